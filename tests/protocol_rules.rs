//! Pins the rules docs/protocol.md states for what a client writer would
//! otherwise have to guess: that a client ignores bytes past a reply's
//! layout, which error a request gets when several apply, where ids start,
//! the order of `failed` ids, the settings of a dead-letter topic, the order
//! of messages that return to ready together, and what a restart does to
//! messages that were in flight or delayed.
//!
//! Each test starts its own broker on port 0 (`common::Server`), or, for the
//! client's side of a rule, a hand-made peer that plays the broker.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use common::Server;
use common::wire::*;
use runnel::broker::Config;
use runnel::client::{Client, Delivered, Fetch, IdsResult};
use runnel::codec::{self, DecodeLimits, ErrorCode, Request, TopicSettings, op};
use runnel::limits::Limits;
use runnel::log::LogOptions;
use runnel::queue::Settings;

fn ids(msgs: &[Delivered]) -> Vec<u64> {
    msgs.iter().map(|m| m.id).collect()
}

// ---------------------------------------------------------------------------
// Replies may grow.
// ---------------------------------------------------------------------------

/// Reads one whole frame from `s`.
fn read_frame(s: &mut TcpStream) -> Vec<u8> {
    let mut frame = vec![0u8; 4];
    s.read_exact(&mut frame).expect("read a frame's length");
    let len = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
    frame.resize(4 + len, 0);
    s.read_exact(&mut frame[4..]).expect("read a frame");
    frame
}

/// Appends `extra` to the reply that starts at `start` of `out` and fixes
/// its length: a reply from a broker that added fields at the end.
fn grow(out: &mut Vec<u8>, start: usize, extra: &[u8]) {
    out.extend_from_slice(extra);
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// The broker's own client follows "Replies may grow": a peer playing a
/// broker that appends bytes to its HELLO, PING, ACK and error replies is
/// understood, and the reply after each still matches its request.
#[test]
fn the_client_ignores_bytes_past_a_replys_layout() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let peer = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let extra = [0xde, 0xad, 0xbe, 0xef];
        let rid = |f: &[u8]| u32::from_le_bytes([f[8], f[9], f[10], f[11]]);
        let mut out = Vec::new();
        let hello = read_frame(&mut s);
        let limits = DecodeLimits::from(&runnel::limits::Limits::default());
        codec::encode_hello_reply(&mut out, rid(&hello), 1, &limits, 0);
        grow(&mut out, 0, &extra);
        s.write_all(&out).expect("write");
        for _ in 0..3 {
            let req = read_frame(&mut s);
            out.clear();
            match req[4] {
                op::PING => codec::encode_empty_reply(&mut out, op::PING, rid(&req)),
                op::ACK => codec::encode_ids_reply(&mut out, op::ACK, rid(&req), 1, &[9]),
                other => codec::encode_error(&mut out, other, rid(&req), codec::ErrorCode::UnknownTopic, "no"),
            }
            grow(&mut out, 0, &extra);
            s.write_all(&out).expect("write");
        }
    });
    let mut c = Client::connect(addr).expect("HELLO with bytes past its layout");
    assert_eq!((c.version, c.limits.frame_bytes_max), (1, 8 << 20));
    c.ping().expect("PING with bytes past its layout");
    assert_eq!(c.ack("t", &[3, 9]).expect("ACK"), IdsResult { done: 1, failed: vec![9] });
    let err = c.purge_topic("t").expect_err("an error reply");
    assert_eq!(err.code(), Some(codec::ErrorCode::UnknownTopic), "{err}");
    peer.join().expect("peer");
}

// ---------------------------------------------------------------------------
// STATS reports the limits HELLO does not.
// ---------------------------------------------------------------------------

