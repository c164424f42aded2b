//! A topic's dedup window (protocol version 4): the dedup ids its
//! messages were produced with in the last `window_ms`, each with the id
//! of the message it first came with, so that a retried PRODUCE is
//! answered with the original ids instead of storing the batch twice (as
//! NATS JetStream's `Msg-Id` duplicate window, Redis's IDMP and SQS FIFO's
//! deduplication id do).
//!
//! Two structures, one entry each: a map from dedup id to its message, for
//! the lookup, and a queue of the same ids in produce order, for expiry.
//! Entries expire from the queue's front only, so a turn's expiry costs
//! the entries that expire and one look at the front, never a scan of
//! the window. The time is passed in, as everywhere in the queues (the
//! reactor owns the clock).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::MsgId;

/// One remembered dedup id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    /// The message it was first produced with.
    id: MsgId,
    /// When that message was produced: broker wall clock, ms since the
    /// Unix epoch.
    produced_ms: u64,
}

/// A topic's remembered dedup ids.
#[derive(Debug, Default)]
pub struct DedupWindow {
    /// Dedup id to its first message. The ids are the client's, so the map
    /// has the std hasher (keyed): a client cannot make them collide.
    map: HashMap<Arc<[u8]>, Entry>,
    /// The same ids, (produced ms, message id, dedup id), in the order they
    /// came: a later entry of an id replaces the map's only once the
    /// earlier expired, and its queue entry removes the map's only when the
    /// two still match.
    order: VecDeque<(u64, MsgId, Arc<[u8]>)>,
    /// Bytes of the dedup ids in `order`.
    id_bytes: usize,
}

impl DedupWindow {
    /// Entries held, expired ones not yet dropped included: what
    /// `dedup_entries_max` counts.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Bytes of the dedup ids held (what restating them writes besides
    /// their fixed fields).
    pub fn id_bytes(&self) -> usize {
        self.id_bytes
    }

    /// The message `dedup_id` was first produced with, if that was less
    /// than `window_ms` before `now_ms`.
    pub fn get(&self, dedup_id: &[u8], now_ms: u64, window_ms: u64) -> Option<MsgId> {
        let e = self.map.get(dedup_id)?;
        (e.produced_ms.saturating_add(window_ms) > now_ms).then_some(e.id)
    }

    /// Remembers that `dedup_id` came with message `id` at `produced_ms`.
    /// The caller looked it up first (`get` found nothing in the window):
    /// an older entry of the id is replaced.
    pub fn insert(&mut self, dedup_id: &[u8], id: MsgId, produced_ms: u64) {
        let key: Arc<[u8]> = Arc::from(dedup_id);
        self.map.insert(Arc::clone(&key), Entry { id, produced_ms });
        self.id_bytes += key.len();
        self.order.push_back((produced_ms, id, key));
    }

    /// Recovery met `dedup_id` on message `id`, produced at `produced_ms`,
    /// in whatever order the log holds its messages: the entry kept is the
    /// latest produce, and of copies produced at the same time (a redriven
    /// message keeps its born time and dedup id) the first, smallest id.
    /// Call `sort` once every message was met.
    pub fn restore(&mut self, dedup_id: &[u8], id: MsgId, produced_ms: u64) {
        if let Some(e) = self.map.get(dedup_id)
            && (e.produced_ms, std::cmp::Reverse(e.id)) >= (produced_ms, std::cmp::Reverse(id))
        {
            return;
        }
        let key: Arc<[u8]> = Arc::from(dedup_id);
        self.map.insert(Arc::clone(&key), Entry { id, produced_ms });
        self.id_bytes += key.len();
        self.order.push_back((produced_ms, id, key));
    }

    /// Puts the entries `restore` kept in produce order, the others gone,
    /// so that `expire` can take them from the front.
    pub fn sort(&mut self) {
        let mut live: Vec<(u64, MsgId, Arc<[u8]>)> =
            self.map.iter().map(|(key, e)| (e.produced_ms, e.id, Arc::clone(key))).collect();
        live.sort_unstable_by_key(|&(ms, id, _)| (ms, id));
        self.id_bytes = live.iter().map(|e| e.2.len()).sum();
        self.order = live.into();
    }

    /// Drops the entries produced `window_ms` or more before `now_ms`, from
    /// the front; returns how many entries went.
    pub fn expire(&mut self, now_ms: u64, window_ms: u64) -> usize {
        let mut n = 0;
        while let Some(&(produced_ms, _, _)) = self.order.front() {
            if produced_ms.saturating_add(window_ms) > now_ms {
                break;
            }
            self.pop_front();
            n += 1;
        }
        n
    }

