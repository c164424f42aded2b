//! Scheduled messages (protocol version 3): the delivery time a PRODUCE
//! gives a message, CANCEL and RESCHEDULE, and the one wheel timer per
//! topic that fires at its earliest due time (so the wheel holds one timer
//! per topic with scheduled messages, not one per message).
//!
//! A message is due by the broker's wall clock; the wheel runs on the
//! monotonic clock, so a timer is armed for the monotonic time the due
//! time is at now, and one that fires early (the wall clock was set back)
//! finds nothing due and is armed again.

use super::requests::Refusal;
use super::topics::unknown;
use super::{Broker, Now, Timer, TopicId};
use crate::codec::props::{self, PROP_DELIVER_AT, PROP_ENTRY_OVERHEAD_BYTES, Prop};
use crate::codec::schedule::When;
use crate::codec::{self, Batch, ErrorCode, Props, op};
use crate::queue::{FastMap, MsgId};
use crate::record::{RecordKind, RescheduleRecord, ScheduledRecord};
use crate::wheel::TimerKey;

/// Most scheduled messages one topic makes ready in one loop turn: a
/// million due at one millisecond are made ready over some turns, each of
/// bounded work, not in one that stalls the loop.
pub(super) const DUE_PER_TURN_MAX: u32 = 65_536;

/// The wheel timer of each topic with scheduled messages.
#[derive(Default)]
pub(super) struct DueTimers(FastMap<TopicId, (TimerKey, u64)>);

/// The time a message's property names, given the time now.
fn due_of(p: Prop<'_>, now_wall_ms: u64) -> Option<u64> {
    match p {
        Prop::DeliverAt(at) => Some(at),
        Prop::Delay(ms) => Some(now_wall_ms.saturating_add(ms)),
        _ => None,
    }
}

/// The properties a produced message is stored with, and its due time if
/// it is scheduled: a delay becomes the time it names (`deliver_at_ms`),
/// so that a restart keeps the time, and a time not after now is left out
/// (the message is not scheduled). `buf` holds the new blob.
pub(super) fn stored_props<'b>(props: Props<'b>, now_wall_ms: u64, buf: &'b mut Vec<u8>) -> (Props<'b>, Option<u64>) {
    let Some(due) = props.schedule().and_then(|p| due_of(p, now_wall_ms)) else { return (props, None) };
    buf.clear();
    if due <= now_wall_ms {
        buf.extend_from_slice(&props::without_schedule(&props));
        return (Props::trusted(buf), None);
    }
    buf.extend_from_slice(props.bytes());
    if let Some(at) = props.schedule_value_at() {
        buf[at - PROP_ENTRY_OVERHEAD_BYTES] = PROP_DELIVER_AT;
        buf[at..at + 8].copy_from_slice(&due.to_le_bytes());
    }
    (Props::trusted(buf), Some(due))
}

/// BAD_ARGUMENT if `due_ms` is more than `ahead_ms_max` after now.
fn check_ahead(due_ms: u64, now_wall_ms: u64, ahead_ms_max: u64) -> Result<(), Refusal> {
    if due_ms.saturating_sub(now_wall_ms) <= ahead_ms_max {
        return Ok(());
    }
    let message = format!(
        "delivery time {due_ms} is {} ms ahead of the broker's clock, more than schedule_ahead_ms_max ({ahead_ms_max})",
        due_ms - now_wall_ms
    );
    Err((ErrorCode::BadArgument, message))
}

impl Broker {
    /// Refuses a batch (before any of it is stored) with a delivery time
    /// past `schedule_ahead_ms_max`.
    pub(super) fn check_schedules(&self, batch: &Batch<'_>, now: Now) -> Result<(), Refusal> {
        if !batch.with_props {
            return Ok(());
        }
        let max = self.config.limits.schedule_ahead_ms_max;
        for (p, _) in batch.messages() {
            if let Some(due) = p.schedule().and_then(|p| due_of(p, now.wall_ms)) {
                check_ahead(due, now.wall_ms, max)?;
            }
        }
        Ok(())
    }

