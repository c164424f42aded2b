//! Memory per keyed message: what a topic's key index (`KeyIndex`) takes
//! on the heap for each message with a key, counted by a global allocator
//! that sums live bytes, for 1M keyed messages with distinct 16-byte keys
//! (an order or trace id: the common case, and the costliest per message)
//! and for 1M messages sharing 10k keys. A measurement that prints, with a
//! loose bound so that a regression that doubles it fails; it asserts no
//! time.
//!
//! `cargo test --release --test key_index_memory -- --nocapture`
//!
//! The message itself costs what any message with properties costs
//! (README, "Memory"): its key property is the key plus 3 bytes, plus the
//! 2-byte properties length if it has no other property.

use std::sync::atomic::Ordering;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::LIVE_BYTES;

use runnel::queue::KeyIndex;

/// Heap bytes per message of an index of `n` keyed messages with
/// `distinct` keys of 16 bytes, in produce order.
fn bytes_per_keyed_message(n: u64, distinct: u64) -> f64 {
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut ix = KeyIndex::new(32, n as u32);
    for id in 1..=n {
        ix.insert(format!("order-{:010}", id % distinct).as_bytes(), id);
    }
    let heap = LIVE_BYTES.load(Ordering::Relaxed) - before;
    assert_eq!((ix.len() as u64, ix.keys() as u64), (n, distinct.min(n)));
    let per = heap as f64 / n as f64;
    println!("key index memory: {heap} heap bytes for {n} keyed messages, {distinct} keys = {per:.1} bytes each");
    per
}

/// Both cases in one test, one after the other: the count is of the
/// whole process, so they must not run at once.
#[test]
fn key_index_memory_per_keyed_message() {
    let per = bytes_per_keyed_message(1_000_000, 1_000_000);
    assert!(per < 300.0, "{per:.1} bytes per keyed message with distinct keys");
    let per = bytes_per_keyed_message(1_000_000, 10_000);
    assert!(per < 100.0, "{per:.1} bytes per keyed message with shared keys");
}
