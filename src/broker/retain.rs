//! Retention (protocol version 4): what the commit log holds of each
//! topic, so that compaction keeps the segments a retaining topic still
//! needs and no other, and replay finds a topic's messages in the files.
//!
//! `Retained` learns where every Produce record (and every output of an
//! AckProduce record) went, from each committed
//! turn (`Log::take_kept_turn`) and from recovery, into two small maps: a
//! `SparseIndex` (an entry per megabyte of a topic's records) and, per
//! segment and topic, the bytes of the topic's records and when the newest
//! was written. Both cost memory per segment, never per message, and are
//! kept for every topic (a topic may start retaining later; recovery meets
//! records before the Topic record that says whether their topic retains).
//! A compaction copy (a message re-appended at the head) is not counted:
//! its message is live, in memory, and replay reads only what the index
//! leads to.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::requests::Refusal;
use super::topics::Topics;
use super::{Broker, TopicId};
use crate::codec::{ErrorCode, TopicOptions};
use crate::log::reader::{INDEX_STRIDE_BYTES, ReadPos, SparseIndex};
use crate::log::{Log, RECORD_HEADER_BYTES, ReadRecord, RecordKind};
use crate::queue::{GroupId, MsgId, Retention, Topic};
use crate::record::{Messages, Record};

/// What one segment holds of one topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    topic: TopicId,
    /// Bytes of the topic's Produce records in the segment, headers
    /// included.
    bytes: u64,
    /// When the newest of them was written: wall clock ms (its newest
    /// message's born time, as recovery reads it).
    newest_ms: u64,
}

/// Where each topic's messages are in the files.
pub(crate) struct Retained {
    /// Message id to file position, sparsely.
    pub index: SparseIndex,
    /// Per segment (by base offset), what it holds of each topic.
    segments: BTreeMap<u64, Vec<Held>>,
    /// Scheduled messages canceled before their time, by topic, while the
    /// files may still hold their Produce records: a replay steps over
    /// them (a canceled message never was one of the topic's). Pruned as
    /// segments go, so it holds at most the cancels of what the files hold.
    canceled: HashMap<TopicId, BTreeSet<MsgId>>,
    /// Each purged topic's last PURGE: the files' messages below it are
    /// not replayed (`oldest_id` starts after them).
    purged_below: HashMap<TopicId, MsgId>,
    /// Replays recovery found under way, for the broker to resume:
    /// (topic, group, where the replay starts, the ids below the group's
    /// cursor it still owes, in order).
    pub(crate) resume: Vec<(TopicId, GroupId, MsgId, Vec<MsgId>)>,
}

impl Default for Retained {
    fn default() -> Self {
        Retained {
            index: SparseIndex::new(INDEX_STRIDE_BYTES),
            segments: BTreeMap::new(),
            canceled: HashMap::new(),
            purged_below: HashMap::new(),
            resume: Vec::new(),
        }
    }
}

/// Produce records of one topic that follow each other in one segment,
/// their ids running on: noted as one, so that a turn of many small
/// produces to a topic costs one index entry lookup, not one a record.
/// A run stops at a stride's bytes, so the index stays as dense, and a
/// compaction copy (ids below what the index has) is a run of its own,
/// so that it never takes new messages with it when the index skips it.
struct Run {
    topic: TopicId,
    first_id: MsgId,
    next_id: MsgId,
    bytes: u64,
    pos: ReadPos,
    /// Its first ids are past what the index has: not a compaction copy,
    /// so later records may join it.
    fresh: bool,
}

impl Retained {
    /// Records holding messages `first_id..next_id` of `topic`, `bytes`
    /// long in all (headers included), start at `pos`; the newest of them
    /// was written at `written_ms`.
    fn note(&mut self, run: &Run, written_ms: u64) {
        let Run { topic, first_id, next_id, bytes, pos, .. } = *run;
        if !self.index.note(topic, first_id, next_id, bytes, pos) {
            return;
        }
        let held = self.segments.entry(pos.segment).or_default();
        match held.iter_mut().find(|h| h.topic == topic) {
            Some(h) => {
                h.bytes += bytes;
                h.newest_ms = h.newest_ms.max(written_ms);
            }
            None => held.push(Held { topic, bytes, newest_ms: written_ms }),
        }
    }

