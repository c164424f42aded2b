//! Compaction: keeps the commit log from growing without bound under a
//! steady produce/ack load, and gives a full disk back once its messages
//! are gone.
//!
//! The log is cleaned from its oldest end, one segment at a time, as in a
//! log-structured store: every message of the oldest segment that is still
//! live is re-appended at the head (same id, born time, delivery count and
//! dead-letter info); then the Topic records whose latest copy is there and
//! the highest id any deleted topic had are restated, and the segment file
//! is removed. Cleaning only the oldest segment keeps recovery simple: every
//! Remove, Purge and Delete record refers to records before it, so removing
//! a prefix of the log never leaves one of them pointing at something still
//! present (or resurrects what it removed).
//!
//! When: as soon as no message of the oldest segment is live (nothing to
//! copy, only a few records to restate), and otherwise once the log is more
//! than twice the live data plus two segments. While the disk is short of
//! space (`Log::space_short`), once half the log is dead or half the oldest
//! segment is; and then the segment being appended to is closed early when
//! most of the log is dead, so that a log of one segment (a small disk,
//! 64 MiB segments) can be removed too. The copying runs in slices of at
//! most `COMPACT_BYTES_PER_TURN` per loop turn, so it never stalls the
//! loop.
//!
//! The order matters on a full disk. A cleaning is begun only if it can
//! finish: unless the disk has room for copies of the whole segment, what
//! the copies take is measured first (in slices too), and copying begins
//! only if the disk has room for all of it (`Log::copies_fit`). Copies
//! ride in the turns' own commits as records the log drops if the commit
//! fails, or when the disk has no room for them past what the copies leave
//! free (less than what produces leave, so copies go on where produces
//! stop); the job then resumes where that slice began, some turns later,
//! so a copy that cannot be written never piles up or holds up anything
//! else, and nothing is copied twice (a crash neither: recovery notes the
//! copies a cut-short cleaning wrote, `later_copies`). Once a segment's
//! copies are written, its restatement is written and synced on its own,
//! ahead of the turn's records (`Log::commit_ahead`), into the headroom the
//! log keeps free for it, and only then is the segment removed. So freeing
//! messages frees the disk even when the turn's own records (acks past the
//! room kept for them) do not fit: they are written once the removal has
//! made room. And compaction cannot fill the disk itself: what a cleaning
//! copies, the removal it ends with gives back, with the dead messages
//! besides.
//!
//! Every step of it belongs to the first half of the turn's end
//! (`Broker::write`): it appends or writes records (the copies, the
//! restatement) and changes segment files (closing the active one,
//! removing the oldest), and nothing may do either between the turn's
//! `write` and its `sync`. The second half only notes what was committed
//! (`Compactor::committed`, `Compactor::failed`).
//!
//! The compactor keeps, for each segment, the ids of the messages its
//! Produce records hold (a few ranges per segment), so it finds what to
//! copy in the in-memory queues without reading the file. It is a sibling
//! of the broker: it reads the topic table and writes the log through
//! their interfaces, and the broker tells it what each turn appended.

use std::collections::{BTreeMap, HashMap};

use crate::broker::dedup::Dedup;
use crate::broker::retain::Retained;
use crate::broker::topics::Topics;
use crate::broker::{Now, TopicId};
use crate::failure_log::FailureLog;
use crate::log::{HEADROOM_BYTES_MIN, Log};
use crate::queue::{GroupId, MsgId};
use crate::record::{self, DeleteRecord, MessageRecord, ProduceWriter};

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
const RECORD_MESSAGE_OVERHEAD_BYTES: u64 = record::message_record_bytes(0, 0, false);
/// Turns between checks of whether to compact, when there is no work (and
/// the space is not short: then every turn checks).
const CHECK_EVERY_TURNS: u32 = 64;
/// Turns before compaction tries again after a write of its own failed: a
/// disk that refuses the copies or the restatement now will likely refuse
/// them next turn too, and each try costs a slice of copying (or a sync).
const RETRY_AFTER_TURNS: u32 = 64;

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
    /// While its live messages are measured, before any is copied. None
    /// once copying.
    measuring: Option<Measure>,
}

/// What is known, while measuring, of what copying a segment takes.
#[derive(Clone, Copy, Debug)]
struct Measure {
    /// Log bytes the copies of the live messages seen so far take.
    bytes: u64,
    /// The most they may take for the cleaning to be worth it.
    bytes_max: u64,
    /// The log bytes of every live message when it began.
    live_bytes: u64,
}

/// What a slice of copying left.
enum Slice {
    /// More to copy next turn.
    More(Job),
    /// Every live message is copied; `copied` says whether this slice
    /// appended any (then they must be written before the segment goes).
    Done { copied: bool },
}

