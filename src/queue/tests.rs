//! Tests for `queue/`. First `Seq` and `Topic` by example, each test one
//! rule; then a seeded random test that drives a `Topic` the way the broker
//! does and compares it, after every operation, with a plain reference model
//! written below (a `BTreeMap` of messages with their states and a `VecDeque`
//! retry queue). Timers go through a real `Wheel`, so expiry happens only by
//! advancing time, exactly as in the broker.
//!
//! The random test prints its seed in every assertion message; set
//! `RUNNEL_SEED=<seed>` to replay one seed alone.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use super::seq::{BLOCK_BYTES_MAX, BLOCK_MESSAGES_MAX};
use super::*;
use crate::codec::{DEAD_LETTER_SUFFIX, DeadReason};
use crate::testkit::{Rng, seeds};
use crate::wheel::{TimerKey, Wheel};

/// The group every test acts on: the default one.
const G: GroupId = GroupId::DEFAULT;

/// A topic as the broker's table makes one: a dead-letter topic by name.
/// Recovery of a topic whose only group is the default one, as
/// `replay.rs` does it: the messages are stored (`Topic::restore`), then
/// `carried` sets deliveries of stored messages (Produce and Requeue
/// records; others are ignored), `done` releases messages (Remove
/// records), and the group is restored at its earliest.
struct Recovery {
    carried: IdMap<u16>,
    done: Vec<MsgId>,
}

impl Recovery {
    fn new() -> Recovery {
        Recovery { carried: IdMap::default(), done: Vec::new() }
    }
    fn restore(
        &mut self,
        t: &mut Topic,
        id: MsgId,
        born_ms: u64,
        payload: &[u8],
        carried: u16,
        dead: Option<DeadInfo>,
    ) {
        t.restore(id, born_ms, payload, dead);
        if carried > 0 {
            self.carried.insert(id, carried);
        }
    }
    fn deliveries(&mut self, id: MsgId, d: u16) {
        self.carried.insert(id, d);
    }
    fn finish(mut self, t: &mut Topic) {
        for id in self.done {
            t.seq.release(id);
        }
        self.carried.retain(|id, _| t.seq.contains(*id));
        let mut group = Group::new(G, 0);
        group.restore(0, Vec::new(), self.carried);
        t.delete_group(G, &mut FakeTimers::new(0));
        t.insert_group(group);
        t.restore_done();
    }
}

fn new_topic(name: &str, settings: Settings, first_id: MsgId) -> Topic {
    let mut t = Topic::new(name, name.ends_with(DEAD_LETTER_SUFFIX), settings, first_id);
    t.insert_group(Group::new(G, 0));
    t
}

// ---------------------------------------------------------------------------
// Helpers shared by the example tests and the model test.
// ---------------------------------------------------------------------------

/// The broker's `GroupTimers` in miniature: a real wheel whose values are
/// message ids. Counts disarms of keys that named no pending timer, which
/// would mean the queue lost track of one of its timers.
struct FakeTimers {
    wheel: Wheel<MsgId>,
    /// Disarms whose key matched no pending timer.
    stale_disarms: u64,
}

impl FakeTimers {
    fn new(now_ms: u64) -> FakeTimers {
        FakeTimers { wheel: Wheel::new(now_ms), stale_disarms: 0 }
    }

    /// Moves time to `now_ms`; returns the timers that fired, in order, as
    /// (deadline_ms, id).
    fn advance(&mut self, now_ms: u64) -> Vec<(u64, MsgId)> {
        let mut expired = Vec::new();
        self.wheel.advance(now_ms, &mut expired);
        expired
    }
}

impl Timers for FakeTimers {
    fn arm(&mut self, deadline_ms: u64, id: MsgId) -> TimerKey {
        self.wheel.insert(deadline_ms, id)
    }
    fn disarm(&mut self, key: TimerKey) {
        if self.wheel.cancel(key).is_none() {
            self.stale_disarms += 1;
        }
    }
}

/// A payload that tells its message apart from its neighbours.
fn payload_for(id: MsgId, len: usize) -> Vec<u8> {
    (0..len).map(|i| (id as usize).wrapping_mul(31).wrapping_add(i) as u8).collect()
}

/// Appends `payloads` and publishes them; returns their ids.
fn produce(t: &mut Topic, born_ms: u64, payloads: &[&[u8]]) -> Vec<MsgId> {
    let ids = payloads.iter().map(|p| t.produce(born_ms, p).0).collect();
    t.publish();
    ids
}

/// Fetches for `owner` and returns what was delivered, in order.
fn fetch(
    t: &mut Topic,
    timers: &mut FakeTimers,
    owner: ConsumerId,
    max_messages: u32,
    max_bytes: u64,
    deadline_ms: u64,
) -> Vec<Delivery> {
    let mut got = Vec::new();
    let n = t.fetch(G, Take { owner, max_messages, max_bytes, deadline_ms }, timers, |_, d| got.push(d));
    assert_eq!(n as usize, got.len(), "fetch's count and its deliveries disagree");
    got
}

/// Fetches everything ready for `owner` with a deadline of `deadline_ms`;
/// returns (id, deliveries) pairs.
fn fetch_all(t: &mut Topic, timers: &mut FakeTimers, owner: ConsumerId, deadline_ms: u64) -> Vec<(MsgId, u16)> {
    fetch(t, timers, owner, u32::MAX, u64::MAX, deadline_ms).iter().map(|d| (d.id, d.deliveries)).collect()
}

/// Advances time as the broker does: fires every due timer into the topic.
fn fire(t: &mut Topic, timers: &mut FakeTimers, now_ms: u64) -> Vec<(MsgId, Returned)> {
    let mut out = Vec::new();
    for (_, id) in timers.advance(now_ms) {
        if let Some(r) = t.timer_fired(G, id, timers) {
            out.push((id, r));
        }
    }
    out
}

fn dead(origin_id: MsgId, origin_deliveries: u16, reason: DeadReason) -> Returned {
    Returned::Dead(DeadInfo { origin_id, origin_deliveries, reason })
}

fn live_ids(seq: &Seq) -> Vec<MsgId> {
    seq.iter_live().map(|m| m.id).collect()
}

/// Appends `n` messages of `len` bytes whose payloads name their ids.
fn fill(seq: &mut Seq, n: usize, len: usize) -> Vec<MsgId> {
    (0..n).map(|_| seq.append(0, &payload_for(seq.next_id(), len)).0).collect()
}

// ---------------------------------------------------------------------------
// Seq
// ---------------------------------------------------------------------------

#[test]
fn seq_append_get_release_with_dense_ids() {
    let mut seq = Seq::new(10);
    let ids: Vec<MsgId> = (0..5u8).map(|i| seq.append(1_000, &[i; 3][..usize::from(i % 4)]).0).collect();
    assert_eq!(ids, [10, 11, 12, 13, 14], "ids are dense from the first id");
    assert_eq!(seq.next_id(), 15);
    assert_eq!((seq.live(), seq.live_bytes()), (5, 6));
    for (i, &id) in ids.iter().enumerate() {
        let m = seq.get(id).expect("appended message is live"); // ok: test code, on the test's own data
        assert_eq!((m.id, m.born_ms, m.payload), (id, 1_000, &[i as u8; 3][..i % 4]));
        assert!(seq.contains(id));
    }
    assert_eq!(seq.get(9), None, "below the first id");
    assert_eq!(seq.get(15), None, "not appended yet");

    assert_eq!(seq.release(12), Some(2), "release returns the payload length");
    assert_eq!(seq.release(12), None, "a released message is not live");
    assert_eq!(seq.release(10), Some(0), "an empty payload is still a message");
    assert_eq!(seq.release(99), None);
    assert_eq!(seq.get(12), None);
    assert!(!seq.contains(12));
    assert_eq!((seq.live(), seq.live_bytes()), (3, 4));
    assert_eq!(live_ids(&seq), [11, 13, 14]);
    assert_eq!(seq.append(1_000, b"x").0, 15, "released ids are never reused");

    assert_eq!(Seq::new(0).next_id(), 1, "id 0 is never handed out");
    let mut seq = Seq::new(0);
    assert_eq!(seq.append(0, b"a").0, 1);
}

#[test]
fn seq_live_in_counts_live_messages_at_its_bounds() {
    let mut seq = Seq::new(1);
    fill(&mut seq, BLOCK_MESSAGES_MAX + 10, 1);
    seq.release(3);
    seq.release(BLOCK_MESSAGES_MAX as u64 + 2);
    let end = seq.next_id();
    assert_eq!(seq.live_in(0, end), seq.live());
    assert_eq!(seq.live_in(1, end), seq.live());
    assert_eq!(seq.live_in(2, end), seq.live() - 1, "from one past the first");
    assert_eq!(seq.live_in(1, end - 1), seq.live() - 1, "until one before the last");
    assert_eq!(seq.live_in(3, 4), 0, "a released message");
    assert_eq!(seq.live_in(2, 5), 2);
    let second_block = BLOCK_MESSAGES_MAX as u64 + 1;
    assert_eq!(seq.live_in(second_block - 1, second_block + 2), 2, "across the block boundary, one released");
    assert_eq!(seq.live_in(end, end + 10), 0);
    assert_eq!(seq.live_in(5, 5), 0);
}

#[test]
fn seq_born_ms_never_goes_backwards() {
    let mut seq = Seq::new(1);
    assert_eq!(seq.append(5_000, b"a"), (1, 5_000));
    assert_eq!(seq.append(4_000, b"b"), (2, 5_000), "a clock step back gets the last born time");
    assert_eq!(seq.get(2).map(|m| m.born_ms), Some(5_000));
    assert_eq!(seq.append(0, b"c"), (3, 5_000));
    assert_eq!(seq.append(7_000, b"d"), (4, 7_000));
    assert_eq!(seq.append(6_999, b"e"), (5, 7_000));
    // A born time too far from the block's base for a u32 delta opens a new
    // block and is still stored exactly.
    let far = 5_000 + u64::from(u32::MAX) + 1;
    assert_eq!(seq.append(far, b"f"), (6, far));
    assert_eq!(seq.blocks.len(), 2);
    let borns: Vec<u64> = seq.iter_live().map(|m| m.born_ms).collect();
    assert_eq!(borns, [5_000, 5_000, 5_000, 7_000, 7_000, far]);
}

#[test]
fn seq_insert_with_a_small_gap_stays_in_the_block() {
    let mut seq = Seq::new(1);
    seq.insert(1, 10, b"one");
    seq.insert(5, 20, b"five");
    assert_eq!(seq.blocks.len(), 1, "a small gap is padded inside the block");
    assert_eq!(seq.next_id(), 6);
    for id in 2..5 {
        assert_eq!(seq.get(id), None, "gap id {id}");
        assert!(!seq.contains(id));
        assert_eq!(seq.release(id), None);
    }
    assert_eq!(seq.get(5).map(|m| (m.born_ms, m.payload)), Some((20, &b"five"[..])));
    assert_eq!(seq.next_live(2, 100), Some(5));
    assert_eq!(seq.next_live(2, 5), None, "until is exclusive");
    assert_eq!(live_ids(&seq), [1, 5]);
    assert_eq!((seq.live(), seq.live_bytes()), (2, 7));
    assert_eq!(seq.append(0, b"six").0, 6, "append continues after the gap");
}