/// A client sizes its reply buffer by `output_bytes_max` and
/// `fetch_bytes_max`, and its pings by `idle_timeout_ms`; HELLO does not
/// carry them, the broker section of STATS does.
#[test]
fn stats_reports_the_limits_a_client_sizes_its_buffers_by() {
    let limits =
        Limits { output_bytes_max: 48 << 20, fetch_bytes_max: 4 << 20, idle_timeout_ms: 123_456, ..Limits::default() };
    limits.check().expect("limits work together");
    let (srv, _dir) = Server::start(Config { limits, ..Config::default() });
    let mut c = srv.client();
    assert_eq!(stat(&mut c, "", "output_bytes_max"), 48 << 20);
    assert_eq!(stat(&mut c, "", "fetch_bytes_max"), 4 << 20);
    assert_eq!(stat(&mut c, "", "idle_timeout_ms"), 123_456);
}

// ---------------------------------------------------------------------------
// Which error wins, ids, HELLO ranges, ACK replies.
// ---------------------------------------------------------------------------

/// A bad field value is refused before the topic is looked up: FETCH with
/// `max_messages` 0 gets BAD_ARGUMENT even on a topic that does not exist
/// (and cannot be created), but a bad topic name is refused first.
#[test]
fn bad_argument_wins_over_unknown_topic_and_loses_to_bad_topic() {
    let (srv, _dir) = Server::start(Config { auto_create: false, ..Config::default() });
    let mut c = srv.client();
    let zero = Fetch { max_messages: 0, ..Fetch::default() };
    assert_eq!(code(c.fetch("missing", now(1))), ErrorCode::UnknownTopic);
    assert_eq!(code(c.fetch("missing", zero)), ErrorCode::BadArgument);
    assert_eq!(code(c.fetch("bad name", zero)), ErrorCode::BadTopic);
}

/// Message ids start at 1 (0 is never an id), but only a topic's first id on
/// a broker that has handed out none may be relied on to be 1: ids are never
/// reused, so a topic created after a delete or a restart starts higher.
#[test]
fn ids_start_at_1_and_a_later_topic_may_start_higher() {
    let dir = common::TempDir::new("ids");
    let srv = Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut c = srv.client();
    assert_eq!(c.produce_batch("a", &[b"1".as_slice(), b"2", b"3"]).unwrap(), (1, 3));
    assert_eq!(c.produce("b", b"1").unwrap(), 1, "each topic has its own ids");
    c.delete_topic("a").unwrap();
    let after_delete = c.produce("c", b"1").unwrap();
    assert!(after_delete > 3, "a topic created after a delete got id {after_delete}");
    drop(c);
    srv.stop();
    let srv = Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut c = srv.client();
    let after_restart = c.produce("d", b"1").unwrap();
    assert!(after_restart > after_delete, "a topic created after a restart got id {after_restart}");
    assert_eq!(c.produce("b", b"2").unwrap(), 2, "an existing topic goes on where it was");
}

/// A HELLO whose range is empty (min_version above max_version) gets
/// VERSION, like a range with no common version; the connection stays open.
#[test]
fn hello_with_min_version_above_max_version_gets_version() {
    let (srv, _dir) = Server::start(Config::default());
    let mut r = Raw::connect(srv.addr);
    for (min_version, max_version) in [(2, 1), (1, 0), (0, 0)] {
        r.send(7, &Request::Hello { min_version, max_version, token: b"" });
        assert_eq!(r.recv().error(), ErrorCode::Version, "range {min_version}..={max_version}");
    }
    r.hello();
}

/// `failed` lists ids in request order, and every id of the request is
/// counted once, in `done` or in `failed`: an id given twice is acked (or
/// NACKed) once and fails the second time, but touched twice.
#[test]
fn failed_ids_keep_request_order_and_duplicates_count_each_time() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    c.produce_batch("t", &[b"1".as_slice(), b"2", b"3"]).unwrap();
    assert_eq!(c.fetch("t", now(3)).unwrap().len(), 3);
    assert_eq!(c.ack("t", &[9, 2, 2, 8, 1]).unwrap(), IdsResult { done: 2, failed: vec![9, 2, 8] });
    assert_eq!(c.touch("t", &[3, 3], 0).unwrap(), IdsResult { done: 2, failed: vec![] });
    assert_eq!(c.nack("t", &[7, 3, 3], 0, false).unwrap(), IdsResult { done: 1, failed: vec![7, 3] });
}

