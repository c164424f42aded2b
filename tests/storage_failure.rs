//! A failed write or fdatasync never acknowledges what is not durable.
//!
//! The broker is driven directly (no sockets): frames in, `commit`, replies
//! out, with the log's segment files wrapped in a `SegmentFile` whose writes
//! or syncs fail on demand — the injectable failure the issue asks for,
//! instead of filling a disk.

mod common;

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use common::TempDir;
use runnel::broker::{Broker, Config, Now, Outbox, Outcome, Session};
use runnel::codec::{self, Batch, Decoded, ErrorCode, Frame, Ids, Reply, ReplyFrame, Request};
use runnel::log::{LogOptions, SegmentFile};
use std::os::unix::fs::FileExt;

/// What the faulty file does next.
const OK: u8 = 0;
const FAIL_SYNC: u8 = 1;
const FAIL_WRITE: u8 = 2;
/// Writes half the buffer, then fails (a torn write).
const TORN_WRITE: u8 = 3;

struct Faulty {
    file: std::fs::File,
    mode: Arc<AtomicU8>,
}

impl SegmentFile for Faulty {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        match self.mode.load(Ordering::SeqCst) {
            FAIL_WRITE => Err(io::Error::other("injected: no space left on device")),
            TORN_WRITE => {
                FileExt::write_all_at(&self.file, &buf[..buf.len() / 2], offset)?;
                Err(io::Error::other("injected: I/O error after a partial write"))
            }
            _ => FileExt::write_all_at(&self.file, buf, offset),
        }
    }
    fn sync_data(&mut self) -> io::Result<()> {
        match self.mode.load(Ordering::SeqCst) {
            FAIL_SYNC => Err(io::Error::other("injected: fdatasync failed")),
            _ => self.file.sync_data(),
        }
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn reserve(&mut self, len: u64) -> io::Result<()> {
        SegmentFile::reserve(&mut self.file, len)
    }
}

/// Output buffers for the connections of a test.
#[derive(Default)]
struct Outs(HashMap<usize, Vec<u8>>);

impl Outbox for Outs {
    fn out(&mut self, conn: usize) -> Option<&mut Vec<u8>> {
        Some(self.0.entry(conn).or_default())
    }
    fn unblock(&mut self, _conn: usize) {}
}

struct Harness {
    broker: Broker,
    session: Session,
    outs: Outs,
    next_rid: u32,
    now: Now,
}

impl Harness {
    fn open(dir: &Path, mode: Option<Arc<AtomicU8>>) -> Harness {
        let now = Now { mono_ms: 1, wall_ms: 1_700_000_000_000 };
        let broker = match mode {
            Some(mode) => {
                let opener = Box::new(move |p: &Path| -> io::Result<Box<dyn SegmentFile>> {
                    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(p)?;
                    Ok(Box::new(Faulty { file, mode: mode.clone() }))
                });
                Broker::open_with(Config::default(), dir, LogOptions::default(), opener, now)
            }
            None => Broker::open(Config::default(), dir, LogOptions::default(), now),
        }
        .expect("open broker");
        let mut h = Harness {
            broker,
            session: Session { consumer: 1, ..Session::default() },
            outs: Outs::default(),
            next_rid: 1,
            now,
        };
        let hello = Request::Hello { min_version: 1, max_version: 1, token: b"" };
        assert!(matches!(h.call(&hello), Reply::Hello { .. }));
        h
    }

    /// Sends one request, ends the turn (commit), and returns its reply.
    fn call(&mut self, req: &Request<'_>) -> Reply<'static> {
        let rid = self.next_rid;
        self.next_rid += 1;
        let mut out = std::mem::take(self.outs.0.entry(0).or_default());
        let outcome =
            self.broker.handle(0, &mut self.session, &Frame { request_id: rid, request: *req }, self.now, &mut out);
        assert_ne!(outcome, Outcome::Parked);
        self.outs.0.insert(0, out);
        self.broker.commit(self.now, &mut self.outs);
        let out = self.outs.0.remove(&0).unwrap_or_default();
        // Own the reply by leaking its buffer: the tests are short-lived.
        let out: &'static [u8] = Box::leak(out.into_boxed_slice());
        let Ok(Decoded::Frame(ReplyFrame { request_id, reply, .. }, n)) = codec::decode_reply(out, usize::MAX) else {
            panic!("no whole reply in {out:?}");
        };
        assert_eq!(n, out.len(), "exactly one reply");
        assert_eq!(request_id, rid);
        reply
    }

    fn produce(&mut self, topic: &str, payloads: &[&[u8]]) -> Reply<'static> {
        let mut body = Vec::new();
        codec::encode_batch(&mut body, payloads);
        let body: &[u8] = &body;
        self.call(&Request::Produce { topic, batch: Batch { count: payloads.len() as u32, bytes: body } })
    }

