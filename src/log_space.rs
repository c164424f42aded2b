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

/// What a withdrawable record is: which a full disk drops first, since
/// each kind leaves its own bytes of the disk free past the headroom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Withdrawable {
    /// A client's produce: answered STORAGE when dropped.
    Produce,
    /// Compaction's copies of live messages: put off when dropped.
    Copy,
}

/// What a turn's write dropped for want of space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Dropped {
    /// The client produces.
    pub produces: bool,
    /// Compaction's copies (only ever with the produces, or with none).
    pub copies: bool,
}

impl Log {
    /// Bytes of the disk that client produces leave free past the
    /// headroom (`Limits::produce_headroom_bytes` says why): room for what
    /// frees the disk once produces have filled it — compaction's copies
    /// of the live messages of the segment it cleans, and the acks, PURGE,
    /// DELETE and topic changes — so that those are still written, and
    /// acknowledged, on a disk that refuses produces.
    fn produce_headroom_bytes(&self) -> u64 {
        self.options.produce_headroom_bytes
    }

    /// Bytes of the disk that compaction's copies leave free past the
    /// headroom: a quarter of what produces leave, so that copies go on
    /// where produces stop (the other three quarters are theirs), while
    /// the acks and admin records written during a cleaning still have
    /// room (those of some 32,000 messages, by default). Copies are
    /// bounded besides: a segment is cleaned only once the disk has room
    /// for all of its copies and this after them (`copies_fit`), and its
    /// removal then gives back every byte they took.
    pub fn copy_headroom_bytes(&self) -> u64 {
        self.produce_headroom_bytes() / 4
    }

    /// Bytes that records of `kind` leave free past the headroom.
    fn withdrawable_headroom_bytes(&self, kind: Withdrawable) -> u64 {
        match kind {
            Withdrawable::Produce => self.produce_headroom_bytes(),
            Withdrawable::Copy => self.copy_headroom_bytes(),
        }
    }

    /// Makes room for the turn's records at byte `at` of the active
    /// segment, leaving `headroom` free after them: first drops the client
    /// produces if there is no room for everything and
    /// `produce_headroom_bytes` more, then compaction's copies if there is
    /// no room for what is left and `copy_headroom_bytes` more; fails
    /// (ENOSPC) if there is no room for the rest and the headroom. So each
    /// kind stops where the disk keeps room for what the next frees it.
    /// `header` bytes go before the records (a new segment's Write
    /// record, `Log::write_header`).
    pub(super) fn fit_turn(&mut self, at: u64, header: u64, headroom: u64) -> io::Result<Dropped> {
        let mut dropped = Dropped::default();
        for kind in [Withdrawable::Produce, Withdrawable::Copy] {
            if !self.withdrawable.iter().any(|w| w.2 == kind) {
                continue;
            }
            let more = self.withdrawable_headroom_bytes(kind);
            if self.make_room(at, header + self.buf.len() as u64, headroom + more).is_ok() {
                // What comes after it needs less.
                return Ok(dropped);
            }
            self.drop_withdrawable(|w| w == kind);
            match kind {
                Withdrawable::Produce => dropped.produces = true,
                Withdrawable::Copy => dropped.copies = true,
            }
        }
        self.make_room(at, header + self.buf.len() as u64, headroom)?;
        Ok(dropped)
    }

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
        if !stepped && !self.space_short && self.owned_bytes(at) >= bytes {
            return Ok(());
        }
        let Some(room) = self.room_bytes(at) else { return Ok(()) };
        // Short: the next step of produces would not fit.
        let produce_room = bytes + self.headroom_bytes + self.produce_headroom_bytes() + RESERVE_AHEAD_BYTES;
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

    /// The active segment's reserved space past byte `at` of it.
    fn owned_bytes(&self, at: u64) -> u64 {
        if self.reserved_bytes == CANNOT_RESERVE { 0 } else { self.reserved_bytes.saturating_sub(at) }
    }

    /// The room for records at byte `at` of the active segment: the
    /// filesystem's free space and the segment's reserved space past `at`.
    /// None if the filesystem cannot say (or no segment is open yet).
    fn room_bytes(&mut self, at: u64) -> Option<u64> {
        let owned = self.owned_bytes(at);
        let free = self.timed(Phase::Reserve, |log| log.active.as_ref().map(|f| f.free_bytes()))?.ok()?;
        Some(owned.saturating_add(free))
    }

    /// Whether the disk has room, after the records this turn holds so
    /// far, for `bytes` of compaction's copies and the headroom and
    /// `copy_headroom_bytes` after them: compaction begins copying a
    /// segment's live messages only then, so that a cleaning it begins can
    /// finish (and give back what its copies took). A filesystem that
    /// cannot say has room (no headroom is kept on it); before the active
    /// segment is open (a start's first turn) the room is not known yet,
    /// and is taken to be short.
    pub fn copies_fit(&mut self, bytes: u64) -> bool {
        if self.active.is_none() {
            return false;
        }
        let at = self.segments.last().map_or(0, |s| s.bytes);
        let need = self.buf.len() as u64 + bytes + self.headroom_bytes + self.copy_headroom_bytes();
        self.room_bytes(at).is_none_or(|room| room >= need)
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
