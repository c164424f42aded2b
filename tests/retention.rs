//! Retention and replay (protocol version 4), in process, on a clock the
//! test moves: the settings and their limits, what STATS shows, compaction
//! keeping the segments a retaining topic still needs and removing them
//! once expired, by age and by size, and groups reading retained messages
//! back from the files (from the earliest, an id or a time, within their
//! bounds per turn and in memory, across a restart) (docs/protocol.md, "Retention and replay
//! (version 4)"). The broker is driven as the reactor drives it, with
//! `Now` chosen by the test, so nothing here sleeps.

mod common;

use std::path::Path;

use common::Outs;
use common::TempDir;
use common::clocked::{Harness, SEGMENT_BYTES_MAX, START_WALL_MS, start};
use runnel::broker::{Broker, Config, ConnKey, LoopStats, Now, Outcome};
use runnel::codec::group::{GroupSettings, Start};
use runnel::codec::{self, Batch, Decoded, ErrorCode, Frame, Ids, Props, PropsLimits, Reply, Request, props};
use runnel::codec::{TopicOptions, TopicSettings};
use runnel::log::LogOptions;
use runnel::testkit::{Rng, SeedGuard, seeds};

const PAYLOAD_BYTES: usize = 200;

/// A broker on a test clock at `now`, with one version-4 session.
fn open_at(dir: &Path, now: Now) -> Harness {
    Harness::open(dir, now, Config::default(), codec::V4)
}

impl Harness {
    /// Moves the clock on by `ms` and runs `turns` turns with no request.
    fn tick(&mut self, ms: u64, turns: u32) {
        self.now = Now { mono_ms: self.now.mono_ms + ms, wall_ms: self.now.wall_ms + ms };
        for _ in 0..turns {
            let mut outs = Outs::default();
            self.broker.advance(self.now, &mut outs);
            self.broker.commit(self.now, &mut outs);
        }
    }

    fn create(
        &mut self,
        topic: &'static str,
        retention_ms: Option<u64>,
        retention_bytes: Option<u64>,
    ) -> Reply<'static> {
        let options = TopicOptions { retention_ms, retention_bytes, ..TopicOptions::default() };
        self.call(Request::CreateTopic { topic, settings: TopicSettings::default(), options })
    }

    /// Produces `n` messages to `topic`, one PRODUCE each.
    fn produce(&mut self, topic: &'static str, n: usize) {
        for _ in 0..n {
            let mut bytes = Vec::new();
            codec::encode_message(
                &mut bytes,
                &Props::parse(&[], codec::V4, &PropsLimits::ANY).expect("empty"),
                &[b'm'; PAYLOAD_BYTES],
            );
            let batch = Batch { count: 1, bytes: &bytes, with_props: true };
            let reply = self.call(Request::Produce { topic, flags: 0, batch });
            assert!(matches!(reply, Reply::Produced { count: 1, .. }), "{reply:?}");
        }
    }

    fn stat(&mut self, section: &str, key: &str) -> u64 {
        let Reply::Stats(sections) = self.call(Request::Stats { topic: "" }) else { panic!("stats") };
        let s = sections.into_iter().find(|s| s.0 == section).map(|s| s.1).unwrap_or_default();
        s.iter().find(|kv| kv.0 == key).map(|kv| kv.1).unwrap_or_else(|| panic!("no key {key} in {section:?}"))
    }
}

fn code(reply: Reply<'_>) -> Option<ErrorCode> {
    match reply {
        Reply::Error { code, .. } => ErrorCode::from_u8(code),
        _ => None,
    }
}

#[test]
fn the_settings_are_kept_across_a_restart_and_held_to_their_limits() {
    let dir = TempDir::new("retention-settings");
    let mut h = open_at(dir.path(), start());
    assert!(matches!(h.create("r", Some(60_000), None), Reply::Created { created: true }));
    assert!(matches!(h.create("r", None, Some(1 << 20)), Reply::Created { created: false }));
    assert_eq!(h.stat("r", "retention_ms"), 60_000, "a bound the request does not name stays");
    assert_eq!(h.stat("r", "retention_bytes"), 1 << 20);
    let max = runnel::limits::Limits::default();
    assert_eq!(code(h.create("x", Some(max.retention_ms_max + 1), None)), Some(ErrorCode::BadArgument));
    assert_eq!(code(h.create("x", None, Some(max.retention_bytes_max + 1))), Some(ErrorCode::BadArgument));
    h.create("plain", None, None);
    assert_eq!(h.stat("plain", "retention_ms"), 0, "off by default");
    drop(h);
    let mut h = open_at(dir.path(), start());
    assert_eq!(h.stat("r", "retention_ms"), 60_000, "the settings are in the Topic record");
    assert_eq!(h.stat("r", "retention_bytes"), 1 << 20);
    assert!(matches!(h.create("r", Some(0), Some(0)), Reply::Created { created: false }));
    assert_eq!(h.stat("r", "retention_ms"), 0, "0 turns it off");
}