/// What the compactor knows of the log, and its work in progress.
#[derive(Default)]
pub(crate) struct Compactor {
    /// For each segment (by base offset), the ids its Produce records hold.
    manifests: BTreeMap<u64, Vec<Range>>,
    /// For each segment, the ids of the messages its Produce records hold
    /// a later copy of, as recovery found them (an earlier segment stored
    /// them already: a cleaning a crash cut short copied them, and the
    /// cleaning after the restart began again). A cleaning of an earlier
    /// segment leaves them, their latest copy being here, so a crash does
    /// not make copies pile up.
    later_copies: BTreeMap<u64, Vec<Range>>,
    /// The segment holding each topic's latest Topic record.
    topic_segment: HashMap<TopicId, u64>,
    /// Segments holding a Delete record (whose id floor must be restated).
    delete_segments: BTreeMap<u64, ()>,
    /// The oldest segment holding a record of each consumer group (Group,
    /// GroupState, Remove, Requeue): before it goes, the group's state is
    /// restated (a Group and a GroupState record), so that the acks it
    /// held are never lost while a copy of their message lives on for
    /// another group.
    group_segment: HashMap<(TopicId, GroupId), u64>,
    /// Groups with records in this turn's commit.
    turn_groups: Vec<(TopicId, GroupId)>,
    /// The oldest segment holding a record of each topic's dedup window (a
    /// Produce record of a message with a dedup id, or a Dedup record):
    /// before it goes, the topic's whole window is restated in a Dedup
    /// record, so that no id is forgotten inside its window when the
    /// records of acked messages go (protocol version 4).
    dedup_segment: HashMap<TopicId, u64>,
    /// Topics with dedup ids in this turn's commit.
    turn_dedup: Vec<TopicId>,
    /// This turn's Produce records that a failed commit keeps (dead
    /// letters, redrives, ACK_PRODUCE outputs), attached to a segment once
    /// committed.
    turn_ranges: Vec<Range>,
    /// This turn's client produces: dropped with their records if the
    /// commit fails, or the disk has no room for them.
    turn_produce_ranges: Vec<Range>,
    /// This turn's compaction copies: dropped with their records as the
    /// produces are (after them on a full disk).
    turn_copy_ranges: Vec<Range>,
    turn_topics: Vec<TopicId>,
    turn_deletes: bool,
    /// The acks of ACK_PRODUCE records not yet committed (this turn's, and
    /// those a failed commit keeps): topic, group, id, and its delivery
    /// count before the ack. Until the record is durable, a restatement
    /// states these messages as still pending, and a segment holding one
    /// of them is not removed: a crash before the record's write must find
    /// the input owed, as the lost record left it. As many as the acks of
    /// the records the log holds for its next commit.
    unwritten_acks: Vec<(TopicId, GroupId, MsgId, u16)>,
    /// The deliveries of Deliver records not yet committed (kept across a
    /// failed commit, as the records are), by topic, group and id. A
    /// restatement written ahead of them states each message's count
    /// without them, since replay adds one per delivery it reads after the
    /// restatement. As many as the ids of the records the log holds for
    /// its next commit.
    unwritten_deliveries: Vec<(TopicId, GroupId, MsgId)>,
    /// The segment being cleaned.
    job: Option<Job>,
    /// The job as it was before this turn's slice of copies: where it
    /// resumes if they are dropped, so that no message is copied twice
    /// (and no copy left behind takes the disk).
    slice_from: Option<Job>,
    /// A segment whose last copies are in this turn's commit.
    copied: Option<u64>,
    /// A segment whose copies are all written: restated and removed by the
    /// next turn's compaction step.
    ready: Option<u64>,
    /// How many ranges at the start of a segment's manifest are known to
    /// hold no live message, and which segment: a message never comes back
    /// to life, so the check for a dead segment resumes where it stopped.
    dead_ranges: (u64, usize),
    /// A segment whose cleaning was found not worth it (too much of it
    /// live), and the log bytes of every live message then: it is not
    /// measured again until some message is freed (a message never comes
    /// back to life).
    not_worth: Option<(u64, u64)>,
    /// Turns until the next check for work.
    countdown: u32,
    /// Turns before trying again after a failed write of compaction's own.
    backoff: u32,
    /// Check for work at the next turn whatever the countdown (a segment
    /// was just removed, and the next may be due too).
    recheck: bool,
    /// Segments removed.
    pub compactions: u64,
    /// Where each topic's messages are in the files: what retention keeps
    /// and replay reads.
    pub(crate) retained: Retained,
}

fn push_range(ranges: &mut Vec<Range>, topic: TopicId, id: MsgId) {
    match ranges.last_mut() {
        Some(r) if r.topic == topic && r.hi + 1 == id => r.hi = id,
        _ => ranges.push(Range { topic, lo: id, hi: id }),
    }
}

