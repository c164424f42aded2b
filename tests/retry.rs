//! Retries that back off (protocol version 4), in process, on a clock the
//! test moves: a group's retry policy makes a NACK without a delay, and a
//! passed ack deadline, wait before the message is ready again, for the
//! time the policy says for its delivery count; the wait survives a
//! restart and compaction (docs/protocol.md, "Retry policy (version 4)").
//! The broker is driven as the reactor drives it (the turn's requests,
//! then its timers, then its commit) with `Now` chosen by the test, so
//! nothing here sleeps. Then the same over the wire, with older sessions;
//! the SIGKILL test is in tests/crash.rs.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::TempDir;
use common::clocked::{Harness, START_WALL_MS, start};
use runnel::broker::{Config, Now};
use runnel::client::{Client, Fetch, State};
use runnel::codec::group::{GroupSettings, Start};
use runnel::codec::{self, Batch, ErrorCode, Ids, Props, Reply, Request, TopicOptions, TopicSettings};
use runnel::log::LogOptions;
use runnel::queue::{GroupId, RetryPolicy};
use runnel::testkit::{Rng, SeedGuard, seeds};

const PAYLOAD: [u8; 200] = [b'm'; 200];

/// A broker on a test clock at `now`, with one session of `version`.
fn open(dir: &Path, now: Now, version: u16) -> Harness {
    Harness::open(dir, now, Config::default(), version)
}

fn policy(initial_ms: u32, multiplier_pct: u16, cap_ms: u32, jitter_pct: u8) -> RetryPolicy {
    RetryPolicy { initial_ms, multiplier_pct, cap_ms, jitter_pct }
}

impl Harness {
    /// CREATE_GROUP `group` of topic `t` with `retry`: the error code if
    /// refused.
    fn create(&mut self, group: &str, retry: Option<RetryPolicy>, ack_timeout_ms: u32) -> Option<ErrorCode> {
        let settings = GroupSettings { retry, ack_timeout_ms, max_deliveries: 5, ..GroupSettings::default() };
        let out = self.call(Request::CreateGroup { topic: "t", group, settings, start: Start::Earliest });
        error_code(&out)
    }

    fn produce(&mut self, n: u32) -> u64 {
        let mut bytes = Vec::new();
        for _ in 0..n {
            codec::encode_message(&mut bytes, &Props::EMPTY, &PAYLOAD);
        }
        let batch = Batch { count: n, bytes: &bytes, with_props: true };
        match self.call(Request::Produce { topic: "t", flags: 0, batch }) {
            Reply::Produced { first_id, .. } => first_id,
            other => panic!("produce: {other:?}"),
        }
    }

    /// FETCH for `group`: each message's id and delivery count.
    fn fetch(&mut self, group: &str, ack_timeout_ms: u32) -> Vec<(u64, u16)> {
        let fetch = Request::Fetch { topic: "t", group, max_messages: 100, max_bytes: 0, wait_ms: 0, ack_timeout_ms };
        match self.call(fetch) {
            Reply::Messages { messages, .. } => messages.iter().map(|m| (m.id, m.delivery_count)).collect(),
            other => panic!("fetch: {other:?}"),
        }
    }

    fn nack(&mut self, group: &str, id: u64, delay_ms: u32) {
        self.nack_why(group, id, delay_ms, "");
    }

    /// NACK giving `reason` (none if empty).
    fn nack_why(&mut self, group: &str, id: u64, delay_ms: u32, reason: &str) {
        let mut body = Vec::new();
        codec::encode_ids(&mut body, &[id]);
        let flags = if reason.is_empty() { 0 } else { codec::NACK_FLAG_REASON };
        let nack = Request::Nack { topic: "t", group, delay_ms, flags, ids: Ids { bytes: &body }, reason };
        assert!(matches!(self.call(nack), Reply::Ids { done: 1, .. }), "nack {id}");
    }

    /// PEEK: message `id`'s state in `group`, and its `until_ms`.
    fn peek_state(&mut self, group: &str, id: u64) -> (u8, u64) {
        let out = self.call(Request::Peek { topic: "t", id });
        let Reply::Inspected(entries) = out else { panic!("peek") };
        let line = entries[0].groups.iter().find(|l| l.name == group).expect("the group's line");
        (line.state as u8, line.until_ms)
    }

