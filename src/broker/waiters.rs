//! The consumers waiting for messages: parked FETCHes, each in a slab, by
//! connection (at most one each) and, in arrival order, by the group they
//! wait on. This is where pushed subscriptions will wait too.
//!
//! Every way a waiter leaves — answered at a publish, its wait over, its
//! connection gone, its topic deleted, a shutdown — removes it from all
//! three, so the queues never hold a stale key.

use std::collections::VecDeque;

use slab::Slab;

use super::{ConnKey, TopicId};
use crate::queue::{ConsumerId, FastMap, GroupId};
use crate::wheel::TimerKey;

/// A parked FETCH's key in `Waiters`: reused once it has left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WaiterKey(usize);

/// A parked FETCH.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waiter {
    pub conn: ConnKey,
    pub consumer: ConsumerId,
    pub request_id: u32,
    /// The session's protocol version: the layout of its reply.
    pub version: u16,
    pub topic: TopicId,
    pub group: GroupId,
    /// The FETCH's limits, clamped to the broker's.
    pub max_messages: u32,
    pub max_bytes: u64,
    /// The ack timeout the FETCH asked for, ms (0: the topic's).
    pub ack_timeout_ms: u32,
    /// The end of its wait.
    pub timer: TimerKey,
}

/// The parked FETCHes.
#[derive(Default)]
pub(crate) struct Waiters {
    slab: Slab<Waiter>,
    /// The parked FETCH of each connection.
    by_conn: FastMap<ConnKey, WaiterKey>,
    /// The waiters on each group, oldest first; a group with none has no
    /// entry, so deleted topics leave nothing behind.
    by_group: FastMap<(TopicId, GroupId), VecDeque<WaiterKey>>,
}

impl Waiters {
    /// The key the next `park` takes (its wait timer names it).
    pub fn vacant_key(&self) -> WaiterKey {
        WaiterKey(self.slab.vacant_key())
    }

    /// Parks `w`; returns its key, the one `vacant_key` said.
    pub fn park(&mut self, w: Waiter) -> WaiterKey {
        assert!(!self.by_conn.contains_key(&w.conn), "connection {:?} has a parked FETCH already", w.conn);
        let key = WaiterKey(self.slab.insert(w));
        self.by_conn.insert(w.conn, key);
        self.by_group.entry((w.topic, w.group)).or_default().push_back(key);
        key
    }

    /// How many wait on group `group` of `topic`.
    pub fn waiting(&self, topic: TopicId, group: GroupId) -> usize {
        self.by_group.get(&(topic, group)).map_or(0, VecDeque::len)
    }

    /// Takes the oldest waiter on group `group` of `topic`.
    pub fn next(&mut self, topic: TopicId, group: GroupId) -> Option<Waiter> {
        let queue = self.by_group.get_mut(&(topic, group))?;
        let key = queue.pop_front();
        if queue.is_empty() {
            self.by_group.remove(&(topic, group));
        }
        let w = self.slab.remove(key?.0);
        self.by_conn.remove(&w.conn);
        Some(w)
    }

    /// Takes waiter `key`, if it is still parked (its wait timer fired).
    pub fn take(&mut self, key: WaiterKey) -> Option<Waiter> {
        let w = self.slab.try_remove(key.0)?;
        self.by_conn.remove(&w.conn);
        if let Some(queue) = self.by_group.get_mut(&(w.topic, w.group)) {
            queue.retain(|k| *k != key);
            if queue.is_empty() {
                self.by_group.remove(&(w.topic, w.group));
            }
        }
        Some(w)
    }

    /// Takes `conn`'s waiter, if it has one (it closed).
    pub fn leave(&mut self, conn: ConnKey) -> Option<Waiter> {
        let key = *self.by_conn.get(&conn)?;
        self.take(key)
    }

    /// Takes every waiter on `topic` (deleted), oldest first in each group.
    pub fn drain_topic(&mut self, topic: TopicId) -> Vec<Waiter> {
        let groups: Vec<(TopicId, GroupId)> = self.by_group.keys().filter(|k| k.0 == topic).copied().collect();
        let mut taken = Vec::new();
        for g in groups {
            while let Some(w) = self.next(g.0, g.1) {
                taken.push(w);
            }
        }
        taken
    }

    /// Takes every waiter on group `group` of `topic` (deleted), oldest
    /// first.
    pub fn drain_group(&mut self, topic: TopicId, group: GroupId) -> Vec<Waiter> {
        std::iter::from_fn(|| self.next(topic, group)).collect()
    }

    /// Takes every waiter, in key order (a shutdown).
    pub fn drain_all(&mut self) -> Vec<Waiter> {
        let keys: Vec<WaiterKey> = self.slab.iter().map(|(k, _)| WaiterKey(k)).collect();
        keys.into_iter().filter_map(|k| self.take(k)).collect()
    }
}
