//! Reading a segment write by write: each Write record with the records it
//! frames (docs/log-format.md, "Writes"), checked whole before any of them
//! counts, and what the Write records that survive after damage say a
//! completed sync covered. A segment written before framing is read record
//! by record, as it always was.

use byteorder::{ByteOrder, LittleEndian};

use super::{RECORD_HEADER_BYTES, RecordKind, WRITE_BODY_BYTES, WRITE_RECORD_BYTES, WriteFrame, parse_record};

/// One step of reading a segment from a record boundary.
pub(in crate::log) enum Step {
    /// A whole, valid record that no Write record frames (a segment
    /// written before framing): `used` bytes.
    Record { used: usize },
    /// A whole write: a Write record and `records` whole, valid records
    /// after it, up to `end`.
    Write { end: usize, records: u64 },
    /// The records end here: zeros (reserved space) or the end of the file
    /// follow.
    End,
    /// Bytes at `at` are not a valid record: the first damage of the write
    /// that begins where the step began (at `at` itself, or after its Write
    /// record and `records` whole records of it).
    Damaged { at: usize, why: String, records: u64 },
}

/// The Write records read so far in a segment, in order.
#[derive(Default)]
pub(in crate::log) struct Framing {
    /// Where the first valid one is: the segment is framed from there on.
    first_at: Option<usize>,
    /// The last valid one's sequence number (0: none yet).
    last_seq: u64,
}

impl Framing {
    /// Whether a valid Write record came before: damage from there on is
    /// judged by what Write records say.
    pub(in crate::log) fn framed(&self) -> bool {
        self.first_at.is_some()
    }
    /// Whether a valid Write record lies before byte `end`.
    pub(in crate::log) fn framed_before(&self, end: usize) -> bool {
        self.first_at.is_some_and(|at| at < end)
    }
    /// The last valid Write record's sequence number (0: none).
    pub(in crate::log) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The frame of the Write record at `at` with `body`, if it is one an
    /// honest log can hold: its body's length, a sequence number above the
    /// one before it, and no claim past its own offset (a sync covers only
    /// what was written before the write it is told in).
    fn check(&self, at: usize, body: &[u8]) -> Result<WriteFrame, String> {
        let frame = WriteFrame::decode(body)
            .ok_or_else(|| format!("a Write record of {} body bytes (version 1 has {WRITE_BODY_BYTES})", body.len()))?;
        if frame.synced_bytes > at as u64 {
            return Err(format!(
                "a Write record says {} bytes of its segment were synced before it was written, past its own offset",
                frame.synced_bytes
            ));
        }
        if frame.seq <= self.last_seq {
            return Err(format!("a Write record numbered {} after one numbered {}", frame.seq, self.last_seq));
        }
        Ok(frame)
    }

    fn note(&mut self, at: usize, frame: WriteFrame) {
        self.first_at.get_or_insert(at);
        self.last_seq = frame.seq;
    }
}

/// Reads `data` from `pos`, a record boundary: one record, or one whole
/// write (its Write record and every record it frames), or where the
/// records end, or the first damage. `torn_writes`: in the last segment of
/// a run that may have crashed, a write whose records end (zeros, or the
/// end of the file) before its Write record says is damage, a write a crash
/// cut short; elsewhere its records simply end there (and what is missing
/// shows as a gap before the next segment, or against the clean-stop
/// marker's end).
pub(in crate::log) fn step(data: &[u8], pos: usize, framing: &mut Framing, torn_writes: bool) -> Step {
    let (kind, body, used) = match parse_record(&data[pos..]) {
        Ok((kind, _, body, used)) => (kind, body, used),
        Err(_) if super::damage::all_zero(&data[pos..]) => return Step::End,
        Err(why) => return Step::Damaged { at: pos, why, records: 0 },
    };
    if kind != RecordKind::Write {
        return Step::Record { used };
    }
    let frame = match framing.check(pos, body) {
        Ok(frame) => frame,
        Err(why) => return Step::Damaged { at: pos, why, records: 0 },
    };
    framing.note(pos, frame);
    let end = (pos + used).saturating_add(usize::try_from(frame.records_bytes).unwrap_or(usize::MAX));
    let (mut at, mut records) = (pos + used, 0);
    while at < end {
        match parse_record(&data[at..]) {
            Ok((RecordKind::Write, ..)) => {
                let why = format!("a Write record inside the write begun at byte {pos}");
                return Step::Damaged { at, why, records };
            }
            Ok((_, _, _, n)) if at + n > end => {
                let why = format!("a record running past the end of its write (byte {end}, begun at byte {pos})");
                return Step::Damaged { at, why, records };
            }
            Ok((_, _, _, n)) => {
                at += n;
                records += 1;
            }
            Err(_) if super::damage::all_zero(&data[at..]) && !torn_writes => return Step::Write { end: at, records },
            Err(_) if super::damage::all_zero(&data[at..]) => {
                let why = format!(
                    "the write begun at byte {pos} holds {} bytes of records, but they end at byte {at}: a write cut short",
                    frame.records_bytes
                );
                return Step::Damaged { at, why, records };
            }
            Err(why) => return Step::Damaged { at, why, records },
        }
    }
    Step::Write { end, records }
}