// ---------------------------------------------------------------------------
// Dead-letter topics.
// ---------------------------------------------------------------------------

/// A dead-letter topic created on demand gets the broker's defaults for new
/// topics, not its origin's settings. `.dlq` names are otherwise ordinary
/// beside their origin: PRODUCE and CREATE_TOPIC accept them (a message
/// produced there has no dead-letter fields), and STATS's `topics` counts
/// them (`topics_max` does not: tests/broker_limits.rs).
#[test]
fn a_dlq_topic_gets_the_broker_defaults_and_accepts_produce_and_create() {
    let defaults =
        Settings { ack_timeout_ms: 45_000, max_deliveries: 7, dedup_window_ms: None, retention: Default::default() };
    let (srv, _dir) = Server::start(Config { defaults, ..Config::default() });
    let mut c = srv.client();
    c.create_topic("jobs", TopicSettings { ack_timeout_ms: 60_000, max_deliveries: 2 }).unwrap();
    let id = c.produce("jobs", b"x").unwrap();
    assert_eq!(c.fetch("jobs", now(1)).unwrap().len(), 1);
    c.nack("jobs", &[id], 0, true).unwrap();
    assert_eq!(c.fetch("jobs.dlq", wait_for(1)).unwrap().len(), 1);
    let topics = c.list_topics().unwrap();
    let of = |name: &str| topics.iter().find(|t| t.0 == name).map(|t| t.1);
    assert_eq!(of("jobs"), Some(TopicSettings { ack_timeout_ms: 60_000, max_deliveries: 2 }));
    assert_eq!(of("jobs.dlq"), Some(TopicSettings { ack_timeout_ms: 45_000, max_deliveries: 7 }));
    assert!(!c.create_topic("jobs.dlq", TopicSettings { ack_timeout_ms: 1000, max_deliveries: 0 }).unwrap());
    assert_eq!(code(c.produce("mail.dlq", b"by hand")), ErrorCode::UnknownTopic, "no topic mail");
    c.create_topic("mail", TopicSettings::default()).unwrap();
    let other = c.produce("mail.dlq", b"by hand").unwrap();
    let got = c.fetch("mail.dlq", now(1)).unwrap();
    assert_eq!((got[0].id, got[0].dead), (other, None));
    assert_eq!(stat(&mut c, "", "topics"), 4, "STATS counts dead-letter topics");
}

// ---------------------------------------------------------------------------
// Ready order of messages that return together.
// ---------------------------------------------------------------------------

/// Messages returned by one NACK return in the order of its ids; messages
/// returned by a disconnect, in the order they were delivered; messages
/// whose deadlines pass together, in the order the deadlines were set.
#[test]
fn messages_that_return_together_keep_the_order_of_the_event() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    c.produce_batch("n", &[b"1".as_slice(), b"2", b"3", b"4", b"5"]).unwrap();
    assert_eq!(c.fetch("n", now(3)).unwrap().len(), 3);
    c.nack("n", &[3, 1, 2], 0, false).unwrap();
    assert_eq!(ids(&c.fetch("n", now(5)).unwrap()), vec![3, 1, 2, 4, 5], "NACK: the order of its ids");

    c.produce_batch("d", &[b"1".as_slice(), b"2", b"3", b"4"]).unwrap();
    let mut y = srv.client();
    let mut x = srv.client();
    assert_eq!(ids(&y.fetch("d", now(1)).unwrap()), vec![1]);
    assert_eq!(ids(&x.fetch("d", now(2)).unwrap()), vec![2, 3]);
    y.nack("d", &[1], 0, false).unwrap();
    assert_eq!(ids(&x.fetch("d", now(1)).unwrap()), vec![1]);
    drop(x);
    wait_until("the disconnect returns x's messages", || stat(&mut c, "d", "inflight") == 0);
    assert_eq!(ids(&c.fetch("d", now(4)).unwrap()), vec![2, 3, 1, 4], "disconnect: the order delivered");

    c.produce_batch("e", &[b"1".as_slice(), b"2", b"3"]).unwrap();
    assert_eq!(c.fetch("e", now(3)).unwrap().len(), 3);
    c.nack("e", &[3, 2, 1], 0, false).unwrap();
    let short = Fetch { max_messages: 3, ack_timeout_ms: 50, ..Fetch::default() };
    assert_eq!(ids(&c.fetch("e", short).unwrap()), vec![3, 2, 1]);
    let back = c.fetch("e", wait_for(3)).unwrap();
    assert_eq!(ids(&back), vec![3, 2, 1], "deadlines passed together: the order they were set");
}

