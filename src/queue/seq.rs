//! `Seq`: the ordered messages of a topic — payloads packed back to back in
//! blocks, a columnar index, the per-message properties — shared by every
//! group that reads the topic.
//!
//! Like RocketMQ's CommitLog and ConsumeQueue, payloads are packed back to
//! back in large per-block buffers and the per-message index is columnar: a
//! 4-byte end offset, a 4-byte born time delta and one live bit — about 8
//! bytes per queued message beyond its payload, with no heap allocation per
//! message. A message is live until `release`, which the topic calls once
//! every group is done with it.
//!
//! Properties (tags and headers) cost nothing where no message has them: a
//! block stores them only once one of its messages has some (its
//! `with_props` flag; then every live message's stored bytes start with its
//! `u16` properties length, then the properties, then the payload), and a
//! tag column (the `TagSetId` of each message, 2 bytes) only once one has
//! tags. The tags themselves are interned in the topic's `Tags` table.

use std::collections::VecDeque;

use super::schedule::Schedule;
use super::tags::{REDRIVEN_TO_PREFIX, TAG_SETS_MAX, TagSetId, Tags, TagsFull};
use super::{IdMap, MsgId};
use crate::codec::props::PROP_REDRIVEN_TO;
use crate::codec::{DeadInfo, Props};

/// Most messages in one block: 4096 keeps the live bitmap at 512 bytes and
/// lets a block be freed at a fine grain.
pub(super) const BLOCK_MESSAGES_MAX: usize = 4096;
/// Payload bytes after which a block closes: 1 MiB buffers are large enough
/// to amortise their allocation and small enough that one slow message
/// pins little memory.
pub(super) const BLOCK_BYTES_MAX: usize = 1 << 20;
/// A closed block whose live payload falls below 1/4 of its buffer is
/// rewritten with only the live payloads, so memory follows live bytes.
const BLOCK_SHRINK_RATIO: usize = 4;
/// Bytes of the properties length that starts a message's stored bytes in
/// a block `with_props`.
const PROPS_LEN_BYTES: usize = 2;

/// A run of consecutive ids whose payloads sit back to back in one buffer.
pub(super) struct Block {
    /// Id of the first message; message `i` has id `first_id + i`.
    pub(super) first_id: MsgId,
    /// Born time of the first message, ms since the Unix epoch.
    pub(super) born_base_ms: u64,
    /// End offset of message `i`'s stored bytes in `bytes` (they start
    /// where message `i - 1`'s end). A dead message may have zero length.
    pub(super) ends: Vec<u32>,
    /// Born time of message `i` minus `born_base_ms`, ms.
    pub(super) born_delta_ms: Vec<u32>,
    /// Bit `i` set while message `i` is held by a group.
    pub(super) live_bits: Vec<u64>,
    /// Live messages in the block.
    pub(super) live: u32,
    /// Stored bytes of the live messages (payloads, and properties with
    /// their lengths in a block `with_props`).
    pub(super) live_bytes: u64,
    /// The messages' stored bytes, back to back.
    pub(super) bytes: Vec<u8>,
    /// The `TagSetId` of message `i` (0: untagged); empty until a message
    /// of the block has tags.
    pub(super) tag_sets: Vec<u16>,
    /// Every live message's stored bytes start with its properties length
    /// and properties; set once a message of the block has properties.
    pub(super) with_props: bool,
    /// No more messages will be appended.
    pub(super) closed: bool,
}

/// A message to store: its properties, their interned tag set (with the
/// message's reference to it taken: `Seq::intern_tags`), and its payload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Body<'a> {
    pub props: Props<'a>,
    pub tag_set: Option<TagSetId>,
    pub payload: &'a [u8],
}

