//! Framed writes (docs/log-format.md, "Writes"): which damage a start cuts
//! as the torn end of a crashed run and which it refuses, on segments built
//! by hand, write by write, with the Write records the log writes.
//!
//! The rule: damage in the last segment of a run that may have crashed is
//! cut, with the whole write that holds it and everything after, unless a
//! whole Write record after it says a completed sync covered it (then the
//! damaged bytes may have been acknowledged, and the start refuses), or the
//! clean-stop marker covers it. A power cut keeps or loses each sector of
//! an unsynced write on its own, so whole records of the same write may
//! follow the torn spot; they go with it. Damage in any other segment is
//! refused, and a segment without Write records keeps the rule it had.
//!
//! The log is opened with a closure that records where each replayed record
//! lies, so what a start kept is read off directly (the bodies are not
//! decoded: recovery replays records without reading them).

mod common;

use std::fs;
use std::path::Path;

use common::TempDir;
use runnel::log::{
    CLEAN_STOP_FILE, Log, LogOptions, OpenError, RECORD_HEADER_BYTES, RecordKind, WRITE_RECORD_BYTES, WriteFrame,
};

/// A disk sector: a power cut keeps or loses each of an unsynced write's.
const SECTOR_BYTES: usize = 512;

/// A whole record of `kind` with a `body_bytes` body whose bytes follow
/// from `tag` (so that no two records are alike).
fn record(kind: RecordKind, body_bytes: usize, tag: u8) -> Vec<u8> {
    let mut r = vec![0u8; RECORD_HEADER_BYTES];
    r[0..4].copy_from_slice(&(body_bytes as u32).to_le_bytes());
    r[8] = kind as u8;
    r[9] = kind.version();
    r.extend((0..body_bytes).map(|i| tag.wrapping_add(i as u8) | 1));
    let mut h = crc32fast::Hasher::new();
    h.update(&r[0..4]);
    h.update(&r[8..]);
    let crc = h.finalize();
    r[4..8].copy_from_slice(&crc.to_le_bytes());
    r
}

/// A segment built write by write, as the log writes one.
struct Seg {
    data: Vec<u8>,
    /// The next write's sequence number.
    seq: u64,
    /// What a completed sync has made durable (the next write says so).
    synced: usize,
    /// Where each record (not Write record) starts and ends.
    records: Vec<(usize, usize)>,
    /// Where each write starts (its Write record).
    writes: Vec<usize>,
}

impl Seg {
    /// A segment as the log begins one: a Write record of no records,
    /// synced before anything follows.
    fn new() -> Seg {
        let mut s = Seg { data: Vec::new(), seq: 1, synced: 0, records: Vec::new(), writes: Vec::new() };
        s.write(&[]);
        s.sync();
        s
    }

    /// A segment of records with no Write record (written before framing).
    fn unframed(bodies: &[usize]) -> Seg {
        let mut s = Seg { data: Vec::new(), seq: 1, synced: 0, records: Vec::new(), writes: Vec::new() };
        for &b in bodies {
            s.push_record(b);
        }
        s
    }

    fn push_record(&mut self, body_bytes: usize) {
        let at = self.data.len();
        self.data.extend(record(RecordKind::Purge, body_bytes, self.records.len() as u8));
        self.records.push((at, self.data.len()));
    }

    /// Appends a write of records with these body sizes; returns where it
    /// starts.
    fn write(&mut self, bodies: &[usize]) -> usize {
        let at = self.data.len();
        let records_bytes = bodies.iter().map(|b| (RECORD_HEADER_BYTES + b) as u64).sum();
        let frame = WriteFrame { seq: self.seq, synced_bytes: self.synced as u64, records_bytes };
        self.seq += 1;
        let mut rec = [0u8; WRITE_RECORD_BYTES];
        frame.encode(&mut rec);
        self.data.extend_from_slice(&rec);
        self.writes.push(at);
        for &b in bodies {
            self.push_record(b);
        }
        at
    }

    /// A completed `fdatasync`: every byte so far is durable.
    fn sync(&mut self) {
        self.synced = self.data.len();
    }

    /// Where each record that starts at or after `from` starts.
    fn records_from(&self, from: usize) -> Vec<usize> {
        self.records.iter().map(|r| r.0).filter(|&s| s >= from).collect()
    }
}

