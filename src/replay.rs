//! Recovery's second half: each record the log reads back is decoded
//! (`record::Record::decode`) and then applied to the topic table, in log
//! order; `finish` ends it. (The first half, what damage in the files
//! means, is `recovery.rs`.)
//!
//! Compaction re-appends a topic's Topic record and its live messages at
//! the head of the log, so a topic's messages may come before its Topic
//! record (it is created nameless and named when the record comes) and in
//! any id order: a message below the topic's highest id so far is kept
//! aside as a stray and merged in at the end. A topic still nameless at the
//! end belonged to a deleted topic, and is dropped.

use std::collections::{BTreeMap, HashMap};

use crate::broker::TopicId;
use crate::broker::topics::Topics;
use crate::compactor::Compactor;
use crate::log::ReadRecord;
use crate::queue::{GroupId, MsgId, Stray, Timers};
use crate::record::{MessageRecord, Record, TopicRecord};
use crate::wheel::TimerKey;

/// Recovery under way: the table being built, what the compactor learns
/// of each segment, and the strays.
pub(crate) struct Replay<'a> {
    topics: &'a mut Topics,
    /// Told which segment holds each topic's messages, Topic and Delete
    /// records.
    notes: &'a mut Compactor,
    /// Messages met below their topic's highest id so far (compaction
    /// copied them forward), merged in at the end.
    strays: HashMap<TopicId, BTreeMap<MsgId, Stray>>,
}

impl<'a> Replay<'a> {
    pub fn new(topics: &'a mut Topics, notes: &'a mut Compactor) -> Replay<'a> {
        Replay { topics, notes, strays: HashMap::new() }
    }

    /// Decodes one record and applies it. An error (a body that does not
    /// match its layout, a record naming the floor's topic id) stops the
    /// start.
    pub fn apply(&mut self, r: &ReadRecord<'_>) -> Result<(), String> {
        let record = Record::decode(r.kind, r.version, r.body)?;
        if let Record::Remove { group, .. } | Record::Requeue { group, .. } = &record
            && *group != GroupId::DEFAULT
        {
            return Err(format!("the record names consumer group {}, which this build does not know", group.0));
        }
        match &record {
            Record::Delete(_) => {}
            Record::Topic(TopicRecord { topic, .. })
            | Record::Purge(crate::record::PurgeRecord { topic, .. })
            | Record::Produce { topic, .. }
            | Record::Remove { topic, .. }
            | Record::Requeue { topic, .. } => {
                if *topic == TopicId::FLOOR {
                    return Err(format!("topic id {topic} names no topic; only a Delete record may carry it"));
                }
            }
        }
        match record {
            Record::Topic(t) => self.topic(&t, r.segment),
            Record::Delete(d) => {
                self.topics.raise_id_floor(d.next_id);
                self.topics.remove(d.topic);
                self.strays.remove(&d.topic);
                self.notes.replayed_delete(r.segment);
            }
            Record::Purge(p) => {
                let e = self.topics.nameless(p.topic);
                e.topic.purge(&mut NoTimers);
                e.topic.seq.bump_next_id(p.below_id);
                if let Some(strays) = self.strays.get_mut(&p.topic) {
                    strays.retain(|id, _| *id >= p.below_id);
                }
            }
            Record::Produce { topic, messages } => {
                for m in messages {
                    let m = m?;
                    self.notes.replayed_produce(r.segment, topic, m.id);
                    self.message(topic, &m);
                }
            }
            Record::Remove { topic, group, ids, .. } => {
                for id in ids.iter() {
                    self.topics.nameless(topic).topic.restore_done_with(group, id);
                    if let Some(strays) = self.strays.get_mut(&topic) {
                        strays.remove(&id);
                    }
                }
            }
            Record::Requeue { topic, group, entries } => {
                for (id, deliveries) in entries.iter() {
                    self.topics.nameless(topic).topic.restore_deliveries(group, id, deliveries);
                    if let Some(s) = self.strays.get_mut(&topic).and_then(|m| m.get_mut(&id)) {
                        s.deliveries = deliveries;
                    }
                }
            }
        }
        Ok(())
    }

    /// A Topic record: the topic exists (created, or named if its messages
    /// came first) with these settings and at least this next id.
    fn topic(&mut self, t: &TopicRecord<'_>, segment: u64) {
        match self.topics.get_mut(t.topic) {
            Some(e) => {
                e.topic.settings = t.settings;
                e.topic.seq.bump_next_id(t.next_id);
                if e.topic.name.is_empty() {
                    self.topics.name(t.topic, t.name);
                }
            }
            None => self.topics.insert(t.topic, t.name, t.settings, t.next_id),
        }
        self.topics.raise_id_floor(t.next_id);
        self.notes.replayed_topic(segment, t.topic);
    }

    /// A message of a Produce record: stored, or only its delivery count
    /// taken if it is stored already (a copy compaction wrote before the
    /// original's segment was removed), or kept aside if it comes below the
    /// topic's highest id so far (a copy moved forward by compaction).
    fn message(&mut self, topic: TopicId, m: &MessageRecord<'_>) {
        let t = &mut self.topics.nameless(topic).topic;
        if t.seq.contains(m.id) {
            t.restore_deliveries(GroupId::DEFAULT, m.id, m.deliveries);
        } else if m.id >= t.seq.next_id() {
            t.restore(m.id, m.born_ms, m.body(), m.deliveries, m.dead);
        } else {
            let strays = self.strays.entry(topic).or_default();
            let stray = strays.entry(m.id).or_insert_with(|| Stray {
                born_ms: m.born_ms,
                deliveries: m.deliveries,
                dead: m.dead,
                props: m.props.bytes().to_vec(),
                payload: m.payload.to_vec(),
            });
            stray.deliveries = m.deliveries;
        }
    }

    /// Ends recovery: merges strays, drops topics whose Topic record never
    /// came (their records belonged to a deleted topic), and makes every
    /// remaining message ready in id order.
    pub fn finish(self) {
        for (tid, strays) in self.strays {
            if let Some(e) = self.topics.get_mut(tid) {
                e.topic.merge(strays.into_iter());
            }
        }
        let nameless: Vec<TopicId> = self.topics.iter().filter(|e| e.topic.name.is_empty()).map(|e| e.id).collect();
        for tid in nameless {
            if let Some(e) = self.topics.remove(tid) {
                log::warn!(
                    "recovery: dropped {} messages of topic id {tid}, whose topic record is missing from the log",
                    e.topic.seq.live()
                );
            }
        }
        let mut floor = 0;
        for e in self.topics.iter_mut() {
            e.topic.restore_done();
            floor = floor.max(e.topic.seq.next_id());
        }
        self.topics.raise_id_floor(floor);
    }
}

