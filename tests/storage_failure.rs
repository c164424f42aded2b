//! A failed write or fdatasync never acknowledges what is not durable, and
//! a full disk is not a dead end.
//!
//! The broker is driven directly (no sockets): frames in, `commit`, replies
//! out, with the log's segment files wrapped in a `SegmentFile` whose writes
//! or syncs fail on demand, or that allocates from a small disk of its own
//! (`SmallDisk`) and fails as a full one does (ENOSPC) — what can be tested
//! without mounting a filesystem. tests/full_disk.rs fills a real one.

mod common;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use common::TempDir;
use runnel::broker::{Broker, Config, ConnKey, LoopStats, Now, Outbox, Outcome, Session};
use runnel::codec::{self, Batch, Decoded, ErrorCode, Frame, Ids, Reply, ReplyFrame, Request};
use runnel::limits::Limits;
use runnel::log::{LogOptions, Opener, SegmentFile};
use std::os::unix::fs::FileExt;

/// What the faulty file does next.
const OK: u8 = 0;
const FAIL_SYNC: u8 = 1;
const FAIL_WRITE: u8 = 2;
/// Writes half the buffer, then fails (a torn write).
const TORN_WRITE: u8 = 3;
/// The next sync succeeds, then every write fails (the process dies
/// between a sync and the write after it).
const SYNC_THEN_FAIL_WRITE: u8 = 4;

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
            SYNC_THEN_FAIL_WRITE => {
                self.mode.store(FAIL_WRITE, Ordering::SeqCst);
                self.file.sync_data()
            }
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
    fn out(&mut self, ConnKey(conn): ConnKey) -> Option<&mut Vec<u8>> {
        Some(self.0.entry(conn).or_default())
    }
    fn unblock(&mut self, _conn: ConnKey) {}
}

struct Harness {
    broker: Broker,
    session: Session,
    outs: Outs,
    next_rid: u32,
    now: Now,
}

fn open_segment(p: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(p)
}

/// Opens segment files as `Faulty` ones, doing what `mode` says.
fn faulty(mode: Arc<AtomicU8>) -> Opener {
    Box::new(move |p: &Path| -> io::Result<Box<dyn SegmentFile>> {
        Ok(Box::new(Faulty { file: open_segment(p)?, mode: mode.clone() }))
    })
}

impl Harness {
    fn open(dir: &Path, mode: Option<Arc<AtomicU8>>) -> Harness {
        Harness::open_with(dir, mode.map(faulty), LogOptions::default())
    }

    fn open_with(dir: &Path, opener: Option<Opener>, options: LogOptions) -> Harness {
        Harness::open_config(dir, opener, options, Config::default())
    }

