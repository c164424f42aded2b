//! What each request does, over real TCP: HELLO and PING, PRODUCE and
//! FETCH, ACK, NACK and TOUCH, the admin requests, pipelining, and delivery
//! over time (redelivery, dead letters, long polls).
//!
//! Each test starts its own broker on port 0 (see `common::Server`) and talks
//! to it with the blocking client, or with a raw socket where the test is
//! about bytes on the wire. Nothing here asserts how long anything took:
//! timeouts are short (50–500 ms) and every wait is a long-poll FETCH or a
//! bounded poll that returns as soon as the awaited state is there.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use common::Server;
use common::wire::*;
use runnel::broker::Config;
use runnel::client::{Client, Delivered, Fetch, IdsResult, OwnedReply};
use runnel::codec::{self, DeadInfo, DeadReason, ErrorCode, Ids, Reply, Request, TopicSettings, op};

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

/// The counters of one topic section (or "" for the broker section).
fn section(c: &mut Client, name: &str) -> HashMap<String, u64> {
    let topic = if name.is_empty() { None } else { Some(name) };
    let stats = c.stats(topic).expect("STATS");
    let s = stats.iter().find(|s| s.0 == name).unwrap_or_else(|| panic!("no section {name:?} in {stats:?}"));
    s.1.iter().cloned().collect()
}

fn ids(msgs: &[Delivered]) -> Vec<u64> {
    msgs.iter().map(|m| m.id).collect()
}

fn payloads(msgs: &[Delivered]) -> Vec<&[u8]> {
    msgs.iter().map(|m| m.payload.as_slice()).collect()
}

fn ids_result(done: u32, failed: &[u64]) -> IdsResult {
    IdsResult { done, failed: failed.to_vec() }
}

fn settings(ack_timeout_ms: u32, max_deliveries: u16) -> TopicSettings {
    TopicSettings { ack_timeout_ms, max_deliveries }
}

// ---------------------------------------------------------------------------
// HELLO and PING.
// ---------------------------------------------------------------------------

#[test]
fn hello_negotiates_the_highest_common_version() {
    let (srv, _dir) = Server::start(Config::default());
    let mut r = Raw::connect(srv.addr);
    // A client speaking 0..=7 gets the broker's highest, and its limits.
    r.send(11, &Request::Hello { min_version: 0, max_version: 7, token: b"" });
    let got = r.recv();
    assert_eq!((got.op(), got.request_id()), (op::HELLO, 11));
    match got.reply() {
        Reply::Hello { version, limits, map_epoch } => {
            assert_eq!((version, map_epoch), (codec::VERSION_MAX, 0));
            let reported = codec::DecodeLimits::from(&runnel::limits::Limits::default()).reported(version);
            assert_eq!(limits, reported);
        }
        other => panic!("expected HELLO reply, got {other:?}"),
    }
    // A repeated HELLO is answered again.
    r.send(12, &Request::Hello { min_version: 1, max_version: 1, token: b"" });
    let got = r.recv();
    assert_eq!(got.request_id(), 12);
    assert!(matches!(got.reply(), Reply::Hello { version: 1, .. }));
    r.send(13, &Request::Ping);
    let got = r.recv();
    assert_eq!((got.op(), got.request_id(), got.reply()), (op::PING, 13, Reply::Pong));
}

#[test]
fn hello_with_no_common_version_gets_version_and_the_connection_stays_usable() {
    let (srv, _dir) = Server::start(Config::default());
    let mut r = Raw::connect(srv.addr);
    let above = codec::VERSION_MAX + 1;
    for (rid, (min, max)) in [(1, (above, 9)), (2, (0, 0)), (3, (1, 0))] {
        r.send(rid, &Request::Hello { min_version: min, max_version: max, token: b"" });
        let got = r.recv();
        assert_eq!((got.op(), got.request_id()), (op::HELLO, rid));
        assert_eq!(got.error(), ErrorCode::Version, "versions {min}..={max}");
    }
    // The failed HELLOs did not open the session...
    r.send(4, &Request::Ping);
    let got = r.recv();
    assert_eq!((got.op(), got.request_id(), got.error()), (op::PING, 4, ErrorCode::HelloRequired));
    // ...but the connection is still open: a good HELLO works.
    r.send(5, &Request::Hello { min_version: 1, max_version: above, token: b"" });
    assert!(matches!(r.recv().reply(), Reply::Hello { version, .. } if version == codec::VERSION_MAX));
    r.send(6, &Request::Ping);
    assert_eq!(r.recv().reply(), Reply::Pong);

    // After a successful HELLO, an impossible renegotiation is refused and
    // the connection is back to "HELLO required" until a HELLO succeeds.
    let mut c = srv.client();
    c.send(&Request::Hello { min_version: above, max_version: above + 1, token: b"" });
    assert_eq!(code(c.recv()), ErrorCode::Version);
    assert_eq!(code(c.ping()), ErrorCode::HelloRequired);
    c.send(&Request::Hello { min_version: 1, max_version: 1, token: b"" });
    assert!(matches!(c.recv().unwrap(), OwnedReply::Hello { version: 1, .. }));
    c.ping().expect("PING after a renewed HELLO");
    let id = c.produce("t", b"x").expect("PRODUCE after a renewed HELLO");
    assert_eq!(ids(&c.fetch("t", now(1)).unwrap()), vec![id]);
}

#[test]
fn requests_before_hello_get_hello_required_and_do_nothing() {
    let (srv, _dir) = Server::start(Config::default());
    let mut r = Raw::connect(srv.addr);
    let body = batch_body(&[b"early"]);
    r.send(7, &produce_req("early", &body, 1));
    let got = r.recv();
    assert_eq!((got.op(), got.request_id(), got.error()), (op::PRODUCE, 7, ErrorCode::HelloRequired));
    r.send(8, &Request::Ping);
    let got = r.recv();
    assert_eq!((got.op(), got.request_id(), got.error()), (op::PING, 8, ErrorCode::HelloRequired));
    r.send(9, &Request::ListTopics);
    assert_eq!(r.recv().error(), ErrorCode::HelloRequired);
    r.hello();
    r.send(10, &Request::Ping);
    assert_eq!(r.recv().reply(), Reply::Pong);
    // The PRODUCE before HELLO stored nothing: the topic does not exist.
    let mut c = srv.client();
    assert!(c.list_topics().unwrap().is_empty());
    assert_eq!(code(c.stats(Some("early"))), ErrorCode::UnknownTopic);
}

