//! Retention (protocol version 4), in process, on a clock the test moves:
//! the settings and their limits, what STATS shows, and compaction keeping
//! the segments a retaining topic still needs and removing them once
//! expired, by age and by size (docs/protocol.md, "Retention and replay
//! (version 4)"). The broker is driven as the reactor drives it, with
//! `Now` chosen by the test, so nothing here sleeps.

mod common;

use std::path::Path;

use common::{Outs, TempDir};
use runnel::broker::{Broker, Config, ConnKey, LoopStats, Now, Outcome, Session};
use runnel::codec::{self, Batch, Decoded, ErrorCode, Frame, Ids, Props, PropsLimits, Reply, Request};
use runnel::codec::{TopicOptions, TopicSettings};
use runnel::log::LogOptions;

const START_WALL_MS: u64 = 1_767_225_600_000;
/// Small segments, so that a few hundred messages fill several.
const SEGMENT_BYTES_MAX: u64 = 8 << 10;
const PAYLOAD_BYTES: usize = 200;

/// A broker on a test clock, with one version-4 session.
struct Harness {
    broker: Broker,
    session: Session,
    now: Now,
    rid: u32,
}

fn open_at(dir: &Path, now: Now) -> Harness {
    let log = LogOptions { segment_bytes_max: SEGMENT_BYTES_MAX, ..LogOptions::default() };
    let broker = Broker::open(Config::default(), dir, log, now).expect("open broker");
    Harness::with(broker, now)
}

fn start() -> Now {
    Now { mono_ms: 1, wall_ms: START_WALL_MS }
}

impl Harness {
    fn with(broker: Broker, now: Now) -> Harness {
        let mut h = Harness { broker, session: Session { consumer: 1, ..Session::default() }, now, rid: 0 };
        let reply = h.call(Request::Hello { min_version: 1, max_version: codec::V4, token: b"" });
        assert!(matches!(reply, Reply::Hello { .. }), "{reply:?}");
        h
    }

    /// Serves one request in a turn of its own and returns its reply.
    fn call(&mut self, request: Request<'_>) -> Reply<'static> {
        self.rid += 1;
        let mut out = Vec::new();
        let frame = Frame { request_id: self.rid, request };
        let outcome =
            self.broker.handle(ConnKey(0), &mut self.session, &frame, self.now, &LoopStats::default(), &mut out);
        let mut outs = Outs::default();
        self.broker.advance(self.now, &mut outs);
        self.broker.commit(self.now, &mut outs);
        if outcome == Outcome::Held {
            out = std::mem::take(&mut outs.0[0]);
        }
        match codec::decode_reply(&out, usize::MAX) {
            Ok(Decoded::Frame(f, n)) if n == out.len() => owned(f.reply),
            other => panic!("not one reply: {other:?}"),
        }
    }

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

    /// Fetches and acks everything ready in `topic`'s default group.
    fn drain(&mut self, topic: &'static str) -> usize {
        let mut n = 0;
        loop {
            let fetch =
                Request::Fetch { topic, group: "", max_messages: 1000, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
            let Reply::Messages { messages, .. } = self.call(fetch) else { panic!("fetch") };
            if messages.is_empty() {
                return n;
            }
            let ids: Vec<u64> = messages.iter().map(|m| m.id).collect();
            n += ids.len();
            let mut body = Vec::new();
            codec::encode_ids(&mut body, &ids);
            let ack = self.call(Request::Ack { topic, group: "", ids: Ids { bytes: &body } });
            assert!(matches!(ack, Reply::Ids { failed, .. } if failed.is_empty()));
        }
    }

    fn stat(&mut self, section: &str, key: &str) -> u64 {
        let Reply::Stats(sections) = self.call(Request::Stats { topic: "" }) else { panic!("stats") };
        let s = sections.into_iter().find(|s| s.0 == section).map(|s| s.1).unwrap_or_default();
        s.iter().find(|kv| kv.0 == key).map(|kv| kv.1).unwrap_or_else(|| panic!("no key {key} in {section:?}"))
    }
}

fn owned(r: Reply<'_>) -> Reply<'static> {
    match r {
        Reply::Messages { topic, messages } => Reply::Messages {
            topic: String::from(topic).leak(),
            messages: messages
                .into_iter()
                .map(|m| codec::Message {
                    origin_group: "",
                    props: Props::EMPTY,
                    payload: m.payload.to_vec().leak(),
                    ..m
                })
                .collect(),
        },
        Reply::Error { code, message } => Reply::Error { code, message: String::from(message).leak() },
        Reply::Stats(s) => Reply::Stats(
            s.into_iter()
                .map(|(n, kv)| {
                    let kv = kv.into_iter().map(|(k, v)| (&*String::from(k).leak(), v)).collect();
                    (&*String::from(n).leak(), kv)
                })
                .collect(),
        ),
        Reply::Hello { version, limits, map_epoch } => Reply::Hello { version, limits, map_epoch },
        Reply::Produced { first_id, count } => Reply::Produced { first_id, count },
        Reply::Ids { done, failed } => Reply::Ids { done, failed },
        Reply::Created { created } => Reply::Created { created },
        other => panic!("a reply these tests do not expect: {other:?}"),
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
    let mut h = Harness::with(Broker::in_memory(Config::default(), start()), start());
    assert_eq!(code(h.create("r", Some(60_000), None)), Some(ErrorCode::BadArgument));
    assert_eq!(code(h.create("r", None, Some(1))), Some(ErrorCode::BadArgument));
    assert!(matches!(h.create("r", Some(0), None), Reply::Created { created: true }), "off is fine");
}

/// Produces and acks enough of `topic` to fill several segments, then runs
/// turns enough for compaction to look more than once.
fn fill_and_ack(h: &mut Harness, topic: &'static str) {
    h.produce(topic, 300);
    assert_eq!(h.drain(topic), 300);
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
