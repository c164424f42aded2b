//! The commit log's records, typed: every kind the log holds, with one
//! encoder and one decoder each (docs/log-format.md is the contract).
//!
//! The log (`log.rs`) frames records and knows nothing of what their bodies
//! say; this file is the one place that does. A record is written with the
//! newest version of its kind (`RecordKind::version`), and read by the
//! decoder for the (kind, version) its header names, so a broker reads every
//! version any earlier broker wrote (beanstalkd's `file.c` switches on the
//! version the same way). The layout of a message in a Produce record is
//! written here once: `put_message` and `read_message`, and its size,
//! `message_record_bytes`, follows from the same field sizes. The wire
//! protocol has a message layout of its own (`codec.rs`); the two share the
//! field helpers (`codec::put_u64`, `put_dead_info`), never a layout, so
//! either can change without the other.
//!
//! Writing: `Log::begin(kind)` writes the header with the kind's version,
//! then the kind's encoder appends the body, then `Log::end`. The encoders
//! take the log itself, so a body is never written under another kind's
//! header.

use byteorder::{ByteOrder, LittleEndian};

use crate::codec::{self, DeadInfo, DeadReason, Props};
use crate::log::{Log, RECORD_HEADER_BYTES, RecordStart};
use crate::queue::{Body, GroupId, MsgId, Retention, RetryPolicy, Settings};
pub use crate::record_deliver::{DeliverRecord, DeliveredIds};
#[path = "record_message.rs"]
mod message;
pub use message::*;

/// A topic's number in the log: assigned at creation, never reused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicId(pub u32);

impl TopicId {
    /// Names no topic: a Delete record with this id only restates the id
    /// floor (compaction writes it).
    pub const FLOOR: TopicId = TopicId(u32::MAX);
    /// The highest id a topic may have: below `FLOOR`, so that no topic
    /// ever takes it, however many are created and deleted.
    pub const MAX: TopicId = TopicId(u32::MAX - 1);

    /// The id after this one, if a topic may have it.
    pub fn next(self) -> Option<TopicId> {
        (self < TopicId::MAX).then(|| TopicId(self.0 + 1))
    }
}

impl std::fmt::Display for TopicId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// What a record says. The numbers are part of the log format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// A topic was created, its settings changed, or compaction restated it.
    Topic = 1,
    /// A topic was deleted (or compaction restated the id floor).
    Delete = 2,
    /// A topic was purged.
    Purge = 3,
    /// Messages were stored (produced, dead-lettered, redriven, or copied
    /// forward by compaction).
    Produce = 4,
    /// Messages left a topic (acked, dead-lettered, redriven).
    Remove = 5,
    /// Messages went back to ready with a delivery count.
    Requeue = 6,
    /// A consumer group was created, its settings changed, or compaction
    /// restated it.
    Group = 7,
    /// A consumer group was deleted.
    GroupDelete = 8,
    /// A consumer group's whole state: its cursor and what it still needs
    /// below it (RESET_GROUP, and compaction's restatement).
    GroupState = 9,
    /// Scheduled messages were cancelled: they left the topic.
    Cancel = 10,
    /// Scheduled messages were moved to a new time.
    Reschedule = 11,
    /// Scheduled messages' time came: each became ready for every group
    /// past it.
    Due = 12,
    /// Messages went back to a group after a failed delivery, delayed
    /// until a wall-clock time (a NACK with a delay).
    Delay = 13,
    /// Messages a consumer group delivered, each once more
    /// (`record_deliver.rs`).
    Deliver = 14,
    /// ACK_PRODUCE: messages acked for a group and messages stored in
    /// other topics, in one record, so that a torn or lost record is
    /// neither (protocol version 3).
    AckProduce = 15,
    /// The reasons NACKs gave for messages of a consumer group (protocol
    /// version 4): each message's last one, until the group is done with it.
    NackReason = 16,
    /// A topic's dedup window restated by compaction (protocol version 4):
    /// the dedup ids still remembered, with their messages and produce
    /// times, so that removing the Produce records that carried them
    /// forgets none.
    Dedup = 17,
    /// The frame every write of the log begins with: its sequence number,
    /// how much of its segment a completed `fdatasync` had made durable
    /// when it was issued, and how many bytes of records follow it. The
    /// log's own (`log.rs` writes it, recovery reads it); it says nothing
    /// to the broker, which never sees one.
    Write = 18,
}

