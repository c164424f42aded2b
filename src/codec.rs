//! Frames of the runnel wire protocol, versions 1 and 2 (docs/protocol.md
//! is the contract; this file implements it).
//!
//! Every frame is a 12-byte header and a body; all integers little-endian:
//!
//! ```text
//! 0  u32 len         bytes after this field: 8 + body length
//! 4  u8  op          request opcode; a reply carries op | 0x80
//! 5  u8  status      0 in requests; in replies 0 = OK, else an ErrorCode
//! 6  u16 flags       reserved, 0
//! 8  u32 request_id  chosen by the client, echoed by the reply
//! 12 ... body
//! ```
//!
//! Decoding is a pure function over a byte slice, as in sozu and pelikan: it
//! returns a frame that borrows from the slice and the bytes it consumed,
//! "need more", or a typed error that says whether the frame boundary is
//! still known. It never allocates, and it checks every length against the
//! limits before the caller buffers anything. Encoding appends to a `Vec`.
//!
//! One opcode has one meaning in every version; its layout is chosen by the
//! session's negotiated version, which the request decoder and encoder take
//! (before HELLO, and in version 1, the version-1 layouts). An op or a
//! property type the session's version lacks is refused, never guessed at.
//! Replies need no version: a later version's reply fields are announced by
//! flag bits (a delivered message) or follow the version's fields (HELLO).
//! Version 2 adds consumer groups (`group.rs`) and message properties
//! (`props.rs`); version 3 push subscriptions (`push.rs`). This file holds
//! the requests; replies are in `reply.rs`, delivered messages in
//! `message.rs`, error codes in `error.rs`, the decoder's limits in
//! `limits.rs`.

use byteorder::{ByteOrder, LittleEndian};

pub mod ack_produce;
mod error;
pub mod group;
pub mod inspect;
mod limits;
mod message;
pub mod props;
pub mod push;
mod reply;
pub mod schedule;
pub mod topic_settings;

pub use error::ErrorCode;
pub use group::{
    GROUP_FLAG_BROADCAST, GroupInfo, GroupSettings, GroupStats, Start, check_group_name, encode_group_created_reply,
    encode_groups_reply,
};
pub use limits::{DecodeLimits, SINCE_HELLO_FEATURE_LIMITS};
pub use message::*;
pub use props::{Props, PropsLimits};
pub use push::{SINCE_PUSH, encode_credit_reply, encode_subscribed_reply};
pub use reply::*;
pub use topic_settings::TopicOptions;

/// The protocol versions the broker negotiates.
pub const VERSION_MIN: u16 = 1;
pub const VERSION_MAX: u16 = 6;
/// The highest version this codec, and so the client, speaks. The broker
/// raises VERSION_MAX to it once it serves every op of that version.
pub const CODEC_VERSION_MAX: u16 = 6;
/// Version 3: time and identity (scheduled messages and their ops).
pub const V3: u16 = 3;
/// Version 4: keys, inspection, idempotent produce, retry policy, ordering
/// by key.
pub const V4: u16 = 4;
/// Version 5: inspection tells a retry wait and a wait behind a key apart.
pub const V5: u16 = 5;
/// Version 6: the HELLO reply reports the limits of versions 3 and 4
/// (`SINCE_HELLO_FEATURE_LIMITS`).
pub const V6: u16 = 6;
/// Bytes in a frame header.
pub const HEADER_BYTES: usize = 12;
/// Bit set in the op of every reply.
pub const REPLY_BIT: u8 = 0x80;
/// Bit in a delivered message's flags: dead-letter fields follow.
pub const MSG_FLAG_DEAD: u8 = 0x01;
/// Bit in a delivered message's flags (version 2): its properties follow.
pub const MSG_FLAG_PROPS: u8 = 0x02;
/// Bit in a delivered message's flags (version 2, with MSG_FLAG_DEAD): the
/// name of the group that dead-lettered it follows the dead-letter fields.
pub const MSG_FLAG_ORIGIN_GROUP: u8 = 0x04;
/// Bit in NACK's flags: dead-letter the messages now instead of retrying.
pub const NACK_FLAG_DEAD_LETTER: u8 = 0x01;
/// Bit in NACK's flags (version 4): a reason follows the ids (`reason_len`
/// u16, UTF-8), kept with each message as its last NACK reason.
pub const NACK_FLAG_REASON: u8 = 0x02;
/// The protocol version that adds `NACK_FLAG_REASON`.
pub const SINCE_NACK_REASON: u16 = V4;
/// The first protocol version whose PRODUCE has a flags byte (after the
/// topic).
pub const SINCE_PRODUCE_FLAGS: u16 = 3;
/// Bit in PRODUCE's flags (version 3): acknowledge once the batch is
/// written to the log, before the `fdatasync` that makes it durable.
pub const PRODUCE_FLAG_WRITTEN: u8 = 0x01;
/// Bit in a reply header's `flags` (version 4): the PRODUCE reply's body
/// has the list of duplicates after its version-1 fields. A flag, not a
/// length, announces it, so that bytes after a reply's layout stay
/// ignorable ("Replies may grow").
pub const REPLY_FLAG_DUPLICATES: u16 = 0x0001;
/// Every PRODUCE flag this codec knows; another is MALFORMED.
const PRODUCE_FLAGS_KNOWN: u8 = PRODUCE_FLAG_WRITTEN;

