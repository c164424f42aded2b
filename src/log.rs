//! The commit log: one segmented, append-only file sequence for every topic
//! (RocketMQ's CommitLog), written with one `write` and made durable with one
//! `fdatasync` per loop turn (group commit, as Redis's `beforeSleep` does for
//! its AOF).
//!
//! Records are framed (docs/log-format.md is the format's contract):
//!
//! ```text
//! 0  u32 len      body bytes
//! 4  u32 crc      CRC32 of bytes 0..4 and 8..12+len (everything but itself)
//! 8  u8  kind     RecordKind
//! 9  u8  version  format version of this kind's body
//! 10 u16 reserved 0
//! 12 ... body
//! ```
//!
//! The log knows nothing of topics or queues: it frames, writes, syncs,
//! reads back and cuts files. `record.rs` says what the bodies hold, and
//! which (kind, version) pairs this build reads; the broker replays them.
//! Only this file touches files.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use byteorder::{ByteOrder, LittleEndian};

use crate::metrics::{Phase, PhaseNanos};

#[path = "log_reader.rs"]
pub mod reader;
#[path = "recovery.rs"]
mod recovery;
#[path = "releaser.rs"]
mod releaser;
pub use recovery::{CLEAN_STOP_FILE, Damage, DamageKind, Inspection, LastStop};
#[path = "log_open.rs"]
mod open;
#[path = "segment_file.rs"]
mod segment_file;
#[path = "log_space.rs"]
mod space;
#[path = "log_write.rs"]
mod write_frame;
use open::Applier;
pub use open::{OpenError, Recovery, Replayer};
pub use segment_file::{Opener, SegmentFile, open_file, open_mapped};
pub use space::HEADROOM_BYTES_MIN;
use space::{Dropped, Withdrawable, is_no_space};
pub use write_frame::{WRITE_BODY_BYTES, WRITE_RECORD_BYTES, WriteFrame};

pub use crate::record::RecordKind;

/// Bytes in a record header.
pub const RECORD_HEADER_BYTES: usize = 12;
/// Most bytes written without an fdatasync (turns that only acked): past
/// it, the next turn syncs anyway.
const UNSYNCED_BYTES_MAX: u64 = 4 << 20;
/// The largest record body a reader accepts: a bound on what a corrupt
/// length field can make recovery allocate.
pub const RECORD_BYTES_MAX: usize = 1 << 30;
/// The suffix a removed segment's file takes until it is released: not a
/// segment to recovery, which deletes it.
const REMOVING_SUFFIX: &str = ".removing";

/// When the log makes writes durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncMode {
    /// `fdatasync` at the end of every turn that appended anything; a
    /// produce is acknowledged only after it.
    Turn,
    /// Never sync: the page cache only. A produce is acknowledged after the
    /// `write`; a machine crash can lose it (a process crash cannot).
    Never,
}

/// How segment files are opened in `fsync` mode: mapped for `Never`,
/// where a copy into the page cache costs less than a `pwrite`
/// (`MappedFile`), and plain files for `Turn`.
pub fn opener_for(fsync: FsyncMode) -> Opener {
    match fsync {
        FsyncMode::Turn => Box::new(open_file),
        FsyncMode::Never => Box::new(open_mapped),
    }
}

/// How the log is set up.
#[derive(Clone, Debug)]
pub struct LogOptions {
    /// A segment is closed and a new one begun once it holds this many
    /// bytes (a turn's records never span two segments).
    pub segment_bytes_max: u64,
    pub fsync: FsyncMode,
    /// Keep the valid prefix when corruption is found before the tail,
    /// instead of refusing to start.
    pub repair: bool,
    /// Most bytes of failed turns' records kept for the next commit while
    /// the disk keeps failing; past it they are dropped
    /// (`Log::take_unwritten_dropped`). The broker sets it from
    /// `Limits::unwritten_records_bytes_max`, which says why.
    pub unwritten_records_bytes_max: u64,
    /// Bytes of the disk that client produces leave free past the
    /// headroom; compaction's copies leave a quarter of it
    /// (`Log::copy_headroom_bytes`). The broker sets it from
    /// `Limits::produce_headroom_bytes`, which says why.
    pub produce_headroom_bytes: u64,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            segment_bytes_max: 64 << 20,
            fsync: FsyncMode::Turn,
            repair: false,
            unwritten_records_bytes_max: crate::limits::Limits::default().unwritten_records_bytes_max,
            produce_headroom_bytes: crate::limits::Limits::default().produce_headroom_bytes,
        }
    }
}

/// One segment file.
#[derive(Clone, Debug)]
pub struct Segment {
    /// Log offset of its first byte; also its file name.
    pub base: u64,
    /// Bytes in it that are durable (or written, with `--fsync never`).
    pub bytes: u64,
}

impl Segment {
    pub fn end(&self) -> u64 {
        self.base + self.bytes
    }
}

fn segment_name(base: u64) -> String {
    format!("{base:020}.log")
}

/// Counters for STATS.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogStats {
    /// `fdatasync` calls made.
    pub fsyncs: u64,
    /// Turns that wrote records.
    pub commits: u64,
    /// Records written.
    pub records: u64,
    /// Failed writes or syncs, and turns whose produces a full disk
    /// refused.
    pub failures: u64,
    /// Segments removed by compaction.
    pub segments_removed: u64,
    /// `fsync`s of the directory for a new segment's name or a removed
    /// one's rename.
    pub dir_syncs: u64,
}

