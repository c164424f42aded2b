//! Consumer groups on the wire (protocol version 2): group names, a group's
//! settings and start position, and the bodies of CREATE_GROUP,
//! DELETE_GROUP, LIST_GROUPS and RESET_GROUP with their replies.
//! docs/protocol.md ("Consumer groups (version 2)", and the ops under
//! "Requests and replies") is the contract.
//!
//! A group is named by a string after the topic; the empty name is the
//! default group, the one version-1 frames use.

use super::{BodyError, ErrorCode, Rd, Request, malformed, put_str, put_u16, put_u32, put_u64, str_field, topic};
use super::{DecodeLimits, REPLY_BIT, begin_frame, check_name_bytes, end_frame, op};
use crate::queue::RetryPolicy;

/// Bit in CREATE_GROUP's and LIST_GROUPS' flags: a broadcast group.
pub const GROUP_FLAG_BROADCAST: u8 = 0x01;
/// Bit in CREATE_GROUP's and LIST_GROUPS' flags (version 4): messages
/// with the same key go to the group's consumers one at a time, in order.
pub const GROUP_FLAG_ORDERED: u8 = 0x02;
/// The protocol version that adds `GROUP_FLAG_ORDERED`.
pub const SINCE_ORDERED: u16 = super::V4;
/// Bit in CREATE_GROUP's and LIST_GROUPS' flags (version 4): a retry
/// policy follows the filter (`RETRY_POLICY_WIRE_BYTES` bytes).
pub const GROUP_FLAG_RETRY: u8 = 0x04;
/// The protocol version that adds `GROUP_FLAG_RETRY`.
pub const SINCE_RETRY: u16 = super::V4;
/// Bytes of a retry policy on the wire: `initial_ms u32, cap_ms u32,
/// multiplier_pct u16, jitter_pct u8`.
pub const RETRY_POLICY_WIRE_BYTES: usize = 4 + 4 + 2 + 1;

/// The group flags a session of `version` may set.
fn group_flags_known(version: u16) -> u8 {
    if version >= SINCE_ORDERED {
        GROUP_FLAG_BROADCAST | GROUP_FLAG_ORDERED | GROUP_FLAG_RETRY
    } else {
        GROUP_FLAG_BROADCAST
    }
}

impl GroupSettings<'_> {
    /// The flags byte of CREATE_GROUP and LIST_GROUPS.
    pub fn flags(&self) -> u8 {
        (if self.broadcast { GROUP_FLAG_BROADCAST } else { 0 })
            | (if self.ordered { GROUP_FLAG_ORDERED } else { 0 })
            | (if self.retry.is_some() { GROUP_FLAG_RETRY } else { 0 })
    }
}

/// Appends a retry policy (after the filter, with `GROUP_FLAG_RETRY`).
fn put_retry(out: &mut Vec<u8>, retry: Option<RetryPolicy>) {
    if let Some(p) = retry {
        put_u32(out, p.initial_ms);
        put_u32(out, p.cap_ms);
        put_u16(out, p.multiplier_pct);
        out.push(p.jitter_pct);
    }
}

/// Reads a retry policy if `flags` says one follows.
fn retry(rd: &mut Rd<'_>, flags: u8) -> Option<Option<RetryPolicy>> {
    if flags & GROUP_FLAG_RETRY == 0 {
        return Some(None);
    }
    let (initial_ms, cap_ms, multiplier_pct, jitter_pct) = (rd.u32()?, rd.u32()?, rd.u16()?, rd.u8()?);
    Some(Some(RetryPolicy { initial_ms, multiplier_pct, cap_ms, jitter_pct }))
}

/// Where a group starts (CREATE_GROUP) or is moved to (RESET_GROUP). On the
/// wire: a kind u8 and a value u64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// The oldest message the topic still holds (kind 0, value 0).
    Earliest,
    /// Only messages produced from now on (kind 1, value 0).
    Latest,
    /// The message with this id, or the first one after it (kind 2).
    Id(u64),
    /// The first message born at or after this wall-clock time, ms since
    /// the Unix epoch (kind 3).
    Time(u64),
}

impl Start {
    /// The kind and value fields.
    pub fn to_wire(self) -> (u8, u64) {
        match self {
            Start::Earliest => (0, 0),
            Start::Latest => (1, 0),
            Start::Id(id) => (2, id),
            Start::Time(ms) => (3, ms),
        }
    }

    /// From the kind and value fields: `None` for an unknown kind, or a
    /// value other than 0 with a kind that takes none.
    pub fn from_wire(kind: u8, value: u64) -> Option<Start> {
        Some(match (kind, value) {
            (0, 0) => Start::Earliest,
            (1, 0) => Start::Latest,
            (2, id) => Start::Id(id),
            (3, ms) => Start::Time(ms),
            _ => return None,
        })
    }
}