impl RecordKind {
    pub fn from_u8(v: u8) -> Option<RecordKind> {
        Some(match v {
            1 => RecordKind::Topic,
            2 => RecordKind::Delete,
            3 => RecordKind::Purge,
            4 => RecordKind::Produce,
            5 => RecordKind::Remove,
            6 => RecordKind::Requeue,
            7 => RecordKind::Group,
            8 => RecordKind::GroupDelete,
            9 => RecordKind::GroupState,
            10 => RecordKind::Cancel,
            11 => RecordKind::Reschedule,
            12 => RecordKind::Due,
            13 => RecordKind::Delay,
            14 => RecordKind::Deliver,
            15 => RecordKind::AckProduce,
            16 => RecordKind::NackReason,
            17 => RecordKind::Dedup,
            18 => RecordKind::Write,
            _ => return None,
        })
    }

    /// The newest body version of this kind: the one this build writes, and
    /// the highest it reads (it reads every version from 1 up). Bump it
    /// when the body changes, and add the new version's decoder beside the
    /// old ones (docs/log-format.md, "Changing the format").
    pub const fn version(self) -> u8 {
        match self {
            RecordKind::Delete | RecordKind::Purge => 1,
            RecordKind::GroupDelete | RecordKind::GroupState => 1,
            // Version 2 may carry a retry policy (flag 0x04, after the
            // filter); version 1 has none.
            RecordKind::Group => 2,
            RecordKind::Cancel | RecordKind::Reschedule | RecordKind::Due => 1,
            // Version 2 has a flags byte after the group id (0x01: the
            // waits are a retry policy's); version 1 meant NACK delays.
            RecordKind::Delay => 2,
            RecordKind::Deliver => 1,
            // Its messages are laid out as in a Produce record of version 2.
            RecordKind::AckProduce => 1,
            RecordKind::Dedup => 1,
            RecordKind::NackReason => 1,
            RecordKind::Write => 1,
            // Version 2 names the consumer group; version 1 meant the
            // default group.
            RecordKind::Remove | RecordKind::Requeue => 2,
            // Version 2 carries each message's properties (flag bit 0x02);
            // version 1 has none.
            RecordKind::Produce => 2,
            // Version 3 adds the topic's settings list (protocol version 4's
            // CREATE_TOPIC list, as on the wire) after the name; versions 1
            // and 2 have none: the broker's defaults. Version 2 carries the
            // next group id, and the topic's groups come in Group records;
            // version 1 meant a topic with the default group and no other.
            RecordKind::Topic => 3,
        }
    }

    /// Whether this build reads version `version` of this kind.
    pub fn reads(self, version: u8) -> bool {
        (1..=self.version()).contains(&version)
    }
}

/// Why messages left a topic, as a Remove record says. The numbers are part
/// of the log format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RemoveReason {
    /// Acknowledged.
    Acked = 1,
    /// Moved to the dead-letter topic (a Produce into it comes first).
    DeadLettered = 2,
    /// Moved back to its origin topic by REDRIVE (a Produce into it comes
    /// first).
    Redriven = 3,
}

impl RemoveReason {
    fn from_u8(v: u8) -> Option<RemoveReason> {
        Some(match v {
            1 => RemoveReason::Acked,
            2 => RemoveReason::DeadLettered,
            3 => RemoveReason::Redriven,
            _ => return None,
        })
    }
}

// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// Encoders: one per kind.
// ---------------------------------------------------------------------------

/// A Topic record: topic `topic` exists with this name and these settings,
/// and hands out ids from at least `next_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopicRecord<'a> {
    pub topic: TopicId,
    pub next_id: MsgId,
    pub settings: Settings,
    /// The id the topic's next group gets; None in a version-1 record,
    /// whose topic has the default group (and no other).
    pub next_group_id: Option<u32>,
    pub name: &'a str,
}

impl TopicRecord<'_> {
    /// Log bytes of a Topic record whose name has `name_bytes` bytes,
    /// header included.
    /// The most bytes its settings list takes (`TOPIC_SETTINGS_BYTES_MAX`).
    pub const fn bytes(name_bytes: usize) -> u64 {
        (RECORD_HEADER_BYTES + 4 + 8 + 4 + 2 + 4 + 2 + name_bytes + 2 + TOPIC_SETTINGS_BYTES_MAX) as u64
    }

    /// Writes version 3: `topic_id u32, next_id u64, ack_timeout_ms u32,
    /// max_deliveries u16, next_group_id u32, name str, settings_len u16,
    /// settings` (the list of `codec::topic_settings`).
    pub fn append(&self, log: &mut Log) {
        let at = log.begin(RecordKind::Topic);
        let b = log.body();
        codec::put_u32(b, self.topic.0);
        codec::put_u64(b, self.next_id);
        codec::put_u32(b, self.settings.ack_timeout_ms);
        codec::put_u16(b, self.settings.max_deliveries);
        codec::put_u32(b, self.next_group_id.unwrap_or(1));
        codec::put_str(b, self.name.as_bytes());
        let len_at = b.len();
        codec::put_u16(b, 0);
        let r = self.settings.retention;
        let options = codec::TopicOptions {
            dedup_window_ms: self.settings.dedup_window_ms,
            retention_ms: (r.ms > 0).then_some(r.ms),
            retention_bytes: (r.bytes > 0).then_some(r.bytes),
        };
        codec::topic_settings::put_options(b, &options);
        let len = (b.len() - len_at - 2) as u16;
        b[len_at..len_at + 2].copy_from_slice(&len.to_le_bytes());
        log.end(at);
    }
}

