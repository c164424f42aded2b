//! Integration tests of the broker's limits and of malformed input, over
//! real TCP: every bad frame gets the reply docs/protocol.md documents, the
//! connection survives exactly when the doc says it does, and the broker
//! keeps serving everyone else.
//!
//! Limits are set small (and checked with `Limits::check`) so that hitting
//! them is cheap. No test asserts how long anything took.

mod common;

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use common::wire::*;
use common::{Rng, Server};
use runnel::broker::Config;
use runnel::client::{Client, Fetch, IdsResult, OwnedReply};
use runnel::codec::{self, Decoded, ErrorCode, Ids, Reply, Request, TopicSettings, op};
use runnel::limits::Limits;

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

/// Small limits that pass `Limits::check`: a frame holds one message of
/// message_bytes_max to a topic of topic_name_bytes_max, with room to spare.
fn small_limits() -> Limits {
    let l = Limits {
        frame_bytes_max: 2048,
        message_bytes_max: 1024,
        batch_messages_max: 8,
        topic_name_bytes_max: 16,
        fetch_bytes_max: 1024,
        ..Limits::default()
    };
    l.check().expect("small limits are consistent");
    l
}

fn start(limits: Limits) -> (Server, common::TempDir) {
    limits.check().expect("limits are consistent");
    Server::start(Config { limits, ..Config::default() })
}

/// Rewrites a frame's `len` field to match its bytes.
fn reframe(mut frame: Vec<u8>) -> Vec<u8> {
    let len = (frame.len() - 4) as u32;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    frame
}

/// Writes a hand-made frame on a client connection and returns the broker
/// error code of its reply (panics if the reply is not an error).
fn raw_error(c: &mut Client, rid: u32, frame: &[u8]) -> ErrorCode {
    c.write_raw(frame).expect("write");
    c.expect_reply(rid);
    code(c.recv())
}

/// A fresh client can PING and round-trip a message: the broker is alive.
fn assert_serving(srv: &Server, what: &str) {
    let mut c = srv.client();
    c.ping().unwrap_or_else(|e| panic!("{what}: PING failed: {e}"));
    let id = c.produce("probe", what.as_bytes()).unwrap_or_else(|e| panic!("{what}: PRODUCE failed: {e}"));
    let got = c.fetch("probe", now(1)).unwrap_or_else(|e| panic!("{what}: FETCH failed: {e}"));
    assert_eq!(got.len(), 1, "{what}");
    assert_eq!((got[0].id, got[0].payload.as_slice()), (id, what.as_bytes()), "{what}");
    assert_eq!(c.ack("probe", &[id]).unwrap(), IdsResult { done: 1, failed: vec![] }, "{what}");
}

// ---------------------------------------------------------------------------
// Per-request limits.
// ---------------------------------------------------------------------------

#[test]
fn a_message_over_message_bytes_max_stores_nothing() {
    let (srv, _dir) = start(small_limits());
    let mut c = srv.client();
    assert_eq!(c.limits.message_bytes_max, 1024, "HELLO reports the limit");
    c.produce("t", b"before").unwrap();
    let too_big = vec![b'x'; 1025];
    let r = c.produce_batch("t", &[b"ok".as_slice(), &too_big, b"ok too"]);
    assert_eq!(code(r), ErrorCode::MessageTooLarge);
    assert_eq!(stat(&mut c, "t", "produced"), 1, "nothing of the batch was stored");
    assert_eq!(stat(&mut c, "t", "ready"), 1);
    c.ping().expect("the connection is still usable");
    // Exactly message_bytes_max is fine.
    let max = vec![b'm'; 1024];
    c.produce("t", &max).unwrap();
    let got = [c.fetch("t", now(1)).unwrap(), c.fetch("t", now(1)).unwrap()].concat();
    assert_eq!(got.iter().map(|m| m.payload.len()).collect::<Vec<_>>(), vec![6, 1024]);
    // A topic the refused batch would have created does not exist.
    assert_eq!(code(c.produce_batch("fresh", &[too_big.as_slice()])), ErrorCode::MessageTooLarge);
    assert_eq!(code(c.stats(Some("fresh"))), ErrorCode::UnknownTopic);
}

#[test]
fn batches_and_id_lists_must_hold_1_to_batch_messages_max() {
    let (srv, _dir) = start(small_limits());
    let mut c = srv.client();
    assert_eq!(c.limits.batch_messages_max, 8);
    let nine: Vec<&[u8]> = vec![b"m"; 9];
    assert_eq!(code(c.produce_batch("t", &nine)), ErrorCode::BatchTooLarge);
    let none: Vec<&[u8]> = Vec::new();
    assert_eq!(code(c.produce_batch("t", &none)), ErrorCode::BatchTooLarge);
    let (first, n) = c.produce_batch("t", &nine[..8]).unwrap();
    assert_eq!(n, 8);
    assert_eq!(stat(&mut c, "t", "produced"), 8, "only the good batch was stored");
    assert_eq!(c.fetch("t", now(100)).unwrap().len(), 8, "FETCH max_messages is clamped, not refused");
    let ids: Vec<u64> = (first..first + 9).collect();
    for (what, r) in [
        ("ACK of 0 ids", c.ack("t", &[])),
        ("ACK of 9 ids", c.ack("t", &ids)),
        ("NACK of 0 ids", c.nack("t", &[], 0, false)),
        ("NACK of 9 ids", c.nack("t", &ids, 0, false)),
        ("TOUCH of 0 ids", c.touch("t", &[], 0)),
        ("TOUCH of 9 ids", c.touch("t", &ids, 0)),
    ] {
        assert_eq!(r.map_err(|e| e.code()).unwrap_err(), Some(ErrorCode::BatchTooLarge), "{what}");
    }
    let s = c.stats(Some("t")).unwrap();
    let t: HashMap<_, _> = s.iter().find(|s| s.0 == "t").unwrap().1.iter().cloned().collect();
    assert_eq!((t["acked"], t["nacked"], t["inflight"]), (0, 0, 8), "the refused requests did nothing");
    assert_eq!(c.ack("t", &ids[..8]).unwrap().done, 8);
}

