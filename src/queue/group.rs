//! `Group`: the state of one consumer group over a topic's `Seq` — its
//! cursor, the messages in flight, back for retry or delayed, the delivery
//! counts carried over a restart, and which consumer holds what (Redis
//! streams keep a group the same way: `streamCG` with its last id and its
//! pending list).
//!
//! The model: messages are ready in produce order; FETCH moves them to the
//! in-flight table with a deadline; ACK is the group done with them; a
//! passed deadline or a NACK returns them to the front of ready; past max
//! deliveries they go to the dead-letter topic. The group keeps state only
//! for messages that are not simply "next in line": every id below the
//! cursor that is in none of its tables, it is done with.
//!
//! A group never releases a message from the sequence itself: it says it
//! is done with one, and the topic releases it once no other group needs
//! it (`Group::needs`). Its tag filter is decided once per tag set and the
//! answer kept: the cursor steps over what the filter drops (noted in
//! `skipped` for the topic to release), so the filter never runs per
//! message, nor reads a payload.

use std::collections::VecDeque;
use std::sync::Arc;

use super::order::{Admit, KeyOrder};
use super::retry::RetryPolicy;
use super::seq::Seq;
use super::tags::TagSetId;
use super::{ConsumerId, Counters, Delivery, FastMap, GroupId, IdMap, MsgId, Returned, Take, Timers};
use crate::codec::{DeadInfo, DeadReason};
use crate::filter::Filter;
use crate::wheel::TimerKey;

/// Most filtered-out messages one FETCH (or one `Topic::skip_filtered`)
/// steps over: a filter that passes nothing on a long topic must not stall
/// the loop. Each costs a bitmap step and a cached decision, so this is
/// about a millisecond of work.
pub const FILTER_SKIPS_PER_CALL_MAX: u32 = 65_536;

/// The first live, visible, unscheduled id at or after `from`, looking at
/// no more than `FILTER_SKIPS_PER_CALL_MAX` scheduled ones.
fn next_unscheduled(seq: &Seq, from: MsgId, until: MsgId) -> Option<MsgId> {
    let mut id = seq.next_live(from, until)?;
    for _ in 0..FILTER_SKIPS_PER_CALL_MAX {
        if !seq.scheduled(id) {
            return Some(id);
        }
        id = seq.next_live(id + 1, until)?;
    }
    None
}

/// A group's settings (CREATE_GROUP; changed by a CREATE_GROUP naming an
/// existing group).
#[derive(Clone, Debug, Default)]
pub struct GroupConfig {
    /// Every consumer connection gets every message (else they compete).
    pub broadcast: bool,
    /// Ack timeout when a FETCH or TOUCH asks for 0, ms; 0 = the topic's.
    pub ack_timeout_ms: u32,
    /// Deliveries before a message is dead-lettered; 0 = the topic's.
    pub max_deliveries: u16,
    /// The filter's text as given (empty = `*`).
    pub filter_text: Box<str>,
    /// The parsed filter, shared with every group of the same text
    /// (`FilterTable`); None passes everything.
    pub filter: Option<Arc<Filter>>,
    /// Messages with the same key go one at a time, in order (`KeyOrder`).
    pub ordered: bool,
    /// How long a message waits before it is ready again after a NACK
    /// without a delay or a passed ack deadline; None: no wait.
    pub retry: Option<RetryPolicy>,
}

/// A message delivered and not yet acknowledged.
#[derive(Clone, Copy, Debug)]
pub(super) struct Inflight {
    /// Its ack deadline.
    pub(super) timer: TimerKey,
    /// The connection it went to.
    pub(super) owner: ConsumerId,
    /// Deliveries so far, this one included.
    pub(super) deliveries: u16,
}

/// Messages delivered to one consumer: ids pushed on delivery, removed
/// lazily (an id whose in-flight owner is someone else, or which is no
/// longer in flight, is skipped and swept when the list doubles).
#[derive(Default)]
struct Owned {
    ids: Vec<MsgId>,
    /// How many of `ids` are still in flight to this consumer.
    live: u32,
}

/// What decides a failed delivery's fate: the topic's settings.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Deliveries after which a failed one dead-letters the message.
    pub max_deliveries: u16,
    /// Whether messages may be dead-lettered (a dead-letter topic's never
    /// are: they go back to ready instead).
    pub dead_letters: bool,
}

