//! `KeyIndex`: a topic's keyed messages by key, for LOOKUP (RocketMQ's
//! IndexFile answers the same question from disk). Only keyed messages
//! cost memory: a topic whose messages carry no key has an empty index.
//!
//! The index is a cache of the log, not a part of the queue: it is fed by
//! every message the topic stores (a produce, a move, recovery's replay of
//! the log), keeps at most `per_key_max` ids per key (the newest) and at
//! most `entries_max` entries in all, forgetting the oldest first, and it
//! keeps an id after its message has left the topic (LOOKUP then says the
//! message is no longer held). A restart rebuilds it from the messages the
//! log still has.
//!
//! Each key is stored once, shared by its map entry and its entries in the
//! age order (`Arc`: the broker is one thread, but its state moves to that thread), so that forgetting the oldest entry finds its key
//! without a search.
//!
//! The map is split into shards of at most about `SHARD_ENTRIES` keys,
//! chosen by a hash of the key: a hash table grows, and rehashes away the
//! tombstones its removals leave, in one call that moves every entry, and
//! one table of a million keys took half a second of the loop to do it.
//! A shard's costs a thousandth of that.

use std::collections::hash_map::{Entry, RandomState};
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;

use super::MsgId;

/// The ids indexed under one key, oldest first: most keys name one
/// message (an order id, a trace id), so one id is kept inline.
#[derive(Debug)]
enum Ids {
    One(MsgId),
    /// Two or more, ascending, at most `per_key_max`.
    Many(Vec<MsgId>),
}

/// A topic's key index.
#[derive(Debug)]
pub struct KeyIndex {
    /// Each key's ids, in `shard_count(entries_max)` shards (none until
    /// the first key comes). The keys come from clients: the shards keep
    /// the standard library's randomly keyed hasher, so colliding keys
    /// cannot be chosen.
    shards: Vec<HashMap<Arc<[u8]>, Ids>>,
    /// Picks a key's shard: keyed at random too, and apart from the
    /// shards' own hasher, so that the keys of one shard do not share the
    /// bits its table places them by.
    sharder: RandomState,
    /// The shard `grow_ahead` looks at next.
    grow_at: usize,
    /// Inserts since `grow_ahead` last grew a shard.
    grow_credit: usize,
    /// Every entry in the order it was indexed, oldest first, with its
    /// key; an entry its key's list dropped already (past `per_key_max`,
    /// or withdrawn) stays until it reaches the front.
    order: VecDeque<(MsgId, Arc<[u8]>)>,
    /// Most ids kept per key (`lookup_results_max`).
    per_key_max: u32,
    /// Most entries of `order` (`key_index_entries_per_topic_max`).
    entries_max: u32,
}

impl Default for KeyIndex {
    /// An empty index with the default limits' bounds.
    fn default() -> KeyIndex {
        let l = crate::limits::Limits::default();
        KeyIndex::new(l.lookup_results_max, l.key_index_entries_per_topic_max)
    }
}

impl KeyIndex {
    /// An empty index with its bounds (each at least 1).
    pub fn new(per_key_max: u32, entries_max: u32) -> KeyIndex {
        assert!(per_key_max >= 1 && entries_max >= 1, "key index bounds {per_key_max}, {entries_max}");
        KeyIndex {
            shards: Vec::new(),
            sharder: RandomState::new(),
            grow_at: 0,
            grow_credit: 0,
            order: VecDeque::new(),
            per_key_max,
            entries_max,
        }
    }

    /// The shard of `key` (there must be shards).
    fn shard(&self, key: &[u8]) -> usize {
        (self.sharder.hash_one(key) as usize) & (self.shards.len() - 1)
    }

    /// The map entry of `key`, if it has one.
    fn ids_mut(&mut self, key: &[u8]) -> Option<&mut Ids> {
        if self.shards.is_empty() {
            return None;
        }
        let s = self.shard(key);
        self.shards[s].get_mut(key)
    }

