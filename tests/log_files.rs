//! The log's files, through `runnel::log::Log` itself.
//!
//! Space reserved ahead of the writes (docs/log-format.md, "Reserved
//! space"): the active segment's file is longer than its records, the
//! zeros after them are not damage, a closed segment keeps none, and a
//! zero block left inside the last write by a machine crash is a torn
//! write, cut whole, while a block of zeros or junk in a write that a later
//! write says was synced is corruption.
//!
//! Removing a segment (docs/log-format.md, "Compaction"): the file leaves
//! the log at once by a rename and its space is released a slice per turn;
//! a start deletes what a stop left half released.
//!
//! The clean-stop marker (docs/log-format.md, "How the last run ended")
//! goes before the log changes, also by the paths compaction takes on a
//! full disk: closing the active segment early, writing a restatement
//! ahead of the turn.
//!
//! Damage in the last segment of a crashed run (docs/log-format.md, "What
//! damage gives what" and "Repair"): a damaged record whose own length
//! leads to a whole record is corruption even when the file ends torn, and
//! repair does not trust a damaged length over the records it would skip.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::TempDir;
use runnel::log::{
    CLEAN_STOP_FILE, FsyncMode, Log, LogOptions, OpenError, RECORD_HEADER_BYTES, RecordKind, WRITE_RECORD_BYTES,
};

/// Body bytes of each test record: with the header, 100 bytes, so records
/// straddle 4 KiB blocks at varying offsets.
const BODY_BYTES: usize = 88;

fn options(segment_bytes_max: u64) -> LogOptions {
    LogOptions { segment_bytes_max, fsync: FsyncMode::Turn, ..LogOptions::default() }
}

/// A reopened log and the record bodies it replayed.
type Opened = Result<(Log, Vec<Vec<u8>>), OpenError>;

/// Opens the log in `dir` and returns it with the bodies it replayed.
fn open(dir: &Path, segment_bytes_max: u64) -> Opened {
    let mut bodies = Vec::new();
    let (log, _) = Log::open(dir, options(segment_bytes_max), |r| {
        bodies.push(r.body.to_vec());
        Ok(())
    })?;
    Ok((log, bodies))
}

/// A record body numbered `n`: its number, then filler that is never zero.
fn body(n: u32) -> Vec<u8> {
    let mut b = n.to_le_bytes().to_vec();
    b.resize(BODY_BYTES, 0xa5);
    b
}

/// Appends records `from..to`, one commit of `per_turn` records at a time.
fn write(log: &mut Log, from: u32, to: u32, per_turn: u32) {
    let mut n = from;
    while n < to {
        for _ in 0..per_turn.min(to - n) {
            let start = log.begin(RecordKind::Produce);
            log.body().extend_from_slice(&body(n));
            log.end(start);
            n += 1;
        }
        log.commit(true).expect("commit");
    }
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    v
}

fn record_bytes(n: u32) -> u64 {
    u64::from(n) * (RECORD_HEADER_BYTES + BODY_BYTES) as u64
}

/// Bytes a segment of `records` test records in `writes` writes holds: each
/// write's Write record, and the one the segment begins with.
fn segment_bytes(records: u32, writes: u32) -> u64 {
    record_bytes(records) + u64::from(writes + 1) * WRITE_RECORD_BYTES as u64
}

/// Where record `n` starts in a segment written one record a turn
/// (`fifty`), and where its write (its Write record) does.
fn one_a_turn(n: u32) -> (u64, u64) {
    let write = segment_bytes(n, n);
    (write + WRITE_RECORD_BYTES as u64, write)
}

#[test]
fn active_segment_is_reserved_ahead_and_its_zeros_are_not_damage() {
    let dir = TempDir::new("reserve-tail");
    let (mut log, _) = open(dir.path(), 64 << 20).expect("open");
    write(&mut log, 0, 50, 1);
    drop(log);
    let seg = segment_files(dir.path()).pop().expect("a segment");
    let len = fs::metadata(&seg).expect("metadata").len();
    assert!(len > record_bytes(50), "the file ({len} bytes) reserves space past its {} record bytes", record_bytes(50));
    let (mut log, bodies) = open(dir.path(), 64 << 20).expect("reserved zeros are not damage");
    assert_eq!(bodies, (0..50).map(body).collect::<Vec<_>>(), "every record replayed, nothing more");
    assert_eq!(log.bytes(), segment_bytes(50, 50), "the log's size counts records, not reserved space");
    // Appending after a restart writes right after the records, not after
    // the reserved space.
    write(&mut log, 50, 60, 1);
    drop(log);
    let (_, bodies) = open(dir.path(), 64 << 20).expect("reopen");
    assert_eq!(bodies, (0..60).map(body).collect::<Vec<_>>());
}

