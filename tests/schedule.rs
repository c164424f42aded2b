//! Scheduled messages (protocol version 3), in process, on a clock the
//! test moves: a seeded model of due times across restarts, and the rules
//! of CANCEL and RESCHEDULE (docs/protocol.md, "Scheduled messages
//! (version 3)"). The broker is driven as the reactor drives it — the
//! turn's requests, then its timers, then its commit — with `Now` chosen
//! by the test, so nothing here sleeps. The crash test with a real
//! `runnel serve` child is in tests/crash.rs.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::TempDir;
use common::clocked::{Harness, START_WALL_MS, start};
use runnel::broker::{Config, Now};
use runnel::codec::props::{self, PROP_DELAY, PROP_DELIVER_AT};
use runnel::codec::schedule::When;
use runnel::codec::{self, Batch, ErrorCode, Ids, Props, PropsLimits, Reply, Request};
use runnel::testkit::{Rng, SeedGuard, seeds};

const GROUPS: [&str; 2] = ["", "b"];
/// A payload large enough that a few hundred messages fill several segments.
const PAYLOAD: [u8; 200] = [b'm'; 200];

/// A broker whose session speaks the newest version (scheduling came
/// with version 3).
fn open(dir: &Path, now: Now) -> Harness {
    Harness::open(dir, now, Config::default(), codec::CODEC_VERSION_MAX)
}

impl Harness {
    /// Produces one message with a time property; returns its id.
    fn produce(&mut self, topic: &'static str, kind: u8, ms: u64) -> u64 {
        let mut blob = Vec::new();
        props::put_time(&mut blob, kind, ms);
        let p = Props::parse(&blob, 3, &PropsLimits::ANY).expect("valid");
        let mut bytes = Vec::new();
        codec::encode_message(&mut bytes, &p, &PAYLOAD);
        match self.call(Request::Produce {
            topic,
            flags: 0,
            batch: Batch { count: 1, bytes: &bytes, with_props: true },
        }) {
            Reply::Produced { first_id, .. } => first_id,
            other => panic!("produce: {other:?}"),
        }
    }

