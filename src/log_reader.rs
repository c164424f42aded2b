//! Reading the log back while the broker runs: `Reader`, a position in the
//! segment files that `Log::read_slice` advances by whole records, a
//! bounded number of bytes per call, and `SparseIndex`, which finds where in
//! the files a topic's message id is without an entry per message.
//!
//! This is what serving retained messages from the files needs (replay: a
//! group reading messages its topic no longer holds in memory,
//! `broker/replay_reader.rs`): the loop reads a bounded number of bytes a
//! turn for all such readers together (`replay_read_bytes_per_turn`),
//! so that a group replaying a gigabyte never stalls the other connections
//! (as Kafka serves old segments through the page cache a fetch at a time,
//! never a whole log at once). Only the log touches
//! files: the reader is the log's, and hands out records as recovery does
//! (`ReadRecord`), for `record::Record::decode`.
//!
//! Only durable bytes are read (a segment's `bytes`, which a turn's sync
//! moves on), so a reader never sees a record a crash could still undo.
//! A segment compaction removed is gone for its readers (`Slice::Gone`):
//! the caller seeks again with the index, whose entries for it went with
//! it (`SparseIndex::forget_segment`).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::{Log, RECORD_HEADER_BYTES, ReadRecord, RecordKind, parse_record, segment_name};
use crate::broker::TopicId;
use crate::queue::MsgId;

/// The index's default stride, bytes of a topic's records between entries:
/// a seek then lands at most a megabyte before the id it looks for, which a
/// reader skips in a few turns' budgets, and a gigabyte of a topic's log
/// costs about a thousand entries (24 KiB).
pub const INDEX_STRIDE_BYTES: u64 = 1 << 20;

/// Where a reader is: a record's start in a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadPos {
    /// The segment's base offset (its file name).
    pub segment: u64,
    /// Bytes from the segment's start.
    pub at_bytes: u64,
}

/// How a `read_slice` call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slice {
    /// It read its budget (or a record larger than it): call again.
    More,
    /// The next record is larger than the budget, and the call may not
    /// pass it: nothing was read; call again with more.
    Full,
    /// It reached the end of the durable records: call again after a sync.
    End,
    /// The segment it was in was removed by compaction.
    Gone,
}

/// A position in the log and the segment file open at it.
pub struct Reader {
    /// The next record to read.
    pos: ReadPos,
    /// The segment `pos` is in, once opened.
    file: Option<File>,
    /// The bytes read this call; kept for the next (no allocation a turn).
    buf: Vec<u8>,
}

impl Reader {
    /// A reader at `pos` (the start of a record, as `SparseIndex::seek`
    /// gives).
    pub fn new(pos: ReadPos) -> Reader {
        Reader { pos, file: None, buf: Vec::new() }
    }
    /// The next record it will read.
    pub fn pos(&self) -> ReadPos {
        self.pos
    }
}

/// The records of the last turn committed, kept until the broker notes
/// where its Produce records went (`Log::take_kept_turn`): two turn
/// buffers take turns, so keeping one costs no copy.
#[derive(Default)]
pub(super) struct KeptTurn {
    /// Where the turn's first record starts; None once taken (or before
    /// the first commit).
    pos: Option<ReadPos>,
    /// The turn's records, as written.
    buf: Vec<u8>,
}

impl Log {
    /// The turn just synced, whose records start at `at`, is kept for
    /// `take_kept_turn` (its buffer trades places with the one kept
    /// before, which the caller then clears).
    pub(super) fn keep_turn(&mut self, at: ReadPos) {
        std::mem::swap(&mut self.buf, &mut self.kept.buf);
        self.kept.pos = Some(at);
    }