    fn open_config(dir: &Path, opener: Option<Opener>, options: LogOptions, config: Config) -> Harness {
        let now = Now { mono_ms: 1, wall_ms: 1_700_000_000_000 };
        let broker = match opener {
            Some(opener) => Broker::open_with(config, dir, options, opener, now),
            None => Broker::open(config, dir, options, now),
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
        let outcome = self.broker.handle(
            ConnKey(0),
            &mut self.session,
            &Frame { request_id: rid, request: *req },
            self.now,
            &LoopStats::default(),
            &mut out,
        );
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
        self.call(&Request::Produce {
            flags: 0,
            topic,
            batch: Batch { count: payloads.len() as u32, bytes: body, with_props: false },
        })
    }

    /// Fetches everything ready and acks nothing; returns (id, payload).
    /// Fetches until a FETCH gets nothing: one FETCH gets at most what its
    /// turn's work budget has left (`work_items_per_turn_max`).
    fn fetch_all(&mut self, topic: &str) -> Vec<(u64, Vec<u8>)> {
        let req =
            Request::Fetch { topic, group: "", max_messages: 10_000, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 60_000 };
        let mut all = Vec::new();
        loop {
            match self.call(&req) {
                Reply::Messages { messages, .. } if messages.is_empty() => return all,
                Reply::Messages { messages, .. } => all.extend(messages.iter().map(|m| (m.id, m.payload.to_vec()))),
                other => panic!("fetch: {other:?}"),
            }
        }
    }

    fn ack(&mut self, topic: &str, ids: &[u64]) -> Reply<'static> {
        let mut body = Vec::new();
        codec::encode_ids(&mut body, ids);
        self.call(&Request::Ack { topic, group: "", ids: Ids { bytes: &body } })
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

/// Produces one message per dedup id in a version-4 session (the payload
/// is the id).
fn produce_deduped(h: &mut Harness, topic: &str, dedup_ids: &[&'static str]) -> Reply<'static> {
    let mut body = Vec::new();
    for id in dedup_ids {
        let mut blob = Vec::new();
        codec::props::put_dedup_id(&mut blob, id.as_bytes());
        let p = codec::Props::parse(&blob, codec::V4, &codec::PropsLimits::ANY).expect("valid");
        codec::encode_message(&mut body, &p, id.as_bytes());
    }
    let body: &[u8] = &body;
    let batch = Batch { count: dedup_ids.len() as u32, bytes: body, with_props: true };
    h.call(&Request::Produce { flags: 0, topic, batch })
}

/// A PRODUCE answered STORAGE stored nothing, so it leaves no dedup id
/// behind: the same ids retried once storage is back are stored, not
/// answered as duplicates of messages that never were.
#[test]
fn a_failed_commit_withdraws_the_dedup_ids_of_its_produce() {
    for (name, fault) in [("sync", FAIL_SYNC), ("write", FAIL_WRITE)] {
        let dir = TempDir::new(&format!("fail-dedup-{name}"));
        let mode = Arc::new(AtomicU8::new(OK));
        let mut h = Harness::open(dir.path(), Some(mode.clone()));
        let hello = Request::Hello { min_version: 1, max_version: codec::V4, token: b"" };
        assert!(matches!(h.call(&hello), Reply::Hello { version: 4, .. }));
        let Reply::Produced { first_id: kept, count: 1 } = produce_deduped(&mut h, "t", &["kept"]) else {
            panic!("{name}: produce")
        };
        mode.store(fault, Ordering::SeqCst);
        let r = produce_deduped(&mut h, "t", &["kept", "lost-1", "lost-2"]);
        assert!(storage_error(&r), "{name}: want STORAGE, got {r:?}");
        mode.store(OK, Ordering::SeqCst);
        let r = produce_deduped(&mut h, "t", &["kept", "lost-1", "lost-2"]);
        let Reply::Deduplicated { count, duplicates, .. } = r else { panic!("{name}: {r:?}") };
        assert_eq!((count, duplicates), (2, vec![(0, kept)]), "{name}: only the stored one is a duplicate");
        let payloads: Vec<Vec<u8>> = h.fetch_all("t").into_iter().map(|m| m.1).collect();
        assert_eq!(payloads, [&b"kept"[..], b"lost-1", b"lost-2"], "{name}: each stored once");
    }
}

/// Bytes a file takes on `SmallDisk`: whole 4 KiB blocks.
fn blocks(len: u64) -> u64 {
    len.next_multiple_of(4096)
}

/// Says, of a write's bytes, whether it fails.
type WriteFault = Box<dyn FnMut(&[u8]) -> bool + Send>;

/// A disk of `capacity_bytes` shared by the segment files opened through
/// `SmallDisk::opener`. A file's blocks count until it is renamed or
/// removed (the log does both itself, which this cannot see: so it counts
/// only the files still there).
struct SmallDisk {
    capacity_bytes: u64,
    /// Bytes of blocks allocated to each file.
    allocated: HashMap<PathBuf, u64>,
    /// Told of every write's bytes: a write it says so of fails, writing
    /// nothing.
    fail_write: Option<WriteFault>,
    /// Writes failed so.
    writes_failed: usize,
}

impl SmallDisk {
    fn new(capacity_bytes: u64) -> Arc<Mutex<SmallDisk>> {
        Arc::new(Mutex::new(SmallDisk {
            capacity_bytes,
            allocated: HashMap::new(),
            fail_write: None,
            writes_failed: 0,
        }))
    }

    fn free_bytes(&self) -> u64 {
        let used: u64 = self.allocated.iter().filter(|(p, _)| p.exists()).map(|(_, n)| n).sum();
        self.capacity_bytes.saturating_sub(used)
    }

    /// Counts each file's blocks by its length again: a start cuts the
    /// last segment's reserved space itself, which this cannot see.
    fn recount(&mut self) {
        for (p, n) in self.allocated.iter_mut() {
            if let Ok(m) = std::fs::metadata(p) {
                *n = blocks(m.len());
            }
        }
    }

    fn opener(disk: &Arc<Mutex<SmallDisk>>) -> Opener {
        let disk = disk.clone();
        Box::new(move |p: &Path| -> io::Result<Box<dyn SegmentFile>> {
            let file = open_segment(p)?;
            let len = file.metadata()?.len();
            disk.lock().expect("disk").allocated.entry(p.to_path_buf()).or_insert(blocks(len));
            Ok(Box::new(OnSmallDisk { file, path: p.to_path_buf(), disk: disk.clone() }))
        })
    }
}

/// A segment file on a `SmallDisk`.
struct OnSmallDisk {
    file: File,
    path: PathBuf,
    disk: Arc<Mutex<SmallDisk>>,
}

impl OnSmallDisk {
    /// Allocates blocks up to byte `len`, as far as the disk has room;
    /// returns how far the file's blocks then reach.
    fn grow(&mut self, len: u64) -> u64 {
        let mut d = self.disk.lock().expect("disk");
        let free = d.free_bytes();
        let have = d.allocated.get(&self.path).copied().unwrap_or(0);
        let reach = blocks(len).min(have + free / 4096 * 4096).max(have);
        d.allocated.insert(self.path.clone(), reach);
        reach
    }
}

fn no_space() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSPC)
}

impl SegmentFile for OnSmallDisk {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut d = self.disk.lock().expect("disk");
        if d.fail_write.as_mut().is_some_and(|f| f(buf)) {
            d.writes_failed += 1;
            return Err(io::Error::other("injected: I/O error"));
        }
        drop(d);
        let end = offset + buf.len() as u64;
        let reach = self.grow(end);
        if reach >= end {
            return FileExt::write_all_at(&self.file, buf, offset);
        }
        // What fits is written, then ENOSPC: a real full disk's short write.
        let fits = reach.saturating_sub(offset) as usize;
        FileExt::write_all_at(&self.file, &buf[..fits], offset)?;
        Err(no_space())
    }
    fn sync_data(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)?;
        let mut d = self.disk.lock().expect("disk");
        if let Some(n) = d.allocated.get_mut(&self.path) {
            *n = (*n).min(blocks(len));
        }
        Ok(())
    }
    fn reserve(&mut self, len: u64) -> io::Result<()> {
        let before = self.disk.lock().expect("disk").allocated.get(&self.path).copied().unwrap_or(0);
        if self.grow(len) < len {
            // fallocate allocates all or nothing.
            if let Some(n) = self.disk.lock().expect("disk").allocated.get_mut(&self.path) {
                *n = before;
            }
            return Err(no_space());
        }
        SegmentFile::reserve(&mut self.file, len)
    }
    fn free_bytes(&self) -> io::Result<u64> {
        Ok(self.disk.lock().expect("disk").free_bytes())
    }
}

/// The small disk's size: a few thousand 500-byte messages fill it.
const SMALL_DISK_BYTES: u64 = 3 << 20;

/// How the data is freed.
#[derive(Clone, Copy, Debug)]
enum Free {
    Purge,
    Delete,
    Ack,
}

impl Harness {
    fn on_disk(dir: &Path, disk: &Arc<Mutex<SmallDisk>>, segment_bytes_max: u64) -> Harness {
        let options = LogOptions { segment_bytes_max, ..LogOptions::default() };
        Harness::open_with(dir, Some(SmallDisk::opener(disk)), options)
    }