impl Compactor {
    /// A Produce record for message `id` of `topic` was appended this turn.
    pub(crate) fn note_produce(&mut self, topic: TopicId, id: MsgId) {
        push_range(&mut self.turn_ranges, topic, id);
    }
    /// As `note_produce`, for a client's produce (withdrawn on failure).
    pub(crate) fn note_client_produce(&mut self, topic: TopicId, id: MsgId) {
        push_range(&mut self.turn_produce_ranges, topic, id);
    }
    /// An AckProduce record acking `acks` (id, delivery count before the
    /// ack) of group `group` of `topic` was appended this turn.
    pub(crate) fn note_ack_produce(&mut self, topic: TopicId, group: GroupId, acks: &[(MsgId, u16)]) {
        self.unwritten_acks.extend(acks.iter().map(|&(id, d)| (topic, group, id, d)));
    }
    /// A Deliver record of group `group` of `topic` naming `ids` was
    /// appended.
    pub(crate) fn note_delivered(&mut self, topic: TopicId, group: GroupId, ids: &[MsgId]) {
        self.note_group(topic, group);
        self.unwritten_deliveries.extend(ids.iter().map(|&id| (topic, group, id)));
    }
    /// A message with a dedup id was produced to `topic` this turn.
    pub(crate) fn note_dedup(&mut self, topic: TopicId) {
        if !self.dedup_segment.contains_key(&topic) && !self.turn_dedup.contains(&topic) {
            self.turn_dedup.push(topic);
        }
    }
    /// Recovery met a record of `topic`'s dedup window in `segment`.
    pub(crate) fn replayed_dedup(&mut self, segment: u64, topic: TopicId) {
        self.dedup_segment.entry(topic).or_insert(segment);
    }
    /// A Topic record for `topic` was appended this turn.
    pub(crate) fn note_topic(&mut self, topic: TopicId) {
        self.turn_topics.push(topic);
    }
    /// A record of group `group` of `topic` was appended this turn.
    pub(crate) fn note_group(&mut self, topic: TopicId, group: GroupId) {
        if !self.group_segment.contains_key(&(topic, group)) && !self.turn_groups.contains(&(topic, group)) {
            self.turn_groups.push((topic, group));
        }
    }
    /// A group was deleted: its records need no restating.
    pub(crate) fn forget_group(&mut self, topic: TopicId, group: GroupId) {
        self.group_segment.remove(&(topic, group));
        self.turn_groups.retain(|g| *g != (topic, group));
    }
    /// Recovery met a record of group `group` in `segment`.
    pub(crate) fn replayed_group(&mut self, segment: u64, topic: TopicId, group: GroupId) {
        self.group_segment.entry((topic, group)).or_insert(segment);
    }
    /// A Delete record was appended this turn.
    pub(crate) fn note_delete(&mut self) {
        self.turn_deletes = true;
    }
    /// Messages were freed in bulk (PURGE, DELETE): look for work at the
    /// end of this turn, even right after a failure.
    pub(crate) fn nudge(&mut self) {
        self.countdown = 0;
        self.backoff = 0;
    }

    /// A topic was deleted: its Topic records need no restating.
    pub(crate) fn forget_topic(&mut self, topic: TopicId) {
        self.topic_segment.remove(&topic);
        self.dedup_segment.remove(&topic);
        self.turn_dedup.retain(|t| *t != topic);
        self.group_segment.retain(|(t, _), _| *t != topic);
        self.turn_groups.retain(|(t, _)| *t != topic);
        self.retained.forget_topic(topic);
    }

    /// Recovery met a Produce record in `segment`.
    pub(crate) fn replayed_produce(&mut self, segment: u64, topic: TopicId, id: MsgId) {
        push_range(self.manifests.entry(segment).or_default(), topic, id);
    }
    /// Recovery met, in `segment`, a copy of message `id` of `topic`, which
    /// an earlier record (of an earlier segment) stores too.
    pub(crate) fn replayed_copy(&mut self, segment: u64, topic: TopicId, id: MsgId) {
        push_range(self.later_copies.entry(segment).or_default(), topic, id);
    }
    pub(crate) fn replayed_topic(&mut self, segment: u64, topic: TopicId) {
        self.topic_segment.insert(topic, segment);
    }
    pub(crate) fn replayed_delete(&mut self, segment: u64) {
        self.delete_segments.insert(segment, ());
    }

    /// The turn's records are durable in `segment` (the log's last).
    pub(crate) fn committed(&mut self, segment: u64) {
        let m = self.manifests.entry(segment).or_default();
        let withdrawable = self.turn_produce_ranges.drain(..).chain(self.turn_copy_ranges.drain(..));
        for r in self.turn_ranges.drain(..).chain(withdrawable) {
            match m.last_mut() {
                Some(last) if last.topic == r.topic && last.hi + 1 == r.lo => last.hi = r.hi,
                _ => m.push(r),
            }
        }
        for t in self.turn_topics.drain(..) {
            self.topic_segment.insert(t, segment);
        }
        for g in self.turn_groups.drain(..) {
            self.group_segment.entry(g).or_insert(segment);
        }
        for t in self.turn_dedup.drain(..) {
            self.dedup_segment.entry(t).or_insert(segment);
        }
        if std::mem::take(&mut self.turn_deletes) {
            self.delete_segments.insert(segment, ());
        }
        self.unwritten_acks.clear();
        self.unwritten_deliveries.clear();
        self.slice_from = None;
        // A segment held back for an ACK_PRODUCE stays ready.
        if let Some(base) = self.copied.take() {
            self.ready = Some(base);
        }
        assert!(self.turn_ranges.is_empty() && self.turn_produce_ranges.is_empty() && self.turn_topics.is_empty());
        assert!(self.turn_groups.is_empty());
    }