    /// PEEK: message `id`'s last NACK reason in `group`.
    fn reason(&mut self, group: &str, id: u64) -> String {
        let out = self.call(Request::Peek { topic: "t", id });
        let Reply::Inspected(entries) = out else { panic!("peek") };
        let line = entries[0].groups.iter().find(|l| l.name == group).expect("the group's line");
        line.last_nack_reason.to_string()
    }

    /// A key of group `group`'s STATS section.
    fn stat(&mut self, group: &str, key: &str) -> Option<u64> {
        let out = self.call(Request::Stats { topic: "t" });
        let Reply::Stats(sections) = out else { panic!("stats") };
        let name = format!("t/{group}");
        let s = sections.iter().find(|s| s.0 == name).unwrap_or_else(|| panic!("no section {name}"));
        s.1.iter().find(|kv| kv.0 == key).map(|kv| kv.1)
    }

    /// Moves the clock to one ms before `at` and checks `group` gets
    /// nothing, then to `at` and returns what it gets: the wait ends at
    /// `at`, not a millisecond sooner.
    fn ready_at(&mut self, group: &str, at: u64) -> Vec<(u64, u16)> {
        self.tick_to(at - 1);
        assert_eq!(self.fetch(group, 0), [], "nothing ready 1 ms before {at}");
        self.tick_to(at);
        self.fetch(group, 0)
    }
}

fn error_code(r: &Reply<'_>) -> Option<ErrorCode> {
    match r {
        Reply::Error { code, .. } => ErrorCode::from_u8(*code),
        _ => None,
    }
}

/// Each NACK without a delay makes the message wait what the policy says
/// for its delivery count (exponential, capped, with jitter), and it comes
/// back when the wait ends, with its deliveries counted: seeded policies
/// against `RetryPolicy::wait_ms`, the model of the sequence.
#[test]
fn a_nack_without_a_delay_waits_as_the_policy_says() {
    for seed in seeds(4) {
        let test = "a_nack_without_a_delay_waits_as_the_policy_says";
        let _guard = SeedGuard { test, seed, replay: "cargo test --release --test retry" };
        println!("seed {seed}");
        let mut rng = Rng::new(seed);
        let dir = TempDir::new("retry-nack");
        let mut h = open(dir.path(), start(), 4);
        let initial = 1 + rng.below(500) as u32;
        let (multiplier, cap) = (rng.pick(&[100, 150, 200, 300]), initial * (1 + rng.below(20) as u32));
        let p = policy(initial, multiplier, cap, rng.pick(&[0, 20, 100]));
        assert_eq!(h.create("", Some(p), 0), None, "seed {seed}: {p:?}");
        let id = h.produce(1);
        let mut got = h.fetch("", 0);
        for deliveries in 1..5u16 {
            assert_eq!(got, [(id, deliveries)], "seed {seed}: {p:?}");
            h.nack("", id, 0);
            assert_eq!(h.stat("", "retry_waiting"), Some(1), "seed {seed}");
            assert_eq!(h.stat("", "delayed"), Some(1), "seed {seed}: a wait is counted in delayed");
            let wait = p.wait_ms(id, deliveries, GroupId::DEFAULT);
            got = if wait == 0 { h.fetch("", 0) } else { h.ready_at("", h.now.wall_ms + wait) };
        }
        assert_eq!(got, [(id, 5)], "seed {seed}");
    }
}

/// A passed ack deadline makes the message wait as a NACK does; a NACK
/// with a delay keeps its own delay; a message out of deliveries is
/// dead-lettered at once, with no wait.
#[test]
fn an_ack_timeout_waits_a_nack_delay_wins_and_the_last_delivery_dead_letters() {
    let dir = TempDir::new("retry-timeout");
    let mut h = open(dir.path(), start(), 4);
    assert_eq!(h.create("g", Some(policy(1000, 200, 60_000, 0)), 500), None);
    let id = h.produce(1);
    assert_eq!(h.fetch("g", 0), [(id, 1)]);
    // The deadline passes at +500: the wait of the first delivery is 1 s.
    h.tick_to(START_WALL_MS + 500);
    assert_eq!(h.stat("g", "retry_waiting"), Some(1));
    assert_eq!(h.ready_at("g", START_WALL_MS + 1_500), [(id, 2)]);
    // An explicit delay is kept, not the policy's 2 s.
    h.nack("g", id, 300);
    assert_eq!(h.stat("g", "retry_waiting"), Some(0), "a NACK delay is not a retry wait");
    assert_eq!(h.ready_at("g", h.now.wall_ms + 300), [(id, 3)]);
    h.nack("g", id, 0);
    assert_eq!(h.ready_at("g", h.now.wall_ms + 4_000), [(id, 4)]);
    h.nack("g", id, 0);
    assert_eq!(h.ready_at("g", h.now.wall_ms + 8_000), [(id, 5)]);
    // The fifth of max_deliveries 5: dead-lettered, no wait.
    h.nack("g", id, 0);
    assert_eq!(h.stat("g", "delayed"), Some(0));
    assert_eq!(h.stat("g", "dead_lettered"), Some(1));
}

