//! The recovery table: what a damaged record means. Where a segment's
//! valid records stop, what was found there (a record this build does not
//! read, or damage), where the segment is (the last after a crash or a
//! clean stop, or an earlier one) and what follows decide, by one table,
//! whether the tail is cut as torn or the broker refuses to start
//! (`docs/log-format.md`).
//!
//! What follows is, where the segment's writes are framed (Write records,
//! `log_write.rs`), what those say: whether a write that survived after the
//! damage was issued once a completed sync had covered it. In a log
//! written before framing it is, as it always was, whether whole records
//! follow.

use byteorder::{ByteOrder, LittleEndian};

use super::writes::{Claims, Framing, Step, step};
use super::{HOLE_BLOCK_BYTES, LastStop, NEWER, RECORD_HEADER_BYTES, RecordKind, WRITE_RECORD_BYTES, parse_record};

/// What recovery found where a segment's valid records stop (zeros, the
/// reserved space, are not damage: the records simply end there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Found {
    /// A whole, CRC-valid record of a kind or version this build does not
    /// read: a newer runnel wrote it.
    Newer,
    /// A record that runs past the end of its file or fails a check.
    Damaged,
}

impl Found {
    pub(super) fn of(why: &str) -> Found {
        if why.starts_with(NEWER) { Found::Newer } else { Found::Damaged }
    }
}

/// Where the damaged record lies, and how the run that wrote it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// In the last segment of a run that may have crashed: the only place
    /// a crash leaves a torn write.
    LastAfterCrash,
    /// In the last segment of a run that stopped cleanly: it synced
    /// everything and vouched for where the log ends.
    LastAfterCleanStop,
    /// In a segment before the last: later segments were written after it.
    Earlier,
}

impl Place {
    /// Segment `n` of `count`, of a log whose last run ended as `stop` says.
    pub(super) fn of(n: usize, count: usize, stop: LastStop) -> Place {
        match (n + 1 == count, stop) {
            (false, _) => Place::Earlier,
            (true, LastStop::MayHaveCrashed) => Place::LastAfterCrash,
            (true, LastStop::Clean { .. }) => Place::LastAfterCleanStop,
        }
    }
}

/// What follows the damaged record in its segment. The first three are
/// for a segment without Write records before the damage (written before
/// framing), the last two for one with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Later {
    /// No whole record: nothing was written after it that survived.
    Nothing,
    /// Whole records (to the end of the file, or one its own length leads
    /// to), but only past an aligned zero block of reserved space: a
    /// machine crash can write later blocks of an unsynced write and not an
    /// earlier one, so they may be the rest of the same torn write.
    AfterZeroBlock,
    /// Whole records with no zero block between: later turns wrote them,
    /// synced and acknowledged them, so the damage is not a torn write.
    Records,
    /// The damage lies in a framed part of the segment and no whole Write
    /// record after it says a completed sync covered it: it lies in writes
    /// that no reply can have depended on (the records of the same write
    /// after it included).
    Unconfirmed,
    /// A whole Write record after it says a completed sync covered the
    /// damaged bytes before that write was issued: they may have been
    /// acknowledged. (In an unframed part too: a later run's first Write
    /// record vouches for what that run's start found and synced.)
    Confirmed,
}

/// What recovery does with the damaged record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Cut the segment there: the unsynced end of a crashed run, which
    /// nothing acknowledged.
    TornTail,
    /// Refuse to start (or, with `--repair`, drop the damaged bytes).
    Refuse,
}

/// One row of the recovery table; `None` matches anything.
pub(super) struct Row {
    pub(super) found: Option<Found>,
    pub(super) place: Option<Place>,
    pub(super) later: Option<Later>,
    pub(super) verdict: Verdict,
    /// What the damage means, for a refusal's message: whether it lies in
    /// bytes that may have been acknowledged.
    pub(super) means: &'static str,
}