#[test]
fn a_frame_over_frame_bytes_max_is_discarded_as_it_arrives() {
    let (srv, _dir) = start(small_limits());
    let mut r = Raw::connect(srv.addr);
    r.hello();
    // The oversized frame's payloads hold valid frames: if the broker
    // parsed the discarded bytes, it would create topic "smuggled".
    let inner_body = batch_body(&[b"smuggled"]);
    let mut inner = Vec::new();
    for i in 0..40 {
        codec::encode_request(&mut inner, 500 + i, &produce_req("smuggled", &inner_body, 1));
    }
    let payloads: Vec<Vec<u8>> = (0..6).map(|_| inner[..1000].to_vec()).collect();
    let body = batch_body(&payloads);
    let big = encode(77, &produce_req("big", &body, 6));
    assert!(big.len() > 2048 * 2);
    // The header arrives in two pieces, the body in chunks; the last chunk
    // carries the following PING too.
    let mut tail = big[1500..].to_vec();
    tail.extend_from_slice(&encode(78, &Request::Ping));
    let pieces: Vec<&[u8]> = vec![&big[..5], &big[5..12], &big[12..700], &big[700..1500], &tail];
    for p in pieces {
        r.write(p);
        std::thread::sleep(Duration::from_millis(2));
    }
    let got = r.recv();
    assert_eq!((got.wire_op(), got.request_id(), got.error()), (op::PRODUCE | 0x80, 77, ErrorCode::FrameTooLarge));
    let pong = r.recv();
    assert_eq!((pong.request_id(), pong.reply()), (78, Reply::Pong));
    // And the connection goes on.
    let ok_body = batch_body(&[b"small"]);
    r.write(&encode(79, &produce_req("big", &ok_body, 1)));
    let produced = r.recv();
    assert_eq!(produced.request_id(), 79);
    assert!(matches!(produced.reply(), Reply::Produced { count: 1, .. }));
    let mut c = srv.client();
    let names: Vec<String> = c.list_topics().unwrap().into_iter().map(|t| t.0).collect();
    assert_eq!(names, vec!["big".to_string()], "nothing of the discarded frame was served");
    assert_eq!(stat(&mut c, "big", "produced"), 1);
}

#[test]
fn frame_bytes_max_is_inclusive() {
    let (srv, _dir) = start(small_limits());
    let mut c = srv.client();
    // 12 header + 2 + 1 topic + 4 count + (4 + 1024) + (4 + l2) = 2048.
    let l2 = 2048 - (12 + 2 + 1 + 4 + 4 + 1024 + 4);
    let body = batch_body(&[vec![1u8; 1024], vec![2u8; l2]]);
    let exact = encode(5, &produce_req("b", &body, 2));
    assert_eq!(exact.len(), 2048);
    c.write_raw(&exact).unwrap();
    c.expect_reply(5);
    assert!(matches!(c.recv().unwrap(), OwnedReply::Produced { count: 2, .. }));
    let body = batch_body(&[vec![1u8; 1024], vec![2u8; l2 + 1]]);
    let over = encode(6, &produce_req("b", &body, 2));
    assert_eq!(over.len(), 2049);
    assert_eq!(raw_error(&mut c, 6, &over), ErrorCode::FrameTooLarge);
    assert_eq!(stat(&mut c, "b", "produced"), 2);
}

#[test]
fn a_frame_length_below_8_gets_malformed_and_the_connection_is_closed() {
    let (srv, _dir) = start(small_limits());
    for len in [0u32, 1, 7] {
        for hello_first in [false, true] {
            let mut r = Raw::connect(srv.addr);
            if hello_first {
                r.hello();
            }
            let mut bad = len.to_le_bytes().to_vec();
            bad.extend_from_slice(&[op::PING, 0, 0, 0, 9, 0, 0, 0]);
            r.write(&bad);
            let got = r.recv();
            assert_eq!(got.wire_op(), 0x80, "a connection-level error: op 0 with the reply bit");
            assert_eq!(got.request_id(), 0);
            assert_eq!(got.error(), ErrorCode::Malformed, "len {len}");
            r.expect_closed();
        }
    }
    // The minimum, 8, is a frame with an empty body.
    let mut r = Raw::connect(srv.addr);
    r.hello();
    let mut ping = 8u32.to_le_bytes().to_vec();
    ping.extend_from_slice(&[op::PING, 0, 0, 0, 3, 0, 0, 0]);
    r.write(&ping);
    let got = r.recv();
    assert_eq!((got.request_id(), got.reply()), (3, Reply::Pong));
    assert_serving(&srv, "after short frames");
}

#[test]
fn an_unknown_opcode_gets_unknown_op_and_the_connection_stays_usable() {
    let (srv, _dir) = start(small_limits());
    let mut r = Raw::connect(srv.addr);
    r.hello();
    for (rid, opcode) in [(1u32, 0x00u8), (2, 0x03), (3, 0x15), (4, 0x21), (5, 0x35), (6, 0x7f)] {
        let mut frame = 8u32.to_le_bytes().to_vec();
        frame.extend_from_slice(&[opcode, 0, 0, 0]);
        frame.extend_from_slice(&rid.to_le_bytes());
        frame.extend_from_slice(b"some body");
        r.write(&reframe(frame));
        let got = r.recv();
        assert_eq!(got.wire_op(), opcode | 0x80, "the error echoes the unknown op");
        assert_eq!((got.request_id(), got.error()), (rid, ErrorCode::UnknownOp), "op 0x{opcode:02x}");
    }
    r.write(&encode(9, &Request::Ping));
    assert_eq!(r.recv().reply(), Reply::Pong);
}