impl<'a> Body<'a> {
    /// A message without properties.
    pub fn plain(payload: &'a [u8]) -> Body<'a> {
        Body { props: Props::EMPTY, tag_set: None, payload }
    }
    /// Its size as the limits count it: properties and payload.
    pub fn bytes(&self) -> u64 {
        (self.props.bytes().len() + self.payload.len()) as u64
    }
}

/// A payload alone is a message without properties.
impl<'a> From<&'a [u8]> for Body<'a> {
    fn from(payload: &'a [u8]) -> Body<'a> {
        Body::plain(payload)
    }
}
impl<'a, const N: usize> From<&'a [u8; N]> for Body<'a> {
    fn from(payload: &'a [u8; N]) -> Body<'a> {
        Body::plain(payload)
    }
}
impl<'a> From<&&'a [u8]> for Body<'a> {
    fn from(payload: &&'a [u8]) -> Body<'a> {
        Body::plain(payload)
    }
}
impl<'a> From<&'a Vec<u8>> for Body<'a> {
    fn from(payload: &'a Vec<u8>) -> Body<'a> {
        Body::plain(payload)
    }
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
            tag_sets: Vec::new(),
            with_props: false,
            closed: false,
        }
    }
    fn len(&self) -> u64 {
        self.ends.len() as u64
    }
    pub(super) fn end_id(&self) -> MsgId {
        self.first_id + self.len()
    }
    fn start_of(&self, i: usize) -> usize {
        if i == 0 { 0 } else { self.ends[i - 1] as usize }
    }
    fn is_live(&self, i: usize) -> bool {
        self.live_bits[i / 64] & (1 << (i % 64)) != 0
    }
    fn can_take(&self, born_ms: u64, stored_bytes: usize) -> bool {
        !self.closed
            && self.ends.len() < BLOCK_MESSAGES_MAX
            && (self.bytes.is_empty() || self.bytes.len() + stored_bytes <= BLOCK_BYTES_MAX)
            && born_ms >= self.born_base_ms
            && born_ms - self.born_base_ms <= u64::from(u32::MAX)
    }
    /// Bytes `m` takes in this block (or would, once it stores properties).
    fn stored_bytes(m: &Body<'_>) -> usize {
        if m.props.is_empty() { m.payload.len() } else { PROPS_LEN_BYTES + m.props.bytes().len() + m.payload.len() }
    }
    /// Appends a message, live or as a dead placeholder for a gap.
    fn push(&mut self, born_ms: u64, m: &Body<'_>, live: bool) {
        let i = self.ends.len();
        if i.is_multiple_of(64) {
            self.live_bits.push(0);
        }
        if !m.props.is_empty() && !self.with_props {
            self.store_props();
        }
        let start = self.bytes.len();
        if self.with_props && live {
            let props = m.props.bytes();
            self.bytes.extend_from_slice(&(props.len() as u16).to_le_bytes());
            self.bytes.extend_from_slice(props);
        }
        self.bytes.extend_from_slice(m.payload);
        self.ends.push(self.bytes.len() as u32);
        self.born_delta_ms.push(born_ms.saturating_sub(self.born_base_ms) as u32);
        // The column starts with the block's first tagged message (the
        // ones before it untagged); then it has an entry per message.
        if m.tag_set.is_some() || !self.tag_sets.is_empty() {
            self.tag_sets.resize(i, 0);
            self.tag_sets.push(m.tag_set.map_or(0, TagSetId::raw));
        }
        if live {
            self.live_bits[i / 64] |= 1 << (i % 64);
            self.live += 1;
            self.live_bytes += (self.bytes.len() - start) as u64;
        }
    }
    /// Makes released message `i` live again with `m` (a replay from the
    /// log files): its stored bytes go where the released ones were (if
    /// any are left), and the block's later ends move by the difference.
    /// Rewrites the bytes after it: a block a replay fills this way costs
    /// a copy of the block per message, so `Seq::put_back` appends where
    /// it can.
    fn revive(&mut self, i: usize, m: &Body<'_>) {
        if !m.props.is_empty() && !self.with_props {
            self.store_props();
        }
        let mut stored = Vec::with_capacity(Block::stored_bytes(m));
        if self.with_props {
            stored.extend_from_slice(&(m.props.bytes().len() as u16).to_le_bytes());
            stored.extend_from_slice(m.props.bytes());
        }
        stored.extend_from_slice(m.payload);
        let (at, old_end) = (self.start_of(i), self.ends[i] as usize);
        let grown = stored.len() as u64;
        self.bytes.splice(at..old_end, stored);
        for e in &mut self.ends[i..] {
            *e = (u64::from(*e) + grown - (old_end - at) as u64) as u32;
        }
        if m.tag_set.is_some() || !self.tag_sets.is_empty() {
            self.tag_sets.resize(self.ends.len(), 0);
            self.tag_sets[i] = m.tag_set.map_or(0, TagSetId::raw);
        }
        self.live_bits[i / 64] |= 1 << (i % 64);
        self.live += 1;
        self.live_bytes += grown;
    }

    /// The first message with properties came: every live message's
    /// stored bytes get a properties length of 0 in front (once per block;
    /// released messages' bytes are dropped on the way).
    fn store_props(&mut self) {
        let extra = PROPS_LEN_BYTES * self.live as usize;
        let mut bytes = Vec::with_capacity(self.bytes.capacity().max(self.bytes.len() + extra));
        let mut start = 0;
        for i in 0..self.ends.len() {
            let end = self.ends[i] as usize;
            if self.is_live(i) {
                bytes.extend_from_slice(&[0; PROPS_LEN_BYTES]);
                bytes.extend_from_slice(&self.bytes[start..end]);
            }
            start = end;
            self.ends[i] = bytes.len() as u32;
        }
        self.bytes = bytes;
        self.live_bytes += extra as u64;
        self.with_props = true;
    }
    /// Message `i`'s properties and payload (it is live).
    fn body(&self, i: usize) -> (Props<'_>, &[u8]) {
        let stored = &self.bytes[self.start_of(i)..self.ends[i] as usize];
        if !self.with_props {
            return (Props::EMPTY, stored);
        }
        let len = usize::from(u16::from_le_bytes([stored[0], stored[1]]));
        let (props, payload) = stored[PROPS_LEN_BYTES..].split_at(len);
        (Props::trusted(props), payload)
    }
    /// Message `i`'s tag set.
    fn tag_set(&self, i: usize) -> Option<TagSetId> {
        self.tag_sets.get(i).and_then(|&raw| TagSetId::from_raw(raw))
    }
    /// Message `i` as stored (it is live).
    fn stored(&self, i: usize) -> Stored<'_> {
        let (props, payload) = self.body(i);
        Stored {
            id: self.first_id + i as u64,
            born_ms: self.born_base_ms + u64::from(self.born_delta_ms[i]),
            props,
            tag_set: self.tag_set(i),
            payload,
        }
    }
    fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            self.ends.shrink_to_fit();
            self.born_delta_ms.shrink_to_fit();
            self.live_bits.shrink_to_fit();
            self.bytes.shrink_to_fit();
            self.tag_sets.shrink_to_fit();
        }
    }
    /// Frees everything once no message is live.
    fn free(&mut self) {
        self.ends = Vec::new();
        self.born_delta_ms = Vec::new();
        self.live_bits = Vec::new();
        self.bytes = Vec::new();
        self.tag_sets = Vec::new();
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

    /// Rewrites `bytes` with only the live messages' stored bytes.
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
    /// Its properties, as produced (empty for none).
    pub props: Props<'a>,
    /// Its tags' set in the topic's table (`Seq::tags`); None untagged.
    pub tag_set: Option<TagSetId>,
    pub payload: &'a [u8],
}

