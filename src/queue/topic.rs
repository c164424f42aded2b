//! `Topic`: one `Seq` and the consumer groups that read it (a short list:
//! `groups_per_topic_max`), each with its own cursor, in-flight table,
//! retry, delays and settings. The methods name the group they act on.
//!
//! What ties the two together is release: a message leaves the sequence
//! once every group is done with it (acked, dead-lettered, redriven,
//! filtered out, or below where the group started), and not before
//! (`Topic::done`, O(groups) per event, no memory per message). A topic
//! with no group keeps everything. Creating, deleting or moving a group can
//! leave many messages that no group needs: the sweep releases them in
//! bounded slices (`Topic::sweep`).

use super::group::{Group, GroupConfig, Policy};
use super::inspect::DeadNotes;
use super::keys::KeyIndex;
use super::seq::{Body, Seq};
use super::{ConsumerId, Counters, Delivery, GroupId, MsgId, Returned, Settings, Stored, Take, Timers};
use crate::codec::group::Start;
use crate::codec::{DeadInfo, Props};

/// Most ids one sweep step looks at (`Topic::sweep`): releasing what a
/// deleted or moved group held goes in slices, so one DELETE_GROUP on a
/// topic of millions never stalls the loop.
pub const SWEEP_IDS_PER_STEP_MAX: u32 = 16_384;

/// A message recovery met below its topic's highest id so far (compaction
/// copied it forward), kept aside until `Topic::merge`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stray {
    /// Broker wall clock at produce, ms since the Unix epoch.
    pub born_ms: u64,
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
    /// The groups reading it, in creation order. A topic with none keeps
    /// every message for the first group to come (as NSQ keeps a
    /// channel-less topic's messages for its first channel).
    groups: Vec<Group>,
    /// The id the next group created gets: never reused within the topic.
    next_group_id: u32,
    /// The number of the next broadcast member (its id has
    /// `GroupId::MEMBER_BIT`).
    next_member: u32,
    /// The next id a sweep looks at, if one is under way: messages below
    /// it were checked, those from it on may be held by no group.
    sweep_from: Option<MsgId>,
    /// Messages produced to it since the broker started (the other
    /// counters are each group's).
    produced: u64,
    /// Whether it is a dead-letter topic: its messages never dead-letter.
    is_dlq: bool,
    /// Its keyed messages by key (LOOKUP), a cache of the log.
    keys: KeyIndex,
    /// Its recent dead letters, by group (what PEEK and LOOKUP say of a
    /// message a group dead-lettered).
    pub(super) dead_notes: DeadNotes,
}

impl Topic {
    /// A topic with no group, whose first message will have id
    /// `first_id`; `is_dlq` says whether it is a dead-letter topic (the
    /// topic table knows by name).
    pub fn new(name: &str, is_dlq: bool, settings: Settings, first_id: MsgId) -> Topic {
        Topic {
            name: name.into(),
            settings,
            seq: Seq::new(first_id),
            groups: Vec::new(),
            next_group_id: 1,
            next_member: 0,
            sweep_from: None,
            produced: 0,
            is_dlq,
            keys: KeyIndex::default(),
            dead_notes: DeadNotes::default(),
        }
    }

    /// The key index.
    pub fn keys(&self) -> &KeyIndex {
        &self.keys
    }

    /// Bounds the key index (`KeyIndex::set_bounds`).
    pub fn set_key_bounds(&mut self, per_key_max: u32, entries_max: u32) {
        self.keys.set_bounds(per_key_max, entries_max);
    }

