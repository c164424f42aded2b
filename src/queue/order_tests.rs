//! Ordering by key against a model: random produces with a few keys (and
//! without), fetches by three consumers, ACKs, NACKs with and without a
//! delay, ack timeouts, disconnects and dead letters, from a printed seed
//! (`RUNNEL_SEED` replays one). For every key, a message is first
//! delivered only once the group is done with every earlier message of
//! its key (so the first deliveries that were acked come in produce
//! order), at most one message of a key is in flight at a time, messages
//! without a key are never held back, and in the end every message is
//! acked or dead-lettered: nothing waits forever behind its key. With
//! redrives, the same holds when REDRIVE naming the group moves ready
//! messages out of it (`Topic::drain_ready_where`, `Group::take_ahead`)
//! and brings redriven keyed messages back into it.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::codec::Props;
use crate::testkit::{Rng, SeedGuard, seeds};
use crate::wheel::{TimerKey, Wheel};

const G: GroupId = GroupId(1);
const KEYS: u64 = 4;
const MAX_DELIVERIES: u16 = 3;

/// The group's view of the wheel.
struct Timed<'a>(&'a mut Wheel<MsgId>);

impl Timers for Timed<'_> {
    fn arm(&mut self, deadline_ms: u64, id: MsgId) -> TimerKey {
        self.0.insert(deadline_ms, id)
    }
    fn disarm(&mut self, key: TimerKey) {
        self.0.cancel(key);
    }
}

/// A properties blob with one key entry (type 5).
fn key_blob(key: u64) -> Vec<u8> {
    let k = format!("key-{key}");
    let mut b = vec![5u8];
    b.extend_from_slice(&(k.len() as u16).to_le_bytes());
    b.extend_from_slice(k.as_bytes());
    b
}

struct Run {
    rng: Rng,
    t: Topic,
    wheel: Wheel<MsgId>,
    now_ms: u64,
    /// Each message's key (None: no key), by id.
    keys: BTreeMap<MsgId, Option<u64>>,
    /// Messages the group is done with (acked or dead-lettered).
    done: BTreeSet<MsgId>,
    /// Messages delivered at least once.
    delivered: BTreeSet<MsgId>,
    /// In flight, and to whom.
    inflight: BTreeMap<MsgId, ConsumerId>,
    /// Acked messages of each key, in the order of their first delivery.
    acked_by_first_delivery: BTreeMap<u64, Vec<(usize, MsgId)>>,
    /// The step of each message's first delivery.
    first_delivery: BTreeMap<MsgId, usize>,
    step: usize,
    op: String,
    /// Whether steps include REDRIVE's moves out of and into the group.
    redrives: bool,
}

impl Run {
    fn ctx(&self) -> String {
        format!("step {} ({})", self.step, self.op)
    }

    fn produce(&mut self) {
        let n = self.rng.range(1, 5);
        self.op = format!("produce {n}");
        for _ in 0..n {
            let key = (!self.rng.percent(20)).then(|| self.rng.below(KEYS));
            let blob = key.map(key_blob).unwrap_or_default();
            let body = Body { props: Props::trusted(&blob), tag_set: None, payload: b"m" };
            let (id, _) = self.t.produce(self.now_ms, body);
            self.keys.insert(id, key);
        }
        self.t.publish();
    }

    fn fetch(&mut self) {
        let owner = self.rng.range(1, 4);
        let max = self.rng.range(1, 6) as u32;
        self.op = format!("fetch owner {owner} max {max}");
        let take = Take { owner, max_messages: max, max_bytes: u64::MAX, deadline_ms: self.now_ms + 40 };
        let mut got = Vec::new();
        self.t.fetch(G, take, &mut Timed(&mut self.wheel), |_, d| got.push(d.id));
        for id in got {
            self.on_delivery(id, owner);
        }
    }

    fn on_delivery(&mut self, id: MsgId, owner: ConsumerId) {
        let ctx = self.ctx();
        assert!(!self.done.contains(&id), "{ctx}: delivered {id}, which the group is done with");
        assert!(self.inflight.insert(id, owner).is_none(), "{ctx}: {id} delivered while in flight");
        let Some(key) = self.keys[&id] else { return self.first(id) };
        for (&other, &k) in &self.keys {
            if other != id && k == Some(key) && self.inflight.contains_key(&other) {
                panic!("{ctx}: {id} and {other} of key {key} in flight at once");
            }
            if other < id && k == Some(key) && !self.done.contains(&other) {
                panic!("{ctx}: {id} of key {key} delivered before the group was done with {other}");
            }
        }
        self.first(id);
    }

    fn first(&mut self, id: MsgId) {
        if self.delivered.insert(id) {
            self.first_delivery.insert(id, self.step);
        }
    }