    /// Passes each record of the last committed turn to `each`, with its
    /// position, once: a second call (or one after a turn that committed
    /// nothing) passes none. The records are the log's own, just written:
    /// their CRCs are not checked again. The write's Write record is the
    /// log's, not passed.
    pub fn take_kept_turn(&mut self, mut each: impl FnMut(ReadRecord<'_>)) {
        let Some(at) = self.kept.pos.take() else { return };
        let buf = &self.kept.buf;
        let mut used = 0;
        while let Some(header) = buf.get(used..used + RECORD_HEADER_BYTES) {
            let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
            let (Some(kind), Some(body)) =
                (RecordKind::from_u8(header[8]), buf.get(used + RECORD_HEADER_BYTES..used + RECORD_HEADER_BYTES + len))
            else {
                return;
            };
            let offset = at.segment + at.at_bytes + used as u64;
            if kind != RecordKind::Write {
                each(ReadRecord { kind, version: header[9], body, offset, segment: at.segment });
            }
            used += RECORD_HEADER_BYTES + len;
        }
    }

    /// Reads the whole records after `r`'s position, in log order, passing
    /// each to `each` (but the Write records, which are the log's own),
    /// reading at most `budget_bytes` of the files; if the next record is
    /// larger, that one record when `whole_if_larger` (the first read of a
    /// turn), else nothing (`Slice::Full`). Moves into the next segment at
    /// the end of one. An error is a read that failed or a durable record
    /// that does not parse: the caller ends that reader.
    pub fn read_slice(
        &self,
        r: &mut Reader,
        (budget_bytes, whole_if_larger): (u64, bool),
        mut each: impl FnMut(ReadRecord<'_>),
    ) -> io::Result<Slice> {
        let seg = loop {
            let Some(i) = self.segments.iter().position(|s| s.base == r.pos.segment) else { return Ok(Slice::Gone) };
            if r.pos.at_bytes < self.segments[i].bytes {
                break &self.segments[i];
            }
            let Some(next) = self.segments.get(i + 1) else { return Ok(Slice::End) };
            r.pos = ReadPos { segment: next.base, at_bytes: 0 };
            r.file = None;
        };
        if !whole_if_larger && budget_bytes < RECORD_HEADER_BYTES as u64 {
            return Ok(Slice::Full);
        }
        if r.file.is_none() {
            r.file = Some(File::open(self.dir.join(segment_name(seg.base)))?);
        }
        let want = budget_bytes.max(RECORD_HEADER_BYTES as u64).min(seg.bytes - r.pos.at_bytes);
        let file = r.file.as_ref().ok_or_else(|| io::Error::other("segment not open"))?;
        read_at(file, &mut r.buf, r.pos.at_bytes, want)?;
        let first = r.buf.get(..4).map_or(0, |b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        let first_bytes = RECORD_HEADER_BYTES as u64 + first;
        if first_bytes > want && first_bytes <= seg.bytes - r.pos.at_bytes {
            if !whole_if_larger {
                return Ok(Slice::Full);
            }
            // One record larger than the budget: read it whole.
            read_at(file, &mut r.buf, r.pos.at_bytes, first_bytes)?;
        }
        let mut used = 0;
        while used < r.buf.len() {
            let Ok((kind, version, body, n)) = parse_record(&r.buf[used..]) else { break };
            let offset = seg.base + r.pos.at_bytes + used as u64;
            if kind != RecordKind::Write {
                each(ReadRecord { kind, version, body, offset, segment: seg.base });
            }
            used += n;
        }
        if used == 0 {
            let why = parse_record(&r.buf).err().unwrap_or_default();
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("segment {}: {why}", seg.base)));
        }
        r.pos.at_bytes += used as u64;
        // The next slice is asked for now, read by the kernel in the
        // background: the loop's next read, a paced while later, finds it
        // in the page cache instead of stalling its turn on the disk.
        let ahead = want.min(seg.bytes - r.pos.at_bytes);
        if ahead > 0
            && let Err(e) = crate::sys::will_need(file, r.pos.at_bytes, ahead)
        {
            log::debug!("replay: no read-ahead of segment {}: {e}", seg.base);
        }
        Ok(Slice::More)
    }
}

/// Fills `buf` with `len` bytes of `file` from `at`.
fn read_at(file: &File, buf: &mut Vec<u8>, at: u64, len: u64) -> io::Result<()> {
    buf.resize(usize::try_from(len).map_err(io::Error::other)?, 0);
    file.read_exact_at(buf, at)
}

/// One entry of the index: the first message id of a Produce record of the
/// topic, and where the record starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    /// The record's first message id.
    first_id: MsgId,
    /// Where the record starts.
    pos: ReadPos,
}

