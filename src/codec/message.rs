//! Delivered messages on the wire: the layout FETCH replies and pushed
//! frames share (docs/protocol.md, "FETCH"), written by `MessagesWriter`
//! and read back by the client.

use super::*;

/// A message as delivered by FETCH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message<'a> {
    pub id: u64,
    pub born_ms: u64,
    /// How many times it has been delivered, this delivery included.
    pub delivery_count: u16,
    /// Present for messages in a dead-letter topic.
    pub dead: Option<DeadInfo>,
    /// With `dead`: the group that dead-lettered it; "" for the default
    /// group (version 2; a version-1 session is not told).
    pub origin_group: &'a str,
    /// Its tags and headers (version 2; a version-1 session gets none).
    pub props: Props<'a>,
    pub payload: &'a [u8],
}

/// Why and from where a message was dead-lettered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeadInfo {
    /// Its id in the topic it came from.
    pub origin_id: u64,
    /// How many times it had been delivered there.
    pub origin_deliveries: u16,
    pub reason: DeadReason,
}

/// Why a message was dead-lettered. The numbers are part of the protocol
/// and of the log format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum DeadReason {
    /// Its last allowed delivery passed its ack deadline.
    AckTimeout = 1,
    /// Its last allowed delivery was NACKed.
    Nacked = 2,
    /// A NACK with the dead-letter flag sent it there at once.
    Rejected = 3,
    /// Its last allowed delivery went to a consumer that disconnected.
    ConsumerLost = 4,
}