    fn pick_inflight(&mut self) -> Option<MsgId> {
        let v: Vec<MsgId> = self.inflight.keys().copied().collect();
        (!v.is_empty()).then(|| self.rng.pick(&v))
    }

    fn ack(&mut self) {
        let Some(id) = self.pick_inflight() else { return };
        self.op = format!("ack {id}");
        assert!(self.t.ack(G, id, &mut Timed(&mut self.wheel)), "{}: ack of a message in flight", self.ctx());
        self.inflight.remove(&id);
        self.done.insert(id);
        if let Some(key) = self.keys[&id] {
            self.acked_by_first_delivery.entry(key).or_default().push((self.first_delivery[&id], id));
        }
    }

    fn returned(&mut self, id: MsgId, r: Option<Returned>) {
        match r {
            Some(Returned::Dead(_)) => {
                self.t.dead_lettered(G, id);
                self.done.insert(id);
            }
            Some(Returned::Retry) => {}
            None => panic!("{}: {id} was not in flight", self.ctx()),
        }
    }

    fn nack(&mut self) {
        let Some(id) = self.pick_inflight() else { return };
        let delay = self.rng.percent(50).then_some(self.now_ms + 25);
        self.op = format!("nack {id} delay {delay:?}");
        let r = self.t.nack(G, id, delay, false, &mut Timed(&mut self.wheel));
        self.inflight.remove(&id);
        self.returned(id, r);
    }

    fn disconnect(&mut self) {
        let owner = self.rng.range(1, 4);
        self.op = format!("disconnect {owner}");
        let mut dead = Vec::new();
        self.t.disconnect(G, owner, &mut Timed(&mut self.wheel), |id, _| dead.push(id));
        self.inflight.retain(|_, o| *o != owner);
        for id in dead {
            self.t.dead_lettered(G, id);
            self.done.insert(id);
        }
    }

    fn advance(&mut self, by_ms: u64) {
        self.now_ms += by_ms;
        self.op = format!("advance to {}", self.now_ms);
        let mut fired = Vec::new();
        self.wheel.advance(self.now_ms, &mut fired);
        for (_, id) in fired {
            let r = self.t.timer_fired(G, id, &mut Timed(&mut self.wheel));
            self.inflight.remove(&id);
            self.returned(id, r);
        }
    }

    /// REDRIVE naming the group, as a dead-letter topic's group sees it:
    /// some of its ready messages (those with a random id remainder) move
    /// out, so the group is done with them; the others stay where they
    /// are, whatever their key.
    fn redrive_out(&mut self) {
        let (m, r) = (self.rng.range(2, 4), self.rng.below(4));
        let max = if self.rng.percent(50) { u64::MAX } else { self.rng.range(1, 4) };
        self.op = format!("redrive out ids = {r} mod {m}, max {max}");
        let mut moved = Vec::new();
        self.t.drain_ready_where(
            G,
            max,
            |x| x.id % m == r,
            |x, _| {
                moved.push(x.id);
                true
            },
        );
        for id in moved {
            let ctx = self.ctx();
            assert!(!self.inflight.contains_key(&id), "{ctx}: moved {id}, which is in flight");
            assert!(self.done.insert(id), "{ctx}: moved {id}, which the group was done with");
        }
    }

    /// REDRIVE naming the group, as its topic sees it: a dead letter of a
    /// random key comes back as a new message for this group alone, behind
    /// whatever of its key the group still has.
    fn redrive_in(&mut self) {
        let key = self.rng.below(KEYS);
        self.op = format!("redrive in key {key}");
        let mut blob = key_blob(key);
        crate::codec::props::put_broker_entry(&mut blob, crate::codec::props::PROP_REDRIVEN_TO, "ordered");
        let id =
            self.t.append_moved(self.now_ms, Body { props: Props::trusted(&blob), tag_set: None, payload: b"r" }, None);
        self.keys.insert(id, Some(key));
        self.t.publish();
    }

    fn step(&mut self) {
        match self.rng.below(100) {
            0..25 => self.produce(),
            25..55 => self.fetch(),
            55..75 => self.ack(),
            75..85 => self.nack(),
            85..89 => self.disconnect(),
            89..92 if self.redrives => self.redrive_out(),
            92..95 if self.redrives => self.redrive_in(),
            _ => {
                let by = self.rng.range(1, 30);
                self.advance(by);
            }
        }
    }