/// A wait survives a restart (it ends at the same wall-clock time) and
/// compaction's restatement of the group; so do the policy and the NACK's
/// reason.
#[test]
fn a_retry_wait_survives_a_restart_and_compaction() {
    let dir = TempDir::new("retry-restart");
    let mut h = open(dir.path(), start(), 4);
    assert_eq!(h.create("", Some(policy(10_000, 100, 10_000, 0)), 0), None);
    let id = h.produce(1);
    assert_eq!(h.fetch("", 0), [(id, 1)]);
    h.nack_why("", id, 0, "flaky");
    drop(h);
    let mut h = open(dir.path(), Now { mono_ms: 1, wall_ms: START_WALL_MS + 5_000 }, 4);
    assert_eq!(h.stat("", "retry_waiting"), Some(1), "still waiting after the restart");
    assert_eq!(h.fetch("", 0), [], "not before the wait ends");
    // Enough traffic that compaction removes the segment of the Delay and
    // Group records: it restates both.
    for _ in 0..8 {
        let first = h.produce(50);
        let got = h.fetch("", 0);
        assert_eq!(got.len(), 50);
        let mut body = Vec::new();
        codec::encode_ids(&mut body, &(first..first + 50).collect::<Vec<_>>());
        h.call(Request::Ack { topic: "t", group: "", ids: Ids { bytes: &body } });
    }
    for _ in 0..400 {
        h.tick_to(h.now.wall_ms);
    }
    assert!(h.broker.compactions() > 0, "compaction ran");
    drop(h);
    let mut h = open(dir.path(), Now { mono_ms: 1, wall_ms: START_WALL_MS + 6_000 }, 4);
    assert_eq!(h.stat("", "retry_waiting"), Some(1), "still waiting after compaction and a restart");
    assert_eq!(h.stat("", "retry_initial_ms"), Some(10_000), "the policy is kept");
    assert_eq!(h.reason("", id), "flaky", "and the NACK's reason");
    assert_eq!(h.peek_state("", id), (State::Waiting as u8, START_WALL_MS + 10_000), "waiting until the wait ends");
    assert_eq!(h.ready_at("", START_WALL_MS + 10_000), [(id, 2)], "ready when the wait ends");
    // The policy still applies after the restarts.
    h.nack("", id, 0);
    assert_eq!(h.ready_at("", h.now.wall_ms + 10_000), [(id, 3)]);
}

/// A policy past `retry_delay_ms_max`, or one that makes no sense, is
/// BAD_ARGUMENT; a group without one returns a NACKed message at once.
#[test]
fn a_bad_policy_is_refused_and_no_policy_returns_a_message_at_once() {
    let dir = TempDir::new("retry-bad");
    let mut h = open(dir.path(), start(), 4);
    let day = Config::default().limits.retry_delay_ms_max;
    assert_eq!(h.create("a", Some(policy(100, 200, day + 1, 0)), 0), Some(ErrorCode::BadArgument));
    assert_eq!(h.create("a", Some(policy(0, 100, 0, 0)), 0), Some(ErrorCode::BadArgument));
    assert_eq!(h.create("a", Some(policy(100, 50, 1000, 0)), 0), Some(ErrorCode::BadArgument));
    assert_eq!(h.create("a", Some(policy(100, 200, day, 0)), 0), None);
    assert_eq!(h.create("plain", None, 0), None);
    let id = h.produce(1);
    assert_eq!(h.fetch("plain", 0), [(id, 1)]);
    h.nack("plain", id, 0);
    assert_eq!(h.fetch("plain", 0), [(id, 2)], "no policy: ready again at once");
    assert_eq!(h.stat("plain", "retry_initial_ms"), None, "no policy keys without a policy");
}

