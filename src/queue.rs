//! A topic: an ordered sequence of messages (`Seq`) and, kept apart from
//! it, the state of the consumers reading it (`Group`).
//!
//! The model is seed 000's: messages are ready in produce order; FETCH moves
//! them to an in-flight table with a deadline; ACK removes them; a passed
//! deadline or a NACK returns them to the front of ready; past max
//! deliveries they go to the dead-letter topic. Today there is one group,
//! the default one. Named groups (a later issue) add more `Group`s over the
//! same `Seq`: a message is released from the sequence when every group is
//! done with it.
//!
//! Memory is the point of the shape. Like RocketMQ's CommitLog and
//! ConsumeQueue, payloads are packed back to back in large per-block buffers
//! and the per-message index is columnar: a 4-byte end offset, a 4-byte born
//! time delta and one live bit — about 8 bytes per queued message beyond its
//! payload, with no heap allocation per message. The group keeps state only
//! for messages that are not simply "next in line": the in-flight table,
//! the retry queue and the delayed set. Every id below the group's cursor
//! that is in none of them has been acknowledged.
//!
//! Nothing here reads a clock or touches a socket or file: `now_ms` comes in
//! and timers go out through the `Timers` trait, so the whole file is tested
//! against a simple model without either.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::codec::{DeadInfo, DeadReason};
use crate::wheel::TimerKey;

/// A message id. Unique per topic, increasing in produce order.
pub type MsgId = u64;
/// Identifies a consumer connection for the life of the broker (never
/// reused, unlike a slab token).
pub type ConsumerId = u64;

/// A consumer group's number within its topic, never reused there. Every
/// topic has the default group; records of log version 1, which name no
/// group, mean it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GroupId(pub u32);

impl GroupId {
    /// The default group: the one every topic has.
    pub const DEFAULT: GroupId = GroupId(0);
}

// ---------------------------------------------------------------------------
// Seq: the ordered messages of a topic.
// ---------------------------------------------------------------------------

/// Most messages in one block: 4096 keeps the live bitmap at 512 bytes and
/// lets a block be freed at a fine grain.
const BLOCK_MESSAGES_MAX: usize = 4096;
/// Payload bytes after which a block closes: 1 MiB buffers are large enough
/// to amortise their allocation and small enough that one slow message
/// pins little memory.
const BLOCK_BYTES_MAX: usize = 1 << 20;
/// A closed block whose live payload falls below 1/4 of its buffer is
/// rewritten with only the live payloads, so memory follows live bytes.
const BLOCK_SHRINK_RATIO: usize = 4;

/// A run of consecutive ids whose payloads sit back to back in one buffer.
struct Block {
    /// Id of the first message; message `i` has id `first_id + i`.
    first_id: MsgId,
    /// Born time of the first message, ms since the Unix epoch.
    born_base_ms: u64,
    /// End offset of message `i`'s payload in `bytes` (it starts where
    /// message `i - 1` ends). A dead message may have zero length.
    ends: Vec<u32>,
    /// Born time of message `i` minus `born_base_ms`, ms.
    born_delta_ms: Vec<u32>,
    /// Bit `i` set while message `i` is held by a group.
    live_bits: Vec<u64>,
    /// Live messages in the block.
    live: u32,
    /// Payload bytes of the live messages.
    live_bytes: u64,
    /// The payloads.
    bytes: Vec<u8>,
    /// No more messages will be appended.
    closed: bool,
}

