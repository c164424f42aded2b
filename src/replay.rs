//! Recovery's second half: each record the log reads back is decoded
//! (`record::Record::decode`) and then applied to the topic table, in log
//! order; `finish` ends it. (The first half, what damage in the files
//! means, is `recovery.rs`.)
//!
//! Compaction re-appends a topic's Topic record and its live messages at
//! the head of the log, so a topic's messages may come before its Topic
//! record (it is created nameless and named when the record comes) and in
//! any id order: a message below the topic's highest id so far is kept
//! aside as a stray and merged in at the end. A topic still nameless at the
//! end belonged to a deleted topic, and is dropped.

use std::collections::{BTreeMap, HashMap};

#[path = "replay/ahead.rs"]
mod ahead;

use crate::broker::TopicId;
use crate::broker::dedup::Dedup;
use crate::broker::topics::Topics;
use crate::compactor::Compactor;
use crate::filter_table::{FilterLimits, FilterTable};
use crate::log::ReadRecord;
use crate::queue::{Group, GroupConfig, GroupId, IdMap, MsgId, Stray, Timers, Topic};
use crate::record::{DedupEntries, GroupRecord, MessageRecord, NackReasons, Record, Requeues, TopicRecord};
use crate::wheel::TimerKey;

/// A consumer group as recovery rebuilds it: what its records said so
/// far. Its state is its last GroupState (or where it was created), then
/// every later Remove and Requeue record.
#[derive(Default)]
struct GroupReplay {
    /// Its Group record came (else the records met so far belong to a
    /// group whose Group record is later in the log, or to one deleted).
    named: bool,
    name: Box<str>,
    config: GroupConfig,
    /// The cursor of its last GroupState, or where it was created: below
    /// it, the group needs only `pending`.
    floor: MsgId,
    /// Ids below `floor` it still needs, with their deliveries so far.
    pending: IdMap<u16>,
    /// Ids it was done with since (acked, dead-lettered, redriven), of
    /// messages that some group may still need.
    done: IdMap<()>,
    /// Deliveries so far of ids at or above `floor` (Requeue records, the
    /// default group's counts in Produce records).
    counts: IdMap<u16>,
    /// Ids NACKed with a delay (Delay records): the wall-clock time each
    /// is ready again, ms.
    delays: IdMap<u64>,
    /// The ids of `delays` whose wait is the retry policy's (Delay records
    /// with the retry flag).
    retry_waits: IdMap<()>,
    /// The last NACK reason of each id that has one (NackReason records).
    nack_reasons: IdMap<Box<str>>,
    /// The highest id at or above `floor` it was done with, released or
    /// not: its cursor goes past it, as it had before the restart.
    done_max: Option<MsgId>,
    /// Ids whose last record since the floor was a Requeue or Delay (not a
    /// Deliver): back in the group, not in flight, when the log ends.
    requeued_last: IdMap<()>,
    /// Placed by the first pass with no state known (`ahead::First::Unknown`):
    /// it needs every message it has not acked until its first GroupState.
    unknown: bool,
}

impl GroupReplay {
    /// A scheduled message's time came: a group past it gets it back for
    /// retry, as `Topic::fall_due` gave it.
    fn due(&mut self, id: MsgId) {
        if id < self.floor && !self.done.contains_key(&id) {
            let d = self.counts.get(&id).copied().unwrap_or(0);
            self.pending.entry(id).or_insert(d);
        }
    }

    /// A Requeue record (`ready_at_ms` None) or a Delay record: the
    /// message went back to the group after a failed delivery.
    /// `retry` says the delay is the retry policy's wait.
    fn requeued(&mut self, id: MsgId, deliveries: u16, ready_at_ms: Option<u64>, retry: bool) {
        let to = if id < self.floor { &mut self.pending } else { &mut self.counts };
        to.insert(id, deliveries);
        self.requeued_last.insert(id, ());
        match ready_at_ms {
            Some(at) => self.delays.insert(id, at),
            None => self.delays.remove(&id),
        };
        match retry && ready_at_ms.is_some() {
            true => self.retry_waits.insert(id, ()),
            false => self.retry_waits.remove(&id),
        };
    }

    /// A Deliver record: the group delivered `id` once more. An id the
    /// group is done with is left alone: a restatement that compaction
    /// wrote ahead of the record's turn states it acked already.
    fn delivered(&mut self, id: MsgId) {
        if self.done.contains_key(&id) {
            return;
        }
        self.requeued_last.remove(&id);
        let count = if id < self.floor { self.pending.get_mut(&id) } else { Some(self.counts.entry(id).or_insert(0)) };
        if let Some(d) = count {
            *d = d.saturating_add(1);
        }
    }