    /// Indexes message `id` by its key, if it has one.
    fn index_key(&mut self, id: MsgId, props: &Props<'_>) {
        if let Some(key) = props.key() {
            self.keys.insert(key, id);
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

    /// Group `g`, if the topic has it.
    pub fn group(&self, g: GroupId) -> Option<&Group> {
        self.groups.iter().find(|x| x.id() == g)
    }

    /// The group named `name`.
    pub fn group_named(&self, name: &str) -> Option<&Group> {
        self.groups.iter().find(|x| x.name() == name)
    }

    /// Every group, in creation order (not a broadcast group's members).
    pub fn groups(&self) -> impl Iterator<Item = &Group> + '_ {
        self.groups.iter().filter(|g| !g.id().is_member())
    }

    /// The id of the `i`-th group, broadcast members included (to visit
    /// every group without borrowing the topic).
    pub fn group_id_at(&self, i: usize) -> Option<GroupId> {
        self.groups.get(i).map(Group::id)
    }

    pub(super) fn group_mut(&mut self, g: GroupId) -> Option<&mut Group> {
        self.groups.iter_mut().find(|x| x.id() == g)
    }

    /// The sequence and group `g`, borrowed apart.
    fn parts(&mut self, g: GroupId) -> Option<(&Seq, &mut Group)> {
        let group = self.groups.iter_mut().find(|x| x.id() == g)?;
        Some((&self.seq, group))
    }

    /// The id the next group created gets (Topic records restate it).
    pub fn next_group_id(&self) -> u32 {
        self.next_group_id
    }

    /// Raises the next group id (recovery).
    pub fn bump_next_group_id(&mut self, next: u32) {
        self.next_group_id = self.next_group_id.max(next);
    }

    /// Where `start` puts a group: the first id it needs.
    pub fn start_cursor(&self, start: Start) -> MsgId {
        match start {
            // The oldest message held (so that a reply names a real id).
            Start::Earliest => self.seq.next_live(0, self.seq.next_id()).unwrap_or(self.seq.next_id()),
            Start::Latest => self.seq.next_id(),
            // An id past the newest starts with the next message produced.
            Start::Id(id) => id.min(self.seq.next_id()),
            Start::Time(ms) => self.seq.first_born_at_or_after(ms).unwrap_or(self.seq.next_id()),
        }
    }

    /// Adds group `name` with the next group id, reading from `cursor`.
    /// Messages below it that no other group needs are released by the
    /// sweep (`sweep`). Returns its id.
    pub fn add_group(&mut self, name: &str, config: GroupConfig, cursor: MsgId) -> GroupId {
        let g = GroupId(self.next_group_id);
        self.next_group_id += 1;
        self.insert_group(Group::with(g, name, config, cursor));
        g
    }

    /// Adds a group as it is (recovery, or the default group with its id).
    pub fn insert_group(&mut self, group: Group) {
        assert!(self.group(group.id()).is_none(), "group {:?} exists", group.id());
        self.next_group_id = self.next_group_id.max(group.id().0 + 1);
        let cursor = group.cursor();
        self.groups.push(group);
        self.start_sweep(0, cursor);
    }

    /// Removes group `g` (a broadcast group with its members), disarming
    /// its timers: what only it held goes by the sweep. False if there is
    /// no such group.
    pub fn delete_group(&mut self, g: GroupId, timers: &mut impl Timers) -> bool {
        let Some(i) = self.groups.iter().position(|x| x.id() == g) else { return false };
        let mut group = self.groups.remove(i);
        for m in std::mem::take(&mut group.members).into_values() {
            self.delete_group(m, timers);
        }
        group.clear(0, timers);
        self.start_sweep(0, MsgId::MAX);
        true
    }

    /// Moves group `g` to `cursor`, dropping what it had in flight, back
    /// for retry or delayed (Redis's XGROUP SETID); a broadcast group's
    /// members all move. False if there is no such group.
    pub fn reset_group(&mut self, g: GroupId, cursor: MsgId, timers: &mut impl Timers) -> bool {
        let Some(group) = self.group_mut(g) else { return false };
        let members: Vec<GroupId> = group.members().collect();
        // A broadcast group itself needs nothing, wherever it is moved.
        if !group.config.broadcast {
            let old = group.cursor();
            group.clear(cursor, timers);
            self.start_sweep(0, old.max(cursor));
        }
        for m in members {
            self.reset_group(m, cursor, timers);
        }
        true
    }

    /// The group consumer `c` acts on when it names group `g`: `g`
    /// itself, or for a broadcast group the consumer's member (None if it
    /// has none).
    pub fn member(&self, g: GroupId, c: ConsumerId) -> Option<GroupId> {
        let group = self.group(g)?;
        if !group.config.broadcast {
            return Some(g);
        }
        group.members.get(&c).copied()
    }

    /// `member`, making consumer `c` a member of broadcast group `g` if it
    /// is not: its position starts at the tail (the next message produced).
    pub fn join_member(&mut self, g: GroupId, c: ConsumerId) -> Option<GroupId> {
        if let Some(m) = self.member(g, c) {
            return Some(m);
        }
        let parent = self.group(g)?;
        let (name, config) = (parent.name().to_string(), parent.config.clone());
        let m = GroupId(GroupId::MEMBER_BIT | self.next_member);
        self.next_member = (self.next_member + 1) % GroupId::MEMBER_BIT;
        self.groups.push(Group::with(m, &name, config, self.seq.next_id()));
        self.group_mut(g)?.members.insert(c, m);
        Some(m)
    }

    /// Broadcast member `m` (of consumer `c`) left: its position and what
    /// it held go; what no one else needs is swept.
    pub fn leave_member(&mut self, m: GroupId, c: ConsumerId, timers: &mut impl Timers) {
        for g in &mut self.groups {
            if g.members.get(&c) == Some(&m) {
                g.members.remove(&c);
            }
        }
        self.delete_group(m, timers);
    }

    /// Changes group `g`'s settings.
    pub fn configure_group(&mut self, g: GroupId, config: GroupConfig) {
        if let Some(group) = self.group_mut(g) {
            group.set_config(config);
        }
    }

    /// Notes that ids below `until` may be held by no group: the sweep
    /// looks at them from `from`.
    fn start_sweep(&mut self, from: MsgId, until: MsgId) {
        if until > from {
            self.sweep_from = Some(self.sweep_from.map_or(from, |f| f.min(from)));
        }
    }

    /// Whether a sweep is under way.
    pub fn sweeping(&self) -> bool {
        self.sweep_from.is_some()
    }

    /// One slice of a sweep: releases live messages no group needs, looking
    /// at most at `SWEEP_IDS_PER_STEP_MAX` of them. Returns how many it
    /// released. A topic with no group keeps everything: nothing to sweep.
    pub fn sweep(&mut self) -> u64 {
        let Some(mut id) = self.sweep_from.take() else { return 0 };
        if self.groups.is_empty() {
            return 0;
        }
        let mut released = 0;
        for _ in 0..SWEEP_IDS_PER_STEP_MAX {
            let Some(live) = self.seq.next_live(id, self.seq.next_id()) else { return released };
            if self.release_unwanted(live, None) {
                released += 1;
            }
            id = live + 1;
        }
        self.sweep_from = Some(id);
        released
    }

    /// Group `g`'s settings, as its failed deliveries see them: its own
    /// max deliveries, or the topic's.
    pub(super) fn policy(&self, g: GroupId) -> Policy {
        let own = self.group(g).map_or(0, |x| x.config.max_deliveries);
        let max_deliveries = if own == 0 { self.settings.max_deliveries } else { own };
        Policy { max_deliveries, dead_letters: !self.is_dlq }
    }

    /// The ack timeout of a delivery of group `g` whose FETCH or TOUCH
    /// asked for `asked_ms` (0: the group's, else the topic's).
    pub fn ack_timeout_ms(&self, g: GroupId, asked_ms: u32) -> u32 {
        let own = self.group(g).map_or(0, |x| x.config.ack_timeout_ms);
        [asked_ms, own, self.settings.ack_timeout_ms].into_iter().find(|&t| t != 0).unwrap_or(0)
    }

    /// The counters of group `g` (zero if it does not exist), with the
    /// topic's `produced`.
    pub fn counters(&self, g: GroupId) -> Counters {
        let group = self.group(g).map(|x| x.counters).unwrap_or_default();
        Counters { produced: self.produced, ..group }
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
        let m = m.into();
        let (id, born_ms) = self.seq.append(born_ms, m);
        self.index_key(id, &m.props);
        (id, born_ms)
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
        self.index_key(id, &m.props);
        id
    }

    /// Recovery: stores a message (its groups are restored at the end).
    /// Its tags are interned afresh from its properties (`m.tag_set` is
    /// not read: no reference was taken for it).
    pub fn restore<'b>(&mut self, id: MsgId, born_ms: u64, m: impl Into<Body<'b>>, dead: Option<DeadInfo>) {
        let mut m = m.into();
        m.tag_set = self.seq.intern_tags_unbounded(&m.props);
        self.seq.insert(id, born_ms, m);
        if let Some(d) = dead {
            self.seq.set_dead_info(id, d);
        }
        self.index_key(id, &m.props);
    }