    /// The turn's records were discarded, not written (a memory-only log):
    /// there is no segment to note them in, and nothing to compact.
    pub(crate) fn discarded(&mut self) {
        self.turn_ranges.clear();
        self.turn_produce_ranges.clear();
        self.turn_copy_ranges.clear();
        self.slice_from = None;
        self.turn_topics.clear();
        self.turn_dedup.clear();
        self.turn_deletes = false;
        self.unwritten_acks.clear();
        self.unwritten_deliveries.clear();
    }

    /// The turn's commit failed: the log dropped the client produces' and
    /// the copies' records and keeps the rest for the next commit, so only
    /// those notes go (the others are attached when it succeeds), and a
    /// cleaning under way is put off (`put_off`).
    pub(crate) fn failed(&mut self) {
        self.turn_produce_ranges.clear();
        self.put_off();
    }

    /// The turn's write dropped its client produces (`produces`) and maybe
    /// compaction's copies too (`copies`) for want of space, and wrote the
    /// rest: those notes go, and a cleaning whose copies went is put off.
    pub(crate) fn withdrawn(&mut self, produces: bool, copies: bool) {
        if produces {
            self.turn_produce_ranges.clear();
        }
        if copies {
            self.put_off();
        }
    }

    /// This turn's copies were not written: the cleaning resumes where the
    /// slice began, some turns later, so that what earlier slices copied
    /// is not copied again.
    fn put_off(&mut self) {
        self.turn_copy_ranges.clear();
        if let Some(job) = self.slice_from.take() {
            self.job = Some(job);
            self.copied = None;
            self.backoff = RETRY_AFTER_TURNS;
        }
    }

    /// The log dropped the records it kept for the next commit (they
    /// passed `unwritten_records_bytes_max`; `Log::take_unwritten_dropped`):
    /// every note of them goes with them, so these lists never outgrow what
    /// the log keeps, and nothing waits for a record that will never be
    /// written. The acks of a dropped ACK_PRODUCE then hold back no
    /// segment (they would only until the next commit anyway, which clears
    /// them): memory and the log disagree from here on, as the log's error
    /// line warns.
    pub(crate) fn dropped(&mut self) {
        self.discarded();
        self.turn_groups.clear();
    }

    /// How many notes of records not yet committed the compactor holds
    /// (tests bound them by what the log keeps).
    #[cfg(test)]
    pub(crate) fn unwritten_notes(&self) -> usize {
        self.turn_ranges.len()
            + self.turn_produce_ranges.len()
            + self.turn_copy_ranges.len()
            + self.turn_topics.len()
            + self.turn_groups.len()
            + self.turn_dedup.len()
            + self.unwritten_acks.len()
            + self.unwritten_deliveries.len()
    }

    /// Whether compaction wants another turn soon (the loop should not
    /// sleep). A segment held back for an ACK_PRODUCE whose commit failed waits
    /// for the next commit without spinning the loop, and a cleaning put
    /// off waits for the turns of its backoff.
    pub(crate) fn busy(&self) -> bool {
        if self.backoff > 0 {
            return false;
        }
        let ready = self.ready.is_some() && self.unwritten_acks.is_empty();
        self.job.is_some() || self.copied.is_some() || ready || self.recheck
    }

    /// Whether segment `base` holds a message an ACK_PRODUCE not yet
    /// written acks: acked in memory, it is not copied forward, so the
    /// segment waits for the record (one turn, unless its commit fails).
    fn holds_unwritten_ack(&self, base: u64) -> bool {
        let Some(ranges) = self.manifests.get(&base) else { return false };
        let held = |&(t, _, id, _): &(TopicId, GroupId, MsgId, u16)| {
            ranges.iter().any(|r| r.topic == t && (r.lo..=r.hi).contains(&id))
        };
        self.unwritten_acks.iter().any(held)
    }

    /// Segment `base` was restated into `last`, ahead of its removal.
    fn restated(&mut self, base: u64, last: u64, topics: &[TopicId], groups: &[(TopicId, GroupId)], floor: bool) {
        for &t in topics {
            self.topic_segment.insert(t, last);
        }
        for &g in groups {
            self.group_segment.insert(g, last);
        }
        if floor {
            self.delete_segments.insert(last, ());
        }
        self.manifests.remove(&base);
        self.later_copies.remove(&base);
        self.delete_segments.remove(&base);
        self.recheck = true;
    }
}