#[test]
fn ping_is_answered_with_its_request_id() {
    let (srv, _dir) = Server::start(Config::default());
    let mut r = Raw::connect(srv.addr);
    r.hello();
    // Ids need not be unique or increasing: each reply echoes its request's.
    let rids = [5u32, 5, 0, u32::MAX, 3, 1_000_000, 2];
    let mut bytes = Vec::new();
    for rid in rids {
        bytes.extend(encode(rid, &Request::Ping));
    }
    r.s.write_all(&bytes).unwrap();
    for rid in rids {
        let got = r.recv();
        assert_eq!((got.op(), got.request_id(), got.reply()), (op::PING, rid, Reply::Pong));
    }
    let mut c = srv.client();
    c.ping().unwrap();
}

// ---------------------------------------------------------------------------
// PRODUCE and FETCH.
// ---------------------------------------------------------------------------

#[test]
fn produce_fetch_ack_round_trip() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let (first, n) = c.produce_batch("t", &[b"a".as_slice(), b"b"]).unwrap();
    assert_eq!(n, 2);
    let msgs = c.fetch("t", Fetch { max_messages: 10, ..Fetch::default() }).unwrap();
    assert_eq!(msgs.iter().map(|m| m.id).collect::<Vec<_>>(), vec![first, first + 1]);
    assert_eq!(msgs[0].payload, b"a");
    assert_eq!(msgs[0].delivery_count, 1);
    let r = c.ack("t", &[first, first + 1, 999]).unwrap();
    assert_eq!(r.done, 2);
    assert_eq!(r.failed, vec![999]);
    assert_eq!(c.stat("t", "acked").unwrap(), Some(2));
}

#[test]
fn produce_ids_are_dense_and_increasing() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let a = c.produce("t", b"one").unwrap();
    let (b, n) = c.produce_batch("t", &[b"two".as_slice(), b"three", b"four"]).unwrap();
    assert_eq!(n, 3);
    assert_eq!(b, a + 1, "a batch starts right after the previous message");
    let (d, n) = c.produce_batch("t", &[b"".as_slice()]).unwrap();
    assert_eq!((d, n), (b + 3, 1), "an empty payload is a message too");
    let msgs = c.fetch("t", now(10)).unwrap();
    assert_eq!(ids(&msgs), vec![a, a + 1, a + 2, a + 3, a + 4]);
    assert_eq!(payloads(&msgs), vec![b"one".as_slice(), b"two", b"three", b"four", b""]);
    assert!(msgs.iter().all(|m| m.delivery_count == 1 && m.dead.is_none()));
    assert!(msgs.windows(2).all(|w| w[0].born_ms <= w[1].born_ms), "born_ms never goes backwards");
    let wall_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    assert!(msgs.iter().all(|m| m.born_ms <= wall_ms && m.born_ms + 3_600_000 > wall_ms), "born_ms is the wall clock");
    assert_eq!(stat(&mut c, "t", "produced"), 5);
}

#[test]
fn fetch_honours_max_messages_and_keeps_order() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let payloads_in: Vec<Vec<u8>> = (0..7).map(|i| format!("m{i}").into_bytes()).collect();
    let (first, _) = c.produce_batch("t", &payloads_in).unwrap();
    let a = c.fetch("t", now(3)).unwrap();
    let b = c.fetch("t", now(3)).unwrap();
    let d = c.fetch("t", now(3)).unwrap();
    let e = c.fetch("t", now(3)).unwrap();
    assert_eq!(ids(&a), vec![first, first + 1, first + 2]);
    assert_eq!(ids(&b), vec![first + 3, first + 4, first + 5]);
    assert_eq!(ids(&d), vec![first + 6]);
    assert!(e.is_empty(), "nothing left: an empty reply");
    assert_eq!(payloads(&b), vec![b"m3".as_slice(), b"m4", b"m5"]);
    // max_messages 0 is refused.
    assert_eq!(code(c.fetch("t", now(0))), ErrorCode::BadArgument);
    c.ping().unwrap();
}

#[test]
fn fetch_honours_max_bytes_but_always_returns_one_message() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let big = vec![b'B'; 300];
    let (first, _) =
        c.produce_batch("t", &[big.as_slice(), &[b'a'; 40], &[b'b'; 40], &[b'c'; 40], &[b'd'; 10]]).unwrap();
    let budget = |max_bytes| Fetch { max_messages: 10, max_bytes, wait_ms: 0, ack_timeout_ms: 0 };
    // The first ready message is larger than the budget: it comes alone.
    let m = c.fetch("t", budget(100)).unwrap();
    assert_eq!(ids(&m), vec![first]);
    assert_eq!(m[0].payload, big);
    // 40 + 40 fit in 100; a third 40 would not.
    let m = c.fetch("t", budget(100)).unwrap();
    assert_eq!(ids(&m), vec![first + 1, first + 2]);
    // 40 + 10 = 50 exactly fits a budget of 50.
    let m = c.fetch("t", budget(50)).unwrap();
    assert_eq!(ids(&m), vec![first + 3, first + 4]);
    // max_bytes 0 means the broker's fetch_bytes_max.
    c.produce_batch("t", &[[b'x'; 1000].as_slice(), &[b'y'; 1000]]).unwrap();
    assert_eq!(c.fetch("t", budget(0)).unwrap().len(), 2);
}

// ---------------------------------------------------------------------------
// ACK, NACK, TOUCH.
// ---------------------------------------------------------------------------

