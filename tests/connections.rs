//! A connection's life and its limits, over real TCP (docs/protocol.md,
//! "Connection limits" and "Closing"): past connections_max a connection is
//! told and closed; a peer that does not read its replies is closed, one
//! that pipelines and reads is not; the handshake, idle and frame timeouts;
//! thousands of idle connections; and peers that vanish mid-frame, with
//! messages in flight, or behind a long poll. No test asserts how long
//! anything took: waits are for states, with generous limits.

mod common;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::wire::*;
use common::{Server, assert_serving, small_limits, start};
use runnel::broker::Config;
use runnel::client::{Client, Fetch, OwnedReply};
use runnel::codec::{self, ErrorCode, Ids, Message, Reply, Request, TopicSettings};
use runnel::limits::Limits;

/// The ids of `msgs`, in order.
fn ids(msgs: &[Message<'_>]) -> Vec<u64> {
    msgs.iter().map(|m| m.id).collect()
}

// ---------------------------------------------------------------------------
// Connection limits.
// ---------------------------------------------------------------------------

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
    // The client reports the refusal as the broker's error.
    match Client::connect(srv.addr) {
        Err(e) => assert_eq!(e.code(), Some(ErrorCode::TooManyConnections), "{e}"),
        Ok(_) => panic!("a connection past connections_max was accepted"),
    }
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
        c.send(&Request::Fetch { topic: "t", group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 });
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

#[test]
fn thousands_of_idle_connections_do_not_stop_a_normal_client() {
    // Both ends of every connection live in this process.
    let fds = runnel::sys::raise_fd_limit().expect("read the open-file limit");
    let n = (((fds.saturating_sub(200)) / 2) as usize).min(4000);
    assert!(n >= 1000, "the open-file limit ({fds}) allows only {n} connections");
    let (srv, _dir) = Server::start(Config::default());
    let mut idle = Vec::with_capacity(n);
    let mut hello = Vec::new();
    codec::encode_request(&mut hello, 1, &Request::Hello { min_version: 1, max_version: 1, token: b"" }, 1);
    for i in 0..n {
        let mut s = TcpStream::connect(srv.addr).unwrap();
        // Half say HELLO and go quiet; half never say anything.
        if i % 2 == 0 {
            s.write_all(&hello).unwrap();
        }
        idle.push(s);
    }
    let mut c = srv.client();
    let id = c.produce("t", b"still served").unwrap();
    let got = c.fetch("t", Fetch::default()).unwrap();
    assert_eq!((got[0].id, got[0].payload.as_slice()), (id, b"still served".as_slice()));
    // The kernel completes connects before the broker accepts them (the
    // listen backlog may hold some back): wait for every one to be counted.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let open = c.stat("", "connections").unwrap().unwrap();
        if open > n as u64 {
            break;
        }
        assert!(Instant::now() < until, "{open} connections counted, {n} idle plus this one open");
        std::thread::sleep(Duration::from_millis(20));
    }
    c.ping().unwrap();
}

// ---------------------------------------------------------------------------
// Timeouts.
// ---------------------------------------------------------------------------