/// Where a topic's messages are in the files, sparsely: an entry for a
/// Produce record of the topic only once `stride_bytes` of the topic's
/// records have passed since its last entry (and at the first of each
/// segment), so memory is about 24 bytes per `stride_bytes` of the topic's
/// log (and per segment holding it), not per message: with
/// `INDEX_STRIDE_BYTES`, 100-byte messages cost about 0.003 bytes each. A seek lands at most a stride's bytes before
/// the id, which the reader skips over at its bounded pace.
///
/// Ids of one topic grow in the log except for compaction's copies, which
/// re-append old messages at the head; those are not indexed (compaction
/// copies only messages some group still needs, which memory holds: a
/// replay reads only done messages, which compaction never copies).
pub struct SparseIndex {
    /// The stride, bytes of a topic's records between entries.
    stride_bytes: u64,
    /// Each topic's entries, in id order.
    topics: HashMap<TopicId, Topic>,
}

/// One topic's entries.
#[derive(Default)]
struct Topic {
    /// Entries in id (and log) order.
    entries: Vec<Entry>,
    /// Bytes of the topic's Produce records since its last entry.
    since_bytes: u64,
    /// The segment of its last entry.
    last_segment: Option<u64>,
    /// The highest id indexed: a record below it is a compaction copy.
    next_id: MsgId,
}

impl SparseIndex {
    /// An empty index with an entry at most every `stride_bytes`.
    pub fn new(stride_bytes: u64) -> SparseIndex {
        SparseIndex { stride_bytes, topics: HashMap::new() }
    }

    /// Bytes of a topic's records between entries.
    pub fn stride_bytes(&self) -> u64 {
        self.stride_bytes
    }

    /// The id after the highest of `topic` indexed (0: none).
    pub fn indexed_to(&self, topic: TopicId) -> MsgId {
        self.topics.get(&topic).map_or(0, |t| t.next_id)
    }

    /// Produce records of `topic` with messages `first_id..next_id`,
    /// `bytes` long in all, start at `pos`: appended now, or met in
    /// recovery. False for a compaction copy (ids below ones met before),
    /// which is not indexed.
    pub fn note(&mut self, topic: TopicId, first_id: MsgId, next_id: MsgId, bytes: u64, pos: ReadPos) -> bool {
        let t = self.topics.entry(topic).or_default();
        if first_id < t.next_id {
            return false;
        }
        t.next_id = next_id;
        let new_segment = t.last_segment != Some(pos.segment);
        if new_segment || t.since_bytes >= self.stride_bytes {
            t.entries.push(Entry { first_id, pos });
            t.since_bytes = 0;
            t.last_segment = Some(pos.segment);
        }
        t.since_bytes += bytes;
        true
    }

    /// The first id of the topic's oldest indexed record: the oldest
    /// message the files still hold in id order.
    pub fn first_id(&self, topic: TopicId) -> Option<MsgId> {
        Some(self.topics.get(&topic)?.entries.first()?.first_id)
    }

    /// Where to start reading to find message `id` of `topic`: the start
    /// of the last indexed record at or before it. None if the files hold
    /// nothing of the topic at or before it.
    pub fn seek(&self, topic: TopicId, id: MsgId) -> Option<ReadPos> {
        let entries = &self.topics.get(&topic)?.entries;
        let i = entries.partition_point(|e| e.first_id <= id);
        Some(entries.get(i.checked_sub(1)?)?.pos)
    }

    /// The segment at `base` was removed: its entries go.
    pub fn forget_segment(&mut self, base: u64) {
        for t in self.topics.values_mut() {
            t.entries.retain(|e| e.pos.segment != base);
            if t.last_segment == Some(base) {
                t.last_segment = None;
            }
        }
    }

    /// The topic was deleted: its entries go.
    pub fn forget_topic(&mut self, topic: TopicId) {
        self.topics.remove(&topic);
    }