    /// Recovery: stores a stray (`merge`).
    fn restore_stray(&mut self, id: MsgId, s: &Stray) {
        let m = Body { props: Props::trusted(&s.props), tag_set: None, payload: &s.payload };
        self.restore(id, s.born_ms, m, s.dead);
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

    /// Ends recovery: every message is visible, each group steps over what
    /// its filter drops (no record says it did), and a full sweep releases
    /// what no group needs (the groups were restored with their state).
    pub fn restore_done(&mut self) {
        self.seq.publish();
        let ids: Vec<GroupId> = self.groups.iter().map(Group::id).collect();
        for g in ids {
            self.has_ready(g);
        }
        self.start_sweep(0, MsgId::MAX);
        while self.sweeping() {
            self.sweep();
        }
    }

    /// Makes every appended message visible. One that no group needs (the
    /// topic's only groups are broadcast groups without members, began
    /// after it, or have filters that drop it) leaves at once; with no
    /// group at all, every one stays. A group without a filter that has
    /// not passed the first of them needs them all: then nothing is looked
    /// at, so a produce costs no work per group unless every group filters.
    pub fn publish(&mut self) {
        let from = self.seq.visible_id();
        self.seq.publish();
        let seq = &self.seq;
        if self.groups.is_empty() || self.groups.iter().any(|g| g.needs(from) && !g.config.broadcast && !g.decides(seq))
        {
            return;
        }
        let mut id = from;
        while let Some(live) = self.seq.next_live(id, self.seq.visible_id()) {
            self.release_unwanted(live, None);
            id = live + 1;
        }
    }

    /// Withdraws the unpublished messages with ids in `first..first+count`
    /// (their produce was not made durable). Their ids are not reused.
    pub fn withdraw(&mut self, first: MsgId, count: u32) {
        for id in first..first + u64::from(count) {
            if let Some(key) = self.seq.get(id).and_then(|m| m.props.key()) {
                self.keys.forget(key, id);
            }
        }
        self.produced -= self.seq.withdraw(first, count);
    }

    // -----------------------------------------------------------------------
    // Release: a message leaves the sequence once no group needs it. (Where
    // retention would keep a message done by every group for replay.)
    // -----------------------------------------------------------------------

    /// Group `g` is done with message `id` (acked, dead-lettered,
    /// redriven, filtered out): it leaves the sequence unless another group
    /// still needs it. O(groups), no memory per message.
    fn done(&mut self, g: GroupId, id: MsgId) {
        debug_assert!(!self.group(g).is_some_and(|x| x.needs(id)), "group {g:?} is done with {id} and still needs it");
        if let Some(group) = self.group_mut(g) {
            group.forget_nack_reason(id);
            if group.config.ordered {
                group.done_with(id);
            }
        }
        self.release_unwanted(id, Some(g));
    }

    /// Releases message `id` if no group but `done` (which is done with
    /// it) still needs it, its filter decided (`Group::wants`): a message
    /// a group's filter drops is done for that group at once, before its
    /// cursor steps over it, and is counted in that group's `filtered`
    /// now, since the cursor will never meet it. A scheduled message stays
    /// until its time, and a topic with no group keeps everything. Returns
    /// whether it was released.
    fn release_unwanted(&mut self, id: MsgId, done: Option<GroupId>) -> bool {
        let seq = &self.seq;
        if self.groups.is_empty() || seq.scheduled(id) {
            return false;
        }
        // One pass in the common case (no filter has dropped it).
        let mut dropped = false;
        for h in self.groups.iter_mut().filter(|h| Some(h.id()) != done) {
            if h.wants(seq, id) {
                return false;
            }
            dropped |= h.cursor() <= id;
        }
        if dropped {
            for h in self.groups.iter_mut().filter(|h| h.cursor() <= id) {
                h.counters.filtered += 1;
            }
        }
        self.release(id);
        true
    }

    // -----------------------------------------------------------------------
    // Scheduled messages: stored, stepped over by every group's cursor
    // until their time, then ready for every group that passed them.
    // -----------------------------------------------------------------------

    /// Schedules message `id` (just produced, or recovered) at `due_ms`.
    pub fn schedule(&mut self, id: MsgId, due_ms: u64) {
        self.seq.schedule_at(id, due_ms);
    }

    /// CANCEL: removes scheduled message `id` from the topic. Returns when
    /// it was due; None if it is not scheduled.
    pub fn cancel(&mut self, id: MsgId) -> Option<u64> {
        let due = self.seq.schedule().due_ms(id)?;
        self.release(id);
        Some(due)
    }

    /// RESCHEDULE: moves scheduled message `id` to `due_ms`. False if it is
    /// not scheduled.
    pub fn reschedule(&mut self, id: MsgId, due_ms: u64) -> bool {
        if !self.seq.scheduled(id) {
            return false;
        }
        self.seq.schedule_at(id, due_ms);
        true
    }

    /// Makes up to `max` scheduled messages due at `now_ms` (wall clock)
    /// ready: each goes back for retry in every group whose cursor passed
    /// it (and passes its filter); a group whose cursor has not reached it
    /// gets it in turn. Calls `out` with each id. Returns how many came.
    pub fn fall_due(&mut self, now_ms: u64, max: u32, mut out: impl FnMut(MsgId)) -> u32 {
        let mut n = 0;
        while n < max {
            let Some((_, id)) = self.seq.pop_due(now_ms) else { break };
            n += 1;
            out(id);
            // An unpublished message has no group past it: nothing is
            // delivered before its produce is durable.
            self.give_due(id);
        }
        n
    }

    /// Message `id`'s time came: every group past it gets it.
    fn give_due(&mut self, id: MsgId) {
        for g in &mut self.groups {
            // A broadcast group itself needs nothing: its members do.
            if g.cursor() <= id || (g.config.broadcast && !g.id().is_member()) {
                continue;
            }
            if g.passes(&self.seq, id) {
                let d = g.deliveries(id);
                g.requeue(id, d);
            } else {
                g.counters.filtered += 1;
            }
        }
        self.release_unwanted(id, None);
    }

    /// Recovery: message `id`'s time came while the broker was down or
    /// before its log recorded that, and its groups were rebuilt without
    /// it (their cursors passed it): as `fall_due` for it alone.
    pub fn restore_due(&mut self, id: MsgId) {
        self.seq.unschedule(id);
        self.give_due(id);
    }

    /// Drops a message from the sequence and from what every group carries
    /// for it.
    fn release(&mut self, id: MsgId) {
        self.seq.release(id);
        for g in &mut self.groups {
            g.forget(id);
        }
    }

    /// Releases what group `g`'s filter stepped over, unless another group
    /// needs it.
    fn release_skipped(&mut self, g: GroupId) {
        let Some(group) = self.group_mut(g) else { return };
        if group.skipped.is_empty() {
            return;
        }
        let skipped = std::mem::take(&mut group.skipped);
        for &id in &skipped {
            self.done(g, id);
        }
        if let Some(group) = self.group_mut(g) {
            group.skipped = skipped;
            group.skipped.clear();
        }
    }

    /// The broker moved message `id` to the dead-letter topic for group
    /// `g`: the group is done with it.
    pub fn dead_lettered(&mut self, g: GroupId, id: MsgId) {
        let Some(group) = self.group_mut(g) else { return };
        group.counters.dead_lettered += 1;
        self.done(g, id);
    }

    // -----------------------------------------------------------------------
    // Consumers: each names its group. A group that does not exist has
    // nothing ready and holds nothing.
    // -----------------------------------------------------------------------

    /// Ready messages of group `g`. A topic without it counts what a group
    /// created now at the earliest message would find: every visible
    /// message but the scheduled ones.
    pub fn ready(&self, g: GroupId) -> u64 {
        match self.group(g) {
            Some(group) => group.ready(&self.seq),
            None => self.seq.unscheduled_in(0, self.seq.visible_id()),
        }
    }
    pub fn inflight(&self, g: GroupId) -> u64 {
        self.group(g).map_or(0, Group::inflight)
    }
    pub fn delayed(&self, g: GroupId) -> u64 {
        self.group(g).map_or(0, Group::delayed)
    }
    /// Whether message `id` of group `g` is in flight to consumer `c`.
    pub fn holds(&self, g: GroupId, id: MsgId, c: ConsumerId) -> bool {
        self.group(g).is_some_and(|x| x.holds(id, c))
    }

    /// Messages of group `g` in flight to consumer `c`.
    pub fn held_by(&self, g: GroupId, c: ConsumerId) -> u32 {
        self.group(g).map_or(0, |x| x.held_by(c))
    }
    /// Whether a FETCH for group `g` would find something now. Steps the
    /// group over messages its filter drops first (a bounded number).
    pub fn has_ready(&mut self, g: GroupId) -> bool {
        let Some((seq, group)) = self.parts(g) else { return false };
        let ready = group.peek_ready(seq).is_some();
        self.release_skipped(g);
        ready
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
        let Some((seq, group)) = self.parts(g) else { return 0 };
        let n = group.fetch(seq, take, timers, |d| out(seq, d));
        self.release_skipped(g);
        n
    }

    /// Acknowledges a delivered message for group `g`. False if it was not
    /// delivered and unacknowledged.
    pub fn ack(&mut self, g: GroupId, id: MsgId, timers: &mut impl Timers) -> bool {
        if !self.group_mut(g).is_some_and(|x| x.ack(id, timers)) {
            return false;
        }
        self.done(g, id);
        true
    }

    /// Extends the deadline of a message in flight to group `g`.
    pub fn touch(&mut self, g: GroupId, id: MsgId, deadline_ms: u64, timers: &mut impl Timers) -> bool {
        self.group_mut(g).is_some_and(|x| x.touch(id, deadline_ms, timers))
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
        let policy = self.policy(g);
        self.group_mut(g)?.nack(id, delay_until_ms, dead_letter, policy, timers)
    }

    /// Notes when delayed message `id` of group `g` is ready again, on the
    /// wall clock (`Group::note_delay_wall`).
    pub fn note_delay_wall(&mut self, g: GroupId, id: MsgId, ready_at_wall_ms: u64) {
        if let Some(group) = self.group_mut(g) {
            group.note_delay_wall(id, ready_at_wall_ms);
        }
    }

    /// Arms the NACK delays recovery found for group `g`.
    pub fn arm_restored(&mut self, g: GroupId, mono_ms: u64, wall_ms: u64, timers: &mut impl Timers) {
        if let Some(group) = self.group_mut(g) {
            group.arm_restored(mono_ms, wall_ms, timers);
        }
    }

    /// A timer of group `g` fired for `id` (`Group::timer_fired`).
    pub fn timer_fired(&mut self, g: GroupId, id: MsgId, timers: &mut impl Timers) -> Option<Returned> {
        self.timer_fired_retry(g, id, None, timers)
    }

    /// `timer_fired`, where a passed ack deadline makes the message wait
    /// for retry until `retry_until_ms` (`Topic::retry_wait_ms`).
    pub fn timer_fired_retry(
        &mut self,
        g: GroupId,
        id: MsgId,
        retry_until_ms: Option<u64>,
        timers: &mut impl Timers,
    ) -> Option<Returned> {
        let policy = self.policy(g);
        self.group_mut(g)?.timer_fired(id, retry_until_ms, policy, timers)
    }

    /// A consumer of group `g` disconnected (`Group::disconnect`).
    pub fn disconnect(
        &mut self,
        g: GroupId,
        owner: ConsumerId,
        timers: &mut impl Timers,
        dead: impl FnMut(MsgId, DeadInfo),
    ) -> Vec<(MsgId, u16)> {
        let policy = self.policy(g);
        self.group_mut(g).map_or_else(Vec::new, |x| x.disconnect(owner, policy, timers, dead))
    }

    /// A connection became a consumer of group `g` (its first FETCH of it).
    pub fn join(&mut self, g: GroupId) {
        if let Some(group) = self.group_mut(g) {
            group.consumers += 1;
        }
    }

    /// A consumer of group `g` closed.
    pub fn leave(&mut self, g: GroupId) {
        if let Some(group) = self.group_mut(g) {
            group.consumers = group.consumers.saturating_sub(1);
        }
    }

    /// Puts a message back in group `g`'s ready (its dead-letter topic
    /// could not take it).
    pub fn requeue(&mut self, g: GroupId, id: MsgId, deliveries: u16) {
        if let Some(group) = self.group_mut(g) {
            group.requeue(id, deliveries);
        }
    }

    /// Group `g`'s deliveries so far of message `id`.
    pub fn deliveries(&self, g: GroupId, id: MsgId) -> u16 {
        self.group(g).map_or(0, |x| x.deliveries(id))
    }

    /// Removes every unacknowledged message (PURGE, DELETE), published or
    /// not, and disarms every group's timers. Returns how many were
    /// removed.
    pub fn purge(&mut self, timers: &mut impl Timers) -> u64 {
        let next_id = self.seq.next_id();
        for g in &mut self.groups {
            g.clear(next_id, timers);
        }
        let ids: Vec<MsgId> = self.seq.iter_live().map(|m| m.id).collect();
        for &id in &ids {
            self.release(id);
        }
        self.sweep_from = None;
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
            let Some((seq, group)) = self.parts(g) else { break };
            let Some((id, _)) = group.peek_ready(seq) else { break };
            self.release_skipped(g);
            let Some(m) = self.seq.get(id) else { break };
            if !out(m, self.seq.dead_info(id)) {
                break;
            }
            if let Some(group) = self.group_mut(g) {
                group.take_ready(id);
            }
            self.done(g, id);
            n += 1;
        }
        self.release_skipped(g);
        n
    }