impl Block {
    fn new(first_id: MsgId, born_base_ms: u64) -> Block {
        Block {
            first_id,
            born_base_ms,
            ends: Vec::new(),
            born_delta_ms: Vec::new(),
            live_bits: Vec::new(),
            live: 0,
            live_bytes: 0,
            bytes: Vec::new(),
            closed: false,
        }
    }
    fn len(&self) -> u64 {
        self.ends.len() as u64
    }
    fn end_id(&self) -> MsgId {
        self.first_id + self.len()
    }
    fn start_of(&self, i: usize) -> usize {
        if i == 0 { 0 } else { self.ends[i - 1] as usize }
    }
    fn is_live(&self, i: usize) -> bool {
        self.live_bits[i / 64] & (1 << (i % 64)) != 0
    }
    fn can_take(&self, born_ms: u64, payload_bytes: usize) -> bool {
        !self.closed
            && self.ends.len() < BLOCK_MESSAGES_MAX
            && (self.bytes.is_empty() || self.bytes.len() + payload_bytes <= BLOCK_BYTES_MAX)
            && born_ms >= self.born_base_ms
            && born_ms - self.born_base_ms <= u64::from(u32::MAX)
    }
    /// Appends a message, live or as a dead placeholder for a gap.
    fn push(&mut self, born_ms: u64, payload: &[u8], live: bool) {
        let i = self.ends.len();
        if i.is_multiple_of(64) {
            self.live_bits.push(0);
        }
        self.bytes.extend_from_slice(payload);
        self.ends.push(self.bytes.len() as u32);
        self.born_delta_ms.push(born_ms.saturating_sub(self.born_base_ms) as u32);
        if live {
            self.live_bits[i / 64] |= 1 << (i % 64);
            self.live += 1;
            self.live_bytes += payload.len() as u64;
        }
    }
    fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            self.ends.shrink_to_fit();
            self.born_delta_ms.shrink_to_fit();
            self.live_bits.shrink_to_fit();
            self.bytes.shrink_to_fit();
        }
    }
    /// Frees everything once no message is live.
    fn free(&mut self) {
        self.ends = Vec::new();
        self.born_delta_ms = Vec::new();
        self.live_bits = Vec::new();
        self.bytes = Vec::new();
        self.closed = true;
    }
    /// A closed block gives back what its released messages held: all of
    /// it when none is live, or the dead payloads once the live ones fill
    /// less than 1/`BLOCK_SHRINK_RATIO` of the buffer.
    fn tidy(&mut self) {
        debug_assert!(self.closed);
        if self.live == 0 {
            self.free();
        } else if self.bytes.len() >= 64 << 10 && (self.live_bytes as usize) * BLOCK_SHRINK_RATIO < self.bytes.len() {
            self.shrink();
        }
    }

    /// Rewrites `bytes` with only the live payloads.
    fn shrink(&mut self) {
        let mut bytes = Vec::with_capacity(self.live_bytes as usize);
        let mut start = 0;
        for i in 0..self.ends.len() {
            let end = self.ends[i] as usize;
            if self.is_live(i) {
                bytes.extend_from_slice(&self.bytes[start..end]);
            }
            start = end;
            self.ends[i] = bytes.len() as u32;
        }
        self.bytes = bytes;
    }
}

/// One message as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stored<'a> {
    pub id: MsgId,
    pub born_ms: u64,
    pub payload: &'a [u8],
}

/// The ordered messages of a topic. Append at the tail; release anywhere.
#[derive(Default)]
pub struct Seq {
    /// Blocks in id order; only the last may be open. Blocks may leave gaps
    /// between them (ids that were never stored or were compacted away).
    blocks: VecDeque<Block>,
    /// The id the next appended message gets.
    next_id: MsgId,
    /// Live messages.
    live: u64,
    /// Payload bytes of live messages.
    live_bytes: u64,
    /// Last born time handed out, so born times never go backwards.
    last_born_ms: u64,
}