#[test]
fn seq_insert_gap_boundary_between_padding_and_a_new_block() {
    // After id 1 the block holds one message and ends at id 2. A gap of
    // 4094 ids fills it exactly to 4096; one more needs a new block.
    let last_fitting = 2 + (BLOCK_MESSAGES_MAX as u64 - 2);
    let mut seq = Seq::new(1);
    seq.insert(1, 0, b"a");
    seq.insert(last_fitting, 0, b"b");
    assert_eq!(seq.blocks.len(), 1);
    assert_eq!(seq.blocks[0].ends.len(), BLOCK_MESSAGES_MAX);
    assert_eq!(live_ids(&seq), [1, last_fitting]);
    seq.append(0, b"c");
    assert_eq!(seq.blocks.len(), 2, "a full block takes nothing more");

    let mut seq = Seq::new(1);
    seq.insert(1, 0, b"a");
    seq.insert(last_fitting + 1, 0, b"b");
    assert_eq!(seq.blocks.len(), 2, "a large gap starts a new block");
    assert_eq!(seq.blocks[0].ends.len(), 1, "the old block is not padded");
    assert!(seq.blocks[0].closed);
    assert_eq!(seq.blocks[1].first_id, last_fitting + 1);
    assert_eq!(seq.next_live(2, u64::MAX), Some(last_fitting + 1));
    assert_eq!(seq.get(last_fitting), None);
    assert_eq!(live_ids(&seq), [1, last_fitting + 1]);

    // Recovery may bring a born time older than the open block's base: it
    // gets a block of its own and keeps its born time.
    let mut seq = Seq::new(1);
    seq.insert(1, 1_000, b"a");
    seq.insert(2, 500, b"b");
    assert_eq!(seq.blocks.len(), 2);
    assert_eq!(seq.get(2).map(|m| m.born_ms), Some(500));
    assert_eq!(seq.append(0, b"c"), (3, 1_000), "append still never goes below the last born time");
}

#[test]
#[should_panic(expected = "ids only grow")]
fn seq_insert_below_next_id_panics() {
    let mut seq = Seq::new(1);
    seq.insert(5, 0, b"a");
    seq.insert(5, 0, b"b");
}

#[test]
fn seq_next_live_across_gaps_and_freed_blocks() {
    let n = BLOCK_MESSAGES_MAX as u64;
    let mut seq = Seq::new(1);
    fill(&mut seq, 3 * BLOCK_MESSAGES_MAX + 10, 4);
    assert_eq!(seq.blocks.len(), 4);
    // Free the second block (ids n+1 ..= 2n) while the first still lives: it
    // stays in place, empty.
    for id in n + 1..=2 * n {
        seq.release(id);
    }
    assert_eq!(seq.blocks.len(), 4, "only front blocks are popped");
    assert!(seq.blocks[1].ends.is_empty(), "a closed block with nothing live is freed");
    assert_eq!(seq.next_live(n + 1, u64::MAX), Some(2 * n + 1), "skips a freed block");
    assert_eq!(seq.next_live(n + 7, u64::MAX), Some(2 * n + 1), "from inside a freed block");
    assert_eq!(seq.next_live(n, u64::MAX), Some(n));
    assert_eq!(seq.next_live(n + 1, 2 * n + 1), None, "until stops before the next block");
    assert_eq!(seq.next_live(0, u64::MAX), Some(1), "from before the first block");
    assert_eq!(seq.next_live(5, 5), None, "empty range");
    assert_eq!(seq.get(n + 3), None);
    assert_eq!(seq.release(n + 3), None);
    // Holes inside a live block, across a 64-bit word of the live bitmap.
    for id in 2 * n + 1..2 * n + 200 {
        seq.release(id);
    }
    assert_eq!(seq.next_live(2 * n + 1, u64::MAX), Some(2 * n + 200));
    assert_eq!(seq.next_live(n + 1, 2 * n + 200), None);
    // Freeing the first block pops it and the freed one behind it.
    for id in 1..=n {
        seq.release(id);
    }
    assert_eq!(seq.blocks.len(), 2);
    assert_eq!(seq.blocks[0].first_id, 2 * n + 1);
    assert_eq!(seq.next_live(0, u64::MAX), Some(2 * n + 200));
    assert_eq!(seq.next_live(3 * n + 11, u64::MAX), None, "past the end");
    assert_eq!(seq.next_live(3 * n + 10, u64::MAX), Some(3 * n + 10));
    // Gaps from `bump_next_id`, small and large.
    seq.bump_next_id(3 * n + 20);
    let a = seq.append(0, b"a").0;
    seq.bump_next_id(a + 10 * n);
    let b = seq.append(0, b"b").0;
    assert_eq!((a, b), (3 * n + 20, 13 * n + 20));
    assert_eq!(seq.next_live(3 * n + 11, u64::MAX), Some(a));
    assert_eq!(seq.next_live(a + 1, u64::MAX), Some(b));
    assert_eq!(seq.next_live(a + 1, b), None);
    assert!(seq.blocks.iter().all(|blk| blk.ends.len() <= BLOCK_MESSAGES_MAX));
}

#[test]
fn seq_block_closes_at_4096_messages() {
    let mut seq = Seq::new(100);
    fill(&mut seq, BLOCK_MESSAGES_MAX, 1);
    assert_eq!(seq.blocks.len(), 1, "a block takes exactly 4096 messages");
    assert!(!seq.blocks[0].closed, "it closes only when the next message arrives");
    fill(&mut seq, 1, 1);
    assert_eq!(seq.blocks.len(), 2);
    assert!(seq.blocks[0].closed);
    assert_eq!(seq.blocks[0].ends.len(), BLOCK_MESSAGES_MAX);
    assert_eq!(seq.blocks[1].first_id, 100 + BLOCK_MESSAGES_MAX as u64);
    // Closing trims the index columns to their length.
    assert_eq!(seq.blocks[0].ends.capacity(), BLOCK_MESSAGES_MAX);
    assert_eq!(seq.blocks[0].live_bits.capacity(), BLOCK_MESSAGES_MAX / 64);
}

#[test]
fn seq_block_closes_at_1_mib_of_payload() {
    let mut seq = Seq::new(1);
    let per_block = BLOCK_BYTES_MAX / 1000;
    fill(&mut seq, per_block, 1000);
    assert_eq!(seq.blocks.len(), 1, "{per_block} kB fit in 1 MiB");
    fill(&mut seq, 1, 1000);
    assert_eq!(seq.blocks.len(), 2, "one more kB does not");
    assert_eq!(seq.blocks[0].ends.len(), per_block);
    assert_eq!(seq.blocks[0].bytes.len(), per_block * 1000);

    // A payload larger than a block gets a block of its own.
    let mut seq = Seq::new(1);
    seq.append(0, b"small");
    let big = payload_for(2, BLOCK_BYTES_MAX + 1);
    seq.append(0, &big);
    seq.append(0, b"after");
    assert_eq!(seq.blocks.len(), 3);
    assert_eq!(seq.blocks[1].ends.len(), 1);
    assert_eq!(seq.get(2).map(|m| m.payload), Some(&big[..]));
    assert_eq!(seq.get(3).map(|m| m.payload), Some(&b"after"[..]));
    // Zero-byte messages are bounded by the count alone.
    let mut seq = Seq::new(1);
    fill(&mut seq, BLOCK_MESSAGES_MAX + 1, 0);
    assert_eq!(seq.blocks.len(), 2);
}

#[test]
fn seq_block_is_freed_and_popped_when_all_its_messages_are_released() {
    let n = BLOCK_MESSAGES_MAX as u64;
    let mut seq = Seq::new(1);
    fill(&mut seq, BLOCK_MESSAGES_MAX + 1, 64);
    let full = seq.heap_bytes();
    // Out of order; the last live message keeps the block.
    for id in (2..=n).rev() {
        seq.release(id);
    }
    assert_eq!(seq.blocks.len(), 2);
    assert_eq!(seq.get(1).map(|m| m.payload), Some(&payload_for(1, 64)[..]));
    seq.release(1);
    assert_eq!(seq.blocks.len(), 1, "the emptied front block is gone");
    assert_eq!(seq.blocks[0].first_id, n + 1);
    assert!(seq.heap_bytes() < full / 100, "{} of {full} bytes left", seq.heap_bytes());
    assert_eq!(live_ids(&seq), [n + 1]);
    // The open block is never freed: it takes the next message.
    seq.release(n + 1);
    assert_eq!(seq.blocks.len(), 1);
    assert_eq!(seq.live(), 0);
    assert_eq!(seq.append(0, b"x").0, n + 2);
    assert_eq!(seq.blocks.len(), 1);
    assert_eq!(live_ids(&seq), [n + 2]);
}

#[test]
fn seq_shrinks_a_block_when_live_bytes_fall_below_a_quarter() {
    let n = BLOCK_MESSAGES_MAX as u64;
    let mut seq = Seq::new(1);
    // 4096 messages of 256 bytes fill one block to exactly 1 MiB.
    fill(&mut seq, BLOCK_MESSAGES_MAX + 1, 256);
    assert_eq!(seq.blocks[0].bytes.len(), BLOCK_BYTES_MAX);
    let before = seq.heap_bytes();
    // Keep every fifth message: 820 of 4096, about a fifth of the bytes.
    for id in (1..=n).filter(|id| id % 5 != 0) {
        seq.release(id);
        let b = &seq.blocks[0];
        assert!(
            b.bytes.len() as u64 <= 4 * b.live_bytes || b.bytes.len() < BLOCK_BYTES_MAX,
            "after releasing {id}: {} live bytes in a buffer of {}",
            b.live_bytes,
            b.bytes.len()
        );
    }
    let kept: Vec<MsgId> = (1..=n).filter(|id| id % 5 == 0).collect();
    let b = &seq.blocks[0];
    assert!(b.bytes.capacity() < BLOCK_BYTES_MAX / 4, "buffer rewritten: capacity {}", b.bytes.capacity());
    assert!(seq.heap_bytes() < before - (BLOCK_BYTES_MAX as u64) / 2);
    // Every survivor still reads back its own payload and born time.
    for &id in &kept {
        assert_eq!(seq.get(id).map(|m| m.payload), Some(&payload_for(id, 256)[..]), "id {id}");
    }
    let mut expected = kept.clone();
    expected.push(n + 1);
    assert_eq!(live_ids(&seq), expected);
    // Release more: a second rewrite keeps the payloads right too.
    for &id in kept.iter().filter(|id| *id % 3 != 0) {
        seq.release(id);
    }
    for m in seq.iter_live() {
        assert_eq!(m.payload, &payload_for(m.id, 256)[..], "id {}", m.id);
    }
    assert_eq!(seq.live_bytes(), 256 * seq.live());
}

