//! The topic queues: plain data structures, driven by calls that pass the
//! time in, so that they are tested against simple models without a clock,
//! a socket or a file. One file, one noun:
//!
//! - `seq`: a topic's messages, packed in blocks (about 8.5 bytes of
//!   overhead per queued message), with their per-message properties;
//! - `tags`: a topic's interned tags and tag sets, by which groups filter;
//! - `schedule`: a topic's scheduled messages, by due time and by id;
//! - `group`: one consumer group's state over them (cursor, in flight,
//!   retry, delayed, who holds what);
//! - `keys`: a topic's keyed messages by key, for LOOKUP (a cache of the
//!   log);
//! - `inspect`: one message's state in every group, for PEEK and LOOKUP;
//! - `topic`: a `Seq` and its groups, and the rule that ties them: a
//!   message leaves the sequence once every group is done with it (and a
//!   topic with no group keeps every message).
//!
//! Timers go out through the `Timers` trait (the broker's wheel), so
//! nothing here reads a clock.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::codec::DeadInfo;
use crate::wheel::TimerKey;

mod dedup;
mod delays;
mod group;
mod inspect;
mod keys;
mod nack_reasons;
mod order;
mod retain;
mod retry;
mod schedule;
mod seq;
mod tags;
mod topic;

pub use dedup::DedupWindow;
pub use group::{FILTER_SKIPS_PER_CALL_MAX, Group, GroupConfig, Policy};
pub use inspect::{DEAD_NOTES_PER_TOPIC_MAX, GroupInspection, GroupState, Inspection};
pub use keys::KeyIndex;
pub use retain::Retention;
pub use retry::{RETRY_MULTIPLIER_PCT_MAX, RetryPolicy};
pub use schedule::Schedule;
pub use seq::{Body, Seq, Stored};
pub use tags::{TAG_SETS_MAX, TagId, TagSetId, Tags, TagsFull};
pub use topic::{SWEEP_IDS_PER_STEP_MAX, Stray, Topic};

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
    /// The default group: the one version 1 of the protocol reads.
    pub const DEFAULT: GroupId = GroupId(0);
    /// Set in the id of a broadcast group's member: one consumer
    /// connection's own position inside the group. Members are not logged
    /// (they end with their connection) and never named on the wire.
    pub const MEMBER_BIT: u32 = 1 << 31;
    /// Names no group: what a request of a broadcast group's consumer that
    /// is not (or no longer) a member acts on.
    pub const NONE: GroupId = GroupId(u32::MAX);

    /// Whether this is a broadcast group's member.
    pub fn is_member(self) -> bool {
        self.0 & GroupId::MEMBER_BIT != 0
    }
}

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

/// Arms and disarms the timers of one group of one topic (the broker's
/// wheel).
pub trait Timers {
    /// Schedules an ack deadline or a NACK delay for message `id`.
    fn arm(&mut self, deadline_ms: u64, id: MsgId) -> TimerKey;
    fn disarm(&mut self, key: TimerKey);
}

/// What happens to a delivery that failed (deadline, NACK, disconnect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Returned {
    /// Back in ready, or delayed.
    Retry,
    /// Out of deliveries: the caller moves it to the dead-letter topic and
    /// then calls `Topic::dead_lettered`.
    Dead(DeadInfo),
}

/// Per-topic settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub ack_timeout_ms: u32,
    pub max_deliveries: u16,
    /// How long a dedup id is remembered after its message is produced, ms
    /// (0: no deduplication); None for a topic whose record predates the
    /// setting: it has the broker's default (`Config::defaults`).
    pub dedup_window_ms: Option<u32>,
    /// Done messages kept in the log for replay (off by default).
    pub retention: Retention,
}

/// The dedup window a topic gets unless it asks for another: 2 minutes, as
/// NATS JetStream's duplicate window, long enough to cover a client's
/// reconnect and retry, short enough to keep the entries few.
pub const DEDUP_WINDOW_MS_DEFAULT: u32 = 120_000;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ack_timeout_ms: 30_000,
            max_deliveries: 16,
            dedup_window_ms: Some(DEDUP_WINDOW_MS_DEFAULT),
            retention: Retention::default(),
        }
    }
}

/// Counters kept since the broker started: `produced` is the topic's, the
/// others its group's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub produced: u64,
    pub delivered: u64,
    pub redelivered: u64,
    pub acked: u64,
    pub nacked: u64,
    pub dead_lettered: u64,
    pub expired: u64,
    /// Messages the group's tag filter stepped over (done for it unread).
    pub filtered: u64,
}

/// What one FETCH takes from a group: for whom, how much, and until when
/// it may hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Take {
    /// The consumer the messages go to.
    pub owner: ConsumerId,
    /// Most messages (at least one is taken if any is ready).
    pub max_messages: u32,
    /// Most payload bytes, past the first message.
    pub max_bytes: u64,
    /// The ack deadline of each, ms.
    pub deadline_ms: u64,
}

/// A message handed out by `Topic::fetch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub id: MsgId,
    pub deliveries: u16,
}

#[cfg(test)]
mod groups_tests;
#[cfg(test)]
mod inspect_tests;
#[cfg(test)]
mod order_tests;
#[cfg(test)]
mod props_tests;
#[cfg(test)]
mod redrive_tests;
#[cfg(test)]
mod tests;