/// Request opcodes.
pub mod op {
    pub const HELLO: u8 = 0x01;
    pub const PING: u8 = 0x02;
    pub const PRODUCE: u8 = 0x10;
    pub const FETCH: u8 = 0x11;
    pub const ACK: u8 = 0x12;
    pub const NACK: u8 = 0x13;
    pub const TOUCH: u8 = 0x14;
    pub const STATS: u8 = 0x20;
    pub const CREATE_TOPIC: u8 = 0x30;
    pub const DELETE_TOPIC: u8 = 0x31;
    pub const PURGE_TOPIC: u8 = 0x32;
    pub const LIST_TOPICS: u8 = 0x33;
    pub const REDRIVE: u8 = 0x34;
    pub const CREATE_GROUP: u8 = 0x40;
    pub const DELETE_GROUP: u8 = 0x41;
    pub const LIST_GROUPS: u8 = 0x42;
    pub const RESET_GROUP: u8 = 0x43;
    pub const SUBSCRIBE: u8 = 0x60;
    pub const CREDIT: u8 = 0x61;
    pub const UNSUBSCRIBE: u8 = 0x62;
    pub const ACK_PRODUCE: u8 = 0x63;
    /// Not a request: the op of a pushed frame (sent as 0xEF, with the
    /// reply bit), which answers no request.
    pub const PUSH: u8 = 0x6F;
    /// Not a request either: the error reply to a frame with PUSH's op
    /// (0x6F, or 0xEF with the reply bit) is sent with this op and the
    /// reply bit, 0xFF, so that a frame with op 0xEF is always a pushed
    /// one (`reply_op`).
    pub const IN_PLACE_OF_PUSH: u8 = 0x7F;
    pub const CANCEL: u8 = 0x50;
    pub const RESCHEDULE: u8 = 0x51;
    pub const LOOKUP: u8 = 0x52;
    pub const PEEK: u8 = 0x53;

    /// The first protocol version that has `op`, if any has.
    pub fn since(op: u8) -> Option<u16> {
        match op {
            HELLO | PING | PRODUCE | FETCH | ACK | NACK | TOUCH | STATS => Some(1),
            CREATE_TOPIC | DELETE_TOPIC | PURGE_TOPIC | LIST_TOPICS | REDRIVE => Some(1),
            CREATE_GROUP | DELETE_GROUP | LIST_GROUPS | RESET_GROUP => Some(2),
            SUBSCRIBE | CREDIT | UNSUBSCRIBE | ACK_PRODUCE => Some(super::SINCE_PUSH),
            CANCEL | RESCHEDULE => Some(super::V3),
            LOOKUP | PEEK => Some(super::V4),
            _ => None,
        }
    }
}

/// Per-topic settings carried by CREATE_TOPIC; 0 means "broker default".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopicSettings {
    pub ack_timeout_ms: u32,
    pub max_deliveries: u16,
}

/// A PRODUCE batch: `count` messages, each `u32 len` then the payload, or
/// in version 2 `u16 props_len`, the properties, then `u32 len` and the
/// payload. Validated by the decoder, so iterating cannot fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch<'a> {
    pub count: u32,
    /// The messages as they are on the wire, exactly.
    pub bytes: &'a [u8],
    /// Each message starts with its properties (the version-2 layout).
    pub with_props: bool,
}

impl<'a> Batch<'a> {
    /// The payloads alone, without their properties (see `messages`).
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.messages().map(|(_, payload)| payload)
    }
    /// Each message's properties and payload.
    pub fn messages(&self) -> BatchIter<'a> {
        BatchIter { rest: self.bytes, with_props: self.with_props }
    }
    /// Bytes of the messages, properties and payloads, without their length
    /// fields: what message_bytes_max bounds one message of.
    pub fn payload_bytes(&self) -> u64 {
        let per_message = if self.with_props { 2 + 4 } else { 4 };
        self.bytes.len() as u64 - per_message * u64::from(self.count)
    }
}

pub struct BatchIter<'a> {
    rest: &'a [u8],
    with_props: bool,
}

impl<'a> BatchIter<'a> {
    /// Takes a length-prefixed field; the batch was validated, so a short
    /// one only means the end.
    fn field(&mut self, len_bytes: usize) -> Option<&'a [u8]> {
        let len = match len_bytes {
            2 => LittleEndian::read_u16(self.rest.get(..2)?) as usize,
            _ => LittleEndian::read_u32(self.rest.get(..4)?) as usize,
        };
        let end = (len_bytes + len).min(self.rest.len());
        let field = &self.rest[len_bytes..end];
        self.rest = &self.rest[end..];
        Some(field)
    }
}

