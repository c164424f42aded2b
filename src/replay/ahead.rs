//! Recovery's first pass: which consumer groups existed before their
//! first record in the log, and what each needed then.
//!
//! Compaction restates a group (a Group and a GroupState record) at the
//! head of the log when the segment holding its oldest record goes, so the
//! log may hold another group's acks of a message before the first record
//! of a group that still needed it. Replay, which releases a message once
//! every group it knows is done with it, must know that group from the
//! start: this pass finds it, so that the second pass can place it before
//! the first record, at the state its first record gives.

use std::collections::{BTreeMap, HashMap};

use crate::broker::TopicId;
use crate::log::ReadRecord;
use crate::queue::{GroupId, IdMap, MsgId};
use crate::record::{Record, RecordKind};

/// What a group's first record in the log says of it before that record.
pub(super) enum First {
    /// A Topic record, then the Group record: it was created there, and
    /// needed nothing before.
    Created,
    /// Compaction's restatement (a Group record, then its GroupState): it
    /// needed, before, what the GroupState states.
    Restated { floor: MsgId, pending: IdMap<u16> },
    /// Any other record: it existed, in a state its first GroupState
    /// record tells; until then replay holds every message it has not
    /// acked in the log.
    Unknown,
}

/// What the first pass found of one topic.
#[derive(Default)]
pub(super) struct TopicAhead {
    /// The offset of the topic's last Delete record: its groups before it
    /// belonged to the deleted topic (an id a restart may give again).
    pub after: Option<u64>,
    pub groups: BTreeMap<u32, First>,
    /// Groups deleted later in the log: what they needed does not matter
    /// once they go, so replay need not hold anything for them.
    deleted: Vec<u32>,
}

/// The first pass under way.
#[derive(Default)]
pub(super) struct Ahead {
    topics: HashMap<TopicId, TopicAhead>,
    /// The record before this one: a Topic record (a Group record after it
    /// is a creation), or the Group record that first named a group (a
    /// GroupState of the same group after it makes it a restatement).
    prev: Prev,
}

#[derive(Default, Clone, Copy, PartialEq)]
enum Prev {
    #[default]
    Other,
    Topic(TopicId),
    FirstGroup(TopicId, GroupId),
}

impl Ahead {
    /// Reads one record. A record that does not decode is left to the
    /// second pass, which stops the start on it.
    pub fn scan(&mut self, r: &ReadRecord<'_>) {
        let prev = std::mem::take(&mut self.prev);
        if matches!(r.kind, RecordKind::Produce | RecordKind::Dedup) {
            return;
        }
        let Ok(record) = Record::decode(r.kind, r.version, r.body) else { return };
        let (topic, group) = match record {
            Record::Topic(t) => {
                self.prev = Prev::Topic(t.topic);
                return;
            }
            Record::Delete(d) => {
                self.topics.insert(d.topic, TopicAhead { after: Some(r.offset), ..TopicAhead::default() });
                return;
            }
            Record::GroupDelete(d) => {
                self.topics.entry(d.topic).or_default().deleted.push(d.group.0);
                return;
            }
            Record::Group(g) => {
                let t = self.topics.entry(g.topic).or_default();
                if let std::collections::btree_map::Entry::Vacant(v) = t.groups.entry(g.group.0) {
                    v.insert(if prev == Prev::Topic(g.topic) { First::Created } else { First::Unknown });
                    self.prev = Prev::FirstGroup(g.topic, g.group);
                }
                return;
            }
            Record::GroupState { topic, group, cursor, entries } => {
                let t = self.topics.entry(topic).or_default();
                if prev == Prev::FirstGroup(topic, group) || !t.groups.contains_key(&group.0) {
                    let pending = entries.iter().filter(|&(id, _)| id < cursor).collect();
                    t.groups.insert(group.0, First::Restated { floor: cursor, pending });
                }
                return;
            }
            Record::Remove { topic, group, .. }
            | Record::AckProduce { topic, group, .. }
            | Record::Requeue { topic, group, .. }
            | Record::Delay { topic, group, .. }
            | Record::Deliver { topic, group, .. }
            | Record::NackReason { topic, group, .. } => (topic, group),
            Record::Produce { .. }
            | Record::Purge(_)
            | Record::Cancel { .. }
            | Record::Reschedule { .. }
            | Record::Due { .. }
            | Record::Dedup { .. } => return,
        };
        self.topics.entry(topic).or_default().groups.entry(group.0).or_insert(First::Unknown);
    }

    /// What the pass found of each topic's groups that existed before
    /// their first record, by topic: groups created in the log, and groups
    /// deleted in it, left out.
    pub fn finish(self) -> HashMap<TopicId, TopicAhead> {
        let mut topics = self.topics;
        for t in topics.values_mut() {
            for g in std::mem::take(&mut t.deleted) {
                t.groups.remove(&g);
            }
            t.groups.retain(|_, f| !matches!(f, First::Created));
        }
        topics.retain(|_, t| !t.groups.is_empty());
        topics
    }
}
