//! The messages inside records, written once: a message as a Produce
//! record stores it, the messages of a Produce record as they are read,
//! and an AckProduce record's outputs, whose messages have the same
//! layout (docs/log-format.md, "Produce").

use super::*;

/// A message as a Produce record stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageRecord<'a> {
    pub id: MsgId,
    /// Broker wall clock at produce, ms since the Unix epoch.
    pub born_ms: u64,
    /// Deliveries so far (0 for a new message).
    pub deliveries: u16,
    /// Present for a message in a dead-letter topic.
    pub dead: Option<DeadInfo>,
    /// Its tags and headers as produced (empty for none).
    pub props: Props<'a>,
    pub payload: &'a [u8],
}

impl<'a> MessageRecord<'a> {
    /// Its properties and payload, for the queue (which interns its tags).
    pub fn body(&self) -> Body<'a> {
        Body { props: self.props, tag_set: None, payload: self.payload }
    }
}

/// Bytes of a message's fields before its payload, without the dead-letter
/// fields and the properties: id, born_ms, deliveries, flags, len.
const MESSAGE_FIXED_BYTES: u64 = 8 + 8 + 2 + 1 + 4;
/// Flag bit of a message in a Produce record of version 2: its properties
/// follow (`props_len u16`, then the blob). The wire's bit, by choice.
const MESSAGE_FLAG_PROPS: u8 = codec::MSG_FLAG_PROPS;

/// Log bytes one message takes in a Produce record (`put_message`), with
/// `props_bytes` bytes of properties (0 for none: then no length either).
pub const fn message_record_bytes(payload_bytes: u64, props_bytes: u64, dead: bool) -> u64 {
    let props = if props_bytes == 0 { 0 } else { 2 + props_bytes };
    MESSAGE_FIXED_BYTES + if dead { codec::DEAD_INFO_BYTES as u64 } else { 0 } + props + payload_bytes
}

/// Appends one message to a Produce record body (version 2).
#[inline]
pub fn put_message(body: &mut Vec<u8>, m: &MessageRecord<'_>) {
    codec::put_u64(body, m.id);
    codec::put_u64(body, m.born_ms);
    codec::put_u16(body, m.deliveries);
    let props = m.props.bytes();
    let mut flags = if m.dead.is_some() { codec::MSG_FLAG_DEAD } else { 0 };
    if !props.is_empty() {
        flags |= MESSAGE_FLAG_PROPS;
    }
    body.push(flags);
    if let Some(d) = &m.dead {
        codec::put_dead_info(body, d);
    }
    if !props.is_empty() {
        codec::props::put_props(body, &m.props);
    }
    codec::put_u32(body, m.payload.len() as u32);
    body.extend_from_slice(m.payload);
}

/// Reads one message of a Produce record of `version`. Version 1 knows
/// only the dead-letter flag (and ignored other bits); version 2 refuses a
/// bit it does not know, and reads the properties after the dead-letter
/// fields.
fn read_message<'a>(rd: &mut Reader<'a>, version: u8) -> Result<MessageRecord<'a>, String> {
    let id = rd.u64()?;
    let born_ms = rd.u64()?;
    let deliveries = rd.u16()?;
    let flags = rd.u8()?;
    if version >= 2 && flags & !(codec::MSG_FLAG_DEAD | MESSAGE_FLAG_PROPS) != 0 {
        return Err(format!("unknown message flags {flags:#04x}"));
    }
    let dead = if flags & codec::MSG_FLAG_DEAD != 0 {
        Some(DeadInfo {
            origin_id: rd.u64()?,
            origin_deliveries: rd.u16()?,
            reason: DeadReason::from_u8(rd.u8()?).ok_or("unknown dead-letter reason")?,
        })
    } else {
        None
    };
    let props = if version >= 2 && flags & MESSAGE_FLAG_PROPS != 0 { read_props(rd)? } else { Props::EMPTY };
    let len = rd.u32()? as usize;
    Ok(MessageRecord { id, born_ms, deliveries, dead, props, payload: rd.bytes(len)? })
}