    /// The ids it still owes a delivery of: delivered (or back for
    /// retry) and not done with.
    fn owed(&self) -> Vec<MsgId> {
        let ids = self.pending.keys().chain(self.counts.iter().filter(|c| *c.1 > 0).map(|c| c.0));
        ids.copied().filter(|id| !self.done.contains_key(id)).collect()
    }

    fn is_done_with(&self, id: MsgId) -> bool {
        self.done.contains_key(&id) || (id < self.floor && !self.pending.contains_key(&id))
    }

    /// A GroupState record: the group's whole state from here on.
    fn checkpoint(&mut self, cursor: MsgId, entries: Requeues<'_>) {
        self.floor = cursor;
        self.done_max = None;
        self.pending.clear();
        self.done.clear();
        self.counts.clear();
        self.delays.clear();
        self.retry_waits.clear();
        self.nack_reasons.clear();
        self.requeued_last.clear();
        for (id, d) in entries.iter() {
            let to = if id < cursor { &mut self.pending } else { &mut self.counts };
            to.insert(id, d);
        }
    }

    /// Past the highest id at or above the floor of `cut` (`GroupReplay::cut`:
    /// its last allowed delivery was in flight at the crash), or 0: the
    /// cursor goes past it, so that such a message comes back for retry,
    /// where the broker takes it to the dead-letter topic
    /// (`Topic::take_exhausted`).
    fn exhausted_past(&self, cut: &IdMap<()>) -> MsgId {
        cut.keys().filter(|&&id| id >= self.floor).map(|id| id + 1).max().unwrap_or(0)
    }

    /// The ids whose last allowed delivery (the group's `max_deliveries`)
    /// was in flight at the crash: not those requeued after it, whose
    /// deliveries reached a `max_deliveries` lowered since (in memory they
    /// are delivered once more). Below the floor, where a GroupState
    /// cannot say whether a message was in flight, any that reached it.
    fn cut(&self, t: &Topic) -> IdMap<()> {
        if t.is_dlq() || self.config.broadcast {
            return IdMap::default();
        }
        let own = self.config.max_deliveries;
        let max = if own == 0 { t.settings.max_deliveries } else { own };
        let cut = |(id, d): (&MsgId, &u16)| {
            *d >= max && !self.requeued_last.contains_key(id) && t.seq.contains(*id) && !t.seq.scheduled(*id)
        };
        let above = self.counts.iter().filter(|(id, _)| **id >= self.floor);
        above.chain(self.pending.iter()).filter(|e| cut(*e)).map(|(id, _)| (*id, ())).collect()
    }

    /// Builds the group over the recovered messages of `t`: its cursor goes
    /// past the highest id it was done with; what it still needs below
    /// that comes back for retry, in id order.
    fn build(self, id: GroupId, t: &Topic, now_wall_ms: u64) -> Group {
        // A delayed message was delivered: the cursor had passed it.
        let passed = self.done.keys().chain(self.delays.keys()).chain(self.done_max.as_ref());
        let max_done = passed.filter(|&&d| d >= self.floor).max().map(|d| d + 1);
        let cut = self.cut(t);
        let cursor = max_done.unwrap_or(self.floor).max(self.floor).max(self.exhausted_past(&cut));
        let mut group = Group::with(id, &self.name, self.config, cursor);
        group.set_cut(cut);
        // A scheduled message is no group's until its time comes; a delayed
        // one is delayed again for what is left of its delay.
        let delayed = |id: &MsgId| self.delays.get(id).is_some_and(|&at| at > now_wall_ms);
        let mut retry: Vec<(MsgId, u16)> = self
            .pending
            .iter()
            .filter(|(id, _)| t.seq.contains(**id) && !self.done.contains_key(id) && !t.seq.scheduled(**id))
            .map(|(id, d)| (*id, *d))
            .collect();
        let mut id = self.floor;
        while let Some(live) = t.seq.next_live(id, cursor) {
            if !self.done.contains_key(&live) && !t.seq.scheduled(live) && group.passes(&t.seq, live) {
                retry.push((live, self.counts.get(&live).copied().unwrap_or(0)));
            }
            id = live + 1;
        }
        let mut delays = Vec::new();
        retry.retain(|&(id, d)| {
            let at = self.delays.get(&id).copied().filter(|_| delayed(&id));
            at.inspect(|&at| delays.push((id, d, at))).is_none()
        });
        delays.sort_unstable();
        group.restore_delays(delays, self.retry_waits.keys().copied());
        retry.sort_unstable();
        let carried =
            self.counts.into_iter().filter(|(id, d)| *id >= cursor && *d > 0 && t.seq.contains(*id)).collect();
        group.restore(cursor, retry, carried);
        group.restore_nack_reasons(self.nack_reasons.into_iter());
        group
    }
}

