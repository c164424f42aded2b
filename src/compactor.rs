//! Compaction: keeps the commit log from growing without bound under a
//! steady produce/ack load.
//!
//! The log is cleaned from its oldest end, one segment at a time, as in a
//! log-structured store: every message of the oldest segment that is still
//! live is re-appended at the head (same id, born time, delivery count and
//! dead-letter info), as are the Topic records whose latest copy is there
//! and the highest id any deleted topic had; once those copies are durable,
//! the segment file is removed. Cleaning only the oldest segment keeps
//! recovery simple: every Remove, Purge and Delete record refers to records
//! before it, so removing a prefix of the log never leaves one of them
//! pointing at something still present (or resurrects what it removed).
//!
//! When: as soon as no message of the oldest segment is live (nothing to
//! copy, only a few records to restate), and otherwise once the log is more
//! than twice the live data plus two segments; one holding a few live
//! messages costs those few. The work runs
//! in slices of at most `COMPACT_BYTES_PER_TURN` per loop turn, so it never
//! stalls the loop; the copies ride in the turn's own group commit.
//!
//! The compactor keeps, for each segment, the ids of the messages its
//! Produce records hold (a few ranges per segment), so it finds what to
//! copy in the in-memory queues without reading the file.

use std::collections::{BTreeMap, HashMap};

use super::{Broker, TopicId, put_message_record};
use crate::codec;
use crate::log::RecordKind;
use crate::queue::MsgId;

/// Most payload bytes copied forward per loop turn: some 30 µs of copying,
/// and what a turn's write (and, with a produce, its fdatasync) carries
/// extra stays small, so a compaction does not show in the loop's latency
/// (1 MiB slices did: the extra megabyte made a produce's sync a few ms
/// slower). Busy, the loop turns thousands of times a second, so this still
/// cleans hundreds of MB/s.
const COMPACT_BYTES_PER_TURN: u64 = 256 << 10;
/// Most messages copied forward per loop turn.
const COMPACT_MESSAGES_PER_TURN: u32 = 4096;
/// Log bytes a message's record takes besides its payload (ids, times,
/// lengths; dead-letter fields not counted).
const RECORD_MESSAGE_OVERHEAD_BYTES: u64 = 8 + 8 + 2 + 1 + 4;
/// Turns between checks of whether to compact, when there is no work.
const CHECK_EVERY_TURNS: u32 = 64;
/// Topic id of a Delete record that only restates the id floor.
const FLOOR_TOPIC_ID: TopicId = u32::MAX;

/// Message ids `lo..=hi` of one topic, stored in one segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    topic: TopicId,
    lo: MsgId,
    hi: MsgId,
}

/// A segment being cleaned.
#[derive(Clone, Copy, Debug)]
struct Job {
    /// Its base offset.
    base: u64,
    /// The range being copied (index into its manifest).
    range: usize,
    /// The next id to look at in that range.
    next: MsgId,
}

/// What the compactor knows of the log, and its work in progress.
#[derive(Default)]
pub(super) struct Compactor {
    /// For each segment (by base offset), the ids its Produce records hold.
    manifests: BTreeMap<u64, Vec<Range>>,
    /// The segment holding each topic's latest Topic record.
    topic_segment: HashMap<TopicId, u64>,
    /// Segments holding a Delete record (whose id floor must be restated).
    delete_segments: BTreeMap<u64, ()>,
    /// This turn's records, attached to a segment once committed.
    turn_ranges: Vec<Range>,
    /// This turn's client produces: dropped with their records if the
    /// commit fails.
    turn_client_ranges: Vec<Range>,
    turn_topics: Vec<TopicId>,
    turn_deletes: bool,
    /// The segment being cleaned.
    job: Option<Job>,
    /// A segment whose copies are in this turn's commit: removed after it.
    remove_after_commit: Option<u64>,
    /// How many ranges at the start of a segment's manifest are known to
    /// hold no live message, and which segment: a message never comes back
    /// to life, so the check for a dead segment resumes where it stopped.
    dead_ranges: (u64, usize),
    /// Turns until the next check for work.
    countdown: u32,
    /// Check for work at the next commit whatever the countdown (a segment
    /// was just removed, and the next may be due too).
    recheck: bool,
    /// Segments removed.
    pub compactions: u64,
}

