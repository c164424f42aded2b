//! The corrupted-log suite: each kind of damage made by hand to a log the
//! real broker wrote, and its outcome checked against docs/log-format.md
//! ("Recovery"): whether a start cuts a torn tail or refuses, what the
//! refusal names, what `Log::inspect` (`--repair --dry-run`) reports, and
//! which messages `--repair` keeps.
//!
//! The log: one topic, produces in batches (one Produce record each), then
//! one ACK of 30 messages (one Remove record), then single produces into a
//! later segment until it is three 4 KiB blocks long; 16 KiB segments, so
//! the log spans several. Built deterministically (no randomness), stopped
//! gracefully (so it holds a clean-stop marker), and damaged in copies.
//! Records are read by their frames and messages found by their payloads
//! (`common::logdir`).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::logdir::{
    KIND_PRODUCE, KIND_REMOVE, KIND_WRITE, Msgs, Rec, assert_msgs_eq, assert_nothing_invented, base_of, broker_records,
    copy_dir, crashed, fetch_all, file_len, records, segments, snapshot, without_payloads_in, write_start,
};
use common::{Server, TempDir};
use runnel::broker::{Broker, Config, Now};
use runnel::client::Fetch;
use runnel::log::{CLEAN_STOP_FILE, DamageKind, Inspection, LastStop, Log, LogOptions, OpenError};

/// Small segments, so the log spans several.
const SEGMENT_BYTES_MAX: u64 = 16 << 10;
/// Messages produced in batches before the ACK.
const BATCHED_MESSAGES: usize = 400;
/// Messages acknowledged, in one ACK.
const ACKED_MESSAGES: usize = 30;
/// The filesystem block the damage zeroes.
const BLOCK_BYTES: u64 = 4096;

/// A data directory the broker wrote, and what it holds.
struct Built {
    dir: TempDir,
    /// Every message produced, acked or not.
    produced: Msgs,
    /// The messages acknowledged.
    acked: Msgs,
    /// What a start holds: produced minus acked.
    live: Msgs,
}

/// A payload unique to message `n`, of a length that varies with `n`.
fn payload(n: usize) -> Vec<u8> {
    let mut p = format!("<msg-{n:05}>").into_bytes();
    p.extend(std::iter::repeat_n(b'a' + (n % 26) as u8, 60 + n * 37 % 180));
    p
}