/// Message `id` is released (every group is done with it): no group's
/// notes need it any more.
fn forget_released(groups: &mut BTreeMap<u32, GroupReplay>, id: MsgId) {
    for g in groups.values_mut() {
        g.done.remove(&id);
        g.counts.remove(&id);
    }
}

/// The settings of a Group record, its filter compiled through `filters`
/// (once per text, and held to no limit: a group the log holds is never
/// lost to a lowered one). A filter the broker took once parses again; one
/// that does not (a later build's syntax) passes everything, so that no
/// message is lost to it.
pub(crate) fn group_config(r: &GroupRecord<'_>, filters: &mut FilterTable) -> GroupConfig {
    let filter = match filters.get(r.filter, FilterLimits::NONE) {
        Ok(f) => f,
        Err(e) => {
            log::warn!(
                "recovery: group {} keeps filter {:?}, which does not parse ({e}): it passes everything",
                r.name,
                r.filter
            );
            None
        }
    };
    GroupConfig {
        broadcast: r.broadcast,
        ack_timeout_ms: r.ack_timeout_ms,
        max_deliveries: r.max_deliveries,
        filter_text: r.filter.into(),
        filter,
        ordered: r.ordered,
        retry: r.retry,
    }
}

/// Recovery under way: the table being built, what the compactor learns
/// of each segment, the strays and the groups.
pub(crate) struct Replay<'a> {
    topics: &'a mut Topics,
    /// Told which segment holds each topic's messages, Topic and Delete
    /// records, and each group's records.
    notes: &'a mut Compactor,
    /// Messages met below their topic's highest id so far (compaction
    /// copied them forward), merged in at the end.
    strays: HashMap<TopicId, BTreeMap<MsgId, Stray>>,
    /// Each topic's groups, by group id, built into the topics at the end.
    groups: HashMap<TopicId, BTreeMap<u32, GroupReplay>>,
    /// Scheduled messages whose time came, by a Due record: no longer
    /// scheduled, whatever their delivery-time property says.
    due: HashMap<TopicId, IdMap<()>>,
    /// The wall clock at the start, ms since the Unix epoch: a message
    /// whose time is still to come is scheduled again.
    now_wall_ms: u64,
    /// The dedup windows being rebuilt (protocol version 4), and the
    /// longest window, ms: an entry older than that is not kept.
    dedup: Option<(&'a mut Dedup, u64)>,
    /// The groups' compiled filters, shared by text (`with_filters`; else
    /// a table of recovery's own).
    filters: Option<&'a mut FilterTable>,
    /// The table when none was lent.
    own_filters: FilterTable,
    /// The first pass (`ahead`), until the second begins.
    ahead: Option<ahead::Ahead>,
    /// Groups the first pass found existing before their first record, of
    /// topics whose last Delete record the second pass has not yet passed.
    placed_after_delete: HashMap<TopicId, ahead::TopicAhead>,
}

/// Scheduled messages whose time came while the broker was down (or
/// before a Due record said so): the broker writes their Due records.
pub(crate) type FellDue = Vec<(TopicId, Vec<MsgId>)>;