fn push_range(ranges: &mut Vec<Range>, topic: TopicId, id: MsgId) {
    match ranges.last_mut() {
        Some(r) if r.topic == topic && r.hi + 1 == id => r.hi = id,
        _ => ranges.push(Range { topic, lo: id, hi: id }),
    }
}

impl Compactor {
    /// A Produce record for message `id` of `topic` was appended this turn.
    pub(super) fn note_produce(&mut self, topic: TopicId, id: MsgId) {
        push_range(&mut self.turn_ranges, topic, id);
    }
    /// As `note_produce`, for a client's produce (withdrawn on failure).
    pub(super) fn note_client_produce(&mut self, topic: TopicId, id: MsgId) {
        push_range(&mut self.turn_client_ranges, topic, id);
    }
    /// A Topic record for `topic` was appended this turn.
    pub(super) fn note_topic(&mut self, topic: TopicId) {
        self.turn_topics.push(topic);
    }
    /// A Delete record was appended this turn.
    pub(super) fn note_delete(&mut self) {
        self.turn_deletes = true;
    }
    /// Messages were freed in bulk (PURGE, DELETE): look for work at this
    /// turn's commit.
    pub(super) fn nudge(&mut self) {
        self.countdown = 0;
    }

    /// A topic was deleted: its Topic records need no restating.
    pub(super) fn forget_topic(&mut self, topic: TopicId) {
        self.topic_segment.remove(&topic);
    }

    /// Recovery met a Produce record in `segment`.
    pub(super) fn replayed_produce(&mut self, segment: u64, topic: TopicId, id: MsgId) {
        push_range(self.manifests.entry(segment).or_default(), topic, id);
    }
    pub(super) fn replayed_topic(&mut self, segment: u64, topic: TopicId) {
        self.topic_segment.insert(topic, segment);
    }
    pub(super) fn replayed_delete(&mut self, segment: u64) {
        self.delete_segments.insert(segment, ());
    }

    /// The turn's records are durable in `segment` (the log's last).
    /// Returns a segment that may now be removed.
    pub(super) fn committed(&mut self, segment: u64) -> Option<u64> {
        let m = self.manifests.entry(segment).or_default();
        for r in self.turn_ranges.drain(..).chain(self.turn_client_ranges.drain(..)) {
            match m.last_mut() {
                Some(last) if last.topic == r.topic && last.hi + 1 == r.lo => last.hi = r.hi,
                _ => m.push(r),
            }
        }
        for t in self.turn_topics.drain(..) {
            self.topic_segment.insert(t, segment);
        }
        if std::mem::take(&mut self.turn_deletes) {
            self.delete_segments.insert(segment, ());
        }
        let removable = self.remove_after_commit.take()?;
        self.manifests.remove(&removable);
        self.delete_segments.remove(&removable);
        self.compactions += 1;
        self.recheck = true;
        Some(removable)
    }

    /// The turn's commit failed: the log dropped the client produces'
    /// records and keeps the rest (copies included) for the next commit, so
    /// only those notes go; the others are attached when it succeeds.
    pub(super) fn failed(&mut self) {
        self.turn_client_ranges.clear();
    }

    /// Whether a compaction is under way (the loop should not sleep).
    pub(super) fn busy(&self) -> bool {
        self.job.is_some() || self.remove_after_commit.is_some() || self.recheck
    }

    /// Whether a segment waits for this turn's commit to be removed: that
    /// commit must sync, so the copies are durable before the original
    /// goes. (Slices before it need not sync: this sync covers them, and a
    /// roll syncs the segment it leaves.)
    pub(super) fn removal_pending(&self) -> bool {
        self.remove_after_commit.is_some()
    }
}

impl Broker {
    /// Runs one slice of compaction, appending its copies to this turn's
    /// records. Called at the start of the turn's commit.
    pub(super) fn compact_step(&mut self) {
        if self.compactor.remove_after_commit.is_some() {
            return;
        }
        let job = match self.compactor.job {
            Some(job) => job,
            None => match self.compaction_due() {
                Some(base) => Job { base, range: 0, next: 0 },
                None => return,
            },
        };
        let job = self.copy_slice(job);
        self.compactor.job = job;
    }