/// What a compaction step works on, lent by the broker for the step.
struct Parts<'a> {
    topics: &'a Topics,
    dedup: &'a Dedup,
    log: &'a mut Log,
    failures: &'a mut FailureLog,
}

impl Compactor {
    /// Runs one step of compaction: restates and removes a segment whose
    /// copies are written, or copies a slice of the oldest segment's live
    /// messages into this turn's records. Called by `Broker::write`, before
    /// the turn's records are written.
    pub(crate) fn step(
        &mut self,
        (topics, dedup): (&Topics, &Dedup),
        log: &mut Log,
        failures: &mut FailureLog,
        now: Now,
    ) {
        let mut p = Parts { topics, dedup, log, failures };
        // After a write of its own failed, or copies that did not fit.
        if self.backoff > 0 {
            self.backoff -= 1;
            return;
        }
        if let Some(base) = self.ready.take() {
            self.finish_segment(&mut p, base, now);
            return;
        }
        let job = match self.job.take() {
            Some(job) => job,
            None => match self.compaction_due(&mut p, now) {
                Some((base, copies_bytes_max, live)) => begin_job(p.log, base, (copies_bytes_max, live)),
                None => return,
            },
        };
        if job.measuring.is_some() {
            self.measure_slice(&mut p, job);
            return;
        }
        let base = job.base;
        match self.walk_slice(&mut p, job, true, &mut Budget::default()) {
            Slice::More(next) => {
                self.slice_from = Some(job);
                self.job = Some(next);
            }
            Slice::Done { copied: true } => {
                self.slice_from = Some(job);
                self.copied = Some(base);
            }
            Slice::Done { copied: false } => self.finish_segment(&mut p, base, now),
        }
    }

    /// Measures a slice of what copying the job's segment forward takes;
    /// once all of it is measured, copies it if the disk has room for all
    /// of it and the copies' headroom after it (`Log::copies_fit`), and
    /// otherwise puts the cleaning off. So a cleaning is begun only if it
    /// can finish: its copies never stop halfway, holding space that only
    /// the removal they wait for would give back.
    fn measure_slice(&mut self, p: &mut Parts<'_>, job: Job) {
        let Some(mut m) = job.measuring else { return };
        let mut budget = Budget::default();
        let slice = self.walk_slice(p, job, false, &mut budget);
        m.bytes += budget.bytes;
        let (base, bytes) = (job.base, m.bytes);
        match slice {
            // Measured again once a message is freed.
            _ if bytes > m.bytes_max => {
                self.not_worth = Some((base, m.live_bytes));
                log::debug!("compaction leaves segment {base}: its copies would take {bytes} bytes or more");
            }
            Slice::More(next) => self.job = Some(Job { measuring: Some(m), ..next }),
            Slice::Done { .. } if bytes == 0 || p.log.copies_fit(bytes) => {
                self.job = Some(Job { base, range: 0, next: 0, measuring: None });
            }
            Slice::Done { .. } => {
                self.backoff = RETRY_AFTER_TURNS;
                log::debug!("compaction puts off segment {base}: no room for its {bytes} bytes of copies");
            }
        }
    }

    /// The oldest segment, if it is due for cleaning, the most bytes its
    /// copies may take for the cleaning to be worth it (`u64::MAX`: any),
    /// and the log bytes of every live message. While the space is short,
    /// first closes the active segment if most of the log is dead.
    fn compaction_due(&mut self, p: &mut Parts<'_>, now: Now) -> Option<(u64, u64, u64)> {
        let short = p.log.space_short();
        // The release thread's queue of removed segments is full.
        if p.log.releasing() {
            return None;
        }
        if !short && !self.recheck && self.countdown > 0 {
            self.countdown -= 1;
            return None;
        }
        self.recheck = false;
        // Nothing due: look again in a while rather than every turn.
        self.countdown = CHECK_EVERY_TURNS;
        let (live, restate) = live_and_restate_bytes(p.topics);
        let restate = restate + p.dedup.restate_bytes();
        p.log.set_headroom_bytes(restate);
        if short && !self.close_active_if_dead(p, live, now) {
            return None;
        }
        let segments = p.log.segments();
        if segments.len() < 2 {
            return None;
        }
        let oldest = segments[0].base;
        // A segment a topic retains stays, unless the disk is short of
        // space: then retention yields.
        if !short && self.retained.keeps(oldest, p.topics, now.wall_ms) {
            return None;
        }
        let bytes = p.log.bytes();
        let due = (short && bytes > 2 * live)
            || (segments.len() >= 3 && bytes > 2 * live + 2 * p.log.segment_bytes_max())
            || self.segment_dead(p.topics, oldest);
        if due {
            return Some((oldest, u64::MAX, live));
        }
        // Short of space, the oldest segment is worth cleaning by itself
        // if at least half of it is dead: what its removal gives back is
        // then at least what its copies take.
        let judged = self.not_worth.is_some_and(|(base, then)| base == oldest && live >= then);
        (short && !judged).then_some((oldest, segments[0].bytes / 2, live))
    }

