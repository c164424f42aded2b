//! Memory per scheduled message: what a topic's `Schedule` (its index by
//! due time and by id) takes on the heap, counted by a global allocator
//! that sums live bytes, for 1M scheduled messages (and 10M with
//! `--ignored`). A measurement that prints, with a loose bound so that a
//! regression that doubles it fails; it asserts no time.
//!
//! `cargo test --release --test schedule_memory -- --nocapture --include-ignored --test-threads 1`
//! (one at a time: the count is of the whole process).
//!
//! The message itself costs what any message with properties costs
//! (README, "Memory"): its `deliver_at_ms` property is 11 bytes, plus the
//! 2-byte properties length if it has no other property.

use std::sync::atomic::Ordering;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::LIVE_BYTES;

use runnel::queue::Schedule;
use runnel::testkit::Rng;

/// Heap bytes per message of a schedule of `n` messages with ids in
/// produce order and due times spread over a day, as a topic gets them.
fn bytes_per_scheduled_message(n: u64) -> f64 {
    let mut rng = Rng::new(7);
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut s = Schedule::default();
    for id in 1..=n {
        s.insert(id, 1_767_225_600_000 + rng.below(86_400_000u64));
    }
    let heap = LIVE_BYTES.load(Ordering::Relaxed) - before;
    assert_eq!(s.len(), n);
    let per = heap as f64 / n as f64;
    println!("schedule memory: {heap} heap bytes for {n} scheduled messages = {per:.1} bytes each");
    per
}

#[test]
fn schedule_memory_per_message_at_1m() {
    let per = bytes_per_scheduled_message(1_000_000);
    assert!(per < 100.0, "{per:.1} bytes per scheduled message");
}

#[test]
#[ignore = "10M scheduled messages take about a GiB: run with --ignored"]
fn schedule_memory_per_message_at_10m() {
    let per = bytes_per_scheduled_message(10_000_000);
    assert!(per < 100.0, "{per:.1} bytes per scheduled message");
}
