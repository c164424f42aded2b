//! `Topic`: one `Seq` and the groups that read it. Today every topic has
//! one group, the default one; the methods name the group they act on, so
//! that more groups are more rows in `others`, not a new shape. (The
//! default group has a field of its own so that a topic with no other
//! group pays nothing for them on its hot paths.)
//!
//! What ties the two together is release: a message leaves the sequence
//! once every group is done with it (acked, dead-lettered, redriven), and
//! not before (`Topic::done`).

use super::group::{Group, Policy};
use super::seq::{Body, Seq};
use super::{ConsumerId, Counters, Delivery, GroupId, MsgId, Returned, Settings, Stored, Take, Timers};
use crate::codec::{DeadInfo, Props};

/// A message recovery met below its topic's highest id so far (compaction
/// copied it forward), kept aside until `Topic::merge`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stray {
    /// Broker wall clock at produce, ms since the Unix epoch.
    pub born_ms: u64,
    /// Deliveries so far.
    pub deliveries: u16,
    /// Present for a message in a dead-letter topic.
    pub dead: Option<DeadInfo>,
    /// Its properties blob, validated when its record was read.
    pub props: Vec<u8>,
    pub payload: Vec<u8>,
}

/// One topic.
pub struct Topic {
    pub name: Box<str>,
    pub settings: Settings,
    /// The messages.
    pub seq: Seq,
    /// The default group: every topic has it.
    default: Group,
    /// The other groups reading it (none until named groups come).
    others: Vec<Group>,
    /// Messages produced to it since the broker started (the other
    /// counters are each group's).
    produced: u64,
    /// Whether it is a dead-letter topic: its messages never dead-letter.
    is_dlq: bool,
}

impl Topic {
    /// A topic whose first message will have id `first_id`; `is_dlq` says
    /// whether it is a dead-letter topic (the topic table knows by name).
    pub fn new(name: &str, is_dlq: bool, settings: Settings, first_id: MsgId) -> Topic {
        let seq = Seq::new(first_id);
        let next = seq.next_id();
        Topic {
            name: name.into(),
            settings,
            seq,
            default: Group::new(GroupId::DEFAULT, next),
            others: Vec::new(),
            produced: 0,
            is_dlq,
        }
    }

    pub fn is_dlq(&self) -> bool {
        self.is_dlq
    }

    /// Names the topic (recovery meets some topics' names late).
    pub fn set_name(&mut self, name: &str, is_dlq: bool) {
        self.name = name.into();
        self.is_dlq = is_dlq;
    }

    /// Group `g`. Groups are named by the broker, which only names groups
    /// that exist.
    pub fn group(&self, g: GroupId) -> &Group {
        if g == GroupId::DEFAULT {
            return &self.default;
        }
        match self.others.iter().find(|x| x.id() == g) {
            Some(group) => group,
            None => unreachable!("topic {} has no group {g:?}", self.name),
        }
    }

    fn group_mut(&mut self, g: GroupId) -> &mut Group {
        self.parts(g).1
    }

    /// The sequence and group `g`, borrowed apart.
    fn parts(&mut self, g: GroupId) -> (&Seq, &mut Group) {
        if g == GroupId::DEFAULT {
            return (&self.seq, &mut self.default);
        }
        match self.others.iter_mut().find(|x| x.id() == g) {
            Some(group) => (&self.seq, group),
            None => unreachable!("topic {} has no group {g:?}", self.name),
        }
    }

    /// Adds a group that starts at the earliest message retained. Groups
    /// other than the default one come with the consumer-groups work; the
    /// tests add one to check that release waits for every group.
    #[cfg(test)]
    pub(crate) fn add_group(&mut self, g: GroupId) {
        assert!(g != GroupId::DEFAULT && self.others.iter().all(|x| x.id() != g), "group {g:?} exists");
        self.others.push(Group::new(g, 0));
    }

    /// The topic's settings, as a group's failed deliveries see them.
    fn policy(&self) -> Policy {
        Policy { max_deliveries: self.settings.max_deliveries, dead_letters: !self.is_dlq }
    }

    /// The counters of group `g`, with the topic's `produced`.
    pub fn counters(&self, g: GroupId) -> Counters {
        Counters { produced: self.produced, ..self.group(g).counters }
    }

    // -----------------------------------------------------------------------
    // Adding messages: a produce, a message moved from another topic, and
    // recovery.
    // -----------------------------------------------------------------------