/// The recovery table (docs/log-format.md, "What damage gives what", is
/// the same table for users): every damaged record falls in exactly one
/// row, which the tests check for every input. Only damage at the very end
/// of a crashed run, in writes no completed sync is known to have covered,
/// is cut without asking; everything else is corruption. (TigerBeetle
/// decides its journal's recovery the same way, from a table.)
pub(super) const DAMAGE_TABLE: [Row; 8] = [
    Row {
        found: Some(Found::Newer),
        place: None,
        later: None,
        verdict: Verdict::Refuse,
        means: "a newer runnel wrote it",
    },
    Row {
        found: Some(Found::Damaged),
        place: Some(Place::Earlier),
        later: None,
        verdict: Verdict::Refuse,
        means: "it lies in a closed segment, synced before the log moved past it: the damaged bytes may have been acknowledged",
    },
    Row {
        found: Some(Found::Damaged),
        place: Some(Place::LastAfterCleanStop),
        later: None,
        verdict: Verdict::Refuse,
        means: "the last run stopped cleanly and synced every byte first: the damaged bytes may have been acknowledged",
    },
    Row {
        found: Some(Found::Damaged),
        place: Some(Place::LastAfterCrash),
        later: Some(Later::Nothing),
        verdict: Verdict::TornTail,
        means: "nothing whole follows it: a crash interrupted the last write",
    },
    Row {
        found: Some(Found::Damaged),
        place: Some(Place::LastAfterCrash),
        later: Some(Later::AfterZeroBlock),
        verdict: Verdict::TornTail,
        means: "only records past a block of reserved zeros follow it: the rest of the same torn write",
    },
    Row {
        found: Some(Found::Damaged),
        place: Some(Place::LastAfterCrash),
        later: Some(Later::Records),
        verdict: Verdict::Refuse,
        means: "whole records follow it in a part of the log written before writes were framed: later turns may have synced them, and the damaged bytes, and acknowledged them",
    },
    Row {
        found: Some(Found::Damaged),
        place: Some(Place::LastAfterCrash),
        later: Some(Later::Unconfirmed),
        verdict: Verdict::TornTail,
        means: "no later write says a completed sync covered it: a crash interrupted a write no reply depended on",
    },
    Row {
        found: Some(Found::Damaged),
        place: Some(Place::LastAfterCrash),
        later: Some(Later::Confirmed),
        verdict: Verdict::Refuse,
        means: "a later write's Write record says a completed sync covered the damaged bytes: they may have been acknowledged",
    },
];

/// The row of the recovery table that decides. What follows the record is
/// looked for (`later`, a search of the rest of the segment) only when the
/// rows that match the rest depend on it.
pub(super) fn classify(found: Found, place: Place, later: impl FnOnce() -> Later) -> &'static Row {
    let rows =
        || DAMAGE_TABLE.iter().filter(|r| r.found.is_none_or(|f| f == found) && r.place.is_none_or(|p| p == place));
    if let Some(row) = rows().find(|r| r.later.is_none()) {
        return row;
    }
    let later = later();
    match rows().find(|r| r.later == Some(later)) {
        Some(row) => row,
        None => unreachable!("the recovery table has a row for every input: {found:?} {place:?} {later:?}"),
    }
}

// ---------------------------------------------------------------------------
// Reading a segment through its damage.
// ---------------------------------------------------------------------------

/// A damaged stretch of a segment: bytes `at..end` hold no valid record.
pub(super) struct Stretch {
    pub(super) at: usize,
    pub(super) end: usize,
    /// The kind byte of the record, when its own length delimits the
    /// stretch.
    pub(super) kind: Option<u8>,
    pub(super) why: String,
}

/// One segment read through, resuming after each damaged stretch.
#[derive(Default)]
pub(super) struct Walked {
    /// Whole valid records (Write records not counted: they are the log's
    /// own).
    pub(super) records: u64,
    pub(super) stretches: Vec<Stretch>,
    /// Where the records end: the reserved zeros, the end of the file, or
    /// the start of a torn tail (the start of the torn write).
    pub(super) end: usize,
    /// Whether `end` is the start of a torn tail.
    pub(super) torn: bool,
    /// Bytes of the valid Write records before `end`, outside the
    /// stretches: a repaired segment is rewritten without them.
    pub(super) write_record_bytes: usize,
    /// The last valid Write record's sequence number (0: none): the log
    /// goes on above it even once repair has dropped it.
    pub(super) last_write_seq: u64,
}