impl Seq {
    pub fn new(first_id: MsgId) -> Seq {
        Seq { next_id: first_id.max(1), ..Seq::default() }
    }
    pub fn next_id(&self) -> MsgId {
        self.next_id
    }
    pub fn live(&self) -> u64 {
        self.live
    }
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }
    /// Raises the next id (recovery, and a topic re-created after delete).
    pub fn bump_next_id(&mut self, next_id: MsgId) {
        self.next_id = self.next_id.max(next_id);
    }

    /// Appends a message with the next id and returns the id. `born_ms` is
    /// raised to the last born time if the clock went backwards.
    pub fn append(&mut self, born_ms: u64, payload: &[u8]) -> (MsgId, u64) {
        let born_ms = born_ms.max(self.last_born_ms);
        let id = self.next_id;
        self.insert(id, born_ms, payload);
        (id, born_ms)
    }

    /// Stores a message at `id`, which must be at least `next_id` (ids in
    /// between become gaps). Used by `append` and by recovery.
    pub fn insert(&mut self, id: MsgId, born_ms: u64, payload: &[u8]) {
        assert!(id >= self.next_id, "ids only grow: {id} < {}", self.next_id);
        let need_new = match self.blocks.back() {
            Some(b) => {
                let gap = id - b.end_id();
                !(b.can_take(born_ms, payload.len()) && gap < (BLOCK_MESSAGES_MAX - b.ends.len()) as u64)
            }
            None => true,
        };
        if need_new {
            if let Some(b) = self.blocks.back_mut() {
                b.close();
                // Releases while it was open did not free or shrink it.
                b.tidy();
            }
            self.blocks.push_back(Block::new(id, born_ms));
        }
        let Some(block) = self.blocks.back_mut() else { unreachable!("a block was just pushed") };
        while block.end_id() < id {
            block.push(block.born_base_ms, &[], false);
        }
        block.push(born_ms, payload, true);
        self.next_id = id + 1;
        self.live += 1;
        self.live_bytes += payload.len() as u64;
        self.last_born_ms = self.last_born_ms.max(born_ms);
    }

    fn block_index(&self, id: MsgId) -> Option<usize> {
        // Most lookups hit the newest block (fetching what was just
        // produced) or the oldest (acking what was fetched first).
        let n = self.blocks.len();
        if let Some(b) = self.blocks.back().filter(|b| b.first_id <= id) {
            return (id < b.end_id()).then_some(n - 1);
        }
        if self.blocks.front().is_some_and(|b| b.first_id <= id && id < b.end_id()) {
            return Some(0);
        }
        let i = self.blocks.partition_point(|b| b.first_id <= id);
        if i == 0 {
            return None;
        }
        let b = &self.blocks[i - 1];
        (id < b.end_id()).then_some(i - 1)
    }

    /// The message at `id`, if it is live.
    pub fn get(&self, id: MsgId) -> Option<Stored<'_>> {
        let b = &self.blocks[self.block_index(id)?];
        let i = (id - b.first_id) as usize;
        if !b.is_live(i) {
            return None;
        }
        Some(Stored {
            id,
            born_ms: b.born_base_ms + u64::from(b.born_delta_ms[i]),
            payload: &b.bytes[b.start_of(i)..b.ends[i] as usize],
        })
    }

    pub fn contains(&self, id: MsgId) -> bool {
        self.block_index(id).is_some_and(|bi| {
            let b = &self.blocks[bi];
            b.is_live((id - b.first_id) as usize)
        })
    }

    /// Releases a live message: no group needs it any more. Returns its
    /// payload length, or None if it was not live.
    pub fn release(&mut self, id: MsgId) -> Option<u64> {
        let bi = self.block_index(id)?;
        let b = &mut self.blocks[bi];
        let i = (id - b.first_id) as usize;
        if !b.is_live(i) {
            return None;
        }
        let len = (b.ends[i] as usize - b.start_of(i)) as u64;
        b.live_bits[i / 64] &= !(1 << (i % 64));
        b.live -= 1;
        b.live_bytes -= len;
        self.live -= 1;
        self.live_bytes -= len;
        if b.closed {
            b.tidy();
        }
        while self.blocks.front().is_some_and(|b| b.live == 0 && b.closed) {
            self.blocks.pop_front();
        }
        Some(len)
    }

    /// The first live id in `from..until`.
    pub fn next_live(&self, from: MsgId, until: MsgId) -> Option<MsgId> {
        let mut bi = match self.block_index(from) {
            Some(bi) => bi,
            None => self.blocks.partition_point(|b| b.first_id <= from),
        };
        let mut from = from;
        while let Some(b) = self.blocks.get(bi) {
            if b.first_id >= until {
                return None;
            }
            if b.live > 0 {
                let start = from.max(b.first_id);
                let mut i = (start - b.first_id) as usize;
                while i < b.ends.len() {
                    let word = b.live_bits[i / 64] >> (i % 64);
                    if word == 0 {
                        i = (i / 64 + 1) * 64;
                        continue;
                    }
                    i += word.trailing_zeros() as usize;
                    let id = b.first_id + i as u64;
                    return (i < b.ends.len() && id < until).then_some(id);
                }
            }
            bi += 1;
            from = 0;
        }
        None
    }

    /// The born time of the oldest live message.
    pub fn oldest_born_ms(&self) -> Option<u64> {
        let id = self.next_live(0, self.next_id)?;
        self.get(id).map(|m| m.born_ms)
    }

    /// Every live message in id order (recovery checks, compaction, tests).
    pub fn iter_live(&self) -> impl Iterator<Item = Stored<'_>> + '_ {
        self.blocks.iter().flat_map(|b| {
            (0..b.ends.len()).filter(|&i| b.is_live(i)).map(move |i| Stored {
                id: b.first_id + i as u64,
                born_ms: b.born_base_ms + u64::from(b.born_delta_ms[i]),
                payload: &b.bytes[b.start_of(i)..b.ends[i] as usize],
            })
        })
    }

    /// Heap bytes held (for memory reporting).
    pub fn heap_bytes(&self) -> u64 {
        self.blocks
            .iter()
            .map(|b| {
                (b.ends.capacity() * 4
                    + b.born_delta_ms.capacity() * 4
                    + b.live_bits.capacity() * 8
                    + b.bytes.capacity()) as u64
                    + std::mem::size_of::<Block>() as u64
            })
            .sum()
    }
}