#[test]
fn a_request_with_reply_bit_status_or_flags_set_is_malformed() {
    let (srv, _dir) = start(small_limits());
    let mut c = srv.client();
    let ping = encode(10, &Request::Ping);
    for (what, at, value) in
        [("reply bit", 4, op::PING | 0x80), ("status", 5, 1u8), ("flags low", 6, 1), ("flags high", 7, 0x80)]
    {
        let mut f = ping.clone();
        f[at] = value;
        assert_eq!(raw_error(&mut c, 10, &f), ErrorCode::Malformed, "{what}");
        c.ping().unwrap_or_else(|e| panic!("usable after {what}: {e}"));
    }
    // A PRODUCE with flags set stores nothing.
    let body = batch_body(&[b"x"]);
    let mut f = encode(11, &produce_req("flagged", &body, 1));
    f[6] = 1;
    assert_eq!(raw_error(&mut c, 11, &f), ErrorCode::Malformed);
    assert_eq!(code(c.stats(Some("flagged"))), ErrorCode::UnknownTopic);
}

#[test]
fn truncated_bodies_and_trailing_bytes_are_malformed() {
    let (srv, _dir) = start(small_limits());
    let mut c = srv.client();
    c.produce("t", b"x").unwrap();
    let fetch =
        encode(20, &Request::Fetch { topic: "t", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 });
    let ids = ids_body(&[1, 2]);
    let ack = encode(21, &Request::Ack { topic: "t", ids: Ids { bytes: &ids } });
    let create = encode(22, &Request::CreateTopic { topic: "c", settings: TopicSettings::default() });
    let body = batch_body(&[b"abc".as_slice(), b"defg"]);
    let produce = encode(23, &produce_req("t", &body, 2));
    let nack = encode(24, &Request::Nack { topic: "t", delay_ms: 0, flags: 0, ids: Ids { bytes: &ids } });
    let mut cases: Vec<(&str, u32, Vec<u8>)> = vec![
        ("FETCH without ack_timeout_ms", 20, reframe(fetch[..fetch.len() - 4].to_vec())),
        ("FETCH with a byte too many", 20, reframe([fetch.as_slice(), &[0]].concat())),
        ("ACK with half an id", 21, reframe(ack[..ack.len() - 4].to_vec())),
        ("ACK with a trailing byte", 21, reframe([ack.as_slice(), &[7]].concat())),
        ("CREATE_TOPIC without max_deliveries", 22, reframe(create[..create.len() - 2].to_vec())),
        ("PRODUCE whose last message runs past the frame", 23, reframe(produce[..produce.len() - 1].to_vec())),
        ("PRODUCE with bytes after the batch", 23, reframe([produce.as_slice(), &[0, 0, 0, 0]].concat())),
        ("PING with a body", 25, reframe([encode(25, &Request::Ping).as_slice(), &[0]].concat())),
        ("LIST_TOPICS with a body", 26, reframe([encode(26, &Request::ListTopics).as_slice(), b"xy"].concat())),
        ("STATS without its topic", 27, reframe(encode(27, &Request::Stats { topic: "t" })[..13].to_vec())),
        ("topic length past the frame", 28, {
            let mut f = encode(28, &Request::DeleteTopic { topic: "t" });
            f[12] = 200;
            f
        }),
    ];
    // A NACK with an unknown flag bit.
    let mut bad_nack = nack.clone();
    bad_nack[12 + 2 + 1 + 4] = 0x02;
    cases.push(("NACK with an unknown flag", 24, bad_nack));
    for (what, rid, frame) in cases {
        assert_eq!(raw_error(&mut c, rid, &frame), ErrorCode::Malformed, "{what}");
        c.ping().unwrap_or_else(|e| panic!("usable after {what}: {e}"));
    }
    // None of them did anything.
    let s = c.stats(Some("t")).unwrap();
    let t: HashMap<_, _> = s.iter().find(|s| s.0 == "t").unwrap().1.iter().cloned().collect();
    assert_eq!((t["produced"], t["delivered"], t["ready"]), (1, 0, 1));
    assert_eq!(c.list_topics().unwrap().len(), 1, "no topic c");
}

#[test]
fn bad_topic_names_get_bad_topic() {
    let (srv, _dir) = start(small_limits());
    let mut c = srv.client();
    assert_eq!(c.limits.topic_name_bytes_max, 16);
    let too_long = "a".repeat(17);
    let dlq_too_long = format!("{}.dlq", "a".repeat(17));
    let bad = ["", too_long.as_str(), "a b", "a/b", "caf\u{e9}", "tab\t", "nul\0", dlq_too_long.as_str()];
    let ids = ids_body(&[1]);
    let body = batch_body(&[b"x"]);
    for name in bad {
        let reqs = [
            produce_req(name, &body, 1),
            Request::Fetch { topic: name, max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 },
            Request::Ack { topic: name, ids: Ids { bytes: &ids } },
            Request::Nack { topic: name, delay_ms: 0, flags: 0, ids: Ids { bytes: &ids } },
            Request::Touch { topic: name, ack_timeout_ms: 0, ids: Ids { bytes: &ids } },
            Request::CreateTopic { topic: name, settings: TopicSettings::default() },
            Request::DeleteTopic { topic: name },
            Request::PurgeTopic { topic: name },
            Request::Redrive { topic: name, max_messages: 0 },
        ];
        for req in reqs {
            c.send(&req);
            assert_eq!(code(c.recv()), ErrorCode::BadTopic, "op 0x{:02x} on {name:?}", req.op());
        }
        if !name.is_empty() {
            c.send(&Request::Stats { topic: name });
            assert_eq!(code(c.recv()), ErrorCode::BadTopic, "STATS on {name:?}");
        }
    }
    // A byte that is not UTF-8 at all.
    let mut f = encode(40, &Request::CreateTopic { topic: "ab", settings: TopicSettings::default() });
    f[14] = 0xff;
    assert_eq!(raw_error(&mut c, 40, &f), ErrorCode::BadTopic);
    assert!(c.list_topics().unwrap().is_empty(), "no bad name created a topic");
    // The longest names: 16 bytes, and 16 + ".dlq".
    let longest = "Az09._-".repeat(3)[..16].to_string();
    let longest_dlq = format!("{longest}.dlq");
    assert!(c.create_topic(&longest, TopicSettings::default()).unwrap());
    assert!(c.create_topic(&longest_dlq, TopicSettings::default()).unwrap());
    c.produce(&longest, b"fine").unwrap();
    // Names are case-sensitive.
    assert_eq!(code(c.stats(Some(&longest.to_uppercase()))), ErrorCode::UnknownTopic);
}