/// Bytes of the settings a Topic record carries, at most: the dedup
/// window's entry and the two retention entries.
const TOPIC_SETTINGS_BYTES_MAX: usize = 3 + 4 + 2 * (3 + 8);

/// A Delete record: the topic and its messages are gone, and no id below
/// `next_id` is handed out again by any topic created later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeleteRecord {
    pub topic: TopicId,
    pub next_id: MsgId,
}

impl DeleteRecord {
    /// Log bytes of a Delete record, header included.
    pub const BYTES: u64 = (RECORD_HEADER_BYTES + 4 + 8) as u64;

    pub fn append(&self, log: &mut Log) {
        let at = log.begin(RecordKind::Delete);
        codec::put_u32(log.body(), self.topic.0);
        codec::put_u64(log.body(), self.next_id);
        log.end(at);
    }
}

/// A Purge record: every message of the topic below `below_id` is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PurgeRecord {
    pub topic: TopicId,
    pub below_id: MsgId,
}

impl PurgeRecord {
    pub fn append(&self, log: &mut Log) {
        let at = log.begin(RecordKind::Purge);
        codec::put_u32(log.body(), self.topic.0);
        codec::put_u64(log.body(), self.below_id);
        log.end(at);
    }
}

/// A Remove record: messages left topic `topic` (for group `group`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoveRecord<'a> {
    pub topic: TopicId,
    pub group: GroupId,
    pub reason: RemoveReason,
    pub ids: &'a [MsgId],
}

impl RemoveRecord<'_> {
    /// Writes version 2: `topic_id u32, group_id u32, reason u8, count u32,
    /// count x id u64`.
    pub fn append(&self, log: &mut Log) {
        let at = log.begin(RecordKind::Remove);
        let b = log.body();
        codec::put_u32(b, self.topic.0);
        codec::put_u32(b, self.group.0);
        b.push(self.reason as u8);
        codec::put_u32(b, self.ids.len() as u32);
        for id in self.ids {
            codec::put_u64(b, *id);
        }
        log.end(at);
    }
}

/// A Requeue record: messages of topic `topic` went back to ready (for
/// group `group`) with these delivery counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequeueRecord<'a> {
    pub topic: TopicId,
    pub group: GroupId,
    /// (id, deliveries so far).
    pub entries: &'a [(MsgId, u16)],
}

impl RequeueRecord<'_> {
    /// Log bytes of a Requeue record with `entries` entries.
    pub const fn bytes(entries: usize) -> u64 {
        (RECORD_HEADER_BYTES + 4 + 4 + 4 + 10 * entries) as u64
    }

    /// Writes version 2: `topic_id u32, group_id u32, count u32, count x
    /// (id u64, deliveries u16)`.
    pub fn append(&self, log: &mut Log) {
        let at = log.begin(RecordKind::Requeue);
        let b = log.body();
        codec::put_u32(b, self.topic.0);
        codec::put_u32(b, self.group.0);
        codec::put_u32(b, self.entries.len() as u32);
        for (id, d) in self.entries {
            codec::put_u64(b, *id);
            codec::put_u16(b, *d);
        }
        log.end(at);
    }
}

/// Bit in a Group record's flags: a broadcast group.
pub const GROUP_RECORD_BROADCAST: u8 = 0x01;
/// Bit in a Group record's flags: ordered by key (older builds wrote 0).
pub const GROUP_RECORD_ORDERED: u8 = 0x02;
/// Bit in a Group record's flags (version 2): a retry policy follows the
/// filter.
pub const GROUP_RECORD_RETRY: u8 = 0x04;
/// Bytes of a retry policy in a Group record: `initial_ms u32, cap_ms
/// u32, multiplier_pct u16, jitter_pct u8`, as on the wire.
const RETRY_POLICY_BYTES: usize = 4 + 4 + 2 + 1;