    /// Every message group `group` gets now (acking each), with its
    /// delivery count and time property.
    fn drain(&mut self, topic: &'static str, group: &'static str) -> Vec<(u64, u16, Option<u64>)> {
        let mut got = Vec::new();
        loop {
            let fetch = Request::Fetch { topic, group, max_messages: 100, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
            let Reply::Messages { messages, .. } = self.call(fetch) else { panic!("fetch") };
            if messages.is_empty() {
                return got;
            }
            let ids: Vec<u64> = messages.iter().map(|m| m.id).collect();
            for m in &messages {
                let at = match m.props.schedule() {
                    Some(props::Prop::DeliverAt(at)) => Some(at),
                    _ => None,
                };
                got.push((m.id, m.delivery_count, at));
            }
            let mut body = Vec::new();
            codec::encode_ids(&mut body, &ids);
            let Reply::Ids { done, .. } = self.call(Request::Ack { topic, group, ids: Ids { bytes: &body } }) else {
                panic!("ack")
            };
            assert_eq!(done as usize, ids.len());
        }
    }

    fn stat(&mut self, topic: &'static str, key: &str) -> u64 {
        self.stat_of(topic, topic, key)
    }

    /// A key of STATS section `section` (a topic's, or `topic/group`).
    fn stat_of(&mut self, topic: &'static str, section: &str, key: &str) -> u64 {
        let Reply::Stats(sections) = self.call(Request::Stats { topic }) else { panic!("stats") };
        let s = sections.iter().find(|s| s.0 == section).unwrap_or_else(|| panic!("no section {section}"));
        s.1.iter().find(|kv| kv.0 == key).map(|kv| kv.1).unwrap_or_else(|| panic!("no key {key} in {section}"))
    }
}

fn error_code(r: &Reply<'_>) -> Option<ErrorCode> {
    match r {
        Reply::Error { code, .. } => ErrorCode::from_u8(*code),
        _ => None,
    }
}

/// Two groups; each gets every scheduled message once, at or after its
/// time, however the broker restarts, and a cancelled one never: against
/// a model of due times (seeded; a failure prints its seed).
#[test]
fn scheduled_messages_against_a_model_of_due_times_across_restarts() {
    for seed in seeds(6) {
        let _guard =
            SeedGuard { test: "scheduled_messages_against_a_model", seed, replay: "cargo test --test schedule" };
        run_model(seed);
    }
}

/// The model: each message's due time, or None once cancelled.
struct Model {
    due: BTreeMap<u64, Option<u64>>,
    /// What each group got: id to the wall time it got it.
    got: [BTreeMap<u64, u64>; 2],
}

fn run_model(seed: u64) {
    let mut rng = Rng::new(seed);
    let dir = TempDir::new("schedule-model");
    let mut h = open(dir.path(), start());
    for g in GROUPS {
        h.drain("t", g);
    }
    let mut m = Model { due: BTreeMap::new(), got: [BTreeMap::new(), BTreeMap::new()] };
    let mut compactions = 0;
    for step in 0..400 {
        match rng.below(10u32) {
            0..=2 => {
                let (kind, value, due) = if rng.one_in(2u32) {
                    let d = rng.below(300u64);
                    (PROP_DELAY, d, h.now.wall_ms + d)
                } else {
                    let at = h.now.wall_ms + rng.below(300u64) - 50;
                    (PROP_DELIVER_AT, at, at)
                };
                let id = h.produce("t", kind, value);
                m.due.insert(id, Some(due));
            }
            3 => {
                let Some(&id) = pick(&mut rng, &m.due) else { continue };
                let scheduled = m.due[&id].is_some_and(|d| d > h.now.wall_ms);
                let r = h.call(Request::Cancel { topic: "t", id });
                if scheduled {
                    assert_eq!(r, Reply::Due(m.due[&id].unwrap()), "seed {seed} step {step}: cancel {id}");
                    m.due.insert(id, None);
                } else {
                    assert_eq!(error_code(&r), Some(ErrorCode::NotScheduled), "seed {seed} step {step}: cancel {id}");
                }
            }
            4 => {
                let Some(&id) = pick(&mut rng, &m.due) else { continue };
                let scheduled = m.due[&id].is_some_and(|d| d > h.now.wall_ms);
                let delay = rng.below(200u64);
                let r = h.call(Request::Reschedule { topic: "t", id, when: When::Delay(delay) });
                if scheduled {
                    assert_eq!(r, Reply::Due(h.now.wall_ms + delay), "seed {seed} step {step}: reschedule {id}");
                    m.due.insert(id, Some(h.now.wall_ms + delay));
                } else {
                    assert_eq!(error_code(&r), Some(ErrorCode::NotScheduled), "seed {seed} step {step}: {id}");
                }
            }
            5 => {
                // A restart: the log is all there is.
                let now = h.now;
                compactions += h.broker.compactions();
                drop(h);
                h = open(dir.path(), now);
            }
            6..=8 => {
                let to = h.now.wall_ms + rng.below(60u64);
                h.tick_to(to);
            }
            _ => {}
        }
        for (g, group) in GROUPS.iter().enumerate() {
            // Group b lags: what fell due stays live while compaction
            // copies it forward.
            if rng.one_in(if g == 0 { 3u32 } else { 25 }) {
                for (id, deliveries, at) in h.drain("t", group) {
                    let due = m.due.get(&id).copied().flatten();
                    let due = due.unwrap_or_else(|| panic!("seed {seed} step {step}: {id} was cancelled or unknown"));
                    assert!(due <= h.now.wall_ms, "seed {seed} step {step}: {id} due {due} came at {}", h.now.wall_ms);
                    assert_eq!(deliveries, 1, "seed {seed} step {step}: {id} once");
                    assert!(at.is_none_or(|at| at == due), "seed {seed} step {step}: {id} carries {at:?}, due {due}");
                    assert!(m.got[g].insert(id, h.now.wall_ms).is_none(), "seed {seed} step {step}: {id} twice");
                }
            }
        }
    }
    // In the end every message not cancelled comes, to each group, once.
    let last = m.due.values().flatten().max().copied().unwrap_or(0);
    h.tick_to(last.max(h.now.wall_ms) + 1);
    let now = h.now;
    compactions += h.broker.compactions();
    drop(h);
    let mut h = open(dir.path(), now);
    assert!(compactions > 0, "seed {seed}: compaction ran");
    for (g, group) in GROUPS.iter().enumerate() {
        for (id, _, _) in h.drain("t", group) {
            assert!(m.due[&id].is_some(), "seed {seed}: cancelled {id} came");
            assert!(m.got[g].insert(id, h.now.wall_ms).is_none(), "seed {seed}: {id} twice to group {group:?}");
        }
        let want: Vec<u64> = m.due.iter().filter(|(_, d)| d.is_some()).map(|(id, _)| *id).collect();
        assert_eq!(m.got[g].keys().copied().collect::<Vec<_>>(), want, "seed {seed}: group {group:?} got each once");
    }
    assert_eq!(h.stat("t", "scheduled"), 0);
}

fn pick<'a>(rng: &mut Rng, due: &'a BTreeMap<u64, Option<u64>>) -> Option<&'a u64> {
    if due.is_empty() {
        return None;
    }
    due.keys().nth(rng.below(due.len()))
}