    /// Changes the bounds (the broker's limits, set after the topic is
    /// made); the next `insert` holds the index to them.
    pub fn set_bounds(&mut self, per_key_max: u32, entries_max: u32) {
        assert!(per_key_max >= 1 && entries_max >= 1, "key index bounds {per_key_max}, {entries_max}");
        self.per_key_max = per_key_max;
        self.entries_max = entries_max;
        self.trim();
        if !self.shards.is_empty() && self.shards.len() != shard_count(entries_max) {
            self.reshard();
        }
        for ids in self.shards.iter_mut().flat_map(|m| m.values_mut()) {
            if let Ids::Many(v) = ids {
                v.drain(..v.len().saturating_sub(per_key_max as usize));
                if let [only] = v[..] {
                    *ids = Ids::One(only);
                }
            }
        }
    }

    /// Spreads the keys over the shards `entries_max` asks for (the bounds
    /// changed: at start, before the broker serves).
    fn reshard(&mut self) {
        let old = std::mem::take(&mut self.shards);
        let state = old.first().map(|m| m.hasher().clone()).unwrap_or_default();
        self.shards = (0..shard_count(self.entries_max)).map(|_| HashMap::with_hasher(state.clone())).collect();
        for (k, ids) in old.into_iter().flatten() {
            let s = self.shard(&k);
            self.shards[s].insert(k, ids);
        }
    }

    /// Forgets the oldest entries past `entries_max`: each with one lookup
    /// of its key, which the entry holds.
    fn trim(&mut self) {
        while self.order.len() > self.entries_max as usize {
            let Some((old, k)) = self.order.pop_front() else { break };
            let s = self.shard(&k);
            if let Entry::Occupied(mut e) = self.shards[s].entry(k)
                && drop_id(e.get_mut(), old)
            {
                e.remove();
            }
        }
    }

    /// Entries held (keyed messages remembered, and stale ones not yet
    /// at the front).
    pub fn len(&self) -> usize {
        self.order.len()
    }
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
    /// Keys the largest of the tables holds: what one growth or rehash
    /// of a table moves at most.
    #[cfg(test)]
    fn largest_table_keys(&self) -> usize {
        self.shards.iter().map(HashMap::len).max().unwrap_or(0)
    }

    /// Distinct keys held.
    pub fn keys(&self) -> usize {
        self.shards.iter().map(HashMap::len).sum()
    }

    /// Indexes message `id` under `key`. An id already there (recovery can
    /// meet a message twice) is not added again.
    pub fn insert(&mut self, key: &[u8], id: MsgId) {
        if self.shards.is_empty() {
            let state = RandomState::new();
            self.shards = (0..shard_count(self.entries_max)).map(|_| HashMap::with_hasher(state.clone())).collect();
        }
        let s = self.shard(key);
        // One lookup: a key seen before costs an allocation given back at
        // once, which is cheaper than a second lookup for every new key.
        let (key, ids) = match self.shards[s].entry(Arc::from(key)) {
            Entry::Occupied(e) => (Arc::clone(e.key()), e.into_mut()),
            Entry::Vacant(e) => {
                let key = Arc::clone(e.key());
                (key, e.insert(Ids::Many(Vec::new())))
            }
        };
        if !add(ids, id, self.per_key_max as usize) {
            return;
        }
        self.order.push_back((id, key));
        self.trim();
        self.grow_ahead();
    }

    /// Grows a shard ahead of its need, one at a time. The keys spread
    /// evenly, so the shards fill at one pace: left to grow when full (at
    /// seven eighths), they would all grow within a few inserts, every key
    /// moved at once as by one table. So a shard the next in turn that is
    /// five eighths full is grown now, if there have been an eighth of its
    /// capacity in inserts since the last shard grew: all of them grow one
    /// by one, in half the inserts they take to fill to seven eighths.
    fn grow_ahead(&mut self) {
        self.grow_credit = self.grow_credit.saturating_add(1);
        self.grow_at = (self.grow_at + 1) % self.shards.len();
        let shard = &mut self.shards[self.grow_at];
        let capacity = shard.capacity();
        if shard.len() >= capacity / 8 * 5 && self.grow_credit >= capacity / 8 {
            self.grow_credit = 0;
            shard.reserve(capacity - shard.len() + 1);
        }
    }