    /// Produces 16-message batches of 500 bytes into "t" until STORAGE;
    /// returns how many were acknowledged.
    fn fill(&mut self) -> usize {
        let payload = [b'p'; 500];
        let batch = [payload.as_slice(); 16];
        let mut acked = 0;
        loop {
            match self.produce("t", &batch) {
                Reply::Produced { count, .. } => acked += count as usize,
                r if storage_error(&r) => return acked,
                r => panic!("filling: {r:?}"),
            }
            assert!(acked * 500 < 2 * SMALL_DISK_BYTES as usize, "the disk never filled");
        }
    }

    fn free(&mut self, how: Free) {
        match how {
            Free::Purge => assert!(matches!(self.call(&Request::PurgeTopic { topic: "t" }), Reply::Count(_))),
            Free::Delete => assert!(matches!(self.call(&Request::DeleteTopic { topic: "t" }), Reply::Count(_))),
            Free::Ack => loop {
                let ids: Vec<u64> = self.fetch_all("t").into_iter().map(|m| m.0).collect();
                if ids.is_empty() {
                    break;
                }
                for chunk in ids.chunks(1000) {
                    assert!(matches!(self.ack("t", chunk), Reply::Ids { .. }));
                }
            },
        }
    }

    /// Produces one message into "after", retrying for some turns while the
    /// broker reclaims; panics if it never succeeds.
    fn produce_again(&mut self, payload: &[u8]) -> u64 {
        for _ in 0..1000 {
            match self.produce("after", &[payload]) {
                Reply::Produced { first_id, .. } => return first_id,
                r if storage_error(&r) => continue,
                r => panic!("produce after freeing: {r:?}"),
            }
        }
        panic!("produces still answered STORAGE after 1,000 turns: the full disk was not reclaimed");
    }
}

/// Fills a small disk, frees the data `how`, and checks that produces are
/// acknowledged again, before and after a restart, and that nothing freed
/// comes back.
fn small_disk(segment_bytes_max: u64, how: Free) {
    let name = format!("small-disk-{segment_bytes_max}-{how:?}");
    let dir = TempDir::new(&name);
    let disk = SmallDisk::new(SMALL_DISK_BYTES);
    let mut h = Harness::on_disk(dir.path(), &disk, segment_bytes_max);
    let filled = h.fill();
    assert!(filled * 500 > SMALL_DISK_BYTES as usize / 2, "{name}: STORAGE after only {filled} messages");
    h.free(how);
    let a = h.produce_again(b"after-1");
    // Room for much more than one message: a quarter of the disk.
    let payload = [b'q'; 500];
    for _ in 0..SMALL_DISK_BYTES / 4 / (16 * 500) {
        assert!(matches!(h.produce("after", &[payload.as_slice(); 16]), Reply::Produced { .. }), "{name}");
    }
    drop(h);

    let mut h = Harness::on_disk(dir.path(), &disk, segment_bytes_max);
    assert!(h.fetch_all("t").is_empty(), "{name}: freed messages came back");
    let after = h.fetch_all("after");
    assert_eq!(after.first(), Some(&(a, b"after-1".to_vec())), "{name}");
    assert_eq!(after.len() as u64, 1 + SMALL_DISK_BYTES / 4 / 500 / 16 * 16, "{name}");
    h.produce_again(b"after-2");
}

#[test]
fn a_full_disk_is_reclaimed_with_default_segments() {
    for how in [Free::Purge, Free::Delete, Free::Ack] {
        small_disk(64 << 20, how);
    }
}

#[test]
fn a_full_disk_is_reclaimed_with_small_segments() {
    for how in [Free::Purge, Free::Delete, Free::Ack] {
        small_disk(64 << 10, how);
    }
}

/// Acking every other message of a full disk leaves half of every segment
/// live: compaction wants to copy that half forward and the disk has no
/// room for it. The copies are dropped and tried again later, never in the
/// way of the acks, which are written (a restart keeps exactly the other
/// half); a purge then frees the disk.
#[test]
fn a_copy_forward_without_room_holds_up_nothing() {
    for segment_bytes_max in [64 << 20, 64 << 10] {
        let dir = TempDir::new("small-disk-half");
        let disk = SmallDisk::new(SMALL_DISK_BYTES);
        let mut h = Harness::on_disk(dir.path(), &disk, segment_bytes_max);
        h.fill();
        let ids: Vec<u64> = h.fetch_all("t").into_iter().map(|m| m.0).collect();
        let acked: Vec<u64> = ids.iter().copied().step_by(2).collect();
        for chunk in acked.chunks(100) {
            let r = h.ack("t", chunk);
            assert!(matches!(r, Reply::Ids { done, .. } if done as usize == chunk.len()), "{r:?}");
        }
        drop(h);
        let mut h = Harness::on_disk(dir.path(), &disk, segment_bytes_max);
        let left: Vec<u64> = h.fetch_all("t").into_iter().map(|m| m.0).collect();
        let want: Vec<u64> = ids.iter().copied().skip(1).step_by(2).collect();
        assert_eq!(left, want, "{segment_bytes_max}: the unacked half, and nothing acked");
        h.free(Free::Purge);
        h.produce_again(b"after");
    }
}

impl Harness {
    /// Produces 16-message batches of 500 bytes into "t", each payload
    /// unique (`unique_payload`), until STORAGE; then acks every message
    /// but `kept` in every `of`. Returns the ids and payloads of those
    /// left.
    fn fill_keeping(&mut self, (kept, of): (usize, usize)) -> Vec<(u64, Vec<u8>)> {
        let mut n = 0;
        loop {
            let batch: Vec<Vec<u8>> = (n..n + 16).map(unique_payload).collect();
            let batch: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
            match self.produce("t", &batch) {
                Reply::Produced { count, .. } => n += count as usize,
                r if storage_error(&r) => break,
                r => panic!("filling: {r:?}"),
            }
            assert!(n * 500 < 2 * SMALL_DISK_BYTES as usize, "the disk never filled");
        }
        let all = self.fetch_all("t");
        assert_eq!(all.len(), n, "setup: every acknowledged message is in flight");
        let (kept, acked): (Vec<_>, Vec<_>) = all.into_iter().enumerate().partition(|(i, _)| i % of < kept);
        let acked: Vec<u64> = acked.into_iter().map(|(_, m)| m.0).collect();
        for chunk in acked.chunks(500) {
            let r = self.ack("t", chunk);
            assert!(matches!(r, Reply::Ids { done, .. } if done as usize == chunk.len()), "{r:?}");
        }
        kept.into_iter().map(|(_, m)| m).collect()
    }

