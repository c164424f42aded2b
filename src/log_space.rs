//! The log's room on the disk: the active segment's space reserved ahead
//! of its writes (`fallocate`), and the headroom every turn leaves free so
//! that the records which free the disk can still be written on a full one.

use std::io;

use super::{Log, WRITE_RECORD_BYTES, recovery};
use crate::metrics::Phase;

/// Space reserved ahead of the writes in the active segment, in steps of
/// this many bytes (capped at the segment size). An append that grows the
/// file makes every `fdatasync` also write the file's metadata (its new
/// size, to the inode or the journal); writing into reserved space does not
/// change the size, which cuts
/// a durable depth-1 produce's sync by a third here (bench/README.md). The
/// reserved tail reads as zeros until written; recovery knows that.
const RESERVE_AHEAD_BYTES: u64 = 1 << 20;
/// `Log::reserved_bytes` when the filesystem cannot reserve space (not
/// retried before the next segment).
const CANNOT_RESERVE: u64 = u64::MAX;
/// The least headroom: bytes of the disk that turns leave free (the active
/// segment's reserved space past its records counts as free), so that
/// compaction can always restate what a segment holds besides messages (a
/// few Topic records and the id floor) and remove it, however full the
/// disk is. The broker raises it to what restating every topic would take
/// (`set_headroom_bytes`); 64 KiB restates about 1,500 topics with 20-byte
/// names, and is nothing next to a segment.
pub const HEADROOM_BYTES_MIN: u64 = 64 << 10;
/// Bytes that a turn's produces (and compaction's copies) leave free past
/// the headroom: room for the records that free the disk once produces
/// have filled it — acks (this holds those of 130,000 messages), PURGE,
/// DELETE, topic changes — so that those are still written, and
/// acknowledged, on a disk that refuses produces.
pub const PRODUCE_HEADROOM_BYTES: u64 = 1 << 20;

impl Log {
    /// Reserves the active segment's space ahead of the writes, a
    /// `RESERVE_AHEAD_BYTES` step at a time up to the segment size (a turn
    /// that takes the segment past it is written as a plain append: the
    /// segment closes after it). Returns whether it tried. A disk too full
    /// for the step leaves the reservation as it is, to be tried again next
    /// turn; a filesystem that cannot reserve at all gets plain appends for
    /// the rest of the segment.
    fn reserve_ahead(&mut self, end: u64) -> bool {
        if end <= self.reserved_bytes || end > self.options.segment_bytes_max {
            return false;
        }
        let want = end.next_multiple_of(RESERVE_AHEAD_BYTES).min(self.options.segment_bytes_max);
        let Some(reserved) = self.timed(Phase::Reserve, |log| log.active.as_mut().map(|f| f.reserve(want))) else {
            return false;
        };
        match reserved {
            Ok(()) => {
                self.reserved_bytes = want;
                // Room for a step; `make_room` looks closer.
                self.space_short = false;
            }
            Err(e) if is_no_space(&e) => self.space_short = true,
            Err(e) => {
                // Appends still work; they just sync the size too.
                log::debug!("commit log: cannot reserve {want} bytes of the active segment: {e}");
                self.reserved_bytes = CANNOT_RESERVE;
            }
        }
        true
    }

    /// Makes room for `bytes` of records at `at` and checks that the disk
    /// keeps `headroom` bytes free after them (the active segment's
    /// reserved space past the records counts as free). A turn that would
    /// leave less fails (ENOSPC) before it writes anything; `commit_ahead`
    /// (no headroom) writes into what the headroom kept. The filesystem's
    /// free space is looked up only when the reservation grows, when the
    /// space was short at the last look, or when the turn does not fit in
    /// the reservation; a filesystem that cannot say is not checked.
    pub(super) fn make_room(&mut self, at: u64, bytes: u64, headroom: u64) -> io::Result<()> {
        let stepped = self.reserve_ahead(at + bytes);
        if headroom == 0 {
            return Ok(());
        }
        let owned = if self.reserved_bytes == CANNOT_RESERVE { 0 } else { self.reserved_bytes.saturating_sub(at) };
        if !stepped && !self.space_short && owned >= bytes {
            return Ok(());
        }
        let Some(Ok(free)) = self.timed(Phase::Reserve, |log| log.active.as_ref().map(|f| f.free_bytes())) else {
            return Ok(());
        };
        let room = owned.saturating_add(free);
        // Short: the next step of produces would not fit.
        let produce_room = bytes + self.headroom_bytes + PRODUCE_HEADROOM_BYTES + RESERVE_AHEAD_BYTES;
        self.space_short = room < produce_room;
        if room >= bytes + headroom {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::StorageFull,
            format!(
                "{room} bytes free on the device: no room for {bytes} bytes of records and the {headroom} bytes kept free after them"
            ),
        ))
    }

    /// Whether, at the last look, the disk had no room for another
    /// reservation step of produces past the headroom (or refused a write):
    /// compaction then frees what it can at once.
    pub fn space_short(&self) -> bool {
        self.space_short
    }

    /// Sets the headroom: at least `HEADROOM_BYTES_MIN`, and what the broker
    /// says restating every topic takes, with the Write records of the
    /// restatement's write and of a new segment's first.
    pub fn set_headroom_bytes(&mut self, bytes: u64) {
        let framed = bytes + 2 * WRITE_RECORD_BYTES as u64;
        self.headroom_bytes = framed.max(HEADROOM_BYTES_MIN).next_multiple_of(recovery::HOLE_BLOCK_BYTES as u64);
    }
}

/// Whether an error says the disk (or the user's quota) is full.
pub(super) fn is_no_space(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded)
}