/// A data directory holding `segments` one after another (by offset), as
/// after a crash (no clean-stop marker).
fn directory(segments: &[&[u8]]) -> TempDir {
    let dir = TempDir::new("torn-writes");
    let mut base = 0u64;
    for data in segments {
        fs::write(dir.path().join(format!("{base:020}.log")), data).expect("write segment");
        base += data.len() as u64;
    }
    dir
}

/// Opens the log in `dir`: what it recovered, and the segment-local offset
/// of each record replayed from the last segment.
fn open(dir: &Path) -> Result<(Log, runnel::log::Recovery, Vec<usize>), OpenError> {
    let mut at = Vec::new();
    let (log, recovery) = Log::open(dir, LogOptions::default(), |r| {
        at.push((r.offset - r.segment) as usize);
        Ok(())
    })?;
    Ok((log, recovery, at))
}

/// The segment-local offsets replayed from the last segment of `dir`.
fn replayed_last(dir: &Path) -> Result<(Vec<usize>, u64), OpenError> {
    let (log, recovery, _) = open(dir)?;
    drop(log);
    // Opened again: the cut is made, so this replay is of what was kept.
    let mut at = Vec::new();
    let last = {
        let mut bases: Vec<u64> = fs::read_dir(dir)
            .expect("read dir")
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".log")?.parse().ok())
            .collect();
        bases.sort_unstable();
        *bases.last().expect("a segment")
    };
    let (log, _) = Log::open(dir, LogOptions::default(), |r| {
        if r.segment == last {
            at.push((r.offset - r.segment) as usize);
        }
        Ok(())
    })?;
    drop(log);
    Ok((at, recovery.truncated_bytes))
}

fn last_file(dir: &Path, data_before: &[&[u8]]) -> std::path::PathBuf {
    let base: usize = data_before.iter().map(|d| d.len()).sum();
    dir.join(format!("{base:020}.log"))
}

fn refusal(dir: &Path) -> (u64, String) {
    match open(dir) {
        Ok((_, r, _)) => panic!("the start must refuse; it cut {} bytes", r.truncated_bytes),
        Err(e @ OpenError::Corrupt { .. }) => {
            let OpenError::Corrupt { offset, .. } = &e else { unreachable!() };
            (*offset, e.to_string())
        }
        Err(e) => panic!("expected a refusal for damage, got: {e}"),
    }
}

/// Zeroes what the unsynced write that begins at `write` put in the sector
/// holding byte `at`, as a power cut that lost that sector leaves it (its
/// bytes before the write hold what earlier writes put there; after it,
/// reserved space).
fn lose_sector(data: &mut [u8], write: usize, at: usize) {
    let from = (at / SECTOR_BYTES * SECTOR_BYTES).max(write);
    let to = (at / SECTOR_BYTES * SECTOR_BYTES + SECTOR_BYTES).min(data.len());
    data[from..to].fill(0);
}

// ---------------------------------------------------------------------------
// Framed writes.
// ---------------------------------------------------------------------------

/// The last write torn by a power cut that kept its later sectors and lost
/// an earlier one: whole records of the same write follow the damage. No
/// later Write record says a sync covered it, so no reply depended on it:
/// the start cuts the whole write (its records before the damage too) and
/// keeps every earlier write.
#[test]
fn a_torn_last_write_with_whole_records_after_the_damage_is_cut_whole() {
    let mut s = Seg::new();
    s.write(&[300, 200]);
    s.sync();
    let torn = s.write(&[400, 700, 500, 600, 300]);
    let mut data = s.data.clone();
    // Lose the sector holding the write's second record's header: records
    // after it, in later sectors, survive whole.
    let second = s.records_from(torn)[1];
    lose_sector(&mut data, torn, second + 4);
    let last = s.records_from(torn).last().copied().expect("a record");
    assert!(last > second + SECTOR_BYTES, "setup: whole records of the write follow the lost sector");
    let dir = directory(&[&data]);
    let (kept, cut) = replayed_last(dir.path()).unwrap_or_else(|e| panic!("a torn write must not stop a start: {e}"));
    assert_eq!(
        kept,
        s.records_from(0).into_iter().filter(|&r| r < torn).collect::<Vec<_>>(),
        "every earlier write kept"
    );
    assert_eq!(cut, (data.len() - torn) as u64, "cut at the torn write's Write record");
    assert_eq!(fs::metadata(last_file(dir.path(), &[])).expect("stat").len(), torn as u64);
}