    /// Arms topic `tid`'s timer for its earliest scheduled message (or
    /// disarms it when it has none); nothing if it is armed for that time.
    pub(super) fn arm_due(&mut self, tid: TopicId, now: Now) {
        let next = self.topics.get(tid).and_then(|e| e.topic.seq.schedule().next_due_ms());
        let armed = self.due_timers.0.get(&tid).copied();
        if let (Some((key, at)), Some(due)) = (armed, next)
            && at == due
            && self.wheel.deadline_ms(key).is_some()
        {
            return;
        }
        if let Some((key, _)) = armed {
            self.wheel.cancel(key);
            self.due_timers.0.remove(&tid);
        }
        if let Some(due) = next {
            let deadline_ms = now.mono_ms.saturating_add(due.saturating_sub(now.wall_ms));
            let key = self.wheel.insert(deadline_ms, Timer::Due { topic: tid });
            self.due_timers.0.insert(tid, (key, due));
        }
    }

    /// Arms the timer of every topic with scheduled messages (at start).
    pub(super) fn arm_all_due(&mut self, now: Now) {
        let tids: Vec<TopicId> =
            self.topics.iter().filter(|e| !e.topic.seq.schedule().is_empty()).map(|e| e.id).collect();
        for tid in tids {
            self.arm_due(tid, now);
        }
    }

    /// Arms the NACK delays recovery found still running, in every group.
    pub(super) fn arm_restored_delays(&mut self, now: Now) {
        let tids: Vec<TopicId> = self.topics.iter().map(|e| e.id).collect();
        for tid in tids {
            let Some(e) = self.topics.get_mut(tid) else { continue };
            let mut i = 0;
            while let Some(group) = e.topic.group_id_at(i) {
                i += 1;
                let mut timers = super::GroupTimers { wheel: &mut self.wheel, topic: tid, group };
                e.topic.arm_restored(group, now.mono_ms, now.wall_ms, &mut timers);
            }
        }
    }

    /// Topic `tid`'s timer fired: its messages due by now become ready
    /// (a Due record says so), and the timer is armed for the next.
    pub(super) fn due_fired(&mut self, tid: TopicId, now: Now) {
        self.due_timers.0.remove(&tid);
        let Some(e) = self.topics.get_mut(tid) else { return };
        let mut ids = Vec::new();
        if e.topic.fall_due(now.wall_ms, DUE_PER_TURN_MAX, |id| ids.push(id)) > 0 {
            ScheduledRecord { topic: tid, ids: &ids }.append(RecordKind::Due, &mut self.log);
            self.turn.mark_for_publish(e);
            self.sweeps.note(tid);
        }
        self.arm_due(tid, now);
    }

    /// CANCEL: the scheduled message leaves the topic. Its reply is the
    /// time it was due.
    pub(super) fn cancel_op(&mut self, topic: &str, id: MsgId, rid: u32, out: &mut Vec<u8>) -> Result<(), Refusal> {
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        let Some(e) = self.topics.get_mut(tid) else { return Err(unknown(topic)) };
        let due = e.topic.cancel(id).ok_or_else(|| not_scheduled(topic, id))?;
        ScheduledRecord { topic: tid, ids: &[id] }.append(RecordKind::Cancel, &mut self.log);
        self.compactor.retained.canceled(tid, id);
        self.compactor.nudge();
        codec::encode_u64_reply(out, op::CANCEL, rid, due);
        Ok(())
    }

    /// RESCHEDULE: the scheduled message is due at a new time (one not
    /// after now makes it ready at the next turn). Its reply is that time.
    pub(super) fn reschedule_op(
        &mut self,
        (topic, id): (&str, MsgId),
        when: When,
        now: Now,
        rid: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        let due = when.due_ms(now.wall_ms);
        check_ahead(due, now.wall_ms, self.config.limits.schedule_ahead_ms_max)?;
        let Some(e) = self.topics.get_mut(tid) else { return Err(unknown(topic)) };
        if !e.topic.reschedule(id, due) {
            return Err(not_scheduled(topic, id));
        }
        RescheduleRecord { topic: tid, entries: &[(id, due)] }.append(&mut self.log);
        self.arm_due(tid, now);
        codec::encode_u64_reply(out, op::RESCHEDULE, rid, due);
        Ok(())
    }
}

/// NOT_SCHEDULED, naming the message.
fn not_scheduled(topic: &str, id: MsgId) -> Refusal {
    let message = format!(
        "message {id} of topic {topic} is not scheduled: never scheduled, its time has come, or it was cancelled"
    );
    (ErrorCode::NotScheduled, message)
}