/// A turn's records, written by `Log::write` and not yet committed: what
/// `Log::sync` needs to finish the turn.
#[must_use = "a written turn must be synced (Log::sync)"]
#[derive(Debug)]
pub struct WrittenTurn {
    /// Bytes written (0: the turn appended nothing).
    bytes: u64,
    /// Records in them.
    records: u64,
    /// Whether `sync` will `fdatasync` them.
    sync: bool,
    /// Whether the turn's client produces were dropped, not written, for
    /// want of space (`Committed::withdrawn`).
    withdrawn: bool,
    /// Whether compaction's copies were dropped too
    /// (`Committed::copies_withdrawn`).
    copies_withdrawn: bool,
    /// Nanoseconds the write took, for `Committed::nanos`.
    write_nanos: u64,
}

impl WrittenTurn {
    /// A turn that appended nothing: there is nothing to sync.
    fn nothing() -> WrittenTurn {
        WrittenTurn { bytes: 0, records: 0, sync: false, withdrawn: false, copies_withdrawn: false, write_nanos: 0 }
    }
    /// Whether `Log::sync` will `fdatasync` this turn.
    pub fn syncs(&self) -> bool {
        self.sync
    }
    /// Whether the turn's withdrawable records (its client produces) were
    /// dropped, not written, for want of space.
    pub fn withdrawn(&self) -> bool {
        self.withdrawn
    }
}

/// What a commit did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Committed {
    /// Bytes written this turn.
    pub bytes: u64,
    /// Whether an `fdatasync` was made.
    pub synced: bool,
    /// Nanoseconds the write and sync took.
    pub nanos: u64,
    /// The turn's client produces were dropped, not written: the disk has
    /// no room for them and the headroom and
    /// `LogOptions::produce_headroom_bytes` after them. The rest of the
    /// turn was written.
    pub withdrawn: bool,
    /// Compaction's copies were dropped too: the disk has no room for them
    /// and the headroom and `Log::copy_headroom_bytes` after them.
    pub copies_withdrawn: bool,
}

/// The commit log.
pub struct Log {
    dir: PathBuf,
    options: LogOptions,
    /// Held for the life of the log: a second broker on the same directory
    /// fails to take it. None for a memory-only log, which has no
    /// directory.
    _lock: Option<recovery::DirLock>,
    /// A memory-only log (`--memory-only`): it writes nothing, anywhere;
    /// each turn's records are discarded where they would be written.
    memory_only: bool,
    /// Segments in offset order; the last is the one appended to.
    segments: Vec<Segment>,
    /// The last segment, open for append.
    active: Option<Box<dyn SegmentFile>>,
    opener: Opener,
    /// Records appended this turn, not yet written: empty, or room for
    /// the write's Write record (`WRITE_RECORD_BYTES`, filled in just
    /// before the write) followed by at least one record.
    buf: Vec<u8>,
    /// Records in `buf`.
    buf_records: u64,
    /// Where a record begun and not yet ended (or abandoned) starts in
    /// `buf`: at most one at a time, and none when the turn is written.
    open_record: Option<usize>,
    /// Byte ranges in `buf` of records dropped if the commit fails, in
    /// order, and what they are (which a full disk drops first).
    withdrawable: Vec<(usize, usize, Withdrawable)>,
    /// Bytes written to the active segment since its last fdatasync.
    unsynced_bytes: u64,
    /// How far the active segment's space is reserved (0: not yet known;
    /// `CANNOT_RESERVE`: the filesystem cannot).
    reserved_bytes: u64,
    /// Bytes of the disk that only `commit_ahead` may write into
    /// (compaction's restatements): other turns leave them free.
    headroom_bytes: u64,
    /// At the last look the disk had no room for another reservation step
    /// of produces past the headroom (or refused a write: ENOSPC), so
    /// compaction reclaims eagerly.
    space_short: bool,
    /// The thread that gives back removed segments' space.
    releaser: releaser::Releaser,
    /// A removal's directory sync failed: the next removal syncs first
    /// (`sync_removal`).
    removal_unsynced: bool,
    /// A write may have left bytes past the committed end of the active
    /// segment: set from a turn's write until its sync succeeds, and after
    /// a failure until they are cut (before the next write).
    dirty: bool,
    /// Whether the clean-stop marker is on disk: removed before the log
    /// next changes.
    clean_stop_marked: bool,
    /// Whether the active segment holds a Write record (recovered at start,
    /// or written since): until it does, its next write is preceded by one
    /// of its own, made durable first (`write_header`).
    active_framed: bool,
    /// The sequence number the next Write record takes: one above the
    /// highest in the log at start, then counting up.
    next_write_seq: u64,
    /// Base offset of the segment this run first appended to: with
    /// `--fsync never`, the segments from it on are synced at a clean stop.
    run_first_base: u64,
    /// The time this turn's calls on the files took, by phase, until the
    /// loop takes it (`take_phases`).
    phases: PhaseNanos,
    pub stats: LogStats,
    /// The last committed turn's records, for the index of where each
    /// topic's messages are (`Log::take_kept_turn`).
    kept: reader::KeptTurn,
    /// The records kept from failed commits passed
    /// `unwritten_records_bytes_max` and were dropped, since the last
    /// `take_unwritten_dropped`: whoever noted them must forget them.
    unwritten_dropped: bool,
}

/// The turn's records, set aside while compaction writes its own ahead of
/// them (`Log::set_aside`, `Log::commit_ahead`).
pub struct Aside {
    /// The turn buffer.
    buf: Vec<u8>,
    /// Records in it.
    records: u64,
    /// Byte ranges in it of records dropped if the commit fails.
    withdrawable: Vec<(usize, usize, Withdrawable)>,
}