/// The same with the Write record itself lost (its sector), the write's
/// later records whole: the write began where the last whole one ended.
#[test]
fn a_torn_write_whose_own_write_record_is_lost_is_cut_where_it_began() {
    let mut s = Seg::new();
    s.write(&[100]);
    s.sync();
    // Make the write start on a sector boundary, so that losing its first
    // sector loses its Write record and leaves the next sectors whole.
    let pad = SECTOR_BYTES - (s.data.len() + WRITE_RECORD_BYTES + RECORD_HEADER_BYTES) % SECTOR_BYTES;
    s.write(&[pad]);
    s.sync();
    let torn = s.write(&[900, 400, 400]);
    assert_eq!(torn % SECTOR_BYTES, 0, "setup: the write starts a sector");
    let mut data = s.data.clone();
    lose_sector(&mut data, torn, torn);
    let dir = directory(&[&data]);
    let (kept, cut) = replayed_last(dir.path()).unwrap_or_else(|e| panic!("a torn write must not stop a start: {e}"));
    assert_eq!(kept, s.records_from(0).into_iter().filter(|&r| r < torn).collect::<Vec<_>>());
    assert_eq!(cut, (data.len() - torn) as u64);
}

/// A write whose first sectors reached the disk and whose later ones did
/// not reads as its Write record and some whole records, then reserved
/// zeros: nothing is damaged, but the write is short of what its Write
/// record says. It is cut whole: a write is kept whole or not at all.
#[test]
fn a_write_cut_short_by_a_power_cut_is_cut_whole() {
    let mut s = Seg::new();
    s.write(&[200]);
    s.sync();
    let short = s.write(&[100, 100, 900, 900]);
    let mut data = s.data.clone();
    let third = s.records_from(short)[2];
    data.truncate(third);
    data.resize(64 << 10, 0);
    let dir = directory(&[&data]);
    let (kept, cut) = replayed_last(dir.path()).unwrap_or_else(|e| panic!("a short write must not stop a start: {e}"));
    assert_eq!(kept, s.records_from(0).into_iter().filter(|&r| r < short).collect::<Vec<_>>());
    assert_eq!(cut, (data.len() - short) as u64, "the write and the reserved space after it");
}

/// Damage in a write that a later write's Write record says a completed
/// sync covered: those bytes may have been acknowledged. The start refuses
/// at the damage and says so.
#[test]
fn damage_below_a_later_writes_synced_bytes_is_refused() {
    let mut s = Seg::new();
    let synced = s.write(&[300, 300]);
    s.sync();
    s.write(&[100]); // says `synced`'s write is durable
    let mut data = s.data.clone();
    let damaged = s.records_from(synced)[1];
    data[damaged + RECORD_HEADER_BYTES + 7] ^= 0x10;
    let dir = directory(&[&data]);
    let (offset, message) = refusal(dir.path());
    assert_eq!(offset, damaged as u64, "{message}");
    assert!(message.contains("a completed sync covered the damaged bytes"), "{message}");
    assert!(message.contains("--repair"), "{message}");
}

/// A later Write record proves the sync even when the write it begins is
/// itself torn: only its own Write record needs to have survived.
#[test]
fn a_surviving_write_record_of_a_torn_write_still_proves_the_sync_before_it() {
    let mut s = Seg::new();
    let synced = s.write(&[300]);
    s.sync();
    let torn = s.write(&[2000, 300]);
    let mut data = s.data.clone();
    data[s.records_from(synced)[0] + 40] ^= 0x01; // bit rot in synced bytes
    lose_sector(&mut data, torn, torn + 1200); // and the later write torn
    assert!(data[torn..torn + WRITE_RECORD_BYTES].iter().any(|&b| b != 0), "setup: its Write record survived");
    let dir = directory(&[&data]);
    let (offset, _) = refusal(dir.path());
    assert_eq!(offset, s.records_from(synced)[0] as u64);
}

/// A bit flipped in the middle of a long, synced last segment: every later
/// Write record vouches for it.
#[test]
fn a_bit_flipped_in_the_middle_of_a_synced_segment_is_refused() {
    let mut s = Seg::new();
    for i in 0..40 {
        s.write(&[50 + i * 7, 20]);
        s.sync();
    }
    let mid = s.records[s.records.len() / 2];
    let mut data = s.data.clone();
    data[(mid.0 + mid.1) / 2] ^= 0x80;
    let dir = directory(&[&data]);
    let (offset, _) = refusal(dir.path());
    assert_eq!(offset, mid.0 as u64);
}