/// A scheduled message is delivered to no group until its time, is counted
/// as scheduled, and then comes to each group: to one whose cursor passed
/// it ahead of its newer messages.
#[test]
fn a_scheduled_message_waits_for_its_time_then_comes_to_every_group() {
    let dir = TempDir::new("schedule-basic");
    let mut h = open(dir.path(), start());
    for g in GROUPS {
        h.drain("t", g);
    }
    let later = h.produce("t", PROP_DELAY, 1000);
    let mut plain = Vec::new();
    codec::encode_message(&mut plain, &Props::EMPTY, b"now");
    let Reply::Produced { first_id: now_id, .. } =
        h.call(Request::Produce { topic: "t", flags: 0, batch: Batch { count: 1, bytes: &plain, with_props: true } })
    else {
        panic!("produce")
    };
    assert_eq!(h.stat("t", "scheduled"), 1);
    assert_eq!(h.stat("t", "ready"), 1, "the plain message alone is ready");
    assert_eq!(h.stat_of("t", "t/b", "lag"), 1, "and is the group's lag");
    assert_eq!(h.drain("t", ""), [(now_id, 1, None)], "the cursor steps over the scheduled one");
    h.tick_to(START_WALL_MS + 999);
    assert_eq!(h.drain("t", ""), [], "not before its time");
    h.tick_to(START_WALL_MS + 1000);
    let due = Some(START_WALL_MS + 1000);
    assert_eq!(h.drain("t", ""), [(later, 1, due)], "a delay is stored as the time it names");
    assert_eq!(h.drain("t", "b"), [(later, 1, due), (now_id, 1, None)], "a group that had not reached it");
    assert_eq!(h.stat("t", "scheduled"), 0);
    // A time already past is no schedule at all.
    let past = h.produce("t", PROP_DELIVER_AT, START_WALL_MS);
    assert_eq!(h.drain("t", ""), [(past, 1, None)]);
}

/// Before the default group exists, the topic's `ready` counts what that
/// group would find if created now, and a scheduled message is not among
/// it (it is counted in `scheduled` alone): with no group at all, and with
/// a named group that has read the rest.
#[test]
fn a_scheduled_message_is_not_ready_for_a_default_group_not_yet_made() {
    let dir = TempDir::new("schedule-no-group");
    let mut h = open(dir.path(), start());
    let later = h.produce("t", PROP_DELAY, 1000);
    let mut plain = Vec::new();
    codec::encode_message(&mut plain, &Props::EMPTY, b"now");
    h.call(Request::Produce { topic: "t", flags: 0, batch: Batch { count: 1, bytes: &plain, with_props: true } });
    assert_eq!((h.stat("t", "ready"), h.stat("t", "scheduled")), (1, 1), "no group yet: the plain message alone");
    assert_eq!(h.drain("t", "b").len(), 1, "group b reads and acks the plain message");
    assert_eq!((h.stat("t", "ready"), h.stat("t", "scheduled")), (0, 1), "nothing ready before its time");
    h.tick_to(START_WALL_MS + 1000);
    assert_eq!(h.stat("t", "ready"), 1, "ready at its time");
    assert_eq!(h.drain("t", ""), [(later, 1, Some(START_WALL_MS + 1000))]);
}