#[test]
fn ack_reports_done_and_failed_ids() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let (first, _) = c.produce_batch("t", &[b"a".as_slice(), b"b", b"c"]).unwrap();
    let got = c.fetch("t", now(2)).unwrap();
    assert_eq!(ids(&got), vec![first, first + 1]);
    // first+2 was never delivered, 12345678 never existed.
    let r = c.ack("t", &[first, first + 1, first + 2, 12_345_678]).unwrap();
    assert_eq!(r, ids_result(2, &[first + 2, 12_345_678]));
    // Acking twice fails the second time.
    assert_eq!(c.ack("t", &[first]).unwrap(), ids_result(0, &[first]));
    let s = section(&mut c, "t");
    assert_eq!((s["acked"], s["ready"], s["inflight"]), (2, 1, 0));
    // An acknowledged message is gone: the next FETCH gets only the third.
    assert_eq!(ids(&c.fetch("t", now(10)).unwrap()), vec![first + 2]);
    // ACK on a topic that does not exist.
    assert_eq!(code(c.ack("nope", &[1])), ErrorCode::UnknownTopic);
}

#[test]
fn a_late_ack_and_an_ack_from_another_consumer_count() {
    let (srv, _dir) = Server::start(Config::default());
    let mut a = srv.client();
    let mut b = srv.client();
    let (first, _) = a.produce_batch("t", &[b"1".as_slice(), b"2"]).unwrap();
    let ack = |ms| Fetch { max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: ms };
    assert_eq!(ids(&a.fetch("t", ack(600_000)).unwrap()), vec![first]);
    // B acknowledges what A holds.
    assert_eq!(b.ack("t", &[first]).unwrap(), ids_result(1, &[]));
    // A's second message passes its deadline and waits for redelivery; a
    // late ACK still removes it.
    assert_eq!(ids(&a.fetch("t", ack(50)).unwrap()), vec![first + 1]);
    wait_until("the deadline to pass", || stat(&mut b, "t", "expired") == 1);
    assert_eq!(a.ack("t", &[first + 1]).unwrap(), ids_result(1, &[]));
    assert!(a.fetch("t", now(10)).unwrap().is_empty());
    assert_eq!(stat(&mut a, "t", "acked"), 2);
}

#[test]
fn nack_returns_messages_to_the_front_of_ready() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let (first, _) = c.produce_batch("t", &[b"1".as_slice(), b"2", b"3"]).unwrap();
    assert_eq!(ids(&c.fetch("t", now(1)).unwrap()), vec![first]);
    let r = c.nack("t", &[first, 999_999], 0, false).unwrap();
    assert_eq!(r, ids_result(1, &[999_999]));
    // The NACKed message comes first, with its delivery count kept.
    let m = c.fetch("t", now(10)).unwrap();
    assert_eq!(ids(&m), vec![first, first + 1, first + 2]);
    assert_eq!(m.iter().map(|m| m.delivery_count).collect::<Vec<_>>(), vec![2, 1, 1]);
    // Only in-flight messages can be NACKed: ack one, then NACK it.
    c.ack("t", &[first + 2]).unwrap();
    assert_eq!(c.nack("t", &[first + 2], 0, false).unwrap(), ids_result(0, &[first + 2]));
    let s = section(&mut c, "t");
    assert_eq!((s["nacked"], s["redelivered"], s["delivered"]), (1, 1, 4));
    assert_eq!(code(c.nack("nope", &[first], 0, false)), ErrorCode::UnknownTopic);
}

#[test]
fn nack_with_delay_hides_the_message_until_the_delay_passes() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let id = c.produce("t", b"later").unwrap();
    assert_eq!(ids(&c.fetch("t", now(1)).unwrap()), vec![id]);
    assert_eq!(c.nack("t", &[id], 500, false).unwrap(), ids_result(1, &[]));
    // Right after: not fetchable, counted as delayed.
    assert!(c.fetch("t", now(1)).unwrap().is_empty(), "a delayed message is not ready");
    let s = section(&mut c, "t");
    assert_eq!((s["delayed"], s["ready"], s["inflight"]), (1, 0, 0));
    // A long poll gets it once the delay passes.
    let m = c.fetch("t", wait_for(1)).unwrap();
    assert_eq!(ids(&m), vec![id]);
    assert_eq!((m[0].delivery_count, m[0].payload.as_slice()), (2, b"later".as_slice()));
    assert_eq!(stat(&mut c, "t", "delayed"), 0);
}

#[test]
fn nack_with_the_dead_letter_flag_moves_the_message_to_the_dlq() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let (first, _) = c.produce_batch("jobs", &[b"poison".as_slice(), b"fine"]).unwrap();
    let got = c.fetch("jobs", now(2)).unwrap();
    let born = got[0].born_ms;
    // delay_ms is ignored with the flag.
    assert_eq!(c.nack("jobs", &[first], 60_000, true).unwrap(), ids_result(1, &[]));
    let dead = c.fetch("jobs.dlq", wait_for(10)).unwrap();
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(d.payload, b"poison");
    assert_eq!(d.born_ms, born);
    assert_eq!(d.delivery_count, 1);
    assert_eq!(d.dead, Some(DeadInfo { origin_id: first, origin_deliveries: 1, reason: DeadReason::Rejected }));
    // It left the origin topic for good.
    assert_eq!(c.ack("jobs", &[first]).unwrap(), ids_result(0, &[first]));
    let s = section(&mut c, "jobs");
    assert_eq!((s["dead_lettered"], s["ready"], s["inflight"]), (1, 0, 1));
    assert_eq!(stat(&mut c, "jobs.dlq", "produced"), 1);
}

#[test]
fn touch_extends_the_deadline() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let (first, _) = c.produce_batch("t", &[b"touched".as_slice(), b"sibling"]).unwrap();
    let got = c.fetch("t", Fetch { max_messages: 2, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 1000 }).unwrap();
    assert_eq!(ids(&got), vec![first, first + 1]);
    let r = c.touch("t", &[first, 777_777], 600_000).unwrap();
    assert_eq!(r, ids_result(1, &[777_777]));
    // The sibling comes back when the original deadline passes; the
    // touched message does not.
    let back = c.fetch("t", wait_for(10)).unwrap();
    assert_eq!(ids(&back), vec![first + 1]);
    assert_eq!(back[0].delivery_count, 2);
    assert!(c.fetch("t", now(10)).unwrap().is_empty(), "the touched message is still in flight");
    let s = section(&mut c, "t");
    assert_eq!((s["inflight"], s["expired"]), (2, 1));
    // Only in-flight messages can be touched.
    c.ack("t", &[first]).unwrap();
    assert_eq!(c.touch("t", &[first], 0).unwrap(), ids_result(0, &[first]));
    assert_eq!(code(c.touch("nope", &[first], 0)), ErrorCode::UnknownTopic);
}