// ---------------------------------------------------------------------------
// Restart.
// ---------------------------------------------------------------------------

/// After a restart every unacknowledged message is ready, in id order.
/// Every delivery is counted: one whose end the broker recorded (an ack
/// deadline that passed, a NACK), one still in flight at the stop (touched
/// or not), and one ended by its consumer's disconnect. A NACK's delay survives:
/// the message stays delayed until it ends.
#[test]
fn a_restart_makes_every_message_ready_in_id_order() {
    let dir = common::TempDir::new("restart");
    let srv = Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut c = srv.client();
    let five: Vec<&[u8]> = vec![b"1", b"2", b"3", b"4", b"5"];
    c.produce_batch("r", &five).unwrap();
    assert_eq!(ids(&c.fetch("r", now(1)).unwrap()), vec![1], "1 stays in flight");
    assert_eq!(ids(&c.fetch("r", now(1)).unwrap()), vec![2]);
    assert_eq!(c.nack("r", &[2], 600_000, false).unwrap().done, 1, "2 is delayed for 10 min");
    assert_eq!(ids(&c.fetch("r", now(1)).unwrap()), vec![3]);
    assert_eq!(c.touch("r", &[3], 600_000).unwrap().done, 1, "3 is touched");
    let short = Fetch { max_messages: 1, ack_timeout_ms: 50, ..Fetch::default() };
    assert_eq!(ids(&c.fetch("r", short).unwrap()), vec![4]);
    wait_until("4's deadline passes", || stat(&mut c, "r", "expired") == 1);
    // On a topic of its own, a message whose consumer goes away.
    c.produce("q", b"1").unwrap();
    let mut lost = srv.client();
    assert_eq!(ids(&lost.fetch("q", now(1)).unwrap()), vec![1]);
    drop(lost);
    wait_until("the disconnect returns q's message", || stat(&mut c, "q", "ready") == 1);
    drop(c);
    srv.stop();

    let srv = Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut c = srv.client();
    assert_eq!((stat(&mut c, "r", "ready"), stat(&mut c, "r", "delayed")), (4, 1));
    let seen = |got: Vec<Delivered>| got.iter().map(|m| (m.id, m.delivery_count)).collect::<Vec<_>>();
    let r = seen(c.fetch("r", now(10)).unwrap());
    assert_eq!(
        r,
        vec![(1, 2), (3, 2), (4, 2), (5, 1)],
        "(id, delivery_count): the deliveries in flight at the stop count; 2 is still delayed"
    );
    assert_eq!(seen(c.fetch("q", now(10)).unwrap()), vec![(1, 2)], "the disconnected delivery counts");
}

// ---------------------------------------------------------------------------
// Only a pushed frame has op 0xEF.
// ---------------------------------------------------------------------------

/// A frame of `op` with an empty body and the header's other fields 0: ops
/// no encoder writes as a request.
fn bare_frame(op: u8, rid: u32) -> Vec<u8> {
    let mut f = vec![0, 0, 0, 0, op, 0, 0, 0];
    f.extend_from_slice(&rid.to_le_bytes());
    reframe(f)
}

/// The next frame that is not pushed, as a client reads replies in request
/// order: every frame with op 0xEF is set aside in `pushed` as a pushed
/// frame (docs/protocol.md, "Frames": no reply has that op).
fn next_reply(r: &mut Raw, pushed: &mut Vec<Got>) -> Got {
    loop {
        let got = r.recv();
        if got.wire_op() != op::PUSH | codec::REPLY_BIT {
            return got;
        }
        pushed.push(got);
    }
}