// ---------------------------------------------------------------------------
// Group: the consumer state of the default group.
// ---------------------------------------------------------------------------

/// Hashes message ids (which the broker assigns, so a client cannot pick
/// colliding keys) with one multiply instead of SipHash's rounds.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

/// A map keyed by ids the broker assigns itself (message, topic, consumer
/// and connection ids), hashed with `IdHasher`.
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
pub type IdMap<V> = FastMap<u64, V>;

/// Arms and disarms the timers of one topic (the broker's wheel).
pub trait Timers {
    /// Schedules an ack deadline or a NACK delay for message `id`.
    fn arm(&mut self, deadline_ms: u64, id: MsgId) -> TimerKey;
    fn disarm(&mut self, key: TimerKey);
}

/// A message delivered and not yet acknowledged.
#[derive(Clone, Copy, Debug)]
struct Inflight {
    /// Its ack deadline.
    timer: TimerKey,
    /// The connection it went to.
    owner: ConsumerId,
    /// Deliveries so far, this one included.
    deliveries: u16,
}

/// Messages delivered to one consumer: ids pushed on delivery, removed
/// lazily (an id whose in-flight owner is someone else, or which is no
/// longer in flight, is skipped and swept when the list doubles).
#[derive(Default)]
struct Owned {
    ids: Vec<MsgId>,
    /// How many of `ids` are still in flight to this consumer.
    live: u32,
}

/// What happens to a delivery that failed (deadline, NACK, disconnect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Returned {
    /// Back in ready, or delayed.
    Retry,
    /// Out of deliveries: the caller moves it to the dead-letter topic and
    /// then calls `Topic::release`.
    Dead(DeadInfo),
}

/// Per-topic settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub ack_timeout_ms: u32,
    pub max_deliveries: u16,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { ack_timeout_ms: 30_000, max_deliveries: 16 }
    }
}

/// Counters kept since the broker started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub produced: u64,
    pub delivered: u64,
    pub redelivered: u64,
    pub acked: u64,
    pub nacked: u64,
    pub dead_lettered: u64,
    pub expired: u64,
}

/// The default group's consumer state.
#[derive(Default)]
struct Group {
    /// Every id below it has been delivered at least once (or released).
    cursor: MsgId,
    /// Ready again after a failed delivery, in the order they came back.
    /// May hold ids no longer in `retry_set` (acked meanwhile): skipped.
    retry: VecDeque<MsgId>,
    /// Ready-again messages and their deliveries so far.
    retry_set: IdMap<u16>,
    /// Delivered and not acknowledged.
    inflight: IdMap<Inflight>,
    /// NACKed with a delay: the timer and the deliveries so far.
    delayed: IdMap<(TimerKey, u16)>,
    /// Deliveries of never-redelivered messages carried over a restart.
    carried: IdMap<u16>,
    /// What each consumer holds.
    owners: IdMap<Owned>,
}

