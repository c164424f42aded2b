//! Replies: the broker's encoders of the replies shared by many ops, and
//! the client's decoder of every reply's body by its op, as
//! docs/protocol.md lays them out.

use super::*;

/// The op of the reply to a frame whose op is `op`: `op` with the reply
/// bit, except that only a pushed frame has PUSH's op with the reply bit
/// (0xEF): a client tells a pushed frame apart by its op alone, so the
/// reply to a frame of op 0x6F or 0xEF (which no request has) takes
/// `op::IN_PLACE_OF_PUSH` with the reply bit, 0xFF.
pub fn reply_op(op: u8) -> u8 {
    let op = op | REPLY_BIT;
    if op == op::PUSH | REPLY_BIT { op::IN_PLACE_OF_PUSH | REPLY_BIT } else { op }
}

/// Appends an error reply. Its op is `reply_op(op)`: an error reply may
/// echo whatever op a frame had (UNKNOWN_OP, HELLO_REQUIRED,
/// FRAME_TOO_LARGE, MALFORMED), and none may look like a pushed frame.
pub fn encode_error(out: &mut Vec<u8>, op: u8, request_id: u32, code: ErrorCode, message: &str) {
    let start = begin_frame(out, reply_op(op), code as u8, request_id);
    put_str(out, message.as_bytes());
    end_frame(out, start);
}

/// Appends the reply to HELLO: the chosen version and the limits; from
/// version 2 on, more of them and the shard map's epoch; from version 6
/// on, every limit of `DecodeLimits`.
pub fn encode_hello_reply(out: &mut Vec<u8>, request_id: u32, version: u16, limits: &DecodeLimits, map_epoch: u64) {
    let start = begin_frame(out, op::HELLO | REPLY_BIT, 0, request_id);
    put_u16(out, version);
    put_u32(out, limits.frame_bytes_max);
    put_u32(out, limits.message_bytes_max);
    put_u32(out, limits.batch_messages_max);
    put_u32(out, limits.topic_name_bytes_max);
    if version >= 2 {
        put_u32(out, limits.output_bytes_max);
        put_u32(out, limits.fetch_bytes_max);
        put_u32(out, limits.idle_timeout_ms);
        put_u64(out, map_epoch);
        put_u32(out, limits.group_name_bytes_max);
        put_u32(out, limits.tags_per_message_max);
        put_u32(out, limits.tag_bytes_max);
        put_u32(out, limits.props_bytes_max);
        put_u32(out, limits.filter_bytes_max);
    }
    if version >= SINCE_HELLO_FEATURE_LIMITS {
        put_u32(out, limits.subscription_credit_max);
        put_u32(out, limits.key_bytes_max);
        put_u32(out, limits.dedup_id_bytes_max);
        put_u32(out, limits.nack_reason_bytes_max);
        put_u32(out, limits.lookup_results_max);
    }
    end_frame(out, start);
}

/// Appends a reply with an empty body (PING).
pub fn encode_empty_reply(out: &mut Vec<u8>, op: u8, request_id: u32) {
    let start = begin_frame(out, op | REPLY_BIT, 0, request_id);
    end_frame(out, start);
}

/// Appends the reply to PRODUCE: ids `first_id .. first_id + count`.
pub fn encode_produce_reply(out: &mut Vec<u8>, request_id: u32, first_id: u64, count: u32) {
    encode_dedup_produce_reply(out, request_id, first_id, count, &[]);
}

/// Appends the reply to a PRODUCE some of whose messages were duplicates
/// (version 4): `count` messages stored with ids from `first_id`, then,
/// if there are any, the duplicates as (index in the batch, the original
/// message's id), in batch order. Without duplicates it is version 1's
/// reply, byte for byte.
pub fn encode_dedup_produce_reply(
    out: &mut Vec<u8>,
    request_id: u32,
    first_id: u64,
    count: u32,
    duplicates: &[(u32, u64)],
) {
    let start = begin_frame(out, op::PRODUCE | REPLY_BIT, 0, request_id);
    put_u64(out, first_id);
    put_u32(out, count);
    if !duplicates.is_empty() {
        out[start + 6..start + 8].copy_from_slice(&REPLY_FLAG_DUPLICATES.to_le_bytes());
        put_u32(out, duplicates.len() as u32);
        for &(index, id) in duplicates {
            put_u32(out, index);
            put_u64(out, id);
        }
    }
    end_frame(out, start);
}