/// One consumer group's state.
#[derive(Default)]
pub struct Group {
    /// Its number within the topic.
    id: GroupId,
    /// Its name (empty: the default group).
    name: Box<str>,
    /// Its settings.
    pub config: GroupConfig,
    /// The filter's decision for each tag set met (the filter runs once
    /// per distinct set, never per message), valid for the topic's tag
    /// table at `decisions_epoch` (a freed set's number may be reused).
    decisions: FastMap<TagSetId, bool>,
    decisions_epoch: u64,
    /// Ids the filter stepped over since the topic last looked: the topic
    /// releases them unless another group needs them.
    pub(super) skipped: Vec<MsgId>,
    /// Every id below it has been delivered at least once (or released).
    cursor: MsgId,
    /// Ready again after a failed delivery, in the order they came back.
    /// May hold ids no longer in `retry_set` (acked meanwhile): skipped.
    pub(super) retry: VecDeque<MsgId>,
    /// Ready-again messages and their deliveries so far.
    retry_set: IdMap<u16>,
    /// Delivered and not acknowledged.
    pub(super) inflight: IdMap<Inflight>,
    /// NACKed with a delay: the timer and the deliveries so far.
    pub(super) delayed: IdMap<(TimerKey, u16)>,
    /// The wall-clock time each delayed message is ready again, ms since
    /// the Unix epoch, as the log states it (`delays.rs`).
    pub(super) delay_wall: IdMap<u64>,
    /// The delayed messages whose wait is the retry policy's ("waiting for
    /// retry"), not a NACK's delay (`retry.rs`).
    pub(super) retry_waits: IdMap<()>,
    /// The last reason a NACK gave, of the messages the group still needs
    /// that have one (`nack_reasons.rs`).
    pub(super) nack_reasons: IdMap<Box<str>>,
    /// Recovery: messages whose NACK delay had not passed, (id, deliveries
    /// so far, ready-again wall time ms), to be delayed again once the
    /// broker has a wheel (`Group::arm_restored`).
    pub(super) restored_delays: Vec<(MsgId, u16, u64)>,
    /// Deliveries of never-redelivered messages carried over a restart.
    pub(super) carried: IdMap<u16>,
    /// Recovery: the messages whose last allowed delivery was in flight
    /// when the broker died, which `Topic::take_exhausted` dead-letters at
    /// start (not those requeued since, whose deliveries reached a
    /// `max_deliveries` lowered later: in memory they get one more).
    pub(super) cut: IdMap<()>,
    /// Ordered by key: each key's line (empty otherwise).
    order: KeyOrder,
    /// What each consumer holds.
    owners: IdMap<Owned>,
    /// Connections that have fetched from the group and are still open.
    pub consumers: u32,
    /// A broadcast group's members: each consumer's own position, a group
    /// of its own (empty for other groups).
    pub(super) members: FastMap<ConsumerId, GroupId>,
    /// Counters kept since the broker started (`produced` is the topic's).
    pub counters: Counters,
    /// During a replay from the log files: the id below which the replay
    /// has put back every message the group needs (it reads no further).
    replay_until: Option<MsgId>,
}

impl Group {
    /// A group that starts reading at `cursor`.
    pub fn new(id: GroupId, cursor: MsgId) -> Group {
        Group { id, cursor, ..Group::default() }
    }

    /// A named group with its settings, starting at `cursor`.
    pub fn with(id: GroupId, name: &str, config: GroupConfig, cursor: MsgId) -> Group {
        Group { id, name: name.into(), config, cursor, ..Group::default() }
    }

    pub fn id(&self) -> GroupId {
        self.id
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The first id the group has not yet delivered.
    pub fn cursor(&self) -> MsgId {
        self.cursor
    }
    /// The end of what the group may read now: the visible messages, and
    /// during a replay from the log files only those the replay has put
    /// back (`set_replay_until`).
    fn until(&self, seq: &Seq) -> MsgId {
        self.replay_until.map_or(seq.visible_id(), |u| u.min(seq.visible_id()))
    }
    /// A replay from the files has put back every message the group needs
    /// below `until` (None: the replay is over; the group reads every
    /// visible message).
    pub fn set_replay_until(&mut self, until: Option<MsgId>) {
        self.replay_until = until;
    }
    /// Where a replay of the group has got to (`set_replay_until`).
    pub fn replay_until(&self) -> Option<MsgId> {
        self.replay_until
    }
    /// Messages back for retry.
    pub fn retry_len(&self) -> u64 {
        self.retry_set.len() as u64
    }
    /// Consumers holding messages of the group now.
    pub fn holders(&self) -> u32 {
        self.owners.len() as u32
    }
    /// A broadcast group's members (their group ids).
    pub fn members(&self) -> impl Iterator<Item = GroupId> + '_ {
        self.members.values().copied()
    }

