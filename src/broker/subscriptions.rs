//! Push subscriptions (protocol version 3): a consumer SUBSCRIBEs to a
//! group with a credit, and the broker pushes it the group's messages as
//! they become ready, while fewer than `credit` of them are in flight to
//! its connection (NSQ's RDY, AMQP's prefetch, NATS's MaxAckPending).
//!
//! A subscription waits for messages beside the parked FETCHes
//! (`waiters.rs`), and is served at the same moment: when a topic is
//! published at the sync (new messages, returned ones, and credit freed by
//! an ACK, a NACK or a passed deadline all mark it). Parked FETCHes are
//! answered first, since each waits with nothing in hand; then the group's
//! subscribers get one message each in turn, those with free credit only,
//! round after round until nothing is ready or nobody has credit, and the
//! turn's first subscriber moves to the back (round-robin by free credit:
//! a subscriber with more credit takes more, and none starves another).
//!
//! Credit counts every message of the group in flight to the connection,
//! FETCHed ones included, so a connection that mixes the two holds at most
//! its credit. A subscriber whose output is at half of `output_bytes_max`,
//! or any while the connections' buffers are full or the wheel has no
//! timer left, is pushed nothing more until that clears: its group is
//! noted as held back and tried again at every publish, and the reactor
//! serves the connection again once its output drains. So a subscriber that
//! does not read meets the limits a peer that does not read its replies
//! meets.

use std::collections::VecDeque;

use slab::Slab;

use super::requests::{Refusal, timer_room, write_taken};
use super::{Broker, ConnKey, Now, Outbox, Session, TopicId};
use crate::codec::{self, ErrorCode, MessagesWriter};
use crate::queue::{ConsumerId, FastMap, GroupId, Take};

/// A push subscription.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Subscription {
    /// The connection its messages go to.
    pub conn: ConnKey,
    /// The connection's consumer: the owner of what is pushed.
    pub consumer: ConsumerId,
    /// The session's protocol version: the layout of its pushed frames.
    pub version: u16,
    pub topic: TopicId,
    /// Its group (in a broadcast group, the connection's member).
    pub group: GroupId,
    /// Most messages of the group in flight to the connection; 0 pauses.
    pub credit: u32,
    /// The ack timeout of what is pushed, ms (0: the group's).
    pub ack_timeout_ms: u32,
}

/// Every subscription, by id (its slab key, the pushed frames' request
/// id), by connection and by group.
#[derive(Default)]
pub(crate) struct Subscriptions {
    slab: Slab<Subscription>,
    /// The ids of each connection's subscriptions.
    by_conn: FastMap<ConnKey, Vec<u32>>,
    /// The ids of each group's subscriptions, in the order the next push
    /// visits them; a group with none has no entry.
    by_group: FastMap<(TopicId, GroupId), VecDeque<u32>>,
    /// Groups with a subscriber that had credit but was pushed nothing
    /// (backpressure, or no timer left): tried again at every publish.
    held_back: Vec<(TopicId, GroupId)>,
}

impl Subscriptions {
    fn add(&mut self, s: Subscription) -> u32 {
        let id = self.slab.insert(s) as u32;
        self.by_conn.entry(s.conn).or_default().push(id);
        self.by_group.entry((s.topic, s.group)).or_default().push_back(id);
        id
    }

    /// Subscription `id` of connection `conn`.
    fn get_mut(&mut self, conn: ConnKey, id: u32) -> Option<&mut Subscription> {
        self.slab.get_mut(id as usize).filter(|s| s.conn == conn)
    }

    fn remove(&mut self, conn: ConnKey, id: u32) -> Option<Subscription> {
        self.get_mut(conn, id)?;
        let s = self.slab.remove(id as usize);
        if let Some(ids) = self.by_conn.get_mut(&conn) {
            ids.retain(|&i| i != id);
            if ids.is_empty() {
                self.by_conn.remove(&conn);
            }
        }
        let key = (s.topic, s.group);
        if let Some(ids) = self.by_group.get_mut(&key) {
            ids.retain(|&i| i != id);
            if ids.is_empty() {
                self.by_group.remove(&key);
            }
        }
        Some(s)
    }

    /// Removes every subscription of `conn` (it closed).
    fn leave(&mut self, conn: ConnKey) {
        for id in self.by_conn.get(&conn).cloned().unwrap_or_default() {
            self.remove(conn, id);
        }
    }

    fn count(&self, conn: ConnKey) -> usize {
        self.by_conn.get(&conn).map_or(0, Vec::len)
    }

    /// The id of `conn`'s subscription to group `group` of `topic`, if any.
    fn find(&self, conn: ConnKey, topic: TopicId, group: GroupId) -> Option<u32> {
        let ids = self.by_conn.get(&conn)?;
        ids.iter().copied().find(|&i| self.slab.get(i as usize).is_some_and(|s| (s.topic, s.group) == (topic, group)))
    }