#[test]
fn seq_iter_live_is_in_id_order_across_blocks() {
    let mut seq = Seq::new(3);
    let mut expected = Vec::new();
    let mut id = 3;
    for i in 0..3000u64 {
        id += [0, 1, 0, 5, 0, 4100][(i % 6) as usize];
        seq.insert(id, i, &payload_for(id, (i % 13) as usize));
        expected.push((id, i));
        id += 1;
    }
    assert!(seq.blocks.len() > 100, "large gaps made many blocks: {}", seq.blocks.len());
    let expected: Vec<(MsgId, u64)> =
        expected.into_iter().enumerate().filter(|(i, _)| i % 3 != 2).map(|e| e.1).collect();
    let released: Vec<MsgId> =
        seq.iter_live().map(|m| m.id).filter(|id| !expected.iter().any(|e| e.0 == *id)).collect();
    for id in released {
        seq.release(id);
    }
    let got: Vec<(MsgId, u64)> = seq.iter_live().map(|m| (m.id, m.born_ms)).collect();
    assert_eq!(got, expected);
    for m in seq.iter_live() {
        assert_eq!(m.payload.len(), (m.born_ms % 13) as usize);
        assert_eq!(m.payload, &payload_for(m.id, m.payload.len())[..]);
    }
}

#[test]
fn seq_heap_bytes_decrease_as_blocks_are_released() {
    let n = BLOCK_MESSAGES_MAX as u64;
    let mut seq = Seq::new(1);
    fill(&mut seq, 4 * BLOCK_MESSAGES_MAX, 100);
    let mut last = seq.heap_bytes();
    assert!(last >= 4 * n * 100, "payloads are counted");
    for block in 0..3 {
        for id in block * n + 1..=(block + 1) * n {
            seq.release(id);
            assert!(seq.heap_bytes() <= last, "released {id}: heap grew");
        }
        let now = seq.heap_bytes();
        assert!(now + n * 100 <= last, "block {block}: {last} -> {now}");
        last = now;
    }
    // Only the open block remains.
    assert_eq!(seq.blocks.len(), 1);
    assert!(last >= n * 100);
}

#[test]
fn seq_memory_per_message_is_within_target() {
    const N: u64 = 100_000;
    const PAYLOAD_BYTES: u64 = 100;
    let mut seq = Seq::new(1);
    let payload = [0xA5u8; PAYLOAD_BYTES as usize];
    for i in 0..N {
        seq.append(1_700_000_000_000 + i, &payload);
    }
    let heap = seq.heap_bytes();
    let per_message = heap as f64 / N as f64;
    println!(
        "seq memory: {heap} heap bytes for {N} messages of {PAYLOAD_BYTES} bytes = {per_message:.2} bytes/message \
         ({:.2} bytes overhead)",
        per_message - PAYLOAD_BYTES as f64
    );
    assert!(heap <= N * (PAYLOAD_BYTES + 24), "{per_message:.2} bytes per message");
}

/// Regression: a block emptied while it was still the open one used to
/// keep its whole buffer after closing, behind any live front message.
#[test]
fn seq_block_emptied_while_open_is_freed_when_it_closes() {
    let n = BLOCK_MESSAGES_MAX as u64;
    let mut seq = Seq::new(1);
    // Block 0: message 1 stays live (a slow consumer holds it).
    fill(&mut seq, BLOCK_MESSAGES_MAX + 1, 200);
    for id in 2..=n {
        seq.release(id);
    }
    // Block 1 fills and is fully acknowledged while it is still open, as
    // with a consumer that keeps up.
    fill(&mut seq, BLOCK_MESSAGES_MAX - 1, 200);
    for id in n + 1..=2 * n {
        seq.release(id);
    }
    // The next message closes block 1 with nothing live in it.
    fill(&mut seq, 1, 200);
    assert_eq!(live_ids(&seq), [1, 2 * n + 1]);
    let b1 = &seq.blocks[1];
    assert_eq!((b1.live, b1.closed), (0, true));
    assert_eq!(b1.bytes.capacity(), 0, "an empty closed block keeps its {} payload bytes", b1.bytes.len());
    assert!(seq.heap_bytes() < 128 << 10, "heap {} bytes for 2 live messages of 200 bytes", seq.heap_bytes());
}

/// Regression: a block mostly released while open used to keep its whole
/// buffer after closing, so one slow message pinned 1 MiB.
#[test]
fn seq_block_mostly_released_while_open_is_shrunk_when_it_closes() {
    let n = BLOCK_MESSAGES_MAX as u64;
    let mut seq = Seq::new(1);
    fill(&mut seq, BLOCK_MESSAGES_MAX, 256);
    for id in 2..=n {
        seq.release(id);
    }
    fill(&mut seq, 1, 256);
    let b0 = &seq.blocks[0];
    assert!(b0.closed);
    assert_eq!(b0.live_bytes, 256);
    assert!(
        b0.bytes.capacity() < BLOCK_BYTES_MAX / 4,
        "closed block with {} live bytes keeps a buffer of {}",
        b0.live_bytes,
        b0.bytes.capacity()
    );
    assert_eq!(seq.get(1).map(|m| m.payload), Some(&payload_for(1, 256)[..]));
}

// ---------------------------------------------------------------------------
// Topic
// ---------------------------------------------------------------------------

fn settings(max_deliveries: u16) -> Settings {
    Settings { ack_timeout_ms: 30_000, max_deliveries, dedup_window_ms: None, retention: Default::default() }
}

#[test]
fn topic_appended_messages_are_invisible_until_published() {
    let mut t = new_topic("t", Settings::default(), 1);
    let mut timers = FakeTimers::new(0);
    let a = t.produce(10, b"a").0;
    let b = t.produce(10, b"b").0;
    assert_eq!((a, b), (1, 2));
    assert!(!t.has_ready(G));
    assert_eq!((t.ready(G), t.seq.unpublished()), (0, 2));
    assert_eq!(fetch(&mut t, &mut timers, 1, 10, u64::MAX, 100), []);
    assert!(timers.wheel.is_empty());
    t.publish();
    assert_eq!((t.ready(G), t.seq.unpublished()), (2, 0));
    assert!(t.has_ready(G));
    let c = t.produce(10, b"c").0;
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 100), [(a, 1), (b, 1)], "c is not published yet");
    assert_eq!((t.ready(G), t.inflight(G), t.seq.unpublished()), (0, 2, 1));
    t.publish();
    t.publish();
    assert_eq!((t.ready(G), t.seq.unpublished()), (1, 0), "publishing twice changes nothing");
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 100), [(c, 1)]);
    assert_eq!(t.counters(G).produced, 3);
}

#[test]
fn topic_withdrawn_messages_never_become_visible_and_ids_are_not_reused() {
    let mut t = new_topic("t", Settings::default(), 1);
    let mut timers = FakeTimers::new(0);
    let a = produce(&mut t, 0, &[b"a"])[0];
    let first = t.produce(0, b"b").0;
    t.produce(0, b"c");
    let kept = t.produce(0, b"d").0;
    assert_eq!(t.counters(G).produced, 4);
    t.withdraw(first, 2);
    assert_eq!(t.counters(G).produced, 2, "a withdrawn produce was never produced");
    assert!(!t.seq.contains(first) && !t.seq.contains(first + 1));
    assert_eq!(t.seq.unpublished(), 1);
    t.publish();
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 100), [(a, 1), (kept, 1)]);
    assert_eq!(t.produce(0, b"e").0, kept + 1, "ids are not reused");
    // Withdrawing again, or ids that are gone, changes nothing.
    t.withdraw(first, 2);
    assert_eq!(t.counters(G).produced, 3);
    // A withdrawn dead letter takes its dead info with it.
    let mut dlq = new_topic("t.dlq", Settings::default(), 1);
    let info = DeadInfo { origin_id: 7, origin_deliveries: 3, reason: DeadReason::Nacked };
    let d = dlq.append_moved(0, b"x", Some(info));
    assert_eq!(dlq.seq.dead_info(d), Some(info));
    dlq.withdraw(d, 1);
    assert_eq!(dlq.seq.dead_info(d), None);
    assert_eq!((dlq.counters(G).produced, dlq.seq.live()), (0, 0));
}

#[test]
fn topic_publish_makes_only_unwithdrawn_messages_ready() {
    let mut t = new_topic("t", Settings::default(), 1);
    t.produce(0, b"a");
    let b = t.produce(0, b"b").0;
    t.withdraw(b, 1);
    t.publish();
    assert_eq!(t.ready(G), 1, "only a became ready");
    t.produce(0, b"c");
    t.publish();
    assert_eq!(t.ready(G), 2);
}

#[test]
fn topic_publish_after_purge_makes_nothing_ready() {
    let mut t = new_topic("t", Settings::default(), 1);
    let mut timers = FakeTimers::new(0);
    t.produce(0, b"a");
    t.purge(&mut timers);
    t.publish();
    assert_eq!(t.ready(G), 0, "the purged message never becomes ready");
    assert!(!t.has_ready(G));
}

#[test]
fn topic_publish_after_id_bump_makes_only_messages_ready() {
    let mut t = new_topic("t", Settings::default(), 1);
    t.seq.bump_next_id(100);
    t.produce(0, b"b");
    t.publish();
    assert_eq!(t.ready(G), 1, "ids skipped by bump_next_id are not messages");
}

#[test]
fn topic_fetch_serves_retries_before_fresh_messages() {
    let mut t = new_topic("t", Settings::default(), 1);
    let mut timers = FakeTimers::new(0);
    produce(&mut t, 0, &[b"1", b"2", b"3", b"4", b"5"]);
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 100).len(), 5);
    produce(&mut t, 0, &[b"6", b"7"]);
    assert_eq!(t.nack(G, 3, None, false, &mut timers), Some(Returned::Retry));
    assert_eq!(t.nack(G, 1, None, false, &mut timers), Some(Returned::Retry));
    assert_eq!(t.nack(G, 4, Some(50), false, &mut timers), Some(Returned::Retry));
    assert!(t.ack(G, 2, &mut timers));
    // 4's delay ends (at 50), then 5's ack deadline passes (at 100): both
    // join the retry queue behind 3 and 1, in that order.
    assert_eq!(fire(&mut t, &mut timers, 100), [(4, Returned::Retry), (5, Returned::Retry)]);
    let got = fetch(&mut t, &mut timers, 2, 3, u64::MAX, 200);
    assert_eq!(got.iter().map(|d| (d.id, d.deliveries)).collect::<Vec<_>>(), [(3, 2), (1, 2), (4, 2)]);
    assert_eq!(fetch_all(&mut t, &mut timers, 2, 200), [(5, 2), (6, 1), (7, 1)]);
    assert!(!t.has_ready(G));
}