    /// Changes the settings; a new filter forgets the old one's decisions.
    pub fn set_config(&mut self, config: GroupConfig) {
        if config.filter_text != self.config.filter_text {
            self.decisions.clear();
        }
        self.config = config;
    }

    /// Whether the group decides per message at all: it has a filter, or
    /// its topic has messages redriven to one group.
    #[inline]
    pub(super) fn decides(&self, seq: &Seq) -> bool {
        self.config.filter.is_some() || seq.tags().has_redriven()
    }

    /// Whether the filter passes message `id` (untagged messages pass only
    /// `*`), decided once per tag set. A message redriven to one group
    /// passes that group's (whatever its filter) and no other.
    pub fn passes(&mut self, seq: &Seq, id: MsgId) -> bool {
        if !self.decides(seq) {
            return true;
        }
        let Some(set) = seq.tag_set(id) else {
            return self.config.filter.as_ref().is_none_or(|f| matches!(**f, Filter::All));
        };
        let epoch = seq.tags().epoch();
        if epoch != self.decisions_epoch {
            self.decisions.clear();
            self.decisions_epoch = epoch;
        }
        if let Some(&d) = self.decisions.get(&set) {
            return d;
        }
        let d = self.decide(seq, set);
        self.decisions.insert(set, d);
        d
    }

    /// The filter's decision for tag set `set`, decided afresh.
    fn decide(&self, seq: &Seq, set: TagSetId) -> bool {
        match seq.tags().redriven_to(set) {
            Some(to) => to == &*self.name,
            None => self.config.filter.as_ref().is_none_or(|f| f.matches_any(seq.tags().names(set))),
        }
    }

    /// `passes`, decided afresh and kept nowhere (inspection reads, and
    /// changes nothing).
    pub(super) fn would_pass(&self, seq: &Seq, id: MsgId) -> bool {
        if !self.decides(seq) {
            return true;
        }
        match seq.tag_set(id) {
            Some(set) => self.decide(seq, set),
            None => self.config.filter.as_ref().is_none_or(|f| matches!(**f, Filter::All)),
        }
    }

    /// Every id the group still needs below its cursor and their
    /// deliveries so far (in flight, back for retry, delayed), and the
    /// delivery counts carried for ids at or above it: what a GroupState
    /// record restates.
    pub fn pending(&self) -> Vec<(MsgId, u16)> {
        let mut v: Vec<(MsgId, u16)> = self.inflight.iter().map(|(id, f)| (*id, f.deliveries)).collect();
        v.extend(self.retry_set.iter().map(|(id, d)| (*id, *d)));
        v.extend(self.delayed.iter().map(|(id, (_, d))| (*id, *d)));
        v.extend(self.carried.iter().map(|(id, d)| (*id, *d)));
        v.extend(self.order.waiting());
        v.sort_unstable();
        v.dedup_by_key(|e| e.0);
        v
    }

    /// The delivered messages back in the group and not in flight (back
    /// for retry, carried over a restart, or waiting behind their key),
    /// with their deliveries so far: what compaction restates as a Requeue
    /// after the GroupState, which cannot tell them from those in flight.
    pub fn returned(&self) -> Vec<(MsgId, u16)> {
        let mut v: Vec<(MsgId, u16)> = self.retry_set.iter().map(|(id, d)| (*id, *d)).collect();
        v.extend(self.carried.iter().map(|(id, d)| (*id, *d)));
        v.extend(self.order.waiting());
        v.retain(|e| e.1 > 0 && !self.inflight.contains_key(&e.0) && !self.delayed.contains_key(&e.0));
        v.sort_unstable();
        v.dedup_by_key(|e| e.0);
        v
    }