fn build() -> Built {
    let dir = TempDir::new("corrupt-src");
    let opts = LogOptions { segment_bytes_max: SEGMENT_BYTES_MAX, ..LogOptions::default() };
    let srv = Server::start_in(Config::default(), opts, dir.path());
    let mut c = srv.client();
    let mut produced = Msgs::new();
    let mut n = 0;
    while n < BATCHED_MESSAGES {
        let batch: Vec<Vec<u8>> = (n..n + 1 + n % 3).map(payload).collect();
        let (first, _) = c.produce_batch("t", &batch).expect("produce");
        n += batch.len();
        produced.extend(batch.into_iter().enumerate().map(|(i, p)| (("t".to_string(), first + i as u64), p)));
    }
    let fetched = c.fetch("t", Fetch { max_messages: ACKED_MESSAGES as u32, ..Fetch::default() }).expect("fetch");
    let ids: Vec<u64> = fetched.iter().map(|m| m.id).collect();
    assert!(c.ack("t", &ids).expect("ack").failed.is_empty(), "setup: the ack");
    // On to a segment after the ACK's, so the last holds only produces.
    let ack_segment = segments(dir.path()).pop();
    while segments(dir.path()).pop() == ack_segment
        || last_records(dir.path()).last().is_none_or(|r| r.end < 3 * BLOCK_BYTES)
    {
        let id = c.produce("t", &payload(n)).expect("produce");
        produced.insert(("t".to_string(), id), payload(n));
        n += 1;
    }
    drop(c);
    srv.stop();
    let acked: Msgs = ids.iter().map(|&id| (("t".to_string(), id), produced[&("t".to_string(), id)].clone())).collect();
    let live = produced.iter().filter(|(k, _)| !acked.contains_key(*k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    let b = Built { dir, produced, acked, live };
    assert!(segments(b.dir.path()).len() >= 5, "setup: the log spans several segments");
    assert!(b.dir.path().join(CLEAN_STOP_FILE).exists(), "a graceful stop leaves the clean-stop marker");
    b
}

/// The records of the last segment of `dir`.
fn last_records(dir: &Path) -> Vec<Rec> {
    segments(dir).last().map(|p| records(&fs::read(p).expect("read"))).unwrap_or_default()
}

/// Opens the broker on `dir` in-process, without sockets.
fn open(dir: &Path, repair: bool) -> Result<Broker, OpenError> {
    unlocked(|| Broker::open(Config::default(), dir, LogOptions { repair, ..LogOptions::default() }, Now::default()))
}

/// `Log::inspect`, as `unlocked` allows.
fn inspect(dir: &Path) -> Inspection {
    unlocked(|| Log::inspect(dir)).expect("inspect")
}

/// Runs `f`, again while it finds the directory locked: a test that spawns
/// `runnel` (the dry-run test) forks a child that holds copies of this
/// process's files, a lock another test took among them, until the child's
/// `exec` closes them. That window is the test harness's, not the log's:
/// a lock held by another process for longer is still an error.
fn unlocked<T>(f: impl Fn() -> Result<T, OpenError>) -> Result<T, OpenError> {
    for _ in 0..50 {
        match f() {
            Err(OpenError::Locked(_)) => std::thread::sleep(std::time::Duration::from_millis(20)),
            other => return other,
        }
    }
    f()
}

/// A copy of the built directory and the path in it of segment `s`.
fn copy_segment(b: &Built, s: usize, tag: &str) -> (TempDir, PathBuf) {
    let copy = copy_dir(b.dir.path(), tag);
    let path = copy.path().join(segments(b.dir.path())[s].file_name().expect("name"));
    (copy, path)
}

/// Asserts that a start on `dir` refuses with `OpenError::Corrupt` naming
/// `file` at `offset` and saying each of `words`; returns the message.
fn assert_refused(dir: &Path, file: &Path, offset: u64, words: &[&str]) -> String {
    let err = match open(dir, false) {
        Ok(broker) => panic!("the start must refuse; it cut {} bytes", broker.recovery.truncated_bytes),
        Err(e) => e,
    };
    let shown = err.to_string();
    match &err {
        OpenError::Corrupt { file: f, offset: o, .. } => {
            assert_eq!((f.as_path(), *o), (file, offset), "names the file and offset: {shown}");
        }
        other => panic!("expected OpenError::Corrupt, got {other:?}: {shown}"),
    }
    for w in words.iter().copied().chain(["--repair", "--dry-run"]) {
        assert!(shown.contains(w), "the refusal must say {w:?}: {shown}");
    }
    shown
}

/// Asserts that `Log::inspect` reports exactly one damaged stretch of
/// `kind` in `file` at `at`, of `bytes`, and changes nothing.
fn assert_inspected(dir: &Path, file: &Path, at: u64, bytes: u64, kind: DamageKind) {
    let before = snapshot(dir);
    let ins = inspect(dir);
    assert_eq!(snapshot(dir), before, "inspecting changes nothing");
    assert!(ins.damaged(), "{ins}");
    assert_eq!(ins.damage.len(), 1, "one damaged stretch: {ins}");
    let d = &ins.damage[0];
    assert_eq!((d.file.as_path(), d.at, d.bytes, &d.kind), (file, at, bytes, &kind), "{ins}");
    assert!(ins.to_string().contains(&d.to_string()), "the report lists the stretch: {ins}");
}

/// Repairs `dir`, asserts the bytes it reports dropped, that the segments
/// are contiguous after it and that a plain start needs no flag, and
/// returns the messages that start holds.
fn repaired(b: &Built, dir: &Path, dropped_bytes: u64) -> Msgs {
    let broker = open(dir, true).unwrap_or_else(|e| panic!("--repair must start: {e}"));
    assert_eq!(broker.recovery.repaired_bytes, dropped_bytes, "bytes repair reports dropped");
    drop(broker);
    let segs = segments(dir);
    for w in segs.windows(2) {
        assert_eq!(base_of(&w[0]) + file_len(&w[0]), base_of(&w[1]), "contiguous after repair: {segs:?}");
    }
    assert!(!dir.join(CLEAN_STOP_FILE).exists(), "repair removes the clean-stop marker");
    let ins = inspect(dir);
    assert!(!ins.damaged(), "nothing left to repair: {ins}");
    let got = fetch_all(dir);
    assert_nothing_invented(&got, &b.produced, "after repair");
    got
}

/// A Produce record of segment `s`, past its first record (the oldest
/// segment's first is the Topic record).
fn produce_record(b: &Built, s: usize) -> Rec {
    let data = fs::read(&segments(b.dir.path())[s]).expect("read");
    let recs = records(&data);
    *recs[1..].iter().find(|r| r.kind == KIND_PRODUCE).expect("setup: a Produce record")
}

/// Flips one bit in the middle of `r`'s body in the file at `path`.
fn flip_in(path: &Path, r: Rec) {
    let mut data = fs::read(path).expect("read");
    data[((r.start + 12 + r.end) / 2) as usize] ^= 0x10;
    fs::write(path, &data).expect("write");
}

/// One flipped byte in a record of the oldest segment, then of a middle
/// one: a start refuses, naming the file, the byte and the record repair
/// drops; repair drops exactly that record and keeps every later record
/// and segment.
#[test]
fn a_flipped_byte_is_refused_and_repair_drops_only_its_record_keeping_every_later_segment() {
    let b = build();
    let n = segments(b.dir.path()).len();
    // The oldest segment (with every later one after it) and a middle one.
    for s in [0, n / 2] {
        let r = produce_record(&b, s);
        let (copy, path) = copy_segment(&b, s, "corrupt-flip");
        let original = fs::read(&path).expect("read");
        flip_in(&path, r);
        let range = format!("{} bytes {}..{} ({} bytes)", path.display(), r.start, r.end, r.end - r.start);
        assert_refused(copy.path(), &path, r.start, &["CRC mismatch", &range]);
        assert_inspected(copy.path(), &path, r.start, r.end - r.start, DamageKind::Record { kind: KIND_PRODUCE });
        let got = repaired(&b, copy.path(), r.end - r.start);
        assert_eq!(segments(copy.path()).len(), n, "segment {s}: every segment kept");
        let lost = &original[r.start as usize..r.end as usize];
        assert_msgs_eq(&got, &without_payloads_in(&b.live, lost), "segment {s}: every message but the record's");
    }
}

/// The records of `data` that overlap `from..to`: the first and the one
/// after the last (where valid records resume).
fn overlapping(data: &[u8], from: u64, to: u64) -> (Rec, Rec) {
    let recs = records(data);
    let first = *recs.iter().find(|r| r.end > from).expect("setup: a record at the block");
    let next = *recs.iter().find(|r| r.start >= to).expect("setup: records after the block");
    (first, next)
}

/// Zeroes the 4 KiB block at byte 4096 of the file at `path`.
fn zero_block(path: &Path) {
    let mut data = fs::read(path).expect("read");
    data[BLOCK_BYTES as usize..2 * BLOCK_BYTES as usize].fill(0);
    fs::write(path, &data).expect("write");
}

/// A zeroed 4 KiB block in a middle segment: no record can be read from
/// the first record it touches to the first after it; repair drops exactly
/// those bytes and resumes at the next valid record.
#[test]
fn a_zeroed_block_in_a_middle_segment_is_refused_and_repair_keeps_the_records_after_it() {
    let b = build();
    let s = segments(b.dir.path()).len() / 2;
    let (copy, path) = copy_segment(&b, s, "corrupt-zero");
    let original = fs::read(&path).expect("read");
    let (first, next) = overlapping(&original, BLOCK_BYTES, 2 * BLOCK_BYTES);
    zero_block(&path);
    assert_refused(copy.path(), &path, first.start, &[&format!("bytes {}..{}", first.start, next.start)]);
    assert_inspected(copy.path(), &path, first.start, next.start - first.start, DamageKind::Unreadable);
    let got = repaired(&b, copy.path(), next.start - first.start);
    let lost = &original[first.start as usize..next.start as usize];
    assert_msgs_eq(&got, &without_payloads_in(&b.live, lost), "every message but those of the zeroed records");
}

/// A middle segment cut exactly at a record boundary reads as whole: only
/// the segment names show the gap. A start refuses, naming both files and
/// the missing log offsets; repair renames the later segments to close the
/// gap and drops nothing (the cut records are gone already).
#[test]
fn a_middle_segment_cut_at_a_record_boundary_is_a_gap() {
    let b = build();
    let segs = segments(b.dir.path());
    let s = segs.len() / 2;
    let (copy, path) = copy_segment(&b, s, "corrupt-cut");
    let original = fs::read(&path).expect("read");
    let recs = records(&original);
    // At the start of the write of its second-to-last produce.
    let cut = write_start(&recs, broker_records(&recs)[broker_records(&recs).len() - 2]);
    let after = recs.iter().filter(|r| r.start >= cut);
    assert!(after.clone().all(|r| matches!(r.kind, KIND_PRODUCE | KIND_WRITE)), "setup: cut only produces");
    fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(cut)).expect("truncate");
    let next = copy.path().join(segs[s + 1].file_name().expect("name"));
    let (end, missing) = (base_of(&path) + cut, original.len() as u64 - cut);
    let words = [&path.display().to_string(), &next.display().to_string(), &format!("ends at log offset {end}")];
    assert_refused(copy.path(), &next, 0, &words.map(String::as_str));
    assert_inspected(copy.path(), &next, end, missing, DamageKind::Missing);
    let got = repaired(&b, copy.path(), 0);
    assert_msgs_eq(&got, &without_payloads_in(&b.live, &original[cut as usize..]), "every message but the cut ones");
}

/// A deleted middle segment: a start refuses, naming the segments on both
/// sides of the gap; repair closes it and keeps every other segment.
#[test]
fn a_deleted_middle_segment_is_a_gap() {
    let b = build();
    let segs = segments(b.dir.path());
    let s = segs.len() / 2;
    let (copy, path) = copy_segment(&b, s, "corrupt-delete");
    let original = fs::read(&path).expect("read");
    fs::remove_file(&path).expect("delete");
    let (prev, next) = (
        copy.path().join(segs[s - 1].file_name().expect("name")),
        copy.path().join(segs[s + 1].file_name().expect("name")),
    );
    let words = [prev.display().to_string(), next.display().to_string(), "a segment deleted".to_string()];
    assert_refused(copy.path(), &next, 0, &words.each_ref().map(String::as_str));
    assert_inspected(copy.path(), &next, base_of(&path), original.len() as u64, DamageKind::Missing);
    let got = repaired(&b, copy.path(), 0);
    assert_eq!(segments(copy.path()).len(), segs.len() - 1);
    assert_msgs_eq(&got, &without_payloads_in(&b.live, &original), "every message but the deleted segment's");
}

/// What docs/log-format.md ("Repair") warns of: repair dropping a Remove
/// record brings the messages it acknowledged back.
#[test]
fn a_lost_remove_record_brings_acknowledged_messages_back() {
    let b = build();
    let segs = segments(b.dir.path());
    let (s, r) = (0..segs.len())
        .find_map(|s| {
            let recs = records(&fs::read(&segs[s]).expect("read"));
            recs.into_iter().find(|r| r.kind == KIND_REMOVE).map(|r| (s, r))
        })
        .expect("setup: the ACK's Remove record");
    let (copy, path) = copy_segment(&b, s, "corrupt-remove");
    flip_in(&path, r);
    assert_refused(copy.path(), &path, r.start, &["a Remove record"]);
    let got = repaired(&b, copy.path(), r.end - r.start);
    let mut expected = b.live.clone();
    expected.extend(b.acked.clone());
    assert_msgs_eq(&got, &expected, "the acknowledged messages are back (docs/log-format.md, \"Repair\")");
}

/// The last segment's path in a copy of the built directory, its original
/// bytes and records.
fn copy_last(b: &Built, tag: &str) -> (TempDir, PathBuf, Vec<u8>, Vec<Rec>) {
    let (copy, path) = copy_segment(b, segments(b.dir.path()).len() - 1, tag);
    let data = fs::read(&path).expect("read");
    let recs = records(&data);
    (copy, path, data, recs)
}

/// A flipped byte in the last record of the last segment: after a clean
/// stop it is corruption (refused; repair drops the record); after a crash
/// the same bytes are a torn tail, cut without a flag with the write that
/// holds them.
#[test]
fn a_flipped_byte_in_the_last_record_after_a_clean_stop_is_corruption_after_a_crash_a_torn_tail() {
    let b = build();
    for clean in [true, false] {
        let (copy, path, data, recs) = copy_last(&b, "corrupt-tailflip");
        let r = *recs.last().expect("a record");
        flip_in(&path, r);
        let lost = without_payloads_in(&b.live, &data[r.start as usize..r.end as usize]);
        if clean {
            assert_refused(copy.path(), &path, r.start, &["CRC mismatch"]);
            assert_msgs_eq(&repaired(&b, copy.path(), r.end - r.start), &lost, "after repair");
        } else {
            crashed(copy.path());
            let broker = open(copy.path(), false).unwrap_or_else(|e| panic!("after a crash, a torn tail: {e}"));
            assert_eq!(broker.recovery.truncated_bytes, data.len() as u64 - write_start(&recs, r));
            drop(broker);
            assert_msgs_eq(&fetch_all(copy.path()), &lost, "after the cut");
        }
    }
}

/// A zeroed 4 KiB block in the last segment with whole writes after it:
/// after a clean stop, corruption (refused; repair keeps the records after
/// the block); after a crash too, since the Write records of the writes
/// after it say a completed sync covered the block (every produce of this
/// log synced its turn). A zeroed block that no later write vouches for is
/// a torn write (tests/torn_writes.rs, tests/log_files.rs).
#[test]
fn a_zeroed_block_followed_by_synced_writes_at_the_tail_is_corruption() {
    let b = build();
    for clean in [true, false] {
        let (copy, path, data, _) = copy_last(&b, "corrupt-tailzero");
        let (first, next) = overlapping(&data, BLOCK_BYTES, 2 * BLOCK_BYTES);
        zero_block(&path);
        let range = format!("bytes {}..{}", first.start, next.start);
        if clean {
            assert_refused(copy.path(), &path, first.start, &[&range, "stopped cleanly"]);
        } else {
            crashed(copy.path());
            assert_refused(copy.path(), &path, first.start, &[&range, "a completed sync covered the damaged bytes"]);
        }
        let got = repaired(&b, copy.path(), next.start - first.start);
        assert_msgs_eq(
            &got,
            &without_payloads_in(&b.live, &data[first.start as usize..next.start as usize]),
            "after repair",
        );
    }
}

/// The last segment cut at a record boundary after a clean stop: the
/// marker says where the log ended, so the start refuses; repair accepts
/// the log as it is and removes the marker.
#[test]
fn the_last_segment_cut_at_a_record_boundary_after_a_clean_stop_is_refused() {
    let b = build();
    let (copy, path, data, recs) = copy_last(&b, "corrupt-tailcut");
    let cut = recs[recs.len() - 2].start;
    fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(cut)).expect("truncate");
    let (head, end) = (base_of(&path) + cut, base_of(&path) + recs.last().expect("a record").end);
    assert_refused(copy.path(), &path, cut, &[&format!("ending at log offset {end} but its records end at {head}")]);
    assert_inspected(copy.path(), &path, head, end - head, DamageKind::Missing);
    assert_msgs_eq(&repaired(&b, copy.path(), 0), &without_payloads_in(&b.live, &data[cut as usize..]), "after repair");
}

