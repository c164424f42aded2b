//! Memory per dedup id: what a topic's dedup window (`DedupWindow`) takes
//! on the heap for each remembered dedup id, counted by a global allocator
//! that sums live bytes, for 1M ids of 16 bytes (a producer id and a
//! sequence number, as `runnel::Client`'s automatic ids) and of 64 bytes
//! (`dedup_id_bytes_max`). A measurement that prints, with a loose bound so
//! that a regression that doubles it fails; it asserts no time.
//!
//! `cargo test --release --test dedup_memory -- --nocapture`
//!
//! The message itself costs what any message with properties costs
//! (README, "Memory"): its dedup id property is the id plus 3 bytes, plus
//! the 2-byte properties length if it has no other property.

use std::sync::atomic::Ordering;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::LIVE_BYTES;

use runnel::queue::DedupWindow;

/// Heap bytes per entry of a window of `n` dedup ids of `id_bytes` bytes,
/// in produce order.
fn bytes_per_dedup_id(n: u64, id_bytes: usize) -> f64 {
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut w = DedupWindow::default();
    let mut id = vec![b'p'; id_bytes];
    for seq in 1..=n {
        id[..8].copy_from_slice(&seq.to_le_bytes());
        w.insert(&id, seq, 1_767_225_600_000 + seq);
    }
    let heap = LIVE_BYTES.load(Ordering::Relaxed) - before;
    assert_eq!(w.len() as u64, n);
    let per = heap as f64 / n as f64;
    println!("dedup window memory: {heap} heap bytes for {n} dedup ids of {id_bytes} bytes = {per:.1} bytes each");
    drop(w);
    per
}

/// Both cases in one test, one after the other: the count is of the
/// whole process, so they must not run at once.
#[test]
fn dedup_window_memory_per_dedup_id() {
    let per = bytes_per_dedup_id(1_000_000, 16);
    assert!(per < 250.0, "{per:.1} bytes per 16-byte dedup id");
    let per = bytes_per_dedup_id(1_000_000, 64);
    assert!(per < 350.0, "{per:.1} bytes per 64-byte dedup id");
}
