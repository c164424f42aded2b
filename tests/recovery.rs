//! Recovery from damaged commit logs, with random damage: a torn tail of a
//! crashed run is cut back to the last whole write (the write that holds
//! the damage goes whole); damage anywhere else stops start-up with an
//! error naming the file and offset, unless `repair` drops exactly the
//! damaged record and keeps every other.
//! (`tests/corrupt_log.rs` makes each kind of damage by hand.)
//!
//! Each test builds a real log with a broker running in-process (small
//! segments, so there are many), stops it, then damages copies of the data
//! directory and reopens them, read through `common::logdir` (record frames
//! only; messages found by their payloads). A test of a crash removes the
//! clean-stop marker the graceful stop left: a crash leaves none.
//!
//! The last tests restart a broker after a commit that failed (an injected
//! `fdatasync` failure): what the log lost with that turn must not make
//! recovery lose what later turns acknowledged.
//!
//! Seeds: `RUNNEL_SEED` replays a run; every assertion prints the seed.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::logdir::{
    HEADER_BYTES, KIND_PRODUCE, KIND_WRITE, Msgs, Rec, assert_nothing_invented, base_of, broker_records, contains,
    copy_dir, crashed, fetch_all, file_len, records, segments, without_payloads_in, write_record_bytes, write_start,
};
use common::{Rng, Server, TempDir};
use runnel::broker::{Broker, Config, ConnKey, LoopStats, Now, Outbox, Session};
use runnel::client::Fetch;
use runnel::codec::{self, Batch, Decoded, ErrorCode, Frame, Reply, ReplyFrame, Request};
use runnel::log::{LogOptions, OpenError, SegmentFile};
use std::os::unix::fs::FileExt;

/// Small segments, so a few hundred messages make many of them.
const SEGMENT_BYTES_MAX: u64 = 4096;
/// Messages produced before any ack (phase 1 of `build`).
const PHASE1_MESSAGES: usize = 160;
/// Records at the tail of the last segment the truncation test cuts into.
const TAIL_RECORDS: usize = 4;
/// Mixed into the seed of the bit-flip generators, so they differ from
/// `build`'s.
const FLIP_SALT: u64 = 0x0f11_9b17;

// ---------------------------------------------------------------------------
// The log under test and what it should hold.
// ---------------------------------------------------------------------------

/// A data directory built by `build` and what the test did to it.
struct Built {
    dir: TempDir,
    /// Every message produced (and acknowledged), acked or not.
    produced: Msgs,
    /// What a clean restart must hold: produced minus acked.
    live: Msgs,
}

/// A payload unique to message `n`: its tag, then filler of a random length.
fn payload(n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut p = format!("<msg-{n:06}>").into_bytes();
    let filler = 100 + rng.below(200) as usize;
    p.extend((0..filler).map(|_| b'a' + rng.below(26) as u8));
    p
}