    /// Notes the Produce records of the turn the log just committed,
    /// written at `now_wall_ms`.
    pub(crate) fn note_turn(&mut self, log: &mut Log, now_wall_ms: u64) {
        let stride_bytes = self.index.stride_bytes();
        let mut run: Option<Run> = None;
        log.take_kept_turn(|r| match r.kind {
            RecordKind::Produce => {
                let Ok(Record::Produce { topic, messages }) = Record::decode(r.kind, r.version, r.body) else { return };
                let Some(next) = run_of(topic, &messages, record_bytes(&r), position(&r)) else { return };
                match &mut run {
                    Some(open)
                        if open.topic == next.topic
                            && open.next_id == next.first_id
                            && open.pos.segment == next.pos.segment
                            && open.bytes < stride_bytes
                            && open.fresh =>
                    {
                        open.next_id = next.next_id;
                        open.bytes += next.bytes;
                    }
                    _ => {
                        if let Some(done) = run.take() {
                            self.note(&done, now_wall_ms);
                        }
                        let fresh = next.first_id >= self.index.indexed_to(next.topic);
                        run = Some(Run { fresh, ..next });
                    }
                }
            }
            RecordKind::AckProduce => {
                if let Some(done) = run.take() {
                    self.note(&done, now_wall_ms);
                }
                if let Ok(Record::AckProduce { outputs, .. }) = Record::decode(r.kind, r.version, r.body) {
                    for (topic, messages) in outputs.filter_map(Result::ok) {
                        if let Some(out) = run_of(topic, &messages, messages.bytes_left() as u64, position(&r)) {
                            self.note(&out, now_wall_ms);
                        }
                    }
                }
            }
            _ => {}
        });
        if let Some(done) = run {
            self.note(&done, now_wall_ms);
        }
    }

    /// Recovery met a Produce record of `topic` holding `messages`.
    pub(crate) fn replayed(&mut self, r: &ReadRecord<'_>, topic: TopicId, messages: &Messages<'_>) {
        let newest_ms = messages.clone().filter_map(Result::ok).map(|m| m.born_ms).max().unwrap_or(0);
        if let Some(run) = run_of(topic, messages, record_bytes(r), position(r)) {
            self.note(&run, newest_ms);
        }
    }

    /// Recovery met the output of an AckProduce record `r` to `topic`,
    /// holding `messages`.
    pub(crate) fn replayed_output(&mut self, r: &ReadRecord<'_>, topic: TopicId, messages: &Messages<'_>) {
        let newest_ms = messages.clone().filter_map(Result::ok).map(|m| m.born_ms).max().unwrap_or(0);
        if let Some(run) = run_of(topic, messages, messages.bytes_left() as u64, position(r)) {
            self.note(&run, newest_ms);
        }
    }

    /// Recovery rebuilt group `g` of topic `t` at `cursor`, still owing
    /// `owed` (in flight at the crash, or back for retry): if the topic
    /// retains, and memory lacks some of what the group owes below its
    /// cursor or some message after it (released before the group got
    /// it), the group was replaying from the files, and its replay goes on
    /// from the first of those, which it returns.
    pub(crate) fn note_resume(
        &mut self,
        tid: TopicId,
        g: GroupId,
        t: &Topic,
        cursor: MsgId,
        owed: impl Iterator<Item = MsgId>,
    ) -> Option<MsgId> {
        if !t.settings.retention.is_on() || self.oldest_id(tid).is_none() {
            return None;
        }
        let mut back: Vec<MsgId> = owed.filter(|&id| id < cursor && !t.seq.contains(id)).collect();
        back.sort_unstable();
        back.dedup();
        let whole = t.seq.whole_from(t.seq.next_id());
        let lacks_ahead = cursor < whole && t.seq.live_in(cursor, whole) < whole - cursor;
        if !back.is_empty() || lacks_ahead {
            let from = back.first().map_or(cursor, |&b| b.min(cursor));
            self.resume.push((tid, g, from, back));
            return Some(from);
        }
        None
    }

    /// Segment `base` was removed.
    pub(crate) fn forget_segment(&mut self, base: u64) {
        self.index.forget_segment(base);
        self.segments.remove(&base);
        let index = &self.index;
        self.canceled.retain(|&topic, ids| {
            let oldest = index.first_id(topic).unwrap_or(MsgId::MAX);
            ids.retain(|&id| id >= oldest);
            !ids.is_empty()
        });
    }

    /// Scheduled message `id` of `topic` was canceled (CANCEL, or its
    /// Cancel record in recovery).
    pub(crate) fn canceled(&mut self, topic: TopicId, id: MsgId) {
        self.canceled.entry(topic).or_default().insert(id);
    }

    /// Whether message `id` of `topic` was canceled.
    pub(crate) fn was_canceled(&self, topic: TopicId, id: MsgId) -> bool {
        self.canceled.get(&topic).is_some_and(|ids| ids.contains(&id))
    }

    /// Topic `topic` was deleted.
    pub(crate) fn forget_topic(&mut self, topic: TopicId) {
        self.canceled.remove(&topic);
        self.purged_below.remove(&topic);
        self.index.forget_topic(topic);
        for held in self.segments.values_mut() {
            held.retain(|h| h.topic != topic);
        }
    }

