//! The Write record: the frame every write of the log begins with
//! (docs/log-format.md, "Writes").
//!
//! Recovery must tell bytes that no reply can have depended on (the
//! unconfirmed end of a crashed run, which it cuts) from damage to bytes
//! that may have been acknowledged (which it refuses). Whole records after
//! a damaged one cannot tell them apart: a power cut can keep a later
//! sector of an unsynced write and lose an earlier one. So each write says
//! of itself, in its first record, how much of its segment a completed
//! `fdatasync` had made durable when it was issued: a later write that
//! survives proves what a sync covered, whatever became of the bytes
//! between. TigerBeetle's journal tells torn writes from corruption the
//! same way, from what its headers say rather than from what the damage
//! looks like.
//!
//! A segment's first write is a Write record alone, made durable before
//! anything follows it (`Log::write_header`): so every segment this build
//! writes holds a durable Write record before any other, and recovery knows
//! a framed segment even when the first write of records after it is torn.

use std::io;

use byteorder::{ByteOrder, LittleEndian};

use super::{FsyncMode, Log, RECORD_HEADER_BYTES, RecordKind, record_crc};
use crate::metrics::Phase;

/// Bytes of a Write record's body: `seq u64`, `synced_bytes u64`,
/// `records_bytes u64`.
pub const WRITE_BODY_BYTES: usize = 24;
/// Bytes of a whole Write record, header included: what framing costs a
/// write.
pub const WRITE_RECORD_BYTES: usize = RECORD_HEADER_BYTES + WRITE_BODY_BYTES;

/// What a Write record says of the write it begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteFrame {
    /// The write's number: every Write record in the log has a greater one
    /// than those before it (the count goes on from the log's highest at
    /// each start).
    pub seq: u64,
    /// Byte offset in the segment below which every byte was made durable
    /// by an `fdatasync` that completed before this write was issued (the
    /// start-up's own sync of the segment included). Segment-local, so that
    /// renaming segments never makes it stale.
    pub synced_bytes: u64,
    /// Bytes of records the write holds after its Write record.
    pub records_bytes: u64,
}

impl WriteFrame {
    /// Writes the whole record (header, body, CRC) into `out`, which is
    /// `WRITE_RECORD_BYTES` long.
    pub fn encode(&self, out: &mut [u8]) {
        let kind = RecordKind::Write;
        LittleEndian::write_u32(&mut out[0..], WRITE_BODY_BYTES as u32);
        out[8..RECORD_HEADER_BYTES].copy_from_slice(&[kind as u8, kind.version(), 0, 0]);
        LittleEndian::write_u64(&mut out[12..], self.seq);
        LittleEndian::write_u64(&mut out[20..], self.synced_bytes);
        LittleEndian::write_u64(&mut out[28..], self.records_bytes);
        let crc = record_crc(out);
        LittleEndian::write_u32(&mut out[4..], crc);
    }

    /// The frame a Write record's body gives, if it has the body's length.
    pub fn decode(body: &[u8]) -> Option<WriteFrame> {
        (body.len() == WRITE_BODY_BYTES).then(|| WriteFrame {
            seq: LittleEndian::read_u64(&body[0..]),
            synced_bytes: LittleEndian::read_u64(&body[8..]),
            records_bytes: LittleEndian::read_u64(&body[16..]),
        })
    }
}

impl Log {
    /// Bytes of the active segment that a completed `fdatasync` made
    /// durable: all it holds but what was written since its last sync. (A
    /// sync still in flight counts for nothing until it completes.)
    fn synced_bytes(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.bytes) - self.unsynced_bytes
    }

    /// The next write's frame, for a write at `at` of `records_bytes` of
    /// records; takes its sequence number.
    fn next_frame(&mut self, records_bytes: u64) -> WriteFrame {
        let frame = WriteFrame { seq: self.next_write_seq, synced_bytes: self.synced_bytes(), records_bytes };
        self.next_write_seq += 1;
        frame
    }

    /// Fills in the Write record that begins the turn buffer (`begin` left
    /// room for it), just before the buffer is written.
    pub(super) fn seal_turn(&mut self) {
        let records_bytes = (self.buf.len() - WRITE_RECORD_BYTES) as u64;
        let frame = self.next_frame(records_bytes);
        frame.encode(&mut self.buf[..WRITE_RECORD_BYTES]);
    }

    /// Writes a Write record of no records at the end of the active segment
    /// and makes it durable (with `--fsync turn`) before anything follows
    /// it: the first write to a segment this build begins (a new one, or
    /// one written by a runnel before framing). From then on recovery knows
    /// the segment is framed even if the next write is torn at its very
    /// first byte, and a Write record it finds after damage there proves
    /// what a sync covered. One small write and sync per segment. With
    /// `--fsync never` nothing is synced, this neither: a machine crash
    /// may then leave damage a start refuses, as for the closed segments.
    pub(super) fn write_header(&mut self) -> io::Result<()> {
        let at = self.segments.last().map_or(0, |s| s.bytes);
        let mut rec = [0u8; WRITE_RECORD_BYTES];
        self.next_frame(0).encode(&mut rec);
        let turn = self.options.fsync == FsyncMode::Turn;
        self.timed(Phase::Roll, |log| {
            let Some(f) = log.active.as_mut() else { return Err(io::Error::other("no active segment")) };
            // A failure from here on may leave bytes past the committed
            // end: they are cut before anything else is written.
            log.dirty = true;
            f.write_all_at(&rec, at)?;
            if turn {
                f.sync_data()?;
                log.stats.fsyncs += 1;
            }
            Ok(())
        })?;
        self.unsynced_bytes = if turn { 0 } else { self.unsynced_bytes + WRITE_RECORD_BYTES as u64 };
        if let Some(s) = self.segments.last_mut() {
            s.bytes += WRITE_RECORD_BYTES as u64;
        }
        self.dirty = false;
        self.active_framed = true;
        Ok(())
    }
}