    /// Whether group `group` of `topic` has a subscriber.
    pub fn any(&self, topic: TopicId, group: GroupId) -> bool {
        self.by_group.contains_key(&(topic, group))
    }

    /// The group's subscriptions, in visiting order.
    fn of_group(&self, topic: TopicId, group: GroupId) -> Vec<(u32, Subscription)> {
        let Some(ids) = self.by_group.get(&(topic, group)) else { return Vec::new() };
        ids.iter().filter_map(|&i| self.slab.get(i as usize).map(|s| (i, *s))).collect()
    }

    /// The group's first `n` subscribers go to the back: the next push
    /// starts with the one after them.
    fn rotate(&mut self, topic: TopicId, group: GroupId, n: usize) {
        if let Some(ids) = self.by_group.get_mut(&(topic, group))
            && !ids.is_empty()
        {
            ids.rotate_left(n % ids.len());
        }
    }
}

/// What a SUBSCRIBE asks for.
#[derive(Clone, Copy)]
pub(super) struct SubscribeArgs<'a> {
    pub topic: &'a str,
    pub group: &'a str,
    pub credit: u32,
    pub ack_timeout_ms: u32,
}

impl Broker {
    /// SUBSCRIBE: a subscription of the connection to the group (made as a
    /// FETCH makes it); what is ready is pushed at this turn's publish,
    /// after this reply.
    pub(super) fn subscribe(
        &mut self,
        conn: ConnKey,
        session: &mut Session,
        args: SubscribeArgs<'_>,
        rid: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        self.check_credit(args.credit)?;
        let max = self.config.limits.subscriptions_per_connection_max;
        if self.subs.count(conn) >= max as usize {
            let msg = format!("this connection has subscriptions_per_connection_max ({max}) subscriptions");
            return Err((ErrorCode::BadArgument, msg));
        }
        let tid = self.topic_for(args.topic, self.config.auto_create)?;
        let group = self.group_of(tid, args.group, true, session.consumer)?;
        if let Some(id) = self.subs.find(conn, tid, group) {
            let msg = format!("this connection subscribes to the group already (subscription {id})");
            return Err((ErrorCode::BadArgument, msg));
        }
        self.join(session, tid, group);
        let s = Subscription {
            conn,
            consumer: session.consumer,
            version: session.version,
            topic: tid,
            group,
            credit: args.credit,
            ack_timeout_ms: args.ack_timeout_ms,
        };
        let id = self.subs.add(s);
        session.subscriptions += 1;
        codec::encode_subscribed_reply(out, rid, id);
        self.credit_freed(tid, group);
        Ok(())
    }

    /// CREDIT: sets the subscription's credit; the reply says how many of
    /// the group's messages the connection holds.
    pub(super) fn credit(
        &mut self,
        conn: ConnKey,
        (id, credit): (u32, u32),
        rid: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        self.check_credit(credit)?;
        let s = self.subs.get_mut(conn, id).ok_or_else(|| unknown_subscription(id))?;
        s.credit = credit;
        let s = *s;
        let held = self.topics.get(s.topic).map_or(0, |e| e.topic.held_by(s.group, s.consumer));
        codec::encode_credit_reply(out, rid, held);
        self.credit_freed(s.topic, s.group);
        Ok(())
    }

    /// UNSUBSCRIBE: the subscription ends, and every message of its group
    /// in flight to the connection returns to ready (or to the dead-letter
    /// topic), as at a disconnect. The reply counts them.
    pub(super) fn unsubscribe(
        &mut self,
        conn: ConnKey,
        session: &mut Session,
        id: u32,
        rid: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        let s = self.subs.remove(conn, id).ok_or_else(|| unknown_subscription(id))?;
        session.subscriptions = session.subscriptions.saturating_sub(1);
        let returned = if let Some(i) = session.fetched.iter().position(|&f| f == (s.topic, s.group)) {
            session.fetched.swap_remove(i);
            self.leave_group(s.topic, s.group, s.consumer)
        } else {
            0
        };
        codec::encode_u64_reply(out, codec::op::UNSUBSCRIBE, rid, returned);
        Ok(())
    }

    fn check_credit(&self, credit: u32) -> Result<(), Refusal> {
        let max = self.config.limits.subscription_credit_max;
        if credit > max {
            return Err((ErrorCode::BadArgument, format!("credit {credit} is over subscription_credit_max ({max})")));
        }
        Ok(())
    }

    /// A connection closed: its subscriptions end (what it held returns
    /// with the rest of its in-flight messages).
    pub(super) fn end_subscriptions(&mut self, conn: ConnKey) {
        self.subs.leave(conn);
    }