    /// Fetches everything ready and acks nothing; returns (id, payload).
    fn fetch_all(&mut self, topic: &str) -> Vec<(u64, Vec<u8>)> {
        let req = Request::Fetch { topic, max_messages: 10_000, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 60_000 };
        match self.call(&req) {
            Reply::Messages { messages, .. } => messages.iter().map(|m| (m.id, m.payload.to_vec())).collect(),
            other => panic!("fetch: {other:?}"),
        }
    }

    fn ack(&mut self, topic: &str, ids: &[u64]) -> Reply<'static> {
        let mut body = Vec::new();
        codec::encode_ids(&mut body, ids);
        self.call(&Request::Ack { topic, ids: Ids { bytes: &body } })
    }
}

fn storage_error(r: &Reply<'_>) -> bool {
    matches!(r, Reply::Error { code, .. } if *code == ErrorCode::Storage as u8)
}

#[test]
fn failed_sync_answers_storage_and_stores_nothing() {
    let dir = TempDir::new("fail-sync");
    let mode = Arc::new(AtomicU8::new(OK));
    let mut h = Harness::open(dir.path(), Some(mode.clone()));
    let Reply::Produced { first_id: a, .. } = h.produce("t", &[b"kept-1", b"kept-2"]) else { panic!("produce") };

    mode.store(FAIL_SYNC, Ordering::SeqCst);
    let r = h.produce("t", &[b"lost-1", b"lost-2"]);
    assert!(storage_error(&r), "a produce whose sync failed must get STORAGE, got {r:?}");
    // The broker keeps serving consumers of what it has, and the failed
    // batch is not visible to them.
    let got = h.fetch_all("t");
    assert_eq!(got, vec![(a, b"kept-1".to_vec()), (a + 1, b"kept-2".to_vec())]);
    // Acks still answer (they do not wait for the log).
    assert!(matches!(h.ack("t", &[a]), Reply::Ids { done: 1, .. }));

    // Storage comes back: later produces are retried and acknowledged.
    mode.store(OK, Ordering::SeqCst);
    let Reply::Produced { first_id: b, count: 1 } = h.produce("t", &[b"after"]) else { panic!("produce after") };
    assert!(b > a + 1);
    drop(h);

    // After a restart: the acknowledged messages, never the failed ones.
    let mut h = Harness::open(dir.path(), None);
    let payloads: Vec<Vec<u8>> = h.fetch_all("t").into_iter().map(|m| m.1).collect();
    assert!(!payloads.iter().any(|p| p.starts_with(b"lost")), "a failed produce came back: {payloads:?}");
    assert!(payloads.contains(&b"kept-2".to_vec()) && payloads.contains(&b"after".to_vec()), "{payloads:?}");
}

#[test]
fn failed_and_torn_writes_leave_a_clean_log() {
    for (name, fault) in [("write", FAIL_WRITE), ("torn", TORN_WRITE)] {
        let dir = TempDir::new(name);
        let mode = Arc::new(AtomicU8::new(OK));
        let mut h = Harness::open(dir.path(), Some(mode.clone()));
        assert!(matches!(h.produce("t", &[b"one"]), Reply::Produced { .. }));
        mode.store(fault, Ordering::SeqCst);
        for _ in 0..3 {
            let r = h.produce("t", &[b"never".as_slice(); 4]);
            assert!(storage_error(&r), "{name}: want STORAGE, got {r:?}");
        }
        mode.store(OK, Ordering::SeqCst);
        assert!(matches!(h.produce("t", &[b"two"]), Reply::Produced { .. }), "{name}: storage retried");
        drop(h);
        // A torn write was cut back before the next append, so the log has
        // no damaged record in its middle: recovery opens without --repair.
        let mut h = Harness::open(dir.path(), None);
        assert_eq!(h.broker.recovery.truncated_bytes, 0, "{name}");
        let payloads: Vec<Vec<u8>> = h.fetch_all("t").into_iter().map(|m| m.1).collect();
        assert_eq!(payloads, vec![b"one".to_vec(), b"two".to_vec()], "{name}");
    }
}