// ---------------------------------------------------------------------------
// Over the wire: a broker in a thread, the client, real time. Waits are
// checked from below only (a message is never back before its wait; how
// late it is depends on the machine).
// ---------------------------------------------------------------------------

fn connect(srv: &common::Server, version: u16) -> Client {
    let mut c = Client::connect_upto(srv.addr, b"", version).expect("connect");
    c.set_timeout(Some(Duration::from_secs(30))).expect("timeout");
    c
}

/// Group `g`'s messages now, or within `wait_ms`, taken with ack timeout
/// `ack_timeout_ms` (0: the topic's): (id, deliveries).
fn take(c: &mut Client, wait_ms: u32, ack_timeout_ms: u32) -> Vec<(u64, u16)> {
    let f = Fetch { max_messages: 10, wait_ms, ack_timeout_ms, ..Fetch::default() };
    let got = c.fetch_group("t", "g", f).expect("FETCH");
    got.iter().map(|m| (m.id, m.delivery_count)).collect()
}

/// A key of group `g`'s STATS section.
fn group_stat(c: &mut Client, key: &str) -> Option<u64> {
    let stats = c.stats(Some("t")).expect("STATS");
    let section = stats.iter().find(|s| s.0 == "t/g")?;
    section.1.iter().find(|kv| kv.0 == key).map(|kv| kv.1)
}

/// Over the wire: the policy is set and shown (LIST_GROUPS, STATS), a NACK
/// without a delay and a passed ack deadline each make the message wait
/// at least the policy's wait, and a version-3 session neither sees the
/// policy nor may set one, while its NACKs wait as the group says.
#[test]
fn over_the_wire_a_nack_and_an_ack_timeout_wait_and_older_sessions_are_unaffected() {
    let (srv, _dir) = common::Server::start(Config::default());
    let mut c = connect(&srv, 4);
    let p = policy(300, 200, 2_000, 0);
    let settings = GroupSettings { retry: Some(p), ..GroupSettings::default() };
    c.create_group("t", "g", settings, Start::Earliest).expect("CREATE_GROUP");
    let groups = c.list_groups("t").expect("LIST_GROUPS");
    assert_eq!(groups.iter().find(|g| g.name == "g").map(|g| g.retry), Some(Some(p)), "{groups:?}");
    assert_eq!(group_stat(&mut c, "retry_cap_ms"), Some(2_000));
    let id = c.produce("t", b"job").expect("PRODUCE");
    assert_eq!(take(&mut c, 0, 0), [(id, 1)]);
    let nacked = Instant::now();
    c.nack_group("t", "g", &[id], 0, false).expect("NACK");
    assert_eq!(take(&mut c, 0, 0), [], "waiting for retry, not ready at once");
    assert_eq!(group_stat(&mut c, "retry_waiting"), Some(1));
    // Taken with an ack deadline of 100 ms, which passes: then the second
    // wait, 600 ms.
    assert_eq!(take(&mut c, 20_000, 100), [(id, 2)]);
    assert!(nacked.elapsed() >= Duration::from_millis(300), "back after {:?}", nacked.elapsed());
    let fetched = Instant::now();
    assert_eq!(take(&mut c, 20_000, 0), [(id, 3)]);
    assert!(fetched.elapsed() >= Duration::from_millis(700), "back after {:?}", fetched.elapsed());
    let mut v3 = connect(&srv, 3);
    let groups = v3.list_groups("t").expect("LIST_GROUPS v3");
    assert!(groups.iter().any(|g| g.name == "g" && g.retry.is_none()), "a version-3 session sees no policy");
    let f = Fetch { max_messages: 10, wait_ms: 20_000, ..Fetch::default() };
    c.nack_group("t", "g", &[id], 0, false).expect("NACK");
    let got = v3.fetch_group("t", "g", f).expect("FETCH v3");
    assert_eq!(got.iter().map(|m| (m.id, m.delivery_count)).collect::<Vec<_>>(), [(id, 4)]);
    v3.nack_group("t", "g", &[id], 0, false).expect("NACK v3");
    assert_eq!(take(&mut c, 0, 0), [], "a version-3 NACK waits as the group says");
    let refused = v3.create_group("t", "h", settings, Start::Earliest);
    assert!(refused.is_err(), "a version-3 session cannot set a policy: {refused:?}");
}