/// Damage in a segment before the last is refused, framed or not: the log
/// synced it before it moved past it.
#[test]
fn damage_in_a_segment_before_the_last_is_refused() {
    let mut first = Seg::new();
    first.write(&[200, 200]);
    first.sync();
    let torn_looking = first.write(&[300]);
    let mut second = Seg::new();
    second.write(&[100]);
    let mut data = first.data.clone();
    // Its last write as a power cut would tear it: still refused.
    let end = data.len();
    lose_sector(&mut data, torn_looking, end - 10);
    let dir = directory(&[&data, &second.data]);
    let (offset, message) = refusal(dir.path());
    assert!(offset >= torn_looking as u64, "{message}");
    assert!(message.contains("closed segment"), "{message}");
}

/// After a graceful stop the marker vouches for every byte: damage in the
/// last write is refused, though no later Write record covers it.
#[test]
fn damage_under_the_clean_stop_marker_is_refused() {
    let mut s = Seg::new();
    s.write(&[200]);
    s.sync();
    let last = s.write(&[300, 300]);
    s.sync();
    let mut data = s.data.clone();
    lose_sector(&mut data, last, s.records_from(last)[0] + 20);
    let dir = directory(&[&data]);
    fs::write(dir.path().join(CLEAN_STOP_FILE), format!("runnel clean stop v1\nfirst 0\nend {}\n", data.len()))
        .expect("marker");
    let (_, message) = refusal(dir.path());
    assert!(message.contains("stopped cleanly"), "{message}");
}

/// A Write record that says more of its segment was synced than lies
/// before it cannot be an honest one: damage, judged by the table (here
/// the next write's Write record covers it).
#[test]
fn a_write_record_claiming_past_itself_is_damage() {
    let mut s = Seg::new();
    s.write(&[100]);
    s.sync();
    let bad = s.write(&[100]);
    s.sync();
    s.write(&[100]);
    let mut data = s.data.clone();
    let lie = WriteFrame { seq: 3, synced_bytes: bad as u64 + 1, records_bytes: 112 };
    lie.encode(&mut data[bad..bad + WRITE_RECORD_BYTES]);
    let dir = directory(&[&data]);
    let (offset, message) = refusal(dir.path());
    assert_eq!(offset, bad as u64);
    assert!(message.contains("past its own offset"), "{message}");
}

// ---------------------------------------------------------------------------
// Segments written before framing keep the rule they had.
// ---------------------------------------------------------------------------

#[test]
fn an_unframed_segment_keeps_its_rules() {
    // Damage in the last record: a torn tail, cut at that record.
    let s = Seg::unframed(&[100, 200, 300]);
    let mut data = s.data.clone();
    let last = s.records[2];
    data[last.0 + 30] ^= 4;
    let dir = directory(&[&data]);
    let (kept, cut) = replayed_last(dir.path()).expect("a torn tail");
    assert_eq!((kept, cut), (vec![s.records[0].0, s.records[1].0], (data.len() - last.0) as u64));

    // Damage with whole records after it: refused (later turns synced
    // them).
    let mut data = s.data.clone();
    data[s.records[1].0 + 30] ^= 4;
    let dir = directory(&[&data]);
    let (offset, message) = refusal(dir.path());
    assert_eq!(offset, s.records[1].0 as u64);
    assert!(message.contains("written before writes were framed"), "{message}");

    // Damage whose later records lie only past a zeroed 4 KiB block: the
    // rest of the same torn write.
    let mut s = Seg::unframed(&[100]);
    s.data.resize(8192, 0);
    s.push_record(100);
    let mut data = s.data.clone();
    data[s.records[0].0 + 30] ^= 4;
    let dir = directory(&[&data]);
    let (kept, _) = replayed_last(dir.path()).expect("a torn tail");
    assert!(kept.is_empty(), "cut at the damaged record: {kept:?}");
}

// ---------------------------------------------------------------------------
// What the log writes.
// ---------------------------------------------------------------------------

