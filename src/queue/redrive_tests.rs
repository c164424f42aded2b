//! `Topic::drain_ready_where` (REDRIVE naming a group) against a plain
//! model: it moves the picked ready messages, those back for retry first in
//! their order, then the rest in id order, up to its maximum, and leaves
//! every other ready message ready, delivered next in the order a plain
//! FETCH would have: what was back for retry first, then by id. Random
//! operations from a printed seed (`RUNNEL_SEED` replays one).

use super::*;
use crate::codec::props::{PROP_ORIGIN_GROUP, put_broker_entry};
use crate::testkit::{Rng, SeedGuard, seeds};
use crate::wheel::{TimerKey, Wheel};

/// Timers on a wheel nobody advances: nothing expires in this test.
struct Still(Wheel<MsgId>);

impl Timers for Still {
    fn arm(&mut self, deadline_ms: u64, id: MsgId) -> TimerKey {
        self.0.insert(deadline_ms, id)
    }
    fn disarm(&mut self, key: TimerKey) {
        self.0.cancel(key);
    }
}

/// A dead letter's properties naming `group` as its origin.
fn origin(group: &str) -> Vec<u8> {
    let mut props = Vec::new();
    put_broker_entry(&mut props, PROP_ORIGIN_GROUP, group);
    props
}

#[test]
fn a_redrive_naming_a_group_moves_its_ready_messages_and_keeps_the_others_order() {
    for seed in seeds(64) {
        let _g = SeedGuard {
            test: "a_redrive_naming_a_group_moves_its_ready_messages_and_keeps_the_others_order",
            seed,
            replay: "cargo test --release --lib redrive_tests",
        };
        let mut rng = Rng::new(seed);
        let mut t = Topic::new("t.dlq", true, Settings::default(), 1);
        let g = t.add_group("", GroupConfig::default(), 0);
        let (a, b) = (origin("a"), origin("b"));
        let mut of_a = std::collections::BTreeSet::new();
        for _ in 0..1 + rng.below(40u64) {
            let is_a = rng.percent(50);
            let props = crate::codec::Props::trusted(if is_a { &a } else { &b });
            let (id, _) = t.produce(1, Body { props, tag_set: None, payload: b"x" });
            if is_a {
                of_a.insert(id);
            }
        }
        t.publish();
        // Some delivered: some back for retry (in a random order), some
        // left in flight.
        let mut timers = Still(Wheel::new(0));
        let take = Take { owner: 1, max_messages: rng.below(30u32), max_bytes: u64::MAX, deadline_ms: 1 << 40 };
        let mut got = Vec::new();
        t.fetch(g, take, &mut timers, |_, d| got.push(d.id));
        let mut retry = Vec::new();
        while !got.is_empty() {
            let id = got.swap_remove(rng.below(got.len() as u64) as usize);
            if rng.percent(70) {
                t.nack(g, id, None, false, &mut timers).expect("in flight");
                retry.push(id);
            }
        }
        // `got` stays in flight. Never delivered: from the cursor on.
        let cursor = t.group(g).map_or(0, |x| x.cursor());
        let fresh: Vec<MsgId> = (cursor.max(1)..t.seq.next_id()).collect();
        let order: Vec<MsgId> = retry.iter().chain(fresh.iter()).copied().collect();
        let max = if rng.percent(50) { u64::MAX } else { rng.below(10u64) };
        let want_moved: Vec<MsgId> = order.iter().copied().filter(|id| of_a.contains(id)).take(max as usize).collect();
        let mut moved = Vec::new();
        let pick = |m: &Stored<'_>| m.props.broker_entry(PROP_ORIGIN_GROUP) == Some("a");
        let n = t.drain_ready_where(g, max, pick, |m, _| {
            moved.push(m.id);
            true
        });
        assert_eq!((n as usize, &moved), (want_moved.len(), &want_moved), "seed {seed}: moved");
        let mut rest = Vec::new();
        let all = Take { owner: 2, max_messages: u32::MAX, max_bytes: u64::MAX, deadline_ms: 1 << 40 };
        t.fetch(g, all, &mut timers, |_, d| rest.push(d.id));
        let (mut old_retry, mut others): (Vec<MsgId>, Vec<MsgId>) =
            order.iter().copied().filter(|id| !moved.contains(id)).partition(|id| retry.contains(id));
        others.sort_unstable();
        old_retry.extend(others);
        assert_eq!(rest, old_retry, "seed {seed}: the others, in order");
        for id in &moved {
            assert!(!t.seq.contains(*id), "seed {seed}: {id} left once moved (no other group)");
        }
    }
}