    /// Ends `turns` turns of nothing but a PING (compaction runs in each).
    fn idle(&mut self, turns: usize) {
        for _ in 0..turns {
            assert!(matches!(self.call(&Request::Ping), Reply::Pong), "PING");
        }
    }

    /// Ends PING turns until `done` (at most 2,000; `what` says what is
    /// awaited).
    fn idle_until(&mut self, what: &str, done: impl Fn(&Harness) -> bool) {
        let mut turns = 0;
        while !done(self) {
            self.idle(1);
            turns += 1;
            assert!(turns < 2_000, "no {what} after {turns} turns");
        }
    }
}

/// A small disk of `bytes` with one 64 MiB segment, filled and then freed
/// but for `kept` messages in `of` (`Harness::fill_keeping`).
fn full_disk_keeping(tag: &str, bytes: u64, keep: (usize, usize)) -> FullDisk {
    let dir = TempDir::new(tag);
    let disk = SmallDisk::new(bytes);
    let mut h = Harness::on_disk(dir.path(), &disk, 64 << 20);
    let kept = h.fill_keeping(keep);
    FullDisk { dir, disk, h, kept }
}

/// What `full_disk_keeping` made.
struct FullDisk {
    dir: TempDir,
    disk: Arc<Mutex<SmallDisk>>,
    h: Harness,
    /// The messages left unacked: (id, payload).
    kept: Vec<(u64, Vec<u8>)>,
}

/// Payload `n` of `fill_keeping`: 500 bytes, beginning with `m-NNNNN-`,
/// which no other bytes of the log hold.
fn unique_payload(n: usize) -> Vec<u8> {
    let mut p = format!("m-{n:05}-").into_bytes();
    p.resize(500, b'x');
    p
}

/// The number of a payload of `fill_keeping`.
fn payload_number(payload: &[u8]) -> usize {
    std::str::from_utf8(&payload[2..7]).expect("digits").parse().expect("a number")
}

/// How many times each payload of `fill_keeping` is in the log files of
/// `dir`, by its number.
fn payload_copies(dir: &Path) -> HashMap<usize, usize> {
    let mut copies = HashMap::new();
    for path in common::logdir::segments(dir) {
        let data = std::fs::read(&path).expect("read segment");
        for at in 0..data.len().saturating_sub(8) {
            let w = &data[at..at + 8];
            if w.starts_with(b"m-") && w[7] == b'-' && w[2..7].iter().all(u8::is_ascii_digit) {
                *copies.entry(payload_number(w)).or_default() += 1;
            }
        }
    }
    copies
}

/// A full disk whose one segment keeps two messages in five: cleaning it
/// would free more than half of it, but its copies would need more room
/// than the disk has past the headroom and what compaction's copies leave
/// free. So the cleaning is not begun: copies that could not all be
/// written would take the room that acks and admin records need, and keep
/// it, since only the removal they wait for would give it back. The log
/// stays as it is until more is freed; then the disk is reclaimed.
#[test]
fn a_cleaning_that_could_not_finish_is_not_begun() {
    let FullDisk { dir, disk: _disk, mut h, kept } =
        full_disk_keeping("small-disk-no-room", SMALL_DISK_BYTES + (1 << 20), (2, 5));
    let kept_bytes = kept.len() as u64 * 500;
    assert!(kept_bytes > 1 << 20, "setup: {kept_bytes} bytes live, more than the room for copies");
    let log_bytes = h.broker.log().bytes();
    h.idle(300);
    assert_eq!(h.broker.log().bytes(), log_bytes, "the log grew with nothing but PINGs");
    let copies = payload_copies(dir.path());
    let copied = kept.iter().filter(|m| copies.get(&payload_number(&m.1)) != Some(&1)).count();
    assert_eq!(copied, 0, "messages copied (or lost) by a cleaning that could not finish");
    assert_eq!(h.broker.compactions(), 0);
    // Freeing the rest frees the disk.
    let ids: Vec<u64> = kept.iter().map(|m| m.0).collect();
    for chunk in ids.chunks(500) {
        assert!(matches!(h.ack("t", chunk), Reply::Ids { .. }));
    }
    h.produce_again(b"after");
    assert!(h.broker.compactions() > 0);
}

/// The same full disk with `--produce-headroom-bytes` raised to 2 MiB:
/// produces stop that far from full, and the three quarters of it that
/// compaction's copies may use hold the two messages in five of its one
/// segment, so freeing the other three cleans it.
#[test]
fn a_larger_produce_headroom_cleans_a_segment_that_keeps_more() {
    let dir = TempDir::new("small-disk-more-room");
    let disk = SmallDisk::new(SMALL_DISK_BYTES + (1 << 20));
    let limits = Limits { produce_headroom_bytes: 2 << 20, ..Limits::default() };
    let options = LogOptions { segment_bytes_max: 64 << 20, ..LogOptions::default() };
    let config = Config { limits, ..Config::default() };
    let mut h = Harness::open_config(dir.path(), Some(SmallDisk::opener(&disk)), options, config);
    let kept = h.fill_keeping((2, 5));
    h.idle_until("compaction", |h| h.broker.compactions() > 0);
    let copies = payload_copies(dir.path());
    let copied = kept.iter().filter(|m| copies.get(&payload_number(&m.1)) == Some(&1)).count();
    assert_eq!(copied, kept.len(), "every message kept, once");
    h.produce_again(b"after");
}