/// The clean-stop marker is removed before the first append after a
/// start (a crash from then on must be read as one), and a graceful stop
/// writes it again with the log's new end.
#[test]
fn the_marker_goes_with_the_first_append_and_comes_back_with_the_next_clean_stop() {
    let b = build();
    let copy = copy_dir(b.dir.path(), "corrupt-marker");
    let marker = copy.path().join(CLEAN_STOP_FILE);
    let srv = Server::start_in(Config::default(), LogOptions::default(), copy.path());
    let mut c = srv.client();
    c.ping().expect("ping");
    assert!(marker.exists(), "nothing appended yet: the log is still as the clean stop left it");
    c.produce("t", b"after the clean stop").expect("produce");
    assert!(!marker.exists(), "an append removes the marker: a crash from here on must be read as one");
    drop(c);
    srv.stop();
    let last = segments(copy.path()).pop().expect("a segment");
    let end = base_of(&last) + last_records(copy.path()).last().expect("a record").end;
    let ins = inspect(copy.path());
    assert!(matches!(ins.last_stop, LastStop::Clean { end: e, .. } if e == end), "marked clean at {end}: {ins}");
}

/// A runnel that leaves no marker does not remove one either: run after a
/// clean stop, it appends past the marker's end and leaves the marker as it
/// was. That marker is outgrown: a start ignores it (reads the log as after
/// a crash, here cutting the torn write the older run left) and removes it.
#[test]
fn a_marker_the_log_has_outgrown_is_ignored() {
    let b = build();
    let copy = copy_dir(b.dir.path(), "corrupt-outgrown");
    let marker = copy.path().join(CLEAN_STOP_FILE);
    let old_marker = fs::read(&marker).expect("read marker");
    // The older run: appends, is killed mid-write, leaves the marker.
    crashed(copy.path());
    let srv = Server::start_in(Config::default(), LogOptions::default(), copy.path());
    srv.client().produce("t", b"appended by a later run").expect("produce");
    srv.stop();
    let last = segments(copy.path()).pop().expect("a segment");
    let recs = last_records(copy.path());
    let r = *recs.last().expect("a record");
    let write = write_start(&recs, r);
    fs::OpenOptions::new().write(true).open(&last).and_then(|f| f.set_len(r.start + 20)).expect("tear the write");
    fs::write(&marker, &old_marker).expect("the marker as the clean stop left it");
    let ins = inspect(copy.path());
    assert!(ins.outgrown_marker && ins.last_stop == LastStop::MayHaveCrashed && !ins.damaged(), "{ins}");
    let broker = open(copy.path(), false).unwrap_or_else(|e| panic!("an outgrown marker must not stop start-up: {e}"));
    assert_eq!(broker.recovery.truncated_bytes, r.start + 20 - write, "the torn write is cut, as after a crash");
    assert!(!marker.exists(), "the start removes the outgrown marker");
}

