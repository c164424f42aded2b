//! Retries that back off (protocol version 4): a group's retry policy
//! makes a NACK without a delay, and a passed ack deadline, wait before
//! the message is ready again ("waiting for retry"). The wait is a delay
//! as a NACK's is (the group's `delayed` table and a wheel timer), logged
//! in a Delay record with the retry flag, so a restart keeps it; a
//! message out of deliveries is dead-lettered at once, without a wait.
//!
//! A NACK may say why (version 4): the reason is kept with each message
//! the group still needs (`queue/nack_reasons.rs`), logged in a
//! NackReason record so a restart keeps it, and carried into a dead
//! letter's copy.

use super::requests::Refusal;
use super::{Broker, GroupTimers, Now, TopicId};
use crate::codec::{DeadInfo, ErrorCode};
use crate::limits::Limits;
use crate::queue::{GroupId, MsgId, Returned, Timers, Topic};
use crate::record::{DelayRecord, NackReasonRecord};

/// BAD_ARGUMENT for a NACK reason over `nack_reason_bytes_max`.
pub(super) fn check_nack_reason(reason: &str, limits: &Limits) -> Result<(), Refusal> {
    let max = limits.nack_reason_bytes_max;
    if reason.len() > max as usize {
        let message = format!("NACK reason is {} bytes, more than nack_reason_bytes_max ({max})", reason.len());
        return Err((ErrorCode::BadArgument, message));
    }
    Ok(())
}

/// Where the messages of one NACK went, for its records.
#[derive(Default)]
pub(super) struct Returns {
    /// Out of deliveries, or rejected: to the dead-letter topic.
    pub(super) dead: Vec<(MsgId, DeadInfo)>,
    /// Ready again now: (id, deliveries so far).
    pub(super) requeued: Vec<(MsgId, u16)>,
    /// Delayed by the NACK: (id, deliveries so far, ready-again wall ms).
    pub(super) delayed: Vec<(MsgId, u16, u64)>,
    /// Waiting for retry: (id, deliveries so far, ready-again wall ms).
    pub(super) waits: Vec<(MsgId, u16, u64)>,
}

/// A message of an ack deadline that passed in a group with a retry
/// policy: (topic, group, id, deliveries so far, ready-again wall ms).
pub(super) type Wait = (TopicId, GroupId, MsgId, u16, u64);

/// NACKs message `id` of group `group`, noting where it went in `back`:
/// a NACK's own delay (`delay_ms` above 0) is kept; without one, the
/// group's retry policy says how long it waits. False if it was not in
/// flight.
pub(super) fn nack_one(
    t: &mut Topic,
    (group, id): (GroupId, MsgId),
    (delay_ms, dead_letter): (u32, bool),
    now: Now,
    timers: &mut impl Timers,
    back: &mut Returns,
) -> bool {
    let wait_ms = if delay_ms > 0 { None } else { t.retry_wait_ms(group, id) };
    let delay_ms = wait_ms.unwrap_or(u64::from(delay_ms));
    let delay = (delay_ms > 0).then(|| now.mono_ms + delay_ms);
    // The log states a delay on the wall clock, which a restart keeps.
    let ready_at_wall_ms = now.wall_ms + delay_ms;
    match t.nack(group, id, delay, dead_letter, timers) {
        None => return false,
        Some(Returned::Retry) if delay.is_some() => {
            t.note_delay_wall(group, id, ready_at_wall_ms);
            let entry = (id, t.deliveries(group, id), ready_at_wall_ms);
            if wait_ms.is_some() {
                t.note_retry_wait(group, id);
                back.waits.push(entry);
            } else {
                back.delayed.push(entry);
            }
        }
        Some(Returned::Retry) => back.requeued.push((id, t.deliveries(group, id))),
        Some(Returned::Dead(info)) => back.dead.push((id, info)),
    }
    true
}

impl Broker {
    /// A timer of group `group` fired for message `id`: an ack deadline
    /// (the message is ready again, noted in `requeued`, or waits for
    /// retry, noted in `waits`, or is dead-lettered) or the end of a
    /// delay (ready again).
    pub(super) fn msg_timer_fired(
        &mut self,
        (topic, group, id): (TopicId, GroupId, MsgId),
        now: Now,
        requeued: &mut Vec<(TopicId, GroupId, MsgId, u16)>,
        waits: &mut Vec<Wait>,
    ) {
        let Some(e) = self.topics.get_mut(topic) else { return };
        let wait_ms = e.topic.retry_wait_ms(group, id).filter(|w| *w > 0);
        let until = wait_ms.map(|w| now.mono_ms + w);
        let mut timers = GroupTimers { wheel: &mut self.wheel, topic, group };
        match e.topic.timer_fired_retry(group, id, until, &mut timers) {
            Some(Returned::Retry) => match wait_ms {
                Some(w) => {
                    let at = now.wall_ms + w;
                    e.topic.note_delay_wall(group, id, at);
                    e.topic.note_retry_wait(group, id);
                    waits.push((topic, group, id, e.topic.deliveries(group, id), at));
                }
                None => {
                    requeued.push((topic, group, id, e.topic.deliveries(group, id)));
                    self.turn.mark_for_publish(e);
                }
            },
            Some(Returned::Dead(info)) => {
                self.dead_letter(topic, group, id, info);
                self.credit_freed(topic, group);
            }
            None => {}
        }
    }

    /// Keeps a NACK's `reason` (if it gave one) with each message it
    /// returned to group `group`, and logs them in a NackReason record (a
    /// dead-lettered one takes it into its copy instead).
    pub(super) fn keep_nack_reasons(&mut self, tid: TopicId, group: GroupId, back: &Returns, reason: &str) {
        if reason.is_empty() {
            return;
        }
        let Some(e) = self.topics.get_mut(tid) else { return };
        let returned = back.delayed.iter().chain(&back.waits).map(|d| d.0).chain(back.requeued.iter().map(|r| r.0));
        let entries: Vec<(MsgId, &str)> = returned.map(|id| (id, reason)).collect();
        for (id, _) in &entries {
            e.topic.note_nack_reason(group, *id, reason);
        }
        if !entries.is_empty() && !group.is_member() {
            NackReasonRecord { topic: tid, group, entries: &entries }.append(&mut self.log);
            self.compactor.note_group(tid, group);
        }
    }

    /// Appends the Delay records (retry flag set) of messages waiting for
    /// retry, one per group; a broadcast member's state is not logged.
    pub(super) fn log_waits(&mut self, waits: &mut [Wait]) {
        waits.sort_unstable_by_key(|w| (w.0, w.1.0, w.2));
        for chunk in waits.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            let (tid, group) = (chunk[0].0, chunk[0].1);
            if group.is_member() {
                continue;
            }
            let entries: Vec<(MsgId, u16, u64)> = chunk.iter().map(|w| (w.2, w.3, w.4)).collect();
            DelayRecord { topic: tid, group, retry: true, entries: &entries }.append(&mut self.log);
            self.compactor.note_group(tid, group);
        }
    }
}