/// Timers that do nothing (recovery has no deadlines).
struct NoTimers;

impl Timers for NoTimers {
    fn arm(&mut self, _: u64, _: MsgId) -> TimerKey {
        unreachable!("recovery arms no timers")
    }
    fn disarm(&mut self, _: TimerKey) {}
}

#[cfg(test)]
mod tests {
    use crate::broker::{Broker, Config, Now, TopicId};
    use crate::codec::Props;
    use crate::log::{Log, LogOptions, OpenError};
    use crate::queue::{GroupId, Settings};
    use crate::record::{DeleteRecord, MessageRecord, ProduceWriter, RemoveReason, RemoveRecord, TopicRecord};
    use crate::testkit::TempDir;

    /// A log holding what `write` appends, opened by a broker.
    fn open_after(write: impl FnOnce(&mut Log)) -> Result<Broker, OpenError> {
        let dir = TempDir::new("replay");
        {
            let (mut log, _) = Log::open(dir.path(), LogOptions::default(), |_| Ok(())).expect("open log");
            write(&mut log);
            log.commit(true).expect("commit");
        }
        Broker::open(Config::default(), dir.path(), LogOptions::default(), Now::default())
    }

    #[test]
    fn a_record_of_a_group_this_build_does_not_know_is_refused() {
        let ids = [1];
        let remove = RemoveRecord { topic: TopicId(0), group: GroupId(3), reason: RemoveReason::Acked, ids: &ids };
        let err = open_after(|log| remove.append(log)).err().expect("an unknown group is refused");
        assert!(matches!(&err, OpenError::Apply { why, .. } if why.contains("consumer group 3")), "{err}");
    }

    #[test]
    fn only_a_delete_record_may_name_the_floor_topic_id() {
        let floor = DeleteRecord { topic: TopicId::FLOOR, next_id: 500 };
        let broker = open_after(|log| floor.append(log)).expect("the floor's restatement is read");
        assert_eq!(broker.topic_count(), 0);
        let settings = Settings::default();
        let topic = TopicRecord { topic: TopicId::FLOOR, next_id: 1, settings, name: "t" };
        let err = open_after(|log| topic.append(log)).err().expect("a Topic record with the floor id is refused");
        assert!(matches!(&err, OpenError::Apply { why, .. } if why.contains("names no topic")), "{err}");
        let err = open_after(|log| {
            let mut w = ProduceWriter::begin(log, TopicId::FLOOR);
            w.push(
                log,
                &MessageRecord { id: 1, born_ms: 0, deliveries: 0, dead: None, props: Props::EMPTY, payload: b"m" },
            );
            w.end(log);
        })
        .err()
        .expect("a Produce record with the floor id is refused");
        assert!(matches!(&err, OpenError::Apply { why, .. } if why.contains("names no topic")), "{err}");
    }
}
