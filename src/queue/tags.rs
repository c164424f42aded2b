//! `Tags`: a topic's table of interned tags and tag sets.
//!
//! A message's tags are a *tag set*: its distinct tags, in no order. Each
//! distinct tag gets a `TagId` and each distinct set a `TagSetId`, once per
//! topic, so that a message stores two bytes for its tags (`Seq`'s per-block
//! column) and a consumer group decides its filter once per tag set, never
//! per message: the filter reads `tags_of` and `name`, and the decision is
//! cached by `TagSetId`.
//!
//! Every live message holds a reference to its set (`intern` takes it,
//! `release` drops it). A set no message holds is kept, so that a tag set
//! that comes and goes keeps its id and every group its cached decision; it
//! is reclaimed only when the table is full and a new set needs its room.
//! That reuses ids, so `epoch` changes with every reclaim: a decision cached
//! by `TagSetId` is valid only while the epoch it was made in lasts. The
//! table is bounded by `tag_sets_per_topic_max` (distinct tag sets among the
//! messages a topic holds; distinct tags are at most `tags_per_message_max`
//! times that), and by `TAG_SETS_MAX` whatever the limit, the most the
//! column's `u16` can name.

use std::collections::HashMap;
use std::num::NonZeroU16;

/// Most tag sets one table can hold: ids are a nonzero `u16`, so that the
/// per-block column takes two bytes a message and 0 means untagged.
pub const TAG_SETS_MAX: u32 = u16::MAX as u32;

/// How a message redriven to one group only (`PROP_REDRIVEN_TO`) is marked
/// in its tag set: a tag of this prefix and the group's name. No client
/// tag can begin with a control character, so the mark never meets one,
/// and it makes the group's filter decision per set like any tag: every
/// other group's filter drops the message, never reading it.
pub const REDRIVEN_TO_PREFIX: &str = "\u{0}redriven-to:";

/// A tag's number within its topic's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TagId(pub u32);

/// A tag set's number within its topic's table: never 0, which the
/// per-block column uses for "no tags".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TagSetId(NonZeroU16);

impl TagSetId {
    /// The id stored in the column for `raw`, None for 0 (untagged).
    pub fn from_raw(raw: u16) -> Option<TagSetId> {
        NonZeroU16::new(raw).map(TagSetId)
    }
    /// What the column stores.
    pub fn raw(self) -> u16 {
        self.0.get()
    }
    /// An index from 0, for tables indexed by set (a group's cache).
    pub fn index(self) -> usize {
        usize::from(self.0.get()) - 1
    }
}

/// The table is full: a new tag set has no room (QUEUE_FULL at PRODUCE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TagsFull {
    /// The bound that was reached: sets in the table.
    pub max: u32,
}

/// One interned tag.
struct TagSlot {
    /// The tag; empty while the slot is free.
    name: Box<str>,
    /// Sets holding it; the slot is freed when the last goes.
    sets: u32,
}

/// One interned tag set.
struct SetSlot {
    /// Its tags' ids, sorted, without duplicates; empty while free.
    tags: Box<[TagId]>,
    /// Live messages holding it.
    messages: u64,
    /// In `unused` (listed once, however often its count touches 0).
    listed: bool,
}

/// A topic's interned tags and tag sets.
#[derive(Default)]
pub struct Tags {
    /// Tags by `TagId`.
    tags: Vec<TagSlot>,
    /// `TagId` by name.
    tag_ids: HashMap<Box<str>, TagId>,
    /// Free slots of `tags`.
    free_tags: Vec<TagId>,
    /// Sets by `TagSetId::index`.
    sets: Vec<SetSlot>,
    /// `TagSetId` by sorted tag ids.
    set_ids: HashMap<Box<[TagId]>, TagSetId>,
    /// Free slots of `sets`.
    free_sets: Vec<TagSetId>,
    /// Sets whose message count fell to 0 since the last reclaim: what a
    /// reclaim looks at (some may be held again by then).
    unused: Vec<TagSetId>,
    /// Sets in the table (held or not).
    len: u32,
    /// Sets some live message holds: what `tag_sets_per_topic_max` bounds.
    held: u32,
    /// Bumped by every reclaim that freed a set (ids may then be reused).
    epoch: u64,
    /// Scratch for a message's tag ids (no allocation per message).
    scratch: Vec<TagId>,
    /// Some set was marked for one group (`REDRIVEN_TO_PREFIX`): from then
    /// on groups without a filter decide per set too (until a restart).
    redriven: bool,
}

