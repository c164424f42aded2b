//! Frames before a successful HELLO, over real TCP (docs/protocol.md,
//! "Opening: HELLO"): without an auth token every frame but HELLO gets
//! HELLO_REQUIRED and none counts toward a close; with one, every frame
//! that is not a successful HELLO gets its error and counts, and the third
//! closes the connection; a successful HELLO resets the count. The client
//! presents the token and reports a wrong one.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::wire::*;
use common::{Server, small_limits, start};
use runnel::broker::Config;
use runnel::client::Client;
use runnel::codec::{self, ErrorCode, Reply, Request, op};

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
    let above = codec::VERSION_MAX + 1;
    let no_version = hello_with(13, above, above + 1, TOKEN);
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

#[test]
fn auth_token_is_required_and_failures_close_the_connection() {
    let config = Config { auth_token: Some(b"s3cret".to_vec()), ..Config::default() };
    let (srv, _dir) = Server::start(config);
    // The right token works.
    let mut ok = Client::connect_with(srv.addr, b"s3cret").unwrap();
    ok.produce("t", b"x").unwrap();
    // A wrong token is UNAUTHENTICATED.
    match Client::connect_with(srv.addr, b"wrong") {
        Err(e) => assert_eq!(e.code(), Some(ErrorCode::Unauthenticated), "{e}"),
        Ok(_) => panic!("a wrong token was accepted"),
    }
    // Frames before an authenticated HELLO are UNAUTHENTICATED, and the
    // connection closes after a few failures.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut out = Vec::new();
    for rid in 1..=5 {
        codec::encode_request(&mut out, rid, &Request::Ping, 1);
    }
    s.write_all(&out).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    let mut replies = 0;
    let mut rest = &got[..];
    while let Ok(codec::Decoded::Frame(f, n)) = codec::decode_reply(rest, usize::MAX) {
        assert!(matches!(f.reply, codec::Reply::Error { code, .. } if code == ErrorCode::Unauthenticated as u8));
        replies += 1;
        rest = &rest[n..];
    }
    assert_eq!(replies, 3, "three UNAUTHENTICATED replies, then the broker closed");
    ok.ping().unwrap();
}