#[test]
fn topic_fetch_max_bytes_takes_at_least_one_message() {
    let mut t = new_topic("t", Settings::default(), 1);
    let mut timers = FakeTimers::new(0);
    let ten = [1u8; 10];
    produce(&mut t, 0, &[&ten, &ten, &ten, &ten, &[2u8; 100], &ten, b"", b""]);
    let ids = |v: Vec<Delivery>| v.iter().map(|d| d.id).collect::<Vec<_>>();
    assert_eq!(ids(fetch(&mut t, &mut timers, 1, 0, u64::MAX, 9)), Vec::<MsgId>::new(), "max_messages 0");
    assert_eq!(ids(fetch(&mut t, &mut timers, 1, 10, 0, 9)), [1], "one even past max_bytes");
    assert_eq!(ids(fetch(&mut t, &mut timers, 1, 10, 19, 9)), [2]);
    assert_eq!(ids(fetch(&mut t, &mut timers, 1, 10, 20, 9)), [3, 4], "exactly max_bytes fits");
    assert_eq!(ids(fetch(&mut t, &mut timers, 1, 10, 50, 9)), [5], "a large first message still goes");
    assert_eq!(ids(fetch(&mut t, &mut timers, 1, 10, 10, 9)), [6, 7, 8], "empty payloads cost nothing");
    assert_eq!(ids(fetch(&mut t, &mut timers, 1, 10, 10, 9)), Vec::<MsgId>::new());
    // It stops at the first message that does not fit; it does not skip.
    produce(&mut t, 0, &[&ten, &[3u8; 30], b"z"]);
    assert_eq!(ids(fetch(&mut t, &mut timers, 1, 10, 25, 9)), [9]);
    assert_eq!(ids(fetch(&mut t, &mut timers, 1, 2, u64::MAX, 9)), [10, 11], "max_messages");
}

#[test]
fn topic_ack_only_succeeds_for_delivered_unacknowledged_messages() {
    let mut t = new_topic("t", Settings::default(), 1);
    let mut timers = FakeTimers::new(0);
    produce(&mut t, 0, &[b"1", b"2", b"3", b"4", b"5"]);
    let unpublished = t.produce(0, b"6").0;
    fetch(&mut t, &mut timers, 1, 3, u64::MAX, 100);
    assert!(!t.ack(G, 4, &mut timers), "never delivered");
    assert!(!t.ack(G, unpublished, &mut timers), "not published");
    assert!(!t.ack(G, 0, &mut timers) && !t.ack(G, 99, &mut timers), "unknown");
    assert!(t.ack(G, 1, &mut timers));
    assert!(!t.ack(G, 1, &mut timers), "acked twice");
    assert!(!t.seq.contains(1));
    // A message back in ready or delayed after a failed delivery can still
    // be acknowledged; its timer goes with it.
    t.nack(G, 2, None, false, &mut timers);
    t.nack(G, 3, Some(1_000), false, &mut timers);
    assert_eq!((t.ready(G), t.inflight(G), t.delayed(G)), (3, 0, 1));
    assert!(t.ack(G, 2, &mut timers), "retry-ready");
    assert!(t.ack(G, 3, &mut timers), "delayed");
    assert!(timers.wheel.is_empty(), "every timer disarmed");
    assert_eq!(timers.stale_disarms, 0);
    assert_eq!((t.ready(G), t.inflight(G), t.delayed(G)), (2, 0, 0));
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 100), [(4, 1), (5, 1)], "acked retries are skipped");
    assert_eq!(t.counters(G).acked, 3);
    assert_eq!(fire(&mut t, &mut timers, 2_000), [(4, Returned::Retry), (5, Returned::Retry)]);
}

#[test]
fn topic_nack_returns_now_or_after_a_delay() {
    let mut t = new_topic("t", settings(5), 1);
    let mut timers = FakeTimers::new(0);
    produce(&mut t, 0, &[b"a", b"b"]);
    assert_eq!(t.nack(G, 1, None, false, &mut timers), None, "not in flight");
    fetch_all(&mut t, &mut timers, 1, 100);
    assert_eq!(t.nack(G, 1, None, false, &mut timers), Some(Returned::Retry));
    assert_eq!(t.nack(G, 1, None, false, &mut timers), None, "no longer in flight");
    assert_eq!(t.nack(G, 2, Some(40), false, &mut timers), Some(Returned::Retry));
    assert_eq!((t.ready(G), t.inflight(G), t.delayed(G)), (1, 0, 1));
    assert_eq!(t.deliveries(G, 2), 1);
    assert_eq!(timers.wheel.len(), 1, "the ack deadline went, the delay came");
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 100), [(1, 2)], "a delayed message is not ready");
    assert_eq!(fire(&mut t, &mut timers, 39), []);
    assert_eq!(fire(&mut t, &mut timers, 40), [(2, Returned::Retry)]);
    assert_eq!((t.ready(G), t.inflight(G), t.delayed(G)), (1, 1, 0));
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 100), [(2, 2)]);
    assert_eq!(t.counters(G).nacked, 2);
    assert_eq!(t.counters(G).expired, 0, "a delay ending is not an expiry");
}

#[test]
fn topic_touch_moves_the_ack_deadline() {
    let mut t = new_topic("t", Settings::default(), 1);
    let mut timers = FakeTimers::new(0);
    produce(&mut t, 0, &[b"a", b"b"]);
    assert!(!t.touch(G, 1, 500, &mut timers), "not in flight");
    fetch(&mut t, &mut timers, 1, 1, u64::MAX, 100);
    assert!(t.touch(G, 1, 500, &mut timers));
    assert!(!t.touch(G, 2, 500, &mut timers), "ready, not in flight");
    assert!(!t.touch(G, 9, 500, &mut timers), "unknown");
    assert_eq!(timers.wheel.len(), 1, "the old deadline was disarmed");
    assert_eq!(fire(&mut t, &mut timers, 499), []);
    assert!(t.touch(G, 1, 200, &mut timers), "a deadline may also move earlier (or into the past)");
    assert_eq!(fire(&mut t, &mut timers, 499), [(1, Returned::Retry)]);
    assert!(!t.touch(G, 1, 900, &mut timers), "expired");
    assert_eq!(t.counters(G).expired, 1);
}

#[test]
fn topic_expired_delivery_returns_to_ready() {
    let mut t = new_topic("t", Settings::default(), 1);
    let mut timers = FakeTimers::new(1_000);
    produce(&mut t, 0, &[b"a", b"b"]);
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 1_100), [(1, 1), (2, 1)]);
    assert!(t.ack(G, 2, &mut timers));
    assert_eq!(fire(&mut t, &mut timers, 1_099), []);
    assert_eq!(t.inflight(G), 1);
    assert_eq!(fire(&mut t, &mut timers, 1_100), [(1, Returned::Retry)]);
    assert_eq!((t.ready(G), t.inflight(G), t.counters(G).expired), (1, 0, 1));
    assert!(!t.ack(G, 3, &mut timers));
    assert_eq!(t.deliveries(G, 1), 1);
    assert_eq!(fetch_all(&mut t, &mut timers, 2, 2_000), [(1, 2)]);
    assert_eq!(t.deliveries(G, 1), 2);
    // A timer for an id the topic no longer tracks is ignored.
    assert_eq!(t.timer_fired(G, 2, &mut timers), None);
    assert_eq!(t.timer_fired(G, 77, &mut timers), None);
}

#[test]
fn topic_disconnect_returns_everything_in_flight_to_that_consumer() {
    let mut t = new_topic("t", settings(3), 1);
    let mut timers = FakeTimers::new(0);
    produce(&mut t, 0, &[b"a", b"b", b"c", b"d"]);
    assert_eq!(fetch_all(&mut t, &mut timers, 7, 100).len(), 4);
    // 1 goes round to consumer 8; 2 is acked; 3 and 4 stay with 7.
    t.nack(G, 1, None, false, &mut timers);
    assert_eq!(fetch(&mut t, &mut timers, 8, 1, u64::MAX, 100)[0].id, 1);
    t.ack(G, 2, &mut timers);
    let mut dead_seen = Vec::new();
    assert_eq!(t.disconnect(G, 7, &mut timers, |id, info| dead_seen.push((id, info))).len(), 2);
    assert!(dead_seen.is_empty());
    assert_eq!((t.ready(G), t.inflight(G)), (2, 1));
    assert_eq!(timers.wheel.len(), 1, "only 8's deadline is left");
    assert_eq!(t.disconnect(G, 7, &mut timers, |_, _| panic!("nothing left")).len(), 0);
    assert_eq!(t.disconnect(G, 99, &mut timers, |_, _| panic!("unknown")).len(), 0);
    assert_eq!(t.counters(G).expired + t.counters(G).nacked, 1, "a disconnect is neither");
    assert_eq!(fetch_all(&mut t, &mut timers, 8, 100), [(3, 2), (4, 2)]);
    assert_eq!(t.disconnect(G, 8, &mut timers, |_, _| panic!("not out of deliveries")).len(), 3);
    assert!(timers.wheel.is_empty());
    assert_eq!(timers.stale_disarms, 0);
}

#[test]
fn topic_dead_outcomes_at_max_deliveries_and_for_rejected() {
    let mut t = new_topic("t", settings(2), 1);
    let mut timers = FakeTimers::new(0);
    produce(&mut t, 0, &[b"timeout", b"nacked", b"lost", b"rejected", b"delayed"]);
    fetch_all(&mut t, &mut timers, 1, 10);
    assert_eq!(t.nack(G, 4, None, true, &mut timers), Some(dead(4, 1, DeadReason::Rejected)), "at once");
    assert!(t.seq.contains(4), "the caller moves it, then releases it");
    t.dead_lettered(G, 4);
    assert_eq!(fire(&mut t, &mut timers, 10).len(), 4, "first deadlines pass");
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 20), [(1, 2), (2, 2), (3, 2), (5, 2)]);
    assert_eq!(t.nack(G, 2, None, false, &mut timers), Some(dead(2, 2, DeadReason::Nacked)));
    assert_eq!(t.nack(G, 5, Some(500), false, &mut timers), Some(dead(5, 2, DeadReason::Nacked)), "no delay");
    assert_eq!(timers.wheel.len(), 2, "no timer armed for a dead message");
    let mut lost = Vec::new();
    assert_eq!(t.disconnect(G, 9, &mut timers, |_, _| {}).len(), 0);
    t.touch(G, 3, 30, &mut timers);
    assert_eq!(fire(&mut t, &mut timers, 20), [(1, dead(1, 2, DeadReason::AckTimeout))]);
    // 3 went to consumer 1, which now disconnects.
    assert_eq!(t.disconnect(G, 1, &mut timers, |id, info| lost.push((id, Returned::Dead(info)))).len(), 0);
    assert_eq!(lost, [(3, dead(3, 2, DeadReason::ConsumerLost))]);
    assert_eq!((t.ready(G), t.inflight(G), t.delayed(G)), (0, 0, 0), "dead, not yet settled: in no table");
    for id in [1, 2, 3, 5] {
        t.dead_lettered(G, id);
    }
    assert_eq!((t.ready(G), t.seq.live()), (0, 0));
    assert_eq!(t.counters(G).dead_lettered, 5);
    assert_eq!(t.counters(G).expired, 5);
    assert_eq!(t.counters(G).nacked, 3);
    assert!(timers.wheel.is_empty());
}

#[test]
fn topic_dead_message_requeued_when_the_dead_letter_topic_is_full() {
    let mut t = new_topic("t", settings(1), 1);
    let mut timers = FakeTimers::new(0);
    produce(&mut t, 0, &[b"a", b"b"]);
    fetch_all(&mut t, &mut timers, 1, 10);
    let Some(Returned::Dead(info)) = t.nack(G, 1, None, false, &mut timers) else { panic!("max_deliveries 1") };
    t.requeue(G, 1, info.origin_deliveries);
    assert_eq!(t.deliveries(G, 1), 1);
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 10), [(1, 2)], "back at the front");
    assert_eq!(t.counters(G).redelivered, 1);
}