/// A client that sets aside every frame with op 0xEF, as the doc says a
/// pushed frame is told apart, still gets the reply to every frame, in
/// order: the error replies to a frame with PUSH's op (0x6F, no request)
/// and to one with op 0xEF (the reply bit set) have op 0xFF, and what it
/// set aside are the subscription's pushed frames alone.
#[test]
fn no_reply_takes_the_op_of_a_pushed_frame() {
    let (srv, _dir) = Server::start(Config::default());
    let version = codec::VERSION_MAX;
    let mut r = Raw::connect(srv.addr);
    let mut out = Vec::new();
    codec::encode_request(&mut out, 1, &Request::Hello { min_version: 1, max_version: version, token: b"" }, 1);
    r.write(&out);
    assert!(matches!(r.recv().reply(), codec::Reply::Hello { version: v, .. } if v == version));
    let mut body = Vec::new();
    codec::encode_message(&mut body, &codec::Props::EMPTY, b"x");
    let produce =
        Request::Produce { topic: "t", flags: 0, batch: codec::Batch { count: 1, bytes: &body, with_props: true } };
    let subscribe = Request::Subscribe { topic: "t", group: "", credit: 10, ack_timeout_ms: 0 };
    out.clear();
    codec::encode_request(&mut out, 2, &subscribe, version);
    codec::encode_request(&mut out, 3, &produce, version);
    out.extend_from_slice(&bare_frame(op::PUSH, 4));
    out.extend_from_slice(&bare_frame(op::PUSH | codec::REPLY_BIT, 5));
    codec::encode_request(&mut out, 6, &Request::Ping, version);
    r.write(&out);
    let mut pushed = Vec::new();
    let replies: Vec<(u32, u8)> =
        (0..5).map(|_| next_reply(&mut r, &mut pushed)).map(|g| (g.request_id(), g.wire_op())).collect();
    assert_eq!(replies, [(2, 0xe0), (3, 0x90), (4, 0xff), (5, 0xff), (6, 0x82)], "(request id, op) of each reply");
    assert_eq!(pushed.len(), 1, "the one message produced was pushed");
    assert!(matches!(pushed[0].reply(), codec::Reply::Pushed { topic: "t", .. }), "{:02x?}", pushed[0].frame);
}

/// The replies that echo a frame's op whatever it is (HELLO_REQUIRED
/// before HELLO, MALFORMED for a header with the reply bit,
/// FRAME_TOO_LARGE, UNKNOWN_OP) never take op 0xEF either: a frame with op
/// 0x6F or 0xEF gets them with op 0xFF.
#[test]
fn an_error_reply_to_a_frame_with_the_push_op_has_op_0xff() {
    let (srv, _dir) = common::start(common::small_limits());
    let mut r = Raw::connect(srv.addr);
    let refused = |r: &mut Raw| {
        let got = r.recv();
        (got.wire_op(), got.request_id(), got.error())
    };
    r.write(&bare_frame(op::PUSH, 1));
    assert_eq!(refused(&mut r), (0xff, 1, ErrorCode::HelloRequired), "before HELLO");
    r.hello();
    r.write(&bare_frame(op::PUSH, 2));
    assert_eq!(refused(&mut r), (0xff, 2, ErrorCode::UnknownOp));
    r.write(&bare_frame(op::PUSH | codec::REPLY_BIT, 3));
    assert_eq!(refused(&mut r), (0xff, 3, ErrorCode::Malformed));
    let mut oversized = bare_frame(op::PUSH, 4);
    oversized.resize(4096, 0);
    r.write(&reframe(oversized));
    assert_eq!(refused(&mut r), (0xff, 4, ErrorCode::FrameTooLarge));
    r.send(5, &Request::Ping);
    assert_eq!((r.recv().wire_op(), 5), (op::PING | codec::REPLY_BIT, 5), "in step");
}