/// A cleaning whose copies take two turns: the write of the second slice
/// fails, and so does the restatement's once the copies are all written.
/// The cleaning resumes where each failure left it, so no message is
/// copied twice (each copy left behind would take the disk for good: it
/// stays live as long as its message), and the segment is removed.
#[test]
fn a_cleaning_put_off_resumes_and_copies_each_message_once() {
    let FullDisk { dir, disk, mut h, kept } = full_disk_keeping("small-disk-resume", SMALL_DISK_BYTES, (1, 4));
    assert!(kept.len() * 500 > 300 << 10, "setup: more than a slice of copying");
    // Fail the second big write (the second slice of copies), and the
    // write after the third (the restatement).
    let (mut slices, mut restatement) = (0, false);
    disk.lock().expect("disk").fail_write = Some(Box::new(move |buf: &[u8]| {
        if std::mem::take(&mut restatement) {
            return true;
        }
        if buf.len() < 100 << 10 {
            return false;
        }
        slices += 1;
        restatement = slices == 3;
        slices == 2
    }));
    h.idle_until("compaction", |h| h.broker.compactions() > 0);
    assert_eq!(disk.lock().expect("disk").writes_failed, 2, "setup: both injected failures were met");
    let copies = payload_copies(dir.path());
    for (id, payload) in &kept {
        assert_eq!(copies.get(&payload_number(payload)), Some(&1), "message {id}: copies in the log");
    }
    drop(h);
    let mut h = Harness::on_disk(dir.path(), &disk, 64 << 20);
    assert_eq!(h.fetch_all("t"), kept, "after a restart: the messages kept, once each");
}

/// A crash in the middle of a cleaning: its first slice of copies is
/// written, then every write fails (the process dies there). After the
/// restart, recovery finds those copies after the messages' first records,
/// and the cleaning that begins again (once a produce finds the disk full)
/// copies only the rest: each message is in the log once when the segment
/// is gone, and the restarted cleaning needs no room for what was already
/// copied.
#[test]
fn a_cleaning_a_crash_cut_short_copies_nothing_again() {
    let FullDisk { dir, disk, mut h, kept } = full_disk_keeping("small-disk-crash", SMALL_DISK_BYTES, (1, 4));
    // Every write after the first slice of copies fails.
    let mut copied = false;
    disk.lock().expect("disk").fail_write = Some(Box::new(move |buf: &[u8]| {
        let fail = copied;
        copied |= buf.len() >= 100 << 10;
        fail
    }));
    let failed = disk.clone();
    h.idle_until("second slice of copies", move |_| failed.lock().expect("disk").writes_failed > 0);
    assert_eq!(h.broker.compactions(), 0, "setup: the cleaning was cut short");
    drop(h);
    let twice = payload_copies(dir.path()).values().filter(|&&n| n == 2).count();
    assert!(twice > 0, "setup: the first slice of copies was written");
    disk.lock().expect("disk").fail_write = None;
    let mut h = Harness::on_disk(dir.path(), &disk, 64 << 20);
    disk.lock().expect("disk").recount();
    // A producer finds the disk full, and it is reclaimed.
    h.produce_again(b"after");
    assert_eq!(h.broker.compactions(), 1);
    let copies = payload_copies(dir.path());
    for (id, payload) in &kept {
        assert_eq!(copies.get(&payload_number(payload)), Some(&1), "message {id}: copies in the log");
    }
    assert_eq!(h.fetch_all("t"), kept, "the messages kept, once each");
}

/// Restating many topics takes more than the least headroom: the log keeps
/// what restating every topic takes free, even after the acks of a full
/// disk have used all the space kept for them.
#[test]
fn many_topics_are_restated_on_a_full_disk() {
    const TOPICS: usize = 1500;
    let dir = TempDir::new("small-disk-topics");
    let disk = SmallDisk::new(6 << 20);
    let mut h = Harness::on_disk(dir.path(), &disk, 64 << 20);
    // 1,500 Topic records of 136 bytes: 204 KB to restate.
    let names: Vec<String> = (0..TOPICS).map(|i| format!("{i:0>100}")).collect();
    for name in &names {
        let settings = codec::TopicSettings { ack_timeout_ms: 0, max_deliveries: 0 };
        assert!(matches!(
            h.call(&Request::CreateTopic { topic: name, settings, options: Default::default() }),
            Reply::Created { created: true }
        ));
    }
    // Small messages, so that acking them all takes more than the 1 MiB
    // kept for acks (8 bytes each).
    let batch = [b"m".as_slice(); 1000];
    let mut filled = 0;
    while !storage_error(&h.produce("t", &batch)) {
        filled += batch.len();
    }
    assert!(filled > 150_000, "setup: {filled} messages, whose acks take more than 1 MiB");
    h.free(Free::Ack);
    h.produce_again(b"after");
    drop(h);

    let mut h = Harness::on_disk(dir.path(), &disk, 64 << 20);
    let Reply::Topics(topics) = h.call(&Request::ListTopics) else { panic!("list topics") };
    assert_eq!(topics.len(), TOPICS + 2, "every topic, \"t\" and \"after\"");
    assert!(h.fetch_all("t").is_empty(), "acked messages came back");
    assert_eq!(h.fetch_all("after").len(), 1);
}

impl Harness {
    /// Hands one request to the broker without ending the turn; returns the
    /// request id and what it wrote into the output at once.
    fn send(&mut self, req: &Request<'_>) -> (u32, Vec<u8>) {
        let rid = self.next_rid;
        self.next_rid += 1;
        let mut out = Vec::new();
        let outcome = self.broker.handle(
            ConnKey(0),
            &mut self.session,
            &Frame { request_id: rid, request: *req },
            self.now,
            &LoopStats::default(),
            &mut out,
        );
        assert_ne!(outcome, Outcome::Parked);
        (rid, out)
    }
}