#[test]
fn topic_dlq_topics_never_dead_letter() {
    let mut t = new_topic("orders.dlq", settings(1), 1);
    assert!(t.is_dlq());
    let mut timers = FakeTimers::new(0);
    let info = DeadInfo { origin_id: 40, origin_deliveries: 1, reason: DeadReason::Rejected };
    t.append_moved(0, b"a", Some(info));
    t.append_moved(0, b"b", Some(info));
    t.produce(0, b"c");
    t.publish();
    fetch_all(&mut t, &mut timers, 1, 10);
    assert_eq!(t.nack(G, 1, None, true, &mut timers), Some(Returned::Retry), "not even rejected ones");
    assert_eq!(t.nack(G, 2, None, false, &mut timers), Some(Returned::Retry));
    assert_eq!(fire(&mut t, &mut timers, 10), [(3, Returned::Retry)]);
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 20), [(1, 2), (2, 2), (3, 2)]);
    assert_eq!(t.disconnect(G, 1, &mut timers, |_, _| panic!("a dlq never dead-letters")).len(), 3);
    assert_eq!(t.seq.dead_info(1), Some(info));
    assert_eq!(t.seq.dead_info(3), None);
    assert_eq!(fetch_all(&mut t, &mut timers, 2, 20), [(1, 3), (2, 3), (3, 3)]);
    t.ack(G, 1, &mut timers);
    assert_eq!(t.seq.dead_info(1), None, "released with its message");
}

#[test]
fn topic_purge_removes_everything_and_disarms_timers() {
    let mut t = new_topic("t", Settings::default(), 1);
    let mut timers = FakeTimers::new(0);
    produce(&mut t, 0, &[b"1", b"2", b"3", b"4", b"5", b"6"]);
    fetch(&mut t, &mut timers, 1, 4, u64::MAX, 100);
    t.nack(G, 1, Some(50), false, &mut timers); // delayed
    t.nack(G, 2, None, false, &mut timers); // retry-ready
    // 3, 4 in flight; 5, 6 ready; 7 appended, not published.
    let unpublished = t.produce(0, b"7").0;
    assert_eq!((t.ready(G), t.inflight(G), t.delayed(G), t.seq.unpublished()), (3, 2, 1, 1));
    assert_eq!(t.purge(&mut timers), 7);
    assert!(timers.wheel.is_empty(), "every timer disarmed");
    assert_eq!(timers.stale_disarms, 0);
    assert_eq!((t.ready(G), t.inflight(G), t.delayed(G), t.seq.unpublished()), (0, 0, 0, 0));
    assert_eq!((t.seq.live(), t.seq.live_bytes()), (0, 0));
    assert!(!t.has_ready(G));
    for id in 1..=7 {
        assert!(!t.ack(G, id, &mut timers), "ack {id}");
        assert_eq!(t.nack(G, id, None, false, &mut timers), None);
        assert_eq!(t.timer_fired(G, id, &mut timers), None);
    }
    assert_eq!(t.disconnect(G, 1, &mut timers, |_, _| panic!("purged")).len(), 0);
    // The failed commit of the purged produce withdraws nothing.
    t.withdraw(unpublished, 1);
    assert_eq!(t.counters(G).produced, 7);
    t.publish();
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 100), []);
    let ids = produce(&mut t, 0, &[b"8"]);
    assert_eq!(ids, [8]);
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 100), [(8, 1)]);
    assert_eq!(t.purge(&mut timers), 1);
    assert_eq!(t.purge(&mut timers), 0);
}

#[test]
fn topic_drain_ready_takes_retries_then_fresh_messages() {
    let mut t = new_topic("t.dlq", Settings::default(), 1);
    let mut timers = FakeTimers::new(0);
    let info = DeadInfo { origin_id: 9, origin_deliveries: 4, reason: DeadReason::AckTimeout };
    for p in [b"1", b"2", b"3", b"4", b"5"] {
        t.append_moved(100, p, Some(info));
    }
    t.produce(100, b"6");
    t.publish();
    fetch(&mut t, &mut timers, 1, 3, u64::MAX, 100);
    t.nack(G, 2, None, false, &mut timers);
    t.nack(G, 3, Some(50), false, &mut timers);
    // Ready: 2 (retry), 4, 5, 6. In flight: 1. Delayed: 3.
    let mut seen = Vec::new();
    let n = t.drain_ready(G, 2, |m, d| {
        seen.push((m.id, m.payload.to_vec(), d));
        true
    });
    assert_eq!(n, 2);
    assert_eq!(seen, [(2, b"2".to_vec(), Some(info)), (4, b"4".to_vec(), Some(info))]);
    assert!(!t.seq.contains(2) && !t.seq.contains(4), "drained messages are released");
    assert_eq!(t.seq.dead_info(2), None);
    // The callback can refuse (the target is full): that message stays.
    let mut calls = 0;
    assert_eq!(
        t.drain_ready(G, u64::MAX, |_, _| {
            calls += 1;
            calls == 1
        }),
        1
    );
    assert_eq!((t.ready(G), t.inflight(G), t.delayed(G)), (1, 1, 1));
    let mut rest = Vec::new();
    let n = t.drain_ready(G, u64::MAX, |m, d| {
        rest.push((m.id, d.is_some()));
        true
    });
    assert_eq!(n, 1);
    assert_eq!(rest, [(6, false)]);
    assert_eq!(t.drain_ready(G, u64::MAX, |_, _| panic!("nothing ready")), 0);
    assert_eq!(live_ids(&t.seq), [1, 3], "in flight and delayed stay");
    assert_eq!(t.counters(G).acked + t.counters(G).delivered, 3, "a drain is neither an ack nor a delivery");
}

#[test]
fn topic_restore_carries_delivery_counts_into_the_next_delivery() {
    let mut t = new_topic("t", settings(4), 3);
    let mut timers = FakeTimers::new(0);
    let info = DeadInfo { origin_id: 1, origin_deliveries: 2, reason: DeadReason::Nacked };
    let mut r = Recovery::new();
    r.restore(&mut t, 5, 50, b"five", 0, None);
    r.restore(&mut t, 7, 70, b"seven", 2, None);
    r.restore(&mut t, 8, 80, b"eight", 1, None);
    r.restore(&mut t, 9_000, 90, b"far", 0, Some(info));
    r.restore(&mut t, 9_001, 91, b"tired", 3, None);
    r.deliveries(5, 3); // a requeue record
    r.deliveries(6, 1); // for a message that is gone: ignored
    r.done.push(8); // an ack record
    r.finish(&mut t);
    assert_eq!((t.ready(G), t.inflight(G), t.seq.unpublished()), (4, 0, 0));
    assert!(t.has_ready(G));
    assert_eq!((t.deliveries(G, 5), t.deliveries(G, 7), t.deliveries(G, 9_000)), (3, 2, 0));
    assert_eq!(t.seq.get(7).map(|m| (m.born_ms, m.payload)), Some((70, &b"seven"[..])));
    assert_eq!(t.seq.dead_info(9_000), Some(info));
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 10), [(5, 4), (7, 3), (9_000, 1), (9_001, 4)]);
    assert_eq!(t.counters(G).redelivered, 3, "carried deliveries make a redelivery");
    assert_eq!(t.counters(G).produced, 0, "recovery is not a produce");
    assert_eq!(t.nack(G, 5, None, false, &mut timers), Some(dead(5, 4, DeadReason::Nacked)));
    assert_eq!(t.nack(G, 7, None, false, &mut timers), Some(Returned::Retry));
    assert_eq!(t.produce(100, b"new").0, 9_002, "ids continue after the last restored");
    t.publish();
    t.dead_lettered(G, 5);
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 10), [(7, 4), (9_002, 1)]);

    // A recovered topic whose every message was acknowledged.
    let mut t = new_topic("t", settings(4), 1);
    let mut r = Recovery::new();
    r.restore(&mut t, 1, 0, b"a", 0, None);
    r.done.push(1);
    r.finish(&mut t);
    assert_eq!((t.ready(G), t.seq.next_id()), (0, 2));
    assert!(!t.has_ready(G));
    t.produce(0, b"b");
    t.publish();
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 10), [(2, 1)]);
}

#[test]
fn topic_recovery_keeps_no_carried_deliveries_for_released_messages() {
    let mut t = new_topic("t", settings(4), 1);
    let mut r = Recovery::new();
    r.restore(&mut t, 1, 0, b"acked before the restart", 0, None);
    r.restore(&mut t, 2, 0, b"still queued", 0, None);
    r.deliveries(1, 2); // its requeue record
    r.deliveries(2, 1);
    r.done.push(1); // its ack record
    r.finish(&mut t);
    let mut carried: Vec<MsgId> = t.group(G).expect("default").carried.keys().copied().collect();
    carried.sort_unstable();
    assert_eq!(carried, [2], "only live messages carry deliveries");
}

#[test]
fn topic_counters() {
    let mut t = new_topic("t", settings(2), 1);
    let mut timers = FakeTimers::new(0);
    produce(&mut t, 0, &[b"1", b"2", b"3", b"4"]);
    let w = t.produce(0, b"5").0;
    t.withdraw(w, 1);
    fetch_all(&mut t, &mut timers, 1, 10); // delivered 4
    t.ack(G, 1, &mut timers); // acked 1
    t.nack(G, 2, None, false, &mut timers); // nacked 1
    t.nack(G, 3, Some(5), false, &mut timers); // nacked 2
    fire(&mut t, &mut timers, 10); // 4 expired, 3's delay ends
    fetch_all(&mut t, &mut timers, 1, 20); // delivered 7, redelivered 3
    t.nack(G, 2, None, false, &mut timers); // nacked 3, dead
    t.dead_lettered(G, 2);
    t.ack(G, 3, &mut timers);
    t.ack(G, 4, &mut timers);
    assert!(!t.ack(G, 4, &mut timers));
    assert_eq!(t.nack(G, 4, None, false, &mut timers), None, "a failed nack is not counted");
    let expected = Counters {
        produced: 4,
        delivered: 7,
        redelivered: 3,
        acked: 3,
        nacked: 3,
        dead_lettered: 1,
        expired: 1,
        filtered: 0,
    };
    assert_eq!(t.counters(G), expected);
}

// ---------------------------------------------------------------------------
// Groups: a message leaves the sequence once every group is done with it
// ---------------------------------------------------------------------------

