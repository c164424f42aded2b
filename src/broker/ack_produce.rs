//! ACK_PRODUCE (protocol version 3): a consumer acks messages of one
//! (topic, group) and produces messages to topics in one frame, written as
//! one AckProduce log record, so that after any crash either all of it
//! happened or none of it (a processing stage that is exactly-once inside
//! the broker).
//!
//! Everything that could refuse the frame is decided before anything
//! changes: every acked id must be in flight to this connection (else the
//! reply names the ones that are not, and nothing is done), and every
//! output must have room and its tag sets (else the frame's error, and
//! nothing is done). Then the acks and the produces are applied and the
//! record appended. The reply waits for the sync, as a PRODUCE's.
//!
//! The record is not withdrawable, as an ack's is not: if the commit
//! fails, the reply is STORAGE and the record is written with the next
//! commit that succeeds (the frame then took effect, as an admin frame
//! does: a retry finds its ids no longer in flight). While the disk is
//! short of space the frame is refused STORAGE before anything is done, so
//! that its produced messages never take the room kept for acks.

use super::requests::{Refusal, intern_batch, room_for};
use super::topics::unknown;
use super::{Broker, GroupTimers, Now, TopicId};
use crate::codec::ack_produce::{self, Outputs};
use crate::codec::{Batch, ErrorCode, Ids};
use crate::queue::{Body, ConsumerId, GroupId, TagSetId};
use crate::record::{AckProduceWriter, MessageRecord};

/// One output, checked: its topic, its batch, and its messages' tag sets
/// (a reference taken for each).
struct Planned<'a> {
    topic: TopicId,
    batch: Batch<'a>,
    tag_sets: Vec<Option<TagSetId>>,
}

impl Broker {
    /// ACK_PRODUCE from consumer `c`: `Ok` with the reply in `out`.
    pub(super) fn ack_produce(
        &mut self,
        (topic, group, c): (&str, &str, ConsumerId),
        acked: Ids<'_>,
        outputs: Outputs<'_>,
        (rid, now): (u32, Now),
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        if self.log.space_short() {
            let msg = "the disk is full: ACK_PRODUCE is refused until space is freed; nothing was done";
            return Err((ErrorCode::Storage, msg.into()));
        }
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        // A broadcast group has no pending list shared by its consumers
        // for the record to settle: refused whoever asks, a member or not,
        // before anything of the group is looked up.
        if self.topics.get(tid).and_then(|e| e.topic.group_named(group)).is_some_and(|g| g.config.broadcast) {
            let msg = format!("group {group} is a broadcast group: ACK_PRODUCE acks for a competing group only");
            return Err((ErrorCode::BadArgument, msg));
        }
        // A missing default group: nothing is in flight to it (`not_held`
        // says so).
        let group = self.group_of(tid, group, false, c)?;
        let ids: Vec<u64> = acked.iter().collect();
        let failed = self.not_held(tid, group, c, &ids)?;
        if !failed.is_empty() {
            ack_produce::encode_reply(out, rid, 0, &failed, &[]);
            return Ok(());
        }
        // A delivery time past the limit refuses the whole request, and so
        // does a dedup id: an output is produced once, with its ack.
        outputs.iter().try_for_each(|(_, batch)| self.check_schedules(&batch, now))?;
        outputs.iter().try_for_each(|(_, batch)| super::dedup::refuse_ids(&batch))?;
        let plan = self.plan_outputs(outputs)?;
        let acks: Vec<(u64, u16)> = match self.topics.get(tid) {
            Some(e) => ids.iter().map(|&id| (id, e.topic.deliveries(group, id))).collect(),
            None => Vec::new(),
        };
        self.ack_all(tid, group, &ids);
        let mut w = AckProduceWriter::begin(&mut self.log, tid, group, &ids);
        self.compactor.note_group(tid, group);
        self.compactor.note_ack_produce(tid, group, &acks);
        let mut produced = Vec::with_capacity(plan.len());
        for p in plan {
            produced.push(self.produce_output(&mut w, p, now));
        }
        w.end(&mut self.log);
        self.credit_freed(tid, group);
        ack_produce::encode_reply(out, rid, ids.len() as u32, &[], &produced);
        Ok(())
    }