/// A Group record: group `group` of topic `topic` exists with this name
/// and these settings; created at `cursor` (a group already known keeps
/// its position: only its settings change).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupRecord<'a> {
    pub topic: TopicId,
    pub group: GroupId,
    pub broadcast: bool,
    /// Ordered by key.
    pub ordered: bool,
    /// 0 = the topic's.
    pub ack_timeout_ms: u32,
    /// 0 = the topic's.
    pub max_deliveries: u16,
    /// The first id the group needs.
    pub cursor: MsgId,
    pub name: &'a str,
    /// The tag filter's text (empty = `*`).
    pub filter: &'a str,
    /// The group's retry policy (version 2; None in version 1).
    pub retry: Option<RetryPolicy>,
}

impl GroupRecord<'_> {
    /// Log bytes of a Group record, header included.
    pub fn bytes(&self) -> u64 {
        let retry = if self.retry.is_some() { RETRY_POLICY_BYTES } else { 0 };
        (RECORD_HEADER_BYTES + 4 + 4 + 1 + 4 + 2 + 8 + 2 + self.name.len() + 2 + self.filter.len() + retry) as u64
    }

    /// Writes version 2: `topic_id u32, group_id u32, flags u8,
    /// ack_timeout_ms u32, max_deliveries u16, cursor u64, name str,
    /// filter str`, then with flag 0x04 the retry policy (`initial_ms
    /// u32, cap_ms u32, multiplier_pct u16, jitter_pct u8`).
    pub fn append(&self, log: &mut Log) {
        let at = log.begin(RecordKind::Group);
        let b = log.body();
        codec::put_u32(b, self.topic.0);
        codec::put_u32(b, self.group.0);
        b.push(
            (if self.broadcast { GROUP_RECORD_BROADCAST } else { 0 })
                | (if self.ordered { GROUP_RECORD_ORDERED } else { 0 })
                | (if self.retry.is_some() { GROUP_RECORD_RETRY } else { 0 }),
        );
        codec::put_u32(b, self.ack_timeout_ms);
        codec::put_u16(b, self.max_deliveries);
        codec::put_u64(b, self.cursor);
        codec::put_str(b, self.name.as_bytes());
        codec::put_str(b, self.filter.as_bytes());
        if let Some(p) = self.retry {
            put_retry_policy(b, &p);
        }
        log.end(at);
    }
}

/// Appends a retry policy as a Group record (and the wire) lays it out.
fn put_retry_policy(b: &mut Vec<u8>, p: &RetryPolicy) {
    codec::put_u32(b, p.initial_ms);
    codec::put_u32(b, p.cap_ms);
    codec::put_u16(b, p.multiplier_pct);
    b.push(p.jitter_pct);
}

/// Reads a retry policy of a Group record.
fn read_retry_policy(rd: &mut Reader<'_>) -> Result<RetryPolicy, String> {
    let (initial_ms, cap_ms, multiplier_pct, jitter_pct) = (rd.u32()?, rd.u32()?, rd.u16()?, rd.u8()?);
    Ok(RetryPolicy { initial_ms, multiplier_pct, cap_ms, jitter_pct })
}

/// A GroupDelete record: the group is gone (its id is never reused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupDeleteRecord {
    pub topic: TopicId,
    pub group: GroupId,
}

impl GroupDeleteRecord {
    /// Writes version 1: `topic_id u32, group_id u32`.
    pub fn append(&self, log: &mut Log) {
        let at = log.begin(RecordKind::GroupDelete);
        codec::put_u32(log.body(), self.topic.0);
        codec::put_u32(log.body(), self.group.0);
        log.end(at);
    }
}

/// A GroupState record: group `group` reads from `cursor`; below it, it
/// needs exactly the ids listed (with their deliveries so far), and the
/// ids listed at or above it carry these delivery counts. Every Remove and
/// Requeue record of the group before it is superseded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupStateRecord<'a> {
    pub topic: TopicId,
    pub group: GroupId,
    pub cursor: MsgId,
    /// (id, deliveries so far), in id order.
    pub entries: &'a [(MsgId, u16)],
}

impl GroupStateRecord<'_> {
    /// Log bytes of a GroupState record with `entries` entries.
    pub const fn bytes(entries: usize) -> u64 {
        (RECORD_HEADER_BYTES + 4 + 4 + 8 + 4 + 10 * entries) as u64
    }

    /// Writes version 1: `topic_id u32, group_id u32, cursor u64, count
    /// u32, count x (id u64, deliveries u16)`.
    pub fn append(&self, log: &mut Log) {
        let at = log.begin(RecordKind::GroupState);
        let b = log.body();
        codec::put_u32(b, self.topic.0);
        codec::put_u32(b, self.group.0);
        codec::put_u64(b, self.cursor);
        codec::put_u32(b, self.entries.len() as u32);
        for (id, d) in self.entries {
            codec::put_u64(b, *id);
            codec::put_u16(b, *d);
        }
        log.end(at);
    }
}