impl<'a> Iterator for BatchIter<'a> {
    type Item = (Props<'a>, &'a [u8]);
    fn next(&mut self) -> Option<(Props<'a>, &'a [u8])> {
        let props = if self.with_props { Props::trusted(self.field(2)?) } else { Props::EMPTY };
        Some((props, self.field(4)?))
    }
}

/// A list of message ids, `count` little-endian u64s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ids<'a> {
    pub bytes: &'a [u8],
}

impl<'a> Ids<'a> {
    pub fn len(&self) -> usize {
        self.bytes.len() / 8
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    pub fn iter(&self) -> impl Iterator<Item = u64> + 'a {
        self.bytes.chunks_exact(8).map(LittleEndian::read_u64)
    }
}

/// A decoded request. `group` is the consumer group a version-2 frame
/// names; version-1 frames name none, and decode to "", the default group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Hello {
        min_version: u16,
        max_version: u16,
        token: &'a [u8],
    },
    Ping,
    Produce {
        topic: &'a str,
        /// `PRODUCE_FLAG_*` bits (version 3; 0 in earlier layouts).
        flags: u8,
        batch: Batch<'a>,
    },
    Fetch {
        topic: &'a str,
        group: &'a str,
        max_messages: u32,
        max_bytes: u32,
        wait_ms: u32,
        ack_timeout_ms: u32,
    },
    Ack {
        topic: &'a str,
        group: &'a str,
        ids: Ids<'a>,
    },
    Nack {
        topic: &'a str,
        group: &'a str,
        delay_ms: u32,
        flags: u8,
        ids: Ids<'a>,
        /// With `NACK_FLAG_REASON` (version 4): why, UTF-8; else empty.
        reason: &'a str,
    },
    Touch {
        topic: &'a str,
        group: &'a str,
        ack_timeout_ms: u32,
        ids: Ids<'a>,
    },
    /// `topic` empty means every topic.
    Stats {
        topic: &'a str,
    },
    CreateTopic {
        topic: &'a str,
        settings: TopicSettings,
        /// The settings list of version 4 (none in earlier layouts).
        options: TopicOptions,
    },
    DeleteTopic {
        topic: &'a str,
    },
    PurgeTopic {
        topic: &'a str,
    },
    ListTopics,
    Redrive {
        topic: &'a str,
        group: &'a str,
        max_messages: u32,
    },
    /// Version 2 and later.
    CreateGroup {
        topic: &'a str,
        group: &'a str,
        settings: GroupSettings<'a>,
        start: Start,
    },
    DeleteGroup {
        topic: &'a str,
        group: &'a str,
    },
    ListGroups {
        topic: &'a str,
    },
    ResetGroup {
        topic: &'a str,
        group: &'a str,
        start: Start,
    },
    /// Version 3 and later: a push subscription to a group, with the
    /// most messages it may hold unacknowledged (`credit`).
    Subscribe {
        topic: &'a str,
        group: &'a str,
        credit: u32,
        ack_timeout_ms: u32,
    },
    /// Sets a subscription's credit.
    Credit {
        subscription: u32,
        credit: u32,
    },
    Unsubscribe {
        subscription: u32,
    },
    /// Version 3 and later.
    Cancel {
        topic: &'a str,
        id: u64,
    },
    Reschedule {
        topic: &'a str,
        id: u64,
        when: schedule::When,
    },
    /// The messages of `topic` with key `key` (version 4).
    Lookup {
        topic: &'a str,
        key: &'a [u8],
    },
    /// Message `id` of `topic` (version 4).
    Peek {
        topic: &'a str,
        id: u64,
    },
    /// Acks `ids` of `group` of `topic` and produces `outputs`, all of it
    /// or none (version 3).
    AckProduce {
        topic: &'a str,
        group: &'a str,
        ids: Ids<'a>,
        outputs: ack_produce::Outputs<'a>,
    },
}

