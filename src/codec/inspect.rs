//! Keys and inspection on the wire (protocol version 4): LOOKUP and PEEK,
//! and their shared reply, one entry per message with its state in every
//! group. docs/protocol.md ("Keys and inspection (version 4)") is the
//! contract; a message's key is a message property (`props.rs`:
//! `PROP_KEY`).

use super::props::{Props, PropsLimits, put_props};
use super::{
    BodyError, DeadInfo, DeadReason, DecodeLimits, ErrorCode, Rd, Reply, Request, V4, malformed, op, put_str, put_u16,
    put_u32, put_u64, str_field, topic,
};

/// Entry flag: the message is held; its fields follow.
pub const INSPECT_FLAG_HELD: u8 = 0x01;
/// Entry flag: it is a dead letter; where it came from follows.
pub const INSPECT_FLAG_DEAD: u8 = 0x02;
/// Entry flag: its payload follows its length (PEEK; LOOKUP sends none).
pub const INSPECT_FLAG_PAYLOAD: u8 = 0x04;

/// A message's state in one group, as the reply numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    /// Next in line: never delivered, or back for retry.
    Ready = 1,
    /// Delivered to `consumer`, not acknowledged, until `until_ms`.
    InFlight = 2,
    /// NACKed with a delay until `until_ms` (and, to a session of version
    /// 4, waiting for retry: `RetryWaiting`).
    Waiting = 3,
    /// Scheduled for `until_ms`.
    Scheduled = 4,
    /// Moved to the dead-letter topic by the group.
    DeadLettered = 5,
    /// The group is finished with it (acked, redriven, purged, cancelled,
    /// or before the group's start).
    Done = 6,
    /// The group's tag filter drops it.
    Filtered = 7,
    /// Version 5: waiting for retry (the group's retry policy) until
    /// `until_ms`.
    RetryWaiting = 8,
    /// Version 5: ready, but held back behind the message of its key the
    /// group has outstanding (a group ordered by key).
    BehindKey = 9,
}

impl State {
    pub fn from_u8(v: u8) -> Option<State> {
        use State::*;
        [Ready, InFlight, Waiting, Scheduled, DeadLettered, Done, Filtered, RetryWaiting, BehindKey]
            .into_iter()
            .find(|s| *s as u8 == v)
    }
    /// Its name in docs/protocol.md and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            State::Ready => "ready",
            State::InFlight => "in_flight",
            State::Waiting => "waiting",
            State::Scheduled => "scheduled",
            State::DeadLettered => "dead_lettered",
            State::Done => "done",
            State::Filtered => "filtered",
            State::RetryWaiting => "retry_waiting",
            State::BehindKey => "behind_key",
        }
    }

    /// The state a session of `version` is told: version 4 has no byte for
    /// a retry wait (it shows `Waiting`) or a wait behind a key (`Ready`).
    pub fn for_version(self, version: u16) -> State {
        match self {
            State::RetryWaiting if version < super::V5 => State::Waiting,
            State::BehindKey if version < super::V5 => State::Ready,
            s => s,
        }
    }
}

/// One group's line of an entry. Fields a state does not use are 0 or
/// empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupLine<'a> {
    /// The group ("" is the default group).
    pub name: &'a str,
    pub state: State,
    /// Deliveries so far (for a dead letter: before it was moved).
    pub deliveries: u16,
    /// In flight: the ack deadline; waiting: when it is ready again;
    /// scheduled: when it is due. Wall clock, ms since the Unix epoch.
    pub until_ms: u64,
    /// In flight: the consumer holding it; for a broadcast group's member,
    /// the member's consumer. Consumers are numbered by the broker, one
    /// per connection.
    pub consumer: u64,
    /// Dead-lettered: why (a `DeadReason`); else 0.
    pub dead_reason: u8,
    /// Dead-lettered: the reason its last NACK gave (empty: none).
    pub last_nack_reason: &'a str,
}

/// The message of an entry, when the topic holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldMessage<'a> {
    /// Broker wall clock at produce, ms since the Unix epoch.
    pub born_ms: u64,
    /// A dead letter's origin.
    pub dead: Option<DeadInfo>,
    pub props: Props<'a>,
    /// The payload's length, bytes.
    pub len: u32,
    /// The payload (PEEK), or None (LOOKUP).
    pub payload: Option<&'a [u8]>,
}

/// One message of a LOOKUP or PEEK reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspected<'a> {
    pub id: u64,
    /// None once the topic no longer holds it.
    pub message: Option<HeldMessage<'a>>,
    pub groups: Vec<GroupLine<'a>>,
}