/// A Cancel or Due record: scheduled messages of topic `topic` were
/// cancelled (they left the topic), or their time came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduledRecord<'a> {
    pub topic: TopicId,
    pub ids: &'a [MsgId],
}

impl ScheduledRecord<'_> {
    /// Writes version 1 of `kind` (Cancel or Due): `topic_id u32, count
    /// u32, count x id u64`.
    pub fn append(&self, kind: RecordKind, log: &mut Log) {
        assert!(matches!(kind, RecordKind::Cancel | RecordKind::Due), "{kind:?} is not a Cancel or Due record");
        let at = log.begin(kind);
        let b = log.body();
        codec::put_u32(b, self.topic.0);
        codec::put_u32(b, self.ids.len() as u32);
        for id in self.ids {
            codec::put_u64(b, *id);
        }
        log.end(at);
    }
}

/// A Reschedule record: scheduled messages of topic `topic` are due at new
/// times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RescheduleRecord<'a> {
    pub topic: TopicId,
    /// (id, due ms since the Unix epoch).
    pub entries: &'a [(MsgId, u64)],
}

impl RescheduleRecord<'_> {
    /// Writes version 1: `topic_id u32, count u32, count x (id u64,
    /// deliver_at_ms u64)`.
    pub fn append(&self, log: &mut Log) {
        let at = log.begin(RecordKind::Reschedule);
        let b = log.body();
        codec::put_u32(b, self.topic.0);
        codec::put_u32(b, self.entries.len() as u32);
        for (id, due) in self.entries {
            codec::put_u64(b, *id);
            codec::put_u64(b, *due);
        }
        log.end(at);
    }
}

/// A Dedup record: topic `topic`'s dedup window holds these entries.
#[derive(Clone, Copy, Debug)]
pub struct DedupRecord;

impl DedupRecord {
    /// Log bytes of a Dedup record with `entries` entries whose dedup ids
    /// take `id_bytes` bytes in all.
    pub const fn bytes(entries: usize, id_bytes: usize) -> u64 {
        (RECORD_HEADER_BYTES + 4 + 4 + (8 + 8 + 2) * entries + id_bytes) as u64
    }

    /// Writes version 1: `topic_id u32, count u32, count x (produced_ms
    /// u64, id u64, dedup_id_len u16, dedup_id)`. Nothing for no entries.
    pub fn append<'a>(topic: TopicId, entries: impl Iterator<Item = (&'a [u8], MsgId, u64)>, log: &mut Log) {
        let at = log.begin(RecordKind::Dedup);
        let b = log.body();
        codec::put_u32(b, topic.0);
        let count_at = b.len();
        codec::put_u32(b, 0);
        let mut count = 0u32;
        for (dedup_id, id, produced_ms) in entries {
            codec::put_u64(b, produced_ms);
            codec::put_u64(b, id);
            codec::put_str(b, dedup_id);
            count += 1;
        }
        if count == 0 {
            log.abandon(at);
            return;
        }
        b[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
        log.end(at);
    }
}

/// The entries of a Dedup record, decoded as they are read: (dedup id,
/// message id, produced ms).
#[derive(Clone, Debug)]
pub struct DedupEntries<'a> {
    rd: Reader<'a>,
    left: u32,
}

impl<'a> Iterator for DedupEntries<'a> {
    type Item = Result<(&'a [u8], MsgId, u64), String>;
    fn next(&mut self) -> Option<Self::Item> {
        self.rd.entry(&mut self.left, |rd| {
            let (produced_ms, id) = (rd.u64()?, rd.u64()?);
            let len = rd.u16()? as usize;
            Ok((rd.bytes(len)?, id, produced_ms))
        })
    }
}

/// A NackReason record: the last reason a NACK gave for each of these
/// messages of group `group` of topic `topic`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NackReasonRecord<'a> {
    pub topic: TopicId,
    pub group: GroupId,
    /// (id, reason).
    pub entries: &'a [(MsgId, &'a str)],
}

