//! Memory of tag filters: what one compiled filter takes on the heap,
//! counted by a global allocator that sums live bytes, against what the
//! broker counts it as (`Filter::cost_bytes`, what
//! `compiled_filters_bytes_max` bounds), and what many groups with the same
//! filter take (one compiled filter, shared). A measurement that prints,
//! with bounds that fail if the accounting falls short of the heap or if
//! groups stop sharing; it asserts no time.
//!
//! `cargo test --release --test filter_memory -- --nocapture`

mod common;

use std::sync::atomic::Ordering;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::LIVE_BYTES;

use common::clocked::{Harness, start};
use runnel::broker::{Broker, Config};
use runnel::codec::group::{GroupSettings, Start};
use runnel::codec::{self, Reply, Request};
use runnel::filter::Filter;

/// Tags a filter is decided on: every length up to 120 bytes, ASCII and
/// not, so that its search cache has met whatever it meets.
fn tags() -> Vec<String> {
    (0..300).map(|i| format!("t{i}-{}-é{}", "ab".repeat(i % 60), "z".repeat(i % 7))).collect()
}

/// Heap bytes `text` takes compiled and decided on every tag of `tags`,
/// and what the broker counts it as.
fn measured(text: &str, tags: &[String]) -> (i64, u64) {
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let f = Filter::parse(text, 4096, 1 << 20).expect("valid");
    for t in tags {
        f.matches(t);
    }
    let heap = LIVE_BYTES.load(Ordering::Relaxed) - before;
    let cost = f.cost_bytes();
    drop(f);
    (heap, cost)
}

/// Heap bytes `groups` groups on as many topics take, each with `filter`,
/// in a broker without files, with the broker's count of distinct compiled
/// filters.
fn groups_heap(filter: &'static str, groups: usize) -> (i64, u64) {
    let mut h = Harness::over(Broker::in_memory(Config::default(), start()), start(), codec::CODEC_VERSION_MAX);
    let topics: Vec<String> = (0..groups).map(|i| format!("topic-{i}")).collect();
    for t in &topics {
        h.call(Request::CreateTopic { topic: t, settings: Default::default(), options: Default::default() });
    }
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    for t in &topics {
        let settings = GroupSettings { filter, ..GroupSettings::default() };
        let reply = h.call(Request::CreateGroup { topic: t, group: "audit", settings, start: Start::Earliest });
        assert!(matches!(reply, Reply::GroupCreated { created: true, .. }), "{reply:?}");
    }
    let heap = LIVE_BYTES.load(Ordering::Relaxed) - before;
    let Reply::Stats(sections) = h.call(Request::Stats { topic: "" }) else { panic!("stats") };
    let compiled = sections[0].1.iter().find(|kv| kv.0 == "compiled_filters").map_or(0, |kv| kv.1);
    (heap, compiled)
}

/// Every measurement in one test, one after the other: the count is of the
/// whole process, so they must not run at once.
#[test]
fn a_compiled_filter_costs_what_the_broker_counts_and_groups_share_it() {
    let tags = tags();
    let patterns =
        [r"re:\w{5}", r"re:^order\.", r"re:(?-u)\w{5}", r"re:\pL+\d", r"re:(?i)\b\w+\b", "re:(a{50}){20}", "eu || us"];
    for text in patterns {
        let (heap, cost) = measured(text, &tags);
        println!("filter memory: {text:?} takes {heap} heap bytes compiled and used, counted as {cost}");
        assert!(heap <= cost as i64, "{text:?}: {heap} heap bytes, counted as {cost}");
        assert!(cost as i64 <= heap + 4096, "{text:?}: counted as {cost}, far above its {heap} heap bytes");
    }
    let groups = 200;
    let (plain, _) = groups_heap("", groups);
    let (filtered, compiled) = groups_heap(r"re:\w{5}", groups);
    let (one, _) = measured(r"re:\w{5}", &tags);
    let extra = filtered - plain;
    println!("filter memory: {groups} groups with re:\\w{{5}} take {extra} heap bytes more than without a filter");
    assert_eq!(compiled, 1, "one compiled filter for every group");
    assert!(extra < 2 * one, "{extra} bytes for {groups} groups sharing one filter of {one} bytes");
}