/// TOUCH sets the deadline to now + ack_timeout_ms, "now" being when the
/// broker serves the TOUCH. The broker must not use a time from an earlier
/// turn: after the broker idled for 600 ms, a TOUCH of 300 ms must not give
/// a deadline that has already passed.
#[test]
fn touch_deadline_counts_from_the_touch_not_from_an_earlier_turn() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let id = c.produce("t", b"x").unwrap();
    // A long ack timeout: the broker has no timer due for minutes and
    // sleeps while the client idles.
    let got = c.fetch("t", Fetch { max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 }).unwrap();
    assert_eq!(ids(&got), vec![id]);
    std::thread::sleep(Duration::from_millis(600));
    // One write: TOUCH, then a PRODUCE to another topic (held until the
    // turn's commit), then a FETCH that the broker therefore serves in the
    // next turn, right after the first one. The message was touched for
    // 300 ms; no 300 ms pass between those two turns.
    let mut body = Vec::new();
    codec::encode_ids(&mut body, &[id]);
    c.send(&Request::Touch { topic: "t", group: "", ack_timeout_ms: 300, ids: Ids { bytes: &body } });
    c.send_produce("other", &[b"y"]);
    c.send(&Request::Fetch { topic: "t", group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 });
    c.flush().unwrap();
    assert_eq!(c.recv().unwrap(), OwnedReply::Ids(ids_result(1, &[])));
    assert!(matches!(c.recv().unwrap(), OwnedReply::Produced { count: 1, .. }));
    match c.recv().unwrap() {
        OwnedReply::Messages { messages, .. } => {
            assert!(messages.is_empty(), "the touched message expired at once: {messages:?}")
        }
        other => panic!("expected a FETCH reply, got {other:?}"),
    }
    assert_eq!(stat(&mut c, "t", "expired"), 0);
}

// ---------------------------------------------------------------------------
// Admin: STATS, CREATE/DELETE/PURGE_TOPIC, LIST_TOPICS, REDRIVE.
// ---------------------------------------------------------------------------

#[test]
fn stats_has_a_broker_section_and_topic_sections() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let (first, _) = c.produce_batch("a", &[b"12345".as_slice(), b"6", b"78"]).unwrap();
    c.produce("b", b"z").unwrap();
    let got = c.fetch("a", now(2)).unwrap();
    assert_eq!(ids(&got), vec![first, first + 1]);
    c.ack("a", &[first]).unwrap();

    let all = c.stats(None).unwrap();
    let names: Vec<&str> = all.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(names, vec!["", "a", "b"], "the broker section, then every topic by name");
    let broker = section(&mut c, "");
    for key in ["uptime_ms", "connections", "turns", "topics", "bytes_in", "bytes_out", "fsyncs"] {
        assert!(broker.contains_key(key), "broker section lacks {key}: {broker:?}");
    }
    assert_eq!(broker["topics"], 2);
    assert_eq!(broker["connections"], 1);
    assert!(broker["bytes_in"] > 0 && broker["bytes_out"] > 0 && broker["fsyncs"] > 0);

    let a = section(&mut c, "a");
    let expect = [
        ("ready", 1),
        ("inflight", 1),
        ("delayed", 0),
        ("produced", 3),
        ("delivered", 2),
        ("redelivered", 0),
        ("acked", 1),
        ("nacked", 0),
        ("dead_lettered", 0),
        ("expired", 0),
        ("bytes", 1 + 2),
    ];
    for (k, v) in expect {
        assert_eq!(a.get(k), Some(&v), "topic a, key {k}: {a:?}");
    }
    // One topic's STATS holds that topic's section and no other topic's.
    let only = c.stats(Some("b")).unwrap();
    assert!(only.iter().any(|s| s.0 == "b"));
    assert!(!only.iter().any(|s| s.0 == "a"));
    assert_eq!(stat(&mut c, "b", "ready"), 1);
    assert_eq!(code(c.stats(Some("missing"))), ErrorCode::UnknownTopic);
}

#[test]
fn create_topic_creates_then_updates_settings() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    assert!(c.create_topic("t", settings(1234, 5)).unwrap(), "created");
    assert_eq!(c.list_topics().unwrap(), vec![("t".to_string(), settings(1234, 5))]);
    assert!(!c.create_topic("t", settings(777, 3)).unwrap(), "existed: settings updated");
    assert_eq!(c.list_topics().unwrap(), vec![("t".to_string(), settings(777, 3))]);
    // 0 means the broker defaults.
    assert!(!c.create_topic("t", settings(0, 0)).unwrap());
    assert_eq!(c.list_topics().unwrap(), vec![("t".to_string(), settings(30_000, 16))]);
    // The topic is usable, and keeps its messages across an update.
    let id = c.produce("t", b"m").unwrap();
    assert!(!c.create_topic("t", settings(100, 2)).unwrap());
    assert_eq!(ids(&c.fetch("t", now(1)).unwrap()), vec![id]);
    // The new ack timeout applies to deliveries with ack_timeout_ms 0.
    let back = c.fetch("t", wait_for(1)).unwrap();
    assert_eq!((ids(&back), back[0].delivery_count), (vec![id], 2));
}

