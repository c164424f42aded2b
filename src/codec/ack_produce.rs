//! ACK_PRODUCE on the wire (protocol version 3): one frame that acks
//! messages of one (topic, group) and produces messages to topics, all of
//! it or none (docs/protocol.md, "Atomic consume-and-produce (version 3)").
//!
//! Request body: `topic str, group str, count u32, count x id u64,
//! outputs u16`, then per output `topic str, count u32` and its messages
//! as in a version-2 PRODUCE. Reply: `done u32, failed_count u32,
//! failed_count x id u64, outputs u16`, then per output `first_id u64,
//! count u32`.

use byteorder::{ByteOrder, LittleEndian};

use super::topic;
use super::{Batch, BodyError, DecodeLimits, ErrorCode, Ids, REPLY_BIT, Rd, Request};
use super::{batch, begin_frame, end_frame, group, ids, malformed, op, put_ids, put_str, put_u16, put_u32, put_u64};

/// The topics an ACK_PRODUCE produces to, each with its batch, as on the
/// wire. Validated by the decoder, so iterating cannot fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outputs<'a> {
    pub count: u16,
    /// The outputs as they are on the wire, exactly.
    pub bytes: &'a [u8],
}

impl<'a> Outputs<'a> {
    /// Each output's topic and batch.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, Batch<'a>)> + 'a {
        let mut rest = self.bytes;
        (0..self.count).map_while(move |_| {
            let (topic, batch, used) = output_at(rest)?;
            rest = &rest[used..];
            Some((topic, batch))
        })
    }
    /// Messages in every output.
    pub fn messages(&self) -> u64 {
        self.iter().map(|(_, b)| u64::from(b.count)).sum()
    }
}

/// The output at the start of `b` (validated), and the bytes it takes.
fn output_at(b: &[u8]) -> Option<(&str, Batch<'_>, usize)> {
    let tlen = LittleEndian::read_u16(b.get(..2)?) as usize;
    let topic = std::str::from_utf8(b.get(2..2 + tlen)?).ok()?;
    let mut pos = 2 + tlen;
    let count = LittleEndian::read_u32(b.get(pos..pos + 4)?);
    pos += 4;
    let start = pos;
    for _ in 0..count {
        pos += 2 + LittleEndian::read_u16(b.get(pos..pos + 2)?) as usize;
        pos += 4 + LittleEndian::read_u32(b.get(pos..pos + 4)?) as usize;
    }
    Some((topic, Batch { count, bytes: b.get(start..pos)?, with_props: true }, pos))
}

/// The body of ACK_PRODUCE: at most batch_messages_max messages over all
/// its outputs.
pub(super) fn parse<'a>(rd: &mut Rd<'a>, limits: &DecodeLimits, version: u16) -> Result<Request<'a>, BodyError> {
    let (t, g) = (topic(rd, limits, false)?, group::group(rd, limits)?);
    let acked = ids(rd, limits)?;
    let count = rd.u16().ok_or_else(|| malformed("outputs count missing"))?;
    let start = rd.pos;
    let mut messages = 0u64;
    for _ in 0..count {
        topic(rd, limits, false)?;
        messages += u64::from(batch(rd, limits, version)?.count);
        if messages > u64::from(limits.batch_messages_max) {
            let max = limits.batch_messages_max;
            let msg = format!(
                "{messages} messages or more in the outputs; a frame carries at most batch_messages_max ({max})"
            );
            return Err(BodyError(ErrorCode::BatchTooLarge, msg));
        }
    }
    let outputs = Outputs { count, bytes: &rd.buf[start..rd.pos] };
    Ok(Request::AckProduce { topic: t, group: g, ids: acked, outputs })
}

/// Appends the body of ACK_PRODUCE.
pub(super) fn encode(out: &mut Vec<u8>, topic: &str, group: &str, acked: Ids<'_>, outputs: Outputs<'_>) {
    put_str(out, topic.as_bytes());
    put_str(out, group.as_bytes());
    put_u32(out, acked.len() as u32);
    out.extend_from_slice(acked.bytes);
    put_u16(out, outputs.count);
    out.extend_from_slice(outputs.bytes);
}

/// Appends one output to an `Outputs` body (the client side): the topic,
/// then the batch's count and messages (`Batch::bytes`, version 2's layout).
pub fn encode_output(out: &mut Vec<u8>, topic: &str, batch: &Batch<'_>) {
    assert!(batch.with_props, "an ACK_PRODUCE output is in version 2's message layout");
    put_str(out, topic.as_bytes());
    put_u32(out, batch.count);
    out.extend_from_slice(batch.bytes);
}

/// Appends the reply to ACK_PRODUCE: how many ids were acked, the ids that
/// were not in flight to the connection (then nothing was done), and the
/// first id and count of each output.
pub fn encode_reply(out: &mut Vec<u8>, request_id: u32, done: u32, failed: &[u64], outputs: &[(u64, u32)]) {
    let start = begin_frame(out, op::ACK_PRODUCE | REPLY_BIT, 0, request_id);
    put_u32(out, done);
    put_ids(out, failed);
    put_u16(out, outputs.len() as u16);
    for &(first_id, count) in outputs {
        put_u64(out, first_id);
        put_u32(out, count);
    }
    end_frame(out, start);
}

/// Reads the reply to ACK_PRODUCE.
pub(super) fn parse_reply<'a>(rd: &mut Rd<'_>) -> Option<super::Reply<'a>> {
    let done = rd.u32()?;
    let n = rd.u32()? as usize;
    let failed = rd.bytes(n.checked_mul(8)?)?.chunks_exact(8).map(LittleEndian::read_u64).collect();
    let m = rd.u16()? as usize;
    let mut outputs = Vec::with_capacity(m.min(rd.buf.len() / 12));
    for _ in 0..m {
        outputs.push((rd.u64()?, rd.u32()?));
    }
    Some(super::Reply::AckProduced { done, failed, outputs })
}
