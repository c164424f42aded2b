//! Many consumer groups on one topic, against a plain model: each group
//! owes itself every message from its start on (unless its filter drops
//! it) until it acks it, and a message stays in the sequence exactly as
//! long as some group owes it (or while the topic has no group at all).
//! Random operations from a printed seed (`RUNNEL_SEED` replays one).

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::codec::group::Start;
use crate::filter::Filter;
use crate::testkit::{Rng, SeedGuard, seeds};
use crate::wheel::{TimerKey, Wheel};

/// Most groups the test keeps at once.
const GROUPS_MAX: usize = 5;

/// One group's view of a wheel shared by every group (`inspect_tests`
/// uses it too).
pub(super) struct Timed<'a> {
    pub(super) wheel: &'a mut Wheel<(GroupId, MsgId)>,
    pub(super) group: GroupId,
}

impl Timers for Timed<'_> {
    fn arm(&mut self, deadline_ms: u64, id: MsgId) -> TimerKey {
        self.wheel.insert(deadline_ms, (self.group, id))
    }
    fn disarm(&mut self, key: TimerKey) {
        self.wheel.cancel(key);
    }
}

/// A group in the model.
#[derive(Default)]
struct ModelGroup {
    /// Its filter drops every (untagged) message.
    filtering: bool,
    /// Where it started (created or reset): it owes nothing below.
    from: MsgId,
    /// Messages it still needs.
    owed: BTreeSet<MsgId>,
    /// Owed messages it delivered at least once (in flight, back for
    /// retry, or delayed): the ones an ACK succeeds for.
    delivered: BTreeSet<MsgId>,
    /// In flight, and to whom.
    inflight: BTreeMap<MsgId, ConsumerId>,
    delayed: BTreeSet<MsgId>,
}

impl ModelGroup {
    fn ready(&self) -> u64 {
        (self.owed.len() - self.inflight.len() - self.delayed.len()) as u64
    }
}

struct Run {
    rng: Rng,
    t: Topic,
    wheel: Wheel<(GroupId, MsgId)>,
    now_ms: u64,
    /// Live messages in the model.
    live: BTreeSet<MsgId>,
    groups: BTreeMap<u32, ModelGroup>,
    /// Names of the groups created, for their ids.
    made: u32,
    step: usize,
    op: String,
}

fn born_ms_of(id: MsgId) -> u64 {
    id * 10
}

impl Run {
    fn ctx(&self) -> String {
        format!("step {} ({})", self.step, self.op)
    }

    fn produce(&mut self) {
        let n = self.rng.range(1, 6);
        self.op = format!("produce {n}");
        for _ in 0..n {
            let id = self.t.seq.next_id();
            self.t.produce(born_ms_of(id), b"m");
            self.live.insert(id);
            for g in self.groups.values_mut().filter(|g| !g.filtering && id >= g.from) {
                g.owed.insert(id);
            }
        }
        self.t.publish();
    }

    /// The first id a group starting at `start` owes.
    fn model_start(&self, start: Start) -> MsgId {
        match start {
            Start::Earliest => self.live.iter().next().copied().unwrap_or(self.t.seq.next_id()),
            Start::Latest => self.t.seq.next_id(),
            Start::Id(id) => id.min(self.t.seq.next_id()),
            Start::Time(ms) => {
                self.live.iter().copied().find(|&id| born_ms_of(id) >= ms).unwrap_or(self.t.seq.next_id())
            }
        }
    }

    fn random_start(&mut self) -> Start {
        let top = self.t.seq.next_id() + 2;
        match self.rng.below(4) {
            0 => Start::Earliest,
            1 => Start::Latest,
            2 => Start::Id(self.rng.below(top)),
            _ => Start::Time(born_ms_of(self.rng.below(top))),
        }
    }

    fn add_group(&mut self) {
        if self.groups.len() >= GROUPS_MAX {
            return;
        }
        let start = self.random_start();
        let filtering = self.rng.percent(20);
        self.op = format!("add group start {start:?} filtering {filtering}");
        let from = self.model_start(start);
        let cursor = self.t.start_cursor(start);
        assert_eq!(cursor, from, "{}: start cursor", self.ctx());
        let mut config = GroupConfig::default();
        if filtering {
            config.filter_text = "only-this-tag".into();
            config.filter = Filter::parse("only-this-tag", 100, 1 << 20).ok().map(std::sync::Arc::new);
        }
        self.made += 1;
        let g = self.t.add_group(&format!("g{}", self.made), config, cursor);
        let owed = if filtering { BTreeSet::new() } else { self.live.range(from..).copied().collect() };
        self.groups.insert(g.0, ModelGroup { filtering, from, owed, ..ModelGroup::default() });
    }