#[test]
fn delete_topic_removes_it_and_answers_later_requests_unknown_topic() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let (first, _) = c.produce_batch("gone", &[b"1".as_slice(), b"2"]).unwrap();
    c.produce("kept", b"k").unwrap();
    let got = c.fetch("gone", now(1)).unwrap();
    assert_eq!(ids(&got), vec![first]);
    // Dead-letter one so the topic has a .dlq, which must survive.
    c.nack("gone", &[first], 0, true).unwrap();
    assert_eq!(c.fetch("gone", now(1)).unwrap().len(), 1);
    assert_eq!(c.delete_topic("gone").unwrap(), 1, "one message (in flight) removed");
    assert_eq!(code(c.ack("gone", &[first + 1])), ErrorCode::UnknownTopic);
    assert_eq!(code(c.touch("gone", &[first + 1], 0)), ErrorCode::UnknownTopic);
    assert_eq!(code(c.stats(Some("gone"))), ErrorCode::UnknownTopic);
    assert_eq!(code(c.purge_topic("gone")), ErrorCode::UnknownTopic);
    assert_eq!(code(c.delete_topic("gone")), ErrorCode::UnknownTopic);
    let names: Vec<String> = c.list_topics().unwrap().into_iter().map(|t| t.0).collect();
    assert_eq!(names, vec!["gone.dlq".to_string(), "kept".to_string()]);
    assert_eq!(stat(&mut c, "gone.dlq", "ready"), 1);
}

#[test]
fn delete_topic_answers_a_parked_fetch_with_unknown_topic() {
    let (srv, _dir) = Server::start(Config::default());
    let mut admin = srv.client();
    assert!(admin.create_topic("t", settings(0, 0)).unwrap());
    let mut waiter = srv.client();
    let parked = std::thread::spawn(move || {
        let r = waiter.fetch("t", Fetch { max_messages: 1, max_bytes: 0, wait_ms: 10_000, ack_timeout_ms: 0 });
        (r.map_err(|e| e.code()), waiter)
    });
    wait_until("the FETCH to park", || stat(&mut admin, "t", "waiters") == 1);
    assert_eq!(admin.delete_topic("t").unwrap(), 0);
    let (r, mut waiter) = parked.join().unwrap();
    assert_eq!(r.unwrap_err(), Some(ErrorCode::UnknownTopic));
    // The waiter's connection carries on.
    waiter.ping().unwrap();
}

#[test]
fn purge_topic_removes_every_unacknowledged_message() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    assert!(c.create_topic("t", settings(4321, 7)).unwrap());
    let (first, _) = c.produce_batch("t", &[b"1".as_slice(), b"2", b"3", b"4"]).unwrap();
    c.fetch("t", now(1)).unwrap(); // in flight
    c.ack("t", &[first]).unwrap(); // acknowledged: not counted
    c.fetch("t", now(1)).unwrap(); // in flight
    c.nack("t", &[first + 1], 60_000, false).unwrap(); // delayed
    c.fetch("t", now(1)).unwrap(); // in flight
    assert_eq!(c.purge_topic("t").unwrap(), 3, "in flight, delayed and ready");
    let s = section(&mut c, "t");
    assert_eq!((s["ready"], s["inflight"], s["delayed"], s["bytes"]), (0, 0, 0, 0));
    assert!(c.fetch("t", now(10)).unwrap().is_empty());
    assert_eq!(c.ack("t", &[first + 2]).unwrap(), ids_result(0, &[first + 2]));
    // The topic and its settings stay; ids go on.
    assert_eq!(c.list_topics().unwrap(), vec![("t".to_string(), settings(4321, 7))]);
    let next = c.produce("t", b"5").unwrap();
    assert!(next > first + 3);
    assert_eq!(ids(&c.fetch("t", now(10)).unwrap()), vec![next]);
    assert_eq!(c.purge_topic("t").unwrap(), 1);
}

#[test]
fn list_topics_lists_every_topic_with_its_settings() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    assert!(c.list_topics().unwrap().is_empty());
    c.create_topic("zeta", settings(100, 2)).unwrap();
    c.produce("alpha", b"a").unwrap(); // auto-created with defaults
    c.fetch("mid", now(1)).unwrap(); // FETCH auto-creates too
    let id = c.produce("zeta", b"z").unwrap();
    c.fetch("zeta", now(1)).unwrap();
    c.nack("zeta", &[id], 0, true).unwrap(); // creates zeta.dlq
    let topics = c.list_topics().unwrap();
    let want: Vec<(String, TopicSettings)> = vec![
        ("alpha".into(), settings(30_000, 16)),
        ("mid".into(), settings(30_000, 16)),
        ("zeta".into(), settings(100, 2)),
        ("zeta.dlq".into(), settings(30_000, 16)),
    ];
    assert_eq!(topics, want);
    assert_eq!(stat(&mut c, "", "topics"), 4);
}

#[test]
fn redrive_needs_both_topics_and_moves_ready_dead_letters() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    assert_eq!(code(c.redrive("t", 0)), ErrorCode::UnknownTopic, "no topic");
    c.create_topic("t", settings(0, 0)).unwrap();
    assert_eq!(code(c.redrive("t", 0)), ErrorCode::UnknownTopic, "no t.dlq");
    let (first, _) = c.produce_batch("t", &[b"a".as_slice(), b"b", b"c"]).unwrap();
    assert_eq!(c.fetch("t", now(3)).unwrap().len(), 3);
    assert_eq!(c.nack("t", &[first, first + 1, first + 2], 0, true).unwrap(), ids_result(3, &[]));
    wait_until("three dead letters", || stat(&mut c, "t.dlq", "ready") == 3);
    // max_messages bounds the move.
    assert_eq!(c.redrive("t", 2).unwrap(), 2);
    assert_eq!(c.redrive("t", 0).unwrap(), 1, "0 means all that are left");
    assert_eq!(c.redrive("t", 0).unwrap(), 0);
    let back = c.fetch("t", now(10)).unwrap();
    assert_eq!(payloads(&back), vec![b"a".as_slice(), b"b", b"c"]);
    assert!(back.iter().all(|m| m.id > first + 2 && m.delivery_count == 1 && m.dead.is_none()));
    assert_eq!(stat(&mut c, "t.dlq", "ready"), 0);
}

// ---------------------------------------------------------------------------
// Pipelining and framing over TCP.
// ---------------------------------------------------------------------------