    /// How many entries `returned` has at most (the log's headroom).
    pub fn returned_len(&self) -> usize {
        self.retry_set.len() + self.carried.len() + self.order.waiting_len()
    }

    /// How many entries `pending` has at most (the log's headroom).
    pub fn pending_len(&self) -> usize {
        self.inflight.len() + self.retry_set.len() + self.delayed.len() + self.carried.len() + self.order.waiting_len()
    }

    /// The oldest born time among the messages delivered and not yet
    /// acknowledged (in flight), if any.
    pub fn oldest_unacked_born_ms(&self, seq: &Seq) -> Option<u64> {
        let id = self.inflight.keys().min()?;
        seq.get(*id).map(|m| m.born_ms)
    }

    /// Whether the group still needs message `id`: not yet delivered, or
    /// in flight, back for retry or delayed. A message leaves the sequence
    /// once no group needs it.
    pub fn needs(&self, id: MsgId) -> bool {
        id >= self.cursor
            || self.inflight.contains_key(&id)
            || self.retry_set.contains_key(&id)
            || self.delayed.contains_key(&id)
            || self.order.holds_back(id)
    }

    /// `needs`, the filter decided: a message at or after the cursor that
    /// the filter drops the group is done with already, though its cursor
    /// has not stepped over it yet (the decision is cached per tag set, so
    /// this costs a lookup, and nothing for a group without a filter).
    #[inline]
    pub fn wants(&mut self, seq: &Seq, id: MsgId) -> bool {
        if id < self.cursor {
            return self.needs(id);
        }
        !self.decides(seq) || self.passes(seq, id)
    }

    /// Ready messages of `seq`: never delivered and visible (waiting
    /// behind their key among them), or back for retry. (Counted from the cursor, so it
    /// costs a walk of the blocks the group has not read: for STATS, not
    /// for every request.)
    pub fn ready(&self, seq: &Seq) -> u64 {
        self.lag(seq) + self.retry_set.len() as u64
    }

    /// Ordered by key: messages waiting behind their key's holder, and
    /// keys with a message outstanding.
    pub fn key_lines(&self) -> (u64, u64) {
        (self.order.waiting_len() as u64, self.order.lines() as u64)
    }
    /// Messages not yet delivered: from the cursor on, visible, and not
    /// scheduled, and those waiting behind their key (a walk of the
    /// blocks, and of the scheduled messages: for STATS and LIST_GROUPS).
    pub fn lag(&self, seq: &Seq) -> u64 {
        seq.unscheduled_in(self.cursor, self.until(seq)) + self.order.waiting_len() as u64
    }
    pub fn inflight(&self) -> u64 {
        self.inflight.len() as u64
    }
    /// Whether message `id` is in flight to consumer `owner`.
    pub fn holds(&self, id: MsgId, owner: ConsumerId) -> bool {
        self.inflight.get(&id).is_some_and(|f| f.owner == owner)
    }

    /// Messages in flight to consumer `owner` (what a push subscription's
    /// credit counts).
    pub fn held_by(&self, owner: ConsumerId) -> u32 {
        self.owners.get(&owner).map_or(0, |o| o.live)
    }
    pub fn delayed(&self) -> u64 {
        self.delayed.len() as u64
    }
    /// Whether a FETCH would find something now.
    pub fn has_ready(&self, seq: &Seq) -> bool {
        !self.retry_set.is_empty() || next_unscheduled(seq, self.cursor, self.until(seq)).is_some()
    }

    /// Moves up to `take.max_messages` ready messages (at least one if any,
    /// then within `take.max_bytes` of payload and properties) to in flight for
    /// `take.owner`, with the ack deadline `take.deadline_ms`. Calls `out`
    /// for each, in delivery order.
    pub fn fetch(&mut self, seq: &Seq, take: Take, timers: &mut impl Timers, mut out: impl FnMut(Delivery)) -> u32 {
        let Take { owner, max_messages, max_bytes, deadline_ms } = take;
        let mut n = 0u32;
        let mut bytes = 0u64;
        // Taken out for the batch: one map lookup per FETCH, not per message.
        let mut owned = self.owners.remove(&owner).unwrap_or_default();
        while n < max_messages {
            let Some((id, prior)) = self.peek_ready(seq) else { break };
            let len = seq.get(id).map_or(0, |m| m.bytes());
            if n > 0 && bytes + len > max_bytes {
                break;
            }
            self.take_ready(id);
            if self.config.ordered {
                self.order.delivered(seq, id);
            }
            bytes += len;
            n += 1;
            let deliveries = prior.saturating_add(1);
            let timer = timers.arm(deadline_ms, id);
            self.inflight.insert(id, Inflight { timer, owner, deliveries });
            owned.ids.push(id);
            owned.live += 1;
            self.counters.delivered += 1;
            if prior > 0 {
                self.counters.redelivered += 1;
            }
            out(Delivery { id, deliveries });
        }
        if owned.live > 0 {
            self.owners.insert(owner, owned);
        }
        n
    }