    fn pick_group(&mut self) -> Option<GroupId> {
        let ids: Vec<u32> = self.groups.keys().copied().collect();
        (!ids.is_empty()).then(|| GroupId(self.rng.pick(&ids)))
    }

    fn delete_group(&mut self) {
        let Some(g) = self.pick_group() else { return };
        self.op = format!("delete {g:?}");
        assert!(self.t.delete_group(g, &mut Timed { wheel: &mut self.wheel, group: g }));
        self.groups.remove(&g.0);
    }

    fn reset_group(&mut self) {
        let Some(g) = self.pick_group() else { return };
        let start = self.random_start();
        self.op = format!("reset {g:?} to {start:?}");
        let from = self.model_start(start);
        let cursor = self.t.start_cursor(start);
        assert!(self.t.reset_group(g, cursor, &mut Timed { wheel: &mut self.wheel, group: g }));
        let live = &self.live;
        let Some(m) = self.groups.get_mut(&g.0) else { unreachable!() };
        let filtering = m.filtering;
        *m = ModelGroup { filtering, from, ..ModelGroup::default() };
        if !filtering {
            m.owed = live.range(from..).copied().collect();
        }
    }

    fn fetch(&mut self) {
        let Some(g) = self.pick_group() else { return };
        let owner = self.rng.range(1, 3);
        let max = self.rng.range(1, 8) as u32;
        self.op = format!("fetch {g:?} owner {owner} max {max}");
        let take = Take { owner, max_messages: max, max_bytes: u64::MAX, deadline_ms: self.now_ms + 50 };
        let mut got = Vec::new();
        self.t.fetch(g, take, &mut Timed { wheel: &mut self.wheel, group: g }, |_, d| got.push(d.id));
        let ctx = self.ctx();
        let Some(m) = self.groups.get_mut(&g.0) else { unreachable!() };
        assert_eq!(got.len() as u64, m.ready().min(u64::from(max)), "{ctx}: fetched count");
        for id in got {
            assert!(m.owed.contains(&id), "{ctx}: delivered {id}, which the group does not owe");
            assert!(!m.inflight.contains_key(&id) && !m.delayed.contains(&id), "{ctx}: {id} delivered twice");
            m.inflight.insert(id, owner);
            m.delivered.insert(id);
        }
    }

    /// An id to act on: usually one the group has delivered.
    fn pick_id(&mut self, m: &BTreeSet<MsgId>) -> MsgId {
        let v: Vec<MsgId> = m.iter().copied().collect();
        if v.is_empty() || self.rng.percent(10) { self.rng.below(self.t.seq.next_id() + 1) } else { self.rng.pick(&v) }
    }

    fn ack(&mut self) {
        let Some(g) = self.pick_group() else { return };
        let delivered = self.groups[&g.0].delivered.clone();
        let id = self.pick_id(&delivered);
        self.op = format!("ack {g:?} {id}");
        let ok = self.t.ack(g, id, &mut Timed { wheel: &mut self.wheel, group: g });
        let Some(m) = self.groups.get_mut(&g.0) else { unreachable!() };
        assert_eq!(ok, m.delivered.contains(&id), "step {}: ack {id} of {g:?}", self.step);
        if ok {
            m.owed.remove(&id);
            m.delivered.remove(&id);
            m.inflight.remove(&id);
            m.delayed.remove(&id);
        }
    }

    fn nack(&mut self) {
        let Some(g) = self.pick_group() else { return };
        let inflight: BTreeSet<MsgId> = self.groups[&g.0].inflight.keys().copied().collect();
        let id = self.pick_id(&inflight);
        let delay = self.rng.percent(50).then_some(self.now_ms + 30);
        self.op = format!("nack {g:?} {id} delay {delay:?}");
        let got = self.t.nack(g, id, delay, false, &mut Timed { wheel: &mut self.wheel, group: g });
        let Some(m) = self.groups.get_mut(&g.0) else { unreachable!() };
        assert_eq!(got.is_some(), m.inflight.remove(&id).is_some(), "step {}: nack {id}", self.step);
        if got.is_some() && delay.is_some() {
            m.delayed.insert(id);
        }
    }