// ---------------------------------------------------------------------------
// Broker-wide limits.
// ---------------------------------------------------------------------------

#[test]
fn a_full_topic_refuses_a_whole_batch_until_acks_free_room() {
    let limits = Limits {
        topic_messages_max: 5,
        topic_bytes_max: 100,
        message_bytes_max: 100,
        fetch_bytes_max: 100,
        frame_bytes_max: 1024,
        batch_messages_max: 8,
        topic_name_bytes_max: 16,
        ..Limits::default()
    };
    let (srv, _dir) = start(limits);
    let mut c = srv.client();
    let tiny = |n: usize| vec![b"m".as_slice(); n];

    // By message count.
    c.produce_batch("m", &tiny(3)).unwrap();
    assert_eq!(code(c.produce_batch("m", &tiny(3))), ErrorCode::QueueFull);
    assert_eq!((stat(&mut c, "m", "produced"), stat(&mut c, "m", "ready")), (3, 3), "none of the batch stored");
    c.produce_batch("m", &tiny(2)).unwrap(); // exactly 5
    assert_eq!(code(c.produce("m", b"6")), ErrorCode::QueueFull);
    // In-flight messages still count; acknowledging them frees room.
    let got = c.fetch("m", now(2)).unwrap();
    assert_eq!(code(c.produce("m", b"6")), ErrorCode::QueueFull, "in flight is still held");
    c.ack("m", &[got[0].id, got[1].id]).unwrap();
    c.produce_batch("m", &tiny(2)).unwrap();
    assert_eq!(code(c.produce("m", b"8")), ErrorCode::QueueFull);
    assert_eq!(stat(&mut c, "m", "produced"), 7);
    // Purging frees room too.
    assert_eq!(c.purge_topic("m").unwrap(), 5);
    c.produce_batch("m", &tiny(5)).unwrap();

    // By payload bytes.
    let p = |n: usize, b: u8| vec![b; n];
    c.produce_batch("b", &[p(40, b'a'), p(40, b'b')]).unwrap();
    assert_eq!(code(c.produce_batch("b", &[p(10, b'c'), p(11, b'd')])), ErrorCode::QueueFull);
    assert_eq!((stat(&mut c, "b", "produced"), stat(&mut c, "b", "bytes")), (2, 80), "none of the batch stored");
    c.produce("b", &p(20, b'e')).unwrap(); // exactly 100
    assert_eq!(code(c.produce("b", b"f")), ErrorCode::QueueFull);
    let got = c.fetch("b", now(1)).unwrap();
    assert_eq!(got[0].payload, p(40, b'a'));
    c.ack("b", &[got[0].id]).unwrap();
    assert_eq!(stat(&mut c, "b", "bytes"), 60);
    c.produce("b", &p(40, b'g')).unwrap();
    assert_eq!(code(c.produce("b", b"h")), ErrorCode::QueueFull);
    let left: Vec<Vec<u8>> = c.fetch("b", now(10)).unwrap().into_iter().map(|m| m.payload).collect();
    assert_eq!(left, vec![p(40, b'b'), p(20, b'e'), p(40, b'g')]);
}

#[test]
fn dead_letters_and_redrive_respect_depth_limits() {
    let limits = Limits { topic_messages_max: 5, ..small_limits() };
    let (srv, _dir) = start(limits);
    let mut c = srv.client();
    let five: Vec<Vec<u8>> = (0..5u8).map(|i| vec![b'a' + i]).collect();
    let (first, _) = c.produce_batch("o", &five).unwrap();
    assert_eq!(c.fetch("o", now(5)).unwrap().len(), 5);
    let all: Vec<u64> = (first..first + 5).collect();
    assert_eq!(c.nack("o", &all, 0, true).unwrap().done, 5);
    wait_until("five dead letters", || c.stat("o.dlq", "ready").ok().flatten() == Some(5));
    // The dlq is full: a sixth dead letter stays in its topic, never lost.
    let sixth = c.produce("o", b"sixth").unwrap();
    assert_eq!(c.fetch("o", now(1)).unwrap()[0].id, sixth);
    c.nack("o", &[sixth], 0, true).unwrap();
    let back = c.fetch("o", wait_for(1)).unwrap();
    assert_eq!((back[0].id, back[0].payload.as_slice()), (sixth, b"sixth".as_slice()));
    assert_eq!(stat(&mut c, "o.dlq", "ready"), 5);
    // REDRIVE moves only as many as fit in the origin: it holds the sixth
    // (in flight) and three more, so one of five fits.
    c.produce_batch("o", &[b"x".as_slice(), b"y", b"z"]).unwrap();
    assert_eq!(c.redrive("o", 0).unwrap(), 1);
    assert_eq!(stat(&mut c, "o.dlq", "ready"), 4);
    assert_eq!(code(c.produce("o", b"full")), ErrorCode::QueueFull);
    let got = c.fetch("o", now(10)).unwrap();
    assert_eq!(got.iter().map(|m| m.payload.as_slice()).collect::<Vec<_>>(), vec![b"x".as_slice(), b"y", b"z", b"a"]);
    // In-flight dead letters are not redriven.
    c.ack("o", &got.iter().map(|m| m.id).collect::<Vec<_>>()).unwrap();
    let held = c.fetch("o.dlq", now(2)).unwrap();
    assert_eq!(held.len(), 2);
    assert_eq!(c.redrive("o", 0).unwrap(), 2, "the two ready ones");
    assert_eq!(stat(&mut c, "o.dlq", "inflight"), 2);
}