impl Request<'_> {
    pub fn op(&self) -> u8 {
        match self {
            Request::Hello { .. } => op::HELLO,
            Request::Ping => op::PING,
            Request::Produce { .. } => op::PRODUCE,
            Request::Fetch { .. } => op::FETCH,
            Request::Ack { .. } => op::ACK,
            Request::Nack { .. } => op::NACK,
            Request::Touch { .. } => op::TOUCH,
            Request::Stats { .. } => op::STATS,
            Request::CreateTopic { .. } => op::CREATE_TOPIC,
            Request::DeleteTopic { .. } => op::DELETE_TOPIC,
            Request::PurgeTopic { .. } => op::PURGE_TOPIC,
            Request::ListTopics => op::LIST_TOPICS,
            Request::Redrive { .. } => op::REDRIVE,
            Request::CreateGroup { .. } => op::CREATE_GROUP,
            Request::DeleteGroup { .. } => op::DELETE_GROUP,
            Request::ListGroups { .. } => op::LIST_GROUPS,
            Request::ResetGroup { .. } => op::RESET_GROUP,
            Request::Subscribe { .. } => op::SUBSCRIBE,
            Request::Credit { .. } => op::CREDIT,
            Request::Unsubscribe { .. } => op::UNSUBSCRIBE,
            Request::Cancel { .. } => op::CANCEL,
            Request::Reschedule { .. } => op::RESCHEDULE,
            Request::Lookup { .. } => op::LOOKUP,
            Request::Peek { .. } => op::PEEK,
            Request::AckProduce { .. } => op::ACK_PRODUCE,
        }
    }

    /// The lowest version whose layout can carry this request: its op's
    /// (`op::since`); 2 for a group other than the default one, or a
    /// message with properties.
    pub fn version_needed(&self) -> u16 {
        let v4 = match *self {
            Request::Produce { batch, .. } => batch.messages().any(|(p, _)| !p.known_to(V3) && p.known_to(V4)),
            Request::CreateTopic { options, .. } => !options.is_empty(),
            Request::CreateGroup { settings, .. } => settings.ordered || settings.retry.is_some(),
            other => op::since(other.op()) == Some(V4),
        };
        if v4 {
            return V4;
        }
        let v3 = match *self {
            Request::Produce { batch, .. } => batch.messages().any(|(p, _)| !p.known_to(2) && p.known_to(V3)),
            other => op::since(other.op()) == Some(V3),
        };
        if v3 {
            return V3;
        }
        let v2 = match *self {
            Request::Fetch { group, .. }
            | Request::Ack { group, .. }
            | Request::Nack { group, .. }
            | Request::Touch { group, .. }
            | Request::Redrive { group, .. } => !group.is_empty(),
            Request::Produce { batch, .. } => batch.messages().any(|(props, _)| !props.is_empty()),
            _ => false,
        };
        let by_op = match *self {
            Request::Produce { flags, .. } if flags != 0 => SINCE_PRODUCE_FLAGS,
            _ => op::since(self.op()).unwrap_or(1),
        };
        if v2 { by_op.max(2) } else { by_op }
    }
}

/// A frame: a request and the id its reply will echo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub request_id: u32,
    pub request: Request<'a>,
}

/// What the decoder found at the start of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<T> {
    /// A whole frame, and how many bytes it took.
    Frame(T, usize),
    /// The buffer holds a prefix of a valid frame; read more.
    NeedMore,
}

/// What to do with the input after a decode error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// Discard this many bytes (the whole bad frame, which may not have
    /// arrived yet) and go on with the next frame.
    Bytes(usize),
    /// The frame boundary is lost: reply, then close the connection.
    Close,
}

/// A frame the broker cannot serve, with what the reply should say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    pub code: ErrorCode,
    /// The op and request id of the bad frame, for the error reply (0 when
    /// the header itself was unreadable).
    pub op: u8,
    pub request_id: u32,
    pub skip: Skip,
    pub message: String,
}

/// A cursor over a body. Every read checks the length first.
struct Rd<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Rd<'a> {
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.bytes(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.bytes(2).map(LittleEndian::read_u16)
    }
    fn u32(&mut self) -> Option<u32> {
        self.bytes(4).map(LittleEndian::read_u32)
    }
    fn u64(&mut self) -> Option<u64> {
        self.bytes(8).map(LittleEndian::read_u64)
    }
    fn done(&self) -> bool {
        self.pos == self.buf.len()
    }
}

/// Why a body failed to parse, before it becomes a DecodeError.
struct BodyError(ErrorCode, String);

fn malformed(what: &str) -> BodyError {
    BodyError(ErrorCode::Malformed, what.to_string())
}

/// What a dead-letter topic's name adds to its topic's name (part of the
/// protocol: a client fetches from `<topic>.dlq`).
pub const DEAD_LETTER_SUFFIX: &str = ".dlq";

/// Checks a topic name: 1..=max bytes (max + 4 for a `.dlq` name) of
/// `[A-Za-z0-9._-]`. Shared by the decoder and the broker.
pub fn check_topic_name(name: &[u8], name_bytes_max: u32) -> Result<&str, String> {
    let max = name_bytes_max as usize + if name.ends_with(DEAD_LETTER_SUFFIX.as_bytes()) { 4 } else { 0 };
    if name.is_empty() {
        return Err("topic name is empty".into());
    }
    check_name_bytes("topic", name, max)
}

/// Checks the length and alphabet (`[A-Za-z0-9._-]`) of a topic or group
/// name, `what`.
fn check_name_bytes<'a>(what: &str, name: &'a [u8], max: usize) -> Result<&'a str, String> {
    if name.len() > max {
        return Err(format!("{what} name is {} bytes, more than {what}_name_bytes_max ({max})", name.len()));
    }
    if let Some(&b) = name.iter().find(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))) {
        return Err(format!("{what} name has byte 0x{b:02x}; allowed are A-Z a-z 0-9 . _ -"));
    }
    // Every byte is ASCII, so this cannot fail; the Err arm is unreachable.
    std::str::from_utf8(name).map_err(|_| format!("{what} name is not UTF-8"))
}