impl<'a> Stored<'a> {
    /// Its size as the limits count it: properties and payload.
    pub fn bytes(&self) -> u64 {
        (self.props.bytes().len() + self.payload.len()) as u64
    }
    /// The message as `Seq::insert` takes it, holding the same tag set.
    pub fn body(&self) -> Body<'a> {
        Body { props: self.props, tag_set: self.tag_set, payload: self.payload }
    }
}

/// The ordered messages of a topic. Append at the tail; release anywhere.
#[derive(Default)]
pub struct Seq {
    /// Blocks in id order; only the last may be open. Blocks may leave gaps
    /// between them (ids that were never stored or were compacted away).
    pub(super) blocks: VecDeque<Block>,
    /// The id the next appended message gets.
    next_id: MsgId,
    /// Messages with ids below this are durable and may be delivered; those
    /// from here to `next_id` wait for the turn's commit (`publish`).
    visible_id: MsgId,
    /// Live messages.
    live: u64,
    /// Bytes of live messages: payloads and properties (what
    /// topic_bytes_max bounds).
    live_bytes: u64,
    /// Last born time handed out, so born times never go backwards.
    last_born_ms: u64,
    /// For a message in a dead-letter topic: where it came from and why (a
    /// per-message property; empty in other topics).
    dead: IdMap<DeadInfo>,
    /// The tags and tag sets of the messages, interned.
    tags: Tags,
    /// The messages whose delivery time is still to come (a per-message
    /// property; empty in a topic without any).
    schedule: Schedule,
}