    /// Forgets message `id` under `key` (its produce was withdrawn).
    pub fn forget(&mut self, key: &[u8], id: MsgId) {
        let Some(ids) = self.ids_mut(key) else { return };
        if drop_id(ids, id) {
            let s = self.shard(key);
            self.shards[s].remove(key);
        }
    }

    /// The ids indexed under `key`, newest first.
    pub fn lookup(&self, key: &[u8]) -> Vec<MsgId> {
        let ids = if self.shards.is_empty() { None } else { self.shards[self.shard(key)].get(key) };
        match ids {
            None => Vec::new(),
            Some(Ids::One(id)) => vec![*id],
            Some(Ids::Many(v)) => v.iter().rev().copied().collect(),
        }
    }
}

/// Drops `id` from a key's ids; true if none is left (the key goes).
fn drop_id(ids: &mut Ids, id: MsgId) -> bool {
    match ids {
        Ids::One(x) => *x == id,
        Ids::Many(v) => {
            v.retain(|x| *x != id);
            if v.len() == 1 {
                *ids = Ids::One(v[0]);
            }
            matches!(ids, Ids::Many(v) if v.is_empty())
        }
    }
}

/// Keys a shard holds at most, about (the keys spread at random).
const SHARD_ENTRIES: usize = 8192;

/// Shards for an index of `entries_max` entries: a power of two, so that a
/// hash picks one with a mask.
fn shard_count(entries_max: u32) -> usize {
    (entries_max as usize).div_ceil(SHARD_ENTRIES).next_power_of_two()
}