    /// `drain_ready` of the messages `pick` chooses only (REDRIVE naming a
    /// group): those back for retry, in order, then those from the cursor
    /// on, in id order; the others stay ready where they are (see
    /// `Group::take_ahead`). Reads every ready message of the group once
    /// (as a REDRIVE of all would move them all). The group's filter is
    /// not applied: a dead-letter topic's groups have none unless created
    /// with one.
    pub fn drain_ready_where(
        &mut self,
        g: GroupId,
        max: u64,
        mut pick: impl FnMut(&Stored<'_>) -> bool,
        mut out: impl FnMut(Stored<'_>, Option<DeadInfo>) -> bool,
    ) -> u64 {
        let Some(group) = self.group(g) else { return 0 };
        let (retry, mut at) = (group.retry_ids(), group.cursor());
        let mut n = 0;
        for id in retry {
            let Some(m) = self.seq.get(id).filter(|m| n < max && pick(m)) else { continue };
            if !out(m, self.seq.dead_info(id)) {
                return n;
            }
            if let Some(x) = self.group_mut(g) {
                x.take_retried(id);
            }
            self.done(g, id);
            n += 1;
        }
        let mut passed = Vec::new();
        while n < max {
            let Some(id) = self.seq.next_live(at, self.seq.visible_id()) else { break };
            at = id + 1;
            let Some(m) = self.seq.get(id) else { break };
            if !pick(&m) {
                passed.push(id);
                continue;
            }
            if !out(m, self.seq.dead_info(id)) {
                break;
            }
            if let Some(x) = self.group_mut(g) {
                x.take_ahead(id, &mut passed);
            }
            self.done(g, id);
            n += 1;
        }
        n
    }
}