    /// The next ready message and its deliveries so far, without taking
    /// it. Ordered by key, a message whose key's line has another holder
    /// is taken out of ready into the line (at most
    /// `FILTER_SKIPS_PER_CALL_MAX` per call, as filtered ones are).
    pub fn peek_ready(&mut self, seq: &Seq) -> Option<(MsgId, u16)> {
        if !self.config.ordered {
            return self.peek_any(seq);
        }
        for _ in 0..FILTER_SKIPS_PER_CALL_MAX {
            let (id, prior) = self.peek_any(seq)?;
            match self.order.admit(seq, id) {
                Admit::Go => return Some((id, prior)),
                Admit::Wait(key) => {
                    self.take_ready(id);
                    self.order.hold(id, prior, key);
                }
            }
        }
        None
    }

    /// The group is done with message `id` (acked, dead-lettered, moved):
    /// ordered by key, the next message of its key is ready.
    pub fn done_with(&mut self, id: MsgId) {
        if let Some((next, deliveries)) = self.order.done(id) {
            self.requeue(next, deliveries);
        }
    }

    /// The next ready message, whatever its key.
    fn peek_any(&mut self, seq: &Seq) -> Option<(MsgId, u16)> {
        while let Some(&id) = self.retry.front() {
            if let Some(&d) = self.retry_set.get(&id) {
                return Some((id, d));
            }
            self.retry.pop_front();
        }
        let id = self.next_passing(seq)?;
        // `carried` is empty except just after a restart: skip the hash.
        let prior = if self.carried.is_empty() { 0 } else { self.carried.get(&id).copied().unwrap_or(0) };
        Some((id, prior))
    }

    /// The next live visible id at or after the cursor that the filter
    /// passes, stepping the cursor over those it does not (noted in
    /// `skipped`), at most `FILTER_SKIPS_PER_CALL_MAX` at a time.
    fn next_passing(&mut self, seq: &Seq) -> Option<MsgId> {
        let until = self.until(seq);
        let mut skips = 0;
        loop {
            let id = seq.next_live(self.cursor, until)?;
            // A scheduled message is stepped over: when its time comes,
            // every group whose cursor passed it gets it back for retry
            // (`Topic::fall_due`).
            if seq.scheduled(id) {
                if skips == FILTER_SKIPS_PER_CALL_MAX {
                    return None;
                }
                skips += 1;
                self.cursor = id + 1;
                continue;
            }
            if !self.decides(seq) || self.passes(seq, id) {
                return Some(id);
            }
            if skips == FILTER_SKIPS_PER_CALL_MAX {
                return None;
            }
            skips += 1;
            self.cursor = id + 1;
            self.carried.remove(&id);
            self.counters.filtered += 1;
            self.skipped.push(id);
        }
    }

    /// Ids back for retry, in the order they came back.
    pub fn retry_ids(&self) -> Vec<MsgId> {
        let mut ids: Vec<MsgId> = self.retry.iter().copied().filter(|id| self.retry_set.contains_key(id)).collect();
        let mut seen = IdMap::default();
        ids.retain(|id| seen.insert(*id, ()).is_none());
        ids
    }

    /// Takes message `id` out of retry (a move: REDRIVE naming a group).
    /// False if it is not back for retry.
    pub fn take_retried(&mut self, id: MsgId) -> bool {
        self.retry_set.remove(&id).is_some()
    }