/// Appends the reply to ACK, NACK or TOUCH: how many ids took effect and
/// which did not.
pub fn encode_ids_reply(out: &mut Vec<u8>, op: u8, request_id: u32, done: u32, failed: &[u64]) {
    let start = begin_frame(out, op | REPLY_BIT, 0, request_id);
    put_u32(out, done);
    put_ids(out, failed);
    end_frame(out, start);
}

/// Appends a reply whose body is one u64 (DELETE_TOPIC, PURGE_TOPIC,
/// REDRIVE, DELETE_GROUP, RESET_GROUP, UNSUBSCRIBE) or one u8
/// (CREATE_TOPIC).
pub fn encode_u64_reply(out: &mut Vec<u8>, op: u8, request_id: u32, value: u64) {
    let start = begin_frame(out, op | REPLY_BIT, 0, request_id);
    if op == op::CREATE_TOPIC {
        out.push(u8::from(value != 0));
    } else {
        put_u64(out, value);
    }
    end_frame(out, start);
}

/// Builds a STATS reply: a broker section and a section per topic, each a
/// list of (name, u64) pairs so clients can show keys they do not know.
pub struct StatsWriter {
    start: usize,
    at: usize,
    n: u32,
}

impl StatsWriter {
    pub fn begin(out: &mut Vec<u8>, request_id: u32) -> StatsWriter {
        let start = begin_frame(out, op::STATS | REPLY_BIT, 0, request_id);
        StatsWriter { start, at: 0, n: 0 }
    }
    /// Starts a section (`name` empty for the broker section).
    pub fn section(&mut self, out: &mut Vec<u8>, name: &str) {
        put_str(out, name.as_bytes());
        self.at = out.len();
        self.n = 0;
        put_u16(out, 0);
    }
    pub fn kv(&mut self, out: &mut Vec<u8>, key: &str, value: u64) {
        assert!(self.at >= self.start + HEADER_BYTES, "StatsWriter::kv before section");
        assert!(self.n < u32::from(u16::MAX), "too many keys in one STATS section");
        let key = &key.as_bytes()[..utf8_prefix(key.as_bytes(), 255)];
        out.push(key.len() as u8);
        out.extend_from_slice(key);
        put_u64(out, value);
        self.n += 1;
        let n = self.n as u16;
        out[self.at..self.at + 2].copy_from_slice(&n.to_le_bytes());
    }
    pub fn finish(self, out: &mut [u8]) {
        end_frame(out, self.start);
    }
}

/// Appends a LIST_TOPICS reply.
pub fn encode_topics_reply(out: &mut Vec<u8>, request_id: u32, topics: &[(&str, TopicSettings)]) {
    let start = begin_frame(out, op::LIST_TOPICS | REPLY_BIT, 0, request_id);
    put_u32(out, topics.len() as u32);
    for (name, s) in topics {
        put_str(out, name.as_bytes());
        put_u32(out, s.ack_timeout_ms);
        put_u16(out, s.max_deliveries);
    }
    end_frame(out, start);
}