#[test]
fn fetch_waits_and_budgets_are_clamped_to_the_limits() {
    let limits = Limits { fetch_wait_ms_max: 50, ..small_limits() };
    let (srv, _dir) = start(limits);
    let mut c = srv.client();
    // A wait of 10 minutes is clamped to 50 ms: the reply comes, empty,
    // well within the client's read timeout.
    let f = Fetch { max_messages: 1, max_bytes: 0, wait_ms: 600_000, ack_timeout_ms: 0 };
    assert!(c.fetch("t", f).unwrap().is_empty());
    c.ping().unwrap();
    // A byte budget over fetch_bytes_max (1024) is clamped to it.
    c.produce("t", &[1u8; 600]).unwrap();
    c.produce("t", &[2u8; 600]).unwrap();
    let f = Fetch { max_messages: 10, max_bytes: u32::MAX, wait_ms: 0, ack_timeout_ms: 0 };
    assert_eq!(c.fetch("t", f).unwrap().len(), 1);
    assert_eq!(c.fetch("t", f).unwrap().len(), 1);
}

#[test]
fn topics_max_counts_user_topics_only() {
    let limits = Limits { topics_max: 3, ..small_limits() };
    let (srv, _dir) = start(limits);
    let mut c = srv.client();
    assert!(c.create_topic("a", TopicSettings::default()).unwrap());
    c.produce("b", b"x").unwrap();
    c.fetch("c", now(1)).unwrap();
    assert_eq!(code(c.create_topic("d", TopicSettings::default())), ErrorCode::TooManyTopics);
    assert_eq!(code(c.produce("d", b"x")), ErrorCode::TooManyTopics);
    assert_eq!(code(c.fetch("d", now(1))), ErrorCode::TooManyTopics);
    assert_eq!(code(c.fetch("d", wait_for(1))), ErrorCode::TooManyTopics);
    assert_eq!(c.list_topics().unwrap().len(), 3, "nothing was created");
    // Updating an existing topic is not creating one.
    assert!(!c.create_topic("a", TopicSettings { ack_timeout_ms: 5, max_deliveries: 5 }).unwrap());
    // Dead-letter topics do not count.
    let id = c.fetch("b", now(1)).unwrap()[0].id;
    c.nack("b", &[id], 0, true).unwrap();
    assert_eq!(c.fetch("b.dlq", wait_for(1)).unwrap().len(), 1);
    assert!(c.create_topic("c.dlq", TopicSettings::default()).unwrap());
    assert_eq!(c.list_topics().unwrap().len(), 5);
    // Deleting one makes room for one.
    c.delete_topic("c").unwrap();
    c.produce("d", b"x").unwrap();
    assert_eq!(code(c.produce("e", b"x")), ErrorCode::TooManyTopics);
}

#[test]
fn the_connection_past_connections_max_is_told_and_closed() {
    let limits = Limits { connections_max: 3, ..small_limits() };
    let (srv, _dir) = start(limits);
    let mut clients: Vec<Client> = (0..3).map(|_| srv.client()).collect();
    let mut r = Raw::connect(srv.addr);
    let got = r.recv();
    assert_eq!(got.wire_op(), 0x80, "op 0 with the reply bit");
    assert_eq!(got.decoded().op, 0);
    assert_eq!((got.request_id(), got.error()), (0, ErrorCode::TooManyConnections));
    r.expect_closed();
    for c in &mut clients {
        c.ping().expect("existing connections keep working");
    }
    assert_eq!(stat(&mut clients[0], "", "connections"), 3);
    // Once one leaves, a new connection is accepted.
    clients.pop();
    let start = Instant::now();
    let mut newcomer = loop {
        let mut r = Raw::connect(srv.addr);
        r.write(&encode(1, &Request::Hello { min_version: 1, max_version: 1, token: b"" }));
        match r.try_recv() {
            Some(g) if matches!(g.reply(), Reply::Hello { .. }) => break r,
            Some(g) => assert_eq!(g.error(), ErrorCode::TooManyConnections),
            None => {}
        }
        assert!(start.elapsed() < PATIENCE, "no connection accepted after one closed");
        std::thread::sleep(Duration::from_millis(5));
    };
    newcomer.write(&encode(2, &Request::Ping));
    assert_eq!(newcomer.recv().reply(), Reply::Pong);
}

/// Limits for the output tests: replies of about 1 KiB, and at most 4 KiB of
/// them pending per peer.
fn output_limits() -> Limits {
    let l = Limits { output_bytes_max: 4096, ..small_limits() };
    l.check().expect("output limits are consistent");
    l
}

