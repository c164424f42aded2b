//! Bad input, over real TCP: requests past a per-request limit, malformed
//! frames and random garbage. Every bad frame gets the reply
//! docs/protocol.md documents ("Bad input", "Limits"), the connection
//! survives exactly when the doc says it does, and the broker keeps serving
//! everyone else. (Frames before HELLO: tests/before_hello.rs; the
//! broker-wide limits: tests/broker_limits.rs; connection limits and peers
//! that vanish: tests/connections.rs.)
//!
//! Limits are set small (and checked with `Limits::check`) so that hitting
//! them is cheap. No test asserts how long anything took.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::net::Shutdown;
use std::time::Duration;

use common::wire::*;
use common::{Rng, assert_serving, small_limits, start};
use runnel::client::{Client, OwnedReply};
use runnel::codec::{self, Decoded, ErrorCode, Ids, Reply, Request, TopicSettings, op};

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

/// Writes a hand-made frame on a client connection and returns the broker
/// error code of its reply (panics if the reply is not an error).
fn raw_error(c: &mut Client, rid: u32, frame: &[u8]) -> ErrorCode {
    c.write_raw(frame).expect("write");
    c.expect_reply(rid);
    code(c.recv())
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
        codec::encode_request(&mut inner, 500 + i, &produce_req("smuggled", &inner_body, 1), 1);
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
    let fetch = encode(
        20,
        &Request::Fetch { topic: "t", group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 },
    );
    let ids = ids_body(&[1, 2]);
    let ack = encode(21, &Request::Ack { topic: "t", group: "", ids: Ids { bytes: &ids } });
    let create = encode(
        22,
        &Request::CreateTopic { topic: "c", settings: TopicSettings::default(), options: Default::default() },
    );
    let body = batch_body(&[b"abc".as_slice(), b"defg"]);
    let produce = encode(23, &produce_req("t", &body, 2));
    let nack = encode(
        24,
        &Request::Nack { topic: "t", group: "", delay_ms: 0, flags: 0, ids: Ids { bytes: &ids }, reason: "" },
    );
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
            Request::Fetch { topic: name, group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 },
            Request::Ack { topic: name, group: "", ids: Ids { bytes: &ids } },
            Request::Nack { topic: name, group: "", delay_ms: 0, flags: 0, ids: Ids { bytes: &ids }, reason: "" },
            Request::Touch { topic: name, group: "", ack_timeout_ms: 0, ids: Ids { bytes: &ids } },
            Request::CreateTopic { topic: name, settings: TopicSettings::default(), options: Default::default() },
            Request::DeleteTopic { topic: name },
            Request::PurgeTopic { topic: name },
            Request::Redrive { topic: name, group: "", max_messages: 0 },
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
    let mut f = encode(
        40,
        &Request::CreateTopic { topic: "ab", settings: TopicSettings::default(), options: Default::default() },
    );
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
// Garbage.
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