/// Reads the body of LOOKUP (`topic str, key_len u16, key`) or PEEK
/// (`topic str, id u64`).
pub(super) fn parse_inspect_op<'a>(op: u8, rd: &mut Rd<'a>, limits: &DecodeLimits) -> Result<Request<'a>, BodyError> {
    let short = || malformed("body too short");
    let topic = topic(rd, limits, false)?;
    if op == op::PEEK {
        return Ok(Request::Peek { topic, id: rd.u64().ok_or_else(short)? });
    }
    let len = rd.u16().ok_or_else(short)?;
    let key = rd.bytes(len as usize).ok_or_else(short)?;
    if key.is_empty() || key.len() > limits.key_bytes_max as usize {
        let why = format!("a key is {} bytes; give 1 to key_bytes_max ({})", key.len(), limits.key_bytes_max);
        return Err(BodyError(ErrorCode::BadArgument, why));
    }
    Ok(Request::Lookup { topic, key })
}

/// Appends the body of LOOKUP or PEEK.
pub(super) fn encode_inspect_op(out: &mut Vec<u8>, req: &Request<'_>) {
    match *req {
        Request::Lookup { topic, key } => {
            put_str(out, topic.as_bytes());
            put_str(out, key);
        }
        Request::Peek { topic, id } => {
            put_str(out, topic.as_bytes());
            put_u64(out, id);
        }
        _ => unreachable!("not an inspection op: {req:?}"),
    }
}

/// Appends a LOOKUP or PEEK reply (`op`) of `entries`, as a session of
/// `version` reads it.
pub fn encode_inspected_reply(out: &mut Vec<u8>, (op, request_id): (u8, u32), entries: &[Inspected<'_>], version: u16) {
    let start = super::begin_frame(out, op | super::REPLY_BIT, 0, request_id);
    put_u32(out, entries.len() as u32);
    for e in entries {
        put_u64(out, e.id);
        let Some(m) = &e.message else {
            out.push(0);
            put_groups(out, &e.groups, version);
            continue;
        };
        let flags = INSPECT_FLAG_HELD
            | if m.dead.is_some() { INSPECT_FLAG_DEAD } else { 0 }
            | if m.payload.is_some() { INSPECT_FLAG_PAYLOAD } else { 0 };
        out.push(flags);
        put_u64(out, m.born_ms);
        if let Some(d) = m.dead {
            put_u64(out, d.origin_id);
            put_u16(out, d.origin_deliveries);
            out.push(d.reason as u8);
        }
        put_props(out, &m.props);
        put_u32(out, m.len);
        out.extend_from_slice(m.payload.unwrap_or_default());
        put_groups(out, &e.groups, version);
    }
    super::end_frame(out, start);
}

fn put_groups(out: &mut Vec<u8>, groups: &[GroupLine<'_>], version: u16) {
    put_u16(out, groups.len() as u16);
    for g in groups {
        put_str(out, g.name.as_bytes());
        out.push(g.state.for_version(version) as u8);
        put_u16(out, g.deliveries);
        put_u64(out, g.until_ms);
        put_u64(out, g.consumer);
        out.push(g.dead_reason);
        put_str(out, g.last_nack_reason.as_bytes());
    }
}

/// Reads a LOOKUP or PEEK reply's body.
pub(super) fn parse_inspected_reply<'a>(rd: &mut Rd<'a>) -> Option<Reply<'a>> {
    let n = rd.u32()?;
    // Each entry takes at least 11 bytes: bound by what is there.
    let mut entries = Vec::with_capacity((n as usize).min(rd.buf.len() / 11));
    for _ in 0..n {
        let id = rd.u64()?;
        let flags = rd.u8()?;
        let message = if flags & INSPECT_FLAG_HELD != 0 { Some(held(rd, flags)?) } else { None };
        let count = rd.u16()?;
        let mut groups = Vec::with_capacity((count as usize).min(rd.buf.len() / 24));
        for _ in 0..count {
            groups.push(group_line(rd)?);
        }
        entries.push(Inspected { id, message, groups });
    }
    Some(Reply::Inspected(entries))
}

fn held<'a>(rd: &mut Rd<'a>, flags: u8) -> Option<HeldMessage<'a>> {
    let born_ms = rd.u64()?;
    let dead = match flags & INSPECT_FLAG_DEAD {
        0 => None,
        _ => Some(DeadInfo {
            origin_id: rd.u64()?,
            origin_deliveries: rd.u16()?,
            reason: DeadReason::from_u8(rd.u8()?)?,
        }),
    };
    let props_len = rd.u16()?;
    let props = Props::parse(rd.bytes(props_len as usize)?, V4, &PropsLimits::ANY).ok()?;
    let len = rd.u32()?;
    let payload = match flags & INSPECT_FLAG_PAYLOAD {
        0 => None,
        _ => Some(rd.bytes(len as usize)?),
    };
    Some(HeldMessage { born_ms, dead, props, len, payload })
}

fn group_line<'a>(rd: &mut Rd<'a>) -> Option<GroupLine<'a>> {
    Some(GroupLine {
        name: str_field(rd)?,
        state: State::from_u8(rd.u8()?)?,
        deliveries: rd.u16()?,
        until_ms: rd.u64()?,
        consumer: rd.u64()?,
        dead_reason: rd.u8()?,
        last_nack_reason: str_field(rd)?,
    })
}