    /// A client's produce: appends a message, not yet visible to consumers
    /// (until `publish`), with its tag set's reference, which the caller
    /// took (`Seq::intern_tags`, so that a batch is refused whole before
    /// any of it is stored). Returns its id and the born time stored (never
    /// below the topic's last one).
    pub fn produce<'b>(&mut self, born_ms: u64, m: impl Into<Body<'b>>) -> (MsgId, u64) {
        self.produced += 1;
        self.seq.append(born_ms, m)
    }

    /// Appends a message moved from another topic (dead-lettered, with
    /// where it came from, or redriven), keeping its born time even if
    /// older than this topic's last, and its properties (its tags interned
    /// in this topic's table: `m.tag_set`, the other topic's, is not read).
    /// Visible at the next `publish`.
    pub fn append_moved<'b>(&mut self, born_ms: u64, m: impl Into<Body<'b>>, dead: Option<DeadInfo>) -> MsgId {
        let mut m = m.into();
        m.tag_set = self.seq.intern_tags_unbounded(&m.props);
        self.produced += 1;
        let id = self.seq.next_id();
        self.seq.insert(id, born_ms, m);
        if let Some(d) = dead {
            self.seq.set_dead_info(id, d);
        }
        id
    }

    /// Recovery: stores a message with its deliveries so far (which count
    /// for the default group: version 1 of the log knows no other). Its
    /// tags are interned afresh from its properties (`m.tag_set` is not
    /// read: no reference was taken for it).
    pub fn restore<'b>(
        &mut self,
        id: MsgId,
        born_ms: u64,
        m: impl Into<Body<'b>>,
        deliveries: u16,
        dead: Option<DeadInfo>,
    ) {
        let mut m = m.into();
        m.tag_set = self.seq.intern_tags_unbounded(&m.props);
        self.seq.insert(id, born_ms, m);
        if let Some(d) = dead {
            self.seq.set_dead_info(id, d);
        }
        self.group_mut(GroupId::DEFAULT).restore_deliveries(id, deliveries);
    }

    /// Recovery: stores a stray (`merge`).
    fn restore_stray(&mut self, id: MsgId, s: &Stray) {
        let m = Body { props: Props::trusted(&s.props), tag_set: None, payload: &s.payload };
        self.restore(id, s.born_ms, m, s.deliveries, s.dead);
    }

    /// Recovery: adds messages met out of id order (compaction copied them
    /// forward in the log), rebuilding the sequence in id order; the
    /// messages it holds keep their tag sets.
    pub fn merge(&mut self, strays: impl Iterator<Item = (MsgId, Stray)>) {
        let mut old = std::mem::take(&mut self.seq);
        self.seq = Seq::new(1);
        self.seq.set_tags(old.take_tags());
        let mut strays = strays.peekable();
        for m in old.iter_live() {
            while let Some((id, stray)) = strays.next_if(|s| s.0 < m.id) {
                self.restore_stray(id, &stray);
            }
            self.seq.insert(m.id, m.born_ms, m.body());
            if let Some(d) = old.dead_info(m.id) {
                self.seq.set_dead_info(m.id, d);
            }
        }
        for (id, stray) in strays {
            self.restore_stray(id, &stray);
        }
        self.seq.bump_next_id(old.next_id());
    }

    /// Recovery: sets the deliveries of a stored message (a Requeue
    /// record, or a copy of a message stored already).
    pub fn restore_deliveries(&mut self, g: GroupId, id: MsgId, deliveries: u16) {
        if self.seq.contains(id) {
            self.group_mut(g).set_deliveries(id, deliveries);
        }
    }

    /// Ends recovery: every live message is ready, in id order.
    pub fn restore_done(&mut self) {
        self.seq.publish();
        self.default.restore_done(&self.seq);
        for g in &mut self.others {
            g.restore_done(&self.seq);
        }
    }

    /// Makes every appended message visible.
    pub fn publish(&mut self) {
        self.seq.publish();
    }

    /// Withdraws the unpublished messages with ids in `first..first+count`
    /// (their produce was not made durable). Their ids are not reused.
    pub fn withdraw(&mut self, first: MsgId, count: u32) {
        self.produced -= self.seq.withdraw(first, count);
    }

    // -----------------------------------------------------------------------
    // Release: a message leaves the sequence once no group needs it.
    // -----------------------------------------------------------------------

    /// Group `g` is done with message `id` (acked, dead-lettered,
    /// redriven): it leaves the sequence unless another group still needs
    /// it.
    fn done(&mut self, g: GroupId, id: MsgId) {
        debug_assert!(!self.group(g).needs(id), "group {g:?} is done with {id} and still needs it");
        self.release_unless_needed(g, id);
    }

    /// Releases message `id` unless a group other than `g` still needs it.
    fn release_unless_needed(&mut self, g: GroupId, id: MsgId) {
        if self.others.is_empty() {
            // The default group is the only one: nobody else to ask.
            self.seq.release(id);
            self.default.forget(id);
            return;
        }
        let others_need = |h: &Group| h.id() != g && h.needs(id);
        if self.others.iter().any(others_need) || others_need(&self.default) {
            return;
        }
        self.release(id);
    }

    /// Drops a message from the sequence and from what every group carries
    /// for it.
    fn release(&mut self, id: MsgId) {
        self.seq.release(id);
        self.default.forget(id);
        for g in &mut self.others {
            g.forget(id);
        }
    }

    /// Recovery: a Remove record says group `g` was done with `id`.
    pub fn restore_done_with(&mut self, g: GroupId, id: MsgId) {
        // The group's cursor is set only when recovery ends.
        self.release_unless_needed(g, id);
    }

    /// The broker moved message `id` to the dead-letter topic for group
    /// `g`: the group is done with it.
    pub fn dead_lettered(&mut self, g: GroupId, id: MsgId) {
        self.group_mut(g).counters.dead_lettered += 1;
        self.done(g, id);
    }

    // -----------------------------------------------------------------------
    // Consumers: each names its group.
    // -----------------------------------------------------------------------

    /// Ready messages of group `g`.
    pub fn ready(&self, g: GroupId) -> u64 {
        self.group(g).ready(&self.seq)
    }
    pub fn inflight(&self, g: GroupId) -> u64 {
        self.group(g).inflight()
    }
    pub fn delayed(&self, g: GroupId) -> u64 {
        self.group(g).delayed()
    }
    /// Whether a FETCH for group `g` would find something now.
    pub fn has_ready(&self, g: GroupId) -> bool {
        self.group(g).has_ready(&self.seq)
    }

    /// `Group::fetch` for group `g`: `out` gets each delivery and the
    /// sequence, to read the message from.
    pub fn fetch(
        &mut self,
        g: GroupId,
        take: Take,
        timers: &mut impl Timers,
        mut out: impl FnMut(&Seq, Delivery),
    ) -> u32 {
        let (seq, group) = self.parts(g);
        group.fetch(seq, take, timers, |d| out(seq, d))
    }

    /// Acknowledges a delivered message for group `g`. False if it was not
    /// delivered and unacknowledged.
    pub fn ack(&mut self, g: GroupId, id: MsgId, timers: &mut impl Timers) -> bool {
        if !self.group_mut(g).ack(id, timers) {
            return false;
        }
        self.done(g, id);
        true
    }

    /// Extends the deadline of a message in flight to group `g`.
    pub fn touch(&mut self, g: GroupId, id: MsgId, deadline_ms: u64, timers: &mut impl Timers) -> bool {
        self.group_mut(g).touch(id, deadline_ms, timers)
    }

    /// NACK for group `g`: `delay_until_ms` None returns it at once. None
    /// if `id` is not in flight.
    pub fn nack(
        &mut self,
        g: GroupId,
        id: MsgId,
        delay_until_ms: Option<u64>,
        dead_letter: bool,
        timers: &mut impl Timers,
    ) -> Option<Returned> {
        let policy = self.policy();
        self.group_mut(g).nack(id, delay_until_ms, dead_letter, policy, timers)
    }

    /// A timer of group `g` fired for `id` (`Group::timer_fired`).
    pub fn timer_fired(&mut self, g: GroupId, id: MsgId, timers: &mut impl Timers) -> Option<Returned> {
        let policy = self.policy();
        self.group_mut(g).timer_fired(id, policy, timers)
    }

    /// A consumer of group `g` disconnected (`Group::disconnect`).
    pub fn disconnect(
        &mut self,
        g: GroupId,
        owner: ConsumerId,
        timers: &mut impl Timers,
        dead: impl FnMut(MsgId, DeadInfo),
    ) -> u64 {
        let policy = self.policy();
        self.group_mut(g).disconnect(owner, policy, timers, dead)
    }

    /// Puts a message back in group `g`'s ready (its dead-letter topic
    /// could not take it).
    pub fn requeue(&mut self, g: GroupId, id: MsgId, deliveries: u16) {
        self.group_mut(g).requeue(id, deliveries);
    }

    /// Group `g`'s deliveries so far of message `id`.
    pub fn deliveries(&self, g: GroupId, id: MsgId) -> u16 {
        self.group(g).deliveries(id)
    }

    /// Removes every unacknowledged message (PURGE, DELETE), published or
    /// not, and disarms every group's timers. Returns how many were
    /// removed.
    pub fn purge(&mut self, timers: &mut impl Timers) -> u64 {
        let next_id = self.seq.next_id();
        self.default.clear(next_id, timers);
        for g in &mut self.others {
            g.clear(next_id, timers);
        }
        let ids: Vec<MsgId> = self.seq.iter_live().map(|m| m.id).collect();
        for &id in &ids {
            self.release(id);
        }
        ids.len() as u64
    }

    /// Takes up to `max` ready messages out of group `g` for a redrive:
    /// calls `out` with each (and its dead-letter origin), and the group is
    /// done with it once `out` took it (false stops).
    pub fn drain_ready(
        &mut self,
        g: GroupId,
        max: u64,
        mut out: impl FnMut(Stored<'_>, Option<DeadInfo>) -> bool,
    ) -> u64 {
        let mut n = 0;
        while n < max {
            let (seq, group) = self.parts(g);
            let Some((id, _)) = group.peek_ready(seq) else { break };
            let Some(m) = self.seq.get(id) else { break };
            if !out(m, self.seq.dead_info(id)) {
                break;
            }
            self.group_mut(g).take_ready(id);
            self.done(g, id);
            n += 1;
        }
        n
    }
}
