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
use runnel::client::{Client, IdsResult};
use runnel::codec::{self, DecodeLimits, op};
use runnel::limits::Limits;

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
        codec::encode_hello_reply(&mut out, rid(&hello), 1, &limits);
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
