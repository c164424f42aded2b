//! The topic table: every topic by id and by name, the ids they get, the
//! id floor that keeps message ids from repeating, and the name of each
//! one's dead-letter topic (`dead_letter_name`, the one place that names
//! one).
//!
//! Recovery (`replay.rs`) builds it, compaction (`compactor.rs`) reads it,
//! the requests change it; all through these methods.

use std::cell::Cell;
use std::collections::HashMap;

use super::TopicId;
use crate::codec::{self, ErrorCode};
use crate::queue::{FastMap, MsgId, Settings, Topic};
use crate::record::TopicRecord;

/// A topic and the broker's bookkeeping for it.
pub(crate) struct Entry {
    pub topic: Topic,
    pub id: TopicId,
    /// Already in this turn's list of topics to publish (`Turn`).
    pub to_publish: bool,
}

/// The topic table.
#[derive(Default)]
pub(crate) struct Topics {
    /// Keyed by the broker's own ids, so the fast `IdHasher` is safe.
    by_id: FastMap<TopicId, Entry>,
    /// Names are the client's, so they get the std hasher (keyed, unlike
    /// `IdHasher`): a client cannot make them collide.
    names: HashMap<Box<str>, TopicId>,
    /// The topic the last lookup by name found: requests come in runs to
    /// one topic, and checking it costs a compare of the name where
    /// `names` costs a keyed hash of it. Checked against the table on
    /// every use, so it is never wrong, only missed.
    last_found: Cell<TopicId>,
    /// The id the next topic created gets: above every id a topic ever
    /// had, never past `TopicId::MAX` (past it, `TopicId::FLOOR`: used up).
    next_topic_id: TopicId,
    /// First message id of the next topic created: above every id any
    /// topic ever had, so ids never repeat, even after delete and
    /// re-create.
    id_floor: MsgId,
    /// Topics that are not dead-letter topics (what topics_max counts).
    user_topics: u32,
    /// The key index bounds of every topic (`lookup_results_max`,
    /// `key_index_entries_per_topic_max`); None: the default limits'.
    key_bounds: Option<(u32, u32)>,
}

/// The name of topic `name`'s dead-letter topic.
pub(crate) fn dead_letter_name(name: &str) -> String {
    format!("{name}{}", codec::DEAD_LETTER_SUFFIX)
}

/// A new topic, its key index held to `key_bounds` (`Topics::key_bounds`).
fn new_topic(key_bounds: Option<(u32, u32)>, name: &str, settings: Settings, first_id: MsgId) -> Topic {
    let mut topic = Topic::new(name, is_dead_letter_name(name), settings, first_id);
    if let Some((per_key, entries)) = key_bounds {
        topic.set_key_bounds(per_key, entries);
    }
    topic
}

/// Whether `name` is a dead-letter topic's.
pub(crate) fn is_dead_letter_name(name: &str) -> bool {
    name.ends_with(codec::DEAD_LETTER_SUFFIX)
}

/// UNKNOWN_GROUP, naming it.
pub(crate) fn unknown_group(topic: &str, group: &str) -> (ErrorCode, String) {
    (ErrorCode::UnknownGroup, format!("topic {topic} has no group named {group}"))
}

/// UNKNOWN_TOPIC, naming it.
pub(crate) fn unknown(name: &str) -> (ErrorCode, String) {
    (ErrorCode::UnknownTopic, format!("no topic named {name}"))
}