/// Builds a log over many small segments with a broker in-process:
/// 1. `PHASE1_MESSAGES` messages over two topics, alone or in batches, and
///    no acks (so every record before the first ack is a Topic or Produce);
/// 2. some messages fetched, about half of those acked (Remove records),
///    the rest left in flight until the consumer closes (a Requeue record);
/// 3. single-message produces, each its own turn and so its own record,
///    until the last `TAIL_RECORDS` records of the last segment are such
///    produces.
fn build(seed: u64) -> Built {
    let mut rng = Rng(seed);
    let dir = TempDir::new("recovery-src");
    let opts = LogOptions { segment_bytes_max: SEGMENT_BYTES_MAX, ..LogOptions::default() };
    let srv = Server::start_in(Config::default(), opts, dir.path());
    let mut c = srv.client();
    let mut produced = Msgs::new();
    let mut n = 0usize;
    let topics = ["alpha", "beta"];
    while n < PHASE1_MESSAGES {
        let topic = topics[rng.below(2) as usize];
        let count = 1 + rng.below(4) as usize;
        let batch: Vec<Vec<u8>> = (n..n + count).map(|i| payload(i, &mut rng)).collect();
        n += count;
        let (first, got) = c.produce_batch(topic, &batch).expect("produce");
        assert_eq!(got as usize, count, "seed {seed}");
        for (i, p) in batch.into_iter().enumerate() {
            assert!(produced.insert((topic.to_string(), first + i as u64), p).is_none(), "seed {seed}: id reused");
        }
    }
    // A consumer of its own, whose close (a Requeue record of what it left
    // in flight) comes before the single produces of phase 3 end the log.
    let mut consumer = srv.client();
    let mut acked = BTreeSet::new();
    for topic in topics {
        let msgs = consumer.fetch(topic, Fetch { max_messages: 40, ..Fetch::default() }).expect("fetch");
        let ids: Vec<u64> = msgs.iter().map(|m| m.id).filter(|_| rng.below(2) == 0).collect();
        let r = consumer.ack(topic, &ids).expect("ack");
        assert!(r.failed.is_empty(), "seed {seed}: ack failed for {:?}", r.failed);
        acked.extend(ids.into_iter().map(|id| (topic.to_string(), id)));
    }
    drop(consumer);
    for _ in 0..200 {
        let p = payload(n, &mut rng);
        n += 1;
        let id = c.produce("alpha", &p).expect("produce");
        produced.insert(("alpha".to_string(), id), p);
        let last = segments(dir.path()).pop().expect("a segment");
        let data = fs::read(&last).expect("read segment");
        let recs = broker_records(&records(&data));
        if recs.len() >= TAIL_RECORDS
            && recs[recs.len() - TAIL_RECORDS..].iter().all(|r| {
                let body = &data[r.start as usize..r.end as usize];
                r.kind == KIND_PRODUCE && produced.values().filter(|p| contains(body, p)).count() == 1
            })
        {
            break;
        }
    }
    drop(c);
    srv.stop();
    let live: Msgs =
        produced.iter().filter(|(k, _)| !acked.contains(*k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    let built = Built { dir, produced, live };
    assert!(segments(built.dir.path()).len() >= 5, "seed {seed}: the log should span several segments");
    // On a copy: a FETCH writes a Deliver record, and the tests cut the
    // original's last records.
    let check = copy_dir(built.dir.path(), "recovery-check");
    assert_eq!(fetch_all(check.path()), built.live, "seed {seed}: a clean restart must hold produced minus acked");
    built
}

/// Opens the broker on `dir` in-process, without sockets.
fn open(dir: &Path, repair: bool) -> Result<Broker, OpenError> {
    Broker::open(Config::default(), dir, LogOptions { repair, ..LogOptions::default() }, Now::default())
}

/// Flips 1 to 3 random bits in `data[start..end]`.
fn flip_bits(data: &mut [u8], start: u64, end: u64, rng: &mut Rng) -> Vec<(u64, u8)> {
    let mut flipped = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let at = start + rng.below(end - start);
        let bit = rng.below(8) as u8;
        data[at as usize] ^= 1 << bit;
        flipped.push((at, bit));
    }
    flipped
}

// ---------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------

/// A crash mid-write leaves the last segment cut anywhere. For every byte
/// offset of its last record (and some of the records before it), start-up
/// must succeed, cut the file back to the last whole write, and hold
/// exactly the messages whose writes lie wholly before the cut.
#[test]
fn truncated_tail_recovers_the_prefix_at_every_offset() {
    let seed = common::seed(0x7e57_0001);
    println!("seed {seed}");
    let b = build(seed);
    let seg = segments(b.dir.path()).pop().expect("a segment");
    let name = seg.file_name().expect("name").to_owned();
    let data = fs::read(&seg).expect("read");
    let all = records(&data);
    let recs = broker_records(&all);
    let tail = &recs[recs.len() - TAIL_RECORDS..];
    // Where each write ends: where the next begins, or where the records do.
    let write_ends: Vec<u64> =
        all.iter().filter(|r| r.kind == KIND_WRITE).skip(1).map(|w| w.start).chain(all.last().map(|r| r.end)).collect();
    let last = tail[TAIL_RECORDS - 1];
    let mut cuts: BTreeSet<u64> = (last.start..=last.end).collect();
    for r in &tail[..TAIL_RECORDS - 1] {
        let mid = (r.start + r.end) / 2;
        cuts.extend([r.start, r.start + 1, r.start + HEADER_BYTES - 1, r.start + HEADER_BYTES, mid, r.end - 1]);
    }
    for cut in cuts {
        let ctx = format!("seed {seed}, {} cut to {cut} bytes (of {})", seg.display(), data.len());
        let copy = copy_dir(b.dir.path(), "recovery-cut");
        crashed(copy.path());
        let path = copy.path().join(&name);
        fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(cut)).expect("truncate");
        let boundary = write_ends.iter().copied().chain([0]).filter(|&e| e <= cut).max().unwrap_or(0);
        // The records cut into are all single produces (checked by `build`),
        // so losing them loses exactly their messages and no ack.
        assert!(
            all.iter().filter(|r| r.end > cut).all(|r| matches!(r.kind, KIND_PRODUCE | KIND_WRITE)),
            "{ctx}: setup"
        );
        let broker =
            open(copy.path(), false).unwrap_or_else(|e| panic!("{ctx}: a torn tail must not stop start-up: {e}"));
        assert_eq!(broker.recovery.truncated_bytes, cut - boundary, "{ctx}: bytes reported cut");
        assert_eq!(broker.recovery.repaired_bytes, 0, "{ctx}: a torn tail is not a repair");
        drop(broker);
        assert_eq!(file_len(&path), boundary, "{ctx}: the file must be cut back to the write boundary");
        let expected = without_payloads_in(&b.live, &data[boundary as usize..]);
        let got = fetch_all(copy.path());
        assert_nothing_invented(&got, &b.produced, &ctx);
        assert_eq!(got, expected, "{ctx}: must hold exactly the messages of whole writes before the cut");
    }
}