    /// Takes message `id`, at or after the cursor, out of ready for a move
    /// (REDRIVE naming a group), stepping the cursor past it: the messages
    /// `passed` between the cursor and it (in id order) go back for retry,
    /// so that they stay ready, still in id order. A restart rebuilds the
    /// same: the cursor past the highest id the group is done with, what it
    /// still needs below it back for retry.
    pub fn take_ahead(&mut self, id: MsgId, passed: &mut Vec<MsgId>) {
        debug_assert!(id >= self.cursor, "message {id} taken from below the cursor {}", self.cursor);
        for p in passed.drain(..) {
            let d = self.carried.remove(&p).unwrap_or(0);
            self.requeue(p, d);
        }
        self.cursor = id + 1;
        self.carried.remove(&id);
    }

    /// Takes the message `peek_ready` returned out of ready.
    pub fn take_ready(&mut self, id: MsgId) {
        if self.retry.front() == Some(&id) {
            self.retry.pop_front();
            self.retry_set.remove(&id);
        } else {
            debug_assert!(id >= self.cursor, "message {id} taken from below the cursor {}", self.cursor);
            self.cursor = id + 1;
            if !self.carried.is_empty() {
                self.carried.remove(&id);
            }
        }
    }

    fn disown(&mut self, owner: ConsumerId) {
        if let Some(o) = self.owners.get_mut(&owner) {
            o.live = o.live.saturating_sub(1);
            if o.live == 0 {
                self.owners.remove(&owner);
            } else if o.ids.len() > 2 * o.live as usize + 64 {
                let inflight = &self.inflight;
                o.ids.retain(|id| inflight.get(id).is_some_and(|f| f.owner == owner));
            }
        }
    }

    /// Acknowledges a delivered message: the group is done with it. False
    /// if it was not delivered and unacknowledged (unknown, never
    /// delivered, acked, dead-lettered).
    pub fn ack(&mut self, id: MsgId, timers: &mut impl Timers) -> bool {
        if let Some(f) = self.inflight.remove(&id) {
            timers.disarm(f.timer);
            self.disown(f.owner);
        } else if let Some((timer, _)) = self.delayed.remove(&id) {
            timers.disarm(timer);
            self.delay_wall.remove(&id);
            self.retry_waits.remove(&id);
        } else if self.retry_set.remove(&id).is_none() {
            return false;
        }
        self.counters.acked += 1;
        true
    }

    /// A message left the sequence: forgets what the group carried for it.
    pub fn forget(&mut self, id: MsgId) {
        if !self.carried.is_empty() {
            self.carried.remove(&id);
        }
        self.forget_nack_reason(id);
    }

    /// Extends the deadline of an in-flight message.
    pub fn touch(&mut self, id: MsgId, deadline_ms: u64, timers: &mut impl Timers) -> bool {
        let Some(f) = self.inflight.get_mut(&id) else { return false };
        timers.disarm(f.timer);
        f.timer = timers.arm(deadline_ms, id);
        true
    }

    /// A failed delivery: back to ready (`delay_until_ms` None), delayed, or
    /// out of deliveries.
    fn give_back(
        &mut self,
        id: MsgId,
        deliveries: u16,
        delay_until_ms: Option<u64>,
        reason: DeadReason,
        policy: Policy,
        timers: &mut impl Timers,
    ) -> Returned {
        if policy.dead_letters && (deliveries >= policy.max_deliveries || reason == DeadReason::Rejected) {
            return Returned::Dead(DeadInfo { origin_id: id, origin_deliveries: deliveries, reason });
        }
        match delay_until_ms {
            Some(t) => {
                let timer = timers.arm(t, id);
                self.delayed.insert(id, (timer, deliveries));
            }
            None => self.requeue(id, deliveries),
        }
        Returned::Retry
    }

    /// Puts a message back in ready (the back of the retry queue).
    pub fn requeue(&mut self, id: MsgId, deliveries: u16) {
        self.retry.push_back(id);
        self.retry_set.insert(id, deliveries);
    }

    /// NACK: `delay_until_ms` None returns it at once. None if `id` is not
    /// in flight.
    pub fn nack(
        &mut self,
        id: MsgId,
        delay_until_ms: Option<u64>,
        dead_letter: bool,
        policy: Policy,
        timers: &mut impl Timers,
    ) -> Option<Returned> {
        let f = self.inflight.remove(&id)?;
        timers.disarm(f.timer);
        self.disown(f.owner);
        self.counters.nacked += 1;
        let reason = if dead_letter { DeadReason::Rejected } else { DeadReason::Nacked };
        Some(self.give_back(id, f.deliveries, delay_until_ms, reason, policy, timers))
    }

