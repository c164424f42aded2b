//! Idempotent produce (protocol version 4), in process, on a clock the test
//! moves: duplicates within a topic's window and after it, within one
//! batch, across restarts and across compaction, the entries limit, and
//! what earlier versions see (docs/protocol.md, "Idempotent produce
//! (version 4)"). The broker is driven as the reactor drives it — the
//! turn's requests, then its timers, then its commit — with `Now` chosen
//! by the test, so nothing here sleeps. The crash test with a real
//! `runnel serve` child is in tests/crash.rs.

mod common;

use std::path::Path;

use common::TempDir;
use common::clocked::{Harness, START_WALL_MS, start};
use runnel::broker::{Config, Now};
use runnel::codec::{self, Batch, ErrorCode, Props, PropsLimits, Reply, Request, props};
use runnel::codec::{TopicOptions, TopicSettings};

/// A payload that makes a few hundred messages fill several segments.
const PAYLOAD: [u8; 200] = [b'm'; 200];

fn open(dir: &Path, now: Now) -> Harness {
    Harness::open(dir, now, Config::default(), codec::V4)
}

/// What a PRODUCE answered: (first id, count, duplicates as (index, id)),
/// or its error.
type Produced = Result<(u64, u32, Vec<(u32, u64)>), ErrorCode>;

impl Harness {
    /// Moves the clock on by `ms` and runs a turn with no request.
    fn tick(&mut self, ms: u64) {
        self.tick_to(self.now.wall_ms + ms);
    }

    /// Produces one message per dedup id (None: without one) to `topic`.
    fn produce(&mut self, topic: &'static str, dedup_ids: &[Option<&str>]) -> Produced {
        let mut bytes = Vec::new();
        for id in dedup_ids {
            let mut blob = Vec::new();
            if let Some(id) = id {
                props::put_dedup_id(&mut blob, id.as_bytes());
            }
            let p = Props::parse(&blob, codec::V4, &PropsLimits::ANY).expect("valid");
            codec::encode_message(&mut bytes, &p, &PAYLOAD);
        }
        let batch = Batch { count: dedup_ids.len() as u32, bytes: &bytes, with_props: true };
        match self.call(Request::Produce { topic, flags: 0, batch }) {
            Reply::Produced { first_id, count } => Ok((first_id, count, Vec::new())),
            Reply::Deduplicated { first_id, count, duplicates } => Ok((first_id, count, duplicates)),
            Reply::Error { code, .. } => Err(ErrorCode::from_u8(code).expect("a known code")),
            other => panic!("produce: {other:?}"),
        }
    }

    fn create(&mut self, topic: &'static str, dedup_window_ms: Option<u32>) -> Reply<'static> {
        let settings = TopicSettings::default();
        let options = TopicOptions { dedup_window_ms, ..TopicOptions::default() };
        self.call(Request::CreateTopic { topic, settings, options })
    }

    /// The STATS keys of `section` ("" for the broker's).
    fn stats(&mut self, section: &str) -> Vec<(&'static str, u64)> {
        let Reply::Stats(sections) = self.call(Request::Stats { topic: "" }) else { panic!("stats") };
        sections.into_iter().find(|s| s.0 == section).map(|s| s.1).unwrap_or_default()
    }

    fn stat(&mut self, section: &str, key: &str) -> u64 {
        let s = self.stats(section);
        s.iter().find(|kv| kv.0 == key).map(|kv| kv.1).unwrap_or_else(|| panic!("no key {key} in {section:?}"))
    }
}

#[test]
fn a_duplicate_within_the_window_is_answered_with_the_original_id() {
    let dir = TempDir::new("dedup-window");
    let mut h = open(dir.path(), start());
    assert_eq!(h.produce("t", &[Some("a"), Some("b")]), Ok((1, 2, vec![])));
    // A retry mixing an old message, a new one and one without an id.
    assert_eq!(h.produce("t", &[Some("b"), Some("c"), None]), Ok((3, 2, vec![(0, 2)])));
    assert_eq!(h.produce("t", &[Some("a"), Some("c")]), Ok((0, 0, vec![(0, 1), (1, 3)])), "all duplicates");
    // The same id twice in one batch: the second is a duplicate of the first.
    assert_eq!(h.produce("t", &[Some("d"), Some("d")]), Ok((5, 1, vec![(1, 5)])));
    // Ids are per topic.
    assert_eq!(h.produce("u", &[Some("a")]), Ok((1, 1, vec![])));
    assert_eq!(h.ack_all("t"), 5, "each message stored once");
    // Acked, the original is still remembered.
    assert_eq!(h.produce("t", &[Some("a")]), Ok((0, 0, vec![(0, 1)])));
    assert_eq!(h.stat("t", "dedup_entries"), 4);
    assert_eq!(h.stat("", "dedup_entries"), 5);
}

#[test]
fn after_the_window_the_id_stores_a_new_message() {
    let dir = TempDir::new("dedup-expiry");
    let mut h = open(dir.path(), start());
    assert!(matches!(h.create("t", Some(1000)), Reply::Created { created: true }));
    assert_eq!(h.stat("t", "dedup_window_ms"), 1000);
    assert_eq!(h.produce("t", &[Some("a")]), Ok((1, 1, vec![])));
    h.tick(999);
    assert_eq!(h.produce("t", &[Some("a")]), Ok((0, 0, vec![(0, 1)])), "1 ms before the window ends");
    h.tick(1);
    assert_eq!(h.stat("t", "dedup_entries"), 0, "expired at the turn");
    assert_eq!(h.produce("t", &[Some("a")]), Ok((2, 1, vec![])), "the window is over");
    // A window of 0 deduplicates nothing.
    assert!(matches!(h.create("t", Some(0)), Reply::Created { created: false }));
    assert_eq!(h.produce("t", &[Some("a")]), Ok((3, 1, vec![])));
    assert_eq!(h.produce("t", &[Some("z"), Some("z")]), Ok((4, 2, vec![])));
}

#[test]
fn the_window_survives_a_restart_and_expires_by_the_wall_clock() {
    let dir = TempDir::new("dedup-restart");
    let mut h = open(dir.path(), start());
    assert!(matches!(h.create("short", Some(10_000)), Reply::Created { created: true }));
    assert_eq!(h.produce("t", &[Some("a"), Some("b")]), Ok((1, 2, vec![])));
    assert_eq!(h.produce("short", &[Some("a")]), Ok((1, 1, vec![])));
    assert_eq!(h.ack_all("t"), 2);
    drop(h);
    let later = Now { mono_ms: 1, wall_ms: START_WALL_MS + 10_000 };
    let mut h = open(dir.path(), later);
    assert_eq!(h.stat("short", "dedup_window_ms"), 10_000, "the setting is in the Topic record");
    assert_eq!(h.produce("t", &[Some("b"), Some("a")]), Ok((0, 0, vec![(0, 2), (1, 1)])));
    assert_eq!(h.produce("short", &[Some("a")]), Ok((2, 1, vec![])), "its window passed while the broker was down");
}

#[test]
fn compaction_keeps_the_window_of_acked_messages() {
    let dir = TempDir::new("dedup-compaction");
    let mut h = open(dir.path(), start());
    let ids: Vec<String> = (0..20).map(|i| format!("id-{i}")).collect();
    for id in &ids {
        assert!(matches!(h.produce("t", &[Some(id)]), Ok((_, 1, d)) if d.is_empty()));
    }
    assert_eq!(h.ack_all("t"), 20);
    // Filler without ids, acked at once, until compaction has removed the
    // segments that held the dedup ids' Produce records a few times over.
    while h.broker.compactions() < 6 {
        for _ in 0..10 {
            h.produce("filler", &[None]).expect("filler");
        }
        h.ack_all("filler");
    }
    let first = h.broker.log().segments()[0].base;
    assert!(first > 0, "the first segment is gone");
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(h.produce("t", &[Some(id)]), Ok((0, 0, vec![(0, i as u64 + 1)])), "{id}");
    }
    drop(h);
    let mut h = open(dir.path(), start());
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(h.produce("t", &[Some(id)]), Ok((0, 0, vec![(0, i as u64 + 1)])), "{id} after a restart");
    }
}