/// After a crash, bits flipped in the last record of the last segment look
/// like a torn write: its write is cut and the prefix recovered, without
/// --repair.
#[test]
fn damaged_last_record_is_a_torn_tail() {
    let seed = common::seed(0x7e57_0002);
    println!("seed {seed}");
    let b = build(seed);
    let mut rng = Rng(seed ^ FLIP_SALT);
    let seg = segments(b.dir.path()).pop().expect("a segment");
    let name = seg.file_name().expect("name").to_owned();
    let data = fs::read(&seg).expect("read");
    let all = records(&data);
    let last = *all.last().expect("a record");
    assert_eq!(last.kind, KIND_PRODUCE, "seed {seed}: setup");
    let write = write_start(&all, last);
    for trial in 0..12 {
        let copy = copy_dir(b.dir.path(), "recovery-lastflip");
        crashed(copy.path());
        let path = copy.path().join(&name);
        let mut bad = data.clone();
        let flipped = flip_bits(&mut bad, last.start, last.end, &mut rng);
        fs::write(&path, &bad).expect("write");
        let ctx = format!("seed {seed}, trial {trial}, bits flipped at (byte, bit) {flipped:?} of {}", seg.display());
        let broker = open(copy.path(), false).unwrap_or_else(|e| panic!("{ctx}: must recover the prefix: {e}"));
        // The cut takes the torn record's write and the space reserved
        // after it.
        assert_eq!(broker.recovery.truncated_bytes, data.len() as u64 - write, "{ctx}: bytes reported cut");
        drop(broker);
        assert_eq!(file_len(&path), write, "{ctx}: the file must be cut at the damaged record's write");
        let got = fetch_all(copy.path());
        assert_nothing_invented(&got, &b.produced, &ctx);
        assert_eq!(got, without_payloads_in(&b.live, &data[last.start as usize..]), "{ctx}: the prefix");
    }
}