/// Decodes the replies in `out`, by request id.
fn replies(out: &[u8]) -> HashMap<u32, Reply<'_>> {
    let mut got = HashMap::new();
    let mut at = 0;
    while at < out.len() {
        let Ok(Decoded::Frame(ReplyFrame { request_id, reply, .. }, n)) = codec::decode_reply(&out[at..], usize::MAX)
        else {
            panic!("no whole reply at byte {at} of {out:?}");
        };
        got.insert(request_id, reply);
        at += n;
    }
    got
}

/// On a full disk a turn's end still comes in two halves (src/reactor.rs,
/// "The order of a turn"): the write drops the turn's produces and writes
/// the rest, so an ACK answered in the turn may leave before the sync, and
/// the sync answers the PRODUCE beside it STORAGE. A turn of produces
/// alone writes nothing and syncs nothing, and is answered STORAGE too.
#[test]
fn on_a_full_disk_the_write_drops_only_the_produces() {
    let dir = TempDir::new("small-disk-halves");
    let disk = SmallDisk::new(SMALL_DISK_BYTES);
    let mut h = Harness::on_disk(dir.path(), &disk, 64 << 20);
    let filled = h.fill();
    let ids: Vec<u64> = h.fetch_all("t").into_iter().map(|m| m.0).collect();
    assert_eq!(ids.len(), filled, "setup: every acknowledged message is in flight");

    let mut body = Vec::new();
    codec::encode_ids(&mut body, &ids[..1]);
    let (ack_rid, mut out) = h.send(&Request::Ack { topic: "t", group: "", ids: Ids { bytes: &body } });
    assert!(!out.is_empty(), "the ACK is answered at once");
    // As large as the batch that found the disk full.
    let refused = [b'r'; 500];
    let mut batch = Vec::new();
    codec::encode_batch(&mut batch, &[refused.as_slice(); 16]);
    let produce =
        Request::Produce { flags: 0, topic: "t", batch: Batch { count: 16, bytes: &batch, with_props: false } };
    let (produce_rid, held) = h.send(&produce);
    assert!(held.is_empty(), "the PRODUCE's reply is held");

    let mut written = h.broker.write(h.now);
    assert!(written.syncs(), "the ACK's record is written, and the held PRODUCE asks for a sync");
    // Here the loop flushes the ACK's reply: its record is written.
    let mut outs = Outs::default();
    h.broker.sync(&mut written, h.now, &mut outs);
    out.extend_from_slice(&outs.0.remove(&0).unwrap_or_default());
    let got = replies(&out);
    assert!(matches!(got[&ack_rid], Reply::Ids { done: 1, .. }), "ACK: {:?}", got[&ack_rid]);
    assert!(storage_error(&got[&produce_rid]), "PRODUCE: {:?}", got[&produce_rid]);

    // Produces alone: nothing is written, and they are refused all the same.
    let (produce_rid, _) = h.send(&produce);
    let mut written = h.broker.write(h.now);
    assert!(!written.syncs(), "nothing left to write, nothing to sync");
    let mut outs = Outs::default();
    h.broker.sync(&mut written, h.now, &mut outs);
    let out = outs.0.remove(&0).unwrap_or_default();
    let got = replies(&out);
    assert!(storage_error(&got[&produce_rid]), "PRODUCE alone: {:?}", got[&produce_rid]);
    drop(h);

    // After a restart: the acked message is gone, the refused ones never came.
    let mut h = Harness::on_disk(dir.path(), &disk, 64 << 20);
    let left: Vec<(u64, Vec<u8>)> = h.fetch_all("t");
    assert_eq!(left.iter().map(|m| m.0).collect::<Vec<_>>(), ids[1..], "every message but the acked one");
    assert!(!left.iter().any(|m| m.1 == refused), "a refused produce was stored");
}

