//! Helpers for tests that speak the protocol by hand: raw connections,
//! frames encoded with the codec, replies read and decoded one by one.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use runnel::client::{self, Client, Fetch};
use runnel::codec::{self, Batch, Decoded, ErrorCode, Reply, Request};

/// Upper bound of every wait in these tests. Generous: only a broken broker
/// ever reaches it.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Polls `cond` until it holds; panics after PATIENCE.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < PATIENCE, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A FETCH of up to `max` messages that answers at once.
pub fn now(max: u32) -> Fetch {
    Fetch { max_messages: max, ..Fetch::default() }
}

/// A FETCH of up to `max` messages that waits up to 5 s for the first one.
pub fn wait_for(max: u32) -> Fetch {
    Fetch { max_messages: max, max_bytes: 0, wait_ms: 5000, ack_timeout_ms: 0 }
}

/// The broker error code of a failed call; panics on success or on a
/// non-broker error.
pub fn code<T: std::fmt::Debug>(r: client::Result<T>) -> ErrorCode {
    match r {
        Err(e) => e.code().unwrap_or_else(|| panic!("expected a broker error, got {e}")),
        Ok(v) => panic!("expected a broker error, got Ok({v:?})"),
    }
}

/// One counter of one STATS section ("" = the broker's).
pub fn stat(c: &mut Client, topic: &str, key: &str) -> u64 {
    c.stat(topic, key).expect("STATS").unwrap_or_else(|| panic!("no key {key} in section {topic:?}"))
}

/// A request frame, encoded by the codec.
pub fn encode(rid: u32, req: &Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    codec::encode_request(&mut out, rid, req, 1);
    out
}

/// Rewrites a frame's `len` field to match its bytes.
pub fn reframe(mut frame: Vec<u8>) -> Vec<u8> {
    let len = (frame.len() - 4) as u32;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    frame
}

pub fn batch_body<P: AsRef<[u8]>>(payloads: &[P]) -> Vec<u8> {
    let mut b = Vec::new();
    codec::encode_batch(&mut b, payloads);
    b
}

pub fn produce_req<'a>(topic: &'a str, body: &'a [u8], count: u32) -> Request<'a> {
    Request::Produce { flags: 0, topic, batch: Batch { count, bytes: body, with_props: false } }
}

pub fn ids_body(ids: &[u64]) -> Vec<u8> {
    let mut b = Vec::new();
    codec::encode_ids(&mut b, ids);
    b
}

/// A reply frame read from a raw socket, owned.
pub struct Got {
    pub frame: Vec<u8>,
}

impl Got {
    pub fn decoded(&self) -> codec::ReplyFrame<'_> {
        match codec::decode_reply(&self.frame, usize::MAX) {
            Ok(Decoded::Frame(f, n)) if n == self.frame.len() => f,
            other => panic!("bad reply frame {:02x?}: {other:?}", self.frame),
        }
    }
    /// The op, without the reply bit.
    pub fn op(&self) -> u8 {
        self.decoded().op
    }
    /// The op byte as sent (reply bit included).
    pub fn wire_op(&self) -> u8 {
        self.frame[4]
    }
    pub fn request_id(&self) -> u32 {
        self.decoded().request_id
    }
    pub fn reply(&self) -> Reply<'_> {
        self.decoded().reply
    }
    /// The error code, or panics if the reply is not an error.
    pub fn error(&self) -> ErrorCode {
        match self.reply() {
            Reply::Error { code, .. } => ErrorCode::from_u8(code).expect("known code"),
            other => panic!("expected an error reply, got {other:?}"),
        }
    }
}

/// A raw connection: frames encoded by the codec, replies read by hand.
pub struct Raw {
    pub s: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    pub fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        s.set_read_timeout(Some(PATIENCE)).expect("timeout");
        Raw { s, buf: Vec::new() }
    }
    pub fn write(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("write");
    }
    pub fn send(&mut self, rid: u32, req: &Request<'_>) {
        self.write(&encode(rid, req));
    }
    pub fn hello(&mut self) {
        self.send(0, &Request::Hello { min_version: 1, max_version: 1, token: b"" });
        assert!(matches!(self.recv().reply(), Reply::Hello { version: 1, .. }));
    }
    /// The next reply frame; panics on EOF or timeout.
    pub fn recv(&mut self) -> Got {
        self.try_recv().unwrap_or_else(|| panic!("broker closed the connection while a reply was expected"))
    }
    /// The next reply frame, or None at EOF.
    pub fn try_recv(&mut self) -> Option<Got> {
        loop {
            if self.buf.len() >= 4 {
                let total = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize + 4;
                if self.buf.len() >= total {
                    let frame: Vec<u8> = self.buf.drain(..total).collect();
                    return Some(Got { frame });
                }
            }
            let mut chunk = [0u8; 64 << 10];
            match self.s.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if is_reset(&e) => return None,
                Err(e) => panic!("read: {e}"),
            }
        }
    }
    /// Asserts that the broker sends nothing more and closes.
    pub fn expect_closed(&mut self) {
        if let Some(extra) = self.try_recv() {
            panic!("expected the broker to close, got another frame {:02x?}", extra.frame);
        }
        assert!(self.buf.is_empty(), "half a frame before EOF: {:02x?}", self.buf);
    }
}

pub fn is_reset(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe)
}