impl Tags {
    /// Tag sets in the table, held by messages or not.
    pub fn len(&self) -> u32 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Tag sets some live message holds.
    pub fn held(&self) -> u32 {
        self.held
    }
    /// Distinct tags in the table (of the sets it holds).
    pub fn distinct_tags(&self) -> usize {
        self.tag_ids.len()
    }
    /// Changes whenever a set id may have been given to another set.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    /// Whether some message was redriven to one group only (its groups
    /// must then decide every tagged message's set, filter or not).
    pub fn has_redriven(&self) -> bool {
        self.redriven
    }
    /// The group set `set` was redriven to, if it is so marked.
    pub fn redriven_to(&self, set: TagSetId) -> Option<&str> {
        if !self.redriven {
            return None;
        }
        self.names(set).find_map(|t| t.strip_prefix(REDRIVEN_TO_PREFIX))
    }
    /// The tags of set `set`, by id, sorted by id.
    pub fn tags_of(&self, set: TagSetId) -> &[TagId] {
        &self.sets[set.index()].tags
    }
    /// The name of tag `tag`.
    pub fn name(&self, tag: TagId) -> &str {
        &self.tags[tag.0 as usize].name
    }
    /// The names of set `set`'s tags (what a filter reads).
    pub fn names(&self, set: TagSetId) -> impl Iterator<Item = &str> + '_ {
        self.tags_of(set).iter().map(|&t| self.name(t))
    }
    /// Live messages holding set `set`.
    pub fn messages_of(&self, set: TagSetId) -> u64 {
        self.sets[set.index()].messages
    }

    /// The set of the tags `tags` yields (any order, duplicates allowed;
    /// called once or twice), with a reference taken for one message: None
    /// for no tags. A new set past `max` sets (after reclaiming the unheld
    /// ones) is refused.
    pub fn intern<'a, I: Iterator<Item = &'a str>>(
        &mut self,
        tags: impl Fn() -> I,
        max: u32,
    ) -> Result<Option<TagSetId>, TagsFull> {
        let mut ids = std::mem::take(&mut self.scratch);
        ids.clear();
        let known = self.known_ids(tags(), &mut ids);
        let found = if known { self.set_ids.get(&ids[..]).copied() } else { None };
        let result = match found {
            Some(set) => Ok(Some(set)),
            None if ids.is_empty() && known => Ok(None),
            None => self.new_set(tags(), &mut ids, max.min(TAG_SETS_MAX)).map(Some),
        };
        self.scratch = ids;
        if let Ok(Some(set)) = result {
            let slot = &mut self.sets[set.index()];
            slot.messages += 1;
            if slot.messages == 1 {
                self.held += 1;
            }
        }
        result
    }

    /// Collects the ids of `tags`, sorted and distinct, into `ids`; false
    /// if some tag is not in the table (then the set is new).
    fn known_ids<'a>(&self, tags: impl Iterator<Item = &'a str>, ids: &mut Vec<TagId>) -> bool {
        for tag in tags {
            match self.tag_ids.get(tag) {
                Some(&id) => ids.push(id),
                None => return false,
            }
        }
        ids.sort_unstable();
        ids.dedup();
        true
    }

    /// Adds the set of `tags`, interning the tags it brings, with no
    /// message holding it yet.
    fn new_set<'a>(
        &mut self,
        tags: impl Iterator<Item = &'a str>,
        ids: &mut Vec<TagId>,
        max: u32,
    ) -> Result<TagSetId, TagsFull> {
        if self.len >= max {
            self.reclaim();
            if self.len >= max {
                return Err(TagsFull { max });
            }
        }
        ids.clear();
        for tag in tags {
            self.redriven |= tag.starts_with(REDRIVEN_TO_PREFIX);
            let id = self.tag_id(tag);
            ids.push(id);
        }
        ids.sort_unstable();
        ids.dedup();
        for &t in ids.iter() {
            self.tags[t.0 as usize].sets += 1;
        }
        let key: Box<[TagId]> = ids.as_slice().into();
        let slot = SetSlot { tags: key.clone(), messages: 0, listed: false };
        let set = match self.free_sets.pop() {
            Some(set) => {
                self.sets[set.index()] = slot;
                set
            }
            None => {
                self.sets.push(slot);
                let raw = u16::try_from(self.sets.len()).unwrap_or(u16::MAX);
                TagSetId::from_raw(raw).unwrap_or_else(|| unreachable!("a pushed set has an index from 1"))
            }
        };
        self.set_ids.insert(key, set);
        self.len += 1;
        Ok(set)
    }

    /// The id of `tag`, interned if new (held by no set yet).
    fn tag_id(&mut self, tag: &str) -> TagId {
        if let Some(&id) = self.tag_ids.get(tag) {
            return id;
        }
        let slot = TagSlot { name: tag.into(), sets: 0 };
        let id = match self.free_tags.pop() {
            Some(id) => {
                self.tags[id.0 as usize] = slot;
                id
            }
            None => {
                self.tags.push(slot);
                TagId(self.tags.len() as u32 - 1)
            }
        };
        self.tag_ids.insert(tag.into(), id);
        id
    }

    /// A message holding set `set` left (or was never stored).
    pub fn release(&mut self, set: TagSetId) {
        let slot = &mut self.sets[set.index()];
        assert!(slot.messages > 0, "tag set {} released more often than taken", set.raw());
        slot.messages -= 1;
        if slot.messages > 0 {
            return;
        }
        self.held -= 1;
        if !slot.listed {
            slot.listed = true;
            self.unused.push(set);
        }
    }

    /// Frees every set no message holds, and the tags only they held.
    fn reclaim(&mut self) {
        let mut freed = false;
        for set in std::mem::take(&mut self.unused) {
            let slot = &mut self.sets[set.index()];
            slot.listed = false;
            if slot.messages > 0 {
                continue;
            }
            let tags = std::mem::take(&mut slot.tags);
            for &t in tags.iter() {
                let tag = &mut self.tags[t.0 as usize];
                tag.sets -= 1;
                if tag.sets == 0 {
                    self.tag_ids.remove(&tag.name);
                    tag.name = Box::default();
                    self.free_tags.push(t);
                }
            }
            self.set_ids.remove(&tags);
            self.free_sets.push(set);
            self.len -= 1;
            freed = true;
        }
        if freed {
            self.epoch += 1;
        }
    }

    /// Heap bytes held, about (for memory reporting).
    pub fn heap_bytes(&self) -> u64 {
        let names: usize = self.tags.iter().map(|t| 2 * t.name.len()).sum();
        let sets: usize = self.sets.iter().map(|s| 2 * 4 * s.tags.len()).sum();
        let slots = self.tags.capacity() * std::mem::size_of::<TagSlot>()
            + self.sets.capacity() * std::mem::size_of::<SetSlot>()
            // A hash map entry: the key's box and the id, with its control
            // byte; about.
            + (self.tag_ids.capacity() + self.set_ids.capacity()) * 25;
        (names + sets + slots) as u64
    }
}