impl NackReasonRecord<'_> {
    /// Log bytes of a NackReason record with `entries` entries whose
    /// reasons take `reason_bytes` bytes in all.
    pub const fn bytes(entries: usize, reason_bytes: usize) -> u64 {
        (RECORD_HEADER_BYTES + 4 + 4 + 4 + (8 + 2) * entries + reason_bytes) as u64
    }

    /// Writes version 1: `topic_id u32, group_id u32, count u32, count x
    /// (id u64, reason str)`. Nothing for no entries.
    pub fn append(&self, log: &mut Log) {
        if self.entries.is_empty() {
            return;
        }
        let at = log.begin(RecordKind::NackReason);
        let b = log.body();
        codec::put_u32(b, self.topic.0);
        codec::put_u32(b, self.group.0);
        codec::put_u32(b, self.entries.len() as u32);
        for (id, reason) in self.entries {
            codec::put_u64(b, *id);
            codec::put_str(b, reason.as_bytes());
        }
        log.end(at);
    }
}

/// The entries of a NackReason record, decoded as they are read: (id,
/// reason).
#[derive(Clone, Debug)]
pub struct NackReasons<'a> {
    rd: Reader<'a>,
    left: u32,
}

impl<'a> Iterator for NackReasons<'a> {
    type Item = Result<(MsgId, &'a str), String>;
    fn next(&mut self) -> Option<Self::Item> {
        self.rd.entry(&mut self.left, |rd| Ok((rd.u64()?, rd.str()?)))
    }
}

/// Bit in a Delay record's flags (version 2): the messages wait for retry
/// (their group's retry policy), not for a NACK's delay.
pub const DELAY_RECORD_RETRY: u8 = 0x01;

/// A Delay record: messages of topic `topic` went back to group `group`,
/// each ready again at a wall-clock time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DelayRecord<'a> {
    pub topic: TopicId,
    pub group: GroupId,
    /// The waits are the group's retry policy's (else NACK delays).
    pub retry: bool,
    /// (id, deliveries so far, ready-again time ms since the Unix epoch).
    pub entries: &'a [(MsgId, u16, u64)],
}

impl DelayRecord<'_> {
    /// Log bytes of a Delay record with `entries` entries.
    pub const fn bytes(entries: usize) -> u64 {
        (RECORD_HEADER_BYTES + 4 + 4 + 1 + 4 + 18 * entries) as u64
    }

    /// Writes version 2: `topic_id u32, group_id u32, flags u8, count u32,
    /// count x (id u64, deliveries u16, ready_at_ms u64)`.
    pub fn append(&self, log: &mut Log) {
        let at = log.begin(RecordKind::Delay);
        let b = log.body();
        codec::put_u32(b, self.topic.0);
        codec::put_u32(b, self.group.0);
        b.push(if self.retry { DELAY_RECORD_RETRY } else { 0 });
        codec::put_u32(b, self.entries.len() as u32);
        for (id, d, ready_at) in self.entries {
            codec::put_u64(b, *id);
            codec::put_u16(b, *d);
            codec::put_u64(b, *ready_at);
        }
        log.end(at);
    }
}

// ---------------------------------------------------------------------------
// The decoder: one, dispatching on (kind, version).
// ---------------------------------------------------------------------------