/// Bits flipped in a Produce record of a segment that is not the last:
/// start-up fails with `OpenError::Corrupt` naming the file, the record's
/// offset, the bytes --repair would drop, and --repair, and changes
/// nothing. With `repair`, start-up drops exactly that record's bytes
/// (the file rewritten without them, the later segments renamed to follow
/// it), reports them, and holds every message but that record's; a plain
/// start then needs no flag.
#[test]
fn damage_before_the_tail_stops_startup_and_repair_drops_only_the_damaged_record() {
    let seed = common::seed(0x7e57_0003);
    println!("seed {seed}");
    let b = build(seed);
    let mut rng = Rng(seed ^ FLIP_SALT);
    let segs = segments(b.dir.path());
    let datas: Vec<Vec<u8>> = segs.iter().map(|p| fs::read(p).expect("read")).collect();
    let candidates: Vec<(usize, Rec)> = (0..segs.len() - 1)
        .flat_map(|s| records(&datas[s]).into_iter().filter(|r| r.kind == KIND_PRODUCE).map(move |r| (s, r)))
        .collect();
    assert!(candidates.len() > 20, "seed {seed}: setup: {} candidate records", candidates.len());
    for trial in 0..16 {
        let (s, r) = candidates[rng.below(candidates.len() as u64) as usize];
        let copy = copy_dir(b.dir.path(), "recovery-flip");
        let path = copy.path().join(segs[s].file_name().expect("name"));
        let mut bad = datas[s].clone();
        let flipped = flip_bits(&mut bad, r.start, r.end, &mut rng);
        fs::write(&path, &bad).expect("write");
        let ctx = format!(
            "seed {seed}, trial {trial}, segment {} of {}, record at byte {}, bits flipped at (byte, bit) {flipped:?}",
            s + 1,
            segs.len(),
            r.start
        );
        assert_refused_at(copy.path(), &path, r, &ctx);
        assert_eq!(fs::read(&path).expect("read"), bad, "{ctx}: a refused start must not change the file");
        assert_eq!(segments(copy.path()).len(), segs.len(), "{ctx}: a refused start must not remove segments");
        assert_repair_drops_only(&b, copy.path(), &path, &datas[s], r, &ctx);
    }
}

/// Asserts that a start on `dir` refuses, naming `path`, the damaged
/// record `r` and what --repair would drop.
fn assert_refused_at(dir: &Path, path: &Path, r: Rec, ctx: &str) {
    let err = match open(dir, false) {
        Ok(broker) => panic!(
            "{ctx}: damage followed by records must stop start-up; it cut {} bytes as a torn tail",
            broker.recovery.truncated_bytes
        ),
        Err(e) => e,
    };
    let shown = err.to_string();
    match &err {
        OpenError::Corrupt { file, offset, .. } => {
            assert_eq!(file, path, "{ctx}: the error must name the damaged file: {shown}");
            assert_eq!(*offset, r.start, "{ctx}: the error must give the damaged record's offset: {shown}");
        }
        other => panic!("{ctx}: expected OpenError::Corrupt, got {other:?}: {shown}"),
    }
    assert!(shown.contains(&path.display().to_string()), "{ctx}: message must name the file: {shown}");
    assert!(shown.contains(&format!("byte {}", r.start)), "{ctx}: message must give the offset: {shown}");
    let range = format!("bytes {}..{} ({} bytes)", r.start, r.end, r.end - r.start);
    assert!(shown.contains(&range), "{ctx}: message must say repair drops {range}: {shown}");
    assert!(shown.contains("--repair"), "{ctx}: message must mention --repair: {shown}");
}