impl Walked {
    /// Bytes of valid records: what the segment holds after a repair (which
    /// rewrites a damaged segment without its Write records, whose offsets
    /// the dropped bytes would make stale).
    pub(super) fn kept_bytes(&self) -> usize {
        let frames = if self.stretches.is_empty() { 0 } else { self.write_record_bytes };
        self.end - self.stretches.iter().map(|s| s.end - s.at).sum::<usize>() - frames
    }
}

/// Reads `data` write by write (record by record where no Write record
/// frames them), skipping each damaged stretch to the next valid record.
/// Damage that the recovery table calls a torn tail (only in the last
/// segment of a run that may have crashed) ends the walk at the start of
/// the write that holds it.
pub(super) fn walk(data: &[u8], place: Place) -> Walked {
    let mut w = Walked::default();
    let (mut anchored, mut claims, mut framing) = (Anchored::default(), Claims::default(), Framing::default());
    let mut pos = 0;
    while pos < data.len() {
        match step(data, pos, &mut framing, place == Place::LastAfterCrash) {
            Step::Record { used } => {
                w.records += 1;
                pos += used;
            }
            Step::Write { end, records } => {
                w.records += records;
                w.write_record_bytes += WRITE_RECORD_BYTES;
                pos = end;
            }
            Step::End => break,
            Step::Damaged { at, why, records } => {
                let later = || later_at(data, at, &framing, &mut claims, || anchored.after(data, at + 1));
                if classify(Found::of(&why), place, later).verdict == Verdict::TornTail {
                    w.torn = true;
                    break;
                }
                // Repair keeps what of the write came before the damage.
                if at > pos {
                    w.write_record_bytes += WRITE_RECORD_BYTES;
                }
                w.records += records;
                let (end, kind) = resync(data, at);
                w.stretches.push(Stretch { at, end, kind, why });
                pos = end;
            }
        }
    }
    w.end = pos;
    w.last_write_seq = framing.last_seq();
    w
}

/// What follows damage at `at`: what a whole Write record after it says
/// (`claims`), if one says a completed sync covered it; else, in a framed
/// part of the segment, that nothing does; else (a part written before
/// framing) whether whole records follow, as `later_records` finds
/// (`records_after` being `records_after(data, at + 1)`, which a walk
/// finds cheaper).
pub(super) fn later_at(
    data: &[u8],
    at: usize,
    framing: &Framing,
    claims: &mut Claims,
    records_after: impl FnOnce() -> Option<usize>,
) -> Later {
    if claims.cover(data, at, framing.last_seq()) {
        return Later::Confirmed;
    }
    if framing.framed() {
        return Later::Unconfirmed;
    }
    later_records(data, at, records_after())
}

/// Where valid records resume after the damaged record at `at`, and its
/// kind byte if its own length says so. Its length is trusted when it
/// leads to a valid record or to the reserved zeros, unless whole records
/// inside its bytes lead there too (then the length was what got damaged).
/// Otherwise the next valid record is searched for, byte by byte.
pub(super) fn resync(data: &[u8], at: usize) -> (usize, Option<u8>) {
    if let Some(next) = declared_end(data, at) {
        let inner = (at + 1..next).find(|&i| {
            valid_at(data, i) && {
                let e = chain_end(data, i);
                e == next || (e < next && all_zero(&data[e..]))
            }
        });
        return match inner {
            Some(i) => (i, None),
            None => (next, Some(data[at + 8])),
        };
    }
    let last_start = data.len().saturating_sub(RECORD_HEADER_BYTES - 1);
    match (at + 1..last_start).find(|&i| valid_at(data, i)) {
        Some(i) => (i, None),
        None => (zero_tail(data).max(at + 1), None),
    }
}

