//! `KeyOrder`: a group's ordering by key (the group option "ordered by
//! key", RocketMQ's orderly consumption, seed 004's sharding key). Messages
//! with the same key go to the group's consumers one at a time, in the
//! order they become ready; messages of different keys, and messages
//! without a key, go as the group's other messages do.
//!
//! Each key with a message outstanding in the group (in flight, back for
//! retry, or delayed) has a **line**: its holder, the one message of the
//! key the group may deliver, and the ready messages of the key that wait
//! behind it, in id order. When the group is done with the holder (acked,
//! dead-lettered), the next in line becomes the holder and ready. A
//! redelivery, a NACK delay or a retry wait of the holder keeps the line
//! waiting: it holds back its own key and no other.
//!
//! A key is kept as a 64-bit hash, keyed per process (SipHash with a random
//! key, as `std`'s maps use), so a client cannot choose keys that collide:
//! two keys that did would share one line, still in order, only less
//! parallel. Memory: one line per key with a message outstanding (bounded
//! by the group's in-flight, retry and delayed messages) and 16 bytes per
//! message waiting behind a holder (bounded by the topic's limits). The
//! lines are not logged: a restart gives every message the group still
//! needs back to it in id order, and the lines form again as they are
//! delivered.

use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use super::seq::Seq;
use super::{FastMap, IdMap, MsgId};

/// One key's line.
#[derive(Debug)]
struct Line {
    /// The one message of the key the group may deliver now.
    holder: MsgId,
    /// Ready messages of the key behind the holder, in the order they
    /// became ready, with their deliveries so far.
    waiting: VecDeque<(MsgId, u16)>,
}

/// What the group does with a ready message of an ordered group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Deliver it: it has no key, its key has no line, or it holds it.
    Go,
    /// Hold it back behind its key's holder.
    Wait(u64),
}

/// A group's lines by key (empty for a group not ordered by key).
#[derive(Default)]
pub struct KeyOrder {
    /// Each key's line, by the key's hash.
    lines: FastMap<u64, Line>,
    /// The key of each holder (to end its line when the group is done
    /// with it, without reading the message again).
    holders: IdMap<u64>,
    /// The key of each message waiting in a line.
    waiting: IdMap<u64>,
    /// The per-process key of the hash.
    hasher: RandomState,
}

impl KeyOrder {
    /// The hash of message `id`'s key, if it has one.
    fn key_of(&self, seq: &Seq, id: MsgId) -> Option<u64> {
        let m = seq.get(id)?;
        if m.props.is_empty() {
            return None;
        }
        Some(self.hasher.hash_one(m.props.key()?))
    }

    /// Whether ready message `id` may be delivered now.
    pub fn admit(&self, seq: &Seq, id: MsgId) -> Admit {
        let Some(key) = self.key_of(seq, id) else { return Admit::Go };
        match self.lines.get(&key) {
            Some(line) if line.holder != id => Admit::Wait(key),
            _ => Admit::Go,
        }
    }

    /// Message `id` (admitted) was delivered: it holds its key's line.
    pub fn delivered(&mut self, seq: &Seq, id: MsgId) {
        if self.holders.contains_key(&id) {
            return;
        }
        let Some(key) = self.key_of(seq, id) else { return };
        self.lines.entry(key).or_insert_with(|| Line { holder: id, waiting: VecDeque::new() });
        self.holders.insert(id, key);
    }

    /// Ready message `id`, with `deliveries` so far, waits behind the
    /// holder of `key` (`Admit::Wait`).
    pub fn hold(&mut self, id: MsgId, deliveries: u16, key: u64) {
        if let Some(line) = self.lines.get_mut(&key) {
            line.waiting.push_back((id, deliveries));
            self.waiting.insert(id, key);
        }
    }

    /// The group is done with message `id`. If it held its key's line, the
    /// next in line (if any) holds it now and is returned with its
    /// deliveries so far, to be made ready.
    pub fn done(&mut self, id: MsgId) -> Option<(MsgId, u16)> {
        let key = self.holders.remove(&id)?;
        let line = self.lines.get_mut(&key)?;
        match line.waiting.pop_front() {
            Some((next, deliveries)) => {
                line.holder = next;
                self.waiting.remove(&next);
                self.holders.insert(next, key);
                Some((next, deliveries))
            }
            None => {
                self.lines.remove(&key);
                None
            }
        }
    }

    /// Whether message `id` waits in a line (the group still needs it).
    pub fn holds_back(&self, id: MsgId) -> bool {
        !self.waiting.is_empty() && self.waiting.contains_key(&id)
    }

    /// The deliveries so far of a message waiting in a line.
    pub fn waiting_deliveries(&self, id: MsgId) -> Option<u16> {
        let key = self.waiting.get(&id)?;
        self.lines.get(key)?.waiting.iter().find(|(w, _)| *w == id).map(|(_, d)| *d)
    }

    /// Every message waiting in a line, with its deliveries so far.
    pub fn waiting(&self) -> impl Iterator<Item = (MsgId, u16)> + '_ {
        self.lines.values().flat_map(|line| line.waiting.iter().copied())
    }

    /// Messages waiting in lines.
    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// Keys with a line.
    pub fn lines(&self) -> usize {
        self.lines.len()
    }
}