#[test]
fn a_closed_segment_ends_where_its_records_do() {
    let dir = TempDir::new("reserve-roll");
    // 20 records a turn (2,000 bytes): turns roll the 8 KiB segments.
    let (mut log, _) = open(dir.path(), 8192).expect("open");
    write(&mut log, 0, 200, 20);
    let segments = log.segments().to_vec();
    drop(log);
    let files = segment_files(dir.path());
    assert_eq!(files.len(), segments.len());
    assert!(segments.len() > 2, "setup: several segments");
    for (s, f) in segments.iter().zip(&files).take(segments.len() - 1) {
        assert_eq!(
            fs::metadata(f).expect("metadata").len(),
            s.bytes,
            "closed segment {} keeps no reserved space",
            s.base
        );
    }
    let (_, bodies) = open(dir.path(), 8192).expect("reopen");
    assert_eq!(bodies.len(), 200);
}

/// Writes 300 records (30,000 bytes) in one write, and `later` records
/// in writes after it, then overwrites the aligned 4 KiB block at 8192
/// (inside the first write) with `fill` and reopens.
fn with_block(fill: u8, later: u32) -> (TempDir, Opened) {
    let dir = TempDir::new("reserve-hole");
    let (mut log, _) = open(dir.path(), 64 << 20).expect("open");
    write(&mut log, 0, 300, 300);
    write(&mut log, 300, 300 + later, 1);
    drop(log);
    let seg = segment_files(dir.path()).pop().expect("a segment");
    let mut data = fs::read(&seg).expect("read");
    data[8192..12288].fill(fill);
    fs::write(&seg, &data).expect("write");
    let opened = open(dir.path(), 64 << 20);
    (dir, opened)
}

/// The record the block at 8192 damages first in `with_block`'s segment:
/// its first write begins after the segment's own Write record.
fn first_in_block() -> u64 {
    let first = 2 * WRITE_RECORD_BYTES as u64;
    first + (8192 - first) / 100 * 100
}

#[test]
fn a_zero_block_inside_the_last_write_is_a_torn_write_cut_whole() {
    // What a machine crash can leave: later blocks of an unsynced write on
    // disk, an earlier block of reserved space still zeros. No reply
    // depended on any of the write: all of it goes, its records before
    // the hole too.
    let (dir, opened) = with_block(0, 0);
    let (log, bodies) = opened.unwrap_or_else(|e| panic!("a zero block in the last write is a torn write: {e}"));
    assert_eq!(bodies, Vec::<Vec<u8>>::new(), "nothing of the torn write");
    assert_eq!(log.bytes(), WRITE_RECORD_BYTES as u64, "the segment's own Write record is left");
    drop(log);
    let seg = segment_files(dir.path()).pop().expect("a segment");
    assert_eq!(fs::metadata(&seg).expect("metadata").len(), WRITE_RECORD_BYTES as u64, "cut at the torn write");
}

#[test]
fn a_block_of_junk_or_zeros_in_a_write_a_later_write_says_was_synced_is_corruption() {
    for fill in [0xff, 0] {
        let (_dir, opened) = with_block(fill, 2);
        match opened {
            Err(OpenError::Corrupt { offset, why, .. }) => {
                assert_eq!(offset, first_in_block(), "names the damaged record");
                assert!(why.contains("a completed sync covered"), "{why}");
            }
            Err(e) => panic!("expected OpenError::Corrupt, got {e}"),
            Ok((_, bodies)) => {
                panic!("damage a later write vouches for must stop start-up; it replayed {} records", bodies.len())
            }
        }
    }
}

fn removing_files(dir: &Path) -> Vec<(PathBuf, u64)> {
    fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_str().is_some_and(|n| n.ends_with(".removing")))
        .map(|p| {
            let len = fs::metadata(&p).expect("metadata").len();
            (p, len)
        })
        .collect()
}