    /// Credit may have been freed in group `group` of `tid` (an ACK, a
    /// NACK, a passed deadline, a new subscription or credit): if it has
    /// subscribers, its topic is served at this turn's publish.
    pub(super) fn credit_freed(&mut self, tid: TopicId, group: GroupId) {
        if self.subs.any(tid, group)
            && let Some(e) = self.topics.get_mut(tid)
        {
            self.turn.mark_for_publish(e);
        }
    }

    /// At the publish: the groups held back at an earlier one are tried
    /// again.
    pub(super) fn push_held_back(&mut self, now: Now, outbox: &mut impl Outbox, grown_bytes: &mut u64) {
        for (tid, group) in std::mem::take(&mut self.subs.held_back) {
            self.push_ready(tid, group, now, outbox, grown_bytes);
        }
    }

    /// Pushes group `group` of `tid`'s ready messages to its subscribers:
    /// one message to each with free credit in turn, round after round,
    /// into one pushed frame per subscriber, while the deliveries' budget
    /// lasts (if it runs out first, the group is put off to the next sync,
    /// to start with the subscriber it stopped at). `grown_bytes` counts
    /// the buffer capacity this adds (as `serve_waiters` does).
    pub(super) fn push_ready(
        &mut self,
        tid: TopicId,
        group: GroupId,
        now: Now,
        outbox: &mut impl Outbox,
        grown_bytes: &mut u64,
    ) {
        let subs = self.subs.of_group(tid, group);
        if subs.is_empty() {
            return;
        }
        // Each subscriber's pushed frame, begun at its first message.
        let mut frames: Vec<Option<MessagesWriter>> = subs.iter().map(|_| None).collect();
        let mut held_back = false;
        // Where the budget ran out, if it did: the next push starts there.
        let mut stopped_at = None;
        'rounds: loop {
            let mut pushed = false;
            for (i, &(id, s)) in subs.iter().enumerate() {
                let Some(e) = self.topics.get_mut(tid) else { break 'rounds };
                if !e.topic.has_ready(group) {
                    break 'rounds;
                }
                if self.budget.spent() {
                    stopped_at = Some(i);
                    break 'rounds;
                }
                if s.credit <= e.topic.held_by(group, s.consumer) {
                    continue;
                }
                if !self.room_to_push(s.conn, outbox, *grown_bytes) {
                    held_back = true;
                    continue;
                }
                let (Some(e), Some(out)) = (self.topics.get_mut(tid), outbox.out(s.conn)) else { continue };
                let (before, len) = (out.capacity(), out.len());
                let frame =
                    frames[i].get_or_insert_with(|| MessagesWriter::begin_pushed(out, id, &e.topic.name, s.version));
                let deadline_ms = now.mono_ms + u64::from(e.topic.ack_timeout_ms(group, s.ack_timeout_ms));
                let take = Take { owner: s.consumer, max_messages: 1, max_bytes: u64::MAX, deadline_ms };
                let n = write_taken(e, &mut self.wheel, group, take, frame, (out, &mut self.scratch.delivered));
                self.budget.spend(u64::from(n), (out.len() - len) as u64);
                *grown_bytes += out.capacity().saturating_sub(before) as u64;
                pushed = true;
            }
            if !pushed {
                break;
            }
        }
        for (frame, (_, s)) in frames.into_iter().zip(&subs) {
            if let Some(w) = frame
                && let Some(out) = outbox.out(s.conn)
            {
                w.finish(out);
            }
        }
        self.log_delivered(tid, group);
        match stopped_at {
            Some(i) => {
                self.subs.rotate(tid, group, i);
                self.budget.defer(tid, group);
            }
            None => self.subs.rotate(tid, group, 1),
        }
        if held_back && !self.subs.held_back.contains(&(tid, group)) {
            self.subs.held_back.push((tid, group));
        }
    }

    /// Whether a message may be pushed to `conn` now: the wheel has a
    /// timer for it, the connections' buffers are not full, and the
    /// connection's output is under half of `output_bytes_max` (else the
    /// reactor serves it again once it drains).
    fn room_to_push(&self, conn: ConnKey, outbox: &mut impl Outbox, grown_bytes: u64) -> bool {
        let l = &self.config.limits;
        timer_room(l.timers_max, &self.wheel) > 0
            && outbox.buffered_bytes() + grown_bytes < l.buffered_bytes_max
            && outbox.room_for_push(conn, l.output_bytes_max as usize / 2)
    }
}

/// The error for a subscription id the connection does not have.
fn unknown_subscription(id: u32) -> Refusal {
    (ErrorCode::BadArgument, format!("this connection has no subscription {id}"))
}
