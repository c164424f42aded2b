//! Dead letters: a message whose deliveries ran out moves to its topic's
//! dead-letter topic (`<topic>.dlq`, named by `topics::dead_letter_name`),
//! keeping its born time and saying where it came from; REDRIVE moves
//! dead letters back. Neither ever drops a message: a move the target
//! topic has no room for leaves the message where it was.

use super::requests::{Refusal, room_for};
use super::topics::unknown;
use super::{Broker, GroupId, TopicId};
use crate::codec::DeadInfo;
use crate::queue::MsgId;
use crate::record::{MessageRecord, ProduceWriter, RemoveReason, RemoveRecord};

impl Broker {
    /// Moves message `id` of `tid` to its dead-letter topic for group
    /// `group`. If that topic is full (or cannot be created), the message
    /// goes back to ready instead: it is never dropped.
    pub(super) fn dead_letter(&mut self, tid: TopicId, group: GroupId, id: MsgId, info: DeadInfo) {
        let Some(name) = self.dead_letter_name_of(tid) else { return };
        let dlq = match self.topic_for(&name, true) {
            Ok(d) => d,
            Err((_, why)) => {
                log::warn!("cannot create dead-letter topic {name}: {why}; message {id} stays in its topic");
                self.requeue_undead(tid, group, id, info);
                return;
            }
        };
        let [Some(src), Some(dst)] = self.topics.pair_mut(tid, dlq) else { return };
        let Some(m) = src.topic.seq.get(id) else { return };
        if room_for(&dst.topic, 1, m.bytes(), &self.config.limits).is_err() {
            log::warn!("dead-letter topic {name} is full; message {id} stays in its topic");
            self.requeue_undead(tid, group, id, info);
            return;
        }
        // Its time has come: the dead letter is not scheduled.
        let untimed = m.props.schedule().map(|_| crate::codec::props::without_schedule(&m.props));
        let props = untimed.as_deref().map_or(m.props, crate::codec::Props::trusted);
        let new_id = dst.topic.append_moved(m.born_ms, crate::queue::Body { props, ..m.body() }, Some(info));
        let mut w = ProduceWriter::begin(&mut self.log, dlq);
        let (dead, payload) = (Some(info), m.payload);
        w.push(&mut self.log, &MessageRecord { id: new_id, born_ms: m.born_ms, deliveries: 0, dead, props, payload });
        w.end(&mut self.log);
        self.compactor.note_produce(dlq, new_id);
        src.topic.dead_lettered(group, id);
        self.turn.mark_for_publish(dst);
        if !group.is_member() {
            RemoveRecord { topic: tid, group, reason: RemoveReason::DeadLettered, ids: &[id] }.append(&mut self.log);
            self.compactor.note_group(tid, group);
        }
    }

    /// A message that could not be dead-lettered goes back to ready.
    fn requeue_undead(&mut self, tid: TopicId, group: GroupId, id: MsgId, info: DeadInfo) {
        if let Some(e) = self.topics.get_mut(tid) {
            e.topic.requeue(group, id, info.origin_deliveries);
            self.turn.mark_for_publish(e);
        }
    }

    /// REDRIVE: moves up to `max_messages` (0: all) ready messages of
    /// `<topic>.dlq` back to `topic`, as new messages that keep their born
    /// time; stops where `topic` is full. Returns how many moved.
    pub(super) fn redrive(&mut self, topic: &str, max_messages: u32) -> Result<u64, Refusal> {
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        let dlq_name = super::topics::dead_letter_name(topic);
        let dlq = self.topics.id(&dlq_name).ok_or_else(|| unknown(&dlq_name))?;
        // REDRIVE consumes the dead-letter topic as its default group does
        // (and makes that group, as a version-1 FETCH would).
        self.group_of(dlq, "", true, 0)?;
        let max = if max_messages == 0 { u64::MAX } else { u64::from(max_messages) };
        let l = &self.config.limits;
        let [Some(dst), Some(src)] = self.topics.pair_mut(tid, dlq) else { return Err(unknown(topic)) };
        let mut moved = Vec::new();
        let (log, compactor) = (&mut self.log, &mut self.compactor);
        let n = src.topic.drain_ready(GroupId::DEFAULT, max, |m, _| {
            if room_for(&dst.topic, 1, m.bytes(), l).is_err() {
                return false;
            }
            let new_id = dst.topic.append_moved(m.born_ms, m.body(), None);
            moved.push(m.id);
            let mut w = ProduceWriter::begin(log, tid);
            let (props, payload) = (m.props, m.payload);
            w.push(log, &MessageRecord { id: new_id, born_ms: m.born_ms, deliveries: 0, dead: None, props, payload });
            w.end(log);
            compactor.note_produce(tid, new_id);
            true
        });
        if n > 0 {
            self.turn.mark_for_publish(dst);
            let group = GroupId::DEFAULT;
            RemoveRecord { topic: dlq, group, reason: RemoveReason::Redriven, ids: &moved }.append(&mut self.log);
            self.compactor.note_group(dlq, group);
        }
        Ok(n)
    }
}