/// Repairs `dir`, whose segment holding `data` has its record `r`
/// damaged, and asserts that exactly that record was dropped: the bytes
/// reported, the files left (contiguous, the damaged one shorter by the
/// record), and the messages a plain start then holds.
fn assert_repair_drops_only(b: &Built, dir: &Path, path: &Path, data: &[u8], r: Rec, ctx: &str) {
    let before = segments(dir);
    let broker = open(dir, true).unwrap_or_else(|e| panic!("{ctx}: --repair must start: {e}"));
    assert_eq!(broker.recovery.repaired_bytes, r.end - r.start, "{ctx}: repair drops exactly the record");
    drop(broker);
    let after = segments(dir);
    assert_eq!(after.len(), before.len(), "{ctx}: repair keeps every segment");
    for w in after.windows(2) {
        assert_eq!(base_of(&w[0]) + file_len(&w[0]), base_of(&w[1]), "{ctx}: segments contiguous after repair");
    }
    let recs = records(data);
    let records_end = recs.last().expect("a record").end;
    // Rewritten without its Write records too: the bytes dropped would make
    // the offsets they give stale.
    let rewritten = records_end - (r.end - r.start) - write_record_bytes(&recs);
    assert_eq!(file_len(path), rewritten, "{ctx}: the file is rewritten without the record");
    let expected = without_payloads_in(&b.live, &data[r.start as usize..r.end as usize]);
    let got = fetch_all(dir);
    assert_nothing_invented(&got, &b.produced, ctx);
    assert_eq!(got, expected, "{ctx}: --repair must keep every message but the damaged record's");
}

/// After a crash, bits flipped in a record of the last segment that a
/// later write follows are not a torn tail: its produce's turn synced it
/// before it was acknowledged, and the later write's Write record says so,
/// so cutting there would lose acknowledged messages. Start-up refuses;
/// --repair drops that record only.
#[test]
fn damage_before_the_last_record_of_the_last_segment_stops_startup() {
    let seed = common::seed(0x7e57_0004);
    println!("seed {seed}");
    let b = build(seed);
    let mut rng = Rng(seed ^ FLIP_SALT);
    let seg = segments(b.dir.path()).pop().expect("a segment");
    let name = seg.file_name().expect("name").to_owned();
    let data = fs::read(&seg).expect("read");
    let recs = records(&data);
    // Not the last record: one with at least one intact record after it.
    let candidates: Vec<Rec> = recs[..recs.len() - 1].iter().copied().filter(|r| r.kind == KIND_PRODUCE).collect();
    assert!(!candidates.is_empty(), "seed {seed}: setup");
    for trial in 0..8 {
        let r = candidates[rng.below(candidates.len() as u64) as usize];
        let copy = copy_dir(b.dir.path(), "recovery-lastseg");
        crashed(copy.path());
        let path = copy.path().join(&name);
        let mut bad = data.clone();
        let flipped = flip_bits(&mut bad, r.start, r.end, &mut rng);
        fs::write(&path, &bad).expect("write");
        let ctx = format!(
            "seed {seed}, trial {trial}, record at byte {} of {} ({} records), bits flipped at (byte, bit) {flipped:?}",
            r.start,
            seg.display(),
            recs.len()
        );
        assert_refused_at(copy.path(), &path, r, &ctx);
        assert_repair_drops_only(&b, copy.path(), &path, &data, r, &ctx);
    }
}

/// A whole record frame (docs/log-format.md) of `kind` around `body`.
fn record_frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend_from_slice(&(body.len() as u32).to_le_bytes());
    r.extend_from_slice(&[0; 4]);
    r.extend_from_slice(&[kind, 1, 0, 0]);
    r.extend_from_slice(body);
    let mut h = crc32fast::Hasher::new();
    h.update(&r[0..4]);
    h.update(&r[8..]);
    let crc = h.finalize();
    r[4..8].copy_from_slice(&crc.to_le_bytes());
    r
}