/// A message's properties: checked against the format alone (the limits
/// were checked at produce, and may have changed since), so that what is
/// stored can be iterated without failing.
fn read_props<'a>(rd: &mut Reader<'a>) -> Result<Props<'a>, String> {
    let len = rd.u16()? as usize;
    let blob = rd.bytes(len)?;
    match Props::parse_stored(blob, codec::CODEC_VERSION_MAX) {
        Ok(props) if !props.is_empty() => Ok(props),
        Ok(_) => Err("a message flagged with properties has none".into()),
        Err(e) => Err(format!("bad message properties: {}", e.message)),
    }
}

/// Log bytes of a Produce record besides its messages: the record header,
/// the topic and the count (`ProduceWriter::begin`).
pub const PRODUCE_RECORD_FIXED_BYTES: u64 = (RECORD_HEADER_BYTES + 4 + 4) as u64;

/// Writes a Produce record message by message: `begin`, `push` each, then
/// `end` (or `end_withdrawable`, `end_copy`). A record with no message is
/// dropped.
pub struct ProduceWriter {
    /// Where the record begins in the log's turn buffer.
    at: RecordStart,
    /// Where its count field is in the turn buffer.
    count_at: usize,
    /// Messages pushed.
    count: u32,
}

impl ProduceWriter {
    #[inline]
    pub fn begin(log: &mut Log, topic: TopicId) -> ProduceWriter {
        let at = log.begin(RecordKind::Produce);
        codec::put_u32(log.body(), topic.0);
        let count_at = log.body().len();
        codec::put_u32(log.body(), 0);
        ProduceWriter { at, count_at, count: 0 }
    }
    #[inline]
    pub fn push(&mut self, log: &mut Log, m: &MessageRecord<'_>) {
        put_message(log.body(), m);
        self.count += 1;
    }
    /// Finishes the record: kept for the next commit if this one fails.
    pub fn end(self, log: &mut Log) {
        if let Some(at) = self.finish(log) {
            log.end(at);
        }
    }
    /// Finishes the record: dropped if this turn's commit fails (a client's
    /// produce).
    #[inline]
    pub fn end_withdrawable(self, log: &mut Log) {
        if let Some(at) = self.finish(log) {
            log.end_withdrawable(at);
        }
    }
    /// Finishes a record of compaction's copies: dropped if this turn's
    /// commit fails, or the disk has no room for it (`Log::end_copy`).
    pub fn end_copy(self, log: &mut Log) {
        if let Some(at) = self.finish(log) {
            log.end_copy(at);
        }
    }
    #[inline]
    fn finish(self, log: &mut Log) -> Option<RecordStart> {
        if self.count == 0 {
            log.abandon(self.at);
            return None;
        }
        log.body()[self.count_at..self.count_at + 4].copy_from_slice(&self.count.to_le_bytes());
        Some(self.at)
    }
}

/// The messages of a Produce record, decoded as they are read.
#[derive(Clone, Debug)]
pub struct Messages<'a> {
    /// The rest of the body.
    pub(super) rd: Reader<'a>,
    /// Messages not yet read.
    pub(super) left: u32,
    /// The record's version: the message layout.
    pub(super) version: u8,
}

impl Messages<'_> {
    /// Messages not yet read.
    pub fn left(&self) -> u32 {
        self.left
    }
    /// Bytes of the messages not yet read (of a Produce record, the rest
    /// of its body; of an AckProduce record's output, the output's).
    pub fn bytes_left(&self) -> usize {
        self.rd.b.len() - self.rd.pos
    }
    /// The id of the next message, read without the rest of it (every
    /// message layout starts with its id); None if none is left.
    pub fn first_id(&self) -> Option<MsgId> {
        if self.left == 0 {
            return None;
        }
        self.rd.b.get(self.rd.pos..self.rd.pos + 8).map(LittleEndian::read_u64)
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<MessageRecord<'a>, String>;
    fn next(&mut self) -> Option<Self::Item> {
        let version = self.version;
        self.rd.entry(&mut self.left, |rd| read_message(rd, version))
    }
}

