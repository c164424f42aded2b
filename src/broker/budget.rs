//! The turn's work budget (`work_items_per_turn_max`,
//! `work_bytes_per_turn_max`): how much the requests of one loop turn may
//! do, and as much again the deliveries at its sync, so that no load a
//! client can send holds the loop for long, and a PING waits at most about
//! two turns whatever else is asked at the same moment.
//!
//! Counted, not timed: the broker never reads the clock, and work counted
//! is the same on every machine and in every run, so tests and the
//! simulation see the turns the reactor sees. (TigerBeetle: batch, and run
//! at your own pace.) An item is a message produced or delivered (a FETCH
//! reply, an answered parked FETCH, a push), an id acknowledged, NACKed or
//! touched, a topic or group listed; bytes are those of the messages and
//! ids the requests carry, and of the replies written.
//!
//! Once either is spent, a request that can do more than a little
//! (`Request::light` names the ones that cannot) waits for the next turn:
//! `Broker::must_wait` says so, the connection keeps its input, and the
//! reactor serves the connections left waiting first in the next turn,
//! before any new readiness, in the order they were left: nobody starves,
//! and one connection's requests are still served in order. A turn so does
//! at most its budget and one request more; a FETCH, which can be cut
//! short, gets no more than what is left (at least one message).
//!
//! At the sync the budget is filled again for the deliveries: parked
//! FETCHes are answered and subscribers pushed to while it lasts, and the
//! groups it does not reach are deferred, first in line at the next sync
//! (`Broker::busy` keeps the loop from sleeping meanwhile). Then it is
//! filled again for the next turn's requests.

use std::collections::{HashSet, VecDeque};

use super::{Broker, TopicId};
use crate::codec::Request;
use crate::limits::Limits;
use crate::queue::GroupId;

/// What is left of a turn's work, and the deliveries put off to the next.
#[derive(Debug, Default)]
pub(super) struct Budget {
    /// Items a part of a turn may handle (`work_items_per_turn_max`).
    items_max: u64,
    /// Bytes a part of a turn may handle (`work_bytes_per_turn_max`).
    bytes_max: u64,
    /// Items left to the part of the turn under way.
    items_left: u64,
    /// Bytes left to the part of the turn under way.
    bytes_left: u64,
    /// Groups whose parked FETCHes or subscribers had messages ready when
    /// the deliveries' budget ran out, in the order they were put off.
    deferred: VecDeque<(TopicId, GroupId)>,
    /// The same groups, to put each off once.
    deferred_set: HashSet<(TopicId, GroupId)>,
    /// Turns whose requests or deliveries used up their budget (counter).
    pub spent_turns: u64,
    /// The part of the turn under way has used up its budget (counted
    /// once in `spent_turns`).
    spent_noted: bool,
}

impl Budget {
    /// A full budget of `l`'s size.
    pub(super) fn new(l: &Limits) -> Budget {
        let (items_max, bytes_max) = (u64::from(l.work_items_per_turn_max), u64::from(l.work_bytes_per_turn_max));
        Budget { items_max, bytes_max, items_left: items_max, bytes_left: bytes_max, ..Budget::default() }
    }

    /// The next part of a turn begins: its budget is full.
    pub(super) fn refill(&mut self) {
        self.items_left = self.items_max;
        self.bytes_left = self.bytes_max;
        self.spent_noted = false;
    }

    /// Whether the part of the turn under way has used up its budget.
    pub(super) fn spent(&self) -> bool {
        self.items_left == 0 || self.bytes_left == 0
    }

    /// Counts `items` and `bytes` of work done.
    pub(super) fn spend(&mut self, items: u64, bytes: u64) {
        self.items_left = self.items_left.saturating_sub(items);
        self.bytes_left = self.bytes_left.saturating_sub(bytes);
        if self.spent() && !self.spent_noted {
            self.spent_noted = true;
            self.spent_turns += 1;
        }
    }

