//! Recovery: reading the commit log back at start, and deciding what
//! damage means (docs/log-format.md, "Recovery", is the contract).
//!
//! PostgreSQL and RocketMQ replay to the first invalid record and cut
//! there. runnel narrows that: only the unsynced end of a crashed run may be
//! cut without asking (a torn tail). Two facts decide it. A graceful stop
//! leaves a marker file saying where the log began and ended, so after a
//! clean stop nothing is torn; and segment file names are log offsets, so a
//! segment deleted or cut short shows as a gap between names. Everything
//! that is not a whole, valid record in its place is corruption: start-up
//! refuses and says what `--repair` would drop.
//!
//! Repair keeps what is valid: records are self-delimiting with CRCs, so it
//! skips exactly the damaged bytes and resumes at the next valid record,
//! rewrites each damaged segment without them, and renames the later
//! segments so each begins where the one before ends. The next start needs
//! no flag.
//!
//! A child module of `log` (only the log touches files).

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{
    FsyncMode, Log, LogOptions, NEWER, OpenError, RECORD_HEADER_BYTES, REMOVING_SUFFIX, ReadRecord, RecordKind,
    Recovery, Replayer, Segment, WRITE_BODY_BYTES, WRITE_RECORD_BYTES, WriteFrame, create_dir_durably, parse_record,
    segment_name, sync_dir,
};

#[path = "recovery/damage.rs"]
mod damage;
#[path = "recovery/writes.rs"]
mod writes;

use damage::*;
use writes::{Claims, Framing, Step, checked_records, step};

/// The marker a graceful stop leaves in the data directory: the log is
/// whole and synced, and holds exactly the log offsets it names.
pub const CLEAN_STOP_FILE: &str = "CLEAN_STOP";
/// The marker is written here, synced, then renamed into place, so a crash
/// never leaves half of one.
const CLEAN_STOP_TMP: &str = "CLEAN_STOP.tmp";
/// The marker's first line: what it is and its format's version.
const CLEAN_STOP_HEADER: &str = "runnel clean stop v1";
/// A damaged segment being rewritten by repair, until it is renamed over
/// the original. Not part of the log: a start deletes it.
const REPAIRING_SUFFIX: &str = ".repairing";
/// The lock file, locked as well as the directory (see `DirLock`).
const LOCK_FILE: &str = "LOCK";
/// Damaged or missing stretches a report names one by one; past this many
/// they are only counted. Bounds the report, and what recovery keeps in
/// memory, for a log damaged all over.
const DAMAGE_LISTED_MAX: usize = 64;
/// The filesystem block: after a machine crash, a block of reserved space
/// that the crash kept from being written reads as zeros even when later
/// blocks of the same unsynced write made it to disk.
pub(super) const HOLE_BLOCK_BYTES: usize = 4096;

// ---------------------------------------------------------------------------
// What recovery reports.
// ---------------------------------------------------------------------------

/// How the broker's previous run ended, by the marker a graceful stop
/// leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LastStop {
    /// No marker: the run may have crashed (or the directory was written by
    /// a runnel that leaves none), so the end of the last segment may be a
    /// torn write.
    MayHaveCrashed,
    /// A graceful stop left the log holding log offsets `first..end`, all of
    /// it synced.
    Clean {
        /// Log offset of the first segment's first byte.
        first: u64,
        /// Log offset just past the last record.
        end: u64,
    },
}

/// What kind of damage a `Damage` is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DamageKind {
    /// A record that fails its checks but whose header still says where it
    /// ends: repair drops exactly its bytes. `kind` is its kind byte as
    /// found (it may be damaged too).
    Record { kind: u8 },
    /// Bytes in which no record can be read: repair drops them and resumes
    /// at the next valid record.
    Unreadable,
    /// Log offsets no segment file holds: a segment deleted or cut short
    /// (repair cannot bring them back; it renames the later segments to
    /// close the gap).
    Missing,
    /// Log offsets held where none should be: a segment beginning before the
    /// one before it ends, or records past where a graceful stop left the
    /// log ending. Repair keeps them.
    Unexpected,
}

/// One damaged or missing stretch of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The segment file it is in (a gap: the file after it; a missing end:
    /// the last file).
    pub file: PathBuf,
    /// `Record` and `Unreadable`: the byte offset in `file` where it
    /// begins. `Missing` and `Unexpected`: the log offset where it begins.
    pub at: u64,
    /// Bytes dropped, missing or unexpected.
    pub bytes: u64,
    pub kind: DamageKind,
    /// What is wrong, in words.
    pub why: String,
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (file, from, to, n) = (self.file.display(), self.at, self.at + self.bytes, self.bytes);
        match self.kind {
            DamageKind::Record { kind } => {
                let name = RecordKind::from_u8(kind).map_or_else(|| format!("kind {kind}"), |k| format!("{k:?}"));
                write!(f, "{file} bytes {from}..{to} ({n} bytes): a {name} record: {}", self.why)
            }
            DamageKind::Unreadable => {
                write!(f, "{file} bytes {from}..{to} ({n} bytes): no record can be read: {}", self.why)
            }
            DamageKind::Missing => write!(f, "log offsets {from}..{to} ({n} bytes) are missing: {}", self.why),
            DamageKind::Unexpected => write!(f, "log offsets {from}..{to} ({n} bytes) are unexpected: {}", self.why),
        }
    }
}