    /// Acks everything, firing timers as needed, until the group is done
    /// with every message.
    fn drain(&mut self) {
        self.op = "drain".into();
        for _ in 0..10_000 {
            if self.done.len() == self.keys.len() {
                return;
            }
            self.fetch();
            while let Some(&id) = self.inflight.keys().next() {
                self.op = format!("drain: ack {id}");
                assert!(self.t.ack(G, id, &mut Timed(&mut self.wheel)));
                self.inflight.remove(&id);
                self.done.insert(id);
                if let Some(key) = self.keys[&id] {
                    self.acked_by_first_delivery.entry(key).or_default().push((self.first_delivery[&id], id));
                }
            }
            self.advance(30);
        }
        let stuck: Vec<MsgId> = self.keys.keys().filter(|id| !self.done.contains(id)).copied().collect();
        panic!("{}: never delivered: {stuck:?}", self.ctx());
    }

    fn check_end(&mut self) {
        for (key, acked) in &self.acked_by_first_delivery {
            let mut by_delivery = acked.clone();
            by_delivery.sort();
            let ids: Vec<MsgId> = by_delivery.iter().map(|(_, id)| *id).collect();
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            assert_eq!(ids, sorted, "key {key}: acked messages by first delivery are not in produce order");
        }
        while self.t.sweeping() {
            self.t.sweep();
        }
        assert_eq!(self.t.seq.live(), 0, "the group is done with every message and the topic holds some");
        assert_eq!(self.t.group(G).map(|g| g.key_lines()), Some((0, 0)), "lines left");
    }
}

fn run(seed: u64, steps: usize, redrives: bool) {
    let _guard = SeedGuard { test: "ordered_by_key", seed, replay: "cargo test --release --lib ordered_by_key" };
    let settings = Settings { ack_timeout_ms: 40, max_deliveries: MAX_DELIVERIES, ..Settings::default() };
    let mut t = Topic::new("t", false, settings, 1);
    let g = t.add_group("ordered", GroupConfig { ordered: true, ..GroupConfig::default() }, 1);
    assert_eq!(g, G);
    let mut r = Run {
        rng: Rng::new(seed),
        t,
        wheel: Wheel::new(0),
        now_ms: 0,
        keys: BTreeMap::new(),
        done: BTreeSet::new(),
        delivered: BTreeSet::new(),
        inflight: BTreeMap::new(),
        acked_by_first_delivery: BTreeMap::new(),
        first_delivery: BTreeMap::new(),
        step: 0,
        op: "start".into(),
        redrives,
    };
    for step in 1..=steps {
        r.step = step;
        r.step();
    }
    r.drain();
    r.check_end();
}

#[test]
fn ordered_by_key_delivers_each_key_in_produce_order_one_at_a_time() {
    for seed in seeds(80) {
        run(seed, 500, false);
    }
}

/// REDRIVE naming an ordered group keeps the order: moving some of its
/// ready messages out steps its cursor past them and puts the ones passed
/// back for retry (`Group::take_ahead`), where their key still holds them
/// back; a redriven keyed message waits behind the message of its key the
/// group has in flight.
#[test]
fn ordered_by_key_holds_with_redrives_naming_the_group() {
    for seed in seeds(80) {
        run(seed, 500, true);
    }
}

/// Messages of different keys, and without a key, are not held back by a
/// key's message in flight; the next of a key comes once the group is done
/// with the one before (acked here), and a NACKed holder comes back before
/// the rest of its key.
#[test]
fn a_key_in_flight_holds_back_only_its_own_key() {
    let mut t = Topic::new("t", false, Settings { ack_timeout_ms: 40, max_deliveries: 5, ..Settings::default() }, 1);
    let g = t.add_group("o", GroupConfig { ordered: true, ..GroupConfig::default() }, 1);
    let mut wheel = Wheel::new(0);
    let blobs = [key_blob(1), key_blob(1), key_blob(2), Vec::new(), key_blob(1)];
    for b in &blobs {
        t.produce(0, Body { props: Props::trusted(b), tag_set: None, payload: b"m" });
    }
    t.publish();
    let fetch = |t: &mut Topic, wheel: &mut Wheel<MsgId>| {
        let mut got = Vec::new();
        let take = Take { owner: 1, max_messages: 10, max_bytes: u64::MAX, deadline_ms: 1_000 };
        t.fetch(g, take, &mut Timed(wheel), |_, d| got.push(d.id));
        got
    };
    assert_eq!(fetch(&mut t, &mut wheel), [1, 3, 4], "key 1's first, key 2's, the unkeyed one");
    assert_eq!(t.ready(g), 2, "2 and 5 wait behind 1");
    assert_eq!(t.nack(g, 1, None, false, &mut Timed(&mut wheel)), Some(Returned::Retry));
    assert_eq!(fetch(&mut t, &mut wheel), [1], "the NACKed holder again, not 2");
    assert!(t.ack(g, 1, &mut Timed(&mut wheel)));
    assert_eq!(fetch(&mut t, &mut wheel), [2]);
    assert!(t.ack(g, 2, &mut Timed(&mut wheel)));
    assert_eq!(fetch(&mut t, &mut wheel), [5]);
}