impl<'a> Replay<'a> {
    pub fn new(topics: &'a mut Topics, notes: &'a mut Compactor) -> Replay<'a> {
        Replay {
            topics,
            notes,
            strays: HashMap::new(),
            groups: HashMap::new(),
            due: HashMap::new(),
            now_wall_ms: 0,
            dedup: None,
            filters: None,
            own_filters: FilterTable::default(),
            ahead: Some(ahead::Ahead::default()),
            placed_after_delete: HashMap::new(),
        }
    }

    /// Rebuilds the dedup windows into `dedup` too, keeping the entries
    /// younger than `window_ms_max` at the wall clock `at_wall_ms` sets
    /// (the broker then expires each by its topic's window).
    pub fn with_dedup(mut self, dedup: &'a mut Dedup, window_ms_max: u64) -> Replay<'a> {
        self.dedup = Some((dedup, window_ms_max));
        self
    }

    /// Compiles the groups' filters into `filters`, which the broker keeps
    /// (each text once, shared by its groups).
    pub fn with_filters(mut self, filters: &'a mut FilterTable) -> Replay<'a> {
        self.filters = Some(filters);
        self
    }

    /// A Dedup record: the window of `topic` as compaction restated it.
    fn dedup_record(&mut self, segment: u64, topic: TopicId, entries: DedupEntries<'_>) -> Result<(), String> {
        self.notes.replayed_dedup(segment, topic);
        for e in entries {
            let (dedup_id, id, produced_ms) = e?;
            self.dedup_entry(topic, dedup_id, id, produced_ms);
        }
        Ok(())
    }

    /// Message `id` of `topic` came with `dedup_id` at `produced_ms`.
    fn dedup_entry(&mut self, topic: TopicId, dedup_id: &[u8], id: MsgId, produced_ms: u64) {
        let now = self.now_wall_ms;
        if let Some((dedup, max)) = self.dedup.as_mut()
            && produced_ms.saturating_add(*max) > now
        {
            dedup.restore(topic, dedup_id, id, produced_ms);
        }
    }

    /// Sets the wall clock scheduled messages are compared with (0 until
    /// set: every delivery time is to come).
    pub fn at_wall_ms(mut self, now_wall_ms: u64) -> Replay<'a> {
        self.now_wall_ms = now_wall_ms;
        self
    }

    /// The messages an AckProduce record stored in its output topics, as a
    /// Produce record's.
    fn outputs(&mut self, r: &ReadRecord<'_>, outputs: crate::record::Outputs<'_>) -> Result<(), String> {
        for output in outputs {
            let (topic, messages) = output?;
            if topic == TopicId::FLOOR {
                return Err(format!("topic id {topic} names no topic; only a Delete record may carry it"));
            }
            self.notes.retained.replayed_output(r, topic, &messages);
            for m in messages {
                let m = m?;
                self.notes.replayed_produce(r.segment, topic, m.id);
                self.message(topic, &m);
            }
        }
        Ok(())
    }

    /// Decodes one record and applies it. An error (a body that does not
    /// match its layout, a record naming the floor's topic id) stops the
    /// start.
    pub fn apply(&mut self, r: &ReadRecord<'_>) -> Result<(), String> {
        if let Some(ahead) = self.ahead.take() {
            self.begin(ahead);
        }
        let record = Record::decode(r.kind, r.version, r.body)?;
        let topic = record_topic(&record);
        if let Some(topic) = topic
            && topic == TopicId::FLOOR
        {
            return Err(format!("topic id {topic} names no topic; only a Delete record may carry it"));
        }
        match record {
            Record::Topic(t) => self.topic(&t, r.segment),
            Record::Delete(d) => self.delete(d.topic, d.next_id, r),
            Record::Purge(p) => self.purge(p.topic, p.below_id),
            Record::Produce { topic, messages } => {
                self.notes.retained.replayed(r, topic, &messages);
                for m in messages {
                    let m = m?;
                    self.notes.replayed_produce(r.segment, topic, m.id);
                    if m.props.dedup_id().is_some() {
                        self.notes.replayed_dedup(r.segment, topic);
                    }
                    self.message(topic, &m);
                }
            }
            Record::Remove { topic, group, ids, .. } => {
                self.notes.replayed_group(r.segment, topic, group);
                for id in ids.iter() {
                    self.done_with(topic, group, id);
                }
            }
            Record::AckProduce { topic, group, ids, outputs } => {
                self.notes.replayed_group(r.segment, topic, group);
                for id in ids.iter() {
                    self.done_with(topic, group, id);
                }
                self.outputs(r, outputs)?;
            }
            Record::Requeue { topic, group, entries } => {
                self.notes.replayed_group(r.segment, topic, group);
                let g = self.group(topic, group);
                entries.iter().for_each(|(id, d)| g.requeued(id, d, None, false));
            }
            Record::Delay { topic, group, retry, entries } => {
                self.notes.replayed_group(r.segment, topic, group);
                let g = self.group(topic, group);
                entries.iter().for_each(|(id, d, at)| g.requeued(id, d, Some(at), retry));
            }
            Record::Deliver { topic, group, ids } => {
                self.notes.replayed_group(r.segment, topic, group);
                let g = self.group(topic, group);
                ids.iter().for_each(|id| g.delivered(id));
            }
            Record::Group(g) => self.group_record(&g, r.segment),
            Record::GroupDelete(d) => {
                if let Some(groups) = self.groups.get_mut(&d.topic) {
                    groups.remove(&d.group.0);
                }
                self.notes.forget_group(d.topic, d.group);
            }
            Record::GroupState { topic, group, cursor, entries } => {
                self.notes.replayed_group(r.segment, topic, group);
                self.group_state((topic, group), cursor, entries);
            }
            r @ (Record::Cancel { .. } | Record::Reschedule { .. } | Record::Due { .. }) => self.schedule_record(r),
            Record::Dedup { topic, entries } => self.dedup_record(r.segment, topic, entries)?,
            Record::NackReason { topic, group, entries } => self.nack_reasons(r.segment, (topic, group), entries)?,
        }
        Ok(())
    }

    /// A GroupState record: the group's whole state from here on.
    fn group_state(&mut self, (topic, group): (TopicId, GroupId), cursor: MsgId, entries: Requeues<'_>) {
        let g = self.group(topic, group);
        g.checkpoint(cursor, entries);
        if std::mem::take(&mut g.unknown) {
            self.release_done(topic);
        }
    }

    /// A record read by the first pass (`ahead`).
    pub fn scan(&mut self, r: &ReadRecord<'_>) {
        if let Some(ahead) = self.ahead.as_mut() {
            ahead.scan(r);
        }
    }

    /// The second pass begins: the groups the first found are placed.
    fn begin(&mut self, ahead: ahead::Ahead) {
        for (tid, t) in ahead.finish() {
            match t.after {
                None => self.place(tid, t.groups),
                Some(_) => drop(self.placed_after_delete.insert(tid, t)),
            }
        }
    }

    /// Places the groups of topic `tid` the first pass found existing
    /// before their first record, at the state it found (before any record
    /// of the topic the second pass applies, or after its last Delete).
    fn place(&mut self, tid: TopicId, groups: BTreeMap<u32, ahead::First>) {
        let known = self.groups.entry(tid).or_default();
        for (gid, first) in groups {
            let g = known.entry(gid).or_default();
            match first {
                ahead::First::Restated { floor, pending } => {
                    g.floor = floor;
                    g.pending = pending;
                }
                ahead::First::Unknown => g.unknown = true,
                ahead::First::Created => {}
            }
        }
    }

    /// Releases each message of `topic` that some group acked and every
    /// group is now done with: those a group placed with no state known
    /// held until its first GroupState.
    fn release_done(&mut self, topic: TopicId) {
        let Some(groups) = self.groups.get_mut(&topic) else { return };
        let strays = self.strays.get_mut(&topic);
        let seq = &mut self.topics.nameless(topic).topic.seq;
        // A message released already keeps its notes (see `done_with`).
        let held = |id: &MsgId| seq.contains(*id) || strays.as_ref().is_some_and(|s| s.contains_key(id));
        let mut acked: Vec<MsgId> = groups.values().flat_map(|g| g.done.keys().copied()).filter(held).collect();
        acked.sort_unstable();
        acked.dedup();
        acked.retain(|&id| groups.values().all(|g| g.is_done_with(id)));
        for &id in &acked {
            forget_released(groups, id);
            seq.release(id);
        }
        if let Some(strays) = strays {
            acked.iter().for_each(|id| drop(strays.remove(id)));
        }
    }

    /// A NackReason record: the last reasons NACKs gave for messages of
    /// group `group`.
    fn nack_reasons(
        &mut self,
        segment: u64,
        (topic, group): (TopicId, GroupId),
        entries: NackReasons<'_>,
    ) -> Result<(), String> {
        self.notes.replayed_group(segment, topic, group);
        let g = self.group(topic, group);
        for e in entries {
            let (id, reason) = e?;
            g.nack_reasons.insert(id, reason.into());
        }
        Ok(())
    }

    /// A Delete record: topic `topic` is gone, and no id below `next_id`
    /// is given again.
    fn delete(&mut self, topic: TopicId, next_id: MsgId, r: &ReadRecord<'_>) {
        if let Some((dedup, _)) = self.dedup.as_mut() {
            dedup.forget_topic(topic);
        }
        self.topics.raise_id_floor(next_id);
        self.topics.remove(topic);
        self.strays.remove(&topic);
        self.groups.remove(&topic);
        self.notes.replayed_delete(r.segment);
        // The groups of the topic that may take its id, found by the first pass.
        if let Some(t) = self.placed_after_delete.remove(&topic) {
            match t.after == Some(r.offset) {
                true => self.place(topic, t.groups),
                false => drop(self.placed_after_delete.insert(topic, t)),
            }
        }
    }

    /// A record of scheduled messages: Cancel, Reschedule or Due.
    fn schedule_record(&mut self, record: Record<'_>) {
        match record {
            Record::Cancel { topic, ids } => ids.iter().for_each(|id| {
                self.notes.retained.canceled(topic, id);
                self.cancel(topic, id);
            }),
            Record::Reschedule { topic, entries } => {
                for (id, due_ms) in entries.iter() {
                    self.reschedule(topic, id, due_ms);
                }
            }
            Record::Due { topic, ids } => {
                for id in ids.iter() {
                    self.due.entry(topic).or_default().insert(id, ());
                    for g in self.groups.get_mut(&topic).into_iter().flat_map(|m| m.values_mut()) {
                        g.due(id);
                    }
                }
            }
            _ => unreachable!("not a record of scheduled messages"),
        }
    }

    /// A Cancel record: the scheduled message left the topic.
    fn cancel(&mut self, topic: TopicId, id: MsgId) {
        self.topics.nameless(topic).topic.seq.release(id);
        if let Some(strays) = self.strays.get_mut(&topic) {
            strays.remove(&id);
        }
        for g in self.groups.get_mut(&topic).into_iter().flat_map(|m| m.values_mut()) {
            g.pending.remove(&id);
            g.counts.remove(&id);
        }
    }

    /// A Reschedule record: the message's delivery time is `due_ms`,
    /// written into its stored property (a copy compaction wrote later
    /// carries it already).
    fn reschedule(&mut self, topic: TopicId, id: MsgId, due_ms: u64) {
        if self.topics.nameless(topic).topic.seq.write_due(id, due_ms) {
            return;
        }
        let Some(stray) = self.strays.get_mut(&topic).and_then(|s| s.get_mut(&id)) else { return };
        if let Some(at) = crate::codec::Props::trusted(&stray.props).schedule_value_at() {
            stray.props[at..at + 8].copy_from_slice(&due_ms.to_le_bytes());
        }
    }

    /// Schedules again every message of topic `tid` whose time is still to
    /// come, and gives the groups past it each one whose time came with
    /// no Due record to say so (returned, for the broker to write them).
    fn reschedule_all(&mut self, tid: TopicId) -> Vec<MsgId> {
        let due = self.due.remove(&tid).unwrap_or_default();
        let Some(e) = self.topics.get_mut(tid) else { return Vec::new() };
        let mut times = Vec::new();
        for m in e.topic.seq.iter_live().filter(|m| !m.props.is_empty() && !due.contains_key(&m.id)) {
            if let Some(crate::codec::props::Prop::DeliverAt(at)) = m.props.schedule() {
                times.push((m.id, at));
            }
        }
        let mut fell_due = Vec::new();
        for (id, at) in times {
            if at > self.now_wall_ms {
                e.topic.schedule(id, at);
                continue;
            }
            fell_due.push(id);
            for g in self.groups.get_mut(&tid).into_iter().flat_map(|m| m.values_mut()) {
                g.due(id);
            }
        }
        fell_due
    }

    /// Group `group` of topic `topic` as rebuilt so far (made, unnamed, if
    /// its Group record has not come yet).
    fn group(&mut self, topic: TopicId, group: GroupId) -> &mut GroupReplay {
        self.topics.nameless(topic);
        self.groups.entry(topic).or_default().entry(group.0).or_default()
    }

    /// A Topic record: the topic exists (created, or named if its messages
    /// came first) with these settings and at least this next id. A
    /// version-1 record's topic has the default group (reading from its
    /// earliest message, as every topic of those builds did).
    fn topic(&mut self, t: &TopicRecord<'_>, segment: u64) {
        match self.topics.get_mut(t.topic) {
            Some(e) => {
                e.topic.settings = t.settings;
                e.topic.seq.bump_next_id(t.next_id);
                if e.topic.name.is_empty() {
                    self.topics.name(t.topic, t.name);
                }
            }
            None => self.topics.insert(t.topic, t.name, t.settings, t.next_id),
        }
        match t.next_group_id {
            Some(next) => {
                if let Some(e) = self.topics.get_mut(t.topic) {
                    e.topic.bump_next_group_id(next);
                }
            }
            None => {
                let g = self.group(t.topic, GroupId::DEFAULT);
                g.named = true;
                self.notes.replayed_group(segment, t.topic, GroupId::DEFAULT);
            }
        }
        self.topics.raise_id_floor(t.next_id);
        self.notes.replayed_topic(segment, t.topic);
    }

    /// A Group record: the group exists with these settings; created at
    /// its cursor unless it was known already.
    fn group_record(&mut self, r: &GroupRecord<'_>, segment: u64) {
        self.notes.replayed_group(segment, r.topic, r.group);
        // Its id is taken even if the group is deleted later.
        self.topics.nameless(r.topic).topic.bump_next_group_id(r.group.0.saturating_add(1));
        let config = group_config(r, self.filters.as_deref_mut().unwrap_or(&mut self.own_filters));
        let g = self.group(r.topic, r.group);
        if !g.named {
            g.floor = g.floor.max(r.cursor);
        }
        g.named = true;
        g.name = r.name.into();
        g.config = config;
    }

    /// A Purge record: every group starts again at `below_id`.
    fn purge(&mut self, topic: TopicId, below_id: MsgId) {
        self.notes.retained.purged(topic, below_id);
        let e = self.topics.nameless(topic);
        e.topic.purge(&mut NoTimers);
        e.topic.seq.bump_next_id(below_id);
        if let Some(strays) = self.strays.get_mut(&topic) {
            strays.retain(|id, _| *id >= below_id);
        }
        for g in self.groups.get_mut(&topic).into_iter().flat_map(|m| m.values_mut()) {
            g.floor = g.floor.max(below_id);
            g.pending.retain(|id, _| *id >= below_id);
            g.done.retain(|id, _| *id >= below_id);
            g.counts.retain(|id, _| *id >= below_id);
            g.nack_reasons.retain(|id, _| *id >= below_id);
        }
    }

    /// A Remove record says group `group` was done with `id`: the message
    /// goes once every group is done with it (and then no group's notes
    /// need it: a message released here was released by the run that
    /// wrote the log too, so no later copy of it comes).
    fn done_with(&mut self, topic: TopicId, group: GroupId, id: MsgId) {
        let g = self.group(topic, group);
        g.done.insert(id, ());
        if id >= g.floor {
            g.done_max = g.done_max.max(Some(id));
        }
        g.delays.remove(&id);
        g.retry_waits.remove(&id);
        g.nack_reasons.remove(&id);
        // A message released already (a replay from the files put it back
        // for this group): its note stays, so that a resumed replay steps
        // over it.
        let strayed = self.strays.get(&topic).is_some_and(|s| s.contains_key(&id));
        if !strayed && !self.topics.nameless(topic).topic.seq.contains(id) {
            return;
        }
        let Some(groups) = self.groups.get_mut(&topic) else { return };
        if !groups.values().all(|g| g.is_done_with(id)) {
            return;
        }
        forget_released(groups, id);
        self.topics.nameless(topic).topic.seq.release(id);
        if let Some(strays) = self.strays.get_mut(&topic) {
            strays.remove(&id);
        }
    }

    /// A message of a Produce record: stored (unless stored already: a
    /// copy compaction wrote before the original's segment was removed),
    /// or kept aside if it comes below the topic's highest id so far (a
    /// copy moved forward by compaction). Its delivery count is the default
    /// group's.
    fn message(&mut self, topic: TopicId, m: &MessageRecord<'_>) {
        // A client's produce: a dead letter's copy is not one.
        if let Some(dedup_id) = m.props.dedup_id().filter(|_| m.dead.is_none()) {
            self.dedup_entry(topic, dedup_id, m.id, m.born_ms);
        }
        if m.deliveries > 0 {
            self.group(topic, GroupId::DEFAULT).counts.insert(m.id, m.deliveries);
        }
        let t = &mut self.topics.nameless(topic).topic;
        if t.seq.contains(m.id) {
            return;
        }
        if m.id >= t.seq.next_id() {
            t.restore(m.id, m.born_ms, m.body(), m.dead);
        } else {
            let strays = self.strays.entry(topic).or_default();
            strays.entry(m.id).or_insert_with(|| Stray {
                born_ms: m.born_ms,
                dead: m.dead,
                props: m.props.bytes().to_vec(),
                payload: m.payload.to_vec(),
            });
        }
    }

    /// Ends recovery: merges strays, drops topics whose Topic record never
    /// came (their records belonged to a deleted topic), builds each
    /// topic's groups, and releases what no group needs.
    pub fn finish(mut self) -> FellDue {
        for (tid, strays) in std::mem::take(&mut self.strays) {
            if let Some(e) = self.topics.get_mut(tid) {
                e.topic.merge(strays.into_iter());
            }
        }
        let nameless: Vec<TopicId> = self.topics.iter().filter(|e| e.topic.name.is_empty()).map(|e| e.id).collect();
        for tid in nameless {
            if let Some(e) = self.topics.remove(tid) {
                log::warn!(
                    "recovery: dropped {} messages of topic id {tid}, whose topic record is missing from the log",
                    e.topic.seq.live()
                );
            }
        }
        let mut fell_due = FellDue::new();
        let tids: Vec<TopicId> = self.topics.iter().map(|e| e.id).collect();
        for tid in tids {
            let ids = self.reschedule_all(tid);
            if !ids.is_empty() {
                fell_due.push((tid, ids));
            }
        }
        let mut floor = 0;
        for e in self.topics.iter_mut() {
            e.topic.seq.publish();
            for (gid, g) in self.groups.remove(&e.id).unwrap_or_default() {
                if g.named {
                    let owed = g.owed();
                    let broadcast = g.config.broadcast;
                    let mut group = g.build(GroupId(gid), &e.topic, self.now_wall_ms);
                    // Whether the group was replaying is decided here, on
                    // the whole log: compaction may have moved the records
                    // that released what it started before (another group's
                    // acks, restated) after its own. A replaying group reads
                    // nothing past where its replay resumes until the replay
                    // gets there (else its cursor would step over what the
                    // files still hold for it).
                    if !broadcast {
                        let r = &mut self.notes.retained;
                        let from = r.note_resume(e.id, GroupId(gid), &e.topic, group.cursor(), owed.into_iter());
                        if from.is_some() {
                            group.set_replay_until(from);
                        }
                    }
                    e.topic.insert_group(group);
                }
            }
            e.topic.restore_done();
            floor = floor.max(e.topic.seq.next_id());
        }
        self.recover_dead_notes();
        self.topics.raise_id_floor(floor);
        fell_due
    }
}