#[test]
fn a_peer_that_never_reads_is_disconnected() {
    // Once half of output_bytes_max waits unread, the broker stops reading
    // the peer; if it stays unread for frame_timeout_ms, it closes it.
    let (srv, _dir) = start(Limits { output_bytes_max: 64 << 10, frame_timeout_ms: 300, ..small_limits() });
    let mut observer = srv.client();
    // Forty topics make each full STATS reply some 10 KiB.
    for i in 0..40 {
        observer.create_topic(&format!("topic-{i:02}"), TopicSettings::default()).unwrap();
    }
    let mut hog = Raw::connect(srv.addr);
    hog.hello();
    hog.s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let stats = encode(1, &Request::Stats { topic: "" });
    let burst: Vec<u8> = stats.iter().copied().cycle().take(stats.len() * 10).collect();
    let start = Instant::now();
    let write_error = loop {
        if let Err(e) = hog.s.write_all(&burst) {
            break e;
        }
        assert!(start.elapsed() < PATIENCE, "the broker kept serving a peer that never reads");
    };
    assert!(is_reset(&write_error) || write_error.kind() == io::ErrorKind::WouldBlock, "{write_error}");
    wait_until("the hog to be disconnected", || stat(&mut observer, "", "connections") == 1);
    assert_serving(&srv, "after the hog");
}