fn topic<'a>(rd: &mut Rd<'a>, limits: &DecodeLimits, allow_empty: bool) -> Result<&'a str, BodyError> {
    let len = rd.u16().ok_or_else(|| malformed("topic length missing"))?;
    let name = rd.bytes(len as usize).ok_or_else(|| malformed("topic name runs past the frame"))?;
    if allow_empty && name.is_empty() {
        return Ok("");
    }
    check_topic_name(name, limits.topic_name_bytes_max).map_err(|e| BodyError(ErrorCode::BadTopic, e))
}

fn ids<'a>(rd: &mut Rd<'a>, limits: &DecodeLimits) -> Result<Ids<'a>, BodyError> {
    let count = rd.u32().ok_or_else(|| malformed("id count missing"))?;
    if count == 0 || count > limits.batch_messages_max {
        return Err(BodyError(
            ErrorCode::BatchTooLarge,
            format!("{count} ids; a frame carries 1 to batch_messages_max ({})", limits.batch_messages_max),
        ));
    }
    let bytes = rd.bytes(count as usize * 8).ok_or_else(|| malformed("ids run past the frame"))?;
    Ok(Ids { bytes })
}

fn batch<'a>(rd: &mut Rd<'a>, limits: &DecodeLimits, version: u16) -> Result<Batch<'a>, BodyError> {
    let count = rd.u32().ok_or_else(|| malformed("message count missing"))?;
    if count == 0 || count > limits.batch_messages_max {
        return Err(BodyError(
            ErrorCode::BatchTooLarge,
            format!("{count} messages; a batch carries 1 to batch_messages_max ({})", limits.batch_messages_max),
        ));
    }
    let start = rd.pos;
    let with_props = version >= 2;
    for i in 0..count {
        let props_len = if with_props { message_props(rd, limits, version)? } else { 0 };
        let len = rd.u32().ok_or_else(|| malformed("message length missing"))?;
        if u64::from(len) + props_len as u64 > u64::from(limits.message_bytes_max) {
            let what = if with_props { "bytes of properties and payload" } else { "bytes" };
            return Err(BodyError(
                ErrorCode::MessageTooLarge,
                format!(
                    "message {i} is {} {what}, more than message_bytes_max ({})",
                    u64::from(len) + props_len as u64,
                    limits.message_bytes_max
                ),
            ));
        }
        rd.bytes(len as usize).ok_or_else(|| malformed("message runs past the frame"))?;
    }
    Ok(Batch { count, bytes: &rd.buf[start..rd.pos], with_props })
}

/// Reads and validates a PRODUCE message's properties (version 2); returns
/// their length.
fn message_props(rd: &mut Rd<'_>, limits: &DecodeLimits, version: u16) -> Result<usize, BodyError> {
    let len = rd.u16().ok_or_else(|| malformed("properties length missing"))? as usize;
    if len > limits.props_bytes_max as usize {
        let max = limits.props_bytes_max;
        return Err(BodyError(
            ErrorCode::BadArgument,
            format!("properties are {len} bytes, more than props_bytes_max ({max})"),
        ));
    }
    let bytes = rd.bytes(len).ok_or_else(|| malformed("properties run past the frame"))?;
    Props::parse(bytes, version, &limits.props()).map_err(|e| BodyError(e.code, e.message))?;
    Ok(len)
}

/// The group a consumer-side frame names: a string after the topic from
/// version 2 on; "" (the default group) in version 1.
fn group_of<'a>(rd: &mut Rd<'a>, limits: &DecodeLimits, version: u16) -> Result<&'a str, BodyError> {
    if version >= 2 { group::group(rd, limits) } else { Ok("") }
}