/// One topic.
pub struct Topic {
    pub name: Box<str>,
    pub settings: Settings,
    /// The messages.
    pub seq: Seq,
    /// Messages with ids below this are durable and may be delivered; those
    /// from here to `seq.next_id()` wait for the turn's commit.
    visible_id: MsgId,
    group: Group,
    pub counters: Counters,
    /// For a dead-letter topic: where each message came from and why.
    dead_info: IdMap<DeadInfo>,
    /// Whether the name ends in `.dlq`: such topics never dead-letter.
    is_dlq: bool,
}

/// A message handed out by `Topic::fetch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub id: MsgId,
    pub deliveries: u16,
}

impl Topic {
    pub fn new(name: &str, settings: Settings, first_id: MsgId) -> Topic {
        let seq = Seq::new(first_id);
        let next = seq.next_id();
        Topic {
            name: name.into(),
            settings,
            seq,
            visible_id: next,
            group: Group { cursor: next, ..Group::default() },
            counters: Counters::default(),
            dead_info: IdMap::default(),
            is_dlq: name.ends_with(".dlq"),
        }
    }

    pub fn is_dlq(&self) -> bool {
        self.is_dlq
    }

    /// Names the topic (recovery meets some topics' names late).
    pub fn set_name(&mut self, name: &str) {
        self.name = name.into();
        self.is_dlq = name.ends_with(".dlq");
    }

    /// Recovery: adds messages met out of id order (compaction copied them
    /// forward in the log), rebuilding the sequence in id order. Each item is
    /// (id, born_ms, payload, deliveries so far, dead-letter info).
    pub fn merge(&mut self, strays: impl Iterator<Item = (MsgId, u64, Vec<u8>, u16, Option<DeadInfo>)>) {
        let old = std::mem::take(&mut self.seq);
        let mut seq = Seq::new(1);
        let mut strays = strays.peekable();
        for m in old.iter_live() {
            while let Some((id, born_ms, payload, deliveries, dead)) = strays.next_if(|s| s.0 < m.id) {
                self.restore_into(&mut seq, id, born_ms, &payload, deliveries, dead);
            }
            seq.insert(m.id, m.born_ms, m.payload);
        }
        for (id, born_ms, payload, deliveries, dead) in strays {
            self.restore_into(&mut seq, id, born_ms, &payload, deliveries, dead);
        }
        seq.bump_next_id(old.next_id());
        self.seq = seq;
    }

    fn restore_into(
        &mut self,
        seq: &mut Seq,
        id: MsgId,
        born_ms: u64,
        payload: &[u8],
        deliveries: u16,
        dead: Option<DeadInfo>,
    ) {
        seq.insert(id, born_ms, payload);
        if deliveries > 0 {
            self.group.carried.insert(id, deliveries);
        }
        if let Some(d) = dead {
            self.dead_info.insert(id, d);
        }
    }

    /// Appends a message not yet visible to consumers (until `publish`).
    /// Returns its id.
    pub fn append(&mut self, born_ms: u64, payload: &[u8]) -> MsgId {
        self.append_born(born_ms, payload).0
    }

    /// `append`, also returning the born time stored (never below the
    /// topic's last one).
    pub fn append_born(&mut self, born_ms: u64, payload: &[u8]) -> (MsgId, u64) {
        self.counters.produced += 1;
        self.seq.append(born_ms, payload)
    }

    /// Appends a message that keeps the born time it had in another topic
    /// (dead-lettered or redriven), even if older than this topic's last.
    pub fn append_kept(&mut self, born_ms: u64, payload: &[u8]) -> MsgId {
        self.counters.produced += 1;
        let id = self.seq.next_id();
        self.seq.insert(id, born_ms, payload);
        id
    }