/// CANCEL and RESCHEDULE act on scheduled messages only, and what they did
/// holds across a restart; a time too far ahead is refused.
#[test]
fn cancel_and_reschedule_hold_across_a_restart() {
    let dir = TempDir::new("schedule-cancel");
    let mut h = open(dir.path(), start());
    h.drain("t", "");
    let a = h.produce("t", PROP_DELAY, 10_000);
    let b = h.produce("t", PROP_DELAY, 10_000);
    assert_eq!(h.call(Request::Cancel { topic: "t", id: a }), Reply::Due(START_WALL_MS + 10_000));
    let again = h.call(Request::Cancel { topic: "t", id: a });
    assert_eq!(error_code(&again), Some(ErrorCode::NotScheduled));
    let when = When::At(START_WALL_MS + 20_000);
    assert_eq!(h.call(Request::Reschedule { topic: "t", id: b, when }), Reply::Due(START_WALL_MS + 20_000));
    let far = When::Delay(400 * 24 * 3600 * 1000);
    assert_eq!(error_code(&h.call(Request::Reschedule { topic: "t", id: b, when: far })), Some(ErrorCode::BadArgument));
    let unknown = h.call(Request::Cancel { topic: "nope", id: 1 });
    assert_eq!(error_code(&unknown), Some(ErrorCode::UnknownTopic));
    let now = h.now;
    drop(h);
    let mut h = open(dir.path(), now);
    assert_eq!(h.stat("t", "scheduled"), 1, "b alone, still scheduled");
    h.tick_to(START_WALL_MS + 10_000);
    assert_eq!(h.drain("t", ""), [], "b was moved to 20 s");
    h.tick_to(START_WALL_MS + 20_000);
    assert_eq!(h.drain("t", ""), [(b, 1, Some(START_WALL_MS + 20_000))]);
    let late = h.call(Request::Cancel { topic: "t", id: b });
    assert_eq!(error_code(&late), Some(ErrorCode::NotScheduled), "its time has come");
}

/// A message whose time came while the broker was down is ready when it
/// starts, for a group whose cursor had passed it too; and once that group
/// acks it, a later restart does not bring it back.
#[test]
fn a_time_that_passed_while_down_is_ready_at_start_and_only_once() {
    let dir = TempDir::new("schedule-downtime");
    let mut h = open(dir.path(), start());
    h.drain("t", "");
    let id = h.produce("t", PROP_DELAY, 5_000);
    let mut plain = Vec::new();
    codec::encode_message(&mut plain, &Props::EMPTY, b"now");
    h.call(Request::Produce { topic: "t", flags: 0, batch: Batch { count: 1, bytes: &plain, with_props: true } });
    assert_eq!(h.drain("t", "").len(), 1, "the group's cursor passes the scheduled message");
    drop(h);
    let later = Now { mono_ms: 1, wall_ms: START_WALL_MS + 60_000 };
    let mut h = open(dir.path(), later);
    assert_eq!(h.drain("t", ""), [(id, 1, Some(START_WALL_MS + 5_000))]);
    drop(h);
    let mut h = open(dir.path(), Now { mono_ms: 1, wall_ms: START_WALL_MS + 120_000 });
    assert_eq!(h.drain("t", ""), [], "acked: it does not come again");
}