/// A crash that cuts the last record inside its payload is a torn tail,
/// whatever bytes the payload holds. Payloads are arbitrary bytes: one may
/// well contain a whole record frame (a message carrying a piece of a
/// runnel log, say). Start-up must still cut the tail, not take the frame
/// inside the torn payload for a later record and refuse to start.
#[test]
fn torn_tail_whose_payload_embeds_a_record_is_still_a_torn_tail() {
    let dir = TempDir::new("recovery-embedded");
    let srv = Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut c = srv.client();
    let first = c.produce("t", b"first message").expect("produce");
    let embedded = record_frame(KIND_PRODUCE, b"not a record of this log, just payload bytes");
    let mut payload = vec![b'x'; 200];
    payload.extend_from_slice(&embedded);
    payload.extend_from_slice(&[b'y'; 200]);
    c.produce("t", &payload).expect("produce");
    drop(c);
    srv.stop();
    crashed(dir.path());

    let seg = segments(dir.path()).pop().expect("a segment");
    let data = fs::read(&seg).expect("read");
    let all = records(&data);
    let last = *all.last().expect("a record");
    let write = write_start(&all, last);
    let at = data.windows(embedded.len()).position(|w| w == embedded.as_slice()).expect("the payload is in the log");
    // Cut after the embedded frame, inside the trailing filler: a write
    // torn there leaves the frame whole in the torn bytes.
    let cut = (at + embedded.len() + 100) as u64;
    assert!(last.start < at as u64 && cut < last.end, "setup: the cut is inside the last record");
    fs::OpenOptions::new().write(true).open(&seg).and_then(|f| f.set_len(cut)).expect("truncate");

    let broker = open(dir.path(), false)
        .unwrap_or_else(|e| panic!("a torn tail must not stop start-up, whatever its payload holds: {e}"));
    assert_eq!(broker.recovery.truncated_bytes, cut - write, "bytes reported cut");
    drop(broker);
    assert_eq!(file_len(&seg), write, "the file must be cut at the torn record's write");
    let got = fetch_all(dir.path());
    assert_eq!(got, [(("t".to_string(), first), b"first message".to_vec())].into(), "the prefix");
}

// ---------------------------------------------------------------------------
// A failed commit must not leave the log missing what later records need.
// ---------------------------------------------------------------------------

/// A segment file whose `fdatasync` fails while `fail` is set.
struct FailingSync {
    file: fs::File,
    fail: Arc<AtomicBool>,
}

impl SegmentFile for FailingSync {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(&self.file, buf, offset)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected: fdatasync failed"));
        }
        self.file.sync_data()
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn reserve(&mut self, len: u64) -> io::Result<()> {
        SegmentFile::reserve(&mut self.file, len)
    }
}

/// Output buffers of the in-process broker's one connection.
#[derive(Default)]
struct Outs(Vec<u8>);

impl Outbox for Outs {
    fn out(&mut self, _conn: ConnKey) -> Option<&mut Vec<u8>> {
        Some(&mut self.0)
    }
    fn unblock(&mut self, _conn: ConnKey) {}
}

/// Serves `req` as one whole turn (handle, commit) of `broker` and returns
/// whether its reply is an error, and which.
fn turn(broker: &mut Broker, session: &mut Session, rid: u32, req: &Request<'_>) -> Result<(), u8> {
    let now = Now { mono_ms: 1, wall_ms: 1_700_000_000_000 };
    let mut outs = Outs::default();
    broker.handle(
        ConnKey(0),
        session,
        &Frame { request_id: rid, request: *req },
        now,
        &LoopStats::default(),
        &mut outs.0,
    );
    broker.commit(now, &mut outs);
    match codec::decode_reply(&outs.0, usize::MAX) {
        Ok(Decoded::Frame(ReplyFrame { reply: Reply::Error { code, .. }, .. }, _)) => Err(code),
        Ok(Decoded::Frame(..)) => Ok(()),
        other => panic!("no whole reply: {other:?}"),
    }
}

/// An in-process broker on `dir` whose syncs fail while the returned flag
/// is set, past its HELLO.
fn failing_broker(dir: &Path) -> (Broker, Session, Arc<AtomicBool>) {
    let fail = Arc::new(AtomicBool::new(false));
    let f = fail.clone();
    let opener = Box::new(move |p: &Path| -> io::Result<Box<dyn SegmentFile>> {
        let file = fs::OpenOptions::new().create(true).truncate(false).write(true).open(p)?;
        Ok(Box::new(FailingSync { file, fail: f.clone() }) as Box<dyn SegmentFile>)
    });
    let mut broker =
        Broker::open_with(Config::default(), dir, LogOptions::default(), opener, Now::default()).expect("open broker");
    let mut session = Session { consumer: 1, ..Session::default() };
    let hello = Request::Hello { min_version: codec::VERSION_MIN, max_version: codec::VERSION_MAX, token: b"" };
    turn(&mut broker, &mut session, 1, &hello).expect("hello");
    (broker, session, fail)
}