#[test]
fn a_memory_only_broker_refuses_retention() {
    let mut h = Harness::over(Broker::in_memory(Config::default(), start()), start(), codec::V4);
    assert_eq!(code(h.create("r", Some(60_000), None)), Some(ErrorCode::BadArgument));
    assert_eq!(code(h.create("r", None, Some(1))), Some(ErrorCode::BadArgument));
    assert!(matches!(h.create("r", Some(0), None), Reply::Created { created: true }), "off is fine");
}

/// Produces and acks enough of `topic` to fill several segments, then runs
/// turns enough for compaction to look more than once.
fn fill_and_ack(h: &mut Harness, topic: &'static str) {
    h.produce(topic, 300);
    assert_eq!(h.ack_all(topic), 300);
    h.tick(1, 300);
}

#[test]
fn compaction_keeps_what_age_retains_and_removes_it_once_expired() {
    let dir = TempDir::new("retention-age");
    let mut h = open_at(dir.path(), start());
    h.create("r", Some(60_000), None);
    fill_and_ack(&mut h, "r");
    let segments = h.stat("", "log_segments");
    assert!(segments >= 5, "{segments} segments");
    assert_eq!(h.stat("", "compactions"), 0, "every segment holds retained messages");
    assert_eq!(h.stat("r", "retained_oldest_id"), 1);
    let retained = h.stat("r", "retained_bytes");
    assert!(retained >= 300 * PAYLOAD_BYTES as u64, "{retained} bytes retained");
    // The same after a restart: recovery finds what the files hold.
    drop(h);
    let mut h = open_at(dir.path(), Now { mono_ms: 1, wall_ms: START_WALL_MS + 1000 });
    h.tick(1, 300);
    assert_eq!(h.stat("", "compactions"), 0, "kept after a restart");
    assert_eq!(h.stat("r", "retained_oldest_id"), 1);
    h.tick(60_000, 300);
    let (c, s) = (h.stat("", "compactions"), h.stat("", "log_segments"));
    assert!(c > 0 && s < segments, "expired segments go: {c} compacted, {s} of {segments} left");
    assert!(h.stat("r", "retained_oldest_id") > 1, "the oldest retained message moved on");
    let left = h.stat("r", "retained_bytes");
    assert!(left < retained / 2, "{left} of {retained} bytes retained");
}

#[test]
fn compaction_keeps_what_size_retains_counted_from_the_newest() {
    let dir = TempDir::new("retention-bytes");
    let mut h = open_at(dir.path(), start());
    let bound = 3 * SEGMENT_BYTES_MAX;
    h.create("r", None, Some(bound));
    fill_and_ack(&mut h, "r");
    h.tick(1_000_000, 300);
    let retained = h.stat("r", "retained_bytes");
    assert!(retained >= bound, "{retained} bytes: at least the bound is kept");
    assert!(retained < bound + 2 * SEGMENT_BYTES_MAX, "{retained} bytes: no more than the bound and a segment");
    assert!(h.stat("", "compactions") > 0);
    assert!(h.stat("r", "retained_oldest_id") > 1);
}

#[test]
fn a_topic_without_retention_is_compacted_as_before() {
    let dir = TempDir::new("retention-off");
    let mut h = open_at(dir.path(), start());
    h.create("r", Some(60_000), None);
    h.create("plain", None, None);
    fill_and_ack(&mut h, "plain");
    assert!(h.stat("", "compactions") > 0, "the acked segments of a topic that retains nothing go");
    assert_eq!(h.stat("plain", "retained_oldest_id"), 0);
    assert_eq!(h.stat("plain", "retained_bytes"), 0);
}

// ---------------------------------------------------------------------------
// Replay from the files.
// ---------------------------------------------------------------------------

/// A message as a replaying group received it: id, tags, header, payload.
type Got = (u64, Vec<String>, Vec<u8>);

impl Harness {
    /// Produces `n` messages to `topic`, each with a tag and a header
    /// naming its number from `from`, one PRODUCE each.
    fn produce_marked(&mut self, topic: &'static str, from: usize, n: usize) {
        for k in from..from + n {
            let bytes = marked(k);
            let batch = Batch { count: 1, bytes: &bytes, with_props: true };
            let reply = self.call(Request::Produce { topic, flags: 0, batch });
            assert!(matches!(reply, Reply::Produced { count: 1, .. }), "{reply:?}");
        }
    }