/// `runnel serve --repair --dry-run` prints what repair would drop, exits 1
/// on a damaged log and 0 on a whole one, and changes nothing.
#[test]
fn dry_run_reports_what_repair_drops_and_changes_nothing() {
    let b = build();
    let run = |dir: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_runnel"))
            .args(["serve", "--listen", "127.0.0.1:1", "--repair", "--dry-run", "--data"])
            .arg(dir)
            .output()
            .expect("run runnel serve --dry-run");
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let before = snapshot(b.dir.path());
    let (code, text) = run(b.dir.path());
    assert_eq!(code, Some(0), "a whole log: exit 0:\n{text}");
    assert!(text.contains("no damage") && text.contains("stopped cleanly"), "{text}");
    assert_eq!(snapshot(b.dir.path()), before, "a dry run changes nothing");

    let s = segments(b.dir.path()).len() / 2;
    let r = produce_record(&b, s);
    let (copy, path) = copy_segment(&b, s, "corrupt-dryrun");
    flip_in(&path, r);
    let before = snapshot(copy.path());
    let (code, text) = run(copy.path());
    assert_eq!(code, Some(1), "a damaged log: exit 1:\n{text}");
    let line = format!("{} bytes {}..{} ({} bytes): a Produce record", path.display(), r.start, r.end, r.end - r.start);
    assert!(text.contains(&line), "names what repair drops ({line}):\n{text}");
    assert_eq!(snapshot(copy.path()), before, "a dry run changes nothing");
}
