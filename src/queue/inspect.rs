//! Inspection: what PEEK and LOOKUP tell of one message — the message as
//! stored, and its state in every group of its topic — read from the
//! state the groups keep anyway, without delivering it or changing
//! anything (beanstalkd's `peek`, with RocketMQ's per-group view).
//!
//! A group keeps state only for the messages it has not simply passed
//! (`group.rs`): what it is done with leaves no trace but its cursor. So
//! "done" covers every way a group can be finished with a message (acked,
//! redriven, purged, cancelled, or before where the group started), except
//! two that inspection tells apart: a filter that drops the message
//! (decided again from its tags), and a dead letter, which the topic notes
//! in a small ring of its recent ones (`DeadNotes`). Times are handed back
//! on the wall clock: the caller turns a timer's deadline into one.

use std::collections::VecDeque;

use super::group::Group;
use super::seq::{Seq, Stored};
use super::topic::Topic;
use super::{ConsumerId, GroupId, MsgId};
use crate::codec::DeadInfo;
use crate::codec::props::PROP_ORIGIN_GROUP;
use crate::wheel::TimerKey;

/// Most dead letters a topic remembers for inspection, the oldest
/// forgotten first. Dead letters are rare: 1024 of them cost 24 KiB, and
/// only in a topic that has had some.
pub const DEAD_NOTES_PER_TOPIC_MAX: usize = 1024;

/// A dead letter as the topic notes it: where it went and why, and the
/// reason its last NACK gave.
type DeadNote = (DeadInfo, Option<Box<str>>);

/// A topic's recent dead letters: (id, the group that dead-lettered it,
/// its note), oldest first. Not logged: recovery rebuilds them from the
/// dead letters the dead-letter topic still holds (`recover_dead_notes`);
/// for one consumed or redriven from there, inspection says "done".
#[derive(Debug, Default)]
pub struct DeadNotes(VecDeque<(MsgId, GroupId, DeadNote)>);

impl DeadNotes {
    fn note(&mut self, id: MsgId, g: GroupId, note: DeadNote) {
        if self.0.len() == DEAD_NOTES_PER_TOPIC_MAX {
            self.0.pop_front();
        }
        self.0.push_back((id, g, note));
    }

    fn find(&self, id: MsgId, g: GroupId) -> Option<GroupState> {
        let (info, reason) = &self.0.iter().rev().find(|n| n.0 == id && n.1 == g)?.2;
        Some(GroupState::DeadLettered { info: *info, last_nack_reason: reason.clone() })
    }
}

/// Where one message stands in one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupState {
    /// The group will deliver it next in line: never delivered, or back
    /// for retry. `deliveries` so far.
    Ready { deliveries: u16 },
    /// Delivered to `consumer` and not acknowledged; its ack deadline is
    /// `deadline_ms` (wall clock, ms since the Unix epoch).
    InFlight { consumer: ConsumerId, deliveries: u16, deadline_ms: u64 },
    /// NACKed with a delay: ready again at `until_ms` (wall clock).
    Waiting { deliveries: u16, until_ms: u64 },
    /// Waiting for retry (the group's retry policy): ready again at
    /// `until_ms` (wall clock).
    RetryWaiting { deliveries: u16, until_ms: u64 },
    /// Ready, but held back behind the message of its key the group has
    /// outstanding (a group ordered by key).
    BehindKey { deliveries: u16 },
    /// Scheduled for `due_ms` (wall clock): no group gets it before.
    Scheduled { due_ms: u64 },
    /// Moved to the dead-letter topic by this group: where and why.
    /// `last_nack_reason` is the reason its last NACK gave, when NACKs
    /// carry one (None until then).
    DeadLettered { info: DeadInfo, last_nack_reason: Option<Box<str>> },
    /// The group is finished with it: acked, redriven, purged, cancelled,
    /// or before where the group started.
    Done,
    /// The group's tag filter drops it.
    Filtered,
}

/// One group's line of an inspection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupInspection<'a> {
    /// The group's name ("" is the default group).
    pub name: &'a str,
    /// For a broadcast group's member: its consumer (each member has its
    /// own position, and its own line).
    pub member_of: Option<ConsumerId>,
    pub state: GroupState,
    /// The reason the message's last NACK in this group gave, while the
    /// group still needs it (a dead letter's is in its state).
    pub last_nack_reason: Option<&'a str>,
}

/// What the topic can tell of one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspection<'a> {
    pub id: MsgId,
    /// The message, while the topic holds it; None once every group is
    /// done with it (its key index may still name it).
    pub stored: Option<Stored<'a>>,
    /// Where a message of a dead-letter topic came from and why.
    pub dead: Option<DeadInfo>,
    /// Every group's state (a broadcast group's members each, not the
    /// group itself), in creation order.
    pub groups: Vec<GroupInspection<'a>>,
}