/// The Write records of `data`, read as a start reads them: (offset,
/// frame) of each.
fn write_records(data: &[u8]) -> Vec<(usize, WriteFrame)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + RECORD_HEADER_BYTES <= data.len() && data[at..].iter().any(|&b| b != 0) {
        let len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
        if data[at + 8] == RecordKind::Write as u8 {
            let body = &data[at + RECORD_HEADER_BYTES..at + RECORD_HEADER_BYTES + len];
            out.push((at, WriteFrame::decode(body).expect("a Write record's body")));
        }
        at += RECORD_HEADER_BYTES + len;
    }
    out
}

/// Appends a Purge record to the log and commits it (synced).
fn commit_one(log: &mut Log, sync: bool) {
    let at = log.begin(RecordKind::Purge);
    log.body().extend_from_slice(&[1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0]);
    log.end(at);
    log.commit(sync).expect("commit");
}

/// A segment of an older runnel is appended to after a Write record of no
/// records, synced, that says every byte before it is durable (the start
/// synced them). Each later write says what completed syncs covered, and
/// the numbers go on across a restart.
#[test]
fn the_log_frames_every_write_and_begins_an_older_segment_with_a_synced_write_record() {
    let old = Seg::unframed(&[100, 200]);
    let dir = directory(&[&old.data]);
    let (mut log, _, _) = open(dir.path()).expect("open an older segment");
    commit_one(&mut log, false); // acks only: no sync
    commit_one(&mut log, true);
    commit_one(&mut log, true);
    drop(log);
    let data = fs::read(last_file(dir.path(), &[])).expect("read");
    let frames = write_records(&data);
    let n = old.data.len();
    let rec = (RECORD_HEADER_BYTES + 12) as u64;
    let w = WRITE_RECORD_BYTES;
    let expected = [
        (n, WriteFrame { seq: 1, synced_bytes: n as u64, records_bytes: 0 }),
        (n + w, WriteFrame { seq: 2, synced_bytes: (n + w) as u64, records_bytes: rec }),
        // The turn before did not sync: this write says only what did.
        (n + 2 * w + rec as usize, WriteFrame { seq: 3, synced_bytes: (n + w) as u64, records_bytes: rec }),
        (
            n + 3 * w + 2 * rec as usize,
            WriteFrame { seq: 4, synced_bytes: (n + 3 * w) as u64 + 2 * rec, records_bytes: rec },
        ),
    ];
    assert_eq!(frames, expected);

    // Damage in the older records is now refused: the first Write record
    // vouches for them.
    let mut bad = data.clone();
    bad[old.records[1].0 + 20] ^= 1;
    fs::write(last_file(dir.path(), &[]), &bad).expect("write");
    let (offset, message) = refusal(dir.path());
    assert_eq!(offset, old.records[1].0 as u64, "{message}");
    fs::write(last_file(dir.path(), &[]), &data).expect("write");

    // Reopened: the numbers go on.
    let (mut log, _, _) = open(dir.path()).expect("reopen");
    commit_one(&mut log, true);
    drop(log);
    let frames = write_records(&fs::read(last_file(dir.path(), &[])).expect("read"));
    assert_eq!(frames.last().map(|f| f.1.seq), Some(5), "{frames:?}");
}

/// A new segment begins with a Write record of its own, synced before the
/// first write of records: a power cut that tears that first write at its
/// very first byte leaves a segment recovery knows is framed.
#[test]
fn a_new_segment_begins_with_a_write_record_synced_on_its_own() {
    let dir = TempDir::new("torn-writes-roll");
    let options = LogOptions { segment_bytes_max: 4096, ..LogOptions::default() };
    let (mut log, _) = Log::open(dir.path(), options, |_| Ok(())).expect("open");
    let before = log.stats.fsyncs;
    commit_one(&mut log, true);
    assert_eq!(log.stats.fsyncs - before, 2, "the Write record's own sync, then the turn's");
    let mut segments = 1;
    while log.segments().len() < 3 {
        commit_one(&mut log, true);
        if log.segments().len() > segments {
            segments = log.segments().len();
            let s = log.segments().last().expect("a segment");
            let data = fs::read(dir.path().join(format!("{:020}.log", s.base))).expect("read");
            let frames = write_records(&data);
            assert_eq!(frames[0].0, 0, "a segment's first record is a Write record");
            assert_eq!((frames[0].1.synced_bytes, frames[0].1.records_bytes), (0, 0));
            assert_eq!(frames[1].1.synced_bytes, WRITE_RECORD_BYTES as u64, "synced before the first write");
        }
    }
}