#[test]
fn pipelined_requests_are_answered_in_order() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let x0 = c.produce("p", b"x0").unwrap();
    assert_eq!(ids(&c.fetch("p", now(1)).unwrap()), vec![x0]);

    let mut ack_body = Vec::new();
    codec::encode_ids(&mut ack_body, &[x0, x0 + 1, x0 + 2, 987_654]);
    c.send_produce("p", &[b"a".as_slice(), b"b"]);
    c.send(&Request::Ping);
    c.send_produce("p", &[b"c"]);
    c.send(&Request::Fetch { topic: "p", group: "", max_messages: 2, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 });
    c.send(&Request::Ack { topic: "p", group: "", ids: Ids { bytes: &ack_body } });
    c.send(&Request::Stats { topic: "p" });
    c.send(&Request::Ping);
    c.send(&Request::Fetch { topic: "p", group: "", max_messages: 10, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 });
    // And a long tail: PRODUCE to another topic and PING, interleaved.
    for i in 0..100u32 {
        c.send_produce("q", &[i.to_le_bytes()]);
        c.send(&Request::Ping);
    }
    c.send(&Request::Stats { topic: "q" });
    c.flush().unwrap();

    // `recv` checks that each reply carries the id of the oldest request
    // still waiting, so every Ok below is also an id match.
    assert_eq!(c.recv().unwrap(), OwnedReply::Produced { first_id: x0 + 1, count: 2 });
    assert_eq!(c.recv().unwrap(), OwnedReply::Pong);
    assert_eq!(c.recv().unwrap(), OwnedReply::Produced { first_id: x0 + 3, count: 1 });
    match c.recv().unwrap() {
        OwnedReply::Messages { topic, messages } => {
            assert_eq!(topic, "p");
            assert_eq!(ids(&messages), vec![x0 + 1, x0 + 2]);
            assert_eq!(payloads(&messages), vec![b"a".as_slice(), b"b"]);
        }
        other => panic!("expected messages, got {other:?}"),
    }
    assert_eq!(c.recv().unwrap(), OwnedReply::Ids(ids_result(3, &[987_654])));
    match c.recv().unwrap() {
        OwnedReply::Stats(s) => {
            let p: HashMap<_, _> = s.iter().find(|s| s.0 == "p").expect("section p").1.iter().cloned().collect();
            assert_eq!((p["produced"], p["acked"], p["ready"], p["inflight"]), (4, 3, 1, 0));
        }
        other => panic!("expected stats, got {other:?}"),
    }
    assert_eq!(c.recv().unwrap(), OwnedReply::Pong);
    match c.recv().unwrap() {
        OwnedReply::Messages { messages, .. } => assert_eq!(payloads(&messages), vec![b"c".as_slice()]),
        other => panic!("expected messages, got {other:?}"),
    }
    let mut q_ids = Vec::new();
    for _ in 0..100 {
        match c.recv().unwrap() {
            OwnedReply::Produced { first_id, count: 1 } => q_ids.push(first_id),
            other => panic!("expected a PRODUCE reply, got {other:?}"),
        }
        assert_eq!(c.recv().unwrap(), OwnedReply::Pong);
    }
    assert!(q_ids.windows(2).all(|w| w[1] == w[0] + 1), "dense ids: {q_ids:?}");
    match c.recv().unwrap() {
        OwnedReply::Stats(s) => {
            let q: HashMap<_, _> = s.iter().find(|s| s.0 == "q").expect("section q").1.iter().cloned().collect();
            assert_eq!(q["produced"], 100);
        }
        other => panic!("expected stats, got {other:?}"),
    }
    assert_eq!(c.in_flight(), 0);
    let q = c.fetch("q", now(100)).unwrap();
    assert_eq!(ids(&q), q_ids);
    assert!(q.iter().enumerate().all(|(i, m)| m.payload == (i as u32).to_le_bytes()));
}

#[test]
fn a_request_sent_one_byte_at_a_time_is_served() {
    let (srv, _dir) = Server::start(Config::default());
    let mut bytes = Vec::new();
    codec::encode_request(&mut bytes, 1, &Request::Hello { min_version: 1, max_version: 1, token: b"" }, 1);
    let body = batch_body(&[b"first".as_slice(), b"", &[0xAB; 100]]);
    codec::encode_request(&mut bytes, 2, &produce_req("slow", &body, 3), 1);
    codec::encode_request(
        &mut bytes,
        3,
        &Request::Fetch { topic: "slow", group: "", max_messages: 10, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 },
        1,
    );
    codec::encode_request(&mut bytes, 4, &Request::Ping, 1);

    let mut r = Raw::connect(srv.addr);
    for (i, b) in bytes.iter().enumerate() {
        r.s.write_all(std::slice::from_ref(b)).unwrap();
        r.s.flush().unwrap();
        if i % 16 == 15 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let hello = r.recv();
    assert_eq!(hello.request_id(), 1);
    assert!(matches!(hello.reply(), Reply::Hello { version: 1, .. }));
    let produced = r.recv();
    assert_eq!(produced.request_id(), 2);
    let Reply::Produced { first_id, count: 3 } = produced.reply() else { panic!("{:?}", produced.reply()) };
    let fetched = r.recv();
    assert_eq!(fetched.request_id(), 3);
    match fetched.reply() {
        Reply::Messages { topic, messages } => {
            assert_eq!(topic, "slow");
            assert_eq!(messages.iter().map(|m| m.id).collect::<Vec<_>>(), vec![first_id, first_id + 1, first_id + 2]);
            assert_eq!(messages[0].payload, b"first");
            assert_eq!(messages[1].payload, b"");
            assert_eq!(messages[2].payload, [0xAB; 100]);
        }
        other => panic!("expected messages, got {other:?}"),
    }
    let pong = r.recv();
    assert_eq!((pong.request_id(), pong.reply()), (4, Reply::Pong));
}

#[test]
fn many_frames_in_one_write_get_every_reply_in_order() {
    let (srv, _dir) = Server::start(Config::default());
    let mut r = Raw::connect(srv.addr);
    r.hello();
    // Request ids that are neither increasing nor dense, to show the reply
    // echoes each one.
    let rid = |i: u32| 1_000_000 - i * 7;
    let mut bytes = Vec::new();
    for i in 0..200u32 {
        let body = batch_body(&[format!("msg-{i}").into_bytes()]);
        codec::encode_request(&mut bytes, rid(i), &produce_req("bulk", &body, 1), 1);
    }
    r.s.write_all(&bytes).unwrap();
    let mut firsts = Vec::new();
    for i in 0..200u32 {
        let got = r.recv();
        assert_eq!((got.op(), got.request_id()), (op::PRODUCE, rid(i)), "reply {i}");
        match got.reply() {
            Reply::Produced { first_id, count: 1 } => firsts.push(first_id),
            other => panic!("reply {i}: {other:?}"),
        }
    }
    assert!(firsts.windows(2).all(|w| w[1] == w[0] + 1), "ids follow request order");
    let mut c = srv.client();
    let msgs = c.fetch("bulk", now(500)).unwrap();
    assert_eq!(ids(&msgs), firsts);
    assert!(msgs.iter().enumerate().all(|(i, m)| m.payload == format!("msg-{i}").as_bytes()));
}

// ---------------------------------------------------------------------------
// Delivery over time: redelivery, dead letters, lost consumers, long polls.
// ---------------------------------------------------------------------------

#[test]
fn an_unacked_message_is_redelivered_after_its_ack_timeout() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let id = c.produce("t", b"again").unwrap();
    let first = c.fetch("t", Fetch { max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 100 }).unwrap();
    assert_eq!((ids(&first), first[0].delivery_count), (vec![id], 1));
    let again = c.fetch("t", wait_for(1)).unwrap();
    assert_eq!(ids(&again), vec![id]);
    assert_eq!((again[0].delivery_count, again[0].born_ms), (2, first[0].born_ms));
    assert_eq!(again[0].payload, b"again");
    let s = section(&mut c, "t");
    assert_eq!((s["redelivered"], s["expired"], s["delivered"], s["inflight"]), (1, 1, 2, 1));
    assert_eq!(c.ack("t", &[id]).unwrap(), ids_result(1, &[]));
}