#[test]
fn past_the_entries_limit_a_produce_gets_dedup_full_and_stores_nothing() {
    let dir = TempDir::new("dedup-full");
    let mut config = Config::default();
    config.limits.dedup_entries_max = 3;
    let mut h = Harness::open(dir.path(), start(), config, codec::V4);
    assert!(matches!(h.create("t", Some(1000)), Reply::Created { .. }));
    assert_eq!(h.produce("t", &[Some("a"), Some("b")]), Ok((1, 2, vec![])));
    assert_eq!(h.produce("t", &[Some("c"), Some("d")]), Err(ErrorCode::DedupFull));
    assert_eq!(h.stat("t", "ready"), 2, "nothing of the refused batch was stored");
    // Duplicates and messages without an id need no room.
    assert_eq!(h.produce("t", &[Some("a"), None, Some("c")]), Ok((3, 2, vec![(0, 1)])));
    assert_eq!(h.produce("t", &[Some("d")]), Err(ErrorCode::DedupFull));
    assert_eq!(h.stat("", "dedup_entries_max"), 3);
    h.tick(1000);
    assert_eq!(h.produce("t", &[Some("d")]), Ok((5, 1, vec![])), "room again once the window passed");
}

#[test]
fn bad_dedup_ids_and_windows_are_refused() {
    let dir = TempDir::new("dedup-bad");
    let mut h = open(dir.path(), start());
    let long = "x".repeat(65);
    assert_eq!(h.produce("t", &[Some(&long)]), Err(ErrorCode::BadArgument), "past dedup_id_bytes_max");
    let max = runnel::limits::Limits::default().dedup_window_ms_max;
    assert!(matches!(h.create("t", Some(max + 1)), Reply::Error { code, .. } if code == ErrorCode::BadArgument as u8));
    assert!(matches!(h.create("t", Some(max)), Reply::Created { .. }));
}

#[test]
fn earlier_versions_cannot_send_dedup_ids_and_see_no_new_keys() {
    let dir = TempDir::new("dedup-v3");
    let mut h = Harness::open(dir.path(), start(), Config::default(), 3);
    let mut bytes = Vec::new();
    codec::encode_batch(&mut bytes, &[b"x"]);
    let batch = Batch { count: 1, bytes: &bytes, with_props: false };
    assert!(matches!(h.call(Request::Produce { topic: "t", flags: 0, batch }), Reply::Produced { .. }));
    let keys = h.stats("t");
    assert!(keys.iter().all(|kv| !kv.0.starts_with("dedup")), "{keys:?}");
    let broker_keys = h.stats("");
    assert!(broker_keys.iter().all(|kv| !kv.0.starts_with("dedup")), "{broker_keys:?}");
}
