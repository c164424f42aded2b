//! Scheduled messages on the wire (protocol version 3): the bodies of
//! CANCEL and RESCHEDULE. docs/protocol.md ("Scheduled messages (version
//! 3)") is the contract; the delivery time a message is produced with is a
//! message property (`props.rs`: `PROP_DELIVER_AT`, `PROP_DELAY`).

use super::{BodyError, DecodeLimits, Rd, Request, malformed, op, put_str, put_u64, topic};

/// When a RESCHEDULE moves a message to. On the wire: a kind u8 and a
/// value u64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// At this wall-clock time, ms since the Unix epoch on the broker's
    /// clock (kind 0).
    At(u64),
    /// This many ms after the broker receives the request (kind 1).
    Delay(u64),
}

impl When {
    /// The kind and value fields.
    pub fn to_wire(self) -> (u8, u64) {
        match self {
            When::At(ms) => (0, ms),
            When::Delay(ms) => (1, ms),
        }
    }

    /// From the kind and value fields: None for an unknown kind.
    pub fn from_wire(kind: u8, value: u64) -> Option<When> {
        match kind {
            0 => Some(When::At(value)),
            1 => Some(When::Delay(value)),
            _ => None,
        }
    }

    /// The wall-clock time it names, given the time now.
    pub fn due_ms(self, now_wall_ms: u64) -> u64 {
        match self {
            When::At(ms) => ms,
            When::Delay(ms) => now_wall_ms.saturating_add(ms),
        }
    }
}

/// Reads the body of CANCEL (`topic str, id u64`) or RESCHEDULE (`topic
/// str, id u64, kind u8, value u64`).
pub(super) fn parse_schedule_op<'a>(op: u8, rd: &mut Rd<'a>, limits: &DecodeLimits) -> Result<Request<'a>, BodyError> {
    let short = || malformed("body too short");
    let topic = topic(rd, limits, false)?;
    let id = rd.u64().ok_or_else(short)?;
    if op == op::CANCEL {
        return Ok(Request::Cancel { topic, id });
    }
    let kind = rd.u8().ok_or_else(short)?;
    let value = rd.u64().ok_or_else(short)?;
    let when = When::from_wire(kind, value).ok_or_else(|| malformed("unknown RESCHEDULE kind"))?;
    Ok(Request::Reschedule { topic, id, when })
}

/// Appends the body of CANCEL or RESCHEDULE.
pub(super) fn encode_schedule_op(out: &mut Vec<u8>, req: &Request<'_>) {
    match *req {
        Request::Cancel { topic, id } => {
            put_str(out, topic.as_bytes());
            put_u64(out, id);
        }
        Request::Reschedule { topic, id, when } => {
            put_str(out, topic.as_bytes());
            put_u64(out, id);
            let (kind, value) = when.to_wire();
            out.push(kind);
            put_u64(out, value);
        }
        _ => unreachable!("not a schedule op: {req:?}"),
    }
}