    fn pop_front(&mut self) {
        if let Some((_, id, key)) = self.order.pop_front() {
            self.id_bytes -= key.len();
            self.forget(&key, id);
        }
    }

    /// Drops the map's entry of `key` if it is still message `id`'s.
    fn forget(&mut self, key: &[u8], id: MsgId) {
        if self.map.get(key).is_some_and(|e| e.id == id) {
            self.map.remove(key);
        }
    }

    /// Drops the entries of messages from `first_id` on, from the back
    /// (they came last): their produce was withdrawn. Returns how many.
    pub fn withdraw(&mut self, first_id: MsgId) -> usize {
        let mut n = 0;
        while self.order.back().is_some_and(|&(_, id, _)| id >= first_id) {
            if let Some((_, id, key)) = self.order.pop_back() {
                self.id_bytes -= key.len();
                self.forget(&key, id);
                n += 1;
            }
        }
        n
    }

    /// The live entries, (dedup id, message id, produced ms), oldest first:
    /// what a restatement writes. An id met twice is listed once.
    pub fn entries(&self) -> impl Iterator<Item = (&[u8], MsgId, u64)> + '_ {
        self.order
            .iter()
            .filter(|(_, id, key)| self.map.get(&**key).is_some_and(|e| e.id == *id))
            .map(|(ms, id, key)| (&**key, *id, *ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Rng;

    #[test]
    fn an_id_is_remembered_for_its_window_and_not_after() {
        let mut w = DedupWindow::default();
        w.insert(b"a", 7, 1000);
        assert_eq!(w.get(b"a", 1000, 100), Some(7));
        assert_eq!(w.get(b"a", 1099, 100), Some(7), "1 ms before the end");
        assert_eq!(w.get(b"a", 1100, 100), None, "the window is over");
        assert_eq!(w.expire(1099, 100), 0);
        assert_eq!(w.expire(1100, 100), 1);
        assert!(w.is_empty());
    }

    #[test]
    fn a_reproduced_id_after_expiry_gets_the_new_message() {
        let mut w = DedupWindow::default();
        w.insert(b"a", 1, 0);
        w.insert(b"a", 5, 200);
        assert_eq!(w.get(b"a", 200, 100), Some(5));
        assert_eq!(w.expire(150, 100), 1, "the old entry goes");
        assert_eq!(w.get(b"a", 200, 100), Some(5), "without taking the new one");
        assert_eq!(w.entries().count(), 1);
    }

    #[test]
    fn recovery_keeps_the_latest_produce_and_the_first_copy() {
        let mut w = DedupWindow::default();
        w.restore(b"a", 9, 200);
        w.restore(b"a", 1, 100);
        w.restore(b"b", 12, 50);
        w.restore(b"b", 4, 50);
        w.restore(b"b", 4, 50);
        w.sort();
        assert_eq!(w.get(b"a", 200, 1000), Some(9), "the later produce");
        assert_eq!(w.get(b"b", 200, 1000), Some(4), "the original of a redriven copy");
        assert_eq!(w.len(), 2);
        assert_eq!(w.expire(1050, 1000), 1, "b, produced first, expires first");
    }

    #[test]
    fn withdraw_drops_the_newest_entries() {
        let mut w = DedupWindow::default();
        w.insert(b"a", 1, 0);
        w.insert(b"b", 2, 0);
        w.insert(b"c", 3, 0);
        assert_eq!(w.withdraw(2), 2);
        assert_eq!(w.get(b"a", 0, 10), Some(1));
        assert_eq!(w.get(b"b", 0, 10), None);
    }

    #[test]
    fn the_window_matches_a_model() {
        for seed in crate::testkit::seeds(8) {
            println!("seed {seed}");
            window_against_model(seed);
        }
    }

    fn window_against_model(seed: u64) {
        let mut rng = Rng::new(seed);
        let mut w = DedupWindow::default();
        let mut model: HashMap<Vec<u8>, (MsgId, u64)> = HashMap::new();
        let (mut now, window, mut next_id) = (0u64, 50u64, 1u64);
        for _ in 0..5000 {
            now += rng.below(5);
            let key = vec![rng.below(40) as u8];
            let want = model.get(&key).filter(|(_, at)| at + window > now).map(|(id, _)| *id);
            assert_eq!(w.get(&key, now, window), want, "seed {seed}");
            if want.is_none() {
                w.insert(&key, next_id, now);
                model.insert(key, (next_id, now));
                next_id += 1;
            }
            w.expire(now, window);
            model.retain(|_, (_, at)| *at + window > now);
            assert_eq!(w.entries().count(), model.len(), "seed {seed}");
        }
    }
}