#[test]
fn a_message_past_max_deliveries_goes_to_the_dlq_and_redrive_brings_it_back() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    assert!(c.create_topic("jobs", settings(100, 2)).unwrap());
    let id = c.produce("jobs", b"payload-kept").unwrap();
    let d1 = c.fetch("jobs", now(1)).unwrap();
    assert_eq!((ids(&d1), d1[0].delivery_count), (vec![id], 1));
    let d2 = c.fetch("jobs", wait_for(1)).unwrap();
    assert_eq!((ids(&d2), d2[0].delivery_count), (vec![id], 2));
    // The second deadline passes: out of deliveries.
    let dead = c.fetch("jobs.dlq", Fetch { ack_timeout_ms: 600_000, ..wait_for(10) }).unwrap();
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(d.dead, Some(DeadInfo { origin_id: id, origin_deliveries: 2, reason: DeadReason::AckTimeout }));
    assert_eq!(d.born_ms, d1[0].born_ms, "born_ms is kept");
    assert_eq!(d.payload, b"payload-kept");
    assert_eq!(d.delivery_count, 1);
    let s = section(&mut c, "jobs");
    assert_eq!((s["dead_lettered"], s["expired"], s["ready"], s["inflight"]), (1, 2, 0, 0));
    assert_eq!(c.ack("jobs", &[id]).unwrap(), ids_result(0, &[id]), "no longer in its topic");
    // Ready it again in the dlq, then redrive.
    c.nack("jobs.dlq", &[d.id], 0, false).unwrap();
    assert_eq!(c.redrive("jobs", 0).unwrap(), 1);
    let back = c.fetch("jobs", now(10)).unwrap();
    assert_eq!(back.len(), 1);
    let b = &back[0];
    assert!(b.id > id, "a new id in the origin topic");
    assert_eq!((b.delivery_count, b.dead, b.payload.as_slice()), (1, None, b"payload-kept".as_slice()));
    let dlq = section(&mut c, "jobs.dlq");
    assert_eq!((dlq["ready"], dlq["inflight"], dlq["delayed"]), (0, 0, 0));
    assert!(c.fetch("jobs.dlq", now(10)).unwrap().is_empty());
    c.ack("jobs", &[b.id]).unwrap();
}

#[test]
fn nack_on_the_last_delivery_dead_letters_with_reason_nacked() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    c.create_topic("t", settings(0, 2)).unwrap();
    let id = c.produce("t", b"n").unwrap();
    c.fetch("t", now(1)).unwrap();
    c.nack("t", &[id], 0, false).unwrap();
    assert_eq!(c.fetch("t", now(1)).unwrap()[0].delivery_count, 2);
    c.nack("t", &[id], 0, false).unwrap();
    let dead = c.fetch("t.dlq", wait_for(1)).unwrap();
    assert_eq!(dead[0].dead, Some(DeadInfo { origin_id: id, origin_deliveries: 2, reason: DeadReason::Nacked }));
    assert!(c.fetch("t", now(1)).unwrap().is_empty());
}

/// The doc promises that a dead letter keeps its born_ms. Messages reach
/// the dlq in the order they fail, not the order they were produced.
#[test]
fn dead_letters_keep_born_ms_whatever_order_they_fail_in() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let old = c.produce("t", b"old").unwrap();
    let first = c.fetch("t", now(1)).unwrap();
    // Make sure the second message is born at a later millisecond.
    wait_until("the clock to move on", || {
        let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        wall > first[0].born_ms + 2
    });
    let new = c.produce("t", b"new").unwrap();
    let second = c.fetch("t", now(1)).unwrap();
    assert!(second[0].born_ms > first[0].born_ms);
    // The newer message fails first.
    c.nack("t", &[new], 0, true).unwrap();
    c.nack("t", &[old], 0, true).unwrap();
    wait_until("two dead letters", || stat(&mut c, "t.dlq", "ready") == 2);
    let dead = c.fetch("t.dlq", now(10)).unwrap();
    let born: HashMap<u64, u64> = dead.iter().map(|m| (m.dead.unwrap().origin_id, m.born_ms)).collect();
    assert_eq!(born[&new], second[0].born_ms);
    assert_eq!(born[&old], first[0].born_ms, "the older message's born_ms was changed");
}

