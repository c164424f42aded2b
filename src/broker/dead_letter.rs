//! Dead letters: a message whose deliveries ran out moves to its topic's
//! dead-letter topic (`<topic>.dlq`, named by `topics::dead_letter_name`),
//! keeping its born time and saying where it came from (its origin id,
//! deliveries, reason, and the group that dead-lettered it, a broker entry
//! of its properties); REDRIVE moves dead letters back, for every group or,
//! naming a group, that group's dead letters for it alone (marked with a
//! broker entry that every other group's filter drops). Neither ever drops a message: a move the target
//! topic has no room for leaves the message where it was.

use super::requests::{Refusal, room_for};
use super::topics::{unknown, unknown_group};
use super::{Broker, GroupId, TopicId};
use crate::codec::props::{
    PROP_ENTRY_OVERHEAD_BYTES, PROP_ORIGIN_GROUP, PROP_REDRIVEN_TO, put_broker_entry, with_last_nack_reason,
    without_schedule,
};
use crate::codec::{DeadInfo, Props};
use crate::queue::{Body, MsgId, Stored};
use crate::record::{MessageRecord, ProduceWriter, RemoveReason, RemoveRecord};

impl Broker {
    /// Moves message `id` of `tid` to its dead-letter topic for group
    /// `group`, with its last NACK reason in the group. If that topic is
    /// full (or cannot be created), the message goes back to ready
    /// instead: it is never dropped.
    pub(super) fn dead_letter(&mut self, tid: TopicId, group: GroupId, id: MsgId, info: DeadInfo) {
        self.dead_letter_nacked(tid, group, id, info, "");
    }

    /// `dead_letter` for a NACK that gave `reason` (empty: none, the
    /// message's last one in the group is its reason).
    pub(super) fn dead_letter_nacked(&mut self, tid: TopicId, group: GroupId, id: MsgId, info: DeadInfo, reason: &str) {
        let kept = self.topics.get(tid).and_then(|e| e.topic.nack_reason(group, id));
        let reason: Option<Box<str>> = if reason.is_empty() { kept.map(Box::from) } else { Some(reason.into()) };
        let Some(name) = self.dead_letter_name_of(tid) else { return };
        let dlq = match self.topic_for(&name, true) {
            Ok(d) => d,
            Err((_, why)) => {
                log::warn!("cannot create dead-letter topic {name}: {why}; message {id} stays in its topic");
                self.requeue_undead(tid, group, id, info, reason.as_deref());
                return;
            }
        };
        let [Some(src), Some(dst)] = self.topics.pair_mut(tid, dlq) else { return };
        let Some(m) = src.topic.seq.get(id) else { return };
        if room_for(&dst.topic, 1, m.bytes(), &self.config.limits).is_err() {
            log::warn!("dead-letter topic {name} is full; message {id} stays in its topic");
            self.requeue_undead(tid, group, id, info, reason.as_deref());
            return;
        }
        let origin = src.topic.group(group).map_or("", |g| g.name());
        // Its time has come: the dead letter is not scheduled.
        let untimed = m.props.schedule().map(|_| without_schedule(&m.props));
        let base = untimed.as_deref().map_or(m.props, Props::trusted);
        let reasoned = reason.as_deref().and_then(|r| with_last_nack_reason(&base, r));
        let base = reasoned.as_deref().map_or(base, Props::trusted);
        let props_buf = with_entry(base, PROP_ORIGIN_GROUP, origin);
        let props = props_buf.as_deref().map_or(base.public(), Props::trusted);
        let new_id = dst.topic.append_moved(m.born_ms, Body { props, tag_set: None, payload: m.payload }, Some(info));
        let mut w = ProduceWriter::begin(&mut self.log, dlq);
        let (dead, payload) = (Some(info), m.payload);
        w.push(&mut self.log, &MessageRecord { id: new_id, born_ms: m.born_ms, deliveries: 0, dead, props, payload });
        w.end(&mut self.log);
        self.compactor.note_produce(dlq, new_id);
        src.topic.dead_lettered(group, id);
        src.topic.note_dead(group, id, info, reason);
        self.turn.mark_for_publish(dst);
        if !group.is_member() {
            RemoveRecord { topic: tid, group, reason: RemoveReason::DeadLettered, ids: &[id] }.append(&mut self.log);
            self.compactor.note_group(tid, group);
        }
    }