    /// The most messages, and bytes of them, a delivery may take now: what
    /// is left, and at least one message (a FETCH is served only while
    /// something is left; one reply may so pass the bytes left by a
    /// message, as it may pass its own `max_bytes`).
    pub(super) fn room(&self) -> (u32, u64) {
        (u32::try_from(self.items_left).unwrap_or(u32::MAX).max(1), self.bytes_left.max(1))
    }

    /// Puts off the deliveries of group `group` of `tid` to the next sync.
    pub(super) fn defer(&mut self, tid: TopicId, group: GroupId) {
        if self.deferred_set.insert((tid, group)) {
            self.deferred.push_back((tid, group));
        }
    }

    /// The group put off longest ago, taken out of the list.
    pub(super) fn next_deferred(&mut self) -> Option<(TopicId, GroupId)> {
        let next = self.deferred.pop_front()?;
        self.deferred_set.remove(&next);
        Some(next)
    }

    /// Whether deliveries wait for the next sync.
    pub(super) fn deferred_any(&self) -> bool {
        !self.deferred.is_empty()
    }
}

impl Request<'_> {
    /// Whether this request's work is small and bounded whatever its
    /// arguments, so that it is served in a turn whose work budget is
    /// spent: above all PING, a client's measure of the loop. Every op is
    /// named, so a new one must say.
    pub fn light(&self) -> bool {
        match self {
            Request::Hello { .. } | Request::Ping => true,
            // One topic's settings, or one message.
            Request::CreateTopic { .. } | Request::Cancel { .. } | Request::Reschedule { .. } => true,
            Request::Lookup { .. } | Request::Peek { .. } => true,
            // A number set: what it lets through is pushed at the sync,
            // under the deliveries' budget.
            Request::Subscribe { .. } | Request::Credit { .. } => true,
            Request::Produce { .. }
            | Request::Fetch { .. }
            | Request::Ack { .. }
            | Request::Nack { .. }
            | Request::Touch { .. }
            | Request::AckProduce { .. }
            | Request::ListTopics
            | Request::ListGroups { .. } => false,
            // Even one topic's: its groups' numbers cost each group's
            // messages in flight, and each member of a broadcast group.
            Request::Stats { .. } => false,
            // They move or remove up to every message of a topic or group.
            Request::DeleteTopic { .. }
            | Request::PurgeTopic { .. }
            | Request::Redrive { .. }
            | Request::Unsubscribe { .. }
            | Request::CreateGroup { .. }
            | Request::DeleteGroup { .. }
            | Request::ResetGroup { .. } => false,
        }
    }
}

impl Broker {
    /// The work `req` did, besides its reply and the messages it
    /// delivered (every delivery counts those as it takes them): its
    /// items, and the bytes of its messages or ids.
    pub(super) fn request_work(&self, req: &Request<'_>) -> (u64, u64) {
        match req {
            Request::Produce { batch, .. } => (u64::from(batch.count), batch.bytes.len() as u64),
            Request::Ack { ids, .. } | Request::Nack { ids, .. } | Request::Touch { ids, .. } => {
                (ids.len() as u64, ids.bytes.len() as u64)
            }
            Request::AckProduce { ids, outputs, .. } => {
                (ids.len() as u64 + outputs.messages(), (ids.bytes.len() + outputs.bytes.len()) as u64)
            }
            Request::ListTopics => (self.topics.len() as u64, 0),
            Request::Stats { topic: "" } => (self.topics.len() as u64, 0),
            Request::Stats { topic } | Request::ListGroups { topic } => {
                let groups = self.topics.id(topic).and_then(|t| self.topics.get(t)).map(|e| e.topic.groups().count());
                (groups.unwrap_or(0) as u64, 0)
            }
            _ => (0, 0),
        }
    }

    /// Whether background work or deliveries put off by the budget want a
    /// turn soon.
    pub(super) fn deliveries_deferred(&self) -> bool {
        self.budget.deferred_any()
    }

    /// Turns whose requests or deliveries used up their work budget.
    pub fn turns_over_budget(&self) -> u64 {
        self.budget.spent_turns
    }
}