/// Where the record at `at` ends by its own length, if a valid record or
/// the reserved zeros begin there.
pub(super) fn declared_end(data: &[u8], at: usize) -> Option<usize> {
    if data.len() - at < RECORD_HEADER_BYTES {
        return None;
    }
    let next = at + RECORD_HEADER_BYTES + LittleEndian::read_u32(&data[at..]) as usize;
    (next <= data.len() && (all_zero(&data[next..]) || valid_at(data, next))).then_some(next)
}

/// What follows a damaged record at `at`: whole records that run to the
/// end of the file (or to the reserved zeros), or a whole record its own
/// length leads to, and whether an aligned zero block of reserved space
/// lies between. (`after` is `records_after(data, at + 1)`, which a walk
/// finds cheaper.)
pub(super) fn later_records(data: &[u8], at: usize, after: Option<usize>) -> Later {
    let landing = declared_end(data, at).filter(|&next| next < data.len() && valid_at(data, next));
    match after.or(landing) {
        None => Later::Nothing,
        Some(next) if zero_block_within(data, at, next) => Later::AfterZeroBlock,
        Some(_) => Later::Records,
    }
}

/// `records_after` for a walk, which asks at offsets that only grow: the
/// records that run to the end do not depend on where the search starts,
/// so an answer past the new offset still holds, and a segment is searched
/// about once however much damage it holds.
#[derive(Default)]
pub(super) struct Anchored {
    /// The last search: from where, and what it found.
    pub(super) last: Option<(usize, Option<usize>)>,
}

impl Anchored {
    pub(super) fn after(&mut self, data: &[u8], from: usize) -> Option<usize> {
        match self.last {
            Some((f, found)) if f <= from && found.is_none_or(|i| i >= from) => found,
            _ => {
                let found = records_after(data, from);
                self.last = Some((from, found));
                found
            }
        }
    }
}

/// Whether a whole, valid record of this build starts at `data[i]`: cheap
/// header checks first, which reject almost every offset before a CRC is
/// computed.
pub(super) fn valid_at(data: &[u8], i: usize) -> bool {
    let b = &data[i..];
    b.len() >= RECORD_HEADER_BYTES
        && RecordKind::from_u8(b[8]).is_some_and(|k| k.reads(b[9]))
        && b[10] == 0
        && b[11] == 0
        && (LittleEndian::read_u32(b) as usize) <= b.len() - RECORD_HEADER_BYTES
        && parse_record(b).is_ok()
}

/// Where a run of whole valid records starting at `i` stops.
pub(super) fn chain_end(data: &[u8], mut i: usize) -> usize {
    while i < data.len() {
        match parse_record(&data[i..]) {
            Ok((_, _, _, used)) => i += used,
            Err(_) => break,
        }
    }
    i
}

/// Where, somewhere in `data[from..]`, whole valid records start and run
/// exactly to the end of the file (or to reserved zeros at its end): what
/// later turns leave after a damaged record in the middle. A torn write
/// leaves no such run (its tail ends inside a record), even if a payload it
/// cut happens to hold bytes that look like a record.
pub(super) fn records_after(data: &[u8], from: usize) -> Option<usize> {
    (from..data.len().saturating_sub(RECORD_HEADER_BYTES - 1)).find(|&i| {
        valid_at(data, i) && {
            let e = chain_end(data, i);
            e == data.len() || all_zero(&data[e..])
        }
    })
}

pub(super) fn all_zero(data: &[u8]) -> bool {
    data.iter().all(|&b| b == 0)
}

/// Where the zero bytes that end `data` begin.
pub(super) fn zero_tail(data: &[u8]) -> usize {
    data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)
}

/// Whether a whole, aligned `HOLE_BLOCK_BYTES` block of zeros lies in
/// `data[from..to]`.
pub(super) fn zero_block_within(data: &[u8], from: usize, to: usize) -> bool {
    let mut b = from.next_multiple_of(HOLE_BLOCK_BYTES);
    while b + HOLE_BLOCK_BYTES <= to {
        if all_zero(&data[b..b + HOLE_BLOCK_BYTES]) {
            return true;
        }
        b += HOLE_BLOCK_BYTES;
    }
    false
}