impl Topics {
    pub fn id(&self, name: &str) -> Option<TopicId> {
        let last = self.last_found.get();
        if !name.is_empty() && self.by_id.get(&last).is_some_and(|e| *e.topic.name == *name) {
            return Some(last);
        }
        let id = self.names.get(name).copied()?;
        self.last_found.set(id);
        Some(id)
    }
    pub fn get(&self, id: TopicId) -> Option<&Entry> {
        self.by_id.get(&id)
    }
    pub fn get_mut(&mut self, id: TopicId) -> Option<&mut Entry> {
        self.by_id.get_mut(&id)
    }
    /// Two different topics at once (a topic and its dead-letter topic).
    pub fn pair_mut(&mut self, a: TopicId, b: TopicId) -> [Option<&mut Entry>; 2] {
        self.by_id.get_disjoint_mut([&a, &b])
    }
    pub fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.by_id.values()
    }
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Entry> {
        self.by_id.values_mut()
    }
    pub fn len(&self) -> usize {
        self.by_id.len()
    }
    /// The topics named `only` (all of them if empty), sorted by name.
    pub fn sorted(&self, only: &str) -> Vec<&Entry> {
        let mut v: Vec<&Entry> = self.iter().filter(|e| only.is_empty() || *e.topic.name == *only).collect();
        v.sort_unstable_by(|a, b| a.topic.name.cmp(&b.topic.name));
        v
    }
    /// First message id of the next topic created.
    pub fn id_floor(&self) -> MsgId {
        self.id_floor
    }
    /// Bounds every topic's key index, now and when created, by `l`.
    pub fn set_key_bounds(&mut self, l: &crate::limits::Limits) {
        let bounds = (l.lookup_results_max, l.key_index_entries_per_topic_max);
        self.key_bounds = Some(bounds);
        for e in self.by_id.values_mut() {
            e.topic.set_key_bounds(bounds.0, bounds.1);
        }
    }

    /// Recovery met an id floor (a Topic or Delete record).
    pub fn raise_id_floor(&mut self, floor: MsgId) {
        self.id_floor = self.id_floor.max(floor);
    }

    /// The Topic record that states topic `id` as it is now.
    pub fn record(&self, id: TopicId) -> Option<TopicRecord<'_>> {
        let t = &self.get(id)?.topic;
        let next_group_id = Some(t.next_group_id());
        Some(TopicRecord { topic: id, next_id: t.seq.next_id(), settings: t.settings, next_group_id, name: &t.name })
    }

    /// Creates topic `name` with `settings`: TOO_MANY_TOPICS past
    /// `topics_max` user topics (a dead-letter topic counts only once its
    /// origin is gone), or once topic ids are used up. A dead-letter topic
    /// is made only beside its origin topic, itself not a dead-letter
    /// topic (else UNKNOWN_TOPIC): so there are never more of them than
    /// `topics_max`.
    pub fn create(&mut self, name: &str, settings: Settings, topics_max: u32) -> Result<TopicId, (ErrorCode, String)> {
        if let Some(origin) = name.strip_suffix(codec::DEAD_LETTER_SUFFIX) {
            if is_dead_letter_name(origin) || self.id(origin).is_none() {
                let why = format!(
                    "no topic named {name}: a dead-letter topic is made only beside its origin topic, {origin}, which must exist and not be a dead-letter topic itself"
                );
                return Err((ErrorCode::UnknownTopic, why));
            }
        } else if self.user_topics + self.orphans() - u32::from(self.names.contains_key(&*dead_letter_name(name)))
            >= topics_max
        {
            let msg = format!(
                "the broker holds topics_max ({topics_max}) topics (dead-letter topics whose origin was deleted count too)"
            );
            return Err((ErrorCode::TooManyTopics, msg));
        }
        let id = self.next_topic_id;
        if id > TopicId::MAX {
            return Err((
                ErrorCode::TooManyTopics,
                format!("topic ids are used up: {} topics were created over the log's life", TopicId::MAX.0),
            ));
        }
        self.insert(id, name, settings, self.id_floor);
        Ok(id)
    }

    /// Dead-letter topics whose origin topic is gone: they count toward
    /// `topics_max` (O(topics): for creating a topic, which is rare).
    fn orphans(&self) -> u32 {
        let orphan = |n: &str| n.strip_suffix(codec::DEAD_LETTER_SUFFIX).is_some_and(|o| !self.names.contains_key(o));
        self.names.keys().filter(|n| orphan(n)).count() as u32
    }

    /// Adds topic `id` (created, or recovered from its Topic record) whose
    /// first message id is at least `first_id` and the id floor.
    pub fn insert(&mut self, id: TopicId, name: &str, settings: Settings, first_id: MsgId) {
        assert!(id <= TopicId::MAX, "topic id {id} is the floor's");
        let topic = new_topic(self.key_bounds, name, settings, first_id.max(self.id_floor));
        self.id_floor = self.id_floor.max(topic.seq.next_id());
        self.by_id.insert(id, Entry { topic, id, to_publish: false });
        self.name(id, name);
        self.note_id(id);
    }

    /// Topic `id` was seen: the next topic created gets a higher id. (No
    /// overflow: `id` is at most `TopicId::MAX`, one below the floor id.)
    fn note_id(&mut self, id: TopicId) {
        self.next_topic_id = self.next_topic_id.max(TopicId(id.0 + 1));
    }

    /// Gives topic `id` its name (at creation, or when recovery meets the
    /// Topic record of a topic whose messages came first).
    pub fn name(&mut self, id: TopicId, name: &str) {
        let Some(e) = self.by_id.get_mut(&id) else { return };
        let is_dlq = is_dead_letter_name(name);
        e.topic.set_name(name, is_dlq);
        self.names.insert(name.into(), id);
        if !is_dlq {
            self.user_topics += 1;
        }
    }

    pub fn remove(&mut self, id: TopicId) -> Option<Entry> {
        let e = self.by_id.remove(&id)?;
        if !e.topic.name.is_empty() {
            self.names.remove(&*e.topic.name);
            if !e.topic.is_dlq() {
                self.user_topics -= 1;
            }
        }
        self.id_floor = self.id_floor.max(e.topic.seq.next_id());
        Some(e)
    }

    /// Recovery: topic `id`, created nameless if its Topic record has not
    /// come yet (compaction may copy a topic's messages ahead of it).
    pub fn nameless(&mut self, id: TopicId) -> &mut Entry {
        assert!(id <= TopicId::MAX, "topic id {id} is the floor's");
        self.note_id(id);
        let bounds = self.key_bounds;
        self.by_id.entry(id).or_insert_with(|| Entry {
            topic: new_topic(bounds, "", Settings::default(), 1),
            id,
            to_publish: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_ids_stop_below_the_floor_id_however_many_topics_come_and_go() {
        let mut topics = Topics::default();
        // As if recovery met a topic with the id before the last.
        topics.insert(TopicId(TopicId::MAX.0 - 1), "old", Settings::default(), 1);
        let last = topics.create("a", Settings::default(), 10).expect("the last id is free");
        assert_eq!(last, TopicId::MAX);
        topics.remove(last);
        let err = topics.create("a", Settings::default(), 10).expect_err("no id is left");
        assert_eq!(err.0, ErrorCode::TooManyTopics);
        assert!(err.1.contains("used up"), "{}", err.1);
        assert!(topics.get(TopicId::FLOOR).is_none(), "no topic ever has the floor id");
        // Dead-letter topics need ids too.
        assert_eq!(topics.create("old.dlq", Settings::default(), 10).map_err(|e| e.0), Err(ErrorCode::TooManyTopics));
    }

    #[test]
    fn a_topic_created_after_a_delete_starts_above_its_ids() {
        let mut topics = Topics::default();
        let a = topics.create("a", Settings::default(), 10).expect("create");
        for _ in 0..5 {
            topics.get_mut(a).expect("a").topic.produce(0, b"m");
        }
        topics.remove(a);
        let b = topics.create("a", Settings::default(), 10).expect("re-create");
        assert!(b > a, "topic ids are not reused");
        assert_eq!(topics.get(b).expect("b").topic.seq.next_id(), 6, "message ids are not reused");
    }

    #[test]
    fn a_lookup_by_name_never_finds_a_topic_gone_or_renamed() {
        let mut topics = Topics::default();
        let a = topics.create("a", Settings::default(), 10).expect("create a");
        let b = topics.create("b", Settings::default(), 10).expect("create b");
        assert_eq!((topics.id("a"), topics.id("b"), topics.id("a")), (Some(a), Some(b), Some(a)));
        topics.remove(a);
        assert_eq!(topics.id("a"), None, "the last found was deleted");
        let a2 = topics.create("a", Settings::default(), 10).expect("re-create a");
        assert_eq!(topics.id("a"), Some(a2));
        assert_eq!(topics.id("b"), Some(b));
        assert_eq!(topics.id("c"), None);
        // Recovery names a nameless topic late; a lookup of the empty name
        // (which no request makes) finds nothing.
        let n = topics.nameless(TopicId(7)).id;
        assert_eq!(topics.id(""), None);
        topics.name(n, "late");
        assert_eq!(topics.id("late"), Some(n));
    }

    #[test]
    fn topics_max_counts_user_topics_and_dead_letter_topics_without_their_origin() {
        let mut topics = Topics::default();
        let a = topics.create("a", Settings::default(), 1).expect("the first");
        assert_eq!(topics.create("b", Settings::default(), 1).map_err(|e| e.0), Err(ErrorCode::TooManyTopics));
        topics.create(&dead_letter_name("a"), Settings::default(), 1).expect("a dead-letter topic");
        assert!(topics.get(topics.id("a.dlq").expect("named")).expect("it").topic.is_dlq());
        assert!(!is_dead_letter_name("a.dlq.x"));
        // Only beside an origin that is not a dead-letter topic.
        for name in ["b.dlq", "a.dlq.dlq"] {
            assert_eq!(topics.create(name, Settings::default(), 1).map_err(|e| e.0), Err(ErrorCode::UnknownTopic));
        }
        // An origin deleted: its dead-letter topic stays, and counts.
        topics.remove(a);
        assert_eq!(topics.create("b", Settings::default(), 1).map_err(|e| e.0), Err(ErrorCode::TooManyTopics));
        topics.create("a", Settings::default(), 1).expect("its origin again: the dead-letter topic has it");
    }
}