impl Seq {
    pub fn new(first_id: MsgId) -> Seq {
        let first_id = first_id.max(1);
        Seq { next_id: first_id, visible_id: first_id, ..Seq::default() }
    }
    pub fn next_id(&self) -> MsgId {
        self.next_id
    }
    /// Ids below this may be delivered (`publish`).
    pub fn visible_id(&self) -> MsgId {
        self.visible_id
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

    /// Makes every appended message visible (the turn's commit made them
    /// durable).
    pub fn publish(&mut self) {
        self.visible_id = self.next_id;
    }

    /// Messages appended and not yet published.
    pub fn unpublished(&self) -> u64 {
        let mut n = 0;
        let mut id = self.visible_id;
        while let Some(next) = self.next_live(id, self.next_id) {
            n += 1;
            id = next + 1;
        }
        n
    }

    /// Appends a message with the next id and returns the id and the born
    /// time stored: `born_ms`, raised to the last born time if the clock
    /// went backwards.
    pub fn append<'b>(&mut self, born_ms: u64, m: impl Into<Body<'b>>) -> (MsgId, u64) {
        let born_ms = born_ms.max(self.last_born_ms);
        let id = self.next_id;
        self.insert(id, born_ms, m);
        (id, born_ms)
    }

    /// Stores a message at `id`, which must be at least `next_id` (ids in
    /// between become gaps), keeping `born_ms` as it is (a message moved
    /// from another topic, or recovered). Not visible until `publish`. Its
    /// tag set's reference, if any, passes to the stored message.
    pub fn insert<'b>(&mut self, id: MsgId, born_ms: u64, m: impl Into<Body<'b>>) {
        let m = m.into();
        assert!(id >= self.next_id, "ids only grow: {id} < {}", self.next_id);
        debug_assert!(m.tag_set.is_none() || m.props.tags().next().is_some(), "message {id}: a tag set without tags");
        let need_new = match self.blocks.back() {
            Some(b) => {
                let gap = id - b.end_id();
                let fits = b.can_take(born_ms, Block::stored_bytes(&m));
                !(fits && gap < (BLOCK_MESSAGES_MAX - b.ends.len()) as u64)
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
            block.push(block.born_base_ms, &Body::default(), false);
        }
        block.push(born_ms, &m, true);
        self.next_id = id + 1;
        self.live += 1;
        self.live_bytes += m.bytes();
        self.last_born_ms = self.last_born_ms.max(born_ms);
    }

    /// Puts back released message `id`, below `visible_id`, with its born
    /// time (a replay from the log files): into the block whose ids cover
    /// it, else at the end of the block before it if it fits there short
    /// of the next block, else into a new block of its own between them.
    /// Its tag set's reference passes to the stored message.
    pub fn put_back<'b>(&mut self, id: MsgId, born_ms: u64, m: impl Into<Body<'b>>) {
        let m = m.into();
        assert!(id < self.visible_id && !self.contains(id), "message {id} put back over a held or unpublished one");
        if let Some(bi) = self.block_index(id) {
            let b = &mut self.blocks[bi];
            b.revive((id - b.first_id) as usize, &m);
        } else {
            let i = self.blocks.partition_point(|b| b.first_id <= id);
            let next_first = self.blocks.get(i).map_or(MsgId::MAX, |b| b.first_id);
            let fits = i > 0 && id < next_first && {
                let b = &self.blocks[i - 1];
                !b.ends.is_empty()
                    && id - b.end_id() < (BLOCK_MESSAGES_MAX - b.ends.len()) as u64
                    && born_ms >= b.born_base_ms
                    && born_ms - b.born_base_ms <= u64::from(u32::MAX)
                    && b.bytes.len() + Block::stored_bytes(&m) <= BLOCK_BYTES_MAX
            };
            let bi = if fits {
                i - 1
            } else {
                let mut b = Block::new(id, born_ms);
                // Only the last block takes appends from produces.
                b.closed = true;
                self.blocks.insert(i, b);
                i
            };
            let b = &mut self.blocks[bi];
            while b.end_id() < id {
                b.push(b.born_base_ms, &Body::default(), false);
            }
            b.push(born_ms, &m, true);
        }
        self.live += 1;
        self.live_bytes += m.bytes();
    }

    /// The tag set of `props`' tags in this topic's table, with a reference
    /// taken for a message about to be stored (`insert`, or `untake_tags`
    /// if it is not): None for no tags. A new set past `max` sets is
    /// refused (recovery passes `TAG_SETS_MAX`: what the log holds is
    /// never refused).
    pub fn intern_tags(&mut self, props: &Props<'_>, max: u32) -> Result<Option<TagSetId>, TagsFull> {
        if props.is_empty() {
            return Ok(None);
        }
        match props.broker_entry(PROP_REDRIVEN_TO) {
            None => self.tags.intern(|| props.tags(), max),
            Some(group) => {
                let mark = format!("{REDRIVEN_TO_PREFIX}{group}");
                self.tags.intern(|| props.tags().chain(std::iter::once(mark.as_str())), max)
            }
        }
    }

    /// `intern_tags` for a message that must be stored whatever the table
    /// holds: one the log holds, or one moved from another topic (a dead
    /// letter, a redriven message). Bounded only by `TAG_SETS_MAX`, which a
    /// topic's produces never reach (`tag_sets_per_topic_max` is at most
    /// it), but a dead-letter topic gathers what its origin held over time:
    /// past it, the message is stored as untagged for filters (None), its
    /// properties kept whole.
    pub fn intern_tags_unbounded(&mut self, props: &Props<'_>) -> Option<TagSetId> {
        self.intern_tags(props, TAG_SETS_MAX).unwrap_or(None)
    }

    /// Gives back a reference `intern_tags` took for a message that was not
    /// stored after all.
    pub fn untake_tags(&mut self, set: Option<TagSetId>) {
        if let Some(set) = set {
            self.tags.release(set);
        }
    }

    /// The tag set of message `id`, if it is live and tagged: what a group's
    /// filter decides by (its decision cached per set: see `Tags::epoch`).
    pub fn tag_set(&self, id: MsgId) -> Option<TagSetId> {
        let b = &self.blocks[self.block_index(id)?];
        if b.tag_sets.is_empty() {
            return None;
        }
        let i = (id - b.first_id) as usize;
        if b.is_live(i) { b.tag_set(i) } else { None }
    }

    /// The topic's table of tags and tag sets.
    pub fn tags(&self) -> &Tags {
        &self.tags
    }

    /// Moves the tag table out (`Topic::merge` rebuilds the sequence and
    /// keeps the sets its messages hold).
    pub(super) fn take_tags(&mut self) -> Tags {
        std::mem::take(&mut self.tags)
    }
    pub(super) fn set_tags(&mut self, tags: Tags) {
        self.tags = tags;
    }

    /// The scheduled messages.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Whether message `id` is scheduled: stored, and delivered to no group
    /// until its time.
    #[inline]
    pub fn scheduled(&self, id: MsgId) -> bool {
        self.schedule.contains(id)
    }

    /// Schedules live message `id` at `due_ms` (or moves it there),
    /// writing the time into its stored delivery-time property, so that
    /// what is copied forward by compaction carries the time it has now.
    pub fn schedule_at(&mut self, id: MsgId, due_ms: u64) {
        if self.write_due(id, due_ms) {
            self.schedule.insert(id, due_ms);
        }
    }

    /// Writes `due_ms` into live message `id`'s delivery-time property
    /// (recovery applies a Reschedule record with it). False if the
    /// message is not live.
    pub fn write_due(&mut self, id: MsgId, due_ms: u64) -> bool {
        let Some(bi) = self.block_index(id) else { return false };
        let b = &mut self.blocks[bi];
        let i = (id - b.first_id) as usize;
        if !b.is_live(i) {
            return false;
        }
        let start = b.start_of(i);
        let (props, _) = b.body(i);
        if let Some(at) = props.schedule_value_at() {
            let at = start + PROPS_LEN_BYTES + at;
            b.bytes[at..at + 8].copy_from_slice(&due_ms.to_le_bytes());
        }
        true
    }

    /// Unschedules message `id` (its time came): returns when it was due.
    pub fn unschedule(&mut self, id: MsgId) -> Option<u64> {
        self.schedule.remove(id)
    }

    /// Takes the first scheduled message due at or before `now_ms`.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<(u64, MsgId)> {
        self.schedule.pop_due(now_ms)
    }

    /// Stores message `id`'s dead-letter origin (it is a dead letter).
    pub fn set_dead_info(&mut self, id: MsgId, info: DeadInfo) {
        assert!(self.contains(id), "dead-letter origin of message {id}, which is not stored");
        self.dead.insert(id, info);
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
        Some(b.stored(i))
    }

    /// Where a dead letter came from and why.
    pub fn dead_info(&self, id: MsgId) -> Option<DeadInfo> {
        if self.dead.is_empty() { None } else { self.dead.get(&id).copied() }
    }

    pub fn contains(&self, id: MsgId) -> bool {
        self.block_index(id).is_some_and(|bi| {
            let b = &self.blocks[bi];
            b.is_live((id - b.first_id) as usize)
        })
    }

    /// Releases a live message: no group needs it any more. Returns its
    /// size (properties and payload), or None if it was not live.
    pub fn release(&mut self, id: MsgId) -> Option<u64> {
        let bi = self.block_index(id)?;
        let b = &mut self.blocks[bi];
        let i = (id - b.first_id) as usize;
        if !b.is_live(i) {
            return None;
        }
        let (props, payload) = b.body(i);
        let len = (props.bytes().len() + payload.len()) as u64;
        let stored = (b.ends[i] as usize - b.start_of(i)) as u64;
        if let Some(set) = b.tag_set(i) {
            self.tags.release(set);
        }
        b.live_bits[i / 64] &= !(1 << (i % 64));
        b.live -= 1;
        b.live_bytes -= stored;
        self.live -= 1;
        self.live_bytes -= len;
        if b.closed {
            b.tidy();
        }
        while self.blocks.front().is_some_and(|b| b.live == 0 && b.closed) {
            self.blocks.pop_front();
        }
        if !self.dead.is_empty() {
            self.dead.remove(&id);
        }
        self.schedule.remove(id);
        Some(len)
    }

    /// Releases the unpublished messages with ids in `first..first+count`
    /// (their produce was not made durable). Their ids are not reused.
    /// Returns how many were live.
    pub fn withdraw(&mut self, first: MsgId, count: u32) -> u64 {
        let ids = first..first + u64::from(count);
        // A consumer may have seen a published message: it is never taken back.
        assert!(
            ids.clone().all(|id| id >= self.visible_id || !self.contains(id)),
            "withdrawing published messages {ids:?} (visible up to {})",
            self.visible_id
        );
        ids.filter(|&id| self.release(id).is_some()).count() as u64
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

    /// How many live messages have ids in `from..until`: whole blocks by
    /// their count, the ends by their bits.
    pub fn live_in(&self, from: MsgId, until: MsgId) -> u64 {
        let mut n = 0;
        let first = self.blocks.partition_point(|b| b.end_id() <= from);
        for b in self.blocks.range(first..) {
            if b.first_id >= until {
                break;
            }
            if b.live == 0 {
                continue;
            }
            if from <= b.first_id && b.end_id() <= until {
                n += u64::from(b.live);
                continue;
            }
            let lo = (from.max(b.first_id) - b.first_id) as usize;
            let hi = (until.min(b.end_id()) - b.first_id) as usize;
            n += (lo..hi).filter(|&i| b.is_live(i)).count() as u64;
        }
        n
    }

    /// How many live messages with ids in `from..until` are not scheduled:
    /// what a group reading from `from` would find ready (STATS).
    pub fn unscheduled_in(&self, from: MsgId, until: MsgId) -> u64 {
        let scheduled = if self.schedule.is_empty() { 0 } else { self.schedule.count_in(from, until) };
        self.live_in(from, until).saturating_sub(scheduled)
    }

    /// The first id from which every message below `until` is live: from
    /// there on memory holds the topic whole (`until` itself if the
    /// message before it is not live). Below it, some message is missing:
    /// released, or never in memory.
    pub fn whole_from(&self, until: MsgId) -> MsgId {
        let mut at = until;
        for b in self.blocks.iter().rev() {
            if b.first_id >= at {
                continue;
            }
            // Ids between this block and `at` are in no block.
            if b.end_id() < at {
                return at;
            }
            let mut i = (at - b.first_id) as usize;
            if b.live as usize == b.ends.len() {
                i = 0;
            }
            while i > 0 && b.is_live(i - 1) {
                i -= 1;
            }
            if i > 0 {
                return b.first_id + i as u64;
            }
            at = b.first_id;
        }
        at
    }

    /// The first live message born at or after `born_ms` (a group's start
    /// or reset by time). Blocks whose last born time is earlier are
    /// skipped whole; born times only grow within a topic, except for
    /// messages moved in keeping theirs, which this takes as they lie.
    pub fn first_born_at_or_after(&self, born_ms: u64) -> Option<MsgId> {
        for b in &self.blocks {
            if b.live == 0 || b.born_delta_ms.last().is_some_and(|d| b.born_base_ms + u64::from(*d) < born_ms) {
                continue;
            }
            let at =
                (0..b.ends.len()).find(|&i| b.is_live(i) && b.born_base_ms + u64::from(b.born_delta_ms[i]) >= born_ms);
            if let Some(i) = at {
                return Some(b.first_id + i as u64);
            }
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
        self.blocks.iter().flat_map(|b| (0..b.ends.len()).filter(|&i| b.is_live(i)).map(move |i| b.stored(i)))
    }

    /// Heap bytes held (for memory reporting), the tag table's included.
    pub fn heap_bytes(&self) -> u64 {
        let blocks: u64 = self
            .blocks
            .iter()
            .map(|b| {
                (b.ends.capacity() * 4
                    + b.born_delta_ms.capacity() * 4
                    + b.live_bits.capacity() * 8
                    + b.bytes.capacity()
                    + b.tag_sets.capacity() * 2) as u64
                    + std::mem::size_of::<Block>() as u64
            })
            .sum();
        blocks + self.tags.heap_bytes()
    }
}