/// A NACK's reason is kept with the message (PEEK shows it), survives a
/// restart, and goes into the dead letter when a later NACK dead-letters
/// the message (property 7 of the copy, and the origin's dead-lettered
/// line, which a restart rebuilds from the copy). A reason over `nack_reason_bytes_max` is BAD_ARGUMENT; a
/// version-3 session cannot give one.
#[test]
fn a_nack_reason_is_kept_across_a_restart_and_carried_into_the_dead_letter() {
    let dir = TempDir::new("nack-reason");
    let srv = common::Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut c = connect(&srv, 4);
    let settings = GroupSettings { max_deliveries: 2, ..GroupSettings::default() };
    c.create_group("t", "g", settings, Start::Earliest).expect("CREATE_GROUP");
    // A second group keeps the message held after g dead-letters it, so
    // that PEEK still finds it.
    c.create_group("t", "h", GroupSettings::default(), Start::Earliest).expect("CREATE_GROUP");
    let id = c.produce("t", b"job").expect("PRODUCE");
    assert_eq!(take(&mut c, 0, 0), [(id, 1)]);
    let long = "x".repeat(Config::default().limits.nack_reason_bytes_max as usize + 1);
    let refused = c.nack_why("t", "g", &[id], (0, false), &long);
    assert_eq!(refused.as_ref().err().and_then(|e| e.code()), Some(ErrorCode::BadArgument), "{refused:?}");
    c.nack_why("t", "g", &[id], (0, false), "db timeout").expect("NACK with a reason");
    let reason_in_g = |c: &mut Client| {
        let i = c.peek("t", id).expect("PEEK");
        i.groups.iter().find(|l| l.group == "g").map(|l| l.last_nack_reason.clone())
    };
    assert_eq!(reason_in_g(&mut c).as_deref(), Some("db timeout"));
    srv.stop();
    let srv = common::Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut c = connect(&srv, 4);
    assert_eq!(reason_in_g(&mut c).as_deref(), Some("db timeout"), "kept across a restart");
    assert_eq!(take(&mut c, 0, 0), [(id, 2)]);
    c.nack_why("t", "g", &[id], (0, false), "still down").expect("NACK");
    let dead = c.fetch("t.dlq", Fetch { max_messages: 10, ..Fetch::default() }).expect("FETCH t.dlq");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].last_nack_reason(), Some("still down"), "property 7 of the dead letter");
    let i = c.peek("t", id).expect("PEEK");
    let line = i.groups.iter().find(|l| l.group == "g").expect("line of g");
    assert_eq!((line.state, line.last_nack_reason.as_str()), (State::DeadLettered, "still down"));
    srv.stop();
    // The dead note is rebuilt at the restart from the dead letter that
    // t.dlq holds (it is not consumed: the FETCH above did not ack it).
    let srv = common::Server::start_in(Config::default(), LogOptions::default(), dir.path());
    let mut c = connect(&srv, 4);
    let i = c.peek("t", id).expect("PEEK");
    let line = i.groups.iter().find(|l| l.group == "g").expect("line of g");
    let got = (line.state, line.deliveries, line.last_nack_reason.as_str());
    assert_eq!(got, (State::DeadLettered, 2, "still down"), "after a restart: {line:?}");
    let mut v3 = connect(&srv, 3);
    let old = v3.nack_why("t", "g", &[id], (0, false), "why");
    assert!(matches!(old, Err(runnel::client::Error::Version { .. })), "{old:?}");
    srv.stop();
}

/// CREATE_TOPIC `t` with `max_deliveries` (the default group's).
fn set_max_deliveries(h: &mut Harness, max_deliveries: u16) {
    let settings = TopicSettings { ack_timeout_ms: 0, max_deliveries };
    let out = h.call(Request::CreateTopic { topic: "t", settings, options: TopicOptions::default() });
    assert!(matches!(out, Reply::Created { .. }), "{out:?}");
}

/// Produces two messages and lets both deliveries of each time out, the
/// second message acked in between: the first is back in the group with
/// two deliveries, and the acked second takes the group's cursor past it
/// (so a restart brings it back for retry). Returns the first's id.
fn requeued_after_two_deliveries(h: &mut Harness) -> u64 {
    let id = h.produce(2);
    for delivery in 1..=2 {
        assert_eq!(h.fetch("", 10), vec![(id, delivery), (id + 1, delivery)]);
        if delivery == 2 {
            let mut body = Vec::new();
            codec::encode_ids(&mut body, &[id + 1]);
            h.call(Request::Ack { topic: "t", group: "", ids: Ids { bytes: &body } });
        }
        let wall = h.now.wall_ms;
        h.tick_to(wall + 20);
    }
    id
}