/// What a full read of the log finds, changing nothing: what a start cuts
/// as a torn tail, and every damaged or missing stretch (what makes a start
/// refuse, and what `--repair` drops).
#[derive(Clone, Debug)]
pub struct Inspection {
    pub dir: PathBuf,
    pub last_stop: LastStop,
    pub segments: usize,
    /// Whole valid records in the segments.
    pub records: u64,
    /// Bytes of those records: what the log holds after a repair.
    pub record_bytes: u64,
    /// The torn tail a start cuts: the last segment, the byte where its
    /// records end, and the bytes cut (reserved space included).
    pub torn: Option<(PathBuf, u64, u64)>,
    /// The first `DAMAGE_LISTED_MAX` damaged or missing stretches, in log
    /// order.
    pub damage: Vec<Damage>,
    /// Damaged or missing stretches in all.
    pub damage_count: u64,
    /// Bytes of segment files repair drops (`Record` and `Unreadable`).
    pub dropped_bytes: u64,
    /// Log bytes no file holds (`Missing`).
    pub missing_bytes: u64,
    /// A clean-stop marker was found but the log goes on past its end (a
    /// runnel that leaves no marker ran since): it is ignored, and a start
    /// removes it.
    pub outgrown_marker: bool,
}

impl Inspection {
    fn new(dir: &Path, last_stop: LastStop, segments: usize) -> Inspection {
        Inspection {
            dir: dir.to_path_buf(),
            last_stop,
            segments,
            records: 0,
            record_bytes: 0,
            torn: None,
            damage: Vec::new(),
            damage_count: 0,
            dropped_bytes: 0,
            missing_bytes: 0,
            outgrown_marker: false,
        }
    }

    /// Whether a start without `--repair` refuses this log.
    pub fn damaged(&self) -> bool {
        self.damage_count > 0
    }

    fn push(&mut self, d: Damage) {
        self.damage_count += 1;
        match d.kind {
            DamageKind::Record { .. } | DamageKind::Unreadable => self.dropped_bytes += d.bytes,
            DamageKind::Missing => self.missing_bytes += d.bytes,
            DamageKind::Unexpected => {}
        }
        if self.damage.len() < DAMAGE_LISTED_MAX {
            self.damage.push(d);
        }
    }

    /// The damage, one stretch a line, and what repair does with it.
    pub fn damage_text(&self) -> String {
        let mut s = format!(
            "{} damaged or missing stretches; --repair would drop {} damaged bytes and keep every valid record:\n",
            self.damage_count, self.dropped_bytes
        );
        for d in &self.damage {
            s += &format!("  {d}\n");
        }
        if self.damage_count > self.damage.len() as u64 {
            s += &format!("  ... and {} more\n", self.damage_count - self.damage.len() as u64);
        }
        if self.missing_bytes > 0 {
            s += &format!("{} bytes of the log are missing; repair cannot bring them back.\n", self.missing_bytes);
        }
        s
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "commit log in {}: {} segments, {} valid records ({} bytes)",
            self.dir.display(),
            self.segments,
            self.records,
            self.record_bytes
        )?;
        match self.last_stop {
            LastStop::Clean { first, end } => {
                writeln!(f, "the last run stopped cleanly, leaving log offsets {first}..{end}")?
            }
            LastStop::MayHaveCrashed if self.outgrown_marker => writeln!(
                f,
                "the last run may have crashed ({CLEAN_STOP_FILE} is outgrown: the log goes on past its end; a start removes it)"
            )?,
            LastStop::MayHaveCrashed => writeln!(f, "the last run may have crashed (no {CLEAN_STOP_FILE} marker)")?,
        }
        if let Some((file, at, bytes)) = &self.torn {
            writeln!(f, "a start cuts a torn tail of {bytes} bytes from {} at byte {at}", file.display())?;
        }
        if self.damaged() {
            writeln!(f, "a start without --repair refuses: the log is damaged")?;
            write!(f, "{}", self.damage_text())
        } else {
            writeln!(f, "no damage: a start needs no --repair")
        }
    }
}

// ---------------------------------------------------------------------------
// The lock.
// ---------------------------------------------------------------------------

/// The data directory's lock, held for the life of the log: an exclusive
/// `flock` on the directory itself, which nothing can unlink from under the
/// broker (a lock on a file inside it is lost with the file's name: a second
/// broker would create a new file and lock that). The `LOCK` file is locked
/// too, so that a runnel that locks only that file also finds the directory
/// in use. Both locks go with the process, however it ends.
pub struct DirLock {
    /// The directory, opened read-only.
    _dir: File,
    /// The `LOCK` file (absent only when inspecting a directory without one).
    _file: Option<File>,
}

impl DirLock {
    /// Locks `dir`; `create` makes the `LOCK` file if it is missing
    /// (inspecting changes nothing, so it does not).
    fn take(dir: &Path, create: bool) -> Result<DirLock, OpenError> {
        let d = OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY).open(dir).map_err(io_error(dir))?;
        try_lock(&d, dir)?;
        let path = dir.join(LOCK_FILE);
        let file = if create {
            Some(OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(io_error(&path))?)
        } else {
            match File::open(&path) {
                Ok(f) => Some(f),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(OpenError::Io(path, e)),
            }
        };
        if let Some(f) = &file {
            try_lock(f, dir)?;
        }
        Ok(DirLock { _dir: d, _file: file })
    }
}