/// A record read back, typed. Lists are read lazily from the body.
#[derive(Clone, Debug)]
pub enum Record<'a> {
    Topic(TopicRecord<'a>),
    Delete(DeleteRecord),
    Purge(PurgeRecord),
    Produce {
        topic: TopicId,
        messages: Messages<'a>,
    },
    Remove {
        topic: TopicId,
        group: GroupId,
        reason: RemoveReason,
        ids: Ids<'a>,
    },
    Requeue {
        topic: TopicId,
        group: GroupId,
        entries: Requeues<'a>,
    },
    Group(GroupRecord<'a>),
    GroupDelete(GroupDeleteRecord),
    GroupState {
        topic: TopicId,
        group: GroupId,
        cursor: MsgId,
        entries: Requeues<'a>,
    },
    /// The acked ids of `group` of `topic`, and the messages stored in
    /// each output topic.
    AckProduce {
        topic: TopicId,
        group: GroupId,
        ids: Ids<'a>,
        outputs: Outputs<'a>,
    },
    Cancel {
        topic: TopicId,
        ids: Ids<'a>,
    },
    Reschedule {
        topic: TopicId,
        entries: Reschedules<'a>,
    },
    Due {
        topic: TopicId,
        ids: Ids<'a>,
    },
    NackReason {
        topic: TopicId,
        group: GroupId,
        entries: NackReasons<'a>,
    },
    Delay {
        topic: TopicId,
        group: GroupId,
        /// The waits are a retry policy's (`DELAY_RECORD_RETRY`).
        retry: bool,
        entries: Delays<'a>,
    },
    Deliver {
        topic: TopicId,
        group: GroupId,
        ids: DeliveredIds<'a>,
    },
    Dedup {
        topic: TopicId,
        entries: DedupEntries<'a>,
    },
}

impl<'a> Record<'a> {
    /// Decodes the body of a record of `kind`, version `version`. A body
    /// that does not match its layout is an error (the CRC held, so a
    /// broker wrote it: this build cannot apply it).
    pub fn decode(kind: RecordKind, version: u8, body: &'a [u8]) -> Result<Record<'a>, String> {
        if !kind.reads(version) {
            return Err(format!("{kind:?} record version {version} is unknown to this build"));
        }
        let mut rd = Reader { b: body, pos: 0 };
        let topic = TopicId(rd.u32()?);
        let record = match kind {
            RecordKind::Write => {
                return Err("a Write record frames a write of the log: the log reads it, never the broker".into());
            }
            RecordKind::Topic => Record::Topic(read_topic(&mut rd, topic, version)?),
            RecordKind::Group => Record::Group(read_group(&mut rd, topic, version)?),
            RecordKind::GroupDelete => Record::GroupDelete(GroupDeleteRecord { topic, group: GroupId(rd.u32()?) }),
            RecordKind::GroupState => {
                let (group, cursor) = (GroupId(rd.u32()?), rd.u64()?);
                Record::GroupState { topic, group, cursor, entries: Requeues(rd.list(10)?) }
            }
            RecordKind::Delete => Record::Delete(DeleteRecord { topic, next_id: rd.u64()? }),
            RecordKind::Purge => Record::Purge(PurgeRecord { topic, below_id: rd.u64()? }),
            RecordKind::Produce => {
                let count = rd.u32()?;
                return Ok(Record::Produce { topic, messages: Messages { rd, left: count, version } });
            }
            RecordKind::Remove => {
                let group = rd.group(version)?;
                let reason = RemoveReason::from_u8(rd.u8()?).ok_or("unknown remove reason")?;
                Record::Remove { topic, group, reason, ids: Ids(rd.list(8)?) }
            }
            RecordKind::Requeue => {
                let group = rd.group(version)?;
                Record::Requeue { topic, group, entries: Requeues(rd.list(10)?) }
            }
            RecordKind::Cancel => Record::Cancel { topic, ids: Ids(rd.list(8)?) },
            RecordKind::Reschedule => Record::Reschedule { topic, entries: Reschedules(rd.list(16)?) },
            RecordKind::Due => Record::Due { topic, ids: Ids(rd.list(8)?) },
            RecordKind::Delay => {
                let group = GroupId(rd.u32()?);
                let retry = version >= 2 && rd.u8()? & DELAY_RECORD_RETRY != 0;
                Record::Delay { topic, group, retry, entries: Delays(rd.list(18)?) }
            }
            RecordKind::Deliver => return crate::record_deliver::decode(topic, &rd.b[rd.pos..]),
            RecordKind::NackReason => {
                let (group, left) = (GroupId(rd.u32()?), rd.u32()?);
                return Ok(Record::NackReason { topic, group, entries: NackReasons { rd, left } });
            }
            RecordKind::Dedup => {
                let left = rd.u32()?;
                return Ok(Record::Dedup { topic, entries: DedupEntries { rd, left } });
            }
            RecordKind::AckProduce => {
                let (group, ids) = (GroupId(rd.u32()?), Ids(rd.list(8)?));
                let left = u32::from(rd.u16()?);
                let rest = Reader { b: &rd.b[rd.pos..], pos: 0 };
                return Ok(Record::AckProduce { topic, group, ids, outputs: Outputs { rd: rest, left } });
            }
        };
        if !rd.done() {
            return Err("bytes left over after the record body".into());
        }
        Ok(record)
    }
}

/// The rest of a Group record of `version` after its topic id.
fn read_group<'a>(rd: &mut Reader<'a>, topic: TopicId, version: u8) -> Result<GroupRecord<'a>, String> {
    let group = GroupId(rd.u32()?);
    let flags = rd.u8()?;
    let (ack_timeout_ms, max_deliveries, cursor) = (rd.u32()?, rd.u16()?, rd.u64()?);
    let (name, filter) = (rd.str()?, rd.str()?);
    // Version 2 may carry a retry policy; version 1 has none.
    let retry = if version >= 2 && flags & GROUP_RECORD_RETRY != 0 { Some(read_retry_policy(rd)?) } else { None };
    Ok(GroupRecord {
        topic,
        group,
        broadcast: flags & GROUP_RECORD_BROADCAST != 0,
        ordered: flags & GROUP_RECORD_ORDERED != 0,
        ack_timeout_ms,
        max_deliveries,
        cursor,
        name,
        filter,
        retry,
    })
}