/// The records of a write `step` checked whole: each (kind, version, body,
/// offset) from `from` to `end`, read by their headers alone (their CRCs
/// held a moment ago).
pub(in crate::log) fn checked_records(
    data: &[u8],
    from: usize,
    end: usize,
) -> impl Iterator<Item = (RecordKind, u8, &[u8], usize)> {
    let mut at = from;
    std::iter::from_fn(move || {
        let header = data.get(at..at + RECORD_HEADER_BYTES).filter(|_| at < end)?;
        let len = LittleEndian::read_u32(header) as usize;
        let kind = RecordKind::from_u8(header[8])?;
        let body = data.get(at + RECORD_HEADER_BYTES..at + RECORD_HEADER_BYTES + len)?;
        let item = (kind, header[9], body, at);
        at += RECORD_HEADER_BYTES + len;
        Some(item)
    })
}

/// The whole Write records found after damage, searching byte by byte
/// (where the damage hides record boundaries), with what each says was
/// synced before it was issued. Searched once a segment, from the first
/// damage asked about; later questions (at later offsets) reuse it.
#[derive(Default)]
pub(in crate::log) struct Claims {
    /// The search: from where, and each Write record found at or after it
    /// (its offset and frame).
    found: Option<(usize, Vec<(usize, WriteFrame)>)>,
}

impl Claims {
    /// Whether a whole Write record after byte `at`, numbered above
    /// `seq_floor` (the last one before the damage: one numbered lower is
    /// not this segment's later write, but bytes a payload carried), says
    /// that a completed sync covered byte `at`.
    pub(in crate::log) fn cover(&mut self, data: &[u8], at: usize, seq_floor: u64) -> bool {
        let from = at + 1;
        let stale = self.found.as_ref().is_none_or(|(f, _)| *f > from);
        if stale {
            self.found = Some((from, write_records_from(data, from)));
        }
        let Some((_, found)) = &self.found else { return false };
        found.iter().any(|&(i, f)| i >= from && f.seq > seq_floor && f.synced_bytes > at as u64)
    }
}

/// Every whole Write record that starts at or after `from`, wherever it
/// starts, that an honest log can hold (no claim past its own offset).
/// Cheap header checks first, so that almost every offset costs a compare.
fn write_records_from(data: &[u8], from: usize) -> Vec<(usize, WriteFrame)> {
    let kind = RecordKind::Write as u8;
    let last = data.len().saturating_sub(WRITE_RECORD_BYTES - 1);
    (from..last)
        .filter(|&i| {
            let h = &data[i..i + RECORD_HEADER_BYTES];
            h[8] == kind
                && h[9] == RecordKind::Write.version()
                && h[10] == 0
                && h[11] == 0
                && LittleEndian::read_u32(h) as usize == WRITE_BODY_BYTES
        })
        .filter_map(|i| {
            let (_, _, body, _) = parse_record(&data[i..]).ok()?;
            let frame = WriteFrame::decode(body)?;
            (frame.synced_bytes <= i as u64).then_some((i, frame))
        })
        .collect()
}