    /// Appends a dead letter (visible at the next `publish`), keeping its
    /// born time.
    pub fn append_dead(&mut self, born_ms: u64, payload: &[u8], info: DeadInfo) -> MsgId {
        let id = self.append_kept(born_ms, payload);
        self.dead_info.insert(id, info);
        id
    }

    /// Makes every appended message visible.
    pub fn publish(&mut self) {
        self.visible_id = self.seq.next_id();
    }

    /// Withdraws the unpublished messages with ids in `first..first+count`
    /// (their produce was not made durable). Their ids are not reused.
    pub fn withdraw(&mut self, first: MsgId, count: u32) {
        for id in first..first + u64::from(count) {
            if self.seq.release(id).is_some() {
                self.counters.produced -= 1;
                self.dead_info.remove(&id);
            }
        }
    }

    /// Inserts a message during recovery, with its deliveries so far.
    pub fn restore(&mut self, id: MsgId, born_ms: u64, payload: &[u8], deliveries: u16, dead: Option<DeadInfo>) {
        self.seq.insert(id, born_ms, payload);
        if deliveries > 0 {
            self.group.carried.insert(id, deliveries);
        }
        if let Some(d) = dead {
            self.dead_info.insert(id, d);
        }
    }

    /// Sets the deliveries of a stored message during recovery.
    pub fn restore_deliveries(&mut self, id: MsgId, deliveries: u16) {
        if self.seq.contains(id) {
            self.group.carried.insert(id, deliveries);
        }
    }

    /// Ends recovery: every live message is ready, in id order.
    pub fn restore_done(&mut self) {
        self.visible_id = self.seq.next_id();
        self.group.cursor = self.seq.next_live(0, self.visible_id).unwrap_or(self.visible_id);
    }

    pub fn dead_info(&self, id: MsgId) -> Option<DeadInfo> {
        self.dead_info.get(&id).copied()
    }

    /// Ready messages: never delivered and visible, or back for retry.
    pub fn ready(&self) -> u64 {
        let g = &self.group;
        self.seq.live() - self.unpublished() - g.inflight.len() as u64 - g.delayed.len() as u64
    }
    pub fn inflight(&self) -> u64 {
        self.group.inflight.len() as u64
    }
    pub fn delayed(&self) -> u64 {
        self.group.delayed.len() as u64
    }
    /// Messages appended this turn and not yet published.
    pub fn unpublished(&self) -> u64 {
        let mut n = 0;
        let mut id = self.visible_id;
        while let Some(next) = self.seq.next_live(id, self.seq.next_id()) {
            n += 1;
            id = next + 1;
        }
        n
    }
    /// Whether a FETCH would find something now.
    pub fn has_ready(&self) -> bool {
        !self.group.retry_set.is_empty() || self.seq.next_live(self.group.cursor, self.visible_id).is_some()
    }

    /// Moves up to `max_messages` ready messages (at least one if any, then
    /// within `max_bytes` of payload) to in flight for `owner`, with the ack
    /// deadline `deadline_ms`. Calls `out` for each, in delivery order.
    pub fn fetch(
        &mut self,
        owner: ConsumerId,
        max_messages: u32,
        max_bytes: u64,
        deadline_ms: u64,
        timers: &mut impl Timers,
        mut out: impl FnMut(&Topic, Delivery),
    ) -> u32 {
        let mut n = 0u32;
        let mut bytes = 0u64;
        // Taken out for the batch: one map lookup per FETCH, not per message.
        let mut owned = self.group.owners.remove(&owner).unwrap_or_default();
        while n < max_messages {
            let Some((id, prior)) = self.peek_ready() else { break };
            let len = self.seq.get(id).map_or(0, |m| m.payload.len() as u64);
            if n > 0 && bytes + len > max_bytes {
                break;
            }
            self.take_ready(id);
            bytes += len;
            n += 1;
            let deliveries = prior.saturating_add(1);
            let timer = timers.arm(deadline_ms, id);
            self.group.inflight.insert(id, Inflight { timer, owner, deliveries });
            owned.ids.push(id);
            owned.live += 1;
            self.counters.delivered += 1;
            if prior > 0 {
                self.counters.redelivered += 1;
            }
            out(self, Delivery { id, deliveries });
        }
        if owned.live > 0 {
            self.group.owners.insert(owner, owned);
        }
        n
    }