impl Harness {
    /// ACK_PRODUCE (version 3) of `acked` in `topic`'s default group, with
    /// one output of `payloads` to `to`.
    fn ack_produce(&mut self, topic: &str, acked: &[u64], to: &str, payloads: &[&'static [u8]]) -> Reply<'static> {
        let (ids, outputs) = ack_produce_bodies(acked, to, payloads);
        self.session.version = 3;
        self.call(&ack_produce_request(topic, &ids, &outputs))
    }
}

/// The ids and outputs of an ACK_PRODUCE with one output.
fn ack_produce_bodies(acked: &[u64], to: &str, payloads: &[&'static [u8]]) -> (Vec<u8>, Vec<u8>) {
    let mut ids = Vec::new();
    codec::encode_ids(&mut ids, acked);
    let messages: Vec<_> = payloads.iter().map(|p| (codec::Props::default(), *p)).collect();
    let mut outputs = Vec::new();
    codec::ack_produce::encode_output(&mut outputs, to, &common::frames::batch_v2(&messages));
    (ids, outputs)
}

/// ACK_PRODUCE in `topic`'s default group, of the bodies above.
fn ack_produce_request<'a>(topic: &'a str, ids: &'a [u8], outputs: &'a [u8]) -> Request<'a> {
    let outputs = codec::ack_produce::Outputs { count: 1, bytes: outputs };
    Request::AckProduce { topic, group: "", ids: Ids { bytes: ids }, outputs }
}

/// An ACK_PRODUCE whose commit fails is kept and written with the next
/// commit, its outputs with it: the compactor counts them among the
/// messages of the segment they land in, so removing that segment copies
/// them forward rather than losing them.
#[test]
fn a_failed_ack_produce_keeps_its_outputs_through_compaction() {
    let dir = TempDir::new("ack-produce-failed");
    let mode = Arc::new(AtomicU8::new(OK));
    let options = LogOptions { segment_bytes_max: 64 << 10, ..LogOptions::default() };
    let mut h = Harness::open_with(dir.path(), Some(faulty(mode.clone())), options);
    let Reply::Produced { first_id: job, .. } = h.produce("in", &[b"job"]) else { panic!("produce") };
    assert_eq!(h.fetch_all("in").len(), 1);
    mode.store(FAIL_SYNC, Ordering::SeqCst);
    let r = h.ack_produce("in", &[job], "out", &[b"result"]);
    assert!(storage_error(&r), "want STORAGE, got {r:?}");
    mode.store(OK, Ordering::SeqCst);
    // Dead messages fill segments until the one holding the record goes.
    let pad = [7u8; 1024];
    let mut turns = 0;
    while h.broker.compactions() == 0 {
        turns += 1;
        assert!(turns < 2_000, "no compaction after {turns} rounds");
        assert!(matches!(h.produce("pad", &[pad.as_slice(); 8]), Reply::Produced { .. }));
        let ids: Vec<u64> = h.fetch_all("pad").into_iter().map(|m| m.0).collect();
        assert!(matches!(h.ack("pad", &ids), Reply::Ids { .. }));
    }
    drop(h);
    let mut h = Harness::open(dir.path(), None);
    assert!(h.fetch_all("in").is_empty(), "the input was acked");
    let out: Vec<Vec<u8>> = h.fetch_all("out").into_iter().map(|m| m.1).collect();
    assert_eq!(out, vec![b"result".to_vec()], "the output of the kept ACK_PRODUCE");
}

/// A compaction that restates a group in the turn of an ACK_PRODUCE of
/// that group syncs the restatement before the turn's records: the process
/// dies between that sync and the turn's write (here the write fails, and
/// the broker is dropped). After a restart the ACK_PRODUCE happened whole
/// or not at all: the input is owed and no output exists, or the input is
/// acked and its output is there. The input is in the segment removed, or
/// in the next one (then only the group's state is restated).
#[test]
fn a_compaction_in_the_turn_of_an_ack_produce_keeps_it_whole() {
    for input_in_removed in [true, false] {
        compaction_in_the_turn_of_an_ack_produce(input_in_removed);
    }
}

fn compaction_in_the_turn_of_an_ack_produce(input_in_removed: bool) {
    let dir = TempDir::new("ack-produce-compaction");
    let mode = Arc::new(AtomicU8::new(OK));
    let options = LogOptions { segment_bytes_max: 64 << 10, ..LogOptions::default() };
    let mut h = Harness::open_with(dir.path(), Some(faulty(mode.clone())), options);
    // The group's first records are in the first segment.
    let first = if input_in_removed { b"job".as_slice() } else { b"early" };
    let Reply::Produced { first_id: mut job, .. } = h.produce("in", &[first]) else { panic!("produce") };
    assert_eq!(h.fetch_all("in").len(), 1);
    // Dead messages close the first segment.
    let pad = [7u8; 1024];
    while common::logdir::segments(dir.path()).len() < 2 {
        assert!(matches!(h.produce("pad", &[pad.as_slice(); 8]), Reply::Produced { .. }));
        let ids: Vec<u64> = h.fetch_all("pad").into_iter().map(|m| m.0).collect();
        assert!(matches!(h.ack("pad", &ids), Reply::Ids { .. }));
    }
    if !input_in_removed {
        assert!(matches!(h.ack("in", &[job]), Reply::Ids { done: 1, .. }));
        let Reply::Produced { first_id, .. } = h.produce("in", &[b"job"]) else { panic!("produce") };
        job = first_id;
        assert_eq!(h.fetch_all("in").len(), 1);
    }
    assert_eq!(h.broker.compactions(), 0, "setup: the first segment holds a message in flight");
    // One turn: the ACK_PRODUCE leaves the first segment dead, and a PURGE
    // makes the compactor look at it at once.
    let (ids, outputs) = ack_produce_bodies(&[job], "out", &[b"result"]);
    h.session.version = 3;
    h.send(&ack_produce_request("in", &ids, &outputs));
    h.send(&Request::PurgeTopic { topic: "pad" });
    mode.store(SYNC_THEN_FAIL_WRITE, Ordering::SeqCst);
    let mut written = h.broker.write(h.now);
    h.broker.sync(&mut written, h.now, &mut Outs::default());
    drop(h);

    let mut h = Harness::open(dir.path(), None);
    let input: Vec<u64> = h.fetch_all("in").into_iter().map(|m| m.0).collect();
    let out: Vec<Vec<u8>> = h.fetch_all("out").into_iter().map(|m| m.1).collect();
    let whole = input.is_empty() && out == vec![b"result".to_vec()];
    let nothing = input == vec![job] && out.is_empty();
    let ctx = format!("input in the removed segment: {input_in_removed}");
    assert!(whole || nothing, "{ctx}: half of the ACK_PRODUCE happened: input owed {input:?}, outputs {out:?}");
}

// ---------------------------------------------------------------------------
// Delivery counts across crashes and compaction.
// ---------------------------------------------------------------------------

impl Harness {
    /// FETCHes up to `max` messages; returns (id, delivery_count).
    fn fetch_counts(&mut self, topic: &str, max: u32) -> Vec<(u64, u16)> {
        let req = Request::Fetch { topic, group: "", max_messages: max, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
        match self.call(&req) {
            Reply::Messages { messages, .. } => messages.iter().map(|m| (m.id, m.delivery_count)).collect(),
            other => panic!("fetch: {other:?}"),
        }
    }

    fn nack(&mut self, topic: &str, ids: &[u64]) -> Reply<'static> {
        let mut body = Vec::new();
        codec::encode_ids(&mut body, ids);
        self.call(&Request::Nack { topic, group: "", delay_ms: 0, flags: 0, ids: Ids { bytes: &body }, reason: "" })
    }
}

/// Every delivery is counted across crashes (the broker dropped without a
/// stop, its last turn written) while compaction restates the group in the
/// very turns that deliver: a seeded run of produces, FETCHes, NACKs, ACKs
/// and crashes against a model of each message's deliveries. Compaction
/// writes its restatement ahead of the turn's Deliver records, so it must
/// state the counts without them, or replay counts them twice.
#[test]
fn delivery_counts_survive_crashes_and_compaction() {
    for seed in runnel::testkit::seeds(4) {
        println!("seed {seed}");
        let mut rng = common::Rng::new(seed);
        let dir = TempDir::new("counted");
        let small = || LogOptions { segment_bytes_max: 16 << 10, ..LogOptions::default() };
        let mut h = Harness::open_with(dir.path(), None, small());
        // Deliveries so far of each unacked message, and which are in flight.
        let mut model: std::collections::BTreeMap<u64, u16> = Default::default();
        let mut inflight: Vec<u64> = Vec::new();
        let payload = vec![b'p'; 400];
        // Segments compacted, over every run of the broker.
        let mut compacted = 0;
        for step in 0..2000 {
            match rng.below(50u64) {
                0..=9 => {
                    let Reply::Produced { first_id, count } = h.produce("t", &[&payload, &payload]) else {
                        panic!("seed {seed}: produce")
                    };
                    model.extend((first_id..first_id + u64::from(count)).map(|id| (id, 0)));
                }
                10..=29 => {
                    for (id, count) in h.fetch_counts("t", 1 + rng.below(3u32)) {
                        let d = model.get_mut(&id).unwrap_or_else(|| panic!("seed {seed}: step {step}: {id}"));
                        *d += 1;
                        assert_eq!(count, *d, "seed {seed}: step {step}: message {id}");
                        inflight.push(id);
                    }
                }
                30..=31 if !inflight.is_empty() => {
                    let ids: Vec<u64> = inflight.drain(..).filter(|_| rng.below(2u64) == 0).collect();
                    h.nack("t", &ids);
                }
                32..=35 => {
                    // Acks the in-flight messages delivered most often, so
                    // that none reaches max_deliveries.
                    let (done, keep): (Vec<u64>, Vec<u64>) =
                        inflight.drain(..).partition(|id| model[id] >= 8 || rng.below(3u64) == 0);
                    h.ack("t", &done);
                    model.retain(|id, _| !done.contains(id));
                    inflight = keep;
                }
                36..=47 => {
                    // Traffic on another topic, done with at once: it fills
                    // segments that compaction removes, restating t's group.
                    h.produce("junk", &[&payload, &payload, &payload]);
                    let ids: Vec<u64> = h.fetch_all("junk").iter().map(|m| m.0).collect();
                    h.ack("junk", &ids);
                }
                _ => {
                    // A crash: the broker goes without a stop.
                    compacted += h.broker.compactions();
                    drop(h);
                    h = Harness::open_with(dir.path(), None, small());
                    inflight.clear();
                }
            }
        }
        compacted += h.broker.compactions();
        drop(h);
        let mut h = Harness::open_with(dir.path(), None, small());
        let got = h.fetch_counts("t", 100_000);
        let want: Vec<(u64, u16)> = model.iter().map(|(id, d)| (*id, d + 1)).collect();
        let mut got_sorted = got.clone();
        got_sorted.sort_unstable();
        assert_eq!(got_sorted, want, "seed {seed}: every unacked message, its deliveries counted");
        println!("seed {seed}: {compacted} segments compacted");
        assert!(compacted > 0, "seed {seed}: the run compacted nothing");
    }
}

/// The records a failed commit keeps for the next one are bounded by
/// `unwritten_records_bytes_max`: while the disk keeps failing they pile
/// up to it, then are dropped (and the log says so once), and once the
/// disk works again the log commits what came after the drop. A commit
/// ahead (compaction's restatement) larger than the bound fails without
/// dropping the turn's records.
#[test]
fn records_kept_for_a_failing_disk_are_bounded() {
    use runnel::log::{Log, RecordKind};
    const RECORD_BYTES: u64 = 100;
    let dir = TempDir::new("unwritten-bound");
    let mode = Arc::new(AtomicU8::new(OK));
    let options = LogOptions { unwritten_records_bytes_max: 10 * RECORD_BYTES, ..LogOptions::default() };
    let (mut log, _) = Log::open_with(dir.path(), options, faulty(mode.clone()), |_| Ok(())).expect("open");
    let append = |log: &mut Log, n: u32| {
        let start = log.begin(RecordKind::Produce);
        log.body().extend_from_slice(&n.to_le_bytes());
        log.body().extend_from_slice(&[0xa5; RECORD_BYTES as usize - 12 - 4]);
        log.end(start);
    };
    let turn = |log: &mut Log, from: u32| {
        (from..from + 3).for_each(|n| append(log, n));
        log.commit(true)
    };
    turn(&mut log, 0).expect("the disk works");
    mode.store(FAIL_WRITE, Ordering::SeqCst);
    // Three turns of 3 records are kept (900 bytes); the fourth passes the
    // bound, and all twelve go.
    for (i, from) in [10, 20, 30].into_iter().enumerate() {
        assert!(turn(&mut log, from).is_err());
        assert_eq!(log.unwritten_bytes(), 3 * (i as u64 + 1) * RECORD_BYTES, "kept for the next commit");
        assert!(!log.take_unwritten_dropped());
    }
    let aside = log.set_aside();
    (100..120).for_each(|n| append(&mut log, n));
    assert!(log.commit_ahead(aside).is_err());
    assert!(!log.take_unwritten_dropped(), "a restatement's failure drops none of the turn's records");
    assert_eq!(log.unwritten_bytes(), 9 * RECORD_BYTES);
    assert!(turn(&mut log, 40).is_err());
    assert_eq!(log.unwritten_bytes(), 0, "past the bound, every kept record is dropped");
    assert!(log.take_unwritten_dropped());
    assert!(!log.take_unwritten_dropped(), "said once");
    assert!(turn(&mut log, 50).is_err());
    mode.store(OK, Ordering::SeqCst);
    turn(&mut log, 60).expect("the disk works again");
    drop(log);
    let mut firsts = Vec::new();
    Log::open(dir.path(), LogOptions::default(), |r| {
        firsts.push(u32::from_le_bytes(r.body[..4].try_into().expect("4 bytes")));
        Ok(())
    })
    .expect("reopen");
    assert_eq!(firsts, [0, 1, 2, 50, 51, 52, 60, 61, 62], "the records before the drop, and those after it");
}