/// Where a record begins in the turn buffer, for `end`.
#[derive(Clone, Copy, Debug)]
pub struct RecordStart(usize);

/// A record read back during recovery.
#[derive(Debug)]
pub struct ReadRecord<'a> {
    pub kind: RecordKind,
    pub version: u8,
    pub body: &'a [u8],
    /// Log offset of the record.
    pub offset: u64,
    /// Base offset (file name) of the segment it is in.
    pub segment: u64,
}

impl Log {
    /// Opens (creating if needed) the log in `dir`, takes its lock, and
    /// replays every record into `apply` in log order. A torn or damaged
    /// record at the end of the last segment is cut off; damage anywhere
    /// else is an error unless `options.repair`.
    pub fn open(
        dir: &Path,
        options: LogOptions,
        apply: impl FnMut(&ReadRecord<'_>) -> Result<(), String>,
    ) -> Result<(Log, Recovery), OpenError> {
        let opener = opener_for(options.fsync);
        Log::open_with(dir, options, opener, apply)
    }

    /// `open` with a custom segment opener (tests inject failures).
    pub fn open_with(
        dir: &Path,
        options: LogOptions,
        opener: Opener,
        apply: impl FnMut(&ReadRecord<'_>) -> Result<(), String>,
    ) -> Result<(Log, Recovery), OpenError> {
        Log::open_replaying(dir, options, opener, &mut Applier(apply))
    }

    /// `open_with`, reading the records into `replayer`: twice if it
    /// `scans`.
    pub fn open_replaying(
        dir: &Path,
        options: LogOptions,
        opener: Opener,
        replayer: &mut dyn Replayer,
    ) -> Result<(Log, Recovery), OpenError> {
        let recovered = recovery::recover(dir, &options, replayer)?;
        let mut log = Log::over(dir.to_path_buf(), options, Some(recovered.lock), opener, recovered.segments);
        log.clean_stop_marked = recovered.marked;
        if !recovered.marked {
            log.sync_crashed_tail().map_err(|e| OpenError::Io(dir.to_path_buf(), e))?;
        }
        log.active_framed = recovered.framed;
        log.next_write_seq = recovered.next_write_seq;
        Ok((log, recovered.recovery))
    }

    /// After a crash (no clean-stop marker), makes the last segment's
    /// records durable: the crashed run may have written some that no sync
    /// covered yet (a turn of acks, compaction's copies), and this run
    /// relies on what it read there. Its first Write record says so too
    /// (`synced_bytes`): after a crash of the process, not of the machine,
    /// the last run's unsynced writes may be in the page cache only, and
    /// from this sync on a power cut cannot take them. Compaction leaves a message whose
    /// latest copy is in a later segment, and removes the segment it
    /// cleans only once what it copied is synced, which a later turn's
    /// sync of a new segment would not cover.
    fn sync_crashed_tail(&mut self) -> io::Result<()> {
        let Some(last) = self.segments.last().filter(|s| s.bytes > 0) else { return Ok(()) };
        if self.options.fsync != FsyncMode::Turn {
            return Ok(());
        }
        OpenOptions::new().write(true).open(self.dir.join(segment_name(last.base)))?.sync_data()?;
        self.stats.fsyncs += 1;
        Ok(())
    }

    /// A log that keeps nothing (`runnel serve --memory-only`): no
    /// directory is read, locked or written, and each turn's records are
    /// discarded where they would be written, so the broker drives it as it
    /// drives a real log. Nothing is synced, reserved, rolled or released,
    /// and the disk is never full, so neither compaction nor the full-disk
    /// logic has anything to do.
    pub fn in_memory() -> Log {
        let options = LogOptions { fsync: FsyncMode::Never, ..LogOptions::default() };
        let opener: Opener = Box::new(|_: &Path| Err(io::Error::other("a memory-only log opens no file")));
        let mut log = Log::over(PathBuf::new(), options, None, opener, Vec::new());
        log.memory_only = true;
        log
    }

    /// A log of `segments` (none: an empty log) in `dir`, appending after
    /// the last.
    fn over(
        dir: PathBuf,
        options: LogOptions,
        lock: Option<recovery::DirLock>,
        opener: Opener,
        mut segments: Vec<Segment>,
    ) -> Log {
        if segments.is_empty() {
            segments.push(Segment { base: 0, bytes: 0 });
        }
        Log {
            dir,
            options,
            _lock: lock,
            memory_only: false,
            run_first_base: segments.last().map_or(0, |s| s.base),
            segments,
            active: None,
            opener,
            buf: Vec::new(),
            buf_records: 0,
            open_record: None,
            withdrawable: Vec::new(),
            unsynced_bytes: 0,
            reserved_bytes: 0,
            headroom_bytes: HEADROOM_BYTES_MIN,
            space_short: false,
            releaser: releaser::Releaser::default(),
            removal_unsynced: false,
            dirty: false,
            clean_stop_marked: false,
            active_framed: false,
            next_write_seq: 1,
            phases: PhaseNanos::default(),
            stats: LogStats::default(),
            kept: reader::KeptTurn::default(),
            unwritten_dropped: false,
        }
    }

    /// Whether this log keeps nothing (`in_memory`).
    pub fn memory_only(&self) -> bool {
        self.memory_only
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }
    /// Bytes in every segment.
    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.bytes).sum()
    }
    /// The log offset the next committed record will have (if no roll).
    pub fn head(&self) -> u64 {
        self.segments.last().map_or(0, Segment::end)
    }
    pub fn segment_bytes_max(&self) -> u64 {
        self.options.segment_bytes_max
    }
    pub fn fsync_mode(&self) -> FsyncMode {
        self.options.fsync
    }
    /// The time the files' calls took so far this turn, by phase.
    pub fn phases(&self) -> &PhaseNanos {
        &self.phases
    }
    /// The time the files' calls took since the last take, by phase.
    pub fn take_phases(&mut self) -> PhaseNanos {
        std::mem::take(&mut self.phases)
    }