    /// A message that could not be dead-lettered goes back to ready, with
    /// its last NACK reason.
    fn requeue_undead(&mut self, tid: TopicId, group: GroupId, id: MsgId, info: DeadInfo, reason: Option<&str>) {
        if let Some(e) = self.topics.get_mut(tid) {
            e.topic.requeue(group, id, info.origin_deliveries);
            e.topic.note_nack_reason(group, id, reason.unwrap_or(""));
            self.turn.mark_for_publish(e);
        }
    }

    /// REDRIVE: moves up to `max_messages` (0: all) ready messages of
    /// `<topic>.dlq` back to `topic`, as new messages that keep their born
    /// time; stops where `topic` is full. With a `group`, only the dead
    /// letters of that group move, marked for it alone. Returns how many
    /// moved.
    pub(super) fn redrive(&mut self, topic: &str, group: &str, max_messages: u32) -> Result<u64, Refusal> {
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        let dlq_name = super::topics::dead_letter_name(topic);
        let dlq = self.topics.id(&dlq_name).ok_or_else(|| unknown(&dlq_name))?;
        if !group.is_empty() && self.topics.get(tid).and_then(|e| e.topic.group_named(group)).is_none() {
            return Err(unknown_group(topic, group));
        }
        // REDRIVE consumes the dead-letter topic as its default group does
        // (and makes that group, as a version-1 FETCH would).
        self.group_of(dlq, "", true, 0)?;
        let max = if max_messages == 0 { u64::MAX } else { u64::from(max_messages) };
        let l = &self.config.limits;
        let [Some(dst), Some(src)] = self.topics.pair_mut(tid, dlq) else { return Err(unknown(topic)) };
        let mut moved = Vec::new();
        let (log, compactor) = (&mut self.log, &mut self.compactor);
        let move_one = |m: Stored<'_>, _| {
            if room_for(&dst.topic, 1, m.bytes(), l).is_err() {
                return false;
            }
            // The origin group's entry goes; a group's redrive marks it.
            let props_buf = with_entry(m.props, PROP_REDRIVEN_TO, group);
            let props = props_buf.as_deref().map_or(m.props.public(), Props::trusted);
            let new_id = dst.topic.append_moved(m.born_ms, Body { props, tag_set: None, payload: m.payload }, None);
            moved.push(m.id);
            let mut w = ProduceWriter::begin(log, tid);
            let payload = m.payload;
            w.push(log, &MessageRecord { id: new_id, born_ms: m.born_ms, deliveries: 0, dead: None, props, payload });
            w.end(log);
            compactor.note_produce(tid, new_id);
            true
        };
        let n = if group.is_empty() {
            src.topic.drain_ready(GroupId::DEFAULT, max, move_one)
        } else {
            let pick = |m: &Stored<'_>| m.props.broker_entry(PROP_ORIGIN_GROUP) == Some(group);
            src.topic.drain_ready_where(GroupId::DEFAULT, max, pick, move_one)
        };
        if n > 0 {
            self.turn.mark_for_publish(dst);
            let group = GroupId::DEFAULT;
            RemoveRecord { topic: dlq, group, reason: RemoveReason::Redriven, ids: &moved }.append(&mut self.log);
            self.compactor.note_group(dlq, group);
        }
        Ok(n)
    }
}

/// A message's client properties followed by the broker's entry `kind`
/// naming `group`, or None to keep the client properties alone (`group`
/// empty: the default group is never named; or no room left in the
/// blob's u16 length, which only properties near `PROPS_BYTES_LIMIT` can
/// fill: the name is then left off).
fn with_entry(props: Props<'_>, kind: u8, group: &str) -> Option<Vec<u8>> {
    let public = props.public().bytes();
    if group.is_empty() || public.len() + PROP_ENTRY_OVERHEAD_BYTES + group.len() > usize::from(u16::MAX) {
        return None;
    }
    let mut out = public.to_vec();
    put_broker_entry(&mut out, kind, group);
    Some(out)
}