fn parse_body<'a>(op: u8, rd: &mut Rd<'a>, limits: &DecodeLimits, version: u16) -> Result<Request<'a>, BodyError> {
    let short = || malformed("body too short");
    let req = match op {
        op::HELLO => {
            let min_version = rd.u16().ok_or_else(short)?;
            let max_version = rd.u16().ok_or_else(short)?;
            let len = rd.u16().ok_or_else(short)?;
            let token = rd.bytes(len as usize).ok_or_else(|| malformed("token runs past the frame"))?;
            Request::Hello { min_version, max_version, token }
        }
        op::PING => Request::Ping,
        op::PRODUCE => {
            let topic = topic(rd, limits, false)?;
            let flags = if version >= SINCE_PRODUCE_FLAGS { rd.u8().ok_or_else(short)? } else { 0 };
            if flags & !PRODUCE_FLAGS_KNOWN != 0 {
                return Err(malformed("unknown PRODUCE flag"));
            }
            Request::Produce { topic, flags, batch: batch(rd, limits, version)? }
        }
        op::FETCH => Request::Fetch {
            topic: topic(rd, limits, false)?,
            group: group_of(rd, limits, version)?,
            max_messages: rd.u32().ok_or_else(short)?,
            max_bytes: rd.u32().ok_or_else(short)?,
            wait_ms: rd.u32().ok_or_else(short)?,
            ack_timeout_ms: rd.u32().ok_or_else(short)?,
        },
        op::ACK => {
            let (topic, group) = (topic(rd, limits, false)?, group_of(rd, limits, version)?);
            Request::Ack { topic, group, ids: ids(rd, limits)? }
        }
        op::NACK => parse_nack(rd, limits, version)?,
        op::TOUCH => {
            let (topic, group) = (topic(rd, limits, false)?, group_of(rd, limits, version)?);
            let ack_timeout_ms = rd.u32().ok_or_else(short)?;
            Request::Touch { topic, group, ack_timeout_ms, ids: ids(rd, limits)? }
        }
        op::STATS => Request::Stats { topic: topic(rd, limits, true)? },
        op::CREATE_TOPIC => parse_create_topic(rd, limits, version)?,
        op::DELETE_TOPIC => Request::DeleteTopic { topic: topic(rd, limits, false)? },
        op::PURGE_TOPIC => Request::PurgeTopic { topic: topic(rd, limits, false)? },
        op::LIST_TOPICS => Request::ListTopics,
        op::REDRIVE => {
            let (topic, group) = (topic(rd, limits, false)?, group_of(rd, limits, version)?);
            Request::Redrive { topic, group, max_messages: rd.u32().ok_or_else(short)? }
        }
        op::CREATE_GROUP..=op::RESET_GROUP => group::parse_group_op(op, rd, limits, version)?,
        op::SUBSCRIBE | op::CREDIT | op::UNSUBSCRIBE => push::parse_push_op(op, rd, limits)?,
        op::CANCEL | op::RESCHEDULE => schedule::parse_schedule_op(op, rd, limits)?,
        op::LOOKUP | op::PEEK => inspect::parse_inspect_op(op, rd, limits)?,
        op::ACK_PRODUCE => ack_produce::parse(rd, limits, version)?,
        other => return Err(BodyError(ErrorCode::UnknownOp, format!("unknown opcode 0x{other:02x}"))),
    };
    if !rd.done() {
        return Err(malformed("bytes left over after the body"));
    }
    Ok(req)
}

/// CREATE_TOPIC's body: the topic, its version-1 settings and (version 4)
/// the settings list, which runs to the end of the body.
fn parse_create_topic<'a>(rd: &mut Rd<'a>, limits: &DecodeLimits, version: u16) -> Result<Request<'a>, BodyError> {
    let short = || malformed("body too short");
    let topic = topic(rd, limits, false)?;
    let ack_timeout_ms = rd.u32().ok_or_else(short)?;
    let max_deliveries = rd.u16().ok_or_else(short)?;
    let options = if version >= V4 {
        topic_settings::parse(rd.bytes(rd.buf.len() - rd.pos).unwrap_or(&[]))?
    } else {
        TopicOptions::default()
    };
    Ok(Request::CreateTopic { topic, settings: TopicSettings { ack_timeout_ms, max_deliveries }, options })
}

/// Refuses an op the session's version lacks, before its body is read.
fn check_op_version(op: u8, version: u16) -> Result<(), BodyError> {
    match op::since(op) {
        None => Err(BodyError(ErrorCode::UnknownOp, format!("unknown opcode 0x{op:02x}"))),
        Some(v) if v > version.max(1) => Err(BodyError(
            ErrorCode::UnknownOp,
            format!("opcode 0x{op:02x} is of protocol version {v}; this connection speaks version {}", version.max(1)),
        )),
        Some(_) => Ok(()),
    }
}

/// The fields of a frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Bytes in the whole frame, header included.
    pub frame_bytes: usize,
    pub op: u8,
    pub status: u8,
    pub flags: u16,
    pub request_id: u32,
}

/// A length field below the 8-byte minimum: the frame boundary is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundaryLost;

/// Reads a header, if 12 bytes are there. `Err` when `len` is below the
/// minimum: the boundary is lost.
pub fn read_header(buf: &[u8]) -> Result<Option<Header>, BoundaryLost> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = LittleEndian::read_u32(buf);
    if (len as usize) < HEADER_BYTES - 4 {
        return Err(BoundaryLost);
    }
    if buf.len() < HEADER_BYTES {
        return Ok(None);
    }
    Ok(Some(Header {
        frame_bytes: len as usize + 4,
        op: buf[4],
        status: buf[5],
        flags: LittleEndian::read_u16(&buf[6..]),
        request_id: LittleEndian::read_u32(&buf[8..]),
    }))
}