fn try_lock(f: &File, dir: &Path) -> Result<(), OpenError> {
    match f.try_lock() {
        Ok(()) => Ok(()),
        Err(fs::TryLockError::WouldBlock) => Err(OpenError::Locked(dir.to_path_buf())),
        Err(fs::TryLockError::Error(e)) => Err(OpenError::Io(dir.to_path_buf(), e)),
    }
}

fn io_error(p: &Path) -> impl FnOnce(io::Error) -> OpenError + use<> {
    let p = p.to_path_buf();
    move |e| OpenError::Io(p, e)
}

// ---------------------------------------------------------------------------
// Opening: replay, refusal, repair.
// ---------------------------------------------------------------------------

/// What `recover` hands `Log::open_with`.
pub(super) struct Recovered {
    pub lock: DirLock,
    /// The segments in log order, each with the bytes of its records.
    pub segments: Vec<Segment>,
    /// Whether the clean-stop marker is still on disk (the log must remove
    /// it before it changes anything).
    pub marked: bool,
    /// Whether the last segment holds a valid Write record (else the log's
    /// next write there is preceded by one of its own).
    pub framed: bool,
    /// One above the highest Write record's sequence number in the log.
    pub next_write_seq: u64,
    pub recovery: Recovery,
}

/// Locks `dir` (creating it and its missing parents, durably, if needed),
/// repairs it if `options.repair` and it needs it, and replays every record
/// into `apply` in log order.
pub(super) fn recover(dir: &Path, options: &LogOptions, replayer: &mut dyn Replayer) -> Result<Recovered, OpenError> {
    let started = Instant::now();
    create_dir_durably(dir).map_err(io_error(dir))?;
    let lock = DirLock::take(dir, true)?;
    let mut bases = list_segments(dir, true)?;
    let (mut stop, outgrown) = last_stop(dir, &bases)?;
    if outgrown {
        let path = dir.join(CLEAN_STOP_FILE);
        fs::remove_file(&path).and_then(|()| sync_dir(dir)).map_err(io_error(&path))?;
    }
    let mut rec = Recovery::default();
    // The highest Write record's number before a repair drops any.
    let mut repaired_write_seq = 0;
    if options.repair {
        let (ins, plan) = scan(dir, &bases, stop)?;
        repaired_write_seq = plan.iter().map(|s| s.last_write_seq).max().unwrap_or(0);
        if ins.damaged() {
            for d in &ins.damage {
                log::error!("commit log: --repair: {d}");
            }
            repair(dir, stop, &plan)?;
            log::error!(
                "commit log: --repair dropped {} damaged bytes and kept every valid record ({} damaged or missing stretches; {} bytes were missing)",
                ins.dropped_bytes,
                ins.damage_count,
                ins.missing_bytes
            );
            rec.repaired_bytes = ins.dropped_bytes;
            rec.damage = ins.damage;
            stop = LastStop::MayHaveCrashed;
            bases = list_segments(dir, false)?;
        }
    }
    rec.clean_stop = stop != LastStop::MayHaveCrashed;
    if replayer.scans() {
        scan_records(dir, &bases, replayer)?;
    }
    let mut apply = |r: &ReadRecord<'_>| replayer.apply(r);
    let replayed = match replay(dir, &bases, stop, &mut apply, &mut rec) {
        Ok(r) => r,
        Err(Halt::Open(e)) => return Err(e),
        Err(Halt::Refuse { file, offset, why }) => {
            let report = scan(dir, &bases, stop).ok().map(|(ins, _)| Box::new(ins));
            return Err(OpenError::Corrupt { file, offset, why, report });
        }
    };
    let segments = replayed.segments;
    rec.segments = segments.len();
    rec.bytes = segments.iter().map(|s| s.bytes).sum();
    rec.millis = started.elapsed().as_millis() as u64;
    Ok(Recovered {
        lock,
        segments,
        marked: rec.clean_stop,
        framed: replayed.framed,
        next_write_seq: replayed.last_write_seq.max(repaired_write_seq) + 1,
        recovery: rec,
    })
}

/// Reads the log in `dir` through and reports what a start would find,
/// changing nothing (no file is created, cut, renamed or removed).
pub(super) fn inspect(dir: &Path) -> Result<Inspection, OpenError> {
    let _lock = DirLock::take(dir, false)?;
    let bases = list_segments(dir, false)?;
    let (stop, outgrown) = last_stop(dir, &bases)?;
    let (mut ins, _) = scan(dir, &bases, stop)?;
    ins.outgrown_marker = outgrown;
    Ok(ins)
}

/// The bases of the segment files in `dir`, in log order. With `tidy`,
/// deletes what an interrupted step left: a removed segment's file still
/// being released, a repair's unfinished copy, a marker never renamed into
/// place. None of them is part of the log.
fn list_segments(dir: &Path, tidy: bool) -> Result<Vec<u64>, OpenError> {
    let mut bases = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(REMOVING_SUFFIX) || name.ends_with(REPAIRING_SUFFIX) || name == CLEAN_STOP_TMP {
            if tidy {
                let path = entry.path();
                fs::remove_file(&path).map_err(io_error(&path))?;
            }
            continue;
        }
        if let Some(stem) = name.strip_suffix(".log")
            && let Ok(base) = stem.parse::<u64>()
        {
            bases.push(base);
        }
    }
    bases.sort_unstable();
    Ok(bases)
}