impl Replay<'_> {
    /// Rebuilds each topic's dead notes (what inspection tells of a dead
    /// letter) from its dead-letter topic's messages.
    fn recover_dead_notes(&mut self) {
        let suffix = crate::codec::DEAD_LETTER_SUFFIX;
        let origin_of = |e: &crate::broker::topics::Entry| e.topic.name.strip_suffix(suffix).map(str::to_string);
        let pairs: Vec<(String, TopicId)> = self.topics.iter().filter_map(|e| Some((origin_of(e)?, e.id))).collect();
        for (name, dlq) in pairs {
            let Some(origin) = self.topics.id(&name) else { continue };
            if let [Some(o), Some(d)] = self.topics.pair_mut(origin, dlq) {
                o.topic.recover_dead_notes(&d.topic.seq);
            }
        }
    }
}

/// The log is read twice: the first pass finds the groups that existed
/// before their first record (`ahead`).
impl crate::log::Replayer for Replay<'_> {
    fn scans(&self) -> bool {
        true
    }
    fn scan(&mut self, r: &ReadRecord<'_>) {
        Replay::scan(self, r);
    }
    fn apply(&mut self, r: &ReadRecord<'_>) -> Result<(), String> {
        Replay::apply(self, r)
    }
}

/// Timers that do nothing (recovery has no deadlines).
struct NoTimers;