/// A message requeued after its second delivery, whose topic then lowers
/// `max_deliveries` to 2, is delivered once more, in memory and after a
/// restart alike: a restart dead-letters only a message whose last
/// allowed delivery the crash cut, not one that was back in its group
/// (found by the `stream` fuzzer, whose restart check saw the topic lose
/// it to the dead-letter topic).
#[test]
fn a_lowered_max_deliveries_gives_a_requeued_message_its_next_delivery_across_a_restart() {
    for restart in [false, true] {
        let dir = TempDir::new("lowered-max");
        let mut h = open(dir.path(), start(), codec::V4);
        set_max_deliveries(&mut h, 3);
        let id = requeued_after_two_deliveries(&mut h);
        set_max_deliveries(&mut h, 2);
        if restart {
            let now = Now { mono_ms: h.now.mono_ms + 1, wall_ms: h.now.wall_ms + 1 };
            drop(h);
            h = open(dir.path(), now, codec::V4);
        }
        assert_eq!(h.fetch("", 10), vec![(id, 3)], "restart {restart}: its third delivery");
        let wall = h.now.wall_ms;
        h.tick_to(wall + 20);
        let dead =
            Request::Fetch { topic: "t.dlq", group: "", max_messages: 10, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
        let Reply::Messages { messages, .. } = h.call(dead) else { panic!("fetch t.dlq") };
        assert_eq!(messages.len(), 1, "restart {restart}: dead-lettered once its third delivery failed");
    }
}

/// As above, for a message its consumer's disconnect returned: the
/// return is logged, so a restart does not take its last Deliver record
/// for a delivery the crash cut.
#[test]
fn a_lowered_max_deliveries_gives_a_message_a_disconnect_returned_its_next_delivery_across_a_restart() {
    for restart in [false, true] {
        let dir = TempDir::new("lowered-max-disconnect");
        let mut h = open(dir.path(), start(), codec::V4);
        set_max_deliveries(&mut h, 3);
        let id = h.produce(2);
        assert_eq!(h.fetch("", 60_000), vec![(id, 1), (id + 1, 1)], "restart {restart}");
        let mut body = Vec::new();
        codec::encode_ids(&mut body, &[id + 1]);
        h.call(Request::Ack { topic: "t", group: "", ids: Ids { bytes: &body } });
        h.reconnect();
        set_max_deliveries(&mut h, 1);
        if restart {
            let now = Now { mono_ms: h.now.mono_ms + 1, wall_ms: h.now.wall_ms + 1 };
            drop(h);
            h = open(dir.path(), now, codec::V4);
        }
        assert_eq!(h.fetch("", 10), vec![(id, 2)], "restart {restart}: its second delivery");
    }
}

/// As above, for a message requeued before compaction restated its group
/// and removed the Requeue record: the restatement says which messages
/// are back in the group and not in flight.
#[test]
fn a_lowered_max_deliveries_gives_a_requeued_message_its_next_delivery_after_compaction() {
    let dir = TempDir::new("lowered-max-compaction");
    let mut h = open(dir.path(), start(), codec::V4);
    set_max_deliveries(&mut h, 3);
    let id = requeued_after_two_deliveries(&mut h);
    set_max_deliveries(&mut h, 2);
    // Enough traffic, on a topic of its own, that compaction removes the
    // segments of the Requeue records and restates the group.
    let compactions = h.broker.compactions();
    while h.broker.compactions() < compactions + 4 {
        let mut bytes = Vec::new();
        for _ in 0..50 {
            codec::encode_message(&mut bytes, &Props::EMPTY, &PAYLOAD);
        }
        let batch = Batch { count: 50, bytes: &bytes, with_props: true };
        assert!(matches!(h.call(Request::Produce { topic: "other", flags: 0, batch }), Reply::Produced { .. }));
        h.ack_all("other");
        for _ in 0..70 {
            h.tick_to(h.now.wall_ms);
        }
    }
    let now = Now { mono_ms: h.now.mono_ms + 1, wall_ms: h.now.wall_ms + 1 };
    drop(h);
    let mut h = open(dir.path(), now, codec::V4);
    assert_eq!(h.fetch("", 10), vec![(id, 3)], "its third delivery, after compaction and a restart");
}