/// Decodes the request at the start of `buf`, in the layouts of the
/// session's negotiated `version` (before HELLO, 0 or 1: version 1's; the
/// HELLO request is the same in every version).
pub fn decode_request<'a>(
    buf: &'a [u8],
    limits: &DecodeLimits,
    version: u16,
) -> Result<Decoded<Frame<'a>>, DecodeError> {
    let header = match read_header(buf) {
        Ok(Some(h)) => h,
        Ok(None) => return Ok(Decoded::NeedMore),
        Err(BoundaryLost) => {
            return Err(DecodeError {
                code: ErrorCode::Malformed,
                op: 0,
                request_id: 0,
                skip: Skip::Close,
                message: "frame length below the 8-byte minimum; frame boundary lost".into(),
            });
        }
    };
    let err =
        |code, skip, message: String| DecodeError { code, op: header.op, request_id: header.request_id, skip, message };
    if header.frame_bytes > limits.frame_bytes_max as usize {
        return Err(err(
            ErrorCode::FrameTooLarge,
            Skip::Bytes(header.frame_bytes),
            format!("frame is {} bytes, more than frame_bytes_max ({})", header.frame_bytes, limits.frame_bytes_max),
        ));
    }
    if buf.len() < header.frame_bytes {
        return Ok(Decoded::NeedMore);
    }
    let skip = Skip::Bytes(header.frame_bytes);
    if header.op & REPLY_BIT != 0 || header.status != 0 || header.flags != 0 {
        return Err(err(
            ErrorCode::Malformed,
            skip,
            "a request must have the reply bit, status and flags all zero".into(),
        ));
    }
    let mut rd = Rd { buf: &buf[HEADER_BYTES..header.frame_bytes], pos: 0 };
    let parsed = check_op_version(header.op, version).and_then(|()| parse_body(header.op, &mut rd, limits, version));
    match parsed {
        Ok(request) => Ok(Decoded::Frame(Frame { request_id: header.request_id, request }, header.frame_bytes)),
        Err(BodyError(code, message)) => Err(err(code, skip, message)),
    }
}

// ---------------------------------------------------------------------------
// Encoding. Every encoder appends one whole frame to `out`.
// ---------------------------------------------------------------------------

/// Starts a frame; returns its start, for `end_frame`.
pub fn begin_frame(out: &mut Vec<u8>, op: u8, status: u8, request_id: u32) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, op, status, 0, 0]);
    out.extend_from_slice(&request_id.to_le_bytes());
    start
}

/// Writes the length of the frame that began at `start`.
pub fn end_frame(out: &mut [u8], start: usize) {
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

pub fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
/// A u16-length-prefixed string (topic names, error text). Longer input is
/// cut at 65535 bytes.
pub fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    let s = &s[..utf8_prefix(s, u16::MAX as usize)];
    put_u16(out, s.len() as u16);
    out.extend_from_slice(s);
}

/// The length of the longest prefix of `s` of at most `max` bytes that does
/// not end inside a UTF-8 character.
fn utf8_prefix(s: &[u8], max: usize) -> usize {
    if s.len() <= max {
        return s.len();
    }
    let mut n = max;
    // Continuation bytes are 0b10xx_xxxx: back up to a character start.
    while n > 0 && s[n] & 0xC0 == 0x80 {
        n -= 1;
    }
    n
}

fn put_ids(out: &mut Vec<u8>, ids: &[u64]) {
    put_u32(out, ids.len() as u32);
    for id in ids {
        put_u64(out, *id);
    }
}

/// Encodes a request from owned parts (the client side; also the tests),
/// in the layouts of `version`. A request that version cannot carry
/// (`Request::version_needed`), or a batch built for the other layout, is a
/// programmer error: the client checks before it sends.
pub fn encode_request(out: &mut Vec<u8>, request_id: u32, req: &Request<'_>, version: u16) {
    let v2 = version >= 2;
    let needed = req.version_needed();
    assert!(needed <= version.max(1), "{req:?} needs protocol version {needed}, not {version}");
    let start = begin_frame(out, req.op(), 0, request_id);
    let topic_group = |out: &mut Vec<u8>, topic: &str, group: &str| {
        put_str(out, topic.as_bytes());
        if v2 {
            put_str(out, group.as_bytes());
        }
    };
    match *req {
        Request::Hello { min_version, max_version, token } => {
            put_u16(out, min_version);
            put_u16(out, max_version);
            put_str(out, token);
        }
        Request::Ping | Request::ListTopics => {}
        Request::Produce { topic, flags, batch } => {
            assert_eq!(batch.with_props, v2, "a batch built for the other version's layout");
            put_str(out, topic.as_bytes());
            // Version 3 has a flags byte after the topic.
            out.extend((version >= SINCE_PRODUCE_FLAGS).then_some(flags));
            put_u32(out, batch.count);
            out.extend_from_slice(batch.bytes);
        }
        Request::Fetch { topic, group, max_messages, max_bytes, wait_ms, ack_timeout_ms } => {
            topic_group(out, topic, group);
            for v in [max_messages, max_bytes, wait_ms, ack_timeout_ms] {
                put_u32(out, v);
            }
        }
        Request::Ack { topic, group, ids } => {
            topic_group(out, topic, group);
            put_id_list(out, ids);
        }
        Request::Nack { topic, group, delay_ms, flags, ids, reason } => {
            topic_group(out, topic, group);
            put_nack(out, (delay_ms, flags), ids, (reason, version));
        }
        Request::Touch { topic, group, ack_timeout_ms, ids } => {
            topic_group(out, topic, group);
            put_u32(out, ack_timeout_ms);
            put_id_list(out, ids);
        }
        Request::Stats { topic } | Request::DeleteTopic { topic } | Request::PurgeTopic { topic } => {
            put_str(out, topic.as_bytes())
        }
        Request::CreateTopic { topic, settings, options } => {
            put_str(out, topic.as_bytes());
            put_u32(out, settings.ack_timeout_ms);
            put_u16(out, settings.max_deliveries);
            topic_settings::put_options(out, &options);
        }
        Request::Redrive { topic, group, max_messages } => {
            topic_group(out, topic, group);
            put_u32(out, max_messages);
        }
        Request::CreateGroup { .. }
        | Request::DeleteGroup { .. }
        | Request::ListGroups { .. }
        | Request::ResetGroup { .. } => group::encode_group_op(out, req),
        Request::Subscribe { .. }
        | Request::Credit { .. }
        | Request::Unsubscribe { .. }
        | Request::AckProduce { .. } => push::encode_push_op(out, req),
        Request::Cancel { .. } | Request::Reschedule { .. } => schedule::encode_schedule_op(out, req),
        Request::Lookup { .. } | Request::Peek { .. } => inspect::encode_inspect_op(out, req),
    }
    end_frame(out, start);
}