impl Timers for NoTimers {
    fn arm(&mut self, _: u64, _: MsgId) -> TimerKey {
        unreachable!("recovery arms no timers")
    }
    fn disarm(&mut self, _: TimerKey) {}
}

/// The topic a record applies to, which must name a topic; None for a
/// Delete record, whose topic id may be the id floor (`TopicId::FLOOR`).
fn record_topic(record: &Record<'_>) -> Option<TopicId> {
    match record {
        Record::Delete(_) => None,
        Record::Topic(TopicRecord { topic, .. })
        | Record::Purge(crate::record::PurgeRecord { topic, .. })
        | Record::Produce { topic, .. }
        | Record::Remove { topic, .. }
        | Record::Requeue { topic, .. }
        | Record::Group(GroupRecord { topic, .. })
        | Record::GroupDelete(crate::record::GroupDeleteRecord { topic, .. })
        | Record::GroupState { topic, .. }
        | Record::Cancel { topic, .. }
        | Record::Reschedule { topic, .. }
        | Record::Due { topic, .. }
        | Record::Delay { topic, .. }
        | Record::Deliver { topic, .. }
        | Record::AckProduce { topic, .. }
        | Record::Dedup { topic, .. }
        | Record::NackReason { topic, .. } => Some(*topic),
    }
}

#[cfg(test)]
#[path = "replay/tests.rs"]
mod tests;