fn read_segment(path: &Path, data: &mut Vec<u8>) -> Result<(), OpenError> {
    data.clear();
    File::open(path).and_then(|mut f| f.read_to_end(data)).map_err(io_error(path))?;
    Ok(())
}

/// The first pass of a `Replayer` that `scans`: the records of every
/// segment, in log order, up to the first that is not valid (where
/// `replay` cuts a torn tail or refuses the start). Produce and Dedup
/// records, which the first pass does not look into and which hold nearly
/// all of a log's bytes, are stepped over by their length, unread when
/// larger than the read buffer and without their CRC checked: a log of
/// large records costs this pass little more than their headers. So after
/// a torn Produce record it may read records `replay` cuts; a group it
/// places from those alone is never named, so it is never built, and what
/// it held back is released at the end (`Topic::restore_done`).
fn scan_records(dir: &Path, bases: &[u64], replayer: &mut dyn Replayer) -> Result<(), OpenError> {
    let mut rec = Vec::new();
    for &base in bases {
        let path = dir.join(segment_name(base));
        let file = File::open(&path).map_err(io_error(&path))?;
        let file_bytes = file.metadata().map_err(io_error(&path))?.len();
        let mut rd = io::BufReader::with_capacity(SCAN_BUFFER_BYTES, file);
        let mut pos = 0u64;
        while let Some(used) = scan_record(&mut rd, &mut rec, file_bytes - pos, |r| {
            replayer.scan(&ReadRecord { offset: base + pos, segment: base, ..r });
        }) {
            pos += used;
        }
    }
    Ok(())
}

/// Bytes `scan_records` reads from a segment at a time.
const SCAN_BUFFER_BYTES: usize = 64 << 10;

/// Reads the record at `rd`'s position (into `rec`) and hands it to
/// `scan`, or steps over it if it is a Produce or Dedup record (or a Write
/// record, the log's own); the bytes
/// it takes. None at the end of the valid records (or of the `left` bytes
/// the file has after the position: a torn length never makes it read or
/// allocate past the file).
fn scan_record(
    rd: &mut io::BufReader<File>,
    rec: &mut Vec<u8>,
    left: u64,
    scan: impl FnOnce(ReadRecord<'_>),
) -> Option<u64> {
    rec.resize(RECORD_HEADER_BYTES, 0);
    rd.read_exact(rec).ok()?;
    let len = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]) as usize;
    let kind = RecordKind::from_u8(rec[8])?;
    let used = (RECORD_HEADER_BYTES + len) as u64;
    if used > left {
        return None;
    }
    if matches!(kind, RecordKind::Produce | RecordKind::Dedup | RecordKind::Write) {
        rd.seek_relative(i64::try_from(len).ok()?).ok()?;
        return Some(used);
    }
    rec.resize(RECORD_HEADER_BYTES + len, 0);
    rd.read_exact(&mut rec[RECORD_HEADER_BYTES..]).ok()?;
    let (kind, version, body, _) = parse_record(rec).ok()?;
    scan(ReadRecord { kind, version, body, offset: 0, segment: 0 });
    Some(used)
}

/// Why `replay` stopped.
enum Halt {
    Open(OpenError),
    /// Damage a start does not cut on its own: the first found.
    Refuse {
        file: PathBuf,
        offset: u64,
        why: String,
    },
}

impl From<OpenError> for Halt {
    fn from(e: OpenError) -> Halt {
        Halt::Open(e)
    }
}

/// What `replay` found: the segments, and what the log's writes go on
/// from.
struct Replayed {
    /// The segments in log order, each with the bytes of its records.
    segments: Vec<Segment>,
    /// Whether the last segment holds a valid Write record.
    framed: bool,
    /// The highest Write record's sequence number (0: none).
    last_write_seq: u64,
}