    /// Begins a record in the turn buffer; append its body to `body()`,
    /// then call `end`. The turn's first record leaves room before it for
    /// the write's Write record.
    #[inline]
    pub fn begin(&mut self, kind: RecordKind) -> RecordStart {
        if self.buf.is_empty() {
            self.buf.resize(WRITE_RECORD_BYTES, 0);
        }
        let at = self.buf.len();
        assert!(self.open_record.is_none(), "a {kind:?} record begun inside another");
        self.open_record = Some(at);
        self.buf.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, kind as u8, kind.version(), 0, 0]);
        RecordStart(at)
    }
    /// The turn buffer, to append a record body to.
    #[inline]
    pub fn body(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }
    /// Finishes a record: writes its length and CRC.
    #[inline]
    pub fn end(&mut self, start: RecordStart) {
        let at = start.0;
        assert_eq!(self.open_record.take(), Some(at), "a record ended that was not the one begun");
        // A record the reader would refuse is never written.
        assert!(self.buf.len() - at - RECORD_HEADER_BYTES <= RECORD_BYTES_MAX, "a record over RECORD_BYTES_MAX");
        let len = (self.buf.len() - at - RECORD_HEADER_BYTES) as u32;
        LittleEndian::write_u32(&mut self.buf[at..], len);
        // A memory-only log discards the record: no reader checks its CRC.
        if !self.memory_only {
            let crc = record_crc(&self.buf[at..]);
            LittleEndian::write_u32(&mut self.buf[at + 4..], crc);
        }
        self.buf_records += 1;
    }
    /// Drops a record begun but not ended (its body turned out invalid).
    pub fn abandon(&mut self, start: RecordStart) {
        assert_eq!(self.open_record.take(), Some(start.0), "a record abandoned that was not the one begun");
        // The turn's only record takes the room for the Write record with
        // it: an empty buffer is a turn of no records.
        self.buf.truncate(if start.0 == WRITE_RECORD_BYTES { 0 } else { start.0 });
    }

    /// Finishes a record that is dropped if this turn's commit fails (a
    /// client's produce, answered STORAGE then); every other record of a
    /// failed turn is kept and written with the next commit, so the log
    /// catches up with what the broker already did in memory.
    #[inline]
    pub fn end_withdrawable(&mut self, start: RecordStart) {
        self.end(start);
        self.withdrawable.push((start.0, self.buf.len(), Withdrawable::Produce));
    }

    /// Finishes a record of compaction's copies: dropped if this turn's
    /// commit fails, as a produce is, and on a full disk dropped after the
    /// produces, which leave more of the disk free (`copy_headroom_bytes`).
    #[inline]
    pub fn end_copy(&mut self, start: RecordStart) {
        self.end(start);
        self.withdrawable.push((start.0, self.buf.len(), Withdrawable::Copy));
    }

    /// Writes the turn's records with one write, then, in `FsyncMode::Turn`
    /// when `sync` (something waits on it: a produce, an admin change, a
    /// compaction), makes them durable with one `fdatasync`: `write`, then
    /// `sync`, with nothing between them. The loop splits the two to send
    /// the replies that need only the write in between.
    pub fn commit(&mut self, sync: bool) -> io::Result<Committed> {
        let written = self.write(sync)?;
        self.sync(written)
    }

    /// The first half of a commit: writes every record of the turn with one
    /// `write` (into the page cache: from then on a crash of the process
    /// cannot lose them, a crash of the machine can) and decides whether
    /// `sync` will `fdatasync` them: when `sync` asks (something waits on
    /// it) or the unsynced bytes would pass `UNSYNCED_BYTES_MAX`. A turn of
    /// only acks and requeues is synced by a later turn; losing it to a
    /// machine crash means redelivery, which at-least-once allows.
    ///
    /// A turn never writes into the headroom: on a disk without room for
    /// its records and the headroom after them, it fails (ENOSPC) before
    /// writing anything; on a disk with room for those but not for its
    /// client produces and `LogOptions::produce_headroom_bytes` more, those
    /// are dropped (`WrittenTurn::withdrawn`), and then compaction's copies
    /// if there is no room for them and `copy_headroom_bytes` more; the
    /// rest is written.
    ///
    /// Nothing may be appended between `write` and its `sync`. On error the
    /// turn has failed as `sync` describes, and there is nothing to sync.
    pub fn write(&mut self, sync: bool) -> io::Result<WrittenTurn> {
        let written = self.write_with(sync, self.headroom_bytes);
        if written.is_err() {
            self.bound_unwritten_records();
        }
        written
    }

    /// `write`, leaving `headroom` bytes of the disk free after the records.
    fn write_with(&mut self, sync: bool, headroom: u64) -> io::Result<WrittenTurn> {
        assert!(self.open_record.is_none(), "the turn is written with a record begun and not ended");
        if self.buf.is_empty() {
            return Ok(WrittenTurn::nothing());
        }
        if self.memory_only {
            return Ok(self.discard_turn());
        }
        let started = Instant::now();
        let others = self.phases.total();
        let result = self.write_turn(headroom);
        let write_nanos = started.elapsed().as_nanos() as u64;
        // What the write took besides a roll or a reservation in it.
        let plain = write_nanos.saturating_sub(self.phases.total() - others);
        self.phases.add(Phase::Write, plain);
        match result {
            Ok(dropped) => Ok(WrittenTurn {
                bytes: self.buf.len() as u64,
                records: std::mem::take(&mut self.buf_records),
                // After the write: a roll in it synced what was unsynced.
                sync: !self.buf.is_empty()
                    && self.options.fsync == FsyncMode::Turn
                    && (sync || self.unsynced_bytes_max_reached()),
                withdrawn: dropped.produces,
                copies_withdrawn: dropped.copies,
                write_nanos,
            }),
            Err(e) => Err(self.fail_turn(e)),
        }
    }

    /// A memory-only log's write: the turn's records go nowhere, and the
    /// turn is one that wrote nothing (there is nothing to sync).
    fn discard_turn(&mut self) -> WrittenTurn {
        self.buf_records = 0;
        self.clear_turn();
        WrittenTurn::nothing()
    }

    /// The second half of a commit: the `fdatasync`, if `write` decided on
    /// one, then the turn's records count as committed. Does nothing for a
    /// turn that wrote nothing. On error nothing of the turn counts as
    /// written: the file is cut back to its committed length (now, or
    /// before the next write if cutting fails too), withdrawable records
    /// are dropped, the others wait for the next commit, and the caller
    /// must not acknowledge anything that waited on this commit. The
    /// records kept are bounded by `unwritten_records_bytes_max`: past it
    /// they are dropped too (`take_unwritten_dropped`).
    pub fn sync(&mut self, turn: WrittenTurn) -> io::Result<Committed> {
        let committed = self.sync_turn(turn);
        if committed.is_err() {
            self.bound_unwritten_records();
        }
        committed
    }

    /// `sync`, without the bound on the records kept: `commit_ahead` puts
    /// the turn's own records back after it, whatever it kept.
    fn sync_turn(&mut self, turn: WrittenTurn) -> io::Result<Committed> {
        // Produces refused for a full disk count as a failure too.
        self.stats.failures += u64::from(turn.withdrawn || turn.copies_withdrawn);
        let (withdrawn, copies_withdrawn) = (turn.withdrawn, turn.copies_withdrawn);
        if turn.bytes == 0 {
            return Ok(Committed { withdrawn, copies_withdrawn, ..Committed::default() });
        }
        assert_eq!(self.buf.len() as u64, turn.bytes, "records were appended between a turn's write and its sync");
        let mut sync_nanos = 0;
        if turn.sync {
            let Some(f) = self.active.as_mut() else { unreachable!("the write opened it") };
            let started = Instant::now();
            let synced = f.sync_data();
            sync_nanos = started.elapsed().as_nanos() as u64;
            self.phases.add(Phase::Fsync, sync_nanos);
            if let Err(e) = synced {
                return Err(self.fail_turn(e));
            }
            self.stats.fsyncs += 1;
        }
        self.dirty = false;
        if let Some(s) = self.segments.last_mut() {
            let at = reader::ReadPos { segment: s.base, at_bytes: s.bytes };
            s.bytes += turn.bytes;
            self.keep_turn(at);
        }
        self.unsynced_bytes = if turn.sync { 0 } else { self.unsynced_bytes + turn.bytes };
        self.clear_turn();
        self.stats.commits += 1;
        self.stats.records += turn.records;
        let nanos = turn.write_nanos + sync_nanos;
        Ok(Committed { bytes: turn.bytes, synced: turn.sync, nanos, withdrawn, copies_withdrawn })
    }

    /// Empties the turn buffer once its records are done with, giving back
    /// the memory of an unusually large turn.
    fn clear_turn(&mut self) {
        self.buf.clear();
        self.withdrawable.clear();
        if self.buf.capacity() > 64 << 20 {
            self.buf = Vec::new();
        }
    }

    /// A write or sync failed: drops the withdrawable records, keeping the
    /// others for the next commit, and cuts the file back to its committed
    /// length if the write had begun (`dirty`).
    fn fail_turn(&mut self, e: io::Error) -> io::Error {
        self.space_short |= is_no_space(&e);
        self.drop_withdrawable(|_| true);
        self.stats.failures += 1;
        // Best effort now; `write_turn` retries before the next write.
        let _ = self.cut_back();
        e
    }

    /// Sets the turn's records aside: what is appended from now until
    /// `commit_ahead` is written before them.
    pub fn set_aside(&mut self) -> Aside {
        assert!(self.open_record.is_none(), "records set aside with one begun and not ended");
        Aside {
            buf: std::mem::take(&mut self.buf),
            records: std::mem::take(&mut self.buf_records),
            withdrawable: std::mem::take(&mut self.withdrawable),
        }
    }

    /// Writes the records appended since `set_aside` and makes them durable
    /// together with everything written before them (even when there are
    /// none), then puts the turn's records back. Compaction restates what a
    /// segment holds this way before removing it: ahead of the turn's
    /// records, so a turn that does not fit on a full disk cannot hold up
    /// the removal that would make room for it, and into the headroom,
    /// which is kept for this. A whole commit of its own, so it comes
    /// before the turn's `write`, never between that and its `sync`. On
    /// error these records are dropped, not kept for the next commit: the
    /// caller tries again later.
    pub fn commit_ahead(&mut self, aside: Aside) -> io::Result<Committed> {
        let result = if self.buf.is_empty() {
            self.sync_written()
        } else {
            self.write_with(true, 0).and_then(|turn| self.sync_turn(turn))
        };
        self.buf = aside.buf;
        self.buf_records = aside.records;
        self.withdrawable = aside.withdrawable;
        result
    }

    /// Makes what earlier turns wrote to the active segment durable.
    fn sync_written(&mut self) -> io::Result<Committed> {
        let Some(f) = self.active.as_mut() else { return Ok(Committed::default()) };
        if self.unsynced_bytes == 0 || self.options.fsync != FsyncMode::Turn {
            return Ok(Committed::default());
        }
        let started = Instant::now();
        let synced = f.sync_data();
        let nanos = started.elapsed().as_nanos() as u64;
        self.phases.add(Phase::Fsync, nanos);
        if let Err(e) = synced {
            self.stats.failures += 1;
            return Err(e);
        }
        self.unsynced_bytes = 0;
        self.stats.fsyncs += 1;
        Ok(Committed { bytes: 0, synced: true, nanos, ..Committed::default() })
    }

    /// After a failed commit of a turn: drops the records kept for the next
    /// commit once they pass `unwritten_records_bytes_max`, so a disk that
    /// keeps failing cannot make them grow without end, and says so
    /// (`take_unwritten_dropped`).
    fn bound_unwritten_records(&mut self) {
        if self.unwritten_bytes() <= self.options.unwritten_records_bytes_max {
            return;
        }
        log::error!(
            "commit log: {} bytes of records wait for a disk that keeps failing, past unwritten-records-bytes-max ({}); dropping them (a restart may redeliver acknowledged messages)",
            self.unwritten_bytes(),
            self.options.unwritten_records_bytes_max
        );
        self.buf_records = 0;
        self.clear_turn();
        self.unwritten_dropped = true;
    }

    /// Bytes of records appended and not yet committed: this turn's, and
    /// those kept from failed commits (at most
    /// `unwritten_records_bytes_max` of these once a turn ends).
    pub fn unwritten_bytes(&self) -> u64 {
        // Not the room kept for the write's Write record.
        self.buf.len().saturating_sub(WRITE_RECORD_BYTES) as u64
    }

    /// Whether the records kept from failed commits were dropped (past
    /// `unwritten_records_bytes_max`) since the last call: whoever noted
    /// what they hold, to be attached once committed, must forget it.
    pub fn take_unwritten_dropped(&mut self) -> bool {
        std::mem::take(&mut self.unwritten_dropped)
    }

    /// Drops the withdrawable records that `which` picks from the turn
    /// buffer.
    fn drop_withdrawable(&mut self, which: impl Fn(Withdrawable) -> bool) {
        if !self.withdrawable.iter().any(|w| which(w.2)) {
            return;
        }
        let mut kept = Vec::with_capacity(self.buf.len());
        let mut still = Vec::new();
        let mut at = 0;
        for (start, end, what) in std::mem::take(&mut self.withdrawable) {
            kept.extend_from_slice(&self.buf[at..start]);
            if !which(what) {
                still.push((kept.len(), kept.len() + end - start, what));
                kept.extend_from_slice(&self.buf[start..end]);
            }
            at = end;
        }
        kept.extend_from_slice(&self.buf[at..]);
        self.withdrawable = still;
        // Count what is kept by walking the record headers, after the room
        // for the Write record.
        let (mut i, mut n) = (WRITE_RECORD_BYTES, 0);
        while i + RECORD_HEADER_BYTES <= kept.len() {
            i += RECORD_HEADER_BYTES + LittleEndian::read_u32(&kept[i..]) as usize;
            n += 1;
        }
        if n == 0 {
            kept.clear();
        }
        self.buf_records = n;
        self.buf = kept;
    }

    /// Cuts the active segment back to its committed length after a
    /// failure, so a half-written record can never be followed by a good
    /// one.
    fn cut_back(&mut self) -> io::Result<()> {
        if !self.dirty {
            return Ok(());
        }
        let len = self.segments.last().map_or(0, |s| s.bytes);
        if let Some(f) = self.active.as_mut() {
            f.set_len(len)?;
            f.sync_data()?;
        }
        self.reserved_bytes = 0;
        self.dirty = false;
        Ok(())
    }

    /// Writes the turn buffer at the end of the active segment (rolling to
    /// a new one first if it would pass its size), leaving `headroom` bytes
    /// of the disk free, and dropping withdrawable records first where
    /// there is no room for them (`fit_turn`); returns what it dropped. The
    /// segment's committed length grows only in `sync`.
    fn write_turn(&mut self, headroom: u64) -> io::Result<Dropped> {
        self.forget_clean_stop()?;
        self.cut_back()?;
        let active_bytes = self.segments.last().map_or(0, |s| s.bytes);
        if active_bytes > 0 && active_bytes + self.buf.len() as u64 > self.options.segment_bytes_max {
            self.timed(Phase::Roll, Log::roll)?;
        }
        self.open_active()?;
        let at = self.segments.last().map_or(0, |s| s.bytes);
        // A segment's first write goes after a Write record of its own.
        let header = if self.active_framed { 0 } else { WRITE_RECORD_BYTES as u64 };
        let dropped = self.fit_turn(at, header, headroom)?;
        if self.buf.is_empty() {
            return Ok(dropped);
        }
        if !self.active_framed {
            self.write_header()?;
        }
        let at = self.segments.last().map_or(0, |s| s.bytes);
        self.seal_turn();
        let Some(f) = self.active.as_mut() else { unreachable!("opened above") };
        // Until the turn's sync is done, a failure may leave bytes past the
        // committed end: the file is cut back before anything else is
        // written. (A turn that failed before this wrote nothing and keeps
        // the reserved space.)
        self.dirty = true;
        f.write_all_at(&self.buf, at)?;
        Ok(dropped)
    }

    /// Opens the active segment's file if it is not open yet (the first
    /// write after a start).
    fn open_active(&mut self) -> io::Result<()> {
        if self.active.is_some() {
            return Ok(());
        }
        self.timed(Phase::Roll, |log| {
            let base = log.segments.last().map_or(0, |s| s.base);
            let path = log.dir.join(segment_name(base));
            log.active = Some((log.opener)(&path)?);
            log.sync_new_name()
        })
    }

    /// Makes a new segment's name durable, in `FsyncMode::Turn`: its
    /// records are synced from the next turn on, and a synced record in a
    /// file a crash unnamed would be lost. With `--fsync never` nothing is
    /// synced until a clean stop, whose marker syncs the directory, so the
    /// directory is not synced here: that sync waits for the device to
    /// flush everything in flight, tens of ms on a busy disk, and it would
    /// stall the loop at every roll (bench/README.md, "The non-durable
    /// tail").
    fn sync_new_name(&mut self) -> io::Result<()> {
        if self.options.fsync != FsyncMode::Turn {
            return Ok(());
        }
        self.stats.dir_syncs += 1;
        sync_dir(&self.dir)
    }

    /// Runs `f`, counting the time it took under `phase`, less what the
    /// phases timed inside it counted: the phases stay disjoint.
    fn timed<T>(&mut self, phase: Phase, f: impl FnOnce(&mut Log) -> T) -> T {
        let inner = self.phases.total();
        let started = Instant::now();
        let result = f(self);
        let nanos = started.elapsed().as_nanos() as u64;
        let inner = self.phases.total() - inner;
        self.phases.add(phase, nanos.saturating_sub(inner));
        result
    }

    /// Unsynced bytes are bounded too: past `UNSYNCED_BYTES_MAX` a turn
    /// syncs whatever it holds, so the page cache never carries much that a
    /// machine crash could take.
    fn unsynced_bytes_max_reached(&self) -> bool {
        self.unsynced_bytes + self.buf.len() as u64 > UNSYNCED_BYTES_MAX
    }

    /// Closes the active segment now, if it holds any record, and begins
    /// the next: compaction removes only closed segments, and on a full disk
    /// the segment being appended to may be the whole log. Returns whether
    /// it closed one.
    pub fn close_active(&mut self) -> io::Result<bool> {
        if self.segments.last().is_none_or(|s| s.bytes == 0) {
            return Ok(false);
        }
        self.forget_clean_stop()?;
        self.cut_back()?;
        self.timed(Phase::Roll, Log::roll)?;
        Ok(true)
    }

    /// Closes the active segment and starts the next, named by its offset.
    fn roll(&mut self) -> io::Result<()> {
        // Both callers have done this already; a roll changes segment files
        // (it cuts the closed one, creates the next), so it says so itself.
        self.forget_clean_stop()?;
        let bytes = self.segments.last().map_or(0, |s| s.bytes);
        // Opened even if nothing was written since the start, to cut the
        // space a previous run reserved: on a full disk it is the room the
        // next segment begins in.
        self.open_active()?;
        if let Some(f) = self.active.as_mut() {
            // A closed segment keeps no reserved space: its file ends where
            // its records do.
            f.set_len(bytes)?;
            // The next fdatasync covers only the new file: sync the old one now.
            if self.unsynced_bytes > 0 && self.options.fsync == FsyncMode::Turn {
                f.sync_data()?;
                self.stats.fsyncs += 1;
            }
        }
        self.unsynced_bytes = 0;
        self.reserved_bytes = 0;
        let base = self.head();
        let path = self.dir.join(segment_name(base));
        let f = (self.opener)(&path)?;
        self.sync_new_name()?;
        self.active = Some(f);
        self.segments.push(Segment { base, bytes: 0 });
        self.active_framed = false;
        Ok(())
    }

    /// Removes segment `base`, which must be the oldest and not the one
    /// appended to (compaction has copied forward whatever in it was live).
    /// The file is renamed at once, so it is no longer part of the log, the
    /// rename made durable, and the file handed to the release thread,
    /// which gives its space back off the loop (`releaser.rs`); while the
    /// space is short it is unlinked at once instead (and the unlink made
    /// durable), as it is if the thread cannot take it: then the space is
    /// wanted now, more than a stall of the loop is feared.
    pub fn remove_oldest(&mut self, base: u64) -> io::Result<()> {
        if self.segments.len() < 2 || self.segments[0].base != base {
            return Err(io::Error::other(format!("segment {base} is not the oldest closed segment")));
        }
        self.forget_clean_stop()?;
        self.timed(Phase::Release, |log| log.remove_file_of(base))?;
        self.segments.remove(0);
        self.stats.segments_removed += 1;
        Ok(())
    }

    /// `remove_oldest`'s work on the file of segment `base`. Removals become
    /// durable one at a time, in order (`sync_removal`). Once one is durable
    /// the segment is out of the log, so what follows cannot fail it: a file
    /// that cannot be released is left for the next start to delete.
    fn remove_file_of(&mut self, base: u64) -> io::Result<()> {
        if self.removal_unsynced {
            self.sync_removal()?;
        }
        let path = self.dir.join(segment_name(base));
        if self.space_short {
            // At once, with no rename: renaming could need a directory
            // block that a full disk has not got. Undone by a power loss,
            // an unlink brings the file back whole (nothing cut it).
            fs::remove_file(&path)?;
            if let Err(e) = self.sync_removal() {
                log::warn!(
                    "cannot sync {} after removing {}: {e}; tried again before the next removal",
                    self.dir.display(),
                    path.display()
                );
            }
            return Ok(());
        }
        let doomed = self.dir.join(format!("{}{REMOVING_SUFFIX}", segment_name(base)));
        fs::rename(&path, &doomed)?;
        if let Err(e) = self.sync_removal() {
            // Not known to be durable: put the segment back as it was
            // (compaction tries again later), and cut nothing of it.
            let _ = fs::rename(&doomed, &path);
            return Err(e);
        }
        let opened = OpenOptions::new().write(true).open(&doomed).and_then(|f| Ok((f.metadata()?.len(), f)));
        let Ok((len, file)) = opened else {
            release_now(&doomed);
            return Ok(());
        };
        if let Err((file, doomed)) = self.releaser.hand_over(file, doomed, len) {
            drop(file);
            release_now(&doomed);
        }
        Ok(())
    }

    /// Makes a removal (a segment's rename, or its unlink while space is
    /// short) durable, in `FsyncMode::Turn`: before the file is cut and
    /// before the next segment is removed. Else a power loss could bring
    /// the segment back under its own name cut short or empty (its cut
    /// durable, its rename not), or keep a later segment's removal and not
    /// this one's: either way log offsets would be missing, and the next
    /// start would refuse. Until it succeeds `removal_unsynced` says so.
    /// With `--fsync never` nothing is synced until a clean stop, whose
    /// marker syncs the directory (`sync_new_name` says why).
    fn sync_removal(&mut self) -> io::Result<()> {
        if self.options.fsync != FsyncMode::Turn {
            return Ok(());
        }
        self.removal_unsynced = true;
        self.stats.dir_syncs += 1;
        sync_dir(&self.dir)?;
        self.removal_unsynced = false;
        Ok(())
    }

    /// Whether the release thread holds as many removed segments as it
    /// queues: compaction removes no other until it has released one.
    pub fn releasing(&self) -> bool {
        self.releaser.full()
    }

    /// Removed segments whose space the release thread has not given back
    /// yet.
    pub fn release_pending(&self) -> usize {
        self.releaser.pending()
    }
}