#[test]
fn a_consumer_lost_on_the_last_delivery_dead_letters_with_reason_consumer_lost() {
    let (srv, _dir) = Server::start(Config::default());
    let mut b = srv.client();
    b.create_topic("t", settings(0, 1)).unwrap();
    let id = b.produce("t", b"lost").unwrap();
    let mut a = srv.client();
    assert_eq!(ids(&a.fetch("t", now(1)).unwrap()), vec![id]);
    drop(a);
    let dead = b.fetch("t.dlq", wait_for(1)).unwrap();
    assert_eq!(dead[0].dead, Some(DeadInfo { origin_id: id, origin_deliveries: 1, reason: DeadReason::ConsumerLost }));
    assert_eq!(dead[0].payload, b"lost");
}

#[test]
fn a_long_poll_is_answered_by_a_produce() {
    let (srv, _dir) = Server::start(Config::default());
    let mut a = srv.client();
    let mut b = srv.client();
    let poller = std::thread::spawn(move || {
        a.fetch("lp", Fetch { max_messages: 10, max_bytes: 0, wait_ms: 10_000, ack_timeout_ms: 0 }).unwrap()
    });
    wait_until("A's FETCH to park", || b.stat("lp", "waiters").ok().flatten() == Some(1));
    let id = b.produce("lp", b"wake up").unwrap();
    let got = poller.join().unwrap();
    assert_eq!(ids(&got), vec![id]);
    assert_eq!(got[0].payload, b"wake up");
    assert_eq!(stat(&mut b, "lp", "waiters"), 0);
}

#[test]
fn a_long_poll_with_nothing_produced_returns_empty_after_its_wait() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let got = c.fetch("quiet", Fetch { max_messages: 10, max_bytes: 0, wait_ms: 100, ack_timeout_ms: 0 }).unwrap();
    assert!(got.is_empty());
    // The connection reads again after the wait.
    c.ping().unwrap();
    assert_eq!(stat(&mut c, "quiet", "waiters"), 0);
}

#[test]
fn requests_pipelined_behind_a_parked_fetch_wait_for_it() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let mut p = srv.client();
    c.send(&Request::Fetch {
        topic: "lp",
        group: "",
        max_messages: 1,
        max_bytes: 0,
        wait_ms: 10_000,
        ack_timeout_ms: 0,
    });
    c.send(&Request::Ping);
    c.send(&Request::Stats { topic: "lp" });
    c.flush().unwrap();
    wait_until("the FETCH to park", || p.stat("lp", "waiters").ok().flatten() == Some(1));
    let id = p.produce("lp", b"go").unwrap();
    match c.recv().unwrap() {
        OwnedReply::Messages { messages, .. } => assert_eq!(ids(&messages), vec![id]),
        other => panic!("expected the FETCH reply first, got {other:?}"),
    }
    assert_eq!(c.recv().unwrap(), OwnedReply::Pong);
    match c.recv().unwrap() {
        OwnedReply::Stats(s) => {
            let lp: HashMap<_, _> = s.iter().find(|s| s.0 == "lp").expect("section lp").1.iter().cloned().collect();
            assert_eq!((lp["inflight"], lp["waiters"]), (1, 0), "STATS was served after the FETCH");
        }
        other => panic!("expected stats, got {other:?}"),
    }
}

#[test]
fn two_long_polls_share_a_batch_oldest_first() {
    let (srv, _dir) = Server::start(Config::default());
    let mut p = srv.client();
    let spawn = |mut c: Client| {
        std::thread::spawn(move || {
            c.fetch("lp", Fetch { max_messages: 1, max_bytes: 0, wait_ms: 10_000, ack_timeout_ms: 0 }).unwrap()
        })
    };
    let first = spawn(srv.client());
    wait_until("the first FETCH to park", || p.stat("lp", "waiters").ok().flatten() == Some(1));
    let second = spawn(srv.client());
    wait_until("the second FETCH to park", || p.stat("lp", "waiters").ok().flatten() == Some(2));
    let (id, _) = p.produce_batch("lp", &[b"1".as_slice(), b"2"]).unwrap();
    assert_eq!(ids(&first.join().unwrap()), vec![id]);
    assert_eq!(ids(&second.join().unwrap()), vec![id + 1]);
}

#[test]
fn ids_never_repeat_after_delete_and_recreate() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    let (a, _) = c.produce_batch("r", &[b"1".as_slice(), b"2", b"3"]).unwrap();
    assert_eq!(c.delete_topic("r").unwrap(), 3);
    // Re-created by PRODUCE.
    let (b, _) = c.produce_batch("r", &[b"4".as_slice(), b"5"]).unwrap();
    assert!(b > a + 2, "re-created topic reused ids: {b} <= {}", a + 2);
    assert_eq!(c.delete_topic("r").unwrap(), 2);
    // Re-created by CREATE_TOPIC.
    assert!(c.create_topic("r", settings(0, 0)).unwrap());
    let d = c.produce("r", b"6").unwrap();
    assert!(d > b + 1, "re-created topic reused ids: {d} <= {}", b + 1);
    assert_eq!(c.delete_topic("r").unwrap(), 1);
    // Re-created by FETCH.
    assert!(c.fetch("r", now(1)).unwrap().is_empty());
    let e = c.produce("r", b"7").unwrap();
    assert!(e > d, "re-created topic reused ids: {e} <= {d}");
}

#[test]
fn without_auto_create_a_missing_topic_is_unknown_until_created() {
    let (srv, _dir) = Server::start(Config { auto_create: false, ..Config::default() });
    let mut c = srv.client();
    assert_eq!(code(c.produce("t", b"x")), ErrorCode::UnknownTopic);
    assert_eq!(code(c.fetch("t", now(1))), ErrorCode::UnknownTopic);
    assert_eq!(code(c.fetch("t", wait_for(1))), ErrorCode::UnknownTopic);
    assert!(c.list_topics().unwrap().is_empty(), "nothing was created");
    assert!(c.create_topic("t", settings(0, 0)).unwrap());
    let id = c.produce("t", b"x").unwrap();
    assert_eq!(ids(&c.fetch("t", now(1)).unwrap()), vec![id]);
    // Dead-letter topics are still created on demand.
    c.nack("t", &[id], 0, true).unwrap();
    assert_eq!(c.fetch("t.dlq", wait_for(1)).unwrap().len(), 1);
}