#[test]
fn topic_releases_a_message_once_every_group_is_done_with_it() {
    let mut t = new_topic("t", settings(2), 1);
    let second = t.add_group("second", GroupConfig::default(), 0);
    let mut timers = FakeTimers::new(0);
    let ids = produce(&mut t, 0, &[b"a", b"b", b"c", b"d"]);
    // The default group reads and acks everything: the second has read
    // nothing, so every message stays.
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 100).len(), 4);
    for &id in &ids {
        assert!(t.ack(G, id, &mut timers));
    }
    assert_eq!(live_ids(&t.seq), ids, "the second group still needs them");
    assert_eq!((t.ready(G), t.ready(second)), (0, 4));
    // The second group's own acks, NACKs and dead letters.
    let of_second = |t: &mut Topic, timers: &mut FakeTimers, max_messages| {
        let mut got = Vec::new();
        let take = Take { owner: 2, max_messages, max_bytes: u64::MAX, deadline_ms: 100 };
        t.fetch(second, take, timers, |_, d| got.push((d.id, d.deliveries)));
        got
    };
    assert_eq!(of_second(&mut t, &mut timers, 4), [(1, 1), (2, 1), (3, 1), (4, 1)]);
    assert!(t.ack(second, 1, &mut timers));
    assert!(!t.seq.contains(1), "both groups are done with 1");
    assert_eq!(t.nack(second, 2, None, false, &mut timers), Some(Returned::Retry));
    assert!(t.seq.contains(2), "back for retry in the second group");
    let Some(Returned::Dead(_)) = t.nack(second, 3, None, true, &mut timers) else { panic!("rejected") };
    t.dead_lettered(second, 3);
    assert!(!t.seq.contains(3), "dead-lettered for the second, acked by the default");
    assert_eq!(live_ids(&t.seq), [2, 4]);
    // Each group counts its own.
    assert_eq!((t.counters(G).acked, t.counters(second).acked), (4, 1));
    assert_eq!((t.counters(G).dead_lettered, t.counters(second).dead_lettered), (0, 1));
    assert_eq!(t.counters(second).produced, 4, "produced is the topic's");
    // A message the default group has not read is needed by it whatever
    // the second group does.
    let e = produce(&mut t, 0, &[b"e"])[0];
    assert_eq!(of_second(&mut t, &mut timers, 2), [(2, 2), (e, 1)]);
    assert!(t.ack(second, e, &mut timers));
    assert!(t.seq.contains(e), "the default group's cursor is below it");
    assert_eq!(fetch_all(&mut t, &mut timers, 1, 100), [(e, 1)]);
    assert!(t.ack(G, e, &mut timers));
    assert!(!t.seq.contains(e));
    // Purge clears every group and their timers.
    assert_eq!(t.purge(&mut timers), 2);
    assert!(timers.wheel.is_empty());
    assert_eq!((t.inflight(G), t.inflight(second), t.seq.live()), (0, 0, 0));
}

#[test]
fn a_group_needs_what_it_has_not_read_and_what_it_holds() {
    let mut t = new_topic("t", settings(5), 1);
    let mut timers = FakeTimers::new(0);
    produce(&mut t, 0, &[b"1", b"2", b"3", b"4", b"5"]);
    fetch(&mut t, &mut timers, 1, 4, u64::MAX, 100);
    t.nack(G, 2, None, false, &mut timers);
    t.nack(G, 3, Some(50), false, &mut timers);
    t.ack(G, 4, &mut timers);
    let g = t.group(G).expect("default");
    // In flight, back for retry, delayed; acked; then at the cursor (5,
    // not yet delivered) and past it.
    let needed: Vec<bool> = (1..=6).map(|id| g.needs(id)).collect();
    assert_eq!(needed, [true, true, true, false, true, true]);
}

// ---------------------------------------------------------------------------
// Randomized model test
// ---------------------------------------------------------------------------

/// Where a message is, in the reference model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Appended, not yet published.
    Unpublished,
    /// Published and not delivered since the start; `carried` deliveries
    /// came over a restart.
    Fresh {
        carried: u16,
    },
    /// Ready again after a failed delivery; its turn is its place in
    /// `Model::retry`.
    Retry {
        deliveries: u16,
    },
    Inflight {
        owner: ConsumerId,
        deadline_ms: u64,
        deliveries: u16,
    },
    Delayed {
        until_ms: u64,
        deliveries: u16,
    },
    /// Out of deliveries; settled (released or requeued) before the
    /// operation ends.
    Dead,
}

struct ModelMsg {
    born_ms: u64,
    payload: Vec<u8>,
    dead: Option<DeadInfo>,
    state: State,
}

/// The topic as the module documentation describes it, written plainly.
struct Model {
    is_dlq: bool,
    max_deliveries: u16,
    next_id: MsgId,
    last_born_ms: u64,
    /// Every live message.
    msgs: BTreeMap<MsgId, ModelMsg>,
    /// Ids in state Retry, in the order they came back.
    retry: VecDeque<MsgId>,
    counters: Counters,
}

impl Model {
    fn new(is_dlq: bool, max_deliveries: u16, first_id: MsgId) -> Model {
        Model {
            is_dlq,
            max_deliveries,
            next_id: first_id.max(1),
            last_born_ms: 0,
            msgs: BTreeMap::new(),
            retry: VecDeque::new(),
            counters: Counters::default(),
        }
    }

    fn state(&self, id: MsgId) -> Option<State> {
        self.msgs.get(&id).map(|m| m.state)
    }

    fn set(&mut self, id: MsgId, state: State) {
        self.msgs.get_mut(&id).expect("model: live message").state = state; // ok: test code, on the test's own data
    }

    fn remove(&mut self, id: MsgId) {
        let m = self.msgs.remove(&id).expect("model: live message"); // ok: test code, on the test's own data
        if matches!(m.state, State::Retry { .. }) {
            self.retry.retain(|&r| r != id);
        }
    }

    fn append(&mut self, born_ms: u64, payload: Vec<u8>, dead: Option<DeadInfo>) -> MsgId {
        // A dead letter keeps the born time it had in its own topic; a new
        // message's born time never goes below the topic's last.
        let born_ms = if dead.is_some() { born_ms } else { born_ms.max(self.last_born_ms) };
        self.last_born_ms = self.last_born_ms.max(born_ms);
        let id = self.next_id;
        self.next_id += 1;
        self.counters.produced += 1;
        self.msgs.insert(id, ModelMsg { born_ms, payload, dead, state: State::Unpublished });
        id
    }

    fn restore(&mut self, id: MsgId, born_ms: u64, payload: Vec<u8>, carried: u16, dead: Option<DeadInfo>) {
        self.last_born_ms = self.last_born_ms.max(born_ms);
        self.next_id = id + 1;
        self.msgs.insert(id, ModelMsg { born_ms, payload, dead, state: State::Fresh { carried } });
    }

    fn withdraw(&mut self, first: MsgId, count: u32) {
        for id in first..first + u64::from(count) {
            if let Some(state) = self.state(id) {
                assert_eq!(state, State::Unpublished, "model: withdrawing a published message");
                self.remove(id);
                self.counters.produced -= 1;
            }
        }
    }

    fn publish(&mut self) {
        for m in self.msgs.values_mut() {
            if m.state == State::Unpublished {
                m.state = State::Fresh { carried: 0 };
            }
        }
    }

    /// The next ready message and its deliveries so far: the oldest retry,
    /// else the lowest fresh id.
    fn peek_ready(&self) -> Option<(MsgId, u16)> {
        if let Some(&id) = self.retry.front() {
            let Some(State::Retry { deliveries }) = self.state(id) else { panic!("model: retry {id} not in Retry") };
            return Some((id, deliveries));
        }
        self.msgs.iter().find_map(|(&id, m)| match m.state {
            State::Fresh { carried } => Some((id, carried)),
            _ => None,
        })
    }

    fn take_ready(&mut self, id: MsgId) {
        if self.retry.front() == Some(&id) {
            self.retry.pop_front();
        }
    }

    fn fetch(&mut self, owner: ConsumerId, max_messages: u32, max_bytes: u64, deadline_ms: u64) -> Vec<Delivery> {
        let mut out = Vec::new();
        let mut bytes = 0;
        while out.len() < max_messages as usize {
            let Some((id, prior)) = self.peek_ready() else { break };
            let len = self.msgs[&id].payload.len() as u64;
            if !out.is_empty() && bytes + len > max_bytes {
                break;
            }
            self.take_ready(id);
            bytes += len;
            let deliveries = prior.saturating_add(1);
            self.set(id, State::Inflight { owner, deadline_ms, deliveries });
            self.counters.delivered += 1;
            if prior > 0 {
                self.counters.redelivered += 1;
            }
            out.push(Delivery { id, deliveries });
        }
        out
    }

    /// What a failed delivery becomes, without changing anything.
    fn outcome(&self, id: MsgId, deliveries: u16, reason: DeadReason) -> Returned {
        if !self.is_dlq && (deliveries >= self.max_deliveries || reason == DeadReason::Rejected) {
            Returned::Dead(DeadInfo { origin_id: id, origin_deliveries: deliveries, reason })
        } else {
            Returned::Retry
        }
    }

    fn give_back(&mut self, id: MsgId, deliveries: u16, delay_until_ms: Option<u64>, reason: DeadReason) -> Returned {
        let r = self.outcome(id, deliveries, reason);
        match (r, delay_until_ms) {
            (Returned::Dead(_), _) => self.set(id, State::Dead),
            (Returned::Retry, Some(until_ms)) => self.set(id, State::Delayed { until_ms, deliveries }),
            (Returned::Retry, None) => self.requeue(id, deliveries),
        }
        r
    }

    fn requeue(&mut self, id: MsgId, deliveries: u16) {
        self.set(id, State::Retry { deliveries });
        self.retry.push_back(id);
    }

    fn ack(&mut self, id: MsgId) -> bool {
        match self.state(id) {
            Some(State::Inflight { .. } | State::Delayed { .. } | State::Retry { .. }) => {
                self.remove(id);
                self.counters.acked += 1;
                true
            }
            _ => false,
        }
    }

    fn nack(&mut self, id: MsgId, delay_until_ms: Option<u64>, dead_letter: bool) -> Option<Returned> {
        let Some(State::Inflight { deliveries, .. }) = self.state(id) else { return None };
        self.counters.nacked += 1;
        let reason = if dead_letter { DeadReason::Rejected } else { DeadReason::Nacked };
        Some(self.give_back(id, deliveries, delay_until_ms, reason))
    }

    fn touch(&mut self, id: MsgId, deadline_ms: u64) -> bool {
        let Some(State::Inflight { owner, deliveries, .. }) = self.state(id) else { return false };
        self.set(id, State::Inflight { owner, deadline_ms, deliveries });
        true
    }

    /// A timer fired; it must be the message's current one.
    fn timer_fired(&mut self, id: MsgId, deadline_ms: u64) -> Result<Returned, String> {
        match self.state(id) {
            Some(State::Inflight { deadline_ms: d, deliveries, .. }) if d == deadline_ms => {
                self.counters.expired += 1;
                Ok(self.give_back(id, deliveries, None, DeadReason::AckTimeout))
            }
            Some(State::Delayed { until_ms, deliveries }) if until_ms == deadline_ms => {
                self.requeue(id, deliveries);
                Ok(Returned::Retry)
            }
            s => Err(format!("timer for {id} at {deadline_ms} fired, but the model has it {s:?}")),
        }
    }

    /// Ids in flight to `owner`, each with the outcome of losing it.
    fn held_by(&self, owner: ConsumerId) -> BTreeMap<MsgId, Returned> {
        self.msgs
            .iter()
            .filter_map(|(&id, m)| match m.state {
                State::Inflight { owner: o, deliveries, .. } if o == owner => {
                    Some((id, self.outcome(id, deliveries, DeadReason::ConsumerLost)))
                }
                _ => None,
            })
            .collect()
    }

    fn purge(&mut self) -> u64 {
        let n = self.msgs.len() as u64;
        self.msgs.clear();
        self.retry.clear();
        n
    }