/// Produces one message to `topic` as one turn.
fn produce_one(broker: &mut Broker, session: &mut Session, rid: u32, topic: &str, payload: &[u8]) -> Result<(), u8> {
    let mut body = Vec::new();
    codec::encode_batch(&mut body, &[payload]);
    turn(
        broker,
        session,
        rid,
        &Request::Produce { flags: 0, topic, batch: Batch { count: 1, bytes: &body, with_props: false } },
    )
}

/// A PRODUCE that auto-creates its topic appends the topic's Topic record
/// and its Produce record in one turn. If that turn's commit fails, the
/// produce is answered STORAGE and withdrawn, and the log is cut back —
/// but the topic stays in memory, so the next produce to it appends no
/// Topic record. That produce is acknowledged, yet after a restart
/// recovery finds its messages under a topic id with no Topic record and
/// drops them ("topic record is missing from the log"): an acknowledged
/// message is lost. (CREATE_TOPIC answered STORAGE leaves the same state.)
#[test]
fn acknowledged_produce_to_a_topic_created_in_a_failed_turn_survives_restart() {
    let dir = TempDir::new("recovery-failed-create");
    let (mut broker, mut session, fail) = failing_broker(dir.path());
    fail.store(true, Ordering::SeqCst);
    let r = produce_one(&mut broker, &mut session, 2, "fresh", b"durable?");
    assert_eq!(r, Err(ErrorCode::Storage as u8), "the sync failed: STORAGE");
    fail.store(false, Ordering::SeqCst);
    produce_one(&mut broker, &mut session, 3, "fresh", b"durable?").expect("storage is back: acknowledged");
    drop(broker);
    let got: Vec<(String, Vec<u8>)> = fetch_all(dir.path()).into_iter().map(|((t, _), p)| (t, p)).collect();
    assert_eq!(
        got,
        vec![("fresh".to_string(), b"durable?".to_vec())],
        "the acknowledged produce must survive a restart"
    );
}

/// A DELETE_TOPIC whose commit fails is answered STORAGE, but the topic is
/// already gone from memory with its messages. Its Delete record must not be
/// lost with the failed turn (it was, once: a produce to the same name then
/// created a second topic, and after a restart both came back under one
/// name, the old one's message unreachable).
#[test]
fn failed_delete_leaves_one_topic_holding_its_messages() {
    let dir = TempDir::new("recovery-failed-delete");
    let (mut broker, mut session, fail) = failing_broker(dir.path());
    produce_one(&mut broker, &mut session, 2, "t", b"old").expect("produce");
    fail.store(true, Ordering::SeqCst);
    let r = turn(&mut broker, &mut session, 3, &Request::DeleteTopic { topic: "t" });
    assert_eq!(r, Err(ErrorCode::Storage as u8), "the sync failed: STORAGE");
    fail.store(false, Ordering::SeqCst);
    produce_one(&mut broker, &mut session, 4, "t", b"new").expect("storage is back: acknowledged");
    drop(broker);
    let srv = Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let names: Vec<String> = srv.client().list_topics().expect("list").into_iter().map(|t| t.0).collect();
    srv.stop();
    assert_eq!(names, vec!["t".to_string()], "one topic per name after a restart");
    // docs/protocol.md: an admin frame answered STORAGE may already have
    // taken effect in memory; its record is kept and written with the next
    // commit, so after a restart the broker holds what it held before.
    let got: Vec<Vec<u8>> = fetch_all(dir.path()).into_values().collect();
    assert_eq!(got, vec![b"new".to_vec()], "memory and log agree after the restart");
}