/// A message whose time came and that a group still needs is copied
/// forward by compaction without its passed delivery time, since the Due
/// record that said its time came may go with the segment compaction
/// removes: after a restart it is ready at once, not scheduled again, even
/// with a wall clock stepped back before its time, and the group that had
/// acked it does not get it again.
#[test]
fn compaction_copies_a_message_whose_time_came_without_its_time() {
    let dir = TempDir::new("schedule-compacted-due");
    let mut h = open(dir.path(), start());
    for g in GROUPS {
        h.drain("t", g);
    }
    let id = h.produce("t", PROP_DELAY, 1000);
    h.tick_to(START_WALL_MS + 1000);
    let due = Some(START_WALL_MS + 1000);
    assert_eq!(h.drain("t", ""), [(id, 1, due)], "the default group acks it; group b still needs it");
    // The segment now being written holds its Due record, its Produce record
    // that one or an earlier one.
    let written = h.broker.log().segments().last().expect("a segment").base;
    let mut batch = Vec::new();
    for _ in 0..50 {
        codec::encode_message(&mut batch, &Props::EMPTY, &PAYLOAD);
    }
    while h.broker.log().segments()[0].base <= written {
        h.call(Request::Produce { topic: "f", flags: 0, batch: Batch { count: 50, bytes: &batch, with_props: true } });
        assert_eq!(h.drain("f", "").len(), 50);
        // Compaction looks for work every 64 turns, and cleans over several.
        for _ in 0..100 {
            h.tick_to(h.now.wall_ms);
        }
    }
    drop(h);
    let mut h = open(dir.path(), Now { mono_ms: 1, wall_ms: START_WALL_MS + 500 });
    assert_eq!(h.stat("t", "scheduled"), 0, "its copy carries no time");
    assert_eq!(h.drain("t", "b"), [(id, 1, None)], "ready at once for the group that needs it");
    assert_eq!(h.drain("t", ""), [], "and not again for the group that acked it");
}