    /// The oldest segment, if it is due for cleaning.
    fn compaction_due(&mut self) -> Option<u64> {
        let segments = self.log.segments();
        // One removed segment's space is released at a time.
        if segments.len() < 2 || self.log.releasing() {
            return None;
        }
        let (count, oldest) = (segments.len(), segments[0].base);
        if !self.compactor.recheck && self.compactor.countdown > 0 {
            self.compactor.countdown -= 1;
            return None;
        }
        self.compactor.recheck = false;
        let live: u64 = self
            .topics
            .by_id
            .values()
            .map(|e| e.topic.seq.live_bytes() + e.topic.seq.live() * RECORD_MESSAGE_OVERHEAD_BYTES)
            .sum();
        let segment_bytes = self.log.segment_bytes_max();
        if (count >= 3 && self.log.bytes() > 2 * live + 2 * segment_bytes) || self.segment_dead(oldest) {
            return Some(oldest);
        }
        // Nothing due: look again in a while rather than every turn.
        self.compactor.countdown = CHECK_EVERY_TURNS;
        None
    }

    /// Whether no message that segment `base` stored is live.
    fn segment_dead(&mut self, base: u64) -> bool {
        let Some(ranges) = self.compactor.manifests.get(&base) else { return true };
        let (segment, mut i) = self.compactor.dead_ranges;
        if segment != base {
            i = 0;
        }
        while let Some(r) = ranges.get(i) {
            let e = self.topics.by_id.get(&r.topic);
            if e.is_some_and(|e| e.topic.seq.next_live(r.lo, r.hi + 1).is_some()) {
                break;
            }
            i += 1;
        }
        self.compactor.dead_ranges = (base, i);
        i == ranges.len()
    }

    /// Copies live messages of the job's segment forward, within the turn's
    /// budget. Returns the job to continue next turn, or None when the
    /// segment is done (and will be removed after this turn's commit).
    fn copy_slice(&mut self, mut job: Job) -> Option<Job> {
        let mut bytes = 0u64;
        let mut messages = 0u32;
        let Some(ranges) = self.compactor.manifests.get(&job.base).cloned() else {
            return self.finish_segment(job.base);
        };
        while let Some(r) = ranges.get(job.range) {
            if bytes >= COMPACT_BYTES_PER_TURN || messages >= COMPACT_MESSAGES_PER_TURN {
                return Some(job);
            }
            let from = job.next.max(r.lo);
            let Some(e) = self.topics.by_id.get(&r.topic) else {
                job.range += 1;
                job.next = 0;
                continue;
            };
            let t = &e.topic;
            // One Produce record per run of live ids, within the budget.
            let mut id = from;
            let mut count = 0u32;
            let at = self.log.begin(RecordKind::Produce);
            codec::put_u32(self.log.body(), r.topic);
            let count_at = self.log.body().len();
            codec::put_u32(self.log.body(), 0);
            while bytes < COMPACT_BYTES_PER_TURN && messages < COMPACT_MESSAGES_PER_TURN {
                let Some(live) = t.seq.next_live(id, r.hi + 1) else {
                    id = r.hi + 1;
                    break;
                };
                let Some(m) = t.seq.get(live) else { break };
                put_message_record(self.log.body(), live, m.born_ms, t.deliveries(live), t.dead_info(live), m.payload);
                self.compactor.note_produce(r.topic, live);
                bytes += m.payload.len() as u64 + RECORD_MESSAGE_OVERHEAD_BYTES;
                messages += 1;
                count += 1;
                id = live + 1;
            }
            if count == 0 {
                self.log.abandon(at);
            } else {
                let b = self.log.body();
                b[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
                self.log.end(at);
            }
            if id > r.hi {
                job.range += 1;
                job.next = 0;
            } else {
                job.next = id;
            }
        }
        self.finish_segment(job.base)
    }

    /// Restates what the segment holds besides messages — its topics'
    /// Topic records and the id floor if it held a Delete — and marks it
    /// for removal after this turn's commit.
    fn finish_segment(&mut self, base: u64) -> Option<Job> {
        let topics: Vec<TopicId> =
            self.compactor.topic_segment.iter().filter(|(_, s)| **s == base).map(|(t, _)| *t).collect();
        for t in topics {
            self.compactor.topic_segment.remove(&t);
            self.log_topic(t);
        }
        if self.compactor.delete_segments.contains_key(&base) {
            let at = self.log.begin(RecordKind::Delete);
            codec::put_u32(self.log.body(), FLOOR_TOPIC_ID);
            codec::put_u64(self.log.body(), self.topics.id_floor);
            self.log.end(at);
            self.compactor.note_delete();
        }
        self.compactor.remove_after_commit = Some(base);
        None
    }
}