    /// The messages `drain_ready` takes when its callback accepts `accept`.
    fn drain(&mut self, max: u64, accept: u64) -> Vec<(MsgId, ModelMsg)> {
        let mut out = Vec::new();
        while (out.len() as u64) < max.min(accept) {
            let Some((id, _)) = self.peek_ready() else { break };
            self.take_ready(id);
            out.push((id, self.msgs.remove(&id).expect("model: ready message is live"))); // ok: test code, on the test's own data
        }
        out
    }

    fn deliveries(&self, state: State) -> u16 {
        match state {
            State::Unpublished | State::Dead => 0,
            State::Fresh { carried } => carried,
            State::Retry { deliveries } | State::Inflight { deliveries, .. } | State::Delayed { deliveries, .. } => {
                deliveries
            }
        }
    }
}

/// Names the failing seed, step and operation in every assertion.
struct Ctx {
    seed: u64,
    step: usize,
    op: String,
}

impl fmt::Display for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed {} (replay: RUNNEL_SEED={}) step {}: {}", self.seed, self.seed, self.step, self.op)
    }
}

/// Compares everything observable (and the group's tables) with the model.
/// Every message is looked up by id and the live count compared, which
/// pins down the live set. `full` adds what costs more in a debug build:
/// every message's deliveries and dead info, and a walk of the whole
/// sequence with `iter_live` (which visits every slot of every block).
fn check(t: &Topic, timers: &FakeTimers, m: &Model, ctx: &Ctx, full: bool) {
    assert_eq!(t.seq.next_id(), m.next_id, "{ctx}: next id");
    let (mut ready, mut inflight, mut delayed, mut unpublished, mut live_bytes) = (0, 0, 0, 0, 0);
    for (&id, mm) in &m.msgs {
        let Some(s) = t.seq.get(id) else { panic!("{ctx}: message {id} ({:?}) is not live", mm.state) };
        assert_eq!(s.born_ms, mm.born_ms, "{ctx}: born_ms of {id}");
        assert!(
            s.payload == &mm.payload[..],
            "{ctx}: payload of {id} ({} vs {} bytes)",
            s.payload.len(),
            mm.payload.len()
        );
        live_bytes += s.payload.len() as u64;
        if full {
            assert_eq!(t.deliveries(G, id), m.deliveries(mm.state), "{ctx}: deliveries of {id} ({:?})", mm.state);
            assert_eq!(t.seq.dead_info(id), mm.dead, "{ctx}: dead info of {id}");
        }
        match mm.state {
            State::Unpublished => unpublished += 1,
            State::Fresh { .. } | State::Retry { .. } => ready += 1,
            State::Inflight { owner, deadline_ms, deliveries } => {
                inflight += 1;
                let f = t
                    .group(G)
                    .expect("default")
                    .inflight
                    .get(&id)
                    .unwrap_or_else(|| panic!("{ctx}: {id} not in flight"));
                assert_eq!((f.owner, f.deliveries), (owner, deliveries), "{ctx}: in-flight {id}");
                assert_eq!(timers.wheel.deadline_ms(f.timer), Some(deadline_ms), "{ctx}: ack deadline of {id}");
            }
            State::Delayed { until_ms, .. } => {
                delayed += 1;
                let (key, _) =
                    t.group(G).expect("default").delayed.get(&id).unwrap_or_else(|| panic!("{ctx}: {id} not delayed"));
                assert_eq!(timers.wheel.deadline_ms(*key), Some(until_ms), "{ctx}: delay of {id}");
            }
            State::Dead => panic!("{ctx}: dead message {id} left unsettled"),
        }
    }
    assert_eq!(t.seq.live(), m.msgs.len() as u64, "{ctx}: seq.live");
    assert_eq!(t.seq.live_bytes(), live_bytes, "{ctx}: seq.live_bytes");
    if full {
        let mut model = m.msgs.iter();
        for s in t.seq.iter_live() {
            let Some((&id, mm)) = model.next() else { panic!("{ctx}: iter_live yields {} past the model", s.id) };
            assert_eq!((s.id, s.born_ms), (id, mm.born_ms), "{ctx}: iter_live");
            assert!(s.payload == &mm.payload[..], "{ctx}: iter_live payload of {id}");
        }
        assert!(model.next().is_none(), "{ctx}: iter_live ended early");
        check_blocks(&t.seq, ctx);
    }
    assert_eq!(t.ready(G), ready, "{ctx}: ready");
    assert_eq!(t.inflight(G), inflight, "{ctx}: inflight");
    assert_eq!(t.delayed(G), delayed, "{ctx}: delayed");
    assert_eq!(t.seq.unpublished(), unpublished, "{ctx}: unpublished");
    assert_eq!(t.group(G).expect("default").has_ready(&t.seq), ready > 0, "{ctx}: has_ready");
    assert_eq!(t.counters(G), m.counters, "{ctx}: counters");
    assert_eq!(timers.wheel.len() as u64, inflight + delayed, "{ctx}: one timer per in-flight or delayed message");
    assert_eq!(timers.stale_disarms, 0, "{ctx}: disarmed a timer that was not pending");
}

/// The block invariants the module documentation states: blocks in id
/// order without overlap, only the last one open, and a closed block holds
/// nothing once empty and no more than 4x its live payload once large.
fn check_blocks(seq: &Seq, ctx: &Ctx) {
    let n = seq.blocks.len();
    for (i, b) in seq.blocks.iter().enumerate() {
        assert!(b.ends.len() <= BLOCK_MESSAGES_MAX, "{ctx}: block {i} has {} messages", b.ends.len());
        assert_eq!(b.closed, i + 1 < n, "{ctx}: only the last block is open");
        if let Some(next) = seq.blocks.get(i + 1) {
            assert!(b.end_id() <= next.first_id, "{ctx}: block {i} overlaps the next");
        }
        assert_eq!(b.ends.last().map_or(0, |&e| e as usize), b.bytes.len(), "{ctx}: block {i} ends");
        if b.closed && b.live == 0 {
            assert_eq!(b.bytes.capacity() + b.ends.capacity(), 0, "{ctx}: empty closed block {i} not freed");
        }
        if b.closed && b.bytes.len() >= 64 << 10 {
            assert!(
                b.bytes.len() as u64 <= 4 * b.live_bytes,
                "{ctx}: closed block {i} holds {} bytes for {} live",
                b.bytes.len(),
                b.live_bytes
            );
        }
    }
}

/// Payload lengths: mostly small, some empty, a few large enough to close
/// blocks by bytes and make them shrink.
fn random_payload(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(200) {
        0 => rng.range(100_000, 300_000),
        1..20 => 0,
        _ => rng.range(1, 24),
    };
    // Cheap to build even when large: a fill byte with random ends.
    let mut p = vec![rng.next_u64() as u8; len as usize];
    for i in 0..p.len().min(16) {
        p[i] = rng.next_u64() as u8;
        let j = p.len() - 1 - i;
        p[j] ^= rng.next_u64() as u8;
    }
    p
}

fn random_dead_info(rng: &mut Rng) -> DeadInfo {
    let reason =
        rng.pick(&[DeadReason::AckTimeout, DeadReason::Nacked, DeadReason::Rejected, DeadReason::ConsumerLost]);
    DeadInfo { origin_id: rng.range(1, 1 << 40), origin_deliveries: rng.below(20) as u16, reason }
}

/// Settles a Dead outcome as the broker does: usually the message moves to
/// the dead-letter topic and is released; sometimes that topic is full and
/// it goes back to ready instead.
fn settle_dead(t: &mut Topic, m: &mut Model, rng: &mut Rng, id: MsgId, info: DeadInfo) {
    if rng.percent(80) {
        t.dead_lettered(G, id);
        m.remove(id);
        m.counters.dead_lettered += 1;
    } else {
        t.requeue(G, id, info.origin_deliveries);
        m.requeue(id, info.origin_deliveries);
    }
}

/// Recovery: restores messages with gaps, carried deliveries and removals,
/// then ends recovery.
fn restore_random(t: &mut Topic, m: &mut Model, rng: &mut Rng, now_ms: u64) {
    let mut r = Recovery::new();
    let mut id = m.next_id;
    for _ in 0..rng.below(60) {
        id += if rng.percent(3) { rng.range(4_000, 9_000) } else { rng.below(3) };
        let born_ms = now_ms - rng.below(5_000);
        let payload = random_payload(rng);
        let carried = if rng.percent(50) { 0 } else { rng.range(1, 4) as u16 };
        let dead = (m.is_dlq && rng.percent(50)).then(|| random_dead_info(rng));
        r.restore(t, id, born_ms, &payload, carried, dead);
        m.restore(id, born_ms, payload, carried, dead);
        id += 1;
    }
    let lo = m.msgs.keys().next().copied().unwrap_or(1);
    for _ in 0..rng.below(10) {
        let id = rng.range(lo, m.next_id + 1);
        let d = rng.below(5) as u16;
        if t.seq.contains(id) {
            r.deliveries(id, d);
        }
        if m.msgs.contains_key(&id) {
            m.set(id, State::Fresh { carried: d });
        }
    }
    for _ in 0..rng.below(10) {
        let id = rng.range(lo, m.next_id + 1);
        r.done.push(id);
        if m.msgs.contains_key(&id) {
            m.remove(id);
        }
    }
    r.finish(t);
}

/// An id to act on: usually one in the given states, else any id near the
/// topic's range (live or not).
fn pick_id(rng: &mut Rng, m: &Model, first_id: MsgId, wanted: impl Fn(State) -> bool) -> MsgId {
    if rng.percent(75) {
        let ids: Vec<MsgId> = m.msgs.iter().filter(|(_, mm)| wanted(mm.state)).map(|(&id, _)| id).collect();
        if !ids.is_empty() {
            return rng.pick(&ids);
        }
    }
    rng.range(first_id.saturating_sub(2), m.next_id + 2)
}

/// One run of the model test: the topic under test, the model, and what
/// the operations draw from.
struct Run {
    rng: Rng,
    t: Topic,
    m: Model,
    timers: FakeTimers,
    ctx: Ctx,
    /// The current time, ms.
    now: u64,
    first_id: MsgId,
    is_dlq: bool,
    /// The consumers that may fetch; a disconnect replaces one.
    consumers: [ConsumerId; 3],
    next_consumer: ConsumerId,
    /// Produce batches of the current turn, not yet published or
    /// withdrawn: (first id, count).
    pending: Vec<(MsgId, u32)>,
}

impl Run {
    fn new(seed: u64) -> Run {
        let mut rng = Rng(seed);
        let is_dlq = rng.percent(20);
        let name = if is_dlq { "orders.dlq" } else { "orders" };
        let max_deliveries = rng.pick(&[0, 1, 2, 2, 3, 3, 4, 6, u16::MAX]);
        let first_id = rng.pick(&[0, 1, 2, 1_000_000]);
        let now = 1_000_000 + rng.below(1_000);
        let t = new_topic(
            name,
            Settings { ack_timeout_ms: 30_000, max_deliveries, dedup_window_ms: None, retention: Default::default() },
            first_id,
        );
        let m = Model::new(is_dlq, max_deliveries, first_id);
        let op = format!("new {name} max_deliveries {max_deliveries} first_id {first_id}");
        let ctx = Ctx { seed, step: 0, op };
        let timers = FakeTimers::new(now);
        let (consumers, next_consumer, pending) = ([1, 2, 3], 4, Vec::new());
        let mut r = Run { rng, t, m, timers, ctx, now, first_id, is_dlq, consumers, next_consumer, pending };
        if r.rng.percent(40) {
            restore_random(&mut r.t, &mut r.m, &mut r.rng, now);
            r.ctx.op = format!("restore {} messages", r.m.msgs.len());
        }
        r
    }

