//! `Schedule`: a topic's scheduled messages — produced with a delivery time
//! still to come, and until then delivered to no group — ordered by that
//! time (beanstalkd keeps its delayed jobs in a heap the same way).
//!
//! Two indexes, both O(log n) or O(1) per message, and nothing per turn
//! that grows with their number: by due time (a `BTreeSet` of (due, id),
//! whose first entry the broker's wheel holds one timer for), and by id (a
//! hash map, which a group's cursor asks, per message it steps on, whether
//! the message is scheduled). About 60 bytes per scheduled message on top
//! of the message itself (`schedule_memory` measures it). Times are
//! wall-clock ms since the Unix epoch, passed in: nothing here reads a
//! clock.

use std::collections::BTreeSet;

use super::{IdMap, MsgId};

/// The scheduled messages of one topic.
#[derive(Default)]
pub struct Schedule {
    /// (due time ms, id), in due order.
    by_due: BTreeSet<(u64, MsgId)>,
    /// Id to due time, ms.
    by_id: IdMap<u64>,
}

impl Schedule {
    /// Scheduled messages.
    pub fn len(&self) -> u64 {
        self.by_id.len() as u64
    }
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Whether message `id` is scheduled.
    #[inline]
    pub fn contains(&self, id: MsgId) -> bool {
        !self.by_id.is_empty() && self.by_id.contains_key(&id)
    }

    /// The time message `id` is due, if it is scheduled.
    pub fn due_ms(&self, id: MsgId) -> Option<u64> {
        self.by_id.get(&id).copied()
    }

    /// The earliest due time, if any message is scheduled.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.by_due.first().map(|e| e.0)
    }

    /// Schedules `id` at `due_ms`, or moves it there.
    pub fn insert(&mut self, id: MsgId, due_ms: u64) {
        if let Some(old) = self.by_id.insert(id, due_ms) {
            self.by_due.remove(&(old, id));
        }
        self.by_due.insert((due_ms, id));
    }

    /// Unschedules `id`; returns the time it was due.
    pub fn remove(&mut self, id: MsgId) -> Option<u64> {
        if self.by_id.is_empty() {
            return None;
        }
        let due = self.by_id.remove(&id)?;
        self.by_due.remove(&(due, id));
        Some(due)
    }

    /// Takes the first message due at or before `now_ms`, if any.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<(u64, MsgId)> {
        let &(due, id) = self.by_due.first().filter(|e| e.0 <= now_ms)?;
        self.by_due.remove(&(due, id));
        self.by_id.remove(&id);
        Some((due, id))
    }

    /// Scheduled messages with ids in `from..until` (STATS: a walk of
    /// every scheduled message, not for every request).
    pub fn count_in(&self, from: MsgId, until: MsgId) -> u64 {
        self.by_id.keys().filter(|&&id| from <= id && id < until).count() as u64
    }

    /// Every scheduled message, (id, due ms), in no order.
    pub fn iter(&self) -> impl Iterator<Item = (MsgId, u64)> + '_ {
        self.by_id.iter().map(|(id, due)| (*id, *due))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{Rng, SeedGuard, seeds};

    #[test]
    fn messages_come_due_in_time_order_and_moved_or_removed_ones_do_not() {
        let mut s = Schedule::default();
        s.insert(1, 30);
        s.insert(2, 10);
        s.insert(3, 10);
        s.insert(4, 20);
        s.insert(4, 40);
        assert_eq!(s.remove(1), Some(30));
        assert_eq!(s.remove(1), None);
        assert_eq!((s.len(), s.next_due_ms(), s.due_ms(4)), (3, Some(10), Some(40)));
        assert_eq!(s.pop_due(9), None, "nothing due before 10");
        assert_eq!(s.pop_due(10), Some((10, 2)));
        assert_eq!(s.pop_due(10), Some((10, 3)));
        assert_eq!(s.pop_due(39), None, "4 moved to 40");
        assert_eq!((s.count_in(4, 5), s.count_in(0, 4), s.count_in(5, u64::MAX)), (1, 0, 0));
        assert_eq!(s.pop_due(u64::MAX), Some((40, 4)));
        assert!(s.is_empty() && !s.contains(4));
    }

    #[test]
    fn against_a_model() {
        for seed in seeds(8) {
            let _guard = SeedGuard { test: "schedule::against_a_model", seed, replay: "cargo test --lib schedule" };
            run_model(Rng::new(seed));
        }
    }

    fn run_model(mut rng: Rng) {
        let mut s = Schedule::default();
        let mut model: std::collections::BTreeMap<MsgId, u64> = Default::default();
        let mut now = 0;
        for _ in 0..20_000 {
            let id: MsgId = rng.below(200);
            match rng.below(4) {
                0 | 1 => {
                    let due = now + rng.below(100u64);
                    s.insert(id, due);
                    model.insert(id, due);
                }
                2 => assert_eq!(s.remove(id), model.remove(&id)),
                _ => {
                    now += rng.below(10u64);
                    while let Some((due, id)) = s.pop_due(now) {
                        assert_eq!(model.remove(&id), Some(due), "{id} came due at {due}");
                        assert!(due <= now);
                    }
                    assert!(model.values().all(|&d| d > now), "every message due by {now} came");
                }
            }
            assert_eq!(s.len(), model.len() as u64);
        }
    }
}