/// A group's settings, as CREATE_GROUP sets them and LIST_GROUPS shows
/// them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupSettings<'a> {
    /// Every consumer connection of the group gets every message (else its
    /// consumers compete, each message to one of them).
    pub broadcast: bool,
    /// Ack timeout of a delivery when FETCH or TOUCH asks for 0; 0 = the
    /// topic's.
    pub ack_timeout_ms: u32,
    /// Deliveries before a message is dead-lettered; 0 = the topic's.
    pub max_deliveries: u16,
    /// The tag filter (`crate::filter::Filter` reads it); empty = `*`.
    pub filter: &'a str,
    /// Ordered by key (version 4): messages with the same key go one at
    /// a time, in order.
    pub ordered: bool,
    /// The retry policy (version 4, `GROUP_FLAG_RETRY`): how long a
    /// message waits before it is ready again after a NACK without a delay
    /// or a passed ack deadline. None: ready again at once.
    pub retry: Option<RetryPolicy>,
}

/// What LIST_GROUPS reports of a group's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// The id of the first message the group has not yet delivered.
    pub cursor: u64,
    /// Messages not yet delivered to the group (at or after its cursor,
    /// passing its filter).
    pub lag: u64,
    /// Messages delivered and not yet acknowledged, deadline not passed.
    pub inflight: u64,
    /// Messages back for redelivery (deadline passed, NACKed, or their
    /// consumer left).
    pub retry: u64,
    /// Messages NACKed with a delay, waiting for it.
    pub delayed: u64,
    /// Messages the group dead-lettered (counter).
    pub dead_lettered: u64,
    /// Age of the oldest message the group has delivered and not
    /// acknowledged, ms; 0 with none.
    pub oldest_unacked_age_ms: u64,
    /// Connections consuming from the group now.
    pub consumers: u32,
}

/// One group of a LIST_GROUPS reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupInfo<'a> {
    pub name: &'a str,
    pub settings: GroupSettings<'a>,
    pub stats: GroupStats,
}

/// Checks a group name: 0 to `name_bytes_max` bytes of `[A-Za-z0-9._-]`,
/// the topic names' alphabet; empty is the default group. Shared by the
/// decoder and the broker.
pub fn check_group_name(name: &[u8], name_bytes_max: u32) -> Result<&str, String> {
    check_name_bytes("group", name, name_bytes_max as usize)
}

/// Reads a group name (version 2): a bad one is BAD_ARGUMENT.
pub(super) fn group<'a>(rd: &mut Rd<'a>, limits: &DecodeLimits) -> Result<&'a str, BodyError> {
    let len = rd.u16().ok_or_else(|| malformed("group length missing"))?;
    let name = rd.bytes(len as usize).ok_or_else(|| malformed("group name runs past the frame"))?;
    check_group_name(name, limits.group_name_bytes_max).map_err(|e| BodyError(ErrorCode::BadArgument, e))
}

fn start<'a>(rd: &mut Rd<'a>) -> Result<Start, BodyError> {
    let kind = rd.u8().ok_or_else(|| malformed("start kind missing"))?;
    let value = rd.u64().ok_or_else(|| malformed("start value missing"))?;
    Start::from_wire(kind, value).ok_or_else(|| {
        BodyError(
            ErrorCode::BadArgument,
            format!("start kind {kind} with value {value}: kinds are 0 to 3, and 0 and 1 take value 0"),
        )
    })
}

/// Reads a filter string: one over filter_bytes_max, or not UTF-8, is
/// BAD_FILTER (its syntax is the broker's to judge: compiling allocates).
fn filter<'a>(rd: &mut Rd<'a>, limits: &DecodeLimits) -> Result<&'a str, BodyError> {
    let len = rd.u16().ok_or_else(|| malformed("filter length missing"))?;
    let bytes = rd.bytes(len as usize).ok_or_else(|| malformed("filter runs past the frame"))?;
    if len as usize > limits.filter_bytes_max as usize {
        let max = limits.filter_bytes_max;
        return Err(BodyError(
            ErrorCode::BadFilter,
            format!("filter is {len} bytes, more than filter_bytes_max ({max})"),
        ));
    }
    std::str::from_utf8(bytes).map_err(|_| BodyError(ErrorCode::BadFilter, "filter is not UTF-8".into()))
}

/// The body of a version-2 group op (`op` is one of them).
pub(super) fn parse_group_op<'a>(
    op: u8,
    rd: &mut Rd<'a>,
    limits: &DecodeLimits,
    version: u16,
) -> Result<Request<'a>, BodyError> {
    let short = || malformed("body too short");
    let topic = topic(rd, limits, false)?;
    Ok(match op {
        op::CREATE_GROUP => {
            let group = group(rd, limits)?;
            let flags = rd.u8().ok_or_else(short)?;
            if flags & !group_flags_known(version) != 0 {
                return Err(malformed("unknown CREATE_GROUP flag"));
            }
            let start = start(rd)?;
            let ack_timeout_ms = rd.u32().ok_or_else(short)?;
            let max_deliveries = rd.u16().ok_or_else(short)?;
            let filter = filter(rd, limits)?;
            let retry = retry(rd, flags).ok_or_else(|| malformed("retry policy runs past the frame"))?;
            let (broadcast, ordered) = (flags & GROUP_FLAG_BROADCAST != 0, flags & GROUP_FLAG_ORDERED != 0);
            let settings = GroupSettings { broadcast, ack_timeout_ms, max_deliveries, filter, ordered, retry };
            Request::CreateGroup { topic, group, settings, start }
        }
        op::DELETE_GROUP => Request::DeleteGroup { topic, group: group(rd, limits)? },
        op::RESET_GROUP => {
            let group = group(rd, limits)?;
            Request::ResetGroup { topic, group, start: start(rd)? }
        }
        _ => Request::ListGroups { topic },
    })
}