/// A decoded reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    Hello {
        version: u16,
        limits: DecodeLimits,
        /// The epoch of the shard map (version 2); 0 = not sharded.
        map_epoch: u64,
    },
    Pong,
    Produced {
        first_id: u64,
        count: u32,
    },
    /// A PRODUCE reply that names duplicates (version 4): `count` messages
    /// stored with ids from `first_id` (0 when none was), and the others,
    /// as (index in the batch, the id of the message first produced with
    /// its dedup id), in batch order.
    Deduplicated {
        first_id: u64,
        count: u32,
        duplicates: Vec<(u32, u64)>,
    },
    Messages {
        topic: &'a str,
        messages: Vec<Message<'a>>,
    },
    /// A pushed frame (version 3): a subscription's messages; the frame's
    /// request id is the subscription's id. It answers no request.
    Pushed {
        topic: &'a str,
        messages: Vec<Message<'a>>,
    },
    /// SUBSCRIBE: the subscription's id.
    Subscribed {
        subscription: u32,
    },
    /// CREDIT: the group's messages in flight to the connection.
    Credited {
        inflight: u32,
    },
    /// ACK_PRODUCE: the ids acked, those not in flight to the connection
    /// (then nothing was done), and each output's first id and count.
    AckProduced {
        done: u32,
        failed: Vec<u64>,
        outputs: Vec<(u64, u32)>,
    },
    /// ACK, NACK and TOUCH.
    Ids {
        done: u32,
        failed: Vec<u64>,
    },
    Stats(Vec<(&'a str, Vec<(&'a str, u64)>)>),
    Created {
        created: bool,
    },
    /// DELETE_TOPIC, PURGE_TOPIC, REDRIVE, DELETE_GROUP, UNSUBSCRIBE: how
    /// many messages.
    Count(u64),
    Topics(Vec<(&'a str, TopicSettings)>),
    /// CREATE_GROUP: whether the group is new, and its cursor.
    GroupCreated {
        created: bool,
        cursor: u64,
    },
    Groups(Vec<GroupInfo<'a>>),
    /// RESET_GROUP: the group's new cursor.
    Cursor(u64),
    /// CANCEL: the time the message was due; RESCHEDULE: its new time (ms
    /// since the Unix epoch).
    Due(u64),
    /// LOOKUP and PEEK: each message with its state in every group.
    Inspected(Vec<inspect::Inspected<'a>>),
    Error {
        code: u8,
        message: &'a str,
    },
}

/// A reply frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplyFrame<'a> {
    pub op: u8,
    pub request_id: u32,
    pub reply: Reply<'a>,
}

/// Reads a HELLO reply's body (see `encode_hello_reply`).
fn parse_hello_reply<'a>(rd: &mut Rd<'_>) -> Option<Reply<'a>> {
    let version = rd.u16()?;
    let mut limits = DecodeLimits {
        frame_bytes_max: rd.u32()?,
        message_bytes_max: rd.u32()?,
        batch_messages_max: rd.u32()?,
        topic_name_bytes_max: rd.u32()?,
        ..DecodeLimits::CLIENT
    }
    .reported(1);
    let mut map_epoch = 0;
    if version >= 2 {
        limits.output_bytes_max = rd.u32()?;
        limits.fetch_bytes_max = rd.u32()?;
        limits.idle_timeout_ms = rd.u32()?;
        map_epoch = rd.u64()?;
        limits.group_name_bytes_max = rd.u32()?;
        limits.tags_per_message_max = rd.u32()?;
        limits.tag_bytes_max = rd.u32()?;
        limits.props_bytes_max = rd.u32()?;
        limits.filter_bytes_max = rd.u32()?;
    }
    if version >= SINCE_HELLO_FEATURE_LIMITS {
        limits.subscription_credit_max = rd.u32()?;
        limits.key_bytes_max = rd.u32()?;
        limits.dedup_id_bytes_max = rd.u32()?;
        limits.nack_reason_bytes_max = rd.u32()?;
        limits.lookup_results_max = rd.u32()?;
    }
    Some(Reply::Hello { version, limits, map_epoch })
}

/// A PRODUCE reply: version 1's fields, then the duplicates if the
/// header's flags announce them (version 4).
fn parse_produce_reply<'a>(rd: &mut Rd<'_>, flags: u16) -> Option<Reply<'a>> {
    let (first_id, count) = (rd.u64()?, rd.u32()?);
    if flags & REPLY_FLAG_DUPLICATES == 0 {
        return Some(Reply::Produced { first_id, count });
    }
    let n = rd.u32()? as usize;
    if n == 0 {
        // The broker never sets the flag without a duplicate; one that
        // did would mean the plain reply, and reads as it.
        return Some(Reply::Produced { first_id, count });
    }
    let mut duplicates = Vec::with_capacity(n.min(rd.buf.len() / 12));
    for _ in 0..n {
        duplicates.push((rd.u32()?, rd.u64()?));
    }
    Some(Reply::Deduplicated { first_id, count, duplicates })
}