    /// Closes the active segment if at least half of it, and at least the
    /// least headroom, would be freed by cleaning it (with the default
    /// 64 MiB segments, a small disk fills before one closes by size).
    /// Returns false if closing failed.
    fn close_active_if_dead(&mut self, p: &mut Parts<'_>, live: u64, now: Now) -> bool {
        let active_bytes = p.log.segments().last().map_or(0, |s| s.bytes);
        if active_bytes < HEADROOM_BYTES_MIN.max(2 * live) {
            return true;
        }
        match p.log.close_active() {
            Ok(_) => true,
            Err(e) => {
                self.backoff = RETRY_AFTER_TURNS;
                p.failures.failed(now.mono_ms, format_args!("compaction could not close the active segment: {e}"));
                false
            }
        }
    }

    /// Whether no message that segment `base` stored is live.
    fn segment_dead(&mut self, topics: &Topics, base: u64) -> bool {
        let Some(ranges) = self.manifests.get(&base) else { return true };
        let (segment, mut i) = self.dead_ranges;
        if segment != base {
            i = 0;
        }
        while let Some(r) = ranges.get(i) {
            let e = topics.get(r.topic);
            if e.is_some_and(|e| e.topic.seq.next_live(r.lo, r.hi + 1).is_some()) {
                break;
            }
            i += 1;
        }
        self.dead_ranges = (base, i);
        i == ranges.len()
    }

    /// Copies live messages of the job's segment forward (if `copy`; else
    /// only counts what that takes, in `budget`), within the turn's budget,
    /// as records dropped if the commit fails.
    fn walk_slice(&mut self, p: &mut Parts<'_>, mut job: Job, copy: bool, budget: &mut Budget) -> Slice {
        let Some(ranges) = self.manifests.get(&job.base).cloned() else {
            return Slice::Done { copied: false };
        };
        while let Some(r) = ranges.get(job.range) {
            if budget.spent() {
                return Slice::More(job);
            }
            let next = match p.topics.get(r.topic) {
                Some(e) => {
                    let later = self.copied_later(job.base, r);
                    self.copy_run(p.log, (&e.topic, r, &later), job.next.max(r.lo), budget, copy)
                }
                None => r.hi + 1,
            };
            if next > r.hi {
                job.range += 1;
                job.next = 0;
            } else {
                job.next = next;
            }
        }
        Slice::Done { copied: budget.messages > 0 }
    }

    /// The ids of range `r` of segment `base` that a later segment holds
    /// a copy of (`later_copies`), as (first, last).
    fn copied_later(&self, base: u64, r: &Range) -> Vec<(MsgId, MsgId)> {
        let later = self.later_copies.range(base + 1..).flat_map(|(_, copies)| copies);
        later.filter(|c| c.topic == r.topic && c.lo <= r.hi && r.lo <= c.hi).map(|c| (c.lo, c.hi)).collect()
    }

    /// Copies the live messages of range `r` of topic `t` from id `from`
    /// on, but for those `later` a later segment holds a copy of, as one
    /// Produce record, until the budget is spent (only counts what that
    /// takes, unless `copy`); returns the next id to look at (past `r.hi`
    /// once the range is done).
    fn copy_run(
        &mut self,
        log: &mut Log,
        (t, r, later): (&crate::queue::Topic, &Range, &[(MsgId, MsgId)]),
        from: MsgId,
        budget: &mut Budget,
        copy: bool,
    ) -> MsgId {
        let mut id = from;
        let mut w = copy.then(|| ProduceWriter::begin(log, r.topic));
        // The record's own fields, counted with its first message.
        let mut record = record::PRODUCE_RECORD_FIXED_BYTES;
        while !budget.spent() {
            let Some(live) = t.seq.next_live(id, r.hi + 1) else {
                id = r.hi + 1;
                break;
            };
            if let Some(&(_, last)) = later.iter().find(|c| (c.0..=c.1).contains(&live)) {
                id = last + 1;
                continue;
            }
            let Some(m) = t.seq.get(live) else { break };
            let (deliveries, dead) = (t.deliveries(GroupId::DEFAULT, live), t.seq.dead_info(live));
            // A copy of a message whose time came carries no delivery time:
            // the Due record that said so may go with this segment.
            let untimed = (m.props.schedule().is_some() && !t.seq.scheduled(live))
                .then(|| crate::codec::props::without_schedule(&m.props));
            let (props, payload) = (untimed.as_deref().map_or(m.props, crate::codec::Props::trusted), m.payload);
            let bytes = record::message_record_bytes(payload.len() as u64, props.bytes().len() as u64, dead.is_some());
            budget.bytes += std::mem::take(&mut record) + bytes;
            budget.messages += 1;
            if let Some(w) = w.as_mut() {
                w.push(log, &MessageRecord { id: live, born_ms: m.born_ms, deliveries, dead, props, payload });
                push_range(&mut self.turn_copy_ranges, r.topic, live);
            }
            id = live + 1;
        }
        // A record with no message is dropped.
        if let Some(w) = w {
            w.end_copy(log);
        }
        id
    }