/// Appends the body of a version-2 group op.
pub(super) fn encode_group_op(out: &mut Vec<u8>, req: &Request<'_>) {
    match *req {
        Request::CreateGroup { topic, group, settings, start } => {
            put_str(out, topic.as_bytes());
            put_str(out, group.as_bytes());
            out.push(settings.flags());
            put_start(out, start);
            put_u32(out, settings.ack_timeout_ms);
            put_u16(out, settings.max_deliveries);
            put_str(out, settings.filter.as_bytes());
            put_retry(out, settings.retry);
        }
        Request::DeleteGroup { topic, group } => {
            put_str(out, topic.as_bytes());
            put_str(out, group.as_bytes());
        }
        Request::ListGroups { topic } => put_str(out, topic.as_bytes()),
        Request::ResetGroup { topic, group, start } => {
            put_str(out, topic.as_bytes());
            put_str(out, group.as_bytes());
            put_start(out, start);
        }
        _ => unreachable!("not a group op: {req:?}"),
    }
}

fn put_start(out: &mut Vec<u8>, start: Start) {
    let (kind, value) = start.to_wire();
    out.push(kind);
    put_u64(out, value);
}

/// Appends the reply to CREATE_GROUP: whether the group is new, and its
/// cursor.
pub fn encode_group_created_reply(out: &mut Vec<u8>, request_id: u32, created: bool, cursor: u64) {
    let start = begin_frame(out, op::CREATE_GROUP | REPLY_BIT, 0, request_id);
    out.push(u8::from(created));
    put_u64(out, cursor);
    end_frame(out, start);
}

/// Appends a LIST_GROUPS reply.
pub fn encode_groups_reply(out: &mut Vec<u8>, request_id: u32, groups: &[GroupInfo<'_>]) {
    let start = begin_frame(out, op::LIST_GROUPS | REPLY_BIT, 0, request_id);
    put_u32(out, groups.len() as u32);
    for g in groups {
        put_group_info(out, g);
    }
    end_frame(out, start);
}

/// Appends one group of a LIST_GROUPS reply.
fn put_group_info(out: &mut Vec<u8>, g: &GroupInfo<'_>) {
    put_str(out, g.name.as_bytes());
    out.push(g.settings.flags());
    put_u32(out, g.settings.ack_timeout_ms);
    put_u16(out, g.settings.max_deliveries);
    put_str(out, g.settings.filter.as_bytes());
    put_retry(out, g.settings.retry);
    let s = &g.stats;
    for v in [s.cursor, s.lag, s.inflight, s.retry, s.delayed, s.dead_lettered, s.oldest_unacked_age_ms] {
        put_u64(out, v);
    }
    put_u32(out, s.consumers);
}

/// Reads one group of a LIST_GROUPS reply.
pub(super) fn parse_group_info<'a>(rd: &mut Rd<'a>) -> Option<GroupInfo<'a>> {
    let name = str_field(rd)?;
    let flags = rd.u8()?;
    if flags & !(GROUP_FLAG_BROADCAST | GROUP_FLAG_ORDERED | GROUP_FLAG_RETRY) != 0 {
        return None;
    }
    let ack_timeout_ms = rd.u32()?;
    let max_deliveries = rd.u16()?;
    let filter = str_field(rd)?;
    let retry = retry(rd, flags)?;
    let (broadcast, ordered) = (flags & GROUP_FLAG_BROADCAST != 0, flags & GROUP_FLAG_ORDERED != 0);
    let settings = GroupSettings { broadcast, ack_timeout_ms, max_deliveries, filter, ordered, retry };
    let stats = GroupStats {
        cursor: rd.u64()?,
        lag: rd.u64()?,
        inflight: rd.u64()?,
        retry: rd.u64()?,
        delayed: rd.u64()?,
        dead_lettered: rd.u64()?,
        oldest_unacked_age_ms: rd.u64()?,
        consumers: rd.u32()?,
    };
    Some(GroupInfo { name, settings, stats })
}

/// Bytes a group of a LIST_GROUPS reply takes at least (empty name and
/// filter): to bound an allocation by what a frame can hold.
pub(super) const GROUP_INFO_BYTES_MIN: usize = 2 + 1 + 4 + 2 + 2 + 7 * 8 + 4;