    /// A timer of this group fired for `id`: an ack deadline (the message
    /// waits for retry until `retry_until_ms` if given, else is ready
    /// again) or the end of a delay. Every state change disarms the
    /// message's timer, so a timer that fires is always the current one;
    /// an id in neither table (its topic was purged) is ignored.
    pub fn timer_fired(
        &mut self,
        id: MsgId,
        retry_until_ms: Option<u64>,
        policy: Policy,
        timers: &mut impl Timers,
    ) -> Option<Returned> {
        if let Some(f) = self.inflight.remove(&id) {
            self.disown(f.owner);
            self.counters.expired += 1;
            return Some(self.give_back(id, f.deliveries, retry_until_ms, DeadReason::AckTimeout, policy, timers));
        }
        let (_, deliveries) = self.delayed.remove(&id)?;
        self.delay_wall.remove(&id);
        self.retry_waits.remove(&id);
        self.requeue(id, deliveries);
        Some(Returned::Retry)
    }

    /// A consumer disconnected: everything in flight to it returns at once.
    /// Calls `dead` for each message out of deliveries. Returns the
    /// messages that went back to ready, with their deliveries (for the
    /// log's Requeue record).
    pub fn disconnect(
        &mut self,
        owner: ConsumerId,
        policy: Policy,
        timers: &mut impl Timers,
        mut dead: impl FnMut(MsgId, DeadInfo),
    ) -> Vec<(MsgId, u16)> {
        let Some(owned) = self.owners.remove(&owner) else { return Vec::new() };
        let mut returned = Vec::new();
        for id in owned.ids {
            let Some(f) = self.inflight.get(&id).copied() else { continue };
            if f.owner != owner {
                continue;
            }
            self.inflight.remove(&id);
            timers.disarm(f.timer);
            match self.give_back(id, f.deliveries, None, DeadReason::ConsumerLost, policy, timers) {
                Returned::Dead(info) => dead(id, info),
                Returned::Retry => returned.push((id, f.deliveries)),
            }
        }
        returned
    }

    /// Whether ready message `id` waits behind the message of its key the
    /// group has outstanding (a group ordered by key).
    pub fn behind_key(&self, id: MsgId) -> bool {
        self.order.holds_back(id)
    }

    /// The deliveries so far of a message that is ready, delayed or in
    /// flight (for the log's requeue records and compaction).
    pub fn deliveries(&self, id: MsgId) -> u16 {
        if let Some(f) = self.inflight.get(&id) {
            f.deliveries
        } else if let Some(d) = self.retry_set.get(&id) {
            *d
        } else if let Some((_, d)) = self.delayed.get(&id) {
            *d
        } else if let Some(d) = self.order.waiting_deliveries(id) {
            d
        } else {
            self.carried.get(&id).copied().unwrap_or(0)
        }
    }

    /// Drops everything the group holds (PURGE, DELETE) and disarms its
    /// timers; it starts again at `cursor`. The counters stay.
    pub fn clear(&mut self, cursor: MsgId, timers: &mut impl Timers) {
        for f in self.inflight.values() {
            timers.disarm(f.timer);
        }
        for (t, _) in self.delayed.values() {
            timers.disarm(*t);
        }
        let (name, config, counters) =
            (std::mem::take(&mut self.name), std::mem::take(&mut self.config), self.counters);
        let (consumers, members) = (self.consumers, std::mem::take(&mut self.members));
        *self = Group { id: self.id, name, config, cursor, counters, consumers, members, ..Group::default() };
    }

    /// Recovery: sets where the group reads from, and what it still needs
    /// below that (`retry`, in id order, with deliveries so far) and the
    /// deliveries carried for messages at or above it.
    /// Recovery: the messages whose last allowed delivery the crash cut
    /// (`Group::cut`).
    pub fn set_cut(&mut self, cut: IdMap<()>) {
        self.cut = cut;
    }

    pub fn restore(&mut self, cursor: MsgId, retry: Vec<(MsgId, u16)>, carried: IdMap<u16>) {
        self.cursor = cursor;
        for (id, d) in retry {
            self.requeue(id, d);
        }
        self.carried = carried;
    }
}