    /// Whether segment `base` holds a message some topic retains at
    /// `now_ms` (wall clock): then compaction does not clean it.
    pub(crate) fn keeps(&self, base: u64, topics: &Topics, now_ms: u64) -> bool {
        let Some(held) = self.segments.get(&base) else { return false };
        held.iter().any(|h| {
            let retention = topics.get(h.topic).map_or(Retention::default(), |e| e.topic.settings.retention);
            retention.is_on() && retention.keeps(h.newest_ms, self.newer_bytes(base, h.topic), now_ms)
        })
    }

    /// Bytes of `topic`'s records in the segments after `base`.
    fn newer_bytes(&self, base: u64, topic: TopicId) -> u64 {
        let after = self.segments.range(base + 1..);
        after.flat_map(|(_, held)| held.iter().filter(|h| h.topic == topic)).map(|h| h.bytes).sum()
    }

    /// Bytes of `topic`'s records the files hold.
    pub(crate) fn bytes_of(&self, topic: TopicId) -> u64 {
        self.segments.values().flat_map(|held| held.iter().filter(|h| h.topic == topic)).map(|h| h.bytes).sum()
    }

    /// The oldest message id of `topic` the files hold (in id order).
    pub(crate) fn oldest_id(&self, topic: TopicId) -> Option<MsgId> {
        let first = self.index.first_id(topic)?;
        let floor = self.purged_below.get(&topic).copied().unwrap_or(0);
        if first >= floor {
            return Some(first);
        }
        (self.index.indexed_to(topic) > floor).then_some(floor)
    }

    /// PURGE_TOPIC (or its Purge record in recovery) removed every message
    /// of `topic` below `below_id`: no replay reads them back.
    pub(crate) fn purged(&mut self, topic: TopicId, below_id: MsgId) {
        let floor = self.purged_below.entry(topic).or_default();
        *floor = (*floor).max(below_id);
    }
}

/// The run of one record (or AckProduce output) holding `messages` of
/// `topic`, `bytes` long, at `pos`; None if it holds none.
fn run_of(topic: TopicId, messages: &Messages<'_>, bytes: u64, pos: ReadPos) -> Option<Run> {
    let first_id = messages.first_id()?;
    Some(Run { topic, first_id, next_id: first_id + u64::from(messages.left()), bytes, pos, fresh: false })
}

/// A record's bytes in the log, header included.
fn record_bytes(r: &ReadRecord<'_>) -> u64 {
    (RECORD_HEADER_BYTES + r.body.len()) as u64
}

/// Where a record starts.
fn position(r: &ReadRecord<'_>) -> ReadPos {
    ReadPos { segment: r.segment, at_bytes: r.offset - r.segment }
}

/// The retention a CREATE_TOPIC with `options` gives a topic that has
/// `current`: a bound the request does not name stays as it is.
pub(super) fn retention_of(options: &TopicOptions, current: Retention) -> Retention {
    Retention {
        ms: options.retention_ms.unwrap_or(current.ms),
        bytes: options.retention_bytes.unwrap_or(current.bytes),
    }
}

impl Broker {
    /// BAD_ARGUMENT for a retention past its limit, or any retention on a
    /// broker without files (`--memory-only`).
    pub(super) fn check_retention(&self, options: &TopicOptions) -> Result<(), Refusal> {
        let l = &self.config.limits;
        let (ms, bytes) = (options.retention_ms.unwrap_or(0), options.retention_bytes.unwrap_or(0));
        if ms > l.retention_ms_max {
            return Err((
                ErrorCode::BadArgument,
                format!("retention_ms {ms} is more than retention_ms_max ({})", l.retention_ms_max),
            ));
        }
        if bytes > l.retention_bytes_max {
            let max = l.retention_bytes_max;
            return Err((
                ErrorCode::BadArgument,
                format!("retention_bytes {bytes} is more than retention_bytes_max ({max})"),
            ));
        }
        if (ms > 0 || bytes > 0) && self.log.memory_only() {
            return Err((ErrorCode::BadArgument, "a memory-only broker keeps no log to retain messages in".into()));
        }
        Ok(())
    }

    /// The STATS keys of topic `tid`'s retention (version 4): its bounds,
    /// the oldest message the files hold of it (0: none) and their bytes.
    pub(super) fn retention_stats(&self, tid: TopicId, retention: Retention) -> [(&'static str, u64); 4] {
        let r = &self.compactor.retained;
        [
            ("retention_ms", retention.ms),
            ("retention_bytes", retention.bytes),
            ("retained_oldest_id", if retention.is_on() { r.oldest_id(tid).unwrap_or(0) } else { 0 }),
            ("retained_bytes", if retention.is_on() { r.bytes_of(tid) } else { 0 }),
        ]
    }
}