impl Topic {
    /// Group `g` moved message `id` to the dead-letter topic: noted for
    /// inspection, with its last NACK reason.
    pub fn note_dead(&mut self, g: GroupId, id: MsgId, info: DeadInfo, reason: Option<Box<str>>) {
        self.dead_notes.note(id, g, (info, reason));
    }

    /// Recovery: the dead notes are not logged, so they are rebuilt from
    /// the dead letters this topic's dead-letter topic (`dlq`) still
    /// holds, in id order (the ring keeps the newest): each names its
    /// origin id, deliveries and reason, its origin group (a broker entry;
    /// none for the default group) and its last NACK reason (property 7).
    pub fn recover_dead_notes(&mut self, dlq: &Seq) {
        let mut from = 0;
        while let Some(id) = dlq.next_live(from, dlq.visible_id()) {
            from = id + 1;
            let (Some(m), Some(info)) = (dlq.get(id), dlq.dead_info(id)) else { continue };
            let origin = m.props.broker_entry(PROP_ORIGIN_GROUP).unwrap_or("");
            let Some(g) = self.group_named(origin).map(Group::id) else { continue };
            let reason = m.props.last_nack_reason().map(Box::from);
            self.dead_notes.note(info.origin_id, g, (info, reason));
        }
    }

    /// Message `id` and its state in every group. `wall_of` turns a
    /// timer's deadline into wall-clock ms (None: not armed). None if the
    /// topic never had the id (it is not below the next id).
    pub fn inspect(&self, id: MsgId, wall_of: &dyn Fn(TimerKey) -> Option<u64>) -> Option<Inspection<'_>> {
        if id >= self.seq.next_id() {
            return None;
        }
        let stored = self.seq.get(id);
        let mut groups = Vec::new();
        for i in 0.. {
            let Some(g) = self.group_id_at(i).and_then(|g| self.group(g)) else { break };
            // A broadcast group has no position of its own: its members do.
            if g.config.broadcast && !g.id().is_member() {
                continue;
            }
            let state = match stored {
                Some(_) => self.state_in(g, id, wall_of),
                None => self.gone_state(g, id),
            };
            let (name, member_of, last_nack_reason) = (g.name(), self.consumer_of(g.id()), g.nack_reason(id));
            groups.push(GroupInspection { name, member_of, state, last_nack_reason });
        }
        let dead = stored.and_then(|_| self.seq.dead_info(id));
        Some(Inspection { id, stored, dead, groups })
    }

    /// The consumer whose broadcast member `m` is, if it is one.
    fn consumer_of(&self, m: GroupId) -> Option<ConsumerId> {
        if !m.is_member() {
            return None;
        }
        self.groups().find_map(|g| g.members.iter().find(|(_, x)| **x == m).map(|(c, _)| *c))
    }

    /// The state of held message `id` in group `g`.
    fn state_in(&self, g: &Group, id: MsgId, wall_of: &dyn Fn(TimerKey) -> Option<u64>) -> GroupState {
        if let Some(f) = g.inflight.get(&id) {
            let deadline_ms = wall_of(f.timer).unwrap_or(0);
            return GroupState::InFlight { consumer: f.owner, deliveries: f.deliveries, deadline_ms };
        }
        if let Some(&(timer, deliveries)) = g.delayed.get(&id) {
            let until_ms = g.delay_wall.get(&id).copied().or_else(|| wall_of(timer)).unwrap_or(0);
            return match g.waits_for_retry(id) {
                true => GroupState::RetryWaiting { deliveries, until_ms },
                false => GroupState::Waiting { deliveries, until_ms },
            };
        }
        if let Some(due_ms) = self.seq.schedule().due_ms(id) {
            return match g.would_pass(&self.seq, id) {
                true => GroupState::Scheduled { due_ms },
                false => GroupState::Filtered,
            };
        }
        if g.behind_key(id) {
            return GroupState::BehindKey { deliveries: g.deliveries(id) };
        }
        if g.needs(id) && (id < g.cursor() || g.would_pass(&self.seq, id)) {
            return GroupState::Ready { deliveries: g.deliveries(id) };
        }
        if g.needs(id) {
            return GroupState::Filtered;
        }
        self.finished_state(g, id, &self.seq)
    }

    /// The state of a message the topic no longer holds in group `g`.
    fn gone_state(&self, g: &Group, id: MsgId) -> GroupState {
        self.dead_notes.find(id, g.id()).unwrap_or(GroupState::Done)
    }

    /// The state of held message `id` in group `g`, which no longer needs
    /// it: dead-lettered, filtered out, or done.
    fn finished_state(&self, g: &Group, id: MsgId, seq: &Seq) -> GroupState {
        if let Some(state) = self.dead_notes.find(id, g.id()) {
            return state;
        }
        if !g.would_pass(seq, id) {
            return GroupState::Filtered;
        }
        GroupState::Done
    }
}
