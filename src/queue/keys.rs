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

use std::collections::{HashMap, VecDeque};
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
    /// Each key's ids. The keys come from clients: the map keeps the
    /// standard library's randomly keyed hasher, so colliding keys cannot
    /// be chosen.
    by_key: HashMap<Arc<[u8]>, Ids>,
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
        KeyIndex { by_key: HashMap::new(), order: VecDeque::new(), per_key_max, entries_max }
    }

    /// Changes the bounds (the broker's limits, set after the topic is
    /// made); the next `insert` holds the index to them.
    pub fn set_bounds(&mut self, per_key_max: u32, entries_max: u32) {
        assert!(per_key_max >= 1 && entries_max >= 1, "key index bounds {per_key_max}, {entries_max}");
        self.per_key_max = per_key_max;
        self.entries_max = entries_max;
        self.trim();
        for ids in self.by_key.values_mut() {
            if let Ids::Many(v) = ids {
                v.drain(..v.len().saturating_sub(per_key_max as usize));
                if let [only] = v[..] {
                    *ids = Ids::One(only);
                }
            }
        }
    }

    /// Forgets the oldest entries past `entries_max`.
    fn trim(&mut self) {
        while self.order.len() > self.entries_max as usize {
            let Some((old, k)) = self.order.pop_front() else { break };
            self.forget(&k, old);
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
    /// Distinct keys held.
    pub fn keys(&self) -> usize {
        self.by_key.len()
    }

    /// Indexes message `id` under `key`. An id already there (recovery can
    /// meet a message twice) is not added again.
    pub fn insert(&mut self, key: &[u8], id: MsgId) {
        let key: Arc<[u8]> = match self.by_key.get_key_value(key) {
            Some((k, _)) => Arc::clone(k),
            None => Arc::from(key),
        };
        let ids = self.by_key.entry(Arc::clone(&key)).or_insert(Ids::Many(Vec::new()));
        if !add(ids, id, self.per_key_max as usize) {
            return;
        }
        self.order.push_back((id, key));
        self.trim();
    }

    /// Forgets message `id` under `key` (its produce was withdrawn).
    pub fn forget(&mut self, key: &[u8], id: MsgId) {
        let Some(ids) = self.by_key.get_mut(key) else { return };
        let empty = match ids {
            Ids::One(x) => *x == id,
            Ids::Many(v) => {
                v.retain(|x| *x != id);
                if v.len() == 1 {
                    *ids = Ids::One(v[0]);
                }
                matches!(ids, Ids::Many(v) if v.is_empty())
            }
        };
        if empty {
            self.by_key.remove(key);
        }
    }

    /// The ids indexed under `key`, newest first.
    pub fn lookup(&self, key: &[u8]) -> Vec<MsgId> {
        match self.by_key.get(key) {
            None => Vec::new(),
            Some(Ids::One(id)) => vec![*id],
            Some(Ids::Many(v)) => v.iter().rev().copied().collect(),
        }
    }
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