    /// Restates what segment `base` holds besides messages — its topics'
    /// Topic records and the id floor if it held a Delete — ahead of the
    /// turn's records, synced with the copies written before; then removes
    /// the segment. If that write fails, tries again later.
    fn finish_segment(&mut self, p: &mut Parts<'_>, base: u64, now: Now) {
        // Only the oldest segment is cleaned, and nothing else removes one.
        let segments = p.log.segments();
        assert!(segments.len() >= 2 && segments[0].base == base, "segment {base} is not the oldest closed one");
        if self.holds_unwritten_ack(base) {
            self.ready = Some(base);
            return;
        }
        let aside = p.log.set_aside();
        let mut topics: Vec<TopicId> =
            self.topic_segment.iter().filter(|(_, s)| **s == base).map(|(t, _)| *t).collect();
        topics.retain(|&t| p.topics.record(t).map(|r| r.append(p.log)).is_some());
        let mut groups: Vec<(TopicId, GroupId)> =
            self.group_segment.iter().filter(|(_, s)| **s == base).map(|(g, _)| *g).collect();
        let unwritten = Unwritten { acks: &self.unwritten_acks, deliveries: &self.unwritten_deliveries };
        groups.retain(|&(t, g)| restate_group(p.topics, p.log, t, g, unwritten));
        let windows = self.restate_dedup(p, base);
        let floor = self.delete_segments.contains_key(&base);
        if floor {
            DeleteRecord { topic: TopicId::FLOOR, next_id: p.topics.id_floor() }.append(p.log);
        }
        if let Err(e) = p.log.commit_ahead(aside) {
            self.backoff = RETRY_AFTER_TURNS;
            // Its copies are written: it is restated once the backoff is
            // over, not copied again.
            self.ready = Some(base);
            p.failures.failed(now.mono_ms, format_args!("compaction could not restate segment {base}: {e}"));
            return;
        }
        let last = p.log.segments().last().map_or(0, |s| s.base);
        self.restated(base, last, &topics, &groups, floor);
        for t in windows {
            self.dedup_segment.insert(t, last);
        }
        match p.log.remove_oldest(base) {
            Ok(()) => {
                self.compactions += 1;
                self.retained.forget_segment(base);
                log::debug!("compaction removed segment {base}");
            }
            // A segment that cannot be removed (its file gone from under
            // the broker, a failing disk) is tried again after a backoff
            // and logged at the storage failures' bounded rate, not every
            // turn.
            Err(e) => {
                self.backoff = RETRY_AFTER_TURNS;
                p.failures.failed(now.mono_ms, format_args!("compaction could not remove segment {base}: {e}"));
            }
        }
    }
}

/// What the log's turn buffer holds and a restatement written ahead of it
/// must not state yet: the acks of ACK_PRODUCE records (topic, group, id,
/// delivery count before the ack) and the deliveries of Deliver records
/// (topic, group, id).
#[derive(Clone, Copy)]
struct Unwritten<'a> {
    acks: &'a [(TopicId, GroupId, MsgId, u16)],
    deliveries: &'a [(TopicId, GroupId, MsgId)],
}

impl Unwritten<'_> {
    /// Takes the unwritten deliveries of group `g` of `t` off the counts of
    /// `entries` (sorted by id), whose first field is the id and whose
    /// count `count` gets.
    fn uncount<E>(
        &self,
        t: TopicId,
        g: GroupId,
        entries: &mut [E],
        id_of: impl Fn(&E) -> MsgId,
        count: impl Fn(&mut E) -> &mut u16,
    ) {
        for d in self.deliveries.iter().filter(|d| d.0 == t && d.1 == g) {
            if let Ok(i) = entries.binary_search_by_key(&d.2, &id_of) {
                let c = count(&mut entries[i]);
                *c = c.saturating_sub(1);
            }
        }
    }
}

impl Compactor {
    /// Appends a Dedup record for each topic whose oldest dedup record is
    /// in segment `base`, stating its window as it is now; returns the
    /// topics restated (those whose window is empty need none any more).
    fn restate_dedup(&mut self, p: &mut Parts<'_>, base: u64) -> Vec<TopicId> {
        let mut topics: Vec<TopicId> =
            self.dedup_segment.iter().filter(|(_, s)| **s == base).map(|(t, _)| *t).collect();
        topics.retain(|&t| {
            let live = p.dedup.entries_of(t) > 0 && p.topics.get(t).is_some();
            if live {
                record::DedupRecord::append(t, p.dedup.entries_in(t), p.log);
            } else {
                self.dedup_segment.remove(&t);
            }
            live
        });
        topics
    }
}