/// The rest of a Topic record of `version` after its topic id.
fn read_topic<'a>(rd: &mut Reader<'a>, topic: TopicId, version: u8) -> Result<TopicRecord<'a>, String> {
    let next_id = rd.u64()?;
    let (ack_timeout_ms, max_deliveries) = (rd.u32()?, rd.u16()?);
    let next_group_id = if version == 1 { None } else { Some(rd.u32()?) };
    let name = rd.str()?;
    // Version 3 adds the settings list; before it, the broker's defaults.
    let options = if version >= 3 {
        let len = rd.u16()? as usize;
        codec::topic_settings::parse_stored(rd.bytes(len)?)?
    } else {
        codec::TopicOptions::default()
    };
    let retention = Retention { ms: options.retention_ms.unwrap_or(0), bytes: options.retention_bytes.unwrap_or(0) };
    let settings = Settings { ack_timeout_ms, max_deliveries, dedup_window_ms: options.dedup_window_ms, retention };
    Ok(TopicRecord { topic, next_id, settings, next_group_id, name })
}

/// The ids of a Remove record.
#[derive(Clone, Copy, Debug)]
pub struct Ids<'a>(&'a [u8]);

impl<'a> Ids<'a> {
    pub fn iter(&self) -> impl Iterator<Item = MsgId> + 'a {
        self.0.chunks_exact(8).map(LittleEndian::read_u64)
    }
}

/// The (id, deliveries) entries of a Requeue record.
#[derive(Clone, Copy, Debug)]
pub struct Requeues<'a>(&'a [u8]);

impl<'a> Requeues<'a> {
    pub fn iter(&self) -> impl Iterator<Item = (MsgId, u16)> + 'a {
        self.0.chunks_exact(10).map(|e| (LittleEndian::read_u64(e), LittleEndian::read_u16(&e[8..])))
    }
}

/// The (id, due ms) entries of a Reschedule record.
#[derive(Clone, Copy, Debug)]
pub struct Reschedules<'a>(&'a [u8]);

impl<'a> Reschedules<'a> {
    pub fn iter(&self) -> impl Iterator<Item = (MsgId, u64)> + 'a {
        self.0.chunks_exact(16).map(|e| (LittleEndian::read_u64(e), LittleEndian::read_u64(&e[8..])))
    }
}

/// The (id, deliveries, ready-at ms) entries of a Delay record.
#[derive(Clone, Copy, Debug)]
pub struct Delays<'a>(&'a [u8]);

impl<'a> Delays<'a> {
    pub fn iter(&self) -> impl Iterator<Item = (MsgId, u16, u64)> + 'a {
        self.0
            .chunks_exact(18)
            .map(|e| (LittleEndian::read_u64(e), LittleEndian::read_u16(&e[8..]), LittleEndian::read_u64(&e[10..])))
    }
}

/// A cursor over a record body.
#[derive(Clone, Debug)]
struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len()).ok_or("record body too short")?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.bytes(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        self.bytes(2).map(LittleEndian::read_u16)
    }
    fn u32(&mut self) -> Result<u32, String> {
        self.bytes(4).map(LittleEndian::read_u32)
    }
    fn u64(&mut self) -> Result<u64, String> {
        self.bytes(8).map(LittleEndian::read_u64)
    }
    fn str(&mut self) -> Result<&'a str, String> {
        let n = self.u16()? as usize;
        std::str::from_utf8(self.bytes(n)?).map_err(|_| "a name is not UTF-8".into())
    }
    /// The group a Remove or Requeue record of `version` names: version 1
    /// names none, which means the default group.
    fn group(&mut self, version: u8) -> Result<GroupId, String> {
        if version == 1 { Ok(GroupId::DEFAULT) } else { self.u32().map(GroupId) }
    }
    /// A `count u32` and `count` entries of `entry_bytes` each.
    fn list(&mut self, entry_bytes: usize) -> Result<&'a [u8], String> {
        let count = self.u32()? as usize;
        let bytes = count.checked_mul(entry_bytes).ok_or("record body too short")?;
        self.bytes(bytes)
    }
    /// The next of `left` entries, read by `read`; after the last, an error
    /// if bytes are left over (checked once). An error ends the list.
    fn entry<T>(
        &mut self,
        left: &mut u32,
        read: impl FnOnce(&mut Reader<'a>) -> Result<T, String>,
    ) -> Option<Result<T, String>> {
        if *left == 0 {
            return (!self.done()).then(|| {
                self.pos = self.b.len();
                Err("bytes left over after the record body".into())
            });
        }
        *left -= 1;
        let r = read(self);
        if r.is_err() {
            *left = 0;
            self.pos = self.b.len();
        }
        Some(r)
    }
    fn done(&self) -> bool {
        self.pos == self.b.len()
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