/// Unlinks a removed segment's file now, on the loop. Nothing depends on
/// it: a start deletes any `….log.removing` file, so an error only leaves
/// the file (and its space) for that start.
fn release_now(doomed: &Path) {
    if let Err(e) = fs::remove_file(doomed) {
        log::warn!("cannot remove {}: {e}; the next start deletes it", doomed.display());
    }
}

/// Makes `dir`'s entries durable: a file's `fdatasync` makes its bytes
/// durable, not its name. After creating, renaming or unlinking a file
/// that recovery depends on, the log syncs its directory with this before
/// anything relies on the change (docs/log-format.md, "Durable names").
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` and whichever of its parents are missing, each one durable
/// before anything is put in it: after every `mkdir` the parent that got
/// the new entry is synced. Otherwise a power loss could take the new data
/// directory away, with every acknowledged message in it, and the next
/// start would make an empty one. A directory already there is taken as it
/// is.
fn create_dir_durably(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| !d.as_os_str().is_empty() && !d.is_dir()) {
        missing.push(d);
        at = d.parent();
    }
    for d in missing.into_iter().rev() {
        match fs::create_dir(d) {
            // Made meanwhile by someone else: synced all the same.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        sync_dir(parent_dir(d))?;
    }
    Ok(())
}

/// The directory that holds `path` (`.` for a bare name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn record_crc(rec: &[u8]) -> u32 {
    let len = LittleEndian::read_u32(rec) as usize;
    let mut h = crc32fast::Hasher::new();
    h.update(&rec[0..4]);
    h.update(&rec[8..RECORD_HEADER_BYTES + len]);
    h.finalize()
}

/// How `parse_record` begins the reason for a record that is whole and
/// valid but from a newer format.
const NEWER: &str = "written by a newer runnel";

/// Parses the record at the start of `buf`: (kind, version, body, bytes).
fn parse_record(buf: &[u8]) -> Result<(RecordKind, u8, &[u8], usize), String> {
    if buf.len() < RECORD_HEADER_BYTES {
        return Err(format!("{} bytes left, a record header needs {RECORD_HEADER_BYTES}", buf.len()));
    }
    let len = LittleEndian::read_u32(buf) as usize;
    if len > RECORD_BYTES_MAX {
        return Err(format!("record length {len} is over the {RECORD_BYTES_MAX}-byte maximum"));
    }
    if buf.len() < RECORD_HEADER_BYTES + len {
        return Err(format!("record of {len} bytes runs past the end of the file"));
    }
    let crc = LittleEndian::read_u32(&buf[4..]);
    if crc != record_crc(buf) {
        return Err("CRC mismatch".into());
    }
    let kind = RecordKind::from_u8(buf[8])
        .ok_or_else(|| format!("{NEWER}: record kind {} is unknown to this build; run a newer runnel", buf[8]))?;
    let version = buf[9];
    if !kind.reads(version) {
        return Err(format!(
            "{NEWER}: {kind:?} record version {version}; this build reads 1..={}; run a newer runnel",
            kind.version()
        ));
    }
    Ok((kind, version, &buf[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + len], RECORD_HEADER_BYTES + len))
}