/// Reads until EOF or error; true if the broker closed the connection.
fn closed_by_broker(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

#[test]
fn handshake_idle_and_frame_timeouts_close_connections() {
    let limits = Limits { handshake_timeout_ms: 100, idle_timeout_ms: 300, frame_timeout_ms: 100, ..Limits::default() };
    let (srv, _dir) = Server::start(Config { limits, ..Config::default() });
    // Never says HELLO.
    let mut silent = TcpStream::connect(srv.addr).unwrap();
    assert!(closed_by_broker(&mut silent), "handshake timeout");
    // Says HELLO, then nothing.
    let idle = srv.client();
    let mut idle_stream = idle.stream().try_clone().unwrap();
    assert!(closed_by_broker(&mut idle_stream), "idle timeout");
    // Trickles half a frame (slowloris).
    let mut slow = srv.client();
    let mut frame = Vec::new();
    codec::encode_request(&mut frame, 9, &Request::Ping, 1);
    slow.write_raw(&frame[..5]).unwrap();
    let mut slow_stream = slow.stream().try_clone().unwrap();
    assert!(closed_by_broker(&mut slow_stream), "frame timeout");
    // A parked FETCH is not idle: it gets its (empty) reply after its wait.
    let mut parked = srv.client();
    let got = parked.fetch("t", Fetch { wait_ms: 600, ..Fetch::default() }).unwrap();
    assert!(got.is_empty());
    // And a client that keeps talking is served throughout.
    let mut busy = srv.client();
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        busy.ping().unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The idle clock restarts when a parked FETCH is answered, by a message or
/// by the end of its wait: a consumer that polls again after its answer is
/// not closed, however long its FETCH was parked.
#[test]
fn an_answered_long_poll_restarts_the_idle_clock() {
    let limits = Limits { idle_timeout_ms: 1000, ..Limits::default() };
    let (srv, _dir) = Server::start(Config { limits, ..Config::default() });
    let long_poll =
        |topic, wait_ms| Request::Fetch { topic, group: "", max_messages: 1, max_bytes: 0, wait_ms, ack_timeout_ms: 0 };
    // Both park for longer than idle_timeout_ms: one until its wait ends,
    // one until a message comes.
    let mut waits = srv.client();
    waits.send(&long_poll("quiet", 1500));
    waits.flush().unwrap();
    let mut gets = srv.client();
    gets.send(&long_poll("busy", 60_000));
    gets.flush().unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    let id = srv.client().produce("busy", b"at last").unwrap();
    match gets.recv().unwrap() {
        OwnedReply::Messages { messages, .. } => assert_eq!(messages.iter().map(|m| m.id).collect::<Vec<_>>(), [id]),
        other => panic!("the long poll on busy got {other:?}"),
    }
    match waits.recv().unwrap() {
        OwnedReply::Messages { messages, .. } => assert!(messages.is_empty()),
        other => panic!("the long poll on quiet got {other:?}"),
    }
    // Long after the FETCHes were sent, soon after they were answered.
    std::thread::sleep(Duration::from_millis(100));
    waits.ping().expect("the connection whose wait ended is still open");
    gets.ping().expect("the connection that got a message is still open");
}

// ---------------------------------------------------------------------------
// Closing.
// ---------------------------------------------------------------------------

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

/// A consumer that goes away, even halfway through an ACK, gives its
/// in-flight messages back at once, to be delivered again in the order they
/// were delivered; a message another consumer holds stays with it.
#[test]
fn a_peer_that_vanishes_with_messages_in_flight_gives_them_back_at_once() {
    let (srv, _dir) = start(small_limits());
    let mut b = srv.client();
    let (first, _) = b.produce_batch("t", &[b"1".as_slice(), b"2", b"3"]).unwrap();
    let mut r = Raw::connect(srv.addr);
    r.hello();
    r.write(&encode(
        5,
        &Request::Fetch { topic: "t", group: "", max_messages: 2, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 },
    ));
    match r.recv().reply() {
        Reply::Messages { messages, .. } => assert_eq!(ids(&messages), vec![first, first + 1]),
        other => panic!("{other:?}"),
    }
    // B takes the one never delivered.
    let taken: Vec<u64> = b.fetch("t", now(10)).unwrap().iter().map(|m| m.id).collect();
    assert_eq!(taken, vec![first + 2]);
    // Half an ACK, then gone.
    let ids = ids_body(&[first, first + 1]);
    let ack = encode(6, &Request::Ack { topic: "t", group: "", ids: Ids { bytes: &ids } });
    r.write(&ack[..ack.len() / 2]);
    drop(r);
    let back = b.fetch("t", wait_for(10)).unwrap();
    let back: Vec<(u64, u16)> = back.iter().map(|m| (m.id, m.delivery_count)).collect();
    assert_eq!(back, vec![(first, 2), (first + 1, 2)], "returned in the order they were delivered");
    assert_eq!(stat(&mut b, "t", "acked"), 0, "the half ACK did nothing");
    assert_eq!(stat(&mut b, "t", "redelivered"), 2);
    assert_eq!(stat(&mut b, "t", "expired"), 0, "returned by the disconnect, not by a deadline");
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
        &Request::Fetch { topic: "lp", group: "", max_messages: 1, max_bytes: 0, wait_ms: 60_000, ack_timeout_ms: 0 },
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