/// Appends a Group and a GroupState record stating group `g` of topic `t`
/// as it is now, but for what `unwritten` holds: the acks of ACK_PRODUCE
/// records not yet written, whose messages it states as pending, and the
/// deliveries of Deliver records not yet written, which it leaves out of
/// the counts (replay adds them when it reads the records). False if
/// there is no such group.
fn restate_group(topics: &Topics, log: &mut Log, t: TopicId, g: GroupId, unwritten: Unwritten<'_>) -> bool {
    let Some(group) = topics.get(t).and_then(|e| e.topic.group(g)) else { return false };
    group_record(t, group).append(log);
    let mut entries = group.pending();
    let owed = unwritten.acks.iter().filter(|a| a.0 == t && a.1 == g).map(|a| (a.2, a.3));
    entries.extend(owed);
    entries.sort_unstable();
    entries.dedup_by_key(|e| e.0);
    unwritten.uncount(t, g, &mut entries, |e| e.0, |e| &mut e.1);
    record::GroupStateRecord { topic: t, group: g, cursor: group.cursor(), entries: &entries }.append(log);
    // Which of them are back in the group, not in flight: a restart
    // dead-letters one in flight at its last allowed delivery, not these.
    let mut returned = group.returned();
    if !returned.is_empty() {
        unwritten.uncount(t, g, &mut returned, |e| e.0, |e| &mut e.1);
        record::RequeueRecord { topic: t, group: g, entries: &returned }.append(log);
    }
    // The GroupState lists its delayed messages without their delays:
    // NACK delays, then retry waits.
    for retry in [false, true] {
        let mut delays = group.delays(retry);
        if !delays.is_empty() {
            unwritten.uncount(t, g, &mut delays, |e| e.0, |e| &mut e.1);
            record::DelayRecord { topic: t, group: g, retry, entries: &delays }.append(log);
        }
    }
    record::NackReasonRecord { topic: t, group: g, entries: &group.nack_reasons() }.append(log);
    true
}

/// The Group record stating `group` of topic `t`, its cursor as it is now.
pub(crate) fn group_record(t: TopicId, group: &crate::queue::Group) -> record::GroupRecord<'_> {
    let c = &group.config;
    record::GroupRecord {
        topic: t,
        group: group.id(),
        broadcast: c.broadcast,
        ordered: c.ordered,
        ack_timeout_ms: c.ack_timeout_ms,
        max_deliveries: c.max_deliveries,
        cursor: group.cursor(),
        name: group.name(),
        filter: &c.filter_text,
        retry: c.retry,
    }
}

/// A cleaning of segment `base`, the oldest, worth it if its copies take
/// at most `copies_bytes_max` (the live messages then took `live_bytes`):
/// copying at once if that is any and the disk
/// has room for copies of the whole segment (twice its bytes: a copy of a
/// message takes no more than the message did, and a copy record's own
/// fields no more than the message it holds), and otherwise measuring its
/// live messages first.
fn begin_job(log: &mut Log, base: u64, (copies_bytes_max, live_bytes): (u64, u64)) -> Job {
    let bytes = log.segments().first().map_or(0, |s| s.bytes);
    let unbounded = copies_bytes_max == u64::MAX && log.copies_fit(2 * bytes);
    let measuring = (!unbounded).then_some(Measure { bytes: 0, bytes_max: copies_bytes_max, live_bytes });
    Job { base, range: 0, next: 0, measuring }
}

/// What a turn's slice of copying has spent of its budget.
#[derive(Default)]
struct Budget {
    /// Log bytes of the copies (their records' own fields included).
    bytes: u64,
    /// Messages copied.
    messages: u32,
}

impl Budget {
    fn spent(&self) -> bool {
        self.bytes >= COMPACT_BYTES_PER_TURN || self.messages >= COMPACT_MESSAGES_PER_TURN
    }
}

/// The log bytes of every live message, and of restating every topic and
/// the id floor (what the log's headroom must hold).
fn live_and_restate_bytes(topics: &Topics) -> (u64, u64) {
    let mut live = 0;
    let mut restate = DeleteRecord::BYTES;
    for e in topics.iter() {
        live += e.topic.seq.live_bytes() + e.topic.seq.live() * RECORD_MESSAGE_OVERHEAD_BYTES;
        restate += record::TopicRecord::bytes(e.topic.name.len());
        for g in e.topic.groups() {
            restate += group_record(e.id, g).bytes() + record::GroupStateRecord::bytes(g.pending_len());
            restate += record::RequeueRecord::bytes(g.returned_len());
            // Two Delay records: NACK delays and retry waits.
            restate += record::DelayRecord::bytes(g.delayed() as usize) + record::DelayRecord::bytes(0);
            let (reasons, reason_bytes) = g.nack_reasons_size();
            restate += record::NackReasonRecord::bytes(reasons, reason_bytes);
        }
    }
    (live, restate)
}
