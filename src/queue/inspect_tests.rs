//! Inspection against a model: random produces with keys (some tagged,
//! some scheduled), fetches by two consumers, acks, NACKs with and without
//! a delay, NACKs that dead-letter, ack timeouts and schedules falling due,
//! over three groups (one filtering). After every step, every message's
//! `Topic::inspect` and every key's index answer agree with a model of
//! each group's state, kept from what each operation answered. Random
//! operations from a printed seed (`RUNNEL_SEED` replays one).

use std::collections::BTreeMap;

use super::groups_tests::Timed;
use super::*;
use crate::codec::props::{put_key, put_tag};
use crate::codec::{DeadReason, Props};
use crate::filter::Filter;
use crate::testkit::{Rng, SeedGuard, seeds};
use crate::wheel::{TimerKey, Wheel};

/// Ids the index keeps per key.
const PER_KEY_MAX: u32 = 3;
/// Deliveries before a failed one dead-letters.
const MAX_DELIVERIES: u16 = 3;
/// Ack timeout of every fetch, ms.
const ACK_TIMEOUT_MS: u64 = 40;

struct Run {
    rng: Rng,
    t: Topic,
    wheel: Wheel<(GroupId, MsgId)>,
    now_ms: u64,
    /// The groups, and whether each filters (passes only tag `eu`).
    groups: Vec<(GroupId, bool)>,
    /// Each message's expected state in each group (by index in `groups`).
    model: BTreeMap<MsgId, Vec<GroupState>>,
    /// Each key's ids, newest first, as the index should keep them.
    keys: BTreeMap<u8, Vec<MsgId>>,
    /// Each message's key.
    key_of: BTreeMap<MsgId, u8>,
    step: usize,
    op: String,
}

impl Run {
    fn new(seed: u64) -> Run {
        let mut t = Topic::new(
            "t",
            false,
            Settings { ack_timeout_ms: 40, max_deliveries: MAX_DELIVERIES, ..Settings::default() },
            1,
        );
        t.set_key_bounds(PER_KEY_MAX, 1_000);
        let mut groups = Vec::new();
        for (name, filtering) in [("a", false), ("b", false), ("eu", true)] {
            let mut config = GroupConfig::default();
            if filtering {
                config.filter_text = "eu".into();
                config.filter = Filter::parse("eu", 100, 1 << 20).ok().map(std::sync::Arc::new);
            }
            groups.push((t.add_group(name, config, 1), filtering));
        }
        let wheel = Wheel::new(0);
        Run {
            rng: Rng::new(seed),
            t,
            wheel,
            now_ms: 0,
            groups,
            model: BTreeMap::new(),
            keys: BTreeMap::new(),
            key_of: BTreeMap::new(),
            step: 0,
            op: String::new(),
        }
    }

    fn produce(&mut self) {
        let key = self.rng.below(4u64) as u8;
        let eu = self.rng.percent(50);
        let due = self.rng.percent(15).then(|| self.now_ms + self.rng.range(1, 60));
        let mut props = Vec::new();
        put_tag(&mut props, if eu { "eu" } else { "us" });
        put_key(&mut props, &[b'k', key]);
        let parsed = Props::trusted(&props);
        let tag_set = self.t.seq.intern_tags_unbounded(&parsed);
        let (id, _) = self.t.produce(self.now_ms, Body { props: parsed, tag_set, payload: b"m" });
        self.op = format!("produce {id} key {key} eu {eu} due {due:?}");
        if let Some(due) = due {
            self.t.schedule(id, due);
        }
        self.t.publish();
        let states = self.groups.iter().map(|&(_, filtering)| match (filtering && !eu, due) {
            (true, _) => GroupState::Filtered,
            (false, Some(due_ms)) => GroupState::Scheduled { due_ms },
            (false, None) => GroupState::Ready { deliveries: 0 },
        });
        self.model.insert(id, states.collect());
        self.key_of.insert(id, key);
        let ids = self.keys.entry(key).or_default();
        ids.insert(0, id);
        ids.truncate(PER_KEY_MAX as usize);
    }

    fn fetch(&mut self) {
        let i = self.rng.below(self.groups.len());
        let g = self.groups[i].0;
        let owner = self.rng.range(1, 3);
        let deadline_ms = self.now_ms + ACK_TIMEOUT_MS;
        let take = Take { owner, max_messages: self.rng.range(1, 4), max_bytes: u64::MAX, deadline_ms };
        let mut got = Vec::new();
        self.t.fetch(g, take, &mut Timed { wheel: &mut self.wheel, group: g }, |_, d| got.push(d));
        self.op = format!("fetch {g:?} by {owner}: {got:?}");
        for d in got {
            let s = &mut self.model.get_mut(&d.id).expect("a produced id")[i];
            assert!(matches!(s, GroupState::Ready { .. }), "step {}: {} delivered from {s:?}", self.step, d.id);
            *s = GroupState::InFlight { consumer: owner, deliveries: d.deliveries, deadline_ms };
        }
    }

    /// A message group `i` has in flight, if any.
    fn inflight_of(&mut self, i: usize) -> Option<MsgId> {
        let ids: Vec<MsgId> =
            self.model.iter().filter(|(_, s)| matches!(s[i], GroupState::InFlight { .. })).map(|(id, _)| *id).collect();
        (!ids.is_empty()).then(|| self.rng.pick(&ids))
    }

    fn ack(&mut self) {
        let i = self.rng.below(self.groups.len());
        let Some(id) = self.inflight_of(i) else { return };
        let g = self.groups[i].0;
        self.op = format!("ack {g:?} {id}");
        assert!(self.t.ack(g, id, &mut Timed { wheel: &mut self.wheel, group: g }));
        self.model.get_mut(&id).expect("a produced id")[i] = GroupState::Done;
    }