    fn disconnect(&mut self) {
        let Some(g) = self.pick_group() else { return };
        let owner = self.rng.range(1, 3);
        self.op = format!("disconnect {owner} from {g:?}");
        let n = self.t.disconnect(g, owner, &mut Timed { wheel: &mut self.wheel, group: g }, |_, _| {
            panic!("nothing dead-letters here")
        });
        let Some(m) = self.groups.get_mut(&g.0) else { unreachable!() };
        let held: Vec<MsgId> = m.inflight.iter().filter(|(_, o)| **o == owner).map(|(id, _)| *id).collect();
        m.inflight.retain(|_, o| *o != owner);
        let mut returned: Vec<MsgId> = n.iter().map(|r| r.0).collect();
        returned.sort_unstable();
        assert_eq!(returned, held, "step {}: returned on disconnect", self.step);
    }

    fn advance(&mut self) {
        self.now_ms += self.rng.range(1, 60);
        self.op = format!("advance to {}", self.now_ms);
        let mut fired = Vec::new();
        self.wheel.advance(self.now_ms, &mut fired);
        for (_, (g, id)) in fired {
            let r = self.t.timer_fired(g, id, &mut Timed { wheel: &mut self.wheel, group: g });
            assert_eq!(r, Some(Returned::Retry), "step {}: timer of {id} in {g:?}", self.step);
            let Some(m) = self.groups.get_mut(&g.0) else { unreachable!("a deleted group's timer fired") };
            assert!(m.inflight.remove(&id).is_some() || m.delayed.remove(&id));
        }
    }

    fn step(&mut self) {
        match self.rng.below(100) {
            0..25 => self.produce(),
            25..32 => self.add_group(),
            32..35 => self.delete_group(),
            35..39 => self.reset_group(),
            39..60 => self.fetch(),
            60..78 => self.ack(),
            78..86 => self.nack(),
            86..90 => self.disconnect(),
            _ => self.advance(),
        }
    }

    /// Lets the topic catch up (sweeps done, filters stepped over), then
    /// compares it with the model.
    fn check(&mut self) {
        while self.t.sweeping() {
            self.t.sweep();
        }
        let ctx = self.ctx();
        for (&g, m) in &self.groups {
            if m.filtering {
                assert!(!self.t.has_ready(GroupId(g)), "{ctx}: a filter that drops everything has nothing ready");
            }
        }
        if !self.groups.is_empty() {
            self.live.retain(|id| self.groups.values().any(|g| g.owed.contains(id)));
        }
        let live: BTreeSet<MsgId> = self.t.seq.iter_live().map(|m| m.id).collect();
        assert_eq!(live, self.live, "{ctx}: live messages");
        let mut timers = 0;
        for (&g, m) in &self.groups {
            let g = GroupId(g);
            assert_eq!(self.t.inflight(g), m.inflight.len() as u64, "{ctx}: in flight of {g:?}");
            assert_eq!(self.t.delayed(g), m.delayed.len() as u64, "{ctx}: delayed of {g:?}");
            if !m.filtering {
                assert_eq!(self.t.ready(g), m.ready(), "{ctx}: ready of {g:?}");
            }
            timers += m.inflight.len() + m.delayed.len();
        }
        assert_eq!(self.wheel.len(), timers, "{ctx}: one timer per message in flight or delayed");
    }
}

fn run(seed: u64, steps: usize) {
    let _guard = SeedGuard { test: "groups_match_model", seed, replay: "cargo test --release --lib groups_match" };
    let settings =
        Settings { ack_timeout_ms: 50, max_deliveries: u16::MAX, dedup_window_ms: None, retention: Default::default() };
    let mut r = Run {
        rng: Rng::new(seed),
        t: Topic::new("t", false, settings, 1),
        wheel: Wheel::new(0),
        now_ms: 0,
        live: BTreeSet::new(),
        groups: BTreeMap::new(),
        made: 0,
        step: 0,
        op: "start".into(),
    };
    for step in 1..=steps {
        r.step = step;
        r.step();
        r.check();
    }
}

#[test]
fn groups_match_model_under_random_operations() {
    for seed in seeds(60) {
        run(seed, 600);
    }
}