/// Appends an id list: its count, then the ids.
fn put_id_list(out: &mut Vec<u8>, ids: Ids<'_>) {
    put_u32(out, ids.len() as u32);
    out.extend_from_slice(ids.bytes);
}

/// Appends payloads as a PRODUCE batch body (for `Batch::bytes`).
pub fn encode_batch<P: AsRef<[u8]>>(out: &mut Vec<u8>, payloads: &[P]) {
    for p in payloads {
        put_u32(out, p.as_ref().len() as u32);
        out.extend_from_slice(p.as_ref());
    }
}

/// Appends one message of a version-2 PRODUCE batch body (for
/// `Batch::bytes` with `with_props`): its properties, then its payload.
pub fn encode_message(out: &mut Vec<u8>, props: &Props<'_>, payload: &[u8]) {
    props::put_props(out, props);
    put_u32(out, payload.len() as u32);
    out.extend_from_slice(payload);
}

/// Appends ids as an `Ids` body.
pub fn encode_ids(out: &mut Vec<u8>, ids: &[u64]) {
    for id in ids {
        put_u64(out, *id);
    }
}

/// The map epoch of a broker that is not sharded (the HELLO reply's
/// `map_epoch`, version 2).
pub const MAP_EPOCH_UNSHARDED: u64 = 0;

/// The body of a NACK: flag 0x02 (version 4) adds a reason after the ids.
fn parse_nack<'a>(rd: &mut Rd<'a>, limits: &DecodeLimits, version: u16) -> Result<Request<'a>, BodyError> {
    let (topic, group) = (topic(rd, limits, false)?, group_of(rd, limits, version)?);
    let delay_ms = rd.u32().ok_or_else(|| malformed("body too short"))?;
    let flags = rd.u8().ok_or_else(|| malformed("body too short"))?;
    let known = NACK_FLAG_DEAD_LETTER | if version >= SINCE_NACK_REASON { NACK_FLAG_REASON } else { 0 };
    if flags & !known != 0 {
        return Err(malformed("unknown NACK flag"));
    }
    let ids = ids(rd, limits)?;
    let reason = if flags & NACK_FLAG_REASON != 0 { nack_reason(rd)? } else { "" };
    Ok(Request::Nack { topic, group, delay_ms, flags, ids, reason })
}

/// Appends a NACK's body after its topic and group: its delay, flags and
/// ids, then its reason when its flags say one follows (version 4).
fn put_nack(out: &mut Vec<u8>, (delay_ms, flags): (u32, u8), ids: Ids<'_>, (reason, version): (&str, u16)) {
    put_u32(out, delay_ms);
    out.push(flags);
    put_id_list(out, ids);
    if flags & NACK_FLAG_REASON != 0 && version >= SINCE_NACK_REASON {
        put_str(out, reason.as_bytes());
    }
}

/// A NACK's reason (version 4): not UTF-8 is BAD_ARGUMENT (its length is
/// the broker's to judge, `nack_reason_bytes_max`).
fn nack_reason<'a>(rd: &mut Rd<'a>) -> Result<&'a str, BodyError> {
    let len = rd.u16().ok_or_else(|| malformed("NACK reason length missing"))?;
    let bytes = rd.bytes(len as usize).ok_or_else(|| malformed("NACK reason runs past the frame"))?;
    std::str::from_utf8(bytes).map_err(|_| BodyError(ErrorCode::BadArgument, "NACK reason is not UTF-8".into()))
}

fn str_field<'a>(rd: &mut Rd<'a>) -> Option<&'a str> {
    let len = rd.u16()?;
    std::str::from_utf8(rd.bytes(len as usize)?).ok()
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
#[cfg(test)]
mod v2_tests;