/// A torn last write whose payload carries a copy of an earlier Write
/// record (a message holding bytes of a runnel log, say): that copy says a
/// sync covered the damage, but it is numbered no higher than the last
/// Write record before the damage, so it is no later write of this
/// segment. The start cuts the torn write as it would without it.
#[test]
fn a_stale_write_record_inside_a_payload_proves_nothing() {
    let mut s = Seg::new();
    s.write(&[100]);
    s.sync();
    let torn = s.write(&[1200, 600]);
    let mut data = s.data.clone();
    // The torn write's first record carries, in its body, a copy of a
    // Write record numbered 2 claiming everything up to itself synced;
    // its second record is whole after the lost sector of the first.
    let first = s.records_from(torn)[0];
    let copy_at = first + RECORD_HEADER_BYTES + 700;
    let stale = WriteFrame { seq: 2, synced_bytes: copy_at as u64, records_bytes: 0 };
    stale.encode(&mut data[copy_at..copy_at + WRITE_RECORD_BYTES]);
    lose_sector(&mut data, torn, first + RECORD_HEADER_BYTES + 100);
    assert!(copy_at / SECTOR_BYTES != (first + RECORD_HEADER_BYTES + 100) / SECTOR_BYTES, "setup: the copy survives");
    let dir = directory(&[&data]);
    let (kept, cut) = replayed_last(dir.path()).unwrap_or_else(|e| panic!("a stale copy must not stop a start: {e}"));
    assert_eq!(kept, s.records_from(0).into_iter().filter(|&r| r < torn).collect::<Vec<_>>());
    assert_eq!(cut, (data.len() - torn) as u64);
}

/// What `--repair --dry-run` (`Log::inspect`) reports of a torn write is
/// what a start cuts: from the start of the write on, and no damage.
#[test]
fn an_inspection_reports_a_torn_write_as_the_start_cuts_it() {
    let mut s = Seg::new();
    s.write(&[300]);
    s.sync();
    let torn = s.write(&[800, 900, 100]);
    let mut data = s.data.clone();
    lose_sector(&mut data, torn, s.records_from(torn)[0] + 40);
    data.resize(8192, 0);
    let dir = directory(&[&data]);
    let ins = Log::inspect(dir.path()).expect("inspect");
    assert!(!ins.damaged(), "{ins}");
    assert_eq!(ins.torn, Some((last_file(dir.path(), &[]), torn as u64, (data.len() - torn) as u64)), "{ins}");
    assert_eq!(ins.records, 1, "the one record of the earlier write: {ins}");
}

/// `--repair` on a last segment with damage a later Write record vouches
/// for: it drops the damaged record, rewrites the segment without its
/// Write records (their offsets would be stale), and the log writes one of
/// its own before it next appends there.
#[test]
fn repair_rewrites_a_segment_without_its_write_records_and_the_log_frames_it_again() {
    let mut s = Seg::new();
    let damaged = s.write(&[200, 200]);
    s.sync();
    s.write(&[300]);
    s.sync();
    s.write(&[100]);
    let mut data = s.data.clone();
    let bad = s.records_from(damaged)[0];
    data[bad + 50] ^= 2;
    let dir = directory(&[&data]);
    let options = LogOptions { repair: true, ..LogOptions::default() };
    let (mut log, recovery) = Log::open(dir.path(), options, |_| Ok(())).expect("repair");
    assert_eq!(recovery.repaired_bytes, (RECORD_HEADER_BYTES + 200) as u64);
    let kept = fs::read(last_file(dir.path(), &[])).expect("read");
    assert_eq!(kept.len(), 3 * RECORD_HEADER_BYTES + 600, "the three records left, and no Write record");
    assert!(write_records(&kept).is_empty());
    commit_one(&mut log, true);
    drop(log);
    let data = fs::read(last_file(dir.path(), &[])).expect("read");
    let frames = write_records(&data);
    assert_eq!(frames[0].0, kept.len(), "a Write record where the repaired records end");
    assert_eq!(frames[0].1.synced_bytes, kept.len() as u64, "saying they are durable");
    assert!(frames[0].1.seq > 4, "numbered after every Write record the log held: {frames:?}");
}