    fn nack(&mut self) {
        let i = self.rng.below(self.groups.len());
        let Some(id) = self.inflight_of(i) else { return };
        let g = self.groups[i].0;
        let delay = self.rng.percent(50).then(|| self.now_ms + self.rng.range(1, 30));
        let reject = self.rng.percent(10);
        self.op = format!("nack {g:?} {id} delay {delay:?} reject {reject}");
        let GroupState::InFlight { deliveries, .. } = self.model[&id][i] else { unreachable!("in flight") };
        let returned = self.t.nack(g, id, delay, reject, &mut Timed { wheel: &mut self.wheel, group: g });
        let dead = reject || deliveries >= MAX_DELIVERIES;
        let reason = if reject { DeadReason::Rejected } else { DeadReason::Nacked };
        self.returned(i, id, returned.expect("in flight"), dead, reason, delay);
    }

    /// Group `i`'s failed delivery of `id` came back as `r`.
    fn returned(&mut self, i: usize, id: MsgId, r: Returned, dead: bool, reason: DeadReason, delay: Option<u64>) {
        let g = self.groups[i].0;
        let GroupState::InFlight { deliveries, .. } = self.model[&id][i] else { unreachable!("in flight") };
        let s = match r {
            Returned::Dead(info) => {
                assert!(dead, "step {}: {id} dead-lettered", self.step);
                assert_eq!((info.reason, info.origin_deliveries), (reason, deliveries), "step {}", self.step);
                self.t.note_dead(g, id, info, None);
                self.t.dead_lettered(g, id);
                GroupState::DeadLettered { info, last_nack_reason: None }
            }
            Returned::Retry => {
                assert!(!dead, "step {}: {id} was not dead-lettered", self.step);
                match delay {
                    Some(until_ms) => GroupState::Waiting { deliveries, until_ms },
                    None => GroupState::Ready { deliveries },
                }
            }
        };
        self.model.get_mut(&id).expect("a produced id")[i] = s;
    }

    /// Time passes: ack deadlines pass, delays end, schedules fall due.
    fn advance(&mut self) {
        self.now_ms += self.rng.range(1, 30);
        self.op = format!("advance to {}", self.now_ms);
        let mut fired = Vec::new();
        self.wheel.advance(self.now_ms, &mut fired);
        for (_, (g, id)) in fired {
            let i = self.groups.iter().position(|x| x.0 == g).expect("a group");
            let was = self.model[&id][i].clone();
            let r = self.t.timer_fired(g, id, &mut Timed { wheel: &mut self.wheel, group: g });
            match (was, r) {
                (GroupState::InFlight { deliveries, .. }, Some(r)) => {
                    self.returned(i, id, r, deliveries >= MAX_DELIVERIES, DeadReason::AckTimeout, None)
                }
                (GroupState::Waiting { deliveries, .. }, Some(Returned::Retry)) => {
                    self.model.get_mut(&id).expect("a produced id")[i] = GroupState::Ready { deliveries };
                }
                (was, r) => panic!("step {}: timer of {id} in {g:?} fired in {was:?}: {r:?}", self.step),
            }
        }
        let mut due = Vec::new();
        self.t.fall_due(self.now_ms, u32::MAX, |id| due.push(id));
        for id in due {
            for s in self.model.get_mut(&id).expect("a produced id") {
                if matches!(s, GroupState::Scheduled { .. }) {
                    *s = GroupState::Ready { deliveries: 0 };
                }
            }
        }
    }

    /// Every message's inspection and every key's lookup agree with the
    /// model.
    fn check(&self) {
        let wall_of = |k: TimerKey| self.wheel.deadline_ms(k);
        for (id, want) in &self.model {
            let got = self.t.inspect(*id, &wall_of).expect("a produced id");
            let finished =
                |s: &GroupState| matches!(s, GroupState::Done | GroupState::Filtered | GroupState::DeadLettered { .. });
            // Held exactly while a group needs it: a message a group's
            // filter drops is done for that group at once, whether or not
            // its cursor has stepped over it yet.
            let gone = got.stored.is_none();
            let done = want.iter().all(finished);
            assert_eq!(
                gone, done,
                "step {} ({}): {id} released (or held) when every group is done",
                self.step, self.op
            );
            // A message no longer held shows `done` for a group whose
            // filter dropped it: its tags went with it.
            let want =
                want.iter().map(|s| if gone && *s == GroupState::Filtered { GroupState::Done } else { s.clone() });
            let states: Vec<GroupState> = got.groups.iter().map(|l| l.state.clone()).collect();
            assert_eq!(states, want.collect::<Vec<_>>(), "step {} ({}): message {id}", self.step, self.op);
            let key = [b'k', self.key_of[id]];
            assert_eq!(got.stored.map(|m| m.props.key()), (!gone).then_some(Some(&key[..])), "step {}", self.step);
        }
        for (key, ids) in &self.keys {
            assert_eq!(&self.t.keys().lookup(&[b'k', *key]), ids, "step {}: key {key}", self.step);
        }
        assert!(self.t.inspect(self.t.seq.next_id(), &wall_of).is_none(), "an id the topic never had");
    }
}

#[test]
fn inspection_agrees_with_a_model_of_every_groups_state() {
    for seed in seeds(30) {
        let _g = SeedGuard { test: "inspection model", seed, replay: "cargo test --release --lib inspection_agrees" };
        let mut run = Run::new(seed);
        for step in 0..400 {
            run.step = step;
            match run.rng.below(10u64) {
                0..=2 => run.produce(),
                3..=4 => run.fetch(),
                5 => run.ack(),
                6 => run.nack(),
                _ => run.advance(),
            }
            run.check();
        }
    }
}