fn parse_reply_body<'a>(op: u8, (status, flags): (u8, u16), rd: &mut Rd<'a>) -> Option<Reply<'a>> {
    if status != 0 {
        return Some(Reply::Error { code: status, message: str_field(rd)? });
    }
    let reply = match op {
        op::HELLO => parse_hello_reply(rd)?,
        op::PING => Reply::Pong,
        op::PRODUCE => parse_produce_reply(rd, flags)?,
        op::FETCH => {
            let (topic, messages) = parse_messages(rd)?;
            Reply::Messages { topic, messages }
        }
        op::PUSH => {
            let (topic, messages) = parse_messages(rd)?;
            Reply::Pushed { topic, messages }
        }
        op::SUBSCRIBE => Reply::Subscribed { subscription: rd.u32()? },
        op::CREDIT => Reply::Credited { inflight: rd.u32()? },
        op::ACK_PRODUCE => ack_produce::parse_reply(rd)?,
        op::ACK | op::NACK | op::TOUCH => {
            let done = rd.u32()?;
            let n = rd.u32()? as usize;
            let ids = rd.bytes(n.checked_mul(8)?)?;
            Reply::Ids { done, failed: ids.chunks_exact(8).map(LittleEndian::read_u64).collect() }
        }
        op::STATS => {
            let mut sections = Vec::new();
            while !rd.done() {
                let name = str_field(rd)?;
                let n = rd.u16()?;
                // Each pair takes at least 9 bytes: bound by what is there.
                let mut kvs = Vec::with_capacity((n as usize).min(rd.buf.len() / 9));
                for _ in 0..n {
                    let klen = rd.u8()?;
                    let key = std::str::from_utf8(rd.bytes(klen as usize)?).ok()?;
                    kvs.push((key, rd.u64()?));
                }
                sections.push((name, kvs));
            }
            Reply::Stats(sections)
        }
        op::CREATE_TOPIC => Reply::Created { created: rd.u8()? != 0 },
        op::DELETE_TOPIC | op::PURGE_TOPIC | op::REDRIVE | op::DELETE_GROUP | op::UNSUBSCRIBE => {
            Reply::Count(rd.u64()?)
        }
        op::CREATE_GROUP => Reply::GroupCreated { created: rd.u8()? != 0, cursor: rd.u64()? },
        op::RESET_GROUP => Reply::Cursor(rd.u64()?),
        op::CANCEL | op::RESCHEDULE => Reply::Due(rd.u64()?),
        op::LOOKUP | op::PEEK => inspect::parse_inspected_reply(rd)?,
        op::LIST_GROUPS => {
            let n = rd.u32()?;
            let mut groups = Vec::with_capacity((n as usize).min(rd.buf.len() / group::GROUP_INFO_BYTES_MIN));
            for _ in 0..n {
                groups.push(group::parse_group_info(rd)?);
            }
            Reply::Groups(groups)
        }
        op::LIST_TOPICS => {
            let n = rd.u32()?;
            let mut topics = Vec::with_capacity((n as usize).min(rd.buf.len() / 8));
            for _ in 0..n {
                let name = str_field(rd)?;
                topics.push((name, TopicSettings { ack_timeout_ms: rd.u32()?, max_deliveries: rd.u16()? }));
            }
            Reply::Topics(topics)
        }
        _ => return None,
    };
    Some(reply)
}

/// Decodes the reply at the start of `buf`. `Err` carries a description of
/// what is wrong; a client should close the connection on it.
///
/// Bytes after the last field of a reply's layout are ignored, as
/// docs/protocol.md ("Replies may grow") asks of every client: a later
/// broker may append fields to a reply without a new version. A STATS
/// reply has no such end (its sections run to the end of the body); it
/// grows by keys instead.
pub fn decode_reply(buf: &[u8], frame_bytes_max: usize) -> Result<Decoded<ReplyFrame<'_>>, String> {
    let header = match read_header(buf) {
        Ok(Some(h)) => h,
        Ok(None) => return Ok(Decoded::NeedMore),
        Err(BoundaryLost) => return Err("reply length below the minimum".into()),
    };
    if header.frame_bytes > frame_bytes_max {
        return Err(format!("reply of {} bytes is over the client's limit", header.frame_bytes));
    }
    if buf.len() < header.frame_bytes {
        return Ok(Decoded::NeedMore);
    }
    if header.op & REPLY_BIT == 0 {
        return Err(format!("frame op 0x{:02x} is not a reply", header.op));
    }
    let op = header.op & !REPLY_BIT;
    let mut rd = Rd { buf: &buf[HEADER_BYTES..header.frame_bytes], pos: 0 };
    match parse_reply_body(op, (header.status, header.flags), &mut rd) {
        Some(reply) => Ok(Decoded::Frame(ReplyFrame { op, request_id: header.request_id, reply }, header.frame_bytes)),
        None => Err(format!("malformed reply to op 0x{op:02x}")),
    }
}
