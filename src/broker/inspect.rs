//! LOOKUP and PEEK (protocol version 4): the topic's answer
//! (`Topic::inspect`) turned into the reply, its times on the wall clock.
//! Neither changes anything, so neither waits for the sync.

use super::requests::Refusal;
use super::topics::unknown;
use super::{Broker, Now, Outcome};
use crate::codec::inspect::{GroupLine, HeldMessage, Inspected, State, encode_inspected_reply};
use crate::codec::{ErrorCode, Request, op};
use crate::queue::{GroupState, Inspection, MsgId, Topic};
use crate::wheel::TimerKey;

impl Broker {
    /// LOOKUP or PEEK, answered at once (`rid` is the request's id).
    pub(super) fn inspect_op(
        &self,
        req: &Request<'_>,
        (now, rid, version): (Now, u32, u16),
        out: &mut Vec<u8>,
    ) -> Result<Outcome, Refusal> {
        match *req {
            Request::Lookup { topic, key } => self.lookup((topic, key), now, (rid, version), out)?,
            Request::Peek { topic, id } => self.peek((topic, id), now, (rid, version), out)?,
            _ => unreachable!("not an inspection op: {req:?}"),
        }
        Ok(Outcome::Done)
    }

    /// PEEK: message `id` of `topic` with its payload, and its state in
    /// every group. NOT_FOUND if the topic does not hold it.
    fn peek(
        &self,
        (topic, id): (&str, MsgId),
        now: Now,
        (rid, v): (u32, u16),
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        let t = self.topic_named(topic)?;
        let wall_of = |k: TimerKey| self.wall_of(k, now);
        let found = t.inspect(id, &wall_of).filter(|i| i.stored.is_some());
        let Some(i) = found else {
            let why = format!(
                "topic {topic} holds no message {id}: every group is done with it, or it never had it (LOOKUP by its key tells what became of a keyed one)"
            );
            return Err((ErrorCode::NotFound, why));
        };
        encode_inspected_reply(out, (op::PEEK, rid), &[entry(&i, true)], v);
        Ok(())
    }

    /// LOOKUP: the messages of `topic` indexed under `key`, newest first,
    /// without payloads, each with its state in every group.
    fn lookup(
        &self,
        (topic, key): (&str, &[u8]),
        now: Now,
        (rid, v): (u32, u16),
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        let t = self.topic_named(topic)?;
        let wall_of = |k: TimerKey| self.wall_of(k, now);
        let found: Vec<Inspection<'_>> =
            t.keys().lookup(key).into_iter().filter_map(|id| t.inspect(id, &wall_of)).collect();
        let entries: Vec<Inspected<'_>> = found.iter().map(|i| entry(i, false)).collect();
        encode_inspected_reply(out, (op::LOOKUP, rid), &entries, v);
        Ok(())
    }

    fn topic_named(&self, topic: &str) -> Result<&Topic, Refusal> {
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        self.topics.get(tid).map(|e| &e.topic).ok_or_else(|| unknown(topic))
    }

    /// The wall-clock time of timer `k`'s deadline (the wheel runs on the
    /// monotonic clock), as `now` reads both.
    fn wall_of(&self, k: TimerKey, now: Now) -> Option<u64> {
        let mono = self.wheel.deadline_ms(k)?;
        Some((now.wall_ms + mono).saturating_sub(now.mono_ms))
    }
}

/// An inspection as a reply entry; with its payload if `payload`.
fn entry<'a>(i: &'a Inspection<'a>, payload: bool) -> Inspected<'a> {
    let message = i.stored.map(|m| HeldMessage {
        born_ms: m.born_ms,
        dead: i.dead,
        props: m.props.public(),
        len: m.payload.len() as u32,
        payload: payload.then_some(m.payload),
    });
    let groups = i.groups.iter().map(|g| line(g.name, (g.member_of, g.last_nack_reason), &g.state)).collect();
    Inspected { id: i.id, message, groups }
}

/// One group's line: `member_of` names a broadcast member's consumer,
/// `reason` the message's last NACK reason in the group.
fn line<'a>(name: &'a str, (member_of, reason): (Option<u64>, Option<&'a str>), s: &'a GroupState) -> GroupLine<'a> {
    let base = GroupLine {
        name,
        state: State::Ready,
        deliveries: 0,
        until_ms: 0,
        consumer: member_of.unwrap_or(0),
        dead_reason: 0,
        last_nack_reason: reason.unwrap_or(""),
    };
    match s {
        GroupState::Ready { deliveries } => GroupLine { deliveries: *deliveries, ..base },
        GroupState::InFlight { consumer, deliveries, deadline_ms } => GroupLine {
            state: State::InFlight,
            deliveries: *deliveries,
            until_ms: *deadline_ms,
            consumer: *consumer,
            ..base
        },
        GroupState::Waiting { deliveries, until_ms } => {
            GroupLine { state: State::Waiting, deliveries: *deliveries, until_ms: *until_ms, ..base }
        }
        GroupState::RetryWaiting { deliveries, until_ms } => {
            GroupLine { state: State::RetryWaiting, deliveries: *deliveries, until_ms: *until_ms, ..base }
        }
        GroupState::BehindKey { deliveries } => GroupLine { state: State::BehindKey, deliveries: *deliveries, ..base },
        GroupState::Scheduled { due_ms } => GroupLine { state: State::Scheduled, until_ms: *due_ms, ..base },
        GroupState::DeadLettered { info, last_nack_reason } => GroupLine {
            state: State::DeadLettered,
            deliveries: info.origin_deliveries,
            dead_reason: info.reason as u8,
            last_nack_reason: last_nack_reason.as_deref().unwrap_or(""),
            ..base
        },
        GroupState::Done => GroupLine { state: State::Done, ..base },
        GroupState::Filtered => GroupLine { state: State::Filtered, ..base },
    }
}