/// Replays every segment into `apply` in log order, checking that each
/// begins where the one before it ended (or, after a clean stop, where the
/// marker says the log begins) and that the log ends where the marker says.
/// A torn tail is cut; any other damage halts.
fn replay(
    dir: &Path,
    bases: &[u64],
    stop: LastStop,
    apply: &mut dyn FnMut(&ReadRecord<'_>) -> Result<(), String>,
    rec: &mut Recovery,
) -> Result<Replayed, Halt> {
    let mut out = Replayed { segments: Vec::with_capacity(bases.len()), framed: false, last_write_seq: 0 };
    let mut data = Vec::new();
    for (n, &base) in bases.iter().enumerate() {
        let path = dir.join(segment_name(base));
        let previous = n.checked_sub(1).map(|p| dir.join(segment_name(bases[p])));
        let expected = match (out.segments.last(), stop) {
            (Some(s), _) => Some(s.end()),
            (None, LastStop::Clean { first, .. }) => Some(first),
            (None, LastStop::MayHaveCrashed) => None,
        };
        if let Some(end) = expected
            && end != base
        {
            let (_, why) = discontinuity(previous.as_deref(), end, &path, base);
            return Err(Halt::Refuse { file: path, offset: 0, why });
        }
        read_segment(&path, &mut data)?;
        let place = Place::of(n, bases.len(), stop);
        let mut framing = Framing::default();
        let (end, damage) = replay_records(&data, base, &path, apply, rec, &mut framing, place)?;
        if let Some((at, why)) = damage {
            let later = || later_at(&data, at, &framing, &mut Claims::default(), || records_after(&data, at + 1));
            let row = classify(Found::of(&why), place, later);
            if row.verdict == Verdict::Refuse {
                return Err(Halt::Refuse { file: path, offset: at as u64, why: format!("{why}; {}", row.means) });
            }
            cut_torn_tail(&path, end, data.len(), &format!("{why} at byte {at}"))?;
            rec.truncated_bytes = (data.len() - end) as u64;
        }
        out.last_write_seq = out.last_write_seq.max(framing.last_seq());
        out.framed = framing.framed_before(end);
        out.segments.push(Segment { base, bytes: end as u64 });
    }
    if let LastStop::Clean { first, end } = stop {
        let head = out.segments.last().map_or(first, Segment::end);
        if head != end {
            let last = out.segments.last();
            let file = last.map_or_else(|| dir.join(CLEAN_STOP_FILE), |s| dir.join(segment_name(s.base)));
            let offset = last.map_or(0, |s| s.bytes);
            return Err(Halt::Refuse { file, offset, why: clean_end_mismatch(head, end) });
        }
    }
    Ok(out)
}

/// Applies the records of one segment in order until the first that is not
/// valid: a write's records once the whole write is read and valid, so
/// that a torn write is none of them. Returns where the records end (where
/// a torn tail is cut: the start of the write that holds the damage) and,
/// if something other than the reserved zeros follows them, where the
/// damage is and why.
fn replay_records(
    data: &[u8],
    base: u64,
    path: &Path,
    apply: &mut dyn FnMut(&ReadRecord<'_>) -> Result<(), String>,
    rec: &mut Recovery,
    framing: &mut Framing,
    place: Place,
) -> Result<(usize, Option<(usize, String)>), OpenError> {
    let mut apply_at = |kind, version, body, at: usize| {
        let r = ReadRecord { kind, version, body, offset: base + at as u64, segment: base };
        rec.records += 1;
        apply(&r).map_err(|why| OpenError::Apply { file: path.to_path_buf(), offset: at as u64, why })
    };
    let mut pos = 0;
    while pos < data.len() {
        match step(data, pos, framing, place == Place::LastAfterCrash) {
            Step::Record { used } => {
                for (kind, version, body, at) in checked_records(data, pos, pos + used) {
                    apply_at(kind, version, body, at)?;
                }
                pos += used;
            }
            Step::Write { end, .. } => {
                for (kind, version, body, at) in checked_records(data, pos + WRITE_RECORD_BYTES, end) {
                    apply_at(kind, version, body, at)?;
                }
                pos = end;
            }
            // Space reserved ahead of the writes: the records end here.
            Step::End => break,
            Step::Damaged { at, why, .. } => return Ok((pos, Some((at, why)))),
        }
    }
    Ok((pos, None))
}

fn cut_torn_tail(path: &Path, end: usize, len: usize, why: &str) -> Result<(), OpenError> {
    log::warn!(
        "commit log: cut a torn tail of {} bytes from {} at byte {end} ({why}); a crash interrupted a write that no reply depended on",
        len - end,
        path.display()
    );
    let f = OpenOptions::new().write(true).open(path).map_err(io_error(path))?;
    f.set_len(end as u64).map_err(io_error(path))?;
    f.sync_all().map_err(io_error(path))?;
    Ok(())
}

/// Words for a segment `path` at log offset `base` where the log should be
/// at `end` (`previous`: the segment before it, or none for the first,
/// whose place the clean-stop marker gives).
fn discontinuity(previous: Option<&Path>, end: u64, path: &Path, base: u64) -> (DamageKind, String) {
    let path = path.display();
    match previous {
        Some(p) if base > end => (
            DamageKind::Missing,
            format!(
                "{} ends at log offset {end} but {path} begins at {base}: a segment deleted, or one cut short",
                p.display()
            ),
        ),
        Some(p) => (
            DamageKind::Unexpected,
            format!(
                "{path} begins at log offset {base}, before {} ends at {end}: two files hold that part of the log",
                p.display()
            ),
        ),
        None if base > end => (
            DamageKind::Missing,
            format!(
                "the graceful stop left the log beginning at log offset {end} but the first segment, {path}, begins at {base}: the oldest segments were deleted"
            ),
        ),
        None => (
            DamageKind::Unexpected,
            format!(
                "the graceful stop left the log beginning at log offset {end} but {path} begins before it, at {base}"
            ),
        ),
    }
}

fn clean_end_mismatch(head: u64, end: u64) -> String {
    if head < end {
        format!(
            "the graceful stop left the log ending at log offset {end} but its records end at {head}: its end was cut off"
        )
    } else {
        format!("the graceful stop left the log ending at log offset {end} but it holds records up to {head}")
    }
}

// ---------------------------------------------------------------------------
// The scan: every damaged stretch, for the refusal, --dry-run and repair.
// ---------------------------------------------------------------------------

/// One segment as the scan found it: what repair does with it.
struct Scanned {
    base: u64,
    /// It holds damaged stretches: repair rewrites it without them.
    rewrite: bool,
    /// Bytes of its valid records: its length once repaired.
    kept_bytes: u64,
    /// Its last valid Write record's sequence number (0: none).
    last_write_seq: u64,
}

/// Reads every segment through, changing nothing: the report, and for each
/// segment what repair would do.
fn scan(dir: &Path, bases: &[u64], stop: LastStop) -> Result<(Inspection, Vec<Scanned>), OpenError> {
    let mut ins = Inspection::new(dir, stop, bases.len());
    let mut plan = Vec::with_capacity(bases.len());
    // Where the next segment may begin: at least `lo`, at most `hi` (more
    // than `lo` only when damage runs into zeros at the end of a segment,
    // which may have been the end of its last record).
    let mut expected = match stop {
        LastStop::Clean { first, .. } => Some((first, first)),
        LastStop::MayHaveCrashed => None,
    };
    let mut previous: Option<PathBuf> = None;
    let mut data = Vec::new();
    for (n, &base) in bases.iter().enumerate() {
        let path = dir.join(segment_name(base));
        if let Some((lo, hi)) = expected
            && !(lo..=hi).contains(&base)
        {
            let end = if base < lo { lo } else { hi };
            let (kind, why) = discontinuity(previous.as_deref(), end, &path, base);
            let (at, bytes) = if base < lo { (base, lo - base) } else { (hi, base - hi) };
            ins.push(Damage { file: path.clone(), at, bytes, kind, why });
        }
        read_segment(&path, &mut data)?;
        let w = walk(&data, Place::of(n, bases.len(), stop));
        for s in &w.stretches {
            let kind = s.kind.map_or(DamageKind::Unreadable, |kind| DamageKind::Record { kind });
            let (at, bytes) = (s.at as u64, (s.end - s.at) as u64);
            ins.push(Damage { file: path.clone(), at, bytes, kind, why: s.why.clone() });
        }
        if w.torn {
            ins.torn = Some((path.clone(), w.end as u64, (data.len() - w.end) as u64));
        }
        ins.records += w.records;
        ins.record_bytes += w.kept_bytes() as u64;
        let last_write_seq = w.last_write_seq;
        plan.push(Scanned {
            base,
            rewrite: !w.stretches.is_empty(),
            kept_bytes: w.kept_bytes() as u64,
            last_write_seq,
        });
        let runs_into_zeros = w.stretches.last().is_some_and(|s| s.end == w.end && s.kind.is_none());
        let hi = if runs_into_zeros { data.len() } else { w.end };
        expected = Some((base + w.end as u64, base + hi as u64));
        previous = Some(path);
    }
    if let LastStop::Clean { end, .. } = stop
        && let Some((lo, hi)) = expected
        && !(lo..=hi).contains(&end)
    {
        let file = previous.unwrap_or_else(|| dir.join(CLEAN_STOP_FILE));
        let (kind, at, bytes) =
            if end > hi { (DamageKind::Missing, hi, end - hi) } else { (DamageKind::Unexpected, end, lo - end) };
        ins.push(Damage { file, at, bytes, kind, why: clean_end_mismatch(if end > hi { hi } else { lo }, end) });
    }
    Ok((ins, plan))
}

// ---------------------------------------------------------------------------
// Repair.
// ---------------------------------------------------------------------------

/// Makes the directory one a start reads without `--repair`: each damaged
/// segment rewritten without its damaged stretches, the segments renamed so
/// each begins where the one before ends, and the clean-stop marker removed
/// last (until then a start still refuses). Each step is durable before the
/// next; an interrupted repair is finished by running it again.
fn repair(dir: &Path, stop: LastStop, plan: &[Scanned]) -> Result<(), OpenError> {
    for (n, s) in plan.iter().enumerate() {
        if s.rewrite {
            rewrite_segment(dir, s.base, Place::of(n, plan.len(), stop))?;
        }
    }
    renumber(dir, plan)?;
    match fs::remove_file(dir.join(CLEAN_STOP_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(OpenError::Io(dir.join(CLEAN_STOP_FILE), e)),
        _ => {}
    }
    sync_dir(dir).map_err(io_error(dir))
}

/// Rewrites segment `base` with only its valid records: a copy, synced,
/// renamed over the original.
fn rewrite_segment(dir: &Path, base: u64, place: Place) -> Result<(), OpenError> {
    let path = dir.join(segment_name(base));
    let mut data = Vec::new();
    read_segment(&path, &mut data)?;
    let w = walk(&data, place);
    let mut kept = Vec::with_capacity(w.kept_bytes());
    let mut at = 0;
    for s in &w.stretches {
        kept.extend_from_slice(&data[at..s.at]);
        at = s.end;
    }
    kept.extend_from_slice(&data[at..w.end]);
    let kept = without_write_records(&kept);
    let copy = dir.join(format!("{}{REPAIRING_SUFFIX}", segment_name(base)));
    let write = || -> io::Result<()> {
        let mut f = File::create(&copy)?;
        f.write_all(&kept)?;
        f.sync_all()?;
        fs::rename(&copy, &path)?;
        sync_dir(dir)
    };
    write().map_err(io_error(&path))
}

/// `records` (whole, valid records) without its Write records: a repaired
/// segment has bytes dropped, so the offsets its Write records give would
/// be stale. The log writes a Write record of its own before it next
/// appends to a segment without one.
fn without_write_records(records: &[u8]) -> Vec<u8> {
    let mut kept = Vec::with_capacity(records.len());
    for (kind, _, body, at) in checked_records(records, 0, records.len()) {
        if kind != RecordKind::Write {
            kept.extend_from_slice(&records[at..at + RECORD_HEADER_BYTES + body.len()]);
        }
    }
    kept
}

/// Renames the segments so that each begins where the one before ends,
/// counting only the valid records each keeps. Moves down go first, lowest
/// first, then moves up, highest first: in that order no file is renamed
/// onto one not yet moved. Each rename is made durable before the next: a
/// later one may take the name an earlier one gave up, and were the
/// earlier one lost to a power loss, the later would take the name of a
/// segment still there, which would be lost with it.
fn renumber(dir: &Path, plan: &[Scanned]) -> Result<(), OpenError> {
    let mut moves = Vec::new();
    let mut next = plan.first().map_or(0, |s| s.base);
    for s in plan {
        if s.base != next {
            moves.push((s.base, next));
        }
        next += s.kept_bytes;
    }
    let (down, up): (Vec<_>, Vec<_>) = moves.into_iter().partition(|&(from, to)| to < from);
    for (from, to) in down.into_iter().chain(up.into_iter().rev()) {
        let (old, new) = (dir.join(segment_name(from)), dir.join(segment_name(to)));
        log::error!("commit log: --repair renames {} to {} to close the gap", old.display(), new.display());
        fs::rename(&old, &new).map_err(io_error(&old))?;
        sync_dir(dir).map_err(io_error(dir))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The clean-stop marker.
// ---------------------------------------------------------------------------

/// How the last run ended, and whether a clean-stop marker was found that
/// the log has outgrown (then ignored): bytes lie past its `end`, in a
/// later segment or other than zeros in the last. Only a later run writes
/// there (space reserved ahead of the writes reads as zeros), and one that
/// did not remove the marker was a runnel that leaves none.
fn last_stop(dir: &Path, bases: &[u64]) -> Result<(LastStop, bool), OpenError> {
    let stop = read_last_stop(dir)?;
    let (LastStop::Clean { end, .. }, Some(&last)) = (stop, bases.last()) else { return Ok((stop, false)) };
    let outgrown = last > end || {
        let path = dir.join(segment_name(last));
        let mut rest = Vec::new();
        File::open(&path)
            .and_then(|mut f| {
                f.seek(io::SeekFrom::Start(end - last))?;
                f.read_to_end(&mut rest)
            })
            .map_err(io_error(&path))?;
        !all_zero(&rest)
    };
    if outgrown {
        log::warn!(
            "commit log: {CLEAN_STOP_FILE} in {} says the log ended at log offset {end}, but it goes on past it (a runnel that leaves no marker ran since): reading it as after a crash",
            dir.display()
        );
        return Ok((LastStop::MayHaveCrashed, true));
    }
    Ok((stop, false))
}

/// Reads the clean-stop marker. A marker that cannot be parsed stops
/// start-up: it was written whole (by a rename), so it is damage, and what
/// it would have said cannot be guessed.
fn read_last_stop(dir: &Path) -> Result<LastStop, OpenError> {
    let path = dir.join(CLEAN_STOP_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(LastStop::MayHaveCrashed),
        Err(e) => return Err(OpenError::Io(path, e)),
    };
    parse_marker(&text).ok_or_else(|| {
        let why = "unreadable clean-stop marker; check the disk, then remove the file to read the log as after a crash";
        OpenError::Io(path, io::Error::new(io::ErrorKind::InvalidData, why))
    })
}

fn parse_marker(text: &str) -> Option<LastStop> {
    let mut lines = text.lines();
    let (header, first, end) = (lines.next()?, lines.next()?, lines.next()?);
    let first: u64 = first.strip_prefix("first ")?.parse().ok()?;
    let end: u64 = end.strip_prefix("end ")?.parse().ok()?;
    (header == CLEAN_STOP_HEADER && lines.next().is_none() && first <= end).then_some(LastStop::Clean { first, end })
}

impl Log {
    /// Reads the log in `dir` through and reports what a start would find
    /// and what `--repair` would drop, changing nothing. Takes the
    /// directory's lock (a running broker's log is not inspected).
    pub fn inspect(dir: &Path) -> Result<Inspection, OpenError> {
        inspect(dir)
    }

    /// Marks the log as stopped cleanly: makes every byte this run wrote
    /// durable (also with `--fsync never`), then writes the marker with the
    /// log's first and end offsets. After it, recovery takes any damage
    /// for corruption, not for a torn write. Fails if records wait to be
    /// written (a failed last commit): the log is not whole then.
    pub fn mark_clean_stop(&mut self) -> io::Result<()> {
        if self.memory_only {
            return Ok(());
        }
        if !self.buf.is_empty() || self.dirty {
            return Err(io::Error::other("records of a failed commit are not written"));
        }
        self.sync_run()?;
        let first = self.segments.first().map_or(0, |s| s.base);
        let text = format!("{CLEAN_STOP_HEADER}\nfirst {first}\nend {}\n", self.head());
        let tmp = self.dir.join(CLEAN_STOP_TMP);
        let mut f = File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, self.dir.join(CLEAN_STOP_FILE))?;
        sync_dir(&self.dir)?;
        self.clean_stop_marked = true;
        Ok(())
    }

    /// Removes the clean-stop marker, durably, before the log changes: from
    /// then on a crash must be read as one.
    pub(super) fn forget_clean_stop(&mut self) -> io::Result<()> {
        if !self.clean_stop_marked {
            return Ok(());
        }
        match fs::remove_file(self.dir.join(CLEAN_STOP_FILE)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        sync_dir(&self.dir)?;
        self.clean_stop_marked = false;
        Ok(())
    }

    /// Syncs what this run wrote and no sync covered: the active segment's
    /// unsynced writes and, with `--fsync never`, the segments this run
    /// closed.
    fn sync_run(&mut self) -> io::Result<()> {
        if self.options.fsync == FsyncMode::Never {
            let active = self.segments.last().map(|s| s.base);
            for s in self.segments.iter().filter(|s| s.base >= self.run_first_base && Some(s.base) != active) {
                File::open(self.dir.join(segment_name(s.base)))?.sync_data()?;
                self.stats.fsyncs += 1;
            }
        }
        if self.unsynced_bytes > 0
            && let Some(f) = self.active.as_mut()
        {
            f.sync_data()?;
            self.stats.fsyncs += 1;
            self.unsynced_bytes = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use byteorder::{ByteOrder, LittleEndian};

    /// Every input of the recovery table, and the verdict each must get.
    #[test]
    fn every_damage_falls_in_exactly_one_row_of_the_recovery_table() {
        let founds = [Found::Newer, Found::Damaged];
        let places = [Place::LastAfterCrash, Place::LastAfterCleanStop, Place::Earlier];
        let laters = [Later::Nothing, Later::AfterZeroBlock, Later::Records, Later::Unconfirmed, Later::Confirmed];
        let mut torn = Vec::new();
        for found in founds {
            for place in places {
                for later in laters {
                    let rows = DAMAGE_TABLE.iter().filter(|r| {
                        r.found.is_none_or(|f| f == found)
                            && r.place.is_none_or(|p| p == place)
                            && r.later.is_none_or(|l| l == later)
                    });
                    let verdicts: Vec<Verdict> = rows.map(|r| r.verdict).collect();
                    assert_eq!(verdicts.len(), 1, "{found:?} {place:?} {later:?} matches {verdicts:?}");
                    assert_eq!(classify(found, place, || later).verdict, verdicts[0], "{found:?} {place:?} {later:?}");
                    if verdicts[0] == Verdict::TornTail {
                        torn.push((found, place, later));
                    }
                }
            }
        }
        // Only damage at the very end of a run that may have crashed, with
        // nothing whole after it that a later turn could have synced, or in
        // framed writes no later Write record says a sync covered.
        assert_eq!(
            torn,
            [
                (Found::Damaged, Place::LastAfterCrash, Later::Nothing),
                (Found::Damaged, Place::LastAfterCrash, Later::AfterZeroBlock),
                (Found::Damaged, Place::LastAfterCrash, Later::Unconfirmed)
            ]
        );
    }

    #[test]
    fn what_follows_is_looked_for_only_when_the_verdict_depends_on_it() {
        let never = || -> Later { panic!("searched for what follows when it cannot matter") };
        assert_eq!(classify(Found::Newer, Place::LastAfterCrash, never).verdict, Verdict::Refuse);
        assert_eq!(classify(Found::Damaged, Place::Earlier, never).verdict, Verdict::Refuse);
        assert_eq!(classify(Found::Damaged, Place::LastAfterCleanStop, never).verdict, Verdict::Refuse);
    }

    #[test]
    fn a_segment_is_placed_by_its_position_and_the_last_stop() {
        let clean = LastStop::Clean { first: 0, end: 10 };
        assert_eq!(Place::of(0, 1, LastStop::MayHaveCrashed), Place::LastAfterCrash);
        assert_eq!(Place::of(0, 1, clean), Place::LastAfterCleanStop);
        assert_eq!(Place::of(0, 2, LastStop::MayHaveCrashed), Place::Earlier);
        assert_eq!(Place::of(1, 2, clean), Place::LastAfterCleanStop);
    }

    /// `later_records` over real bytes: a damaged record followed by
    /// nothing, by whole records, and by whole records past a zero block.
    #[test]
    fn what_follows_a_damaged_record_is_read_from_the_segment() {
        let record = |kind: RecordKind, body: &[u8]| {
            let mut r = vec![0u8; RECORD_HEADER_BYTES];
            LittleEndian::write_u32(&mut r, body.len() as u32);
            r[8] = kind as u8;
            r[9] = kind.version();
            r.extend_from_slice(body);
            let crc = super::super::record_crc(&r);
            LittleEndian::write_u32(&mut r[4..], crc);
            r
        };
        let good = record(RecordKind::Purge, &[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        let mut bad = good.clone();
        bad[RECORD_HEADER_BYTES] ^= 0xff;
        let after = |data: &[u8]| later_records(data, 0, records_after(data, 1));
        assert_eq!(after(&bad), Later::Nothing);
        let mut data = bad.clone();
        data.extend_from_slice(&good);
        assert_eq!(after(&data), Later::Records, "its own length leads to a whole record");
        let mut data = bad.clone();
        data.resize(2 * HOLE_BLOCK_BYTES, 0);
        data.extend_from_slice(&good);
        assert_eq!(after(&data), Later::AfterZeroBlock);
    }
}