    /// The next ready message and its deliveries so far, without taking it.
    fn peek_ready(&mut self) -> Option<(MsgId, u16)> {
        let g = &mut self.group;
        while let Some(&id) = g.retry.front() {
            if let Some(&d) = g.retry_set.get(&id) {
                return Some((id, d));
            }
            g.retry.pop_front();
        }
        let id = self.seq.next_live(g.cursor, self.visible_id)?;
        // `carried` is empty except just after a restart: skip the hash.
        let prior = if g.carried.is_empty() { 0 } else { g.carried.get(&id).copied().unwrap_or(0) };
        Some((id, prior))
    }

    /// Takes the message `peek_ready` returned out of ready.
    fn take_ready(&mut self, id: MsgId) {
        let g = &mut self.group;
        if g.retry.front() == Some(&id) {
            g.retry.pop_front();
            g.retry_set.remove(&id);
        } else {
            g.cursor = id + 1;
            if !g.carried.is_empty() {
                g.carried.remove(&id);
            }
        }
    }

    fn disown(&mut self, owner: ConsumerId) {
        if let Some(o) = self.group.owners.get_mut(&owner) {
            o.live = o.live.saturating_sub(1);
            if o.live == 0 {
                self.group.owners.remove(&owner);
            } else if o.ids.len() > 2 * o.live as usize + 64 {
                let inflight = &self.group.inflight;
                o.ids.retain(|id| inflight.get(id).is_some_and(|f| f.owner == owner));
            }
        }
    }

    /// Acknowledges a delivered message. False if it was not delivered and
    /// unacknowledged (unknown, never delivered, acked, dead-lettered).
    pub fn ack(&mut self, id: MsgId, timers: &mut impl Timers) -> bool {
        let g = &mut self.group;
        if let Some(f) = g.inflight.remove(&id) {
            timers.disarm(f.timer);
            self.disown(f.owner);
        } else if let Some((timer, _)) = self.group.delayed.remove(&id) {
            timers.disarm(timer);
        } else if self.group.retry_set.remove(&id).is_none() {
            return false;
        }
        self.counters.acked += 1;
        self.release(id);
        true
    }

    /// Drops a message the group is done with (acked, dead-lettered).
    pub fn release(&mut self, id: MsgId) {
        self.seq.release(id);
        if !self.dead_info.is_empty() {
            self.dead_info.remove(&id);
        }
        if !self.group.carried.is_empty() {
            self.group.carried.remove(&id);
        }
    }

    /// Extends the deadline of an in-flight message.
    pub fn touch(&mut self, id: MsgId, deadline_ms: u64, timers: &mut impl Timers) -> bool {
        let Some(f) = self.group.inflight.get_mut(&id) else { return false };
        timers.disarm(f.timer);
        f.timer = timers.arm(deadline_ms, id);
        true
    }

    /// A failed delivery: back to ready (`delay_until_ms` None), delayed, or
    /// out of deliveries.
    fn give_back(
        &mut self,
        id: MsgId,
        deliveries: u16,
        delay_until_ms: Option<u64>,
        reason: DeadReason,
        timers: &mut impl Timers,
    ) -> Returned {
        if !self.is_dlq && (deliveries >= self.settings.max_deliveries || reason == DeadReason::Rejected) {
            return Returned::Dead(DeadInfo { origin_id: id, origin_deliveries: deliveries, reason });
        }
        match delay_until_ms {
            Some(t) => {
                let timer = timers.arm(t, id);
                self.group.delayed.insert(id, (timer, deliveries));
            }
            None => self.requeue(id, deliveries),
        }
        Returned::Retry
    }

    /// Puts a message back in ready (the back of the retry queue).
    pub fn requeue(&mut self, id: MsgId, deliveries: u16) {
        self.group.retry.push_back(id);
        self.group.retry_set.insert(id, deliveries);
    }