/// Writes 2,000-record turns (200,000 bytes) into 1 MiB segments until
/// there are three, and returns the log.
fn three_segments(dir: &Path) -> Log {
    let (mut log, _) = open(dir, 1 << 20).expect("open");
    let mut n = 0;
    while log.segments().len() < 3 {
        write(&mut log, n, n + 2000, 2000);
        n += 2000;
    }
    log
}

#[test]
fn a_removed_segment_leaves_the_log_at_once_and_its_space_off_the_loop() {
    let dir = TempDir::new("release");
    let mut log = three_segments(dir.path());
    let oldest = log.segments()[0].clone();
    log.remove_oldest(oldest.base).expect("remove");
    assert_eq!(log.segments().len(), 2);
    assert!(!segment_files(dir.path()).iter().any(|p| p.ends_with(format!("{:020}.log", oldest.base))), "renamed away");
    // The release thread cuts the file and unlinks it, while the log goes on.
    write(&mut log, 0, 10, 10);
    common::wire::wait_until("the release", || log.release_pending() == 0);
    assert!(removing_files(dir.path()).is_empty(), "the file is gone once released");
    assert!(!log.releasing());
    // A second removal is released the same way.
    let next = log.segments()[0].base;
    log.remove_oldest(next).expect("remove the next");
    common::wire::wait_until("the second release", || log.release_pending() == 0);
    assert!(removing_files(dir.path()).is_empty());
    assert_eq!(log.stats.segments_removed, 2);
}

#[test]
fn a_start_deletes_a_half_released_segment_and_does_not_replay_it() {
    let dir = TempDir::new("release-restart");
    let log = three_segments(dir.path());
    let oldest = log.segments()[0].clone();
    let first_kept = log.segments()[1].base;
    drop(log);
    // Its records: its Write records aside, 100 bytes each.
    let writes = (oldest.bytes - WRITE_RECORD_BYTES as u64) / (2000 * 100 + WRITE_RECORD_BYTES as u64);
    let records = (oldest.bytes - (writes + 1) * WRITE_RECORD_BYTES as u64) / 100;
    // What a stop in the middle of a release leaves: the oldest segment
    // renamed out of the log and cut short.
    let seg = dir.path().join(format!("{:020}.log", oldest.base));
    let doomed = dir.path().join(format!("{:020}.log.removing", oldest.base));
    fs::rename(&seg, &doomed).expect("rename");
    fs::OpenOptions::new().write(true).open(&doomed).expect("open").set_len(oldest.bytes / 2).expect("cut");
    let (log, bodies) = open(dir.path(), 1 << 20).expect("reopen");
    assert!(removing_files(dir.path()).is_empty(), "deleted at start");
    assert_eq!(log.segments()[0].base, first_kept);
    let first = u32::from_le_bytes(bodies[0][..4].try_into().expect("4 bytes"));
    assert_eq!(u64::from(first), records, "replay starts after the removed segment");
}

/// Stops a log of three segments cleanly and reopens it: the clean-stop
/// marker is on disk, and the log is as the stop left it.
fn reopened_after_a_clean_stop(dir: &Path) -> Log {
    let mut log = three_segments(dir);
    log.mark_clean_stop().expect("mark the clean stop");
    drop(log);
    let (log, rec) = Log::open(dir, options(1 << 20), |_| Ok(())).expect("reopen");
    assert!(rec.clean_stop, "setup: read as a clean stop");
    assert!(dir.join(CLEAN_STOP_FILE).exists(), "setup: the marker is kept until the log changes");
    log
}

/// After a crash (no stop), the log in `dir` opens as after one: the
/// marker, gone, vouches for nothing.
fn assert_reopens_as_after_a_crash(dir: &Path) {
    let (_, rec) = Log::open(dir, options(1 << 20), |_| Ok(())).expect("a start after the crash");
    assert!(!rec.clean_stop, "read as a crash");
}

#[test]
fn closing_the_active_segment_early_removes_the_clean_stop_marker_first() {
    // Compaction closes the segment being written to when space is short,
    // before the turn writes anything: the log changes there first.
    let dir = TempDir::new("marker-close");
    let mut log = reopened_after_a_clean_stop(dir.path());
    assert!(log.close_active().expect("close the active segment"), "setup: it held records");
    assert!(!dir.path().join(CLEAN_STOP_FILE).exists(), "the marker goes before the segment files change");
    drop(log);
    assert_reopens_as_after_a_crash(dir.path());
}