/// Adds `id` to a key's ids in order, dropping the oldest past `max`.
/// False if it was there already.
fn add(ids: &mut Ids, id: MsgId, max: usize) -> bool {
    let v = match ids {
        Ids::Many(v) if v.is_empty() => {
            *ids = Ids::One(id);
            return true;
        }
        Ids::One(x) if *x == id => return false,
        Ids::One(x) => {
            *ids = Ids::Many(vec![*x]);
            let Ids::Many(v) = ids else { unreachable!("just set") };
            v
        }
        Ids::Many(v) => v,
    };
    let Err(at) = v.binary_search(&id) else { return false };
    v.insert(at, id);
    if v.len() > max {
        v.remove(0);
    }
    if let [only] = v[..] {
        *ids = Ids::One(only);
    }
    true
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::testkit::{Rng, SeedGuard, seeds};

    #[test]
    fn newest_first_bounded_per_key_and_in_all() {
        let mut ix = KeyIndex::new(3, 6);
        for id in 1..=5 {
            ix.insert(b"a", id);
        }
        assert_eq!(ix.lookup(b"a"), [5, 4, 3], "per_key_max keeps the newest");
        ix.insert(b"b", 6);
        ix.insert(b"b", 6);
        assert_eq!(ix.lookup(b"b"), [6], "an id is indexed once");
        ix.insert(b"c", 7);
        assert_eq!(ix.lookup(b"a"), [5, 4, 3], "entries a key dropped count until they leave");
        ix.insert(b"c", 8);
        ix.insert(b"c", 9);
        assert_eq!(ix.lookup(b"a"), [5, 4], "past entries_max the oldest go");
        ix.forget(b"b", 6);
        assert_eq!((ix.lookup(b"b"), ix.keys()), (vec![], 2));
        assert!(ix.lookup(b"zz").is_empty());
    }

    /// A million keys, past the bound, with some forgotten: no table holds
    /// more than a shard's share (twice `SHARD_ENTRIES`, for the spread of
    /// a random hash), so that no insert grows or rehashes more than that;
    /// and every key still held is found.
    #[test]
    fn no_table_holds_more_than_a_shard_of_the_keys() {
        let entries_max = 1_000_000u32;
        let mut ix = KeyIndex::new(4, entries_max);
        let key = |i: u64| format!("order-{i:012}");
        for id in 0..1_100_000u64 {
            ix.insert(key(id).as_bytes(), id);
            if id % 7 == 0 {
                ix.forget(key(id).as_bytes(), id);
            }
        }
        assert!(ix.keys() > 800_000, "{} keys", ix.keys());
        assert!(ix.largest_table_keys() <= 2 * SHARD_ENTRIES, "a table of {} keys", ix.largest_table_keys());
        for id in [100_001u64, 555_556, 1_099_999] {
            assert_eq!(ix.lookup(key(id).as_bytes()), [id], "key {id}");
        }
        assert!(ix.lookup(key(7).as_bytes()).is_empty(), "forgotten, and past the bound");
        // New bounds spread the keys again.
        ix.set_bounds(4, 100_000);
        assert!(ix.keys() <= 100_000 && ix.largest_table_keys() <= 2 * SHARD_ENTRIES);
        assert_eq!(ix.lookup(key(1_099_999).as_bytes()), [1_099_999]);
    }

    /// The shards fill at one pace; they must not all grow at once. Over
    /// any run of inserts a PRODUCE can carry (`batch_messages_max`,
    /// 8192), the keys moved by tables growing stay within a few shards'
    /// worth, where growing all of them together would move every key.
    #[test]
    fn the_shards_grow_one_by_one() {
        const BATCH: usize = 8192;
        let mut ix = KeyIndex::new(4, 1_000_000);
        let mut capacities: Vec<usize> = Vec::new();
        let (mut moved, mut moved_max) = (0usize, 0usize);
        for id in 0..1_000_000u64 {
            ix.insert(format!("k-{id:012}").as_bytes(), id);
            if capacities.len() != ix.shards.len() {
                capacities = ix.shards.iter().map(HashMap::capacity).collect();
            }
            for (c, m) in capacities.iter_mut().zip(&ix.shards) {
                if m.capacity() != *c {
                    *c = m.capacity();
                    moved += m.len();
                }
            }
            if (id as usize + 1).is_multiple_of(BATCH) {
                moved_max = moved_max.max(moved);
                moved = 0;
            }
        }
        assert!(moved_max <= 8 * SHARD_ENTRIES, "{moved_max} keys moved by growth within {BATCH} inserts");
    }

    /// Against a model: every entry in indexing order, the last
    /// `entries_max` of them kept, and per key the newest `per_key_max`.
    #[test]
    fn matches_a_model_of_its_bounds() {
        for seed in seeds(20) {
            let _g = SeedGuard { test: "key index", seed, replay: "cargo test --release --lib key_index" };
            let mut rng = Rng::new(seed);
            let (per_key, entries) = (1 + rng.below(4u64) as u32, 1 + rng.below(12u64) as u32);
            let mut ix = KeyIndex::new(per_key, entries);
            let mut all: Vec<(MsgId, u8)> = Vec::new();
            for id in 1..200u64 {
                let key = rng.below(5u64) as u8;
                ix.insert(&[key], id);
                all.push((id, key));
                let window = &all[all.len().saturating_sub(entries as usize)..];
                let mut want: BTreeMap<u8, Vec<MsgId>> = BTreeMap::new();
                for &(i, k) in all.iter().rev() {
                    let v = want.entry(k).or_default();
                    if v.len() < per_key as usize && window.contains(&(i, k)) {
                        v.push(i);
                    }
                }
                for k in 0..5u8 {
                    let mut w = want.get(&k).cloned().unwrap_or_default();
                    // A key's newest `per_key` ids, of those still in the window.
                    let newest: Vec<MsgId> =
                        all.iter().rev().filter(|e| e.1 == k).take(per_key as usize).map(|e| e.0).collect();
                    w.retain(|i| newest.contains(i));
                    assert_eq!(ix.lookup(&[k]), w, "key {k} after id {id}");
                }
            }
        }
    }
}