    /// Entries held, over every topic.
    pub fn len(&self) -> usize {
        self.topics.values().map(|t| t.entries.len()).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes held, about.
    pub fn heap_bytes(&self) -> u64 {
        let per_topic = std::mem::size_of::<(TopicId, Topic)>() as u64;
        let entries: u64 = self.topics.values().map(|t| t.entries.capacity() as u64).sum();
        entries * std::mem::size_of::<Entry>() as u64 + self.topics.len() as u64 * per_topic
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::LogOptions;
    use crate::record::{MessageRecord, ProduceWriter, Record};
    use crate::testkit::{Rng, SeedGuard, TempDir, seeds};

    const TOPIC: TopicId = TopicId(1);

    /// Appends one Produce record of `payloads` (ids from `first`) and
    /// commits it.
    fn produce(log: &mut Log, first: MsgId, payloads: &[Vec<u8>]) {
        let mut w = ProduceWriter::begin(log, TOPIC);
        for (i, p) in payloads.iter().enumerate() {
            let m = MessageRecord {
                id: first + i as u64,
                born_ms: 1,
                deliveries: 0,
                dead: None,
                props: Default::default(),
                payload: p,
            };
            w.push(log, &m);
        }
        w.end(log);
        log.commit(true).expect("commit");
    }

    /// Reads until `End`, `budget_bytes` a call: the ids of every message
    /// met, and the most bytes one call handed out.
    fn read_all(log: &Log, r: &mut Reader, budget_bytes: u64) -> (Vec<MsgId>, u64) {
        let (mut ids, mut most) = (Vec::new(), 0);
        loop {
            let mut bytes = 0;
            let slice = log
                .read_slice(r, (budget_bytes, true), |rec| {
                    bytes += (RECORD_HEADER_BYTES + rec.body.len()) as u64;
                    if let Ok(Record::Produce { messages, .. }) = Record::decode(rec.kind, rec.version, rec.body) {
                        ids.extend(messages.map(|m| m.expect("a message").id));
                    }
                })
                .expect("read");
            most = most.max(bytes);
            match slice {
                Slice::More => {}
                Slice::End => return (ids, most),
                Slice::Gone => panic!("nothing was removed"),
                Slice::Full => panic!("a call that may read a larger record whole is never full"),
            }
        }
    }

    #[test]
    fn a_reader_reads_every_record_in_order_within_its_budget_a_call() {
        for seed in seeds(8) {
            let _g = SeedGuard {
                test: "a_reader_reads_every_record_in_order_within_its_budget_a_call",
                seed,
                replay: "cargo test --release --lib log_reader",
            };
            let mut rng = Rng::new(seed);
            let dir = TempDir::new("log-reader");
            let options = LogOptions { segment_bytes_max: 4096, ..LogOptions::default() };
            let (mut log, _) = Log::open(dir.path(), options, |_| Ok(())).expect("open");
            let budget = 200 + rng.below(2000);
            let (mut next, mut largest) = (1, 0);
            let mut r = Reader::new(ReadPos { segment: log.segments()[0].base, at_bytes: 0 });
            let mut got = Vec::new();
            for round in 0..3 {
                for _ in 0..20 {
                    let n = 1 + rng.below(4);
                    let payloads: Vec<Vec<u8>> = (0..n).map(|_| vec![b'x'; rng.below(700) as usize]).collect();
                    let bytes: u64 = payloads.iter().map(|p| p.len() as u64 + 40).sum();
                    largest = largest.max(bytes + 20);
                    produce(&mut log, next, &payloads);
                    next += n;
                }
                let (ids, most) = read_all(&log, &mut r, budget);
                assert!(most <= budget.max(largest), "seed {seed} round {round}: {most} bytes in one call");
                got.extend(ids);
            }
            assert_eq!(got, (1..next).collect::<Vec<_>>(), "seed {seed}: every message once, in order");
            assert!(log.segments().len() > 2, "the reader crossed segments");
        }
    }

    #[test]
    fn a_record_larger_than_the_budget_is_read_whole_and_a_removed_segment_is_gone() {
        let dir = TempDir::new("log-reader-big");
        let options = LogOptions { segment_bytes_max: 4096, ..LogOptions::default() };
        let (mut log, _) = Log::open(dir.path(), options, |_| Ok(())).expect("open");
        let first = log.segments()[0].base;
        produce(&mut log, 1, &[vec![b'b'; 3000]]);
        produce(&mut log, 2, &[vec![b's'; 10]]);
        // At the big record, where the index leads: after the segment's own
        // Write record and its write's.
        let big = ReadPos { segment: first, at_bytes: 2 * crate::log::WRITE_RECORD_BYTES as u64 };
        let mut r = Reader::new(big);
        // Not the first read of its turn: the record waits, nothing is read.
        let mut met = 0;
        assert_eq!(log.read_slice(&mut r, (64, false), |_| met += 1).expect("read"), Slice::Full);
        assert_eq!((met, r.pos()), (0, big));
        assert_eq!(log.read_slice(&mut r, (8, false), |_| met += 1).expect("read"), Slice::Full);
        let (ids, most) = read_all(&log, &mut r, 64);
        assert_eq!(ids, [1, 2]);
        assert!(most > 3000, "the big record came whole");
        produce(&mut log, 3, &[vec![b'b'; 3000]]); // rolls to a new segment
        assert!(log.close_active().expect("close") || log.segments().len() > 1);
        let mut stale = Reader::new(ReadPos { segment: first, at_bytes: 0 });
        log.remove_oldest(first).expect("remove");
        assert_eq!(log.read_slice(&mut stale, (64, true), |_| {}).expect("read"), Slice::Gone);
    }

    #[test]
    fn the_index_seeks_to_the_last_entry_at_or_before_an_id() {
        let mut ix = SparseIndex::new(1000);
        let at = |segment, at_bytes| ReadPos { segment, at_bytes };
        ix.note(TOPIC, 10, 20, 600, at(0, 0));
        ix.note(TOPIC, 20, 30, 600, at(0, 600)); // within the stride: no entry
        ix.note(TOPIC, 30, 40, 600, at(0, 1200)); // 1200 bytes since: an entry
        ix.note(TOPIC, 40, 50, 10, at(4096, 0)); // a new segment: an entry
        ix.note(TOPIC, 15, 16, 10, at(4096, 10)); // a compaction copy: none
        assert_eq!(ix.len(), 3);
        assert_eq!(ix.seek(TOPIC, 9), None);
        assert_eq!(ix.seek(TOPIC, 10), Some(at(0, 0)));
        assert_eq!(ix.seek(TOPIC, 29), Some(at(0, 0)));
        assert_eq!(ix.seek(TOPIC, 30), Some(at(0, 1200)));
        assert_eq!(ix.seek(TOPIC, 45), Some(at(4096, 0)));
        assert_eq!(ix.seek(TopicId(2), 45), None);
        ix.forget_segment(0);
        assert_eq!(ix.seek(TOPIC, 35), None, "its segment is gone");
        assert_eq!(ix.seek(TOPIC, 99), Some(at(4096, 0)));
        ix.forget_topic(TOPIC);
        assert!(ix.is_empty());
    }

    /// Memory per indexed message: a gigabyte of 100-byte messages (a
    /// Produce record each, 145 log bytes) in 64 MiB segments.
    #[test]
    fn the_index_costs_a_small_fraction_of_a_byte_per_message() {
        assert_eq!(std::mem::size_of::<Entry>(), 24);
        let mut ix = SparseIndex::new(INDEX_STRIDE_BYTES);
        let (record_bytes, segment_bytes) = (145u64, 64u64 << 20);
        let messages = (1u64 << 30) / record_bytes;
        for id in 0..messages {
            let at = id * record_bytes;
            let pos = ReadPos { segment: at / segment_bytes * segment_bytes, at_bytes: at % segment_bytes };
            ix.note(TOPIC, id, id + 1, record_bytes, pos);
        }
        let per_message = ix.heap_bytes() as f64 / messages as f64;
        assert!(ix.len() <= 1024 + 16 && per_message < 0.01, "{} entries, {per_message} bytes a message", ix.len());
        assert_eq!(
            ix.seek(TOPIC, messages - 1).map(|p| p.segment),
            Some((messages - 1) * record_bytes / segment_bytes * segment_bytes)
        );
    }
}