#[test]
fn a_restatement_written_ahead_of_the_turn_removes_the_clean_stop_marker_first() {
    let dir = TempDir::new("marker-ahead");
    let mut log = reopened_after_a_clean_stop(dir.path());
    let aside = log.set_aside();
    let start = log.begin(RecordKind::Topic);
    log.body().extend_from_slice(&body(1));
    log.end(start);
    log.commit_ahead(aside).expect("commit ahead");
    assert!(!dir.path().join(CLEAN_STOP_FILE).exists(), "the marker goes before the restatement is written");
    drop(log);
    assert_reopens_as_after_a_crash(dir.path());
}

/// A start after a crash makes the last segment's records durable before
/// it relies on them (compaction leaves a message whose latest copy a
/// crashed run wrote there, unsynced, perhaps); a start after a clean stop
/// has nothing to sync.
#[test]
fn a_start_after_a_crash_syncs_the_last_segment_and_one_after_a_stop_does_not() {
    let dir = TempDir::new("crash-sync");
    let log = reopened_after_a_clean_stop(dir.path());
    assert_eq!(log.stats.fsyncs, 0, "after a clean stop");
    drop(log);
    fs::remove_file(dir.path().join(CLEAN_STOP_FILE)).expect("the crash: no marker");
    let (log, rec) = Log::open(dir.path(), options(1 << 20), |_| Ok(())).expect("a start after the crash");
    assert!(!rec.clean_stop, "setup: read as a crash");
    assert_eq!(log.stats.fsyncs, 1, "after a crash: the last segment");
}

/// Opens the log in `dir` with `--repair` and returns the bodies replayed.
fn open_repair(dir: &Path) -> Vec<Vec<u8>> {
    let mut bodies = Vec::new();
    let opts = LogOptions { repair: true, ..options(64 << 20) };
    Log::open(dir, opts, |r| {
        bodies.push(r.body.to_vec());
        Ok(())
    })
    .unwrap_or_else(|e| panic!("--repair must start: {e}"));
    bodies
}

/// Writes records 0..50, one a turn, and returns the segment's path.
fn fifty(dir: &Path) -> PathBuf {
    let (mut log, _) = open(dir, 64 << 20).expect("open");
    write(&mut log, 0, 50, 1);
    drop(log);
    segment_files(dir).pop().expect("a segment")
}

fn assert_corrupt_at(opened: Opened, offset: u64) {
    match opened {
        Err(OpenError::Corrupt { offset: o, .. }) => assert_eq!(o, offset, "names the damaged record"),
        Err(e) => panic!("expected OpenError::Corrupt, got {e}"),
        Ok((_, bodies)) => panic!("damage with whole records after it must stop start-up; {} replayed", bodies.len()),
    }
}

#[test]
fn a_damaged_record_whose_length_leads_to_a_whole_record_is_not_torn_even_if_the_file_ends_torn() {
    // A synced record damaged on disk, then later records, then a crash
    // that tore the last write: the later records do not run to the end of
    // the file, but the damaged record's own length leads to one of them,
    // so later turns wrote them: corruption, not a torn tail.
    let dir = TempDir::new("torn-after-damage");
    let seg = fifty(dir.path());
    let mut data = fs::read(&seg).expect("read");
    data[one_a_turn(10).0 as usize + 50] ^= 0x01;
    data.truncate(one_a_turn(49).0 as usize + 30);
    fs::write(&seg, &data).expect("write");
    assert_corrupt_at(open(dir.path(), 64 << 20), one_a_turn(10).0);
    let kept: Vec<Vec<u8>> = (0..49).filter(|&n| n != 10).map(body).collect();
    assert_eq!(open_repair(dir.path()), kept, "repair drops the damaged record; the torn one is cut");
}