/// A version-2 session may not schedule, and is delivered a scheduled
/// message without the time property it does not know.
#[test]
fn a_version_2_session_cannot_schedule_and_sees_no_time() {
    let dir = TempDir::new("schedule-v2");
    let mut h = open(dir.path(), start());
    h.drain("t", "");
    let id = h.produce("t", PROP_DELAY, 10);
    h.tick_to(START_WALL_MS + 10);
    let hello = Request::Hello { min_version: 1, max_version: 2, token: b"" };
    assert!(matches!(h.call(hello), Reply::Hello { version: 2, .. }));
    h.session.version = 2;
    let fetch = Request::Fetch { topic: "t", group: "", max_messages: 10, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
    let Reply::Messages { messages, .. } = h.call(fetch) else { panic!("fetch") };
    assert_eq!(messages.len(), 1);
    assert_eq!((messages[0].id, messages[0].props.bytes()), (id, &[][..]), "no time property for version 2");
    // The codec refuses a version-3 op or property in a version-2 session.
    let mut frame = Vec::new();
    codec::encode_request(&mut frame, 9, &Request::Cancel { topic: "t", id }, 3);
    let limits = codec::DecodeLimits::from(&runnel::limits::Limits::default());
    let refused = codec::decode_request(&frame, &limits, 2).expect_err("refused");
    assert_eq!(refused.code, ErrorCode::UnknownOp, "CANCEL is version 3's");
    let mut blob = Vec::new();
    props::put_time(&mut blob, PROP_DELAY, 1);
    assert_eq!(Props::parse(&blob, 2, &PropsLimits::ANY).expect_err("v2").code, ErrorCode::BadArgument);
}

/// A NACK delay survives a restart: the message is ready again when the
/// delay ends on the wall clock, not at the restart, with its deliveries
/// counted (docs/protocol.md, "Restarts").
#[test]
fn a_nack_delay_survives_a_restart() {
    let dir = TempDir::new("nack-delay");
    let mut h = open(dir.path(), start());
    h.drain("t", "");
    let mut plain = Vec::new();
    codec::encode_message(&mut plain, &Props::EMPTY, b"job");
    let Reply::Produced { first_id: id, .. } =
        h.call(Request::Produce { topic: "t", flags: 0, batch: Batch { count: 1, bytes: &plain, with_props: true } })
    else {
        panic!("produce")
    };
    let fetch = Request::Fetch { topic: "t", group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
    let Reply::Messages { messages, .. } = h.call(fetch) else { panic!("fetch") };
    assert_eq!(messages.len(), 1);
    let mut body = Vec::new();
    codec::encode_ids(&mut body, &[id]);
    let nack =
        Request::Nack { topic: "t", group: "", delay_ms: 10_000, flags: 0, ids: Ids { bytes: &body }, reason: "" };
    assert!(matches!(h.call(nack), Reply::Ids { done: 1, .. }));
    drop(h);
    let mut h = open(dir.path(), Now { mono_ms: 1, wall_ms: START_WALL_MS + 5_000 });
    assert_eq!(h.stat("t", "delayed"), 1, "still delayed after the restart");
    assert_eq!(h.drain("t", ""), [], "not before the delay ends");
    // Enough traffic that compaction removes the segment of the Delay
    // record: it restates the delay with the group.
    let mut batch = Vec::new();
    for _ in 0..50 {
        codec::encode_message(&mut batch, &Props::EMPTY, &PAYLOAD);
    }
    for _ in 0..8 {
        h.call(Request::Produce { topic: "t", flags: 0, batch: Batch { count: 50, bytes: &batch, with_props: true } });
        assert_eq!(h.drain("t", "").len(), 50);
    }
    // Compaction looks for work every 64 turns, and cleans over several.
    for _ in 0..400 {
        h.tick_to(h.now.wall_ms);
    }
    assert!(h.broker.compactions() > 0, "compaction ran");
    drop(h);
    let mut h = open(dir.path(), Now { mono_ms: 1, wall_ms: START_WALL_MS + 6_000 });
    assert_eq!(h.stat("t", "delayed"), 1, "still delayed after compaction and a restart");
    h.tick_to(START_WALL_MS + 10_000);
    assert_eq!(h.drain("t", ""), [(id, 2, None)], "ready when the delay ends, its first delivery counted");
}

/// A message ACK_PRODUCE stores with a delivery time is scheduled as a
/// PRODUCE's is, and stays so across a restart.
#[test]
fn ack_produce_schedules_its_outputs_as_produce_does() {
    let dir = TempDir::new("schedule-ack-produce");
    let mut h = open(dir.path(), start());
    h.drain("in", "");
    h.drain("out", "");
    let mut plain = Vec::new();
    codec::encode_message(&mut plain, &Props::EMPTY, b"job");
    let batch = Batch { count: 1, bytes: &plain, with_props: true };
    h.call(Request::Produce { topic: "in", flags: 0, batch });
    let fetch = Request::Fetch { topic: "in", group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
    let Reply::Messages { messages, .. } = h.call(fetch) else { panic!("fetch") };
    let mut blob = Vec::new();
    props::put_time(&mut blob, PROP_DELAY, 5_000);
    let p = Props::parse(&blob, 3, &PropsLimits::ANY).expect("valid");
    let mut message = Vec::new();
    codec::encode_message(&mut message, &p, b"next step");
    let mut outputs = Vec::new();
    codec::ack_produce::encode_output(&mut outputs, "out", &Batch { count: 1, bytes: &message, with_props: true });
    let mut ids = Vec::new();
    codec::encode_ids(&mut ids, &[messages[0].id]);
    let outputs = codec::ack_produce::Outputs { count: 1, bytes: &outputs };
    let req = Request::AckProduce { topic: "in", group: "", ids: Ids { bytes: &ids }, outputs };
    let Reply::AckProduced { done: 1, outputs, .. } = h.call(req) else { panic!("ack_produce") };
    let id = outputs[0].0;
    assert_eq!(h.stat("out", "scheduled"), 1);
    assert_eq!(h.drain("out", ""), [], "not before its time");
    drop(h);
    let mut h = open(dir.path(), Now { mono_ms: 1, wall_ms: START_WALL_MS + 1_000 });
    assert_eq!(h.stat("out", "scheduled"), 1, "still scheduled after a restart");
    h.tick_to(START_WALL_MS + 5_000);
    assert_eq!(h.drain("out", ""), [(id, 1, Some(START_WALL_MS + 5_000))]);
}