impl DeadReason {
    pub fn from_u8(v: u8) -> Option<DeadReason> {
        Some(match v {
            1 => DeadReason::AckTimeout,
            2 => DeadReason::Nacked,
            3 => DeadReason::Rejected,
            4 => DeadReason::ConsumerLost,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            DeadReason::AckTimeout => "ack_timeout",
            DeadReason::Nacked => "nacked",
            DeadReason::Rejected => "rejected",
            DeadReason::ConsumerLost => "consumer_lost",
        }
    }
}

/// Builds a FETCH reply in place: `begin`, `push` each message, `finish`.
pub struct MessagesWriter {
    start: usize,
    count_at: usize,
    count: u32,
    /// The session's version: what a message may carry.
    version: u16,
}

impl MessagesWriter {
    /// Starts the reply to a FETCH of a session speaking `version`.
    pub fn begin(out: &mut Vec<u8>, request_id: u32, topic: &str, version: u16) -> MessagesWriter {
        MessagesWriter::begin_op(out, op::FETCH, request_id, topic, version)
    }
    /// Starts a pushed frame of subscription `subscription` (version 3):
    /// a FETCH reply's body under the op PUSH.
    pub fn begin_pushed(out: &mut Vec<u8>, subscription: u32, topic: &str, version: u16) -> MessagesWriter {
        MessagesWriter::begin_op(out, op::PUSH, subscription, topic, version)
    }
    fn begin_op(out: &mut Vec<u8>, op: u8, request_id: u32, topic: &str, version: u16) -> MessagesWriter {
        let start = begin_frame(out, op | REPLY_BIT, 0, request_id);
        put_str(out, topic.as_bytes());
        let count_at = out.len();
        put_u32(out, 0);
        MessagesWriter { start, count_at, count: 0, version }
    }
    /// Appends a message; for a version-1 session without its properties
    /// and origin group, which that version cannot carry.
    pub fn push(&mut self, out: &mut Vec<u8>, m: &Message<'_>) {
        put_message(out, m, self.version);
        self.count += 1;
    }
    pub fn count(&self) -> u32 {
        self.count
    }
    pub fn finish(self, out: &mut [u8]) {
        out[self.count_at..self.count_at + 4].copy_from_slice(&self.count.to_le_bytes());
        end_frame(out, self.start);
    }
}

/// Bytes of a message's fields in a FETCH reply before its payload,
/// without the fields its flags announce: id, born_ms, delivery_count,
/// flags, len.
const MESSAGE_WIRE_FIXED_BYTES: usize = 8 + 8 + 2 + 1 + 4;

/// Most bytes a message takes in a FETCH reply besides its payload, its
/// properties and its origin group's name: the fixed fields, the
/// dead-letter fields and the two u16 lengths of those variable fields.
pub const MESSAGE_WIRE_OVERHEAD_BYTES_MAX: usize = MESSAGE_WIRE_FIXED_BYTES + DEAD_INFO_BYTES + 2 + 2;

/// Bytes of the dead-letter fields (`put_dead_info`).
pub const DEAD_INFO_BYTES: usize = 8 + 2 + 1;

/// The dead-letter fields: `origin_id u64, origin_deliveries u16, reason
/// u8`. A field helper the FETCH reply and the log's Produce record share.
pub fn put_dead_info(out: &mut Vec<u8>, d: &DeadInfo) {
    put_u64(out, d.origin_id);
    put_u16(out, d.origin_deliveries);
    out.push(d.reason as u8);
}

/// The flags a message is sent with to a session of `version`.
fn message_flags(m: &Message<'_>, version: u16) -> u8 {
    let mut flags = 0;
    if m.dead.is_some() {
        flags |= MSG_FLAG_DEAD;
        if version >= 2 && !m.origin_group.is_empty() {
            flags |= MSG_FLAG_ORIGIN_GROUP;
        }
    }
    // A later version's properties are left out for an earlier session,
    // which would refuse them: a message with only those goes without.
    if version >= 2 && !m.props.is_empty() && (version >= V3 || props::props_len_for(&m.props, version) > 0) {
        flags |= MSG_FLAG_PROPS;
    }
    flags
}

/// The one layout of a delivered message: id, born_ms, delivery_count,
/// flags, then the fields the flags announce, then the payload.
fn put_message(out: &mut Vec<u8>, m: &Message<'_>, version: u16) {
    let flags = message_flags(m, version);
    put_u64(out, m.id);
    put_u64(out, m.born_ms);
    put_u16(out, m.delivery_count);
    out.push(flags);
    if let Some(d) = &m.dead {
        put_dead_info(out, d);
    }
    if flags & MSG_FLAG_ORIGIN_GROUP != 0 {
        put_str(out, m.origin_group.as_bytes());
    }
    if flags & MSG_FLAG_PROPS != 0 {
        props::put_props_for(out, &m.props, version);
    }
    put_u32(out, m.payload.len() as u32);
    out.extend_from_slice(m.payload);
}

/// Bytes a message takes in the FETCH reply of a session of `version`.
pub fn message_wire_bytes(m: &Message<'_>, version: u16) -> usize {
    let flags = message_flags(m, version);
    let mut n = MESSAGE_WIRE_FIXED_BYTES + m.payload.len();
    if m.dead.is_some() {
        n += DEAD_INFO_BYTES;
    }
    if flags & MSG_FLAG_ORIGIN_GROUP != 0 {
        n += 2 + m.origin_group.len();
    }
    if flags & MSG_FLAG_PROPS != 0 {
        n += 2 + if version >= V3 { m.props.bytes().len() } else { props::props_len_for(&m.props, version) };
    }
    n
}

pub(super) fn parse_message<'a>(rd: &mut Rd<'a>) -> Option<Message<'a>> {
    let id = rd.u64()?;
    let born_ms = rd.u64()?;
    let delivery_count = rd.u16()?;
    let flags = rd.u8()?;
    let known = MSG_FLAG_DEAD | MSG_FLAG_PROPS | MSG_FLAG_ORIGIN_GROUP;
    // A flag this codec does not know may announce fields it cannot skip:
    // refuse rather than misread. An origin group without dead-letter
    // fields, or an empty one (the default group goes without), is not
    // what a broker writes.
    if flags & !known != 0 || flags & (MSG_FLAG_DEAD | MSG_FLAG_ORIGIN_GROUP) == MSG_FLAG_ORIGIN_GROUP {
        return None;
    }
    let dead = if flags & MSG_FLAG_DEAD != 0 {
        Some(DeadInfo { origin_id: rd.u64()?, origin_deliveries: rd.u16()?, reason: DeadReason::from_u8(rd.u8()?)? })
    } else {
        None
    };
    let origin_group = if flags & MSG_FLAG_ORIGIN_GROUP != 0 { str_field(rd).filter(|g| !g.is_empty())? } else { "" };
    let props = if flags & MSG_FLAG_PROPS != 0 {
        let len = rd.u16()?;
        Props::parse(rd.bytes(len as usize)?, CODEC_VERSION_MAX, &PropsLimits::ANY).ok().filter(|p| !p.is_empty())?
    } else {
        Props::EMPTY
    };
    let len = rd.u32()?;
    Some(Message { id, born_ms, delivery_count, dead, origin_group, props, payload: rd.bytes(len as usize)? })
}

/// The body of a FETCH reply or a pushed frame: the topic and messages.
pub(super) fn parse_messages<'a>(rd: &mut Rd<'a>) -> Option<(&'a str, Vec<Message<'a>>)> {
    let topic = str_field(rd)?;
    let count = rd.u32()?;
    // Each message takes at least 23 bytes: bound the allocation by what
    // the frame can hold, not by what it claims.
    let mut messages = Vec::with_capacity((count as usize).min(rd.buf.len() / 23));
    for _ in 0..count {
        messages.push(parse_message(rd)?);
    }
    Some((topic, messages))
}