#[test]
fn repair_resumes_at_the_next_record_when_a_length_field_is_damaged() {
    // Record 20's length, damaged, points into the reserved zeros: trusted,
    // it would drop every record after 20. The records inside the bytes it
    // claims run to those zeros, so they are records, and only 20 is lost.
    let dir = TempDir::new("bad-length");
    let seg = fifty(dir.path());
    let mut data = fs::read(&seg).expect("read");
    assert!(data.len() as u64 > segment_bytes(50, 50) + 20_000, "setup: reserved space after the records");
    let at = one_a_turn(20).0 as usize;
    data[at..at + 4].copy_from_slice(&20_000u32.to_le_bytes());
    fs::write(&seg, &data).expect("write");
    assert_corrupt_at(open(dir.path(), 64 << 20), one_a_turn(20).0);
    let kept: Vec<Vec<u8>> = (0..50).filter(|&n| n != 20).map(body).collect();
    assert_eq!(open_repair(dir.path()), kept, "repair drops record 20 only");
    // Rewritten without it, and without its Write records (the bytes
    // dropped would make the offsets they give stale).
    assert_eq!(fs::metadata(&seg).expect("metadata").len(), record_bytes(49), "rewritten without it");
}

/// The log times each of its calls on the files by phase, for the loop's
/// metrics: a turn's write and sync, the reservation of the first step, the
/// roll to a new segment, and the release of a removed segment's space.
#[test]
fn the_log_times_each_phase_of_its_calls_on_the_files() {
    use runnel::metrics::Phase;
    let dir = TempDir::new("log-phases");
    let (mut log, _) = open(dir.path(), 64 << 10).expect("open");
    write(&mut log, 0, 1, 1);
    let first = log.take_phases();
    for p in [Phase::Write, Phase::Fsync, Phase::Reserve] {
        assert!(first.get(p) > 0, "{p:?} not timed: {first:?}");
    }
    // The first write opened the segment (and synced the directory): a
    // roll's work.
    assert!(first.get(Phase::Roll) > 0, "{first:?}");
    assert_eq!(log.take_phases().total(), 0, "taken");
    // Past the segment's size: a roll.
    write(&mut log, 1, 1000, 100);
    let filled = log.take_phases();
    assert!(log.segments().len() > 1 && filled.get(Phase::Roll) > 0, "{filled:?}");
    let base = log.segments()[0].base;
    log.remove_oldest(base).expect("remove");
    assert!(log.take_phases().get(Phase::Release) > 0);
}

/// A memory-only log (`--memory-only`) discards each turn where a log would
/// write it: nothing is kept, synced, rolled or counted as written, and
/// marking a clean stop writes no file.
#[test]
fn a_memory_only_log_discards_every_turn() {
    let mut log = Log::in_memory();
    assert!(log.memory_only());
    write(&mut log, 0, 5000, 100);
    assert_eq!((log.bytes(), log.segments().len(), log.head()), (0, 1, 0));
    assert_eq!((log.stats.fsyncs, log.stats.commits, log.stats.records), (0, 0, 0));
    assert!(!log.space_short() && !log.releasing());
    assert!(!log.close_active().expect("close"), "no segment to close");
    log.mark_clean_stop().expect("mark");
    assert!(!Path::new(CLEAN_STOP_FILE).exists());
}

/// A new segment's name is made durable (the directory synced) only where
/// its records will be synced: with `--fsync never` the loop does not wait
/// for a directory sync at each roll, and the clean stop's marker syncs the
/// directory once.
#[test]
fn only_a_log_that_syncs_its_records_syncs_a_new_segments_name() {
    for (fsync, dir_synced) in [(FsyncMode::Turn, true), (FsyncMode::Never, false)] {
        let dir = TempDir::new("dir-syncs");
        let opts = LogOptions { fsync, ..options(64 << 10) };
        let (mut log, _) = Log::open(dir.path(), opts.clone(), |_| Ok(())).expect("open");
        write(&mut log, 0, 2000, 100);
        let rolled = log.segments().len() as u64;
        assert!(rolled > 2, "setup: rolls");
        let expected = if dir_synced { rolled } else { 0 };
        assert_eq!(log.stats.dir_syncs, expected, "{fsync:?}: the first segment and every roll");
        log.mark_clean_stop().expect("mark");
        drop(log);
        let (log, _) = Log::open(dir.path(), opts, |_| Ok(())).expect("reopen");
        assert_eq!(log.segments().len() as u64, rolled, "{fsync:?}: every segment reopens");
    }
}