/// The outputs of an AckProduce record, decoded as they are read: each
/// topic and its messages.
#[derive(Clone, Debug)]
pub struct Outputs<'a> {
    /// The rest of the body.
    pub(super) rd: Reader<'a>,
    /// Outputs not yet read.
    pub(super) left: u32,
}

/// One output of an AckProduce record: its topic and messages.
fn read_output<'a>(rd: &mut Reader<'a>) -> Result<(TopicId, Messages<'a>), String> {
    let topic = TopicId(rd.u32()?);
    let count = rd.u32()?;
    let len = rd.u32()? as usize;
    let rd = Reader { b: rd.bytes(len)?, pos: 0 };
    Ok((topic, Messages { rd, left: count, version: ACK_PRODUCE_MESSAGE_VERSION }))
}

impl<'a> Iterator for Outputs<'a> {
    type Item = Result<(TopicId, Messages<'a>), String>;
    fn next(&mut self) -> Option<Self::Item> {
        self.rd.entry(&mut self.left, read_output)
    }
}

/// The Produce record version whose message layout an AckProduce record's
/// messages have.
const ACK_PRODUCE_MESSAGE_VERSION: u8 = 2;

/// Writes an AckProduce record, version 1: `topic_id u32, group_id u32,
/// count u32, count x id u64, outputs u16`, then per output `topic_id u32,
/// count u32, bytes u32` and its messages as in a Produce record of version
/// 2. `begin`, `ack` the ids, then per output `output` and `push` each of
/// its messages, then `end`.
pub struct AckProduceWriter {
    at: RecordStart,
    /// Where the outputs' count is in the turn buffer.
    outputs_at: usize,
    outputs: u16,
    /// Where the open output's count and its byte length are.
    output_at: Option<usize>,
    /// Messages of the open output.
    count: u32,
}

impl AckProduceWriter {
    pub fn begin(log: &mut Log, topic: TopicId, group: GroupId, acked: &[MsgId]) -> AckProduceWriter {
        let at = log.begin(RecordKind::AckProduce);
        let b = log.body();
        codec::put_u32(b, topic.0);
        codec::put_u32(b, group.0);
        codec::put_u32(b, acked.len() as u32);
        for id in acked {
            codec::put_u64(b, *id);
        }
        let outputs_at = b.len();
        codec::put_u16(b, 0);
        AckProduceWriter { at, outputs_at, outputs: 0, output_at: None, count: 0 }
    }
    /// Starts the messages of output topic `topic`.
    pub fn output(&mut self, log: &mut Log, topic: TopicId) {
        self.close_output(log);
        let b = log.body();
        codec::put_u32(b, topic.0);
        self.output_at = Some(b.len());
        codec::put_u32(b, 0);
        codec::put_u32(b, 0);
        self.outputs += 1;
    }
    pub fn push(&mut self, log: &mut Log, m: &MessageRecord<'_>) {
        put_message(log.body(), m);
        self.count += 1;
    }
    fn close_output(&mut self, log: &mut Log) {
        let Some(at) = self.output_at.take() else { return };
        let b = log.body();
        let len = (b.len() - at - 8) as u32;
        b[at..at + 4].copy_from_slice(&self.count.to_le_bytes());
        b[at + 4..at + 8].copy_from_slice(&len.to_le_bytes());
        self.count = 0;
    }
    /// Ends the record. It is not withdrawable: its acks took effect.
    pub fn end(mut self, log: &mut Log) {
        self.close_output(log);
        let at = self.outputs_at;
        log.body()[at..at + 2].copy_from_slice(&self.outputs.to_le_bytes());
        log.end(self.at);
    }
}