    /// Produces marked messages in one turn, one PRODUCE each, as a loop
    /// turn serves pipelined connections: `(topic, k)` for each.
    fn produce_marked_in_one_turn(&mut self, plan: &[(&'static str, usize)]) {
        let mut out = Vec::new();
        let mut outs = Outs::default();
        for &(topic, k) in plan {
            let bytes = marked(k);
            let batch = Batch { count: 1, bytes: &bytes, with_props: true };
            self.rid += 1;
            let frame = Frame { request_id: self.rid, request: Request::Produce { topic, flags: 0, batch } };
            let outcome =
                self.broker.handle(ConnKey(0), &mut self.session, &frame, self.now, &LoopStats::default(), &mut out);
            assert_eq!(outcome, Outcome::Held, "a durable produce waits for the sync");
        }
        self.broker.advance(self.now, &mut outs);
        self.broker.commit(self.now, &mut outs);
        let mut replies = outs.0.first().map_or(&[][..], Vec::as_slice);
        for _ in plan {
            let Ok(Decoded::Frame(f, n)) = codec::decode_reply(replies, usize::MAX) else { panic!("a reply each") };
            assert!(matches!(f.reply, Reply::Produced { count: 1, .. }), "{:?}", f.reply);
            replies = &replies[n..];
        }
    }

    /// Fetches one message of `source`'s default group and acks it with an
    /// ACK_PRODUCE whose one output to `topic` is marked message `k`, as
    /// `produce_marked` marks them.
    fn ack_produce_marked(&mut self, source: &'static str, topic: &'static str, k: usize) {
        let fetch =
            Request::Fetch { topic: source, group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
        let Reply::Messages { messages, .. } = self.call(fetch) else { panic!("fetch") };
        let mut acked = Vec::new();
        codec::encode_ids(&mut acked, &[messages[0].id]);
        let bytes = marked(k);
        let mut outputs = Vec::new();
        let batch = Batch { count: 1, bytes: &bytes, with_props: true };
        codec::ack_produce::encode_output(&mut outputs, topic, &batch);
        let outputs = codec::ack_produce::Outputs { count: 1, bytes: &outputs };
        let reply = self.call(Request::AckProduce { topic: source, group: "", ids: Ids { bytes: &acked }, outputs });
        assert!(matches!(reply, Reply::AckProduced { done: 1, .. }), "{reply:?}");
    }

    fn create_group(&mut self, topic: &'static str, group: &'static str, start: Start) -> u64 {
        let settings = GroupSettings::default();
        match self.call(Request::CreateGroup { topic, group, settings, start }) {
            Reply::GroupCreated { cursor, .. } => cursor,
            other => panic!("create group: {other:?}"),
        }
    }

    /// Fetches group `group` of `topic` (running turns between FETCHes, so
    /// the replay reads on), acking `ack` of every `ack_every` received,
    /// until `n` messages came.
    fn receive(&mut self, topic: &'static str, group: &'static str, n: usize) -> Vec<Got> {
        let (mut got, mut idle): (Vec<Got>, u32) = (Vec::new(), 0);
        // A safety net: a replay that stops delivering ends the loop.
        while got.len() < n && idle < 300 {
            let fetch = Request::Fetch { topic, group, max_messages: 50, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
            let Reply::Messages { messages, .. } = self.call(fetch) else { panic!("fetch") };
            let ids: Vec<u64> = messages.iter().map(|m| m.id).collect();
            idle = if ids.is_empty() { idle + 1 } else { 0 };
            for m in &messages {
                let tags = m.props.tags().map(str::to_string).collect();
                let header = m.props.headers().next().map(|h| h.1.to_vec()).unwrap_or_default();
                assert_eq!(m.payload, payload_of(&header).as_slice(), "message {}: its payload", m.id);
                got.push((m.id, tags, header));
            }
            if !ids.is_empty() {
                let mut body = Vec::new();
                codec::encode_ids(&mut body, &ids);
                let ack = self.call(Request::Ack { topic, group, ids: Ids { bytes: &body } });
                assert!(matches!(ack, Reply::Ids { failed, .. } if failed.is_empty()));
            }
            self.tick(1, 1);
        }
        got
    }
}

/// Message `k` as a batch holds it: a tag and a header naming its number,
/// and its payload.
fn marked(k: usize) -> Vec<u8> {
    let mut blob = Vec::new();
    props::put_tag(&mut blob, &format!("t{}", k % 3));
    props::put_header(&mut blob, "k", k.to_string().as_bytes());
    let p = Props::parse(&blob, codec::V4, &PropsLimits::ANY).expect("valid");
    let mut bytes = Vec::new();
    codec::encode_message(&mut bytes, &p, &payload(k));
    bytes
}

fn payload(k: usize) -> Vec<u8> {
    format!("payload {k} ").repeat(20).into_bytes()
}

fn payload_of(header: &[u8]) -> Vec<u8> {
    payload(std::str::from_utf8(header).expect("utf-8").parse().expect("a number"))
}

/// What message `id` holds as `produce_marked` made it (message `id - 1`).
fn got_of(id: u64) -> Got {
    let k = id as usize - 1;
    (id, vec![format!("t{}", k % 3)], k.to_string().into_bytes())
}

/// What `produce_marked(from, n)` produced, with ids from `first_id`.
fn expected(first_id: u64, from: usize, n: usize) -> Vec<Got> {
    (0..n)
        .map(|i| (first_id + i as u64, vec![format!("t{}", (from + i) % 3)], (from + i).to_string().into_bytes()))
        .collect()
}

/// A retaining topic whose 300 messages were all acked and left memory.
fn replayable(dir: &Path) -> Harness {
    let mut h = open_at(dir, start());
    h.create("r", Some(3_600_000), None);
    h.produce_marked("r", 0, 300);
    assert_eq!(h.ack_all("r"), 300);
    h.tick(1, 100);
    assert_eq!(h.stat("r", "bytes"), 0, "every message left memory");
    h
}

#[test]
fn a_group_created_at_earliest_replays_every_retained_message_in_order() {
    let dir = TempDir::new("replay-earliest");
    let mut h = replayable(dir.path());
    assert_eq!(h.create_group("r", "late", Start::Earliest), 1, "earliest is the oldest retained");
    let got = h.receive("r", "late", 300);
    assert_eq!(got, expected(1, 0, 300), "every message once, in order, with its tags and header");
    h.tick(1, 10);
    assert_eq!(h.stat("r", "bytes"), 0, "acked replayed messages leave memory again");
    assert!(h.stat("", "replay_read_bytes") > 300 * 240, "served from the files");
    // New messages follow the replay.
    h.produce_marked("r", 300, 5);
    assert_eq!(h.receive("r", "late", 5), expected(301, 300, 5));
}

#[test]
fn a_group_created_or_reset_at_an_id_or_a_time_replays_from_there() {
    let dir = TempDir::new("replay-id-time");
    let mut h = open_at(dir.path(), start());
    h.create("r", Some(3_600_000), None);
    h.produce_marked("r", 0, 150);
    h.tick(10_000, 1);
    let second_ms = h.now.wall_ms;
    h.produce_marked("r", 150, 150);
    assert_eq!(h.ack_all("r"), 300);
    h.tick(1, 100);
    assert_eq!(h.create_group("r", "at-id", Start::Id(101)), 101);
    assert_eq!(h.receive("r", "at-id", 200), expected(101, 100, 200));
    h.create_group("r", "at-time", Start::Time(second_ms));
    assert_eq!(h.receive("r", "at-time", 150), expected(151, 150, 150), "the messages born at or after the time");
    let reset = h.call(Request::ResetGroup { topic: "r", group: "at-id", start: Start::Id(299) });
    assert!(matches!(reset, Reply::Cursor(299)), "{reset:?}");
    assert_eq!(h.receive("r", "at-id", 2), expected(299, 298, 2));
}

/// A broker with the limits `set` gives, a retaining topic of 300 acked
/// messages, and a group just created at the earliest: its replay begins
/// at the next turn.
fn replaying(dir: &Path, set: impl FnOnce(&mut runnel::limits::Limits)) -> Harness {
    let mut config = Config::default();
    set(&mut config.limits);
    let mut h = Harness::open(dir, start(), config, codec::V4);
    h.create("r", None, Some(1 << 30));
    h.produce_marked("r", 0, 300);
    assert_eq!(h.ack_all("r"), 300);
    h.create_group("r", "late", Start::Earliest);
    h
}

#[test]
fn a_replay_keeps_a_bounded_window_in_memory_and_reads_a_bounded_amount_a_turn() {
    let dir = TempDir::new("replay-bounded");
    let mut h = replaying(dir.path(), |l| {
        l.replay_read_bytes_per_turn = 2048;
        l.replay_window_messages_max = 20;
    });
    h.tick(0, 200);
    let held = h.stat("r", "bytes");
    assert!(held <= 20 * 300, "{held} bytes held ahead of a group that fetches nothing");
    assert_eq!(h.receive("r", "late", 300), expected(1, 0, 300));
    let most = h.stat("", "replay_turn_bytes_max");
    // A Produce record of one message here is some 300 bytes.
    assert!(most <= 2048 + 400, "{most} bytes read in one turn");
}

/// Replays under way together share one turn's budget: a turn reads at
/// most `replay_read_bytes_per_turn` of the files over all of them, a
/// record that does not fit in what is left waiting for the next turn
/// (only the first record of a turn may be larger, and none is here), and
/// each replay still gets every message, in order.
#[test]
fn replays_together_read_no_more_than_the_budget_of_a_turn() {
    let dir = TempDir::new("replay-shared-budget");
    let mut h = replaying(dir.path(), |l| {
        l.replay_read_bytes_per_turn = 4096;
        l.replay_read_bytes_per_sec = 0;
    });
    h.create_group("r", "later", Start::Earliest);
    let largest = common::logdir::segments(dir.path())
        .iter()
        .flat_map(|p| common::logdir::records(&std::fs::read(p).expect("read segment")))
        .map(|r| r.end - r.start)
        .max()
        .expect("records");
    assert!(largest < 4096, "every record fits in the budget ({largest} bytes)");
    assert_eq!(h.receive("r", "late", 300), expected(1, 0, 300));
    assert_eq!(h.receive("r", "later", 300), expected(1, 0, 300));
    let most = h.stat("", "replay_turn_bytes_max");
    assert!(most <= 4096, "{most} bytes read in one turn by two replays");
}

/// A replay paced at `rate` bytes a second with `per_turn` bytes a turn:
/// after the first read, the bytes read over `ms` milliseconds (in turns
/// of 1 ms), checked at every step against the rate.
fn paced_reads(dir: &Path, rate: u64, per_turn: u64, ms: u64) -> (u64, u64) {
    let mut h = replaying(dir, |l| {
        l.replay_read_bytes_per_turn = per_turn;
        l.replay_read_bytes_per_sec = rate;
    });
    // Many turns with no time passing: one turn's read at most when paced.
    h.tick(0, 50);
    let first = h.stat("", "replay_read_bytes");
    let turn_max = h.stat("", "replay_turn_bytes_max");
    if rate > 0 {
        // Waiting for its pace, the replay lets the loop sleep until then.
        let wake = h.broker.next_deadline_ms();
        assert!(wake.is_some_and(|d| d > h.now.mono_ms), "wake at {wake:?}, now {}", h.now.mono_ms);
        assert!(!h.broker.busy(), "a paced replay between its reads keeps the loop busy");
    }
    for t in 1..=ms {
        h.tick(1, 1);
        let read = h.stat("", "replay_read_bytes");
        if rate > 0 {
            // What the rate allows since the first read, and one turn's
            // read (a record larger than the budget is read whole).
            let allowed = first + rate * t / 1000 + turn_max;
            assert!(read <= allowed, "{read} bytes read after {t} ms at {rate} B/s (first read {first})");
        }
    }
    (first, h.stat("", "replay_read_bytes"))
}

#[test]
fn a_paced_replay_reads_no_faster_than_its_rate_and_finishes() {
    let paced = TempDir::new("replay-paced");
    // 20 KiB/s, 2 KiB a turn: a read every 100 ms or so.
    let (first, after_1s) = paced_reads(paced.path(), 20_480, 2048, 1000);
    assert!(first <= 2048 + 400, "{first} bytes in the first turns with no time passing");
    assert!(after_1s > first, "the replay went on as time passed ({after_1s} bytes after 1 s)");
    let unpaced = TempDir::new("replay-unpaced");
    let (first_unpaced, _) = paced_reads(unpaced.path(), 0, 2048, 0);
    assert!(first_unpaced > 10 * 2048, "unpaced, every turn reads ({first_unpaced} bytes in 50 turns)");
    // Paced, the replay still delivers everything in order.
    let dir = TempDir::new("replay-paced-all");
    let mut h = replaying(dir.path(), |l| {
        l.replay_read_bytes_per_turn = 2048;
        l.replay_read_bytes_per_sec = 1 << 20;
    });
    assert_eq!(h.receive("r", "late", 300), expected(1, 0, 300));
}

#[test]
fn a_restart_during_a_replay_resumes_it() {
    let dir = TempDir::new("replay-restart");
    let mut h = replayable(dir.path());
    h.create_group("r", "late", Start::Earliest);
    let first = h.receive("r", "late", 120);
    assert_eq!(first, expected(1, 0, first.len()));
    let seen = first.len();
    // Ten more fetched and not acked: in flight at the crash.
    let fetch =
        Request::Fetch { topic: "r", group: "late", max_messages: 10, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
    let Reply::Messages { messages, .. } = h.call(fetch) else { panic!("fetch") };
    assert_eq!(messages.first().map(|m| m.id), Some(1 + seen as u64));
    drop(h);
    let mut h = open_at(dir.path(), Now { mono_ms: 1, wall_ms: START_WALL_MS + 5000 });
    let rest = h.receive("r", "late", 300 - seen);
    assert_eq!(rest, expected(1 + seen as u64, seen, 300 - seen), "the rest, those in flight again, none acked before");
}

/// Messages an ACK_PRODUCE stored in a retaining topic are retained and
/// replayed as produced ones are, before and after a restart (which
/// rebuilds the index of the files from the log).
#[test]
fn what_an_ack_produce_stored_is_replayed_too() {
    let dir = TempDir::new("replay-ack-produce");
    let mut h = open_at(dir.path(), start());
    h.create("r", Some(3_600_000), None);
    h.create("src", None, None);
    h.produce("src", 100);
    for k in 0..200 {
        match k % 2 {
            0 => h.produce_marked("r", k, 1),
            _ => h.ack_produce_marked("src", "r", k),
        }
    }
    assert_eq!(h.ack_all("r"), 200);
    h.tick(1, 100);
    assert_eq!(h.stat("r", "bytes"), 0, "every message left memory");
    h.create_group("r", "late", Start::Earliest);
    assert_eq!(h.receive("r", "late", 200), expected(1, 0, 200), "the outputs among the produced, in order");
    assert_eq!(replayed_after_restart(h, dir.path(), 200), expected(1, 0, 200), "after a restart too");
}

#[test]
fn a_topic_without_retention_replays_nothing() {
    let dir = TempDir::new("replay-off");
    let mut h = open_at(dir.path(), start());
    h.create("plain", None, None);
    h.produce_marked("plain", 0, 50);
    assert_eq!(h.ack_all("plain"), 50);
    assert_eq!(h.create_group("plain", "late", Start::Earliest), 51, "earliest is the next message");
    assert!(h.receive("plain", "late", 1).is_empty());
    assert_eq!(h.stat("", "replay_read_bytes"), 0);
}

/// The files index a topic's records sparsely (an entry a megabyte and a
/// segment), noting a turn's runs of records of one topic at once: a
/// group started at any id of a long log, written many produces a turn
/// with another topic's between them, gets exactly the messages from
/// there, read back from the files.
#[test]
fn a_replay_from_any_id_of_a_long_log_written_many_produces_a_turn_starts_there() {
    let dir = TempDir::new("replay-runs");
    let log = LogOptions { segment_bytes_max: 64 << 20, ..LogOptions::default() };
    let broker = Broker::open(Config::default(), dir.path(), log, start()).expect("open");
    let mut h = Harness::over(broker, start(), codec::V4);
    h.create("r", Some(3_600_000), None);
    h.create("o", Some(3_600_000), None);
    // 12,000 messages of about 260 B: three megabytes, so several index
    // entries within one segment.
    let (turns, per_turn) = (60, 200);
    for t in 0..turns {
        let mut plan: Vec<(&'static str, usize)> = (0..per_turn).map(|i| ("r", t * per_turn + i)).collect();
        plan.insert(per_turn / 2, ("o", t));
        h.produce_marked_in_one_turn(&plan);
    }
    let n = turns * per_turn;
    assert_eq!(h.ack_all("r"), n);
    h.tick(1, 10);
    assert_eq!(h.stat("r", "bytes"), 0, "every message left memory");
    // Each group's replay keeps its window of messages in memory, so the
    // later groups start among messages held for the earlier ones.
    for (g, from) in [("g0", 0), ("g1", 1), ("g2", 4_037), ("g3", 4_100), ("g4", 8_191), ("g5", n - 3)] {
        assert_eq!(h.create_group("r", g, Start::Id(from as u64 + 1)), from as u64 + 1);
        let mut got = h.receive("r", g, 3);
        got.truncate(3);
        assert_eq!(got, expected(from as u64 + 1, from, 3), "group {g} from id {}", from + 1);
    }
    assert!(h.stat("", "replay_read_bytes") > 0, "served from the files");
}

/// Produces 300 marked messages to retaining topic `r` and acks all of
/// them in its default group but `unacked`, which stays in flight.
fn all_acked_but(h: &mut Harness, unacked: u64) {
    h.create("r", Some(3_600_000), None);
    h.produce_marked("r", 0, 300);
    let fetch =
        Request::Fetch { topic: "r", group: "", max_messages: 1000, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
    let Reply::Messages { messages, .. } = h.call(fetch) else { panic!("fetch") };
    let ids: Vec<u64> = messages.iter().map(|m| m.id).filter(|&id| id != unacked).collect();
    assert_eq!(ids.len(), 299);
    let mut body = Vec::new();
    codec::encode_ids(&mut body, &ids);
    let ack = h.call(Request::Ack { topic: "r", group: "", ids: Ids { bytes: &body } });
    assert!(matches!(ack, Reply::Ids { ref failed, .. } if failed.is_empty()), "{ack:?}");
    h.tick(1, 10);
    assert_eq!((h.stat("r", "inflight"), h.stat("r", "ready")), (1, 0), "only message {unacked} is held");
}

/// A message still in flight holds only itself in memory: a group started
/// at an id after it gets the acknowledged messages from there back from
/// the files, not only what memory happens to hold.
#[test]
fn a_replay_starts_past_an_old_unacknowledged_message() {
    let dir = TempDir::new("replay-past-unacked");
    let mut h = open_at(dir.path(), start());
    all_acked_but(&mut h, 10);
    assert_eq!(h.create_group("r", "at-id", Start::Id(100)), 100);
    assert_eq!(h.receive("r", "at-id", 201), expected(100, 99, 201));
    h.create_group("r", "earliest", Start::Earliest);
    assert_eq!(h.receive("r", "earliest", 300), expected(1, 0, 300), "message 10 once, among the replayed ones");
}

/// A group that starts at a message still in flight, with acknowledged
/// ones after it, replays them; a restart in the middle resumes the
/// replay rather than leaving the group with what memory held.
#[test]
fn a_replay_from_an_unacknowledged_message_resumes_after_a_restart() {
    let dir = TempDir::new("replay-unacked-restart");
    let mut h = open_at(dir.path(), start());
    all_acked_but(&mut h, 100);
    assert_eq!(h.create_group("r", "at-id", Start::Id(100)), 100);
    let first = h.receive("r", "at-id", 20);
    assert_eq!(first, expected(100, 99, first.len()));
    drop(h);
    let mut h = open_at(dir.path(), Now { mono_ms: 1, wall_ms: START_WALL_MS + 5000 });
    let seen = first.len();
    let rest = h.receive("r", "at-id", 201 - seen);
    assert_eq!(rest, expected(100 + seen as u64, 99 + seen, 201 - seen), "the rest, from the files");
}

/// Groups created at random positions of a retaining topic, some
/// filtering by tag, among produces, acks of the default group that leave
/// some messages in flight, other groups' replays and restarts, each get
/// every message from their start on that their filter passes, once and
/// in order: the model is those ids, from the start to the newest.
#[test]
fn groups_started_anywhere_get_every_message_from_there_by_model() {
    const NAMES: [&str; 8] = ["g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7"];
    // Message k has tag t{k % 3} (`marked`); a filtered group drops t1.
    let passes = |filtered: bool, id: u64| !filtered || (id - 1) % 3 != 1;
    for seed in seeds(32) {
        let _guard =
            SeedGuard { test: "groups_started_anywhere", seed, replay: "cargo test --release --test retention" };
        println!("seed {seed}");
        let mut rng = Rng::new(seed);
        let dir = TempDir::new("replay-model");
        let mut h = open_at(dir.path(), start());
        h.create("r", Some(3_600_000), None);
        // Messages 0..produced, message k with id k + 1.
        let mut produced = 0usize;
        // The default group's messages in flight.
        let mut held: Vec<u64> = Vec::new();
        // Each group, whether it filters, and the first id it has not got.
        let mut groups: Vec<(&'static str, bool, u64)> = Vec::new();
        // What group `g` should get next: the passing ids from `next` on.
        let owed = |filtered: bool, next: u64, produced: usize| -> Vec<Got> {
            (next..=produced as u64).filter(|&id| passes(filtered, id)).map(got_of).collect()
        };
        for _ in 0..150 {
            match rng.below(10) {
                0..=2 => {
                    let n = rng.range(1usize, 40);
                    h.produce_marked("r", produced, n);
                    produced += n;
                }
                3 | 4 => {
                    let max_messages = rng.range(1u32, 60);
                    let fetch = Request::Fetch {
                        topic: "r",
                        group: "",
                        max_messages,
                        max_bytes: 0,
                        wait_ms: 0,
                        ack_timeout_ms: 0,
                    };
                    let Reply::Messages { messages, .. } = h.call(fetch) else { panic!("fetch") };
                    held.extend(messages.iter().map(|m| m.id));
                    // Some stay in flight; the rest are acked.
                    let (keep, ack): (Vec<u64>, Vec<u64>) = held.iter().partition(|_| rng.one_in(6));
                    held = keep;
                    if !ack.is_empty() {
                        let mut body = Vec::new();
                        codec::encode_ids(&mut body, &ack);
                        let reply = h.call(Request::Ack { topic: "r", group: "", ids: Ids { bytes: &body } });
                        assert!(matches!(reply, Reply::Ids { ref failed, .. } if failed.is_empty()), "{reply:?}");
                    }
                }
                5 if groups.len() < NAMES.len() => {
                    let g = NAMES[groups.len()];
                    let (start, from) = match rng.below(4) {
                        0 => (Start::Earliest, 1),
                        _ => {
                            let id = rng.range(1, produced as u64 + 1);
                            (Start::Id(id), id)
                        }
                    };
                    let filtered = rng.one_in(2);
                    let settings =
                        GroupSettings { filter: if filtered { "t0 || t2" } else { "" }, ..Default::default() };
                    let reply = h.call(Request::CreateGroup { topic: "r", group: g, settings, start });
                    assert!(
                        matches!(reply, Reply::GroupCreated { cursor, .. } if cursor == from),
                        "group {g}: {reply:?}"
                    );
                    groups.push((g, filtered, from));
                }
                6 | 7 if !groups.is_empty() => {
                    let i = rng.below(groups.len());
                    let (g, filtered, next) = groups[i];
                    let owed = owed(filtered, next, produced);
                    if owed.is_empty() {
                        continue;
                    }
                    let got = h.receive("r", g, rng.range(1, owed.len().min(120)));
                    assert_eq!(got, owed[..got.len()], "group {g} from id {next}");
                    groups[i].2 = got.last().map_or(next, |m| m.0 + 1);
                }
                8 => {
                    let wall_ms = h.now.wall_ms + 1_000;
                    drop(h);
                    h = open_at(dir.path(), Now { mono_ms: 1, wall_ms });
                    // What the default group held is ready again.
                    held.clear();
                }
                _ => h.tick(1, 1),
            }
        }
        for (g, filtered, next) in groups {
            let owed = owed(filtered, next, produced);
            assert_eq!(h.receive("r", g, owed.len()), owed, "group {g}: the rest");
        }
    }
}

/// A scheduled message canceled before its time was never one of the
/// topic's messages: a replay from the files steps over it, before a
/// restart and after one.
#[test]
fn a_replay_does_not_bring_back_a_canceled_message() {
    let dir = TempDir::new("replay-canceled");
    let mut h = open_at(dir.path(), start());
    h.create("r", Some(3_600_000), None);
    h.produce_marked("r", 0, 5);
    assert_eq!(h.ack_all("r"), 5);
    // Message 5 (id 6), due in an hour, then canceled.
    let mut blob = Vec::new();
    props::put_tag(&mut blob, "t2");
    props::put_header(&mut blob, "k", b"5");
    props::put_time(&mut blob, props::PROP_DELIVER_AT, START_WALL_MS + 3_600_000);
    let p = Props::parse(&blob, codec::V4, &PropsLimits::ANY).expect("valid");
    let mut bytes = Vec::new();
    codec::encode_message(&mut bytes, &p, &payload(5));
    let batch = Batch { count: 1, bytes: &bytes, with_props: true };
    let reply = h.call(Request::Produce { topic: "r", flags: 0, batch });
    assert!(matches!(reply, Reply::Produced { first_id: 6, .. }), "{reply:?}");
    assert!(matches!(h.call(Request::Cancel { topic: "r", id: 6 }), Reply::Due(_)));
    h.produce_marked("r", 6, 5);
    assert_eq!(h.ack_all("r"), 5);
    h.tick(1, 10);
    let without_6: Vec<Got> = (1..=11).filter(|&id| id != 6).map(got_of).collect();
    h.create_group("r", "late", Start::Earliest);
    assert_eq!(h.receive("r", "late", 10), without_6, "the canceled message is not replayed");
    assert_eq!(replayed_after_restart(h, dir.path(), 10), without_6, "nor after a restart");
}

/// PURGE_TOPIC removes the topic's messages for replay too: a group
/// started at the earliest afterwards, before a restart and after one,
/// gets only what was produced since.
#[test]
fn a_replay_starts_after_a_purge() {
    let dir = TempDir::new("replay-purge");
    let mut h = open_at(dir.path(), start());
    h.create("r", Some(3_600_000), None);
    h.produce_marked("r", 0, 5);
    assert_eq!(h.ack_all("r"), 5);
    h.produce_marked("r", 5, 5);
    assert!(matches!(h.call(Request::PurgeTopic { topic: "r" }), Reply::Count(5)));
    h.produce_marked("r", 10, 3);
    assert_eq!(h.ack_all("r"), 3);
    h.tick(1, 10);
    let since: Vec<Got> = (11..=13).map(got_of).collect();
    h.create_group("r", "late", Start::Earliest);
    assert_eq!(h.receive("r", "late", 3), since, "nothing from before the purge");
    assert_eq!(replayed_after_restart(h, dir.path(), 3), since, "nor after a restart");
}

/// Restarts the broker of `h` on `dir` and replays `n` messages of topic
/// `r` to a new group started at the earliest.
fn replayed_after_restart(h: Harness, dir: &Path, n: usize) -> Vec<Got> {
    drop(h);
    let mut h = open_at(dir, Now { mono_ms: 1, wall_ms: START_WALL_MS + 5_000 });
    h.create_group("r", "later", Start::Earliest);
    h.receive("r", "later", n)
}