#[test]
fn a_peer_that_pipelines_and_reads_is_not_disconnected_by_output_bytes_max() {
    let (srv, _dir) = start(output_limits());
    let mut c = srv.client();
    for i in 0..8u8 {
        c.produce("t", &[i; 1000]).unwrap();
    }
    // Eight FETCHes of one message each, in one write: 8 KiB of replies, all
    // produced in one turn, twice output_bytes_max.
    for _ in 0..8 {
        c.send(&Request::Fetch { topic: "t", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 });
    }
    c.flush().unwrap();
    for i in 0..8u8 {
        match c.recv() {
            Ok(OwnedReply::Messages { messages, .. }) => {
                assert_eq!(messages.len(), 1);
                assert_eq!(messages[0].payload, vec![i; 1000]);
            }
            other => panic!("reply {i}: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Peers that misbehave at the socket level.
// ---------------------------------------------------------------------------

#[test]
fn random_garbage_never_kills_the_broker() {
    let seed = common::seed(0x5eed_0bad_1dea);
    println!("random_garbage_never_kills_the_broker: seed {seed} (set RUNNEL_SEED to replay)");
    let (srv, _dir) = start(small_limits());
    let mut rng = Rng(seed);
    let ops = [0x01u8, 0x02, 0x10, 0x11, 0x12, 0x13, 0x14, 0x20, 0x30, 0x31, 0x32, 0x33, 0x34];
    for round in 0..24 {
        let ctx = format!("seed {seed}, round {round}");
        let mut bytes = Vec::new();
        let mode = rng.below(3);
        if mode > 0 {
            bytes.extend(encode(0, &Request::Hello { min_version: 1, max_version: 1, token: b"" }));
        }
        if mode < 2 {
            // Pure noise.
            let n = 1 + rng.below(3000) as usize;
            bytes.extend((0..n).map(|_| rng.next_u64() as u8));
        } else {
            // Frames with plausible headers and random bodies.
            for _ in 0..1 + rng.below(40) {
                let body_len = rng.below(48) as usize;
                let mut f = vec![0u8; 12 + body_len];
                f[4] = if rng.below(8) == 0 { rng.next_u64() as u8 } else { ops[rng.below(ops.len() as u64) as usize] };
                if rng.below(10) == 0 {
                    f[5] = rng.next_u64() as u8;
                }
                f[8..12].copy_from_slice(&(rng.next_u64() as u32).to_le_bytes());
                for b in &mut f[12..] {
                    *b = if rng.below(3) == 0 { 0 } else { rng.next_u64() as u8 };
                }
                // Now and then a plausible topic length.
                if body_len >= 3 && rng.below(2) == 0 {
                    f[12] = rng.below(body_len as u64 - 2) as u8;
                    f[13] = 0;
                }
                let mut f = reframe(f);
                if rng.below(20) == 0 {
                    f[..4].copy_from_slice(&(rng.next_u64() as u32).to_le_bytes());
                }
                bytes.extend(f);
            }
        }
        let mut r = Raw::connect(srv.addr);
        // Write in random pieces; the broker may close early, so write
        // errors are fine.
        let mut at = 0;
        while at < bytes.len() {
            let n = (1 + rng.below(600) as usize).min(bytes.len() - at);
            if r.s.write_all(&bytes[at..at + n]).is_err() {
                break;
            }
            at += n;
        }
        let _ = r.s.shutdown(Shutdown::Write);
        // Whatever the broker answered must be well-formed replies.
        let mut replies = 0;
        while let Some(got) = r.try_recv() {
            match codec::decode_reply(&got.frame, usize::MAX) {
                Ok(Decoded::Frame(_, n)) => assert_eq!(n, got.frame.len(), "{ctx}"),
                other => panic!("{ctx}: broker sent a bad frame {:02x?}: {other:?}", got.frame),
            }
            replies += 1;
        }
        drop(r);
        assert_serving(&srv, &format!("{ctx} ({replies} replies)"));
    }
}

#[test]
fn a_peer_that_vanishes_mid_frame_does_not_disturb_others() {
    let (srv, _dir) = start(small_limits());
    let mut observer = srv.client();
    for cut in [1usize, 4, 11, 12, 30] {
        let mut r = Raw::connect(srv.addr);
        r.hello();
        let body = batch_body(&[b"never stored".as_slice(), b"nor this"]);
        let frame = encode(3, &produce_req("half", &body, 2));
        r.write(&frame[..cut]);
        drop(r);
        observer.ping().unwrap();
    }
    wait_until("the vanished peers to be closed", || stat(&mut observer, "", "connections") == 1);
    assert_eq!(code(observer.stats(Some("half"))), ErrorCode::UnknownTopic, "half a frame stores nothing");
    assert_serving(&srv, "after peers vanished mid-frame");
}

#[test]
fn a_peer_that_vanishes_with_messages_in_flight_gives_them_back() {
    let (srv, _dir) = start(small_limits());
    let mut b = srv.client();
    let (first, _) = b.produce_batch("t", &[b"1".as_slice(), b"2"]).unwrap();
    let mut r = Raw::connect(srv.addr);
    r.hello();
    r.write(&encode(
        5,
        &Request::Fetch { topic: "t", max_messages: 2, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 },
    ));
    match r.recv().reply() {
        Reply::Messages { messages, .. } => assert_eq!(messages.len(), 2),
        other => panic!("{other:?}"),
    }
    // Half an ACK, then gone.
    let ids = ids_body(&[first, first + 1]);
    let ack = encode(6, &Request::Ack { topic: "t", ids: Ids { bytes: &ids } });
    r.write(&ack[..ack.len() / 2]);
    drop(r);
    let back = b.fetch("t", wait_for(10)).unwrap();
    assert_eq!(back.iter().map(|m| (m.id, m.delivery_count)).collect::<Vec<_>>(), vec![(first, 2), (first + 1, 2)]);
    assert_eq!(stat(&mut b, "t", "acked"), 0, "the half ACK did nothing");
}

/// A peer that sends a long-poll FETCH and closes at once. The broker reads
/// the FETCH (after a held PRODUCE in the same write, so in the turn after
/// the one that read the bytes) and parks it; the peer's EOF is already in
/// the socket. The doc: when a connection closes, the broker forgets it.
#[test]
fn a_peer_that_closes_behind_a_long_poll_is_forgotten() {
    let (srv, _dir) = start(small_limits());
    let mut observer = srv.client();
    let mut bytes = encode(1, &Request::Hello { min_version: 1, max_version: 1, token: b"" });
    let body = batch_body(&[b"x"]);
    bytes.extend(encode(2, &produce_req("other", &body, 1)));
    bytes.extend(encode(
        3,
        &Request::Fetch { topic: "lp", max_messages: 1, max_bytes: 0, wait_ms: 60_000, ack_timeout_ms: 0 },
    ));
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.write_all(&bytes).unwrap();
    drop(s);
    wait_until("the closed peer to be forgotten", || {
        stat(&mut observer, "", "connections") == 1 && observer.stat("lp", "waiters").ok().flatten().unwrap_or(0) == 0
    });
    // A message produced now goes to a live consumer, first delivery.
    let id = observer.produce("lp", b"for the living").unwrap();
    let got = observer.fetch("lp", wait_for(1)).unwrap();
    assert_eq!(got.iter().map(|m| (m.id, m.delivery_count)).collect::<Vec<_>>(), vec![(id, 1)]);
}

// ---------------------------------------------------------------------------
// Before HELLO (docs/protocol.md, "Opening: HELLO").
// ---------------------------------------------------------------------------

const TOKEN: &[u8] = b"s3cret";

fn start_with_token(token: &[u8]) -> (Server, common::TempDir) {
    let limits = small_limits();
    Server::start(Config { limits, auth_token: Some(token.to_vec()), ..Config::default() })
}

fn hello_with(rid: u32, min_version: u16, max_version: u16, token: &[u8]) -> Vec<u8> {
    encode(rid, &Request::Hello { min_version, max_version, token })
}

/// A frame of `op` with `body`, header fields as given.
fn raw_frame(op: u8, flags: u16, rid: u32, body: &[u8]) -> Vec<u8> {
    let mut f = vec![0, 0, 0, 0, op, 0];
    f.extend_from_slice(&flags.to_le_bytes());
    f.extend_from_slice(&rid.to_le_bytes());
    f.extend_from_slice(body);
    reframe(f)
}

/// Frames that are not a HELLO, each with its op and request id: good
/// requests, and every kind of frame the decoder refuses after HELLO but
/// can skip.
fn not_hello_frames() -> Vec<(&'static str, u8, u32, Vec<u8>)> {
    let body = batch_body(&[b"early"]);
    let produce = encode(3, &produce_req("early", &body, 1));
    vec![
        ("a PING", op::PING, 1, encode(1, &Request::Ping)),
        ("a valid PRODUCE", op::PRODUCE, 2, encode(2, &produce_req("early", &body, 1))),
        ("a PRODUCE cut short", op::PRODUCE, 3, reframe(produce[..produce.len() - 2].to_vec())),
        ("an unknown op", 0x15, 4, raw_frame(0x15, 0, 4, b"some body")),
        ("a bad topic name", op::DELETE_TOPIC, 5, raw_frame(op::DELETE_TOPIC, 0, 5, &[3, 0, b'a', b' ', b'b'])),
        ("an ACK of no ids", op::ACK, 6, raw_frame(op::ACK, 0, 6, &[1, 0, b'a', 0, 0, 0, 0])),
        ("a PING with flags set", op::PING, 7, raw_frame(op::PING, 1, 7, b"")),
        ("a HELLO with the reply bit", op::HELLO | 0x80, 8, raw_frame(op::HELLO | 0x80, 0, 8, &[1, 0, 1, 0, 0, 0])),
    ]
}

/// A frame over frame_bytes_max (2048 here), whole.
fn oversized(rid: u32) -> Vec<u8> {
    let body = batch_body(&[vec![7u8; 1024], vec![8u8; 1024]]);
    let f = encode(rid, &produce_req("big", &body, 2));
    assert!(f.len() > 2048);
    f
}

/// Malformed HELLOs: a byte too many, and flags set.
fn malformed_hellos(rid: u32) -> [Vec<u8>; 2] {
    let trailing = reframe([hello_with(rid, 1, 1, b"").as_slice(), &[0]].concat());
    let mut flagged = hello_with(rid, 1, 1, b"");
    flagged[6] = 1;
    [trailing, flagged]
}

/// Sends `frame` and returns the reply's (op as sent, request id, code).
fn refused(r: &mut Raw, frame: &[u8]) -> (u8, u32, ErrorCode) {
    r.write(frame);
    let got = r.recv();
    (got.wire_op(), got.request_id(), got.error())
}

#[test]
fn before_hello_any_frame_but_hello_gets_hello_required_whatever_is_wrong_with_it() {
    let (srv, _dir) = start(small_limits());
    let mut r = Raw::connect(srv.addr);
    for (what, op, rid, frame) in not_hello_frames() {
        assert_eq!(refused(&mut r, &frame), (op | 0x80, rid, ErrorCode::HelloRequired), "{what}");
    }
    // The stream errors keep their own code: a frame over frame_bytes_max is
    // answered from its header and discarded; the connection goes on.
    assert_eq!(refused(&mut r, &oversized(9)), (op::PRODUCE | 0x80, 9, ErrorCode::FrameTooLarge));
    // A HELLO that does not parse is MALFORMED.
    for frame in malformed_hellos(10) {
        assert_eq!(refused(&mut r, &frame), (op::HELLO | 0x80, 10, ErrorCode::Malformed));
    }
    // Without a token none of that counts toward a close.
    r.hello();
    r.send(11, &Request::Ping);
    assert_eq!(r.recv().reply(), Reply::Pong);
    let mut c = srv.client();
    assert!(c.list_topics().unwrap().is_empty(), "nothing sent before HELLO was served");
}

#[test]
fn with_a_token_every_frame_before_a_successful_hello_counts_toward_the_close() {
    let (srv, _dir) = start_with_token(TOKEN);
    let unauthenticated = ErrorCode::Unauthenticated;
    // Each kind: what it is, the frame, and the reply's op and code.
    let mut kinds: Vec<(String, Vec<u8>, (u8, ErrorCode))> = not_hello_frames()
        .into_iter()
        .map(|(what, op, _, frame)| (what.to_string(), frame, (op | 0x80, unauthenticated)))
        .collect();
    kinds.push(("an oversized frame".into(), oversized(9), (op::PRODUCE | 0x80, ErrorCode::FrameTooLarge)));
    for (i, frame) in malformed_hellos(10).into_iter().enumerate() {
        kinds.push((format!("malformed HELLO {i}"), frame, (op::HELLO | 0x80, ErrorCode::Malformed)));
    }
    kinds.push(("a wrong token".into(), hello_with(11, 1, 1, b"wrong"), (op::HELLO | 0x80, unauthenticated)));
    kinds.push(("no token".into(), hello_with(12, 1, 1, b""), (op::HELLO | 0x80, unauthenticated)));
    let no_version = hello_with(13, 5, 6, TOKEN);
    kinds.push(("the token, no common version".into(), no_version, (op::HELLO | 0x80, ErrorCode::Version)));
    for (what, frame, want) in &kinds {
        // Three of the kind in one write: three replies, then the close.
        let mut r = Raw::connect(srv.addr);
        r.write(&[frame.as_slice(), frame, frame].concat());
        for n in 0..3 {
            let got = r.recv();
            assert_eq!((got.wire_op(), got.error()), *want, "{what}, reply {n}");
        }
        r.expect_closed();
    }
    // Mixed kinds count together: an unknown op, an oversized frame, a
    // wrong token.
    let mixed = [&kinds[3], &kinds[8], &kinds[11]];
    let mut r = Raw::connect(srv.addr);
    r.write(&mixed.iter().flat_map(|k| k.1.iter().copied()).collect::<Vec<u8>>());
    for kind in mixed {
        let got = r.recv();
        assert_eq!((got.wire_op(), got.error()), kind.2, "{}", kind.0);
    }
    r.expect_closed();
    assert_serving_with_token(&srv);
}

/// A fresh client with the token can PING.
fn assert_serving_with_token(srv: &Server) {
    let mut c = Client::connect_with(srv.addr, TOKEN).expect("HELLO with the token");
    c.ping().expect("PING with the token");
}

#[test]
fn a_successful_hello_resets_the_failure_count() {
    let (srv, _dir) = start_with_token(TOKEN);
    let mut r = Raw::connect(srv.addr);
    let ping = encode(1, &Request::Ping);
    // Two failures, then a HELLO with the token.
    for _ in 0..2 {
        assert_eq!(refused(&mut r, &ping).2, ErrorCode::Unauthenticated);
    }
    r.write(&hello_with(2, 1, 1, TOKEN));
    assert!(matches!(r.recv().reply(), Reply::Hello { version: 1, .. }));
    // A failed renegotiation puts the connection back before HELLO, with
    // the count from zero: two more failures do not close it.
    assert_eq!(refused(&mut r, &hello_with(3, 1, 1, b"wrong")).2, ErrorCode::Unauthenticated);
    assert_eq!(refused(&mut r, &ping).2, ErrorCode::Unauthenticated);
    r.write(&hello_with(4, 1, 1, TOKEN));
    assert!(matches!(r.recv().reply(), Reply::Hello { version: 1, .. }));
    r.send(5, &Request::Ping);
    assert_eq!(r.recv().reply(), Reply::Pong);
}

#[test]
fn a_token_sent_to_a_broker_that_requires_none_is_ignored() {
    let (srv, _dir) = start(small_limits());
    let mut c = Client::connect_with(srv.addr, b"any token").expect("HELLO with a token nobody asked for");
    c.ping().expect("PING");
}