    /// The ids of `ids` not in flight to consumer `c` in group `group` of
    /// `tid`; BAD_ARGUMENT if an id is named twice.
    fn not_held(&self, tid: TopicId, group: GroupId, c: ConsumerId, ids: &[u64]) -> Result<Vec<u64>, Refusal> {
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err((ErrorCode::BadArgument, "an id is named twice".into()));
        }
        let Some(e) = self.topics.get(tid) else { return Ok(ids.to_vec()) };
        Ok(ids.iter().copied().filter(|&id| !e.topic.holds(group, id, c)).collect())
    }

    /// Resolves every output's topic (made if missing and auto-create
    /// allows), checks its room, and interns its tag sets; on a refusal,
    /// the sets taken so far are given back.
    fn plan_outputs<'a>(&mut self, outputs: Outputs<'a>) -> Result<Vec<Planned<'a>>, Refusal> {
        let mut plan: Vec<Planned<'a>> = Vec::new();
        let result = outputs.iter().try_for_each(|(name, batch)| {
            let topic = self.topic_for(name, self.config.auto_create)?;
            let Some(e) = self.topics.get_mut(topic) else { return Err(unknown(name)) };
            let l = &self.config.limits;
            room_for(&e.topic, u64::from(batch.count), batch.payload_bytes(), l)?;
            let tag_sets = intern_batch(&mut e.topic.seq, &batch, l.tag_sets_per_topic_max)?;
            plan.push(Planned { topic, batch, tag_sets });
            Ok(())
        });
        if let Err(refusal) = result {
            for p in plan {
                if let Some(e) = self.topics.get_mut(p.topic) {
                    p.tag_sets.into_iter().for_each(|set| e.topic.seq.untake_tags(set));
                }
            }
            return Err(refusal);
        }
        Ok(plan)
    }

    /// Acks every id (each is in flight to the consumer: checked).
    fn ack_all(&mut self, tid: TopicId, group: GroupId, ids: &[u64]) {
        let Some(e) = self.topics.get_mut(tid) else { return };
        let mut timers = GroupTimers { wheel: &mut self.wheel, topic: tid, group };
        for &id in ids {
            let acked = e.topic.ack(group, id, &mut timers);
            assert!(acked, "message {id} was checked to be in flight");
        }
    }

    /// Stores one output's messages and appends them to the record;
    /// returns its first id and count.
    fn produce_output(&mut self, w: &mut AckProduceWriter, p: Planned<'_>, now: Now) -> (u64, u32) {
        let Some(e) = self.topics.get_mut(p.topic) else { return (0, 0) };
        let first = e.topic.seq.next_id();
        w.output(&mut self.log, p.topic);
        let (mut buf, mut scheduled) = (Vec::new(), false);
        for (i, (props, payload)) in p.batch.messages().enumerate() {
            let tag_set = p.tag_sets.get(i).copied().flatten();
            // Scheduled as a PRODUCE's messages are (broker/schedule.rs).
            let (props, due) = super::schedule::stored_props(props, now.wall_ms, &mut buf);
            let (id, born_ms) = e.topic.produce(now.wall_ms, Body { props, tag_set, payload });
            if let Some(due) = due {
                e.topic.schedule(id, due);
                scheduled = true;
            }
            w.push(&mut self.log, &MessageRecord { id, born_ms, deliveries: 0, dead: None, props, payload });
            // Kept with the record if the commit fails, as the acks are.
            self.compactor.note_produce(p.topic, id);
        }
        self.turn.mark_for_publish(e);
        if scheduled {
            self.arm_due(p.topic, now);
        }
        (first, p.batch.count)
    }
}