    fn check(&self, full: bool) {
        check(&self.t, &self.timers, &self.m, &self.ctx, full);
    }

    /// One random operation, as the broker would make it.
    fn step(&mut self) {
        match self.rng.below(1000) {
            0..200 => self.append(),
            200..300 => self.commit(),
            300..500 => self.fetch(),
            500..650 => self.ack(|s| matches!(s, State::Inflight { .. }), ""),
            650..730 => self.nack(),
            730..780 => self.touch(),
            780..900 => self.advance(),
            900..930 => self.disconnect(),
            930..950 => self.drain(),
            950..955 => {
                self.ctx.op = "purge".to_string();
                assert_eq!(self.t.purge(&mut self.timers), self.m.purge(), "{}: purged count", self.ctx);
            }
            955..960 => {
                let by = if self.rng.percent(50) { self.rng.below(10) } else { self.rng.range(3_000, 9_000) };
                self.ctx.op = format!("bump next id by {by}");
                self.t.seq.bump_next_id(self.m.next_id + by);
                self.m.next_id += by;
            }
            _ => self.ack(|s| !matches!(s, State::Inflight { .. }), ", not in flight"),
        }
    }

    fn append(&mut self) {
        let n = self.rng.range(1, 4) as u32;
        let first = self.m.next_id;
        for _ in 0..n {
            let born_ms = self.now - self.rng.below(4);
            let payload = random_payload(&mut self.rng);
            let dead = (self.is_dlq && self.rng.percent(30)).then(|| random_dead_info(&mut self.rng));
            let id = match dead {
                Some(info) => self.t.append_moved(born_ms, &payload, Some(info)),
                None => self.t.produce(born_ms, &payload).0,
            };
            assert_eq!(id, self.m.append(born_ms, payload, dead), "{}: appended id", self.ctx);
        }
        self.pending.push((first, n));
        self.ctx.op = format!("append {n} from {first}");
    }

    /// The turn's commit: some batches withdrawn (a failed commit), then
    /// publish.
    fn commit(&mut self) {
        let fail = !self.pending.is_empty() && self.rng.percent(20);
        let mut withdrawn = Vec::new();
        for &(first, count) in &self.pending {
            if fail && self.rng.percent(70) {
                self.t.withdraw(first, count);
                self.m.withdraw(first, count);
                withdrawn.push(first);
            }
        }
        self.pending.clear();
        self.t.publish();
        self.m.publish();
        self.ctx.op = format!("commit, withdrawing batches {withdrawn:?}");
    }

    fn fetch(&mut self) {
        let rng = &mut self.rng;
        let owner = rng.pick(&self.consumers);
        let max_messages = if rng.percent(5) { 100 } else { rng.below(6) as u32 };
        let max_bytes = match rng.below(3) {
            0 => 0,
            1 => rng.below(40),
            _ => u64::MAX,
        };
        let deadline_ms = self.now + rng.below(60);
        let ctx = &mut self.ctx;
        ctx.op = format!("fetch owner {owner} max {max_messages} bytes {max_bytes} deadline {deadline_ms}");
        let mut got = Vec::new();
        let take = Take { owner, max_messages, max_bytes, deadline_ms };
        let n = self.t.fetch(G, take, &mut self.timers, |seq, d| {
            got.push((d, seq.get(d.id).map(|s| s.payload.to_vec())));
        });
        let expected = self.m.fetch(owner, max_messages, max_bytes, deadline_ms);
        assert_eq!(n as usize, got.len(), "{ctx}: fetch count");
        let delivered: Vec<Delivery> = got.iter().map(|g| g.0).collect();
        assert_eq!(delivered, expected, "{ctx}: deliveries");
        for (d, payload) in &got {
            assert!(payload.as_deref() == Some(&self.m.msgs[&d.id].payload[..]), "{ctx}: payload of {}", d.id);
        }
    }

    /// An ACK of an id in a state `wanted` picks (`what` says which).
    fn ack(&mut self, wanted: impl Fn(State) -> bool, what: &str) {
        let id = pick_id(&mut self.rng, &self.m, self.first_id, wanted);
        self.ctx.op = format!("ack {id} ({:?}){what}", self.m.state(id));
        assert_eq!(self.t.ack(G, id, &mut self.timers), self.m.ack(id), "{}: ack result", self.ctx);
    }

    fn nack(&mut self) {
        let id = pick_id(&mut self.rng, &self.m, self.first_id, |s| matches!(s, State::Inflight { .. }));
        let delay = match self.rng.below(10) {
            0..5 => None,
            5 => Some(self.now.saturating_sub(self.rng.below(5))),
            _ => Some(self.now + self.rng.below(40)),
        };
        let dead_letter = self.rng.percent(15);
        self.ctx.op = format!("nack {id} ({:?}) delay {delay:?} dead_letter {dead_letter}", self.m.state(id));
        let got = self.t.nack(G, id, delay, dead_letter, &mut self.timers);
        assert_eq!(got, self.m.nack(id, delay, dead_letter), "{}: nack result", self.ctx);
        if let Some(Returned::Dead(info)) = got {
            settle_dead(&mut self.t, &mut self.m, &mut self.rng, id, info);
        }
    }

    fn touch(&mut self) {
        let id = pick_id(&mut self.rng, &self.m, self.first_id, |s| matches!(s, State::Inflight { .. }));
        let deadline_ms = self.now + self.rng.below(60);
        self.ctx.op = format!("touch {id} ({:?}) deadline {deadline_ms}", self.m.state(id));
        let got = self.t.touch(G, id, deadline_ms, &mut self.timers);
        assert_eq!(got, self.m.touch(id, deadline_ms), "{}: touch result", self.ctx);
    }

    /// Time moves on: every due timer fires, as the broker fires them.
    fn advance(&mut self) {
        self.now += self.rng.below(25);
        self.ctx.op = format!("advance to {}", self.now);
        let ctx = &self.ctx;
        for (deadline_ms, id) in self.timers.advance(self.now) {
            let expected = self.m.timer_fired(id, deadline_ms).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let got = self.t.timer_fired(G, id, &mut self.timers);
            assert_eq!(got, Some(expected), "{ctx}: timer for {id}");
            if let Returned::Dead(info) = expected {
                settle_dead(&mut self.t, &mut self.m, &mut self.rng, id, info);
            }
        }
        for (id, mm) in &self.m.msgs {
            if let State::Inflight { deadline_ms: d, .. } | State::Delayed { until_ms: d, .. } = mm.state {
                assert!(d > self.now, "{ctx}: {id} due at {d} did not fire ({:?})", mm.state);
            }
        }
    }

    /// A consumer disconnects: what it held comes back (or dies), and a
    /// new consumer takes its place.
    fn disconnect(&mut self) {
        let slot = self.rng.below(3) as usize;
        let owner = self.consumers[slot];
        self.consumers[slot] = self.next_consumer;
        self.next_consumer += 1;
        let expected = self.m.held_by(owner);
        self.ctx.op = format!("disconnect {owner} holding {:?}", expected.keys().collect::<Vec<_>>());
        let mut lost = Vec::new();
        let returned = self.t.disconnect(G, owner, &mut self.timers, |id, info| lost.push((id, info)));
        let retries: Vec<MsgId> = expected.iter().filter(|(_, r)| **r == Returned::Retry).map(|(&id, _)| id).collect();
        let mut returned: Vec<MsgId> = returned.iter().map(|r| r.0).collect();
        returned.sort_unstable();
        assert_eq!(returned, retries, "{}: returned to ready", self.ctx);
        self.requeued_on_disconnect(&retries);
        let mut lost_sorted: Vec<(MsgId, Returned)> =
            lost.iter().map(|&(id, info)| (id, Returned::Dead(info))).collect();
        lost_sorted.sort_unstable_by_key(|l| l.0);
        let expected_dead: Vec<(MsgId, Returned)> =
            expected.into_iter().filter(|(_, r)| *r != Returned::Retry).collect();
        assert_eq!(lost_sorted, expected_dead, "{}: dead on disconnect", self.ctx);
        for &(id, _) in &lost {
            self.m.set(id, State::Dead);
        }
        for (id, info) in lost {
            settle_dead(&mut self.t, &mut self.m, &mut self.rng, id, info);
        }
    }

    /// The messages a disconnect returned all came back at once, so their
    /// order among themselves is the topic's to choose: the model takes it
    /// from the tail of the topic's retry queue, which must hold exactly
    /// `retries`.
    fn requeued_on_disconnect(&mut self, retries: &[MsgId]) {
        let queue = &self.t.group(G).expect("default").retry;
        let mut tail: Vec<MsgId> = queue.iter().skip(queue.len() - retries.len()).copied().collect();
        for &id in &tail {
            let Some(State::Inflight { deliveries, .. }) = self.m.state(id) else { unreachable!() };
            self.m.requeue(id, deliveries);
        }
        tail.sort_unstable();
        assert_eq!(tail, retries, "{}: requeued ids", self.ctx);
    }

    /// REDRIVE's drain, taking at most `accept` of them.
    fn drain(&mut self) {
        let max = if self.rng.percent(20) { u64::MAX } else { self.rng.below(5) };
        let accept = self.rng.below(6);
        self.ctx.op = format!("drain_ready max {max} accept {accept}");
        let mut got = Vec::new();
        let n = self.t.drain_ready(G, max, |s, d| {
            if got.len() as u64 == accept {
                return false;
            }
            got.push((s.id, s.born_ms, s.payload.to_vec(), d));
            true
        });
        let expected: Vec<(MsgId, u64, Vec<u8>, Option<DeadInfo>)> =
            self.m.drain(max, accept).into_iter().map(|(id, mm)| (id, mm.born_ms, mm.payload, mm.dead)).collect();
        assert_eq!(n, expected.len() as u64, "{}: drained count", self.ctx);
        assert_eq!(got, expected, "{}: drained messages", self.ctx);
    }
}

fn run_model(seed: u64, steps: usize) {
    let mut r = Run::new(seed);
    r.check(true);
    for step in 1..=steps {
        r.ctx.step = step;
        r.step();
        r.check(step % 16 == 0);
    }
    r.check(true);
    r.ctx.step += 1;
    r.ctx.op = "final purge".to_string();
    assert_eq!(r.t.purge(&mut r.timers), r.m.purge(), "{}: purged count", r.ctx);
    r.check(true);
    assert!(r.timers.wheel.is_empty(), "{}: timers left after purge", r.ctx);
}

#[test]
fn topic_matches_model_under_random_operations() {
    const SEEDS: u64 = 100;
    const STEPS: usize = 1500;
    for seed in seeds(SEEDS) {
        run_model(seed, STEPS);
    }
}