    /// NACK: `delay_until_ms` None returns it at once. None if `id` is not
    /// in flight.
    pub fn nack(
        &mut self,
        id: MsgId,
        delay_until_ms: Option<u64>,
        dead_letter: bool,
        timers: &mut impl Timers,
    ) -> Option<Returned> {
        let f = self.group.inflight.remove(&id)?;
        timers.disarm(f.timer);
        self.disown(f.owner);
        self.counters.nacked += 1;
        let reason = if dead_letter { DeadReason::Rejected } else { DeadReason::Nacked };
        Some(self.give_back(id, f.deliveries, delay_until_ms, reason, timers))
    }

    /// A timer of this topic fired for `id`: an ack deadline or the end of a
    /// NACK delay. Every state change disarms the message's timer, so a
    /// timer that fires is always the current one; an id in neither table
    /// (its topic was purged) is ignored.
    pub fn timer_fired(&mut self, id: MsgId, timers: &mut impl Timers) -> Option<Returned> {
        if let Some(f) = self.group.inflight.remove(&id) {
            self.disown(f.owner);
            self.counters.expired += 1;
            return Some(self.give_back(id, f.deliveries, None, DeadReason::AckTimeout, timers));
        }
        let (_, deliveries) = self.group.delayed.remove(&id)?;
        self.requeue(id, deliveries);
        Some(Returned::Retry)
    }

    /// A consumer disconnected: everything in flight to it returns at once.
    /// Calls `dead` for each message out of deliveries.
    /// Returns how many messages went back to ready.
    pub fn disconnect(
        &mut self,
        owner: ConsumerId,
        timers: &mut impl Timers,
        mut dead: impl FnMut(&mut Topic, MsgId, DeadInfo),
    ) -> u64 {
        let Some(owned) = self.group.owners.remove(&owner) else { return 0 };
        let mut returned = 0;
        for id in owned.ids {
            let Some(f) = self.group.inflight.get(&id).copied() else { continue };
            if f.owner != owner {
                continue;
            }
            self.group.inflight.remove(&id);
            timers.disarm(f.timer);
            match self.give_back(id, f.deliveries, None, DeadReason::ConsumerLost, timers) {
                Returned::Dead(info) => dead(self, id, info),
                Returned::Retry => returned += 1,
            }
        }
        returned
    }

    /// The deliveries so far of a message that is ready, delayed or in
    /// flight (for the log's requeue records and compaction).
    pub fn deliveries(&self, id: MsgId) -> u16 {
        let g = &self.group;
        if let Some(f) = g.inflight.get(&id) {
            f.deliveries
        } else if let Some(d) = g.retry_set.get(&id) {
            *d
        } else if let Some((_, d)) = g.delayed.get(&id) {
            *d
        } else {
            g.carried.get(&id).copied().unwrap_or(0)
        }
    }

    /// Removes every unacknowledged message (PURGE, DELETE), published or
    /// not, and disarms their timers. Returns how many were removed.
    pub fn purge(&mut self, timers: &mut impl Timers) -> u64 {
        let g = std::mem::take(&mut self.group);
        for f in g.inflight.values() {
            timers.disarm(f.timer);
        }
        for (t, _) in g.delayed.values() {
            timers.disarm(*t);
        }
        let ids: Vec<MsgId> = self.seq.iter_live().map(|m| m.id).collect();
        for &id in &ids {
            self.release(id);
        }
        self.group.cursor = self.seq.next_id();
        ids.len() as u64
    }

    /// Takes up to `max` ready messages out of the queue for a redrive:
    /// calls `out` with each, then releases it.
    pub fn drain_ready(&mut self, max: u64, mut out: impl FnMut(Stored<'_>, Option<DeadInfo>) -> bool) -> u64 {
        let mut n = 0;
        while n < max {
            let Some((id, _)) = self.peek_ready() else { break };
            let Some(m) = self.seq.get(id) else { break };
            if !out(m, self.dead_info.get(&id).copied()) {
                break;
            }
            self.take_ready(id);
            self.release(id);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
