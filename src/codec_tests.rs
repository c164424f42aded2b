//! Unit tests of the wire codec, shaped like the fuzz targets of sozu and
//! pelikan: they assert properties of what the decoders return, not only
//! that they do not panic.
//!
//! - every request and reply round-trips through its encoder and decoder;
//! - every strict prefix of a valid frame is "need more";
//! - any split of a stream of frames gives the same frames in the same order;
//! - each way a request can be wrong gives its error code and the right Skip;
//! - random and mutated input never panics, and whatever the decoders return
//!   agrees with the bytes they were given.
//!
//! The randomized tests draw from a splitmix64 generator, one seed per case.
//! A failure names its seed; `RUNNEL_SEED=<seed> cargo test --lib codec`
//! replays only that seed.

use super::*;
use crate::limits::Limits;
use crate::testkit::{Rng, SeedGuard, seeds};
use std::collections::BTreeSet;
use std::ops::Range;

// ---------------------------------------------------------------------------
// Seeded randomness.
// ---------------------------------------------------------------------------

/// What the codec's tests draw beyond `testkit::Rng`'s basics.
trait CodecRng {
    fn small_bytes(&mut self, n: usize) -> Vec<u8>;
    fn ascii(&mut self, len: usize) -> String;
    fn topic(&mut self) -> String;
}

impl CodecRng for Rng {
    /// Bytes that are mostly small numbers, so that counts and lengths read
    /// from them often fit in the frame and the parsers get further.
    fn small_bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n)
            .map(|_| match self.below(4) {
                0 => 0,
                1 => self.below(10) as u8,
                _ => self.next_u64() as u8,
            })
            .collect()
    }
    fn ascii(&mut self, len: usize) -> String {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";
        (0..len).map(|_| self.pick(ALPHABET) as char).collect()
    }
    /// A name valid under `SMALL`, now and then a dead-letter one.
    fn topic(&mut self) -> String {
        let len = self.range(1, SMALL.topic_name_bytes_max as usize);
        let mut name = self.ascii(len);
        if self.one_in(8) {
            name.push_str(".dlq");
        }
        name
    }
}

/// Names a panicking test's seed with the command that replays it.
fn seed_guard(test: &'static str, seed: u64) -> SeedGuard {
    SeedGuard { test, seed, replay: "cargo test --lib codec" }
}

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

/// Small limits, so that every bound is reached with a few bytes.
const SMALL: DecodeLimits = DecodeLimits {
    frame_bytes_max: 2048,
    message_bytes_max: 64,
    batch_messages_max: 8,
    topic_name_bytes_max: 16,
    output_bytes_max: 1 << 20,
    fetch_bytes_max: 256,
    idle_timeout_ms: 0,
    group_name_bytes_max: 16,
    tags_per_message_max: 2,
    tag_bytes_max: 8,
    props_bytes_max: 48,
    filter_bytes_max: 32,
    subscription_credit_max: 3,
    key_bytes_max: 8,
    dedup_id_bytes_max: 5,
    nack_reason_bytes_max: 6,
    lookup_results_max: 7,
};

/// A name of exactly `SMALL.topic_name_bytes_max` bytes, every kind of byte allowed.
const LONGEST_TOPIC: &str = "abcdefghij.-_XYZ";
/// The same with the `.dlq` suffix, which may go 4 bytes past the limit.
const LONGEST_DLQ_TOPIC: &str = "abcdefghij.-_XYZ.dlq";

const ALL_OPS: [u8; 13] = [
    op::HELLO,
    op::PING,
    op::PRODUCE,
    op::FETCH,
    op::ACK,
    op::NACK,
    op::TOUCH,
    op::STATS,
    op::CREATE_TOPIC,
    op::DELETE_TOPIC,
    op::PURGE_TOPIC,
    op::LIST_TOPICS,
    op::REDRIVE,
];

/// The ops whose body starts with a topic name.
const TOPIC_OPS: [u8; 10] = [
    op::PRODUCE,
    op::FETCH,
    op::ACK,
    op::NACK,
    op::TOUCH,
    op::STATS,
    op::CREATE_TOPIC,
    op::DELETE_TOPIC,
    op::PURGE_TOPIC,
    op::REDRIVE,
];

fn default_limits() -> DecodeLimits {
    DecodeLimits::from(&Limits::default())
}

fn encode(request_id: u32, req: &Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(&mut out, request_id, req, 1);
    out
}

/// A frame built field by field, for what the encoders refuse to write.
fn raw_frame(op: u8, status: u8, flags: u16, request_id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_u32(&mut out, (HEADER_BYTES - 4 + body.len()) as u32);
    out.push(op);
    out.push(status);
    put_u16(&mut out, flags);
    put_u32(&mut out, request_id);
    out.extend_from_slice(body);
    out
}

/// `frame`'s header with another body, and the length field to match.
fn with_body(frame: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = frame[..HEADER_BYTES].to_vec();
    out[..4].copy_from_slice(&((HEADER_BYTES - 4 + body.len()) as u32).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// What the header says the whole frame takes; only for `buf.len() >= 4`.
fn claimed_frame_bytes(buf: &[u8]) -> usize {
    LittleEndian::read_u32(buf) as usize + 4
}

fn batch_bytes<P: AsRef<[u8]>>(payloads: &[P]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_batch(&mut out, payloads);
    out
}

fn ids_bytes(ids: &[u64]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_ids(&mut out, ids);
    out
}

/// The start of a buffer, for assertion messages that stay readable.
fn head(buf: &[u8]) -> String {
    format!("{} bytes {:02x?}", buf.len(), &buf[..buf.len().min(48)])
}

#[track_caller]
fn decode_ok<'a>(buf: &'a [u8], limits: &DecodeLimits) -> (Frame<'a>, usize) {
    match decode_request(buf, limits, 1) {
        Ok(Decoded::Frame(f, n)) => (f, n),
        other => panic!("expected a request frame from {}, got {other:?}", head(buf)),
    }
}

#[track_caller]
fn decode_err(buf: &[u8], limits: &DecodeLimits) -> DecodeError {
    match decode_request(buf, limits, 1) {
        Err(e) => e,
        other => panic!("expected an error from {}, got {other:?}", head(buf)),
    }
}

#[track_caller]
fn reply_ok(buf: &[u8]) -> (ReplyFrame<'_>, usize) {
    match decode_reply(buf, usize::MAX) {
        Ok(Decoded::Frame(f, n)) => (f, n),
        other => panic!("expected a reply frame from {}, got {other:?}", head(buf)),
    }
}

/// Asserts that `frame`, exactly one whole frame, is refused with `code`,
/// names its op and request id, and is skipped whole.
#[track_caller]
fn assert_refused(frame: &[u8], limits: &DecodeLimits, code: ErrorCode, what: &str) {
    let e = decode_err(frame, limits);
    let want = (code, Skip::Bytes(frame.len()), frame[4], LittleEndian::read_u32(&frame[8..]));
    assert_eq!((e.code, e.skip, e.op, e.request_id), want, "{what}: {:?} ({})", e.message, head(frame));
    assert!(!e.message.is_empty(), "{what}: the error has no message");
}

/// A request id that differs per sample and reaches both ends of the range.
fn request_id_for(i: usize) -> u32 {
    match i % 3 {
        0 => i as u32,
        1 => u32::MAX - i as u32,
        _ => (i as u32).wrapping_mul(0x9e37_79b9),
    }
}

/// A valid request of `op` (one that takes a topic) with `topic` in it.
fn request_with_topic(op: u8, topic: &str) -> Request<'_> {
    const ONE_MESSAGE: &[u8] = &[2, 0, 0, 0, b'h', b'i'];
    const ONE_ID: &[u8] = &[7, 0, 0, 0, 0, 0, 0, 0];
    match op {
        op::PRODUCE => {
            Request::Produce { flags: 0, topic, batch: Batch { count: 1, bytes: ONE_MESSAGE, with_props: false } }
        }
        op::FETCH => {
            Request::Fetch { topic, group: "", max_messages: 10, max_bytes: 1000, wait_ms: 0, ack_timeout_ms: 0 }
        }
        op::ACK => Request::Ack { topic, group: "", ids: Ids { bytes: ONE_ID } },
        op::NACK => Request::Nack { topic, group: "", delay_ms: 0, flags: 0, ids: Ids { bytes: ONE_ID }, reason: "" },
        op::TOUCH => Request::Touch { topic, group: "", ack_timeout_ms: 100, ids: Ids { bytes: ONE_ID } },
        op::STATS => Request::Stats { topic },
        op::CREATE_TOPIC => {
            Request::CreateTopic { topic, settings: TopicSettings::default(), options: Default::default() }
        }
        op::DELETE_TOPIC => Request::DeleteTopic { topic },
        op::PURGE_TOPIC => Request::PurgeTopic { topic },
        op::REDRIVE => Request::Redrive { topic, group: "", max_messages: 1 },
        _ => panic!("op 0x{op:02x} takes no topic"),
    }
}

// ---------------------------------------------------------------------------
// Sample requests: one of every shape.
// ---------------------------------------------------------------------------

/// The owned parts the sample requests borrow.
struct Samples {
    /// Eight payloads (batch_messages_max in SMALL), all sizes up to the limit.
    many_payloads: Vec<Vec<u8>>,
    one: Vec<u8>,
    many: Vec<u8>,
    empties: Vec<u8>,
    /// One payload of exactly message_bytes_max.
    full: Vec<u8>,
    one_id: Vec<u8>,
    /// batch_messages_max ids, both ends of the range included.
    many_ids: Vec<u64>,
    many_ids_bytes: Vec<u8>,
}

impl Samples {
    fn new() -> Samples {
        let many_payloads: Vec<Vec<u8>> = vec![
            b"a".to_vec(),
            Vec::new(),
            b"hello, world".to_vec(),
            vec![0u8; 3],
            vec![0xff; 63],
            (0..=255u8).take(40).collect(),
            b"\r\n\0".to_vec(),
            vec![0x5a; SMALL.message_bytes_max as usize],
        ];
        assert_eq!(many_payloads.len(), SMALL.batch_messages_max as usize);
        let many_ids = vec![0, 1, 2, u64::MAX, 1 << 32, 0x0102_0304_0506_0708, 42, u64::MAX - 1];
        assert_eq!(many_ids.len(), SMALL.batch_messages_max as usize);
        Samples {
            one: batch_bytes(&[b"hello"]),
            many: batch_bytes(&many_payloads),
            empties: batch_bytes(&[b"", b"", b""]),
            full: batch_bytes(&[vec![0xab; SMALL.message_bytes_max as usize]]),
            many_payloads,
            one_id: ids_bytes(&[17]),
            many_ids_bytes: ids_bytes(&many_ids),
            many_ids,
        }
    }

    /// Every request shape the codec knows, each valid under SMALL.
    fn requests(&self) -> Vec<(&'static str, Request<'_>)> {
        let mut all = vec![
            ("hello without token", Request::Hello { min_version: 1, max_version: 1, token: b"" }),
            ("hello with token", Request::Hello { min_version: 1, max_version: 7, token: b"s3cret token\0\xff" }),
            ("hello extreme versions", Request::Hello { min_version: u16::MAX, max_version: 0, token: b"t" }),
            ("ping", Request::Ping),
        ];
        all.extend(self.message_requests());
        all.extend(Self::admin_requests());
        all
    }

    /// The requests that carry messages or ids: PRODUCE, FETCH, ACK, NACK,
    /// TOUCH.
    fn message_requests(&self) -> Vec<(&'static str, Request<'_>)> {
        let one_id = Ids { bytes: &self.one_id };
        let many_ids = Ids { bytes: &self.many_ids_bytes };
        let produce = |topic, count, bytes| Request::Produce {
            topic,
            flags: 0,
            batch: Batch { count, bytes, with_props: false },
        };
        vec![
            ("produce one", produce("orders", 1, &self.one)),
            ("produce many", produce("orders", self.many_payloads.len() as u32, &self.many)),
            ("produce empty payloads", produce("e", 3, &self.empties)),
            ("produce message_bytes_max", produce(LONGEST_TOPIC, 1, &self.full)),
            ("produce to dead letters", produce(LONGEST_DLQ_TOPIC, 1, &self.one)),
            (
                "fetch",
                Request::Fetch {
                    topic: "orders",
                    group: "",
                    max_messages: 100,
                    max_bytes: 1 << 20,
                    wait_ms: 30_000,
                    ack_timeout_ms: 0,
                },
            ),
            (
                "fetch extremes",
                Request::Fetch {
                    topic: "o",
                    group: "",
                    max_messages: u32::MAX,
                    max_bytes: 0,
                    wait_ms: u32::MAX,
                    ack_timeout_ms: u32::MAX,
                },
            ),
            ("ack one", Request::Ack { topic: "orders", group: "", ids: one_id }),
            ("ack many", Request::Ack { topic: "orders", group: "", ids: many_ids }),
            ("nack", Request::Nack { topic: "orders", group: "", delay_ms: 0, flags: 0, ids: many_ids, reason: "" }),
            (
                "nack dead letter",
                Request::Nack {
                    topic: "orders",
                    group: "",
                    delay_ms: u32::MAX,
                    flags: NACK_FLAG_DEAD_LETTER,
                    ids: one_id,
                    reason: "",
                },
            ),
            ("touch", Request::Touch { topic: "orders", group: "", ack_timeout_ms: 5_000, ids: many_ids }),
        ]
    }

    /// The admin requests: STATS and the topic operations.
    fn admin_requests() -> Vec<(&'static str, Request<'static>)> {
        vec![
            ("stats all", Request::Stats { topic: "" }),
            ("stats one", Request::Stats { topic: "orders" }),
            (
                "create topic",
                Request::CreateTopic {
                    topic: "orders",
                    settings: TopicSettings { ack_timeout_ms: 30_000, max_deliveries: 5 },
                    options: Default::default(),
                },
            ),
            (
                "create topic defaults",
                Request::CreateTopic {
                    topic: LONGEST_TOPIC,
                    settings: TopicSettings::default(),
                    options: Default::default(),
                },
            ),
            (
                "create topic extremes",
                Request::CreateTopic {
                    topic: "x",
                    settings: TopicSettings { ack_timeout_ms: u32::MAX, max_deliveries: u16::MAX },
                    options: Default::default(),
                },
            ),
            ("delete topic", Request::DeleteTopic { topic: "orders" }),
            ("purge topic", Request::PurgeTopic { topic: "orders.dlq" }),
            ("list topics", Request::ListTopics),
            ("redrive", Request::Redrive { topic: "orders.dlq", group: "", max_messages: 100 }),
            ("redrive all", Request::Redrive { topic: "orders", group: "", max_messages: 0 }),
        ]
    }

    /// The samples, encoded.
    fn frames(&self) -> Vec<(&'static str, Vec<u8>)> {
        self.requests().iter().enumerate().map(|(i, (name, req))| (*name, encode(request_id_for(i), req))).collect()
    }
}

// ---------------------------------------------------------------------------
// Sample replies: one of every encoder.
// ---------------------------------------------------------------------------

const MESSAGES: [Message<'static>; 7] = [
    Message {
        id: 1,
        born_ms: 1_700_000_000_000,
        delivery_count: 1,
        dead: None,
        payload: b"first",
        origin_group: "",
        props: Props::EMPTY,
    },
    Message {
        id: u64::MAX,
        born_ms: 0,
        delivery_count: u16::MAX,
        dead: None,
        payload: b"",
        origin_group: "",
        props: Props::EMPTY,
    },
    Message {
        id: 7,
        born_ms: u64::MAX,
        delivery_count: 2,
        dead: Some(DeadInfo { origin_id: 42, origin_deliveries: 5, reason: DeadReason::AckTimeout }),
        payload: b"\0\xff binary",
        origin_group: "",
        props: Props::EMPTY,
    },
    Message {
        id: 8,
        born_ms: 3,
        delivery_count: 1,
        dead: Some(DeadInfo { origin_id: u64::MAX, origin_deliveries: u16::MAX, reason: DeadReason::Nacked }),
        payload: b"x",
        origin_group: "",
        props: Props::EMPTY,
    },
    Message {
        id: 9,
        born_ms: 4,
        delivery_count: 1,
        dead: Some(DeadInfo { origin_id: 0, origin_deliveries: 0, reason: DeadReason::Rejected }),
        payload: b"",
        origin_group: "",
        props: Props::EMPTY,
    },
    Message {
        id: 10,
        born_ms: 5,
        delivery_count: 3,
        dead: Some(DeadInfo { origin_id: 1, origin_deliveries: 1, reason: DeadReason::ConsumerLost }),
        payload: b"lost",
        origin_group: "",
        props: Props::EMPTY,
    },
    Message {
        id: 11,
        born_ms: 6,
        delivery_count: 1,
        dead: None,
        payload: &[0x5a; 64],
        origin_group: "",
        props: Props::EMPTY,
    },
];

const ALL_ERROR_CODES: [ErrorCode; 25] = [
    ErrorCode::Malformed,
    ErrorCode::UnknownOp,
    ErrorCode::Version,
    ErrorCode::HelloRequired,
    ErrorCode::FrameTooLarge,
    ErrorCode::MessageTooLarge,
    ErrorCode::BatchTooLarge,
    ErrorCode::BadTopic,
    ErrorCode::UnknownTopic,
    ErrorCode::TooManyTopics,
    ErrorCode::QueueFull,
    ErrorCode::Storage,
    ErrorCode::Unauthenticated,
    ErrorCode::ShuttingDown,
    ErrorCode::TooManyConnections,
    ErrorCode::BadArgument,
    ErrorCode::Busy,
    ErrorCode::UnknownGroup,
    ErrorCode::BadFilter,
    ErrorCode::TooManyGroups,
    ErrorCode::Moved,
    ErrorCode::TryAgain,
    ErrorCode::NotPrimary,
    ErrorCode::CrossShard,
    ErrorCode::NotScheduled,
];

/// The longest key a STATS pair can carry: its length is a u8.
const LONGEST_STATS_KEY: &str = match std::str::from_utf8(&[b'k'; 255]) {
    Ok(key) => key,
    Err(_) => panic!("ASCII is UTF-8"),
};

/// Records where each sample reply lies in the shared output buffer.
struct Recorder {
    start: usize,
    samples: Vec<(String, Range<usize>, ReplyFrame<'static>)>,
}

impl Recorder {
    fn add(&mut self, out: &[u8], name: impl Into<String>, op: u8, request_id: u32, reply: Reply<'static>) {
        self.samples.push((name.into(), self.start..out.len(), ReplyFrame { op, request_id, reply }));
        self.start = out.len();
    }
}

/// Appends one frame of every reply shape to `out`, one after the other (so
/// that the writers run at nonzero offsets); returns each one's name, its
/// byte range in `out` and what decoding it must give.
fn encode_reply_samples(out: &mut Vec<u8>) -> Vec<(String, Range<usize>, ReplyFrame<'static>)> {
    let mut r = Recorder { start: out.len(), samples: Vec::new() };
    encode_small_replies(out, &mut r);
    encode_error_replies(out, &mut r);
    encode_messages_replies(out, &mut r);
    encode_listing_replies(out, &mut r);
    r.samples
}

/// HELLO, PONG, PRODUCE's, the id lists', the counts' and CREATE's replies.
fn encode_small_replies(out: &mut Vec<u8>, r: &mut Recorder) {
    encode_hello_reply(out, 1, 1, &SMALL, 0);
    r.add(out, "hello", op::HELLO, 1, Reply::Hello { version: 1, limits: SMALL.reported(1), map_epoch: 0 });
    encode_hello_reply(out, u32::MAX, u16::MAX, &DecodeLimits::CLIENT, u64::MAX);
    r.add(
        out,
        "hello, client limits",
        op::HELLO,
        u32::MAX,
        Reply::Hello { version: u16::MAX, limits: DecodeLimits::CLIENT, map_epoch: u64::MAX },
    );

    encode_empty_reply(out, op::PING, 2);
    r.add(out, "pong", op::PING, 2, Reply::Pong);

    encode_produce_reply(out, 3, 0, 1);
    r.add(out, "produced one", op::PRODUCE, 3, Reply::Produced { first_id: 0, count: 1 });
    encode_produce_reply(out, 4, u64::MAX - 7, 8);
    r.add(out, "produced many", op::PRODUCE, 4, Reply::Produced { first_id: u64::MAX - 7, count: 8 });

    for (i, op) in [op::ACK, op::NACK, op::TOUCH].into_iter().enumerate() {
        let id = 10 + i as u32;
        encode_ids_reply(out, op, id, 3, &[]);
        r.add(out, format!("ids 0x{op:02x}, none failed"), op, id, Reply::Ids { done: 3, failed: vec![] });
        encode_ids_reply(out, op, id, u32::MAX, &[5, 0, u64::MAX]);
        r.add(
            out,
            format!("ids 0x{op:02x}, some failed"),
            op,
            id,
            Reply::Ids { done: u32::MAX, failed: vec![5, 0, u64::MAX] },
        );
    }

    for (op, value) in [(op::DELETE_TOPIC, 0), (op::PURGE_TOPIC, 12_345), (op::REDRIVE, u64::MAX)] {
        encode_u64_reply(out, op, 20, value);
        r.add(out, format!("count 0x{op:02x}"), op, 20, Reply::Count(value));
    }
    encode_u64_reply(out, op::CREATE_TOPIC, 21, 1);
    r.add(out, "created", op::CREATE_TOPIC, 21, Reply::Created { created: true });
    encode_u64_reply(out, op::CREATE_TOPIC, 22, 0);
    r.add(out, "not created", op::CREATE_TOPIC, 22, Reply::Created { created: false });
}

/// An error of every code, and errors with unusual text and ops.
fn encode_error_replies(out: &mut Vec<u8>, r: &mut Recorder) {
    for (i, code) in ALL_ERROR_CODES.into_iter().enumerate() {
        let op = ALL_OPS[i % ALL_OPS.len()];
        let id = 30 + i as u32;
        encode_error(out, op, id, code, code.name());
        r.add(out, format!("error {}", code.name()), op, id, Reply::Error { code: code as u8, message: code.name() });
    }
    encode_error(out, op::FETCH, 50, ErrorCode::UnknownTopic, "");
    r.add(out, "error, empty text", op::FETCH, 50, Reply::Error { code: 9, message: "" });
    encode_error(out, op::STATS, 51, ErrorCode::BadTopic, "topic ‘é’ — non-ASCII text");
    r.add(out, "error, UTF-8 text", op::STATS, 51, Reply::Error { code: 8, message: "topic ‘é’ — non-ASCII text" });
    encode_error(out, 0x7e, 52, ErrorCode::UnknownOp, "unknown opcode 0x7e");
    r.add(out, "error to an unknown op", 0x7e, 52, Reply::Error { code: 2, message: "unknown opcode 0x7e" });
    // The two connection errors answer no request: op 0x80, request id 0.
    encode_error(out, 0, 0, ErrorCode::TooManyConnections, "too many connections");
    r.add(out, "connection error", 0, 0, Reply::Error { code: 15, message: "too many connections" });
}

/// FETCH replies: none, a few, and dead letters to the longest topic.
fn encode_messages_replies(out: &mut Vec<u8>, r: &mut Recorder) {
    let w = MessagesWriter::begin(out, 60, "orders", 1);
    assert_eq!(w.count(), 0);
    w.finish(out);
    r.add(out, "no messages", op::FETCH, 60, Reply::Messages { topic: "orders", messages: vec![] });
    let mut w = MessagesWriter::begin(out, 61, "orders", 1);
    for m in &MESSAGES[..2] {
        w.push(out, m);
    }
    w.finish(out);
    r.add(out, "messages", op::FETCH, 61, Reply::Messages { topic: "orders", messages: MESSAGES[..2].to_vec() });
    let mut w = MessagesWriter::begin(out, 62, LONGEST_DLQ_TOPIC, 1);
    for m in &MESSAGES {
        w.push(out, m);
    }
    assert_eq!(w.count(), MESSAGES.len() as u32);
    w.finish(out);
    r.add(
        out,
        "messages, dead",
        op::FETCH,
        62,
        Reply::Messages { topic: LONGEST_DLQ_TOPIC, messages: MESSAGES.to_vec() },
    );
}

/// STATS and LIST_TOPICS replies, empty and full.
fn encode_listing_replies(out: &mut Vec<u8>, r: &mut Recorder) {
    StatsWriter::begin(out, 70).finish(out);
    r.add(out, "stats, no sections", op::STATS, 70, Reply::Stats(vec![]));
    let mut w = StatsWriter::begin(out, 71);
    w.section(out, "");
    w.kv(out, "uptime_ms", 12_345);
    w.kv(out, "connections", 3);
    w.section(out, "orders");
    w.kv(out, "ready", 10);
    w.kv(out, "in_flight", u64::MAX);
    w.kv(out, "", 0);
    w.section(out, "idle");
    w.section(out, "orders.dlq");
    w.kv(out, LONGEST_STATS_KEY, 1);
    w.finish(out);
    r.add(
        out,
        "stats",
        op::STATS,
        71,
        Reply::Stats(vec![
            ("", vec![("uptime_ms", 12_345), ("connections", 3)]),
            ("orders", vec![("ready", 10), ("in_flight", u64::MAX), ("", 0)]),
            ("idle", vec![]),
            ("orders.dlq", vec![(LONGEST_STATS_KEY, 1)]),
        ]),
    );

    encode_topics_reply(out, 80, &[]);
    r.add(out, "no topics", op::LIST_TOPICS, 80, Reply::Topics(vec![]));
    let topics = [
        ("orders", TopicSettings { ack_timeout_ms: 30_000, max_deliveries: 5 }),
        ("orders.dlq", TopicSettings::default()),
        (LONGEST_TOPIC, TopicSettings { ack_timeout_ms: u32::MAX, max_deliveries: u16::MAX }),
    ];
    encode_topics_reply(out, 81, &topics);
    r.add(out, "topics", op::LIST_TOPICS, 81, Reply::Topics(topics.to_vec()));
}

// ---------------------------------------------------------------------------
// 1. Requests round-trip.
// ---------------------------------------------------------------------------

#[test]
fn every_request_round_trips() {
    let samples = Samples::new();
    let mut ops = BTreeSet::new();
    for (i, (name, req)) in samples.requests().into_iter().enumerate() {
        let request_id = request_id_for(i);
        let buf = encode(request_id, &req);
        assert_eq!(claimed_frame_bytes(&buf), buf.len(), "{name}: length field");
        assert_eq!(buf[4..8], [req.op(), 0, 0, 0], "{name}: op, status, flags");
        assert_eq!(LittleEndian::read_u32(&buf[8..]), request_id, "{name}: request id");
        for limits in [SMALL, default_limits(), DecodeLimits::CLIENT] {
            let (frame, n) = decode_ok(&buf, &limits);
            assert_eq!(frame, Frame { request_id, request: req }, "{name} under {limits:?}");
            assert_eq!(n, buf.len(), "{name}: consumed");
        }
        // Followed by another frame, it still consumes only its own bytes.
        let mut two = buf.clone();
        encode_request(&mut two, 99, &Request::Ping, 1);
        let (frame, n) = decode_ok(&two, &SMALL);
        assert_eq!((frame.request, n), (req, buf.len()), "{name}: followed by another frame");
        let (frame, n) = decode_ok(&two[buf.len()..], &SMALL);
        assert_eq!((frame, n), (Frame { request_id: 99, request: Request::Ping }, HEADER_BYTES));
        ops.insert(req.op());
    }
    assert_eq!(ops, ALL_OPS.into_iter().collect::<BTreeSet<_>>(), "some op has no sample");
}

#[test]
fn the_smallest_frame_is_a_bare_header() {
    let buf = raw_frame(op::PING, 0, 0, 5, &[]);
    assert_eq!(LittleEndian::read_u32(&buf), 8);
    assert_eq!(decode_ok(&buf, &SMALL), (Frame { request_id: 5, request: Request::Ping }, HEADER_BYTES));
    assert_eq!(encode(5, &Request::Ping), buf);
    let buf = raw_frame(op::LIST_TOPICS, 0, 0, 6, &[]);
    assert_eq!(decode_ok(&buf, &SMALL), (Frame { request_id: 6, request: Request::ListTopics }, HEADER_BYTES));
}

#[test]
fn batch_and_ids_iterate_what_was_encoded() {
    let samples = Samples::new();

    let produce = Request::Produce {
        flags: 0,
        topic: "t",
        batch: Batch { count: samples.many_payloads.len() as u32, bytes: &samples.many, with_props: false },
    };
    let buf = encode(7, &produce);
    let (frame, _) = decode_ok(&buf, &SMALL);
    let Request::Produce { topic, batch, .. } = frame.request else { panic!("not a produce: {frame:?}") };
    assert_eq!(topic, "t");
    let want: Vec<&[u8]> = samples.many_payloads.iter().map(Vec::as_slice).collect();
    assert_eq!(batch.iter().collect::<Vec<_>>(), want);
    assert_eq!(batch.count as usize, want.len());
    let payload_bytes: usize = want.iter().map(|p| p.len()).sum();
    assert_eq!(batch.payload_bytes(), payload_bytes as u64);

    let empties = Request::Produce {
        flags: 0,
        topic: "t",
        batch: Batch { count: 3, bytes: &samples.empties, with_props: false },
    };
    let buf = encode(8, &empties);
    let Request::Produce { batch, .. } = decode_ok(&buf, &SMALL).0.request else { panic!("not a produce") };
    assert_eq!(batch.iter().collect::<Vec<_>>(), vec![b"" as &[u8]; 3]);
    assert_eq!(batch.payload_bytes(), 0);

    let full =
        Request::Produce { flags: 0, topic: "t", batch: Batch { count: 1, bytes: &samples.full, with_props: false } };
    let buf = encode(9, &full);
    let Request::Produce { batch, .. } = decode_ok(&buf, &SMALL).0.request else { panic!("not a produce") };
    assert_eq!(batch.iter().collect::<Vec<_>>(), vec![&[0xab; 64][..]]);
    assert_eq!(batch.payload_bytes(), u64::from(SMALL.message_bytes_max));

    let ids = Ids { bytes: &samples.many_ids_bytes };
    for req in [
        Request::Ack { topic: "t", group: "", ids },
        Request::Nack { topic: "t", group: "", delay_ms: 1, flags: NACK_FLAG_DEAD_LETTER, ids, reason: "" },
        Request::Touch { topic: "t", group: "", ack_timeout_ms: 1, ids },
    ] {
        let buf = encode(10, &req);
        let (frame, _) = decode_ok(&buf, &SMALL);
        let got = match frame.request {
            Request::Ack { ids, .. } | Request::Nack { ids, .. } | Request::Touch { ids, .. } => ids,
            other => panic!("not an ids request: {other:?}"),
        };
        assert_eq!(got.iter().collect::<Vec<_>>(), samples.many_ids, "op 0x{:02x}", req.op());
        assert_eq!(got.len(), samples.many_ids.len());
        assert!(!got.is_empty());
    }
}

// ---------------------------------------------------------------------------
// 2. Replies round-trip.
// ---------------------------------------------------------------------------

#[test]
fn every_reply_round_trips() {
    // A frame in front, so that every writer starts at a nonzero offset.
    let mut out = Vec::new();
    encode_empty_reply(&mut out, op::PING, 0);
    let samples = encode_reply_samples(&mut out);
    let mut ops = BTreeSet::new();
    for (name, range, want) in &samples {
        let alone = &out[range.clone()];
        assert_eq!(claimed_frame_bytes(alone), alone.len(), "{name}: length field");
        assert_eq!(alone[4], want.op | REPLY_BIT, "{name}: op");
        assert_eq!(alone[6..8], [0, 0], "{name}: flags");
        let (got, n) = reply_ok(alone);
        assert_eq!((&got, n), (want, alone.len()), "{name}");
        // Followed by the rest of the stream, it consumes only its own bytes.
        let (got, n) = reply_ok(&out[range.start..]);
        assert_eq!((&got, n), (want, alone.len()), "{name}, followed by more");
        ops.insert(want.op);
    }
    assert_eq!(ops.intersection(&ALL_OPS.into_iter().collect()).count(), ALL_OPS.len(), "some op has no reply");

    // The whole buffer decodes frame after frame, with nothing left over.
    let mut at = reply_ok(&out).1;
    for (name, range, want) in &samples {
        assert_eq!(at, range.start, "{name}");
        let (got, n) = reply_ok(&out[at..]);
        assert_eq!(&got, want, "{name}");
        at += n;
    }
    assert_eq!(at, out.len());
}

#[test]
fn a_message_takes_message_wire_bytes() {
    let mut out = Vec::new();
    let mut w = MessagesWriter::begin(&mut out, 1, "t", 1);
    for (i, m) in MESSAGES.iter().enumerate() {
        let before = out.len();
        w.push(&mut out, m);
        assert_eq!(out.len() - before, message_wire_bytes(m, 1), "message {i}");
        assert_eq!(w.count(), i as u32 + 1);
    }
    w.finish(&mut out);
    assert_eq!(claimed_frame_bytes(&out), out.len());
}

#[test]
fn error_codes_and_dead_reasons_have_stable_numbers_and_names() {
    let mut names = BTreeSet::new();
    for (i, code) in ALL_ERROR_CODES.into_iter().enumerate() {
        assert_eq!(code as u8, i as u8 + 1, "{code:?}");
        assert_eq!(ErrorCode::from_u8(code as u8), Some(code));
        assert!(names.insert(code.name()), "{} twice", code.name());
    }
    assert_eq!(ErrorCode::from_u8(0), None);
    assert_eq!(ErrorCode::from_u8(26), None);
    assert_eq!(ErrorCode::from_u8(0xff), None);
    let reasons = [DeadReason::AckTimeout, DeadReason::Nacked, DeadReason::Rejected, DeadReason::ConsumerLost];
    let mut names = BTreeSet::new();
    for (i, reason) in reasons.into_iter().enumerate() {
        assert_eq!(reason as u8, i as u8 + 1, "{reason:?}");
        assert_eq!(DeadReason::from_u8(reason as u8), Some(reason));
        assert!(names.insert(reason.name()));
    }
    assert_eq!(DeadReason::from_u8(0), None);
    assert_eq!(DeadReason::from_u8(5), None);
}

// ---------------------------------------------------------------------------
// 3. Every strict prefix is "need more".
// ---------------------------------------------------------------------------

#[test]
fn every_prefix_of_a_request_needs_more() {
    let samples = Samples::new();
    for (name, buf) in samples.frames() {
        for limits in [SMALL, DecodeLimits::CLIENT] {
            for k in 0..buf.len() {
                assert_eq!(decode_request(&buf[..k], &limits, 1), Ok(Decoded::NeedMore), "{name}: prefix of {k} bytes");
            }
        }
    }
}

#[test]
fn every_prefix_of_a_random_request_needs_more() {
    for seed in seeds(300) {
        let _guard = seed_guard("every_prefix_of_a_random_request_needs_more", seed);
        let mut rng = Rng::new(seed);
        let buf = random_request_frame(&mut rng);
        assert!(matches!(decode_request(&buf, &SMALL, 1), Ok(Decoded::Frame(_, n)) if n == buf.len()), "seed {seed}");
        for k in 0..buf.len() {
            assert_eq!(decode_request(&buf[..k], &SMALL, 1), Ok(Decoded::NeedMore), "seed {seed}: prefix of {k}");
        }
    }
}

#[test]
fn every_prefix_of_a_reply_needs_more() {
    let mut out = Vec::new();
    let samples = encode_reply_samples(&mut out);
    for (name, range, _) in samples {
        let buf = &out[range];
        for k in 0..buf.len() {
            assert_eq!(decode_reply(&buf[..k], usize::MAX), Ok(Decoded::NeedMore), "{name}: prefix of {k} bytes");
            assert_eq!(decode_reply(&buf[..k], buf.len()), Ok(Decoded::NeedMore), "{name}: prefix of {k} bytes");
        }
    }
}

// ---------------------------------------------------------------------------
// 4. Any split of a stream gives the same frames.
// ---------------------------------------------------------------------------

/// What a connection makes of its input: each frame (canonically
/// re-encoded, so it is owned), and each error with what was skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Event {
    Frame { consumed: usize, bytes: Vec<u8> },
    Error { code: ErrorCode, op: u8, request_id: u32, skip: Skip },
}

/// A connection's input side, as the reactor would run it: accumulate the
/// bytes, decode every whole frame, skip bad frames even when their body has
/// not arrived yet, and stop at a lost boundary.
struct RequestInput {
    buf: Vec<u8>,
    /// Bytes of a skipped frame still to arrive and be dropped.
    discard_bytes: usize,
    closed: bool,
    events: Vec<Event>,
}

impl RequestInput {
    fn new() -> RequestInput {
        RequestInput { buf: Vec::new(), discard_bytes: 0, closed: false, events: Vec::new() }
    }

    fn feed(&mut self, mut bytes: &[u8], limits: &DecodeLimits) {
        if self.closed {
            return;
        }
        let dropped = self.discard_bytes.min(bytes.len());
        self.discard_bytes -= dropped;
        bytes = &bytes[dropped..];
        self.buf.extend_from_slice(bytes);
        while !self.buf.is_empty() {
            match decode_request(&self.buf, limits, 1) {
                Ok(Decoded::Frame(frame, consumed)) => {
                    let bytes = encode(frame.request_id, &frame.request);
                    self.events.push(Event::Frame { consumed, bytes });
                    self.buf.drain(..consumed);
                }
                Ok(Decoded::NeedMore) => return,
                Err(e) => {
                    self.events.push(Event::Error { code: e.code, op: e.op, request_id: e.request_id, skip: e.skip });
                    match e.skip {
                        Skip::Bytes(n) if n <= self.buf.len() => {
                            self.buf.drain(..n);
                        }
                        Skip::Bytes(n) => {
                            self.discard_bytes = n - self.buf.len();
                            self.buf.clear();
                        }
                        Skip::Close => {
                            self.closed = true;
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// A valid request under SMALL, of a random shape.
fn random_request_frame(rng: &mut Rng) -> Vec<u8> {
    let request_id = rng.next_u64() as u32;
    let topic = rng.topic();
    let payloads: Vec<Vec<u8>> = (0..rng.range(1, SMALL.batch_messages_max as usize))
        .map(|_| {
            let len = if rng.one_in(4) { SMALL.message_bytes_max as usize } else { rng.range(0, 20) };
            rng.bytes(len)
        })
        .collect();
    let batch = batch_bytes(&payloads);
    let ids: Vec<u64> = (0..rng.range(1, SMALL.batch_messages_max as usize)).map(|_| rng.next_u64()).collect();
    let ids = ids_bytes(&ids);
    let ids = Ids { bytes: &ids };
    let token_len = rng.range(0, 24);
    let token = rng.bytes(token_len);
    let req = match rng.pick(&ALL_OPS) {
        op::HELLO => {
            Request::Hello { min_version: rng.next_u64() as u16, max_version: rng.next_u64() as u16, token: &token }
        }
        op::PING => Request::Ping,
        op::PRODUCE => Request::Produce {
            flags: 0,
            topic: &topic,
            batch: Batch { count: payloads.len() as u32, bytes: &batch, with_props: false },
        },
        op::FETCH => Request::Fetch {
            topic: &topic,
            group: "",
            max_messages: rng.next_u64() as u32,
            max_bytes: rng.next_u64() as u32,
            wait_ms: rng.next_u64() as u32,
            ack_timeout_ms: rng.next_u64() as u32,
        },
        op::ACK => Request::Ack { topic: &topic, group: "", ids },
        op::NACK => Request::Nack {
            topic: &topic,
            group: "",
            delay_ms: rng.next_u64() as u32,
            flags: rng.pick(&[0, NACK_FLAG_DEAD_LETTER]),
            ids,
            reason: "",
        },
        op::TOUCH => Request::Touch { topic: &topic, group: "", ack_timeout_ms: rng.next_u64() as u32, ids },
        op::STATS => Request::Stats { topic: if rng.one_in(3) { "" } else { &topic } },
        op::CREATE_TOPIC => Request::CreateTopic {
            topic: &topic,
            settings: TopicSettings { ack_timeout_ms: rng.next_u64() as u32, max_deliveries: rng.next_u64() as u16 },
            options: Default::default(),
        },
        op::DELETE_TOPIC => Request::DeleteTopic { topic: &topic },
        op::PURGE_TOPIC => Request::PurgeTopic { topic: &topic },
        op::LIST_TOPICS => Request::ListTopics,
        op::REDRIVE => Request::Redrive { topic: &topic, group: "", max_messages: rng.next_u64() as u32 },
        other => unreachable!("op 0x{other:02x}"),
    };
    encode(request_id, &req)
}

/// A request the decoder refuses but can skip, and the error it must give.
fn random_bad_request(rng: &mut Rng) -> (Vec<u8>, Event) {
    let request_id = rng.next_u64() as u32;
    let (frame, code) = match rng.below(5) {
        0 => {
            let op = rng.pick(&[0x00, 0x03, 0x15, 0x40, 0x7f]);
            let len = rng.range(0, 20);
            (raw_frame(op, 0, 0, request_id, &rng.bytes(len)), ErrorCode::UnknownOp)
        }
        1 => (encode(request_id, &request_with_topic(op::DELETE_TOPIC, "bad topic")), ErrorCode::BadTopic),
        2 => {
            let batch = batch_bytes(&[vec![1; SMALL.message_bytes_max as usize + 1]]);
            let req =
                Request::Produce { flags: 0, topic: "t", batch: Batch { count: 1, bytes: &batch, with_props: false } };
            (encode(request_id, &req), ErrorCode::MessageTooLarge)
        }
        3 => (raw_frame(op::PING, 0, 0, request_id, b"xyz"), ErrorCode::Malformed),
        _ => {
            // Too large: its body must be dropped as it arrives.
            let frame_bytes = SMALL.frame_bytes_max as usize + rng.range(1, 300);
            (raw_frame(op::PRODUCE, 0, 0, request_id, &rng.bytes(frame_bytes - HEADER_BYTES)), ErrorCode::FrameTooLarge)
        }
    };
    let event = Event::Error { code, op: frame[4], request_id, skip: Skip::Bytes(frame.len()) };
    (frame, event)
}

/// Random piece sizes that add up to `total`; the largest piece varies per
/// call, from a byte at a time to most of the stream.
fn random_pieces(rng: &mut Rng, total: usize) -> Vec<usize> {
    let piece_max = rng.pick(&[1, 2, 3, 7, 12, 13, 64, 700, 5000]);
    let mut pieces = Vec::new();
    let mut left = total;
    while left > 0 {
        let piece = rng.range(1, piece_max).min(left);
        pieces.push(piece);
        left -= piece;
    }
    pieces
}

#[test]
fn any_split_of_a_request_stream_gives_the_same_frames() {
    for seed in seeds(1000) {
        let _guard = seed_guard("any_split_of_a_request_stream_gives_the_same_frames", seed);
        let mut rng = Rng::new(seed);
        let mut stream = Vec::new();
        let mut want = Vec::new();
        for _ in 0..rng.range(1, 40) {
            let (frame, event) = if rng.one_in(8) {
                random_bad_request(&mut rng)
            } else {
                let frame = random_request_frame(&mut rng);
                (frame.clone(), Event::Frame { consumed: frame.len(), bytes: frame })
            };
            stream.extend_from_slice(&frame);
            want.push(event);
        }
        if rng.one_in(4) {
            // A length below the minimum: the boundary is lost, and nothing
            // after it may be decoded.
            let len = rng.range(0, 7) as u32;
            stream.extend_from_slice(&len.to_le_bytes());
            stream.extend_from_slice(&random_request_frame(&mut rng));
            want.push(Event::Error { code: ErrorCode::Malformed, op: 0, request_id: 0, skip: Skip::Close });
        }

        let mut whole = RequestInput::new();
        whole.feed(&stream, &SMALL);
        assert_eq!(whole.events, want, "seed {seed}: the whole stream at once");

        let pieces = random_pieces(&mut rng, stream.len());
        let mut split = RequestInput::new();
        let mut at = 0;
        for piece in &pieces {
            split.feed(&stream[at..at + piece], &SMALL);
            at += piece;
        }
        assert_eq!(split.events, whole.events, "seed {seed}: split into {} pieces", pieces.len());
        if !split.closed {
            assert_eq!((split.buf.len(), split.discard_bytes), (0, 0), "seed {seed}: bytes left over");
        }
        assert_eq!(split.closed, whole.closed, "seed {seed}");
    }
}

/// A valid reply of a random shape, appended to `out`.
fn random_reply_frame(rng: &mut Rng, out: &mut Vec<u8>) {
    let request_id = rng.next_u64() as u32;
    match rng.below(10) {
        0 => {
            let limits = DecodeLimits {
                frame_bytes_max: rng.next_u64() as u32,
                message_bytes_max: rng.next_u64() as u32,
                batch_messages_max: rng.next_u64() as u32,
                topic_name_bytes_max: rng.next_u64() as u32,
                ..DecodeLimits::CLIENT
            };
            encode_hello_reply(out, request_id, rng.next_u64() as u16, &limits, 0);
        }
        1 => encode_empty_reply(out, op::PING, request_id),
        2 => encode_produce_reply(out, request_id, rng.next_u64(), rng.next_u64() as u32),
        3 => {
            let op = rng.pick(&[op::ACK, op::NACK, op::TOUCH]);
            let failed: Vec<u64> = (0..rng.below(6)).map(|_| rng.next_u64()).collect();
            encode_ids_reply(out, op, request_id, rng.next_u64() as u32, &failed);
        }
        4 => {
            let op = rng.pick(&[op::DELETE_TOPIC, op::PURGE_TOPIC, op::REDRIVE, op::CREATE_TOPIC]);
            encode_u64_reply(out, op, request_id, rng.next_u64());
        }
        5 => {
            let code = rng.pick(&ALL_ERROR_CODES);
            let len = rng.range(0, 40);
            let message = rng.ascii(len);
            encode_error(out, rng.below(0x80) as u8, request_id, code, &message);
        }
        6 | 7 => random_messages_reply(rng, out, request_id),
        8 => random_stats_reply(rng, out, request_id),
        _ => {
            let topics: Vec<(String, TopicSettings)> = (0..rng.below(5))
                .map(|_| {
                    let settings =
                        TopicSettings { ack_timeout_ms: rng.next_u64() as u32, max_deliveries: rng.next_u64() as u16 };
                    (rng.topic(), settings)
                })
                .collect();
            let topics: Vec<(&str, TopicSettings)> = topics.iter().map(|(n, s)| (n.as_str(), *s)).collect();
            encode_topics_reply(out, request_id, &topics);
        }
    }
}

/// A FETCH reply of up to five random messages, some dead letters.
fn random_messages_reply(rng: &mut Rng, out: &mut Vec<u8>, request_id: u32) {
    let topic = rng.topic();
    let mut w = MessagesWriter::begin(out, request_id, &topic, 1);
    for _ in 0..rng.below(6) {
        let len = rng.range(0, 30);
        let payload = rng.bytes(len);
        let dead = rng.one_in(3).then(|| DeadInfo {
            origin_id: rng.next_u64(),
            origin_deliveries: rng.next_u64() as u16,
            reason: DeadReason::from_u8(rng.range(1, 4) as u8).expect("reasons are 1..=4"), // ok: test code, on the test's own data
        });
        let m = Message {
            id: rng.next_u64(),
            born_ms: rng.next_u64(),
            delivery_count: rng.next_u64() as u16,
            dead,
            payload: &payload,
            origin_group: "",
            props: Props::EMPTY,
        };
        w.push(out, &m);
    }
    w.finish(out);
}

/// A STATS reply of up to three random sections of random counters.
fn random_stats_reply(rng: &mut Rng, out: &mut Vec<u8>, request_id: u32) {
    let mut w = StatsWriter::begin(out, request_id);
    for _ in 0..rng.below(4) {
        let name = if rng.one_in(3) { String::new() } else { rng.topic() };
        w.section(out, &name);
        for _ in 0..rng.below(5) {
            let len = rng.range(0, 20);
            let key = rng.ascii(len);
            w.kv(out, &key, rng.next_u64());
        }
    }
    w.finish(out);
}

/// Decodes replies from `stream` fed in `pieces`, as a client would; each
/// reply becomes its consumed length and its Debug text (owned).
fn decode_reply_stream(stream: &[u8], pieces: &[usize]) -> Vec<String> {
    let mut buf = Vec::new();
    let mut got = Vec::new();
    let mut at = 0;
    for piece in pieces {
        buf.extend_from_slice(&stream[at..at + piece]);
        at += piece;
        loop {
            match decode_reply(&buf, usize::MAX) {
                Ok(Decoded::Frame(reply, n)) => {
                    got.push(format!("{n} {reply:?}"));
                    buf.drain(..n);
                }
                Ok(Decoded::NeedMore) => break,
                Err(e) => {
                    got.push(format!("error: {e}"));
                    return got;
                }
            }
        }
    }
    if !buf.is_empty() {
        got.push(format!("{} bytes left over", buf.len()));
    }
    got
}

#[test]
fn any_split_of_a_reply_stream_gives_the_same_replies() {
    for seed in seeds(1000) {
        let _guard = seed_guard("any_split_of_a_reply_stream_gives_the_same_replies", seed);
        let mut rng = Rng::new(seed);
        let mut stream = Vec::new();
        let mut want = Vec::new();
        for _ in 0..rng.range(1, 40) {
            let start = stream.len();
            random_reply_frame(&mut rng, &mut stream);
            let (reply, n) = reply_ok(&stream[start..]);
            assert_eq!(n, stream.len() - start, "seed {seed}: consumed");
            want.push(format!("{n} {reply:?}"));
        }
        assert_eq!(decode_reply_stream(&stream, &[stream.len()]), want, "seed {seed}: the whole stream at once");
        let pieces = random_pieces(&mut rng, stream.len());
        assert_eq!(decode_reply_stream(&stream, &pieces), want, "seed {seed}: split into {} pieces", pieces.len());
    }
}

// ---------------------------------------------------------------------------
// 5. Errors, each with its code and Skip.
// ---------------------------------------------------------------------------

#[test]
fn a_length_below_the_minimum_loses_the_boundary() {
    for len in 0..8u32 {
        let mut buf = len.to_le_bytes().to_vec();
        // Decided as soon as the length field is there, and with a header.
        for _ in 0..2 {
            let e = decode_err(&buf, &SMALL);
            assert_eq!((e.code, e.skip, e.op, e.request_id), (ErrorCode::Malformed, Skip::Close, 0, 0), "len {len}");
            assert!(decode_reply(&buf, usize::MAX).is_err(), "reply with len {len}");
            buf.extend_from_slice(&[op::PING, 0, 0, 0, 1, 2, 3, 4]);
        }
    }
    // Fewer than 4 bytes cannot say anything yet.
    for k in 0..4 {
        assert_eq!(decode_request(&[0u8; 3][..k], &SMALL, 1), Ok(Decoded::NeedMore));
        assert_eq!(decode_reply(&[0u8; 3][..k], usize::MAX), Ok(Decoded::NeedMore));
    }
}

#[test]
fn a_frame_too_large_is_refused_from_its_header() {
    let limits = DecodeLimits { frame_bytes_max: 100, ..SMALL };
    // HELLO with a token of 82 bytes is exactly frame_bytes_max.
    let fits = encode(1, &Request::Hello { min_version: 1, max_version: 1, token: &[b'x'; 82] });
    assert_eq!(fits.len(), 100);
    assert_eq!(decode_ok(&fits, &limits).1, 100);
    for k in 0..fits.len() {
        assert_eq!(decode_request(&fits[..k], &limits, 1), Ok(Decoded::NeedMore), "prefix of {k}");
    }

    let big = encode(0xdead_beef, &Request::Hello { min_version: 1, max_version: 1, token: &[b'x'; 83] });
    assert_eq!(big.len(), 101);
    for k in 0..HEADER_BYTES {
        assert_eq!(decode_request(&big[..k], &limits, 1), Ok(Decoded::NeedMore), "prefix of {k}");
    }
    for k in HEADER_BYTES..=big.len() {
        let e = decode_err(&big[..k], &limits);
        let want = (ErrorCode::FrameTooLarge, Skip::Bytes(101), op::HELLO, 0xdead_beef);
        assert_eq!((e.code, e.skip, e.op, e.request_id), want, "with {k} bytes");
    }

    // The largest length the field can hold, even under the loosest limits.
    let mut huge = raw_frame(op::PRODUCE, 0, 0, 77, &[]);
    huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    for limits in [SMALL, default_limits(), DecodeLimits::CLIENT] {
        let e = decode_err(&huge, &limits);
        let want = (ErrorCode::FrameTooLarge, Skip::Bytes(u32::MAX as usize + 4), op::PRODUCE, 77);
        assert_eq!((e.code, e.skip, e.op, e.request_id), want, "{limits:?}");
    }

    // Too large wins over whatever else is wrong with the frame.
    let mut odd = raw_frame(0x7f | REPLY_BIT, 9, 0xffff, 78, &[]);
    odd[..4].copy_from_slice(&200u32.to_le_bytes());
    let e = decode_err(&odd, &limits);
    assert_eq!((e.code, e.skip, e.op, e.request_id), (ErrorCode::FrameTooLarge, Skip::Bytes(204), 0xff, 78));

    // The client's limit on replies works the same way.
    let mut reply = Vec::new();
    encode_topics_reply(&mut reply, 1, &[("orders", TopicSettings::default())]);
    assert_eq!(reply_ok(&reply).1, reply.len());
    assert!(matches!(decode_reply(&reply, reply.len()), Ok(Decoded::Frame(_, _))));
    assert!(decode_reply(&reply[..HEADER_BYTES], reply.len() - 1).is_err());
    assert_eq!(decode_reply(&reply[..HEADER_BYTES - 1], reply.len() - 1), Ok(Decoded::NeedMore));
}

#[test]
fn an_unknown_op_is_skipped() {
    let known: BTreeSet<u8> = ALL_OPS.into_iter().collect();
    let mut unknown = 0;
    for op in 0..REPLY_BIT {
        if known.contains(&op) {
            continue;
        }
        unknown += 1;
        for body in [&b""[..], &b"\x05\x00hello"[..], &[0xffu8; 40][..]] {
            let frame = raw_frame(op, 0, 0, 0x0a0b_0c0d, body);
            assert_refused(&frame, &SMALL, ErrorCode::UnknownOp, &format!("op 0x{op:02x}"));
            // Nor may it pass for a reply.
            assert!(decode_reply(&frame, usize::MAX).is_err());
        }
    }
    assert_eq!(unknown, 128 - ALL_OPS.len());
}

#[test]
fn a_request_header_has_no_reply_bit_status_or_flags() {
    let samples = Samples::new();
    for (name, frame) in samples.frames() {
        let mut bad = frame.clone();
        bad[4] |= REPLY_BIT;
        assert_refused(&bad, &SMALL, ErrorCode::Malformed, &format!("{name} with the reply bit"));
        for status in [1, 0x80, 0xff] {
            let mut bad = frame.clone();
            bad[5] = status;
            assert_refused(&bad, &SMALL, ErrorCode::Malformed, &format!("{name} with status {status}"));
        }
        for flags in [1u16, 0x0100, 0x8000, 0xffff] {
            let mut bad = frame.clone();
            bad[6..8].copy_from_slice(&flags.to_le_bytes());
            assert_refused(&bad, &SMALL, ErrorCode::Malformed, &format!("{name} with flags {flags:#x}"));
        }
    }
    // An unknown op with the reply bit fails on the header first.
    assert_refused(&raw_frame(0xff, 0, 0, 1, &[]), &SMALL, ErrorCode::Malformed, "op 0xff");
}

#[test]
fn a_message_over_message_bytes_max_is_refused() {
    let max = SMALL.message_bytes_max as usize;
    let over = vec![1u8; max + 1];
    let cases: [(&str, Vec<Vec<u8>>); 3] = [
        ("one over", vec![over.clone()]),
        ("last over", vec![b"ok".to_vec(), vec![2; max], over.clone()]),
        ("first over", vec![over.clone(), b"ok".to_vec()]),
    ];
    for (name, payloads) in cases {
        let batch = batch_bytes(&payloads);
        let req = Request::Produce {
            flags: 0,
            topic: "t",
            batch: Batch { count: payloads.len() as u32, bytes: &batch, with_props: false },
        };
        assert_refused(&encode(3, &req), &SMALL, ErrorCode::MessageTooLarge, name);
    }
    // The limit is checked before the payload is looked for.
    let frame = raw_frame(op::PRODUCE, 0, 0, 4, &[1, 0, b't', 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
    assert_refused(&frame, &SMALL, ErrorCode::MessageTooLarge, "length u32::MAX, no payload");
    let frame = raw_frame(op::PRODUCE, 0, 0, 4, &[1, 0, b't', 1, 0, 0, 0, max as u8 + 1, 0, 0, 0, 1, 2]);
    assert_refused(&frame, &SMALL, ErrorCode::MessageTooLarge, "over, and cut short");
    // A limit of 0 still takes empty messages.
    let zero = DecodeLimits { message_bytes_max: 0, ..SMALL };
    let batch = batch_bytes(&[b""]);
    let req = Request::Produce { flags: 0, topic: "t", batch: Batch { count: 1, bytes: &batch, with_props: false } };
    assert_eq!(decode_ok(&encode(5, &req), &zero).0.request, req);
    let batch = batch_bytes(&[b"x"]);
    let req = Request::Produce { flags: 0, topic: "t", batch: Batch { count: 1, bytes: &batch, with_props: false } };
    assert_refused(&encode(5, &req), &zero, ErrorCode::MessageTooLarge, "1 byte over a limit of 0");
}

#[test]
fn a_batch_of_none_or_too_many_is_refused() {
    // Room for 1000 messages in a frame, so only the count can be wrong.
    let limits = DecodeLimits { frame_bytes_max: 1 << 20, ..SMALL };
    let max = limits.batch_messages_max as usize;
    for count in [0, max + 1, 1000] {
        let payloads = vec![b"m".to_vec(); count];
        let batch = batch_bytes(&payloads);
        let req = Request::Produce {
            flags: 0,
            topic: "t",
            batch: Batch { count: count as u32, bytes: &batch, with_props: false },
        };
        assert_refused(&encode(6, &req), &limits, ErrorCode::BatchTooLarge, &format!("{count} messages"));

        let ids = ids_bytes(&vec![9; count]);
        let ids = Ids { bytes: &ids };
        for req in [
            Request::Ack { topic: "t", group: "", ids },
            Request::Nack { topic: "t", group: "", delay_ms: 0, flags: 0, ids, reason: "" },
            Request::Touch { topic: "t", group: "", ack_timeout_ms: 0, ids },
        ] {
            let what = format!("op 0x{:02x} with {count} ids", req.op());
            assert_refused(&encode(7, &req), &limits, ErrorCode::BatchTooLarge, &what);
        }
    }
    // The count is checked before the messages are looked for.
    let frame = raw_frame(op::PRODUCE, 0, 0, 8, &[1, 0, b't', 0xff, 0xff, 0xff, 0xff]);
    assert_refused(&frame, &SMALL, ErrorCode::BatchTooLarge, "u32::MAX messages, none there");
    let frame = raw_frame(op::ACK, 0, 0, 8, &[1, 0, b't', 0xff, 0xff, 0xff, 0xff]);
    assert_refused(&frame, &SMALL, ErrorCode::BatchTooLarge, "u32::MAX ids, none there");
    // Under limits that allow that many, the frame is merely short.
    assert_refused(&frame, &DecodeLimits::CLIENT, ErrorCode::Malformed, "u32::MAX ids, client limits");
    let frame = raw_frame(op::PRODUCE, 0, 0, 8, &[1, 0, b't', 0xff, 0xff, 0xff, 0xff]);
    assert_refused(&frame, &DecodeLimits::CLIENT, ErrorCode::Malformed, "u32::MAX messages, client limits");
}

#[test]
fn bad_topic_names_are_refused() {
    let too_long = "a".repeat(SMALL.topic_name_bytes_max as usize + 1);
    let dlq_too_long = format!("{}.dlq", too_long);
    let not_dlq = format!("{}.DLQ", "a".repeat(SMALL.topic_name_bytes_max as usize - 3));
    let bad = [
        "",
        " ",
        "has space",
        "a/b",
        "../etc",
        "tab\t",
        "nul\0",
        "é",
        "semi;colon",
        "x:y",
        "star*",
        too_long.as_str(),
        dlq_too_long.as_str(),
        not_dlq.as_str(),
    ];
    for op in TOPIC_OPS {
        for name in bad {
            if op == op::STATS && name.is_empty() {
                continue;
            }
            let frame = encode(11, &request_with_topic(op, name));
            assert_refused(&frame, &SMALL, ErrorCode::BadTopic, &format!("op 0x{op:02x}, topic {name:?}"));
        }
        // Not UTF-8 at all.
        let mut frame = encode(12, &request_with_topic(op, "ab"));
        frame[14..16].copy_from_slice(&[0xff, 0x80]);
        assert_refused(&frame, &SMALL, ErrorCode::BadTopic, &format!("op 0x{op:02x}, topic ff 80"));
    }
}

#[test]
fn good_topic_names_are_taken_up_to_the_limit() {
    let almost_dlq = format!("{}.dlq", "a".repeat(SMALL.topic_name_bytes_max as usize - 3));
    let good =
        ["a", "Z", "0", "A-Z_a.z-09", ".dlq", "orders.dlq", LONGEST_TOPIC, LONGEST_DLQ_TOPIC, almost_dlq.as_str()];
    for op in TOPIC_OPS {
        for name in good {
            let req = request_with_topic(op, name);
            let frame = encode(13, &req);
            assert_eq!(decode_ok(&frame, &SMALL).0.request, req, "op 0x{op:02x}, topic {name:?}");
        }
    }
    assert_eq!(check_topic_name(LONGEST_TOPIC.as_bytes(), 16), Ok(LONGEST_TOPIC));
    assert_eq!(check_topic_name(LONGEST_DLQ_TOPIC.as_bytes(), 16), Ok(LONGEST_DLQ_TOPIC));
    assert!(check_topic_name(LONGEST_TOPIC.as_bytes(), 15).is_err());
    assert!(check_topic_name(LONGEST_DLQ_TOPIC.as_bytes(), 15).is_err());
    assert!(check_topic_name(b"", 16).is_err());
    assert!(check_topic_name(b"a b", 16).unwrap_err().contains("0x20"));
}

#[test]
fn bytes_after_the_body_are_refused() {
    let samples = Samples::new();
    for (name, frame) in samples.frames() {
        for extra in [&[0u8][..], &[0xffu8; 8][..]] {
            let mut body = frame[HEADER_BYTES..].to_vec();
            body.extend_from_slice(extra);
            let bad = with_body(&frame, &body);
            assert_refused(&bad, &SMALL, ErrorCode::Malformed, &format!("{name} + {} bytes", extra.len()));
        }
    }
    // A batch or id list with more than its count says.
    let two = batch_bytes(&[b"a", b"b"]);
    let req = Request::Produce { flags: 0, topic: "t", batch: Batch { count: 1, bytes: &two, with_props: false } };
    assert_refused(&encode(14, &req), &SMALL, ErrorCode::Malformed, "2 messages, count 1");
}

#[test]
fn a_body_cut_short_is_refused() {
    let samples = Samples::new();
    for (name, frame) in samples.frames() {
        let body = &frame[HEADER_BYTES..];
        // Every field is fixed or length-prefixed, so no strict prefix of a
        // valid body is valid; and none reaches a limit the whole does not.
        for k in 0..body.len() {
            let bad = with_body(&frame, &body[..k]);
            assert_refused(&bad, &SMALL, ErrorCode::Malformed, &format!("{name} cut to {k} body bytes"));
        }
    }
    // A batch or id list with fewer than its count says.
    let one = batch_bytes(&[b"a"]);
    let req = Request::Produce { flags: 0, topic: "t", batch: Batch { count: 2, bytes: &one, with_props: false } };
    assert_refused(&encode(15, &req), &SMALL, ErrorCode::Malformed, "1 message, count 2");
    let frame = raw_frame(op::ACK, 0, 0, 15, &[1, 0, b't', 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
    assert_refused(&frame, &SMALL, ErrorCode::Malformed, "1 id, count 2");
    // A topic or token length past the end of the frame.
    let frame = raw_frame(op::DELETE_TOPIC, 0, 0, 16, &[0xff, 0xff, b't']);
    assert_refused(&frame, &SMALL, ErrorCode::Malformed, "topic length past the end");
    let frame = raw_frame(op::HELLO, 0, 0, 16, &[1, 0, 1, 0, 5, 0, b't']);
    assert_refused(&frame, &SMALL, ErrorCode::Malformed, "token length past the end");
}

#[test]
fn unknown_nack_flags_are_refused() {
    let ids = ids_bytes(&[1]);
    for flags in [0x02, 0x03, 0x80, 0xff] {
        let req = Request::Nack { topic: "t", group: "", delay_ms: 0, flags, ids: Ids { bytes: &ids }, reason: "" };
        assert_refused(&encode(17, &req), &SMALL, ErrorCode::Malformed, &format!("flags {flags:#x}"));
    }
}

/// docs/protocol.md, "Replies may grow": a client ignores bytes after the
/// last field of a reply's layout (STATS excepted: its sections run to the
/// end of the body), and the reply after it still decodes from its start.
#[test]
fn bytes_past_a_replys_layout_are_ignored() {
    let mut out = Vec::new();
    let samples = encode_reply_samples(&mut out);
    for (name, range, want) in &samples {
        let frame = &out[range.clone()];
        if frame[4] == op::STATS | REPLY_BIT && frame[5] == 0 {
            continue;
        }
        for extra in [&[0u8][..], &[0xde, 0xad, 0xbe, 0xef, 0x01]] {
            let mut body = frame[HEADER_BYTES..].to_vec();
            body.extend_from_slice(extra);
            let mut stream = with_body(frame, &body);
            let longer = stream.len();
            let mut next = Vec::new();
            encode_empty_reply(&mut next, op::PING, 99);
            stream.extend_from_slice(&next);
            match decode_reply(&stream, usize::MAX) {
                Ok(Decoded::Frame(got, n)) => {
                    assert_eq!((&got, n), (want, longer), "{name} + {} bytes", extra.len());
                }
                other => panic!("{name} + {} bytes: {other:?}", extra.len()),
            }
            let got = decode_reply(&stream[longer..], usize::MAX);
            assert_eq!(got, Ok(Decoded::Frame(ReplyFrame { op: op::PING, request_id: 99, reply: Reply::Pong }, 12)));
        }
    }
}

#[test]
fn malformed_replies_are_errors() {
    let mut out = Vec::new();
    let samples = encode_reply_samples(&mut out);
    for (name, range, _) in &samples {
        let frame = &out[range.clone()];
        let body = &frame[HEADER_BYTES..];
        // A STATS reply is a list of sections up to the end of the frame,
        // so a cut at a section boundary is still a (shorter) reply, and a
        // byte after it is the start of a section that is not all there.
        let stats = frame[4] == op::STATS | REPLY_BIT && frame[5] == 0;
        if stats {
            let mut longer = body.to_vec();
            longer.push(0);
            assert!(decode_reply(&with_body(frame, &longer), usize::MAX).is_err(), "{name} + 1 byte");
        }
        for k in 0..body.len() {
            let cut = with_body(frame, &body[..k]);
            let result = decode_reply(&cut, usize::MAX);
            assert!(stats || result.is_err(), "{name} cut to {k} body bytes: {result:?}");
        }
        let mut request = frame.to_vec();
        request[4] &= !REPLY_BIT;
        assert!(decode_reply(&request, usize::MAX).is_err(), "{name} without the reply bit");
    }
    // Fields with values no encoder writes.
    let mut w = Vec::new();
    let mut m = MessagesWriter::begin(&mut w, 1, "t", 1);
    m.push(&mut w, &MESSAGES[2]);
    m.finish(&mut w);
    let reason_at = w.len() - 4 - MESSAGES[2].payload.len() - 1;
    assert_eq!(w[reason_at], DeadReason::AckTimeout as u8);
    for reason in [0, 5, 0xff] {
        w[reason_at] = reason;
        assert!(decode_reply(&w, usize::MAX).is_err(), "dead reason {reason}");
    }
    let mut w = Vec::new();
    encode_topics_reply(&mut w, 1, &[("ab", TopicSettings::default())]);
    w[HEADER_BYTES + 6..HEADER_BYTES + 8].copy_from_slice(&[0xff, 0xfe]);
    assert!(decode_reply(&w, usize::MAX).is_err(), "topic name not UTF-8");
    let frame = raw_frame(0x7f | REPLY_BIT, 0, 0, 1, &[]);
    assert!(decode_reply(&frame, usize::MAX).is_err(), "OK reply to an unknown op");
}

#[test]
fn reply_flags_are_ignored() {
    // docs/protocol.md: flags are reserved, and clients ignore them in
    // replies, but for the bit that announces a PRODUCE reply's duplicates
    // (version 4).
    let mut out = Vec::new();
    let samples = encode_reply_samples(&mut out);
    for (name, range, want) in &samples {
        for flags in [1u16, 0x8000, 0xffff] {
            let mut frame = out[range.clone()].to_vec();
            if frame[4] == op::PRODUCE | REPLY_BIT && flags & REPLY_FLAG_DUPLICATES != 0 {
                continue;
            }
            frame[6..8].copy_from_slice(&flags.to_le_bytes());
            assert_eq!(reply_ok(&frame), (want.clone(), frame.len()), "{name} with flags {flags:#x}");
        }
    }
}

#[test]
fn a_produce_reply_flagged_with_no_duplicates_reads_as_the_plain_reply() {
    // The broker sets the bit only with a duplicate; bytes that set it with
    // a count of 0 mean what the plain reply means, so that what a client
    // decodes re-encodes to the same reply (found by the `decode` fuzzer).
    let mut out = Vec::new();
    let start = begin_frame(&mut out, op::PRODUCE | REPLY_BIT, 0, 9);
    put_u64(&mut out, 7);
    put_u32(&mut out, 2);
    put_u32(&mut out, 0);
    out[start + 6..start + 8].copy_from_slice(&REPLY_FLAG_DUPLICATES.to_le_bytes());
    end_frame(&mut out, start);
    assert_eq!(reply_ok(&out).0.reply, Reply::Produced { first_id: 7, count: 2 });
}

// ---------------------------------------------------------------------------
// 6. Garbage never panics, and what the decoders say agrees with the bytes.
// ---------------------------------------------------------------------------

/// Decodes `buf` as a request and checks the answer against the bytes.
fn check_request(buf: &[u8], limits: &DecodeLimits, seed: u64) {
    let result = decode_request(buf, limits, 1);
    let whole_header = buf.len() >= HEADER_BYTES;
    match &result {
        Ok(Decoded::Frame(frame, n)) => {
            let n = *n;
            assert!((HEADER_BYTES..=buf.len()).contains(&n), "seed {seed}: consumed {n} of {}", head(buf));
            assert_eq!(n, claimed_frame_bytes(buf), "seed {seed}: consumed other than the length field says");
            // The decoder takes only canonical frames: encoding what it
            // returns gives back exactly the bytes it consumed.
            assert_eq!(encode(frame.request_id, &frame.request), buf[..n], "seed {seed}: not canonical");
            // And it did not look past them.
            assert_eq!(decode_request(&buf[..n], limits, 1), result, "seed {seed}: depends on bytes after the frame");
        }
        Ok(Decoded::NeedMore) => {
            let incomplete = !whole_header
                || (claimed_frame_bytes(buf) <= limits.frame_bytes_max as usize
                    && buf.len() < claimed_frame_bytes(buf));
            assert!(incomplete, "seed {seed}: need more, but the frame is all there: {}", head(buf));
        }
        Err(e) => {
            assert!(!e.message.is_empty(), "seed {seed}: error without a message");
            match e.skip {
                Skip::Close => {
                    assert_eq!(e.code, ErrorCode::Malformed, "seed {seed}");
                    assert!(
                        buf.len() >= 4 && claimed_frame_bytes(buf) < HEADER_BYTES,
                        "seed {seed}: closed on {}",
                        head(buf)
                    );
                }
                Skip::Bytes(n) => {
                    assert!(n >= HEADER_BYTES && whole_header, "seed {seed}: skip {n} of {}", head(buf));
                    assert_eq!(n, claimed_frame_bytes(buf), "seed {seed}: skip other than the length field says");
                    assert_eq!((e.op, e.request_id), (buf[4], LittleEndian::read_u32(&buf[8..])), "seed {seed}");
                    if e.code == ErrorCode::FrameTooLarge {
                        assert!(n > limits.frame_bytes_max as usize, "seed {seed}: {n} bytes is not too large");
                    } else {
                        assert!(n <= buf.len(), "seed {seed}: refused a frame of {n} bytes before it all came");
                        assert!(n <= limits.frame_bytes_max as usize, "seed {seed}: should be FrameTooLarge");
                    }
                }
            }
        }
    }
}

/// Decodes `buf` as a reply and checks the answer against the bytes.
fn check_reply(buf: &[u8], frame_bytes_max: usize, seed: u64) {
    let result = decode_reply(buf, frame_bytes_max);
    match &result {
        Ok(Decoded::Frame(reply, n)) => {
            let n = *n;
            assert!((HEADER_BYTES..=buf.len()).contains(&n), "seed {seed}: consumed {n} of {}", head(buf));
            assert!(n <= frame_bytes_max, "seed {seed}");
            assert_eq!(n, claimed_frame_bytes(buf), "seed {seed}");
            assert_eq!((reply.op, reply.request_id), (buf[4] & !REPLY_BIT, LittleEndian::read_u32(&buf[8..])));
            assert!(buf[4] & REPLY_BIT != 0, "seed {seed}: took a request for a reply");
            assert_eq!(decode_reply(&buf[..n], frame_bytes_max), result, "seed {seed}: looked past the frame");
        }
        Ok(Decoded::NeedMore) => {
            let incomplete = buf.len() < HEADER_BYTES || buf.len() < claimed_frame_bytes(buf);
            assert!(incomplete, "seed {seed}: need more, but the reply is all there: {}", head(buf));
        }
        Err(e) => assert!(!e.is_empty(), "seed {seed}"),
    }
}

/// One of many kinds of bad input: pure noise, plausible headers over
/// noise, and valid frames with bytes flipped, lengths changed or cut.
fn garbage(rng: &mut Rng) -> Vec<u8> {
    match rng.below(7) {
        0 => {
            let len = if rng.one_in(8) { rng.range(0, 400) } else { rng.range(0, 40) };
            rng.bytes(len)
        }
        1 => {
            // A header that fits its body, over a body that often starts
            // with a valid topic and goes on with small numbers.
            let op = rng.pick(&ALL_OPS) | if rng.one_in(2) { REPLY_BIT } else { 0 };
            let status = if rng.one_in(4) { rng.range(1, 20) as u8 } else { 0 };
            let mut body = Vec::new();
            if rng.one_in(2) {
                put_str(&mut body, rng.topic().as_bytes());
            }
            let len = rng.range(0, 60);
            body.extend_from_slice(&rng.small_bytes(len));
            raw_frame(op, status, 0, rng.next_u64() as u32, &body)
        }
        2 | 3 => {
            let mut buf = if rng.one_in(2) {
                random_request_frame(rng)
            } else {
                let mut out = Vec::new();
                random_reply_frame(rng, &mut out);
                out
            };
            for _ in 0..rng.range(1, 4) {
                let at = rng.below(buf.len());
                buf[at] ^= rng.range(1, 255) as u8;
            }
            buf
        }
        4 => {
            let mut buf = random_request_frame(rng);
            let len = match rng.below(3) {
                0 => rng.range(0, buf.len() + 16) as u32,
                1 => rng.next_u64() as u32,
                _ => (buf.len() - 4) as u32 ^ (1 << rng.below(32)),
            };
            buf[..4].copy_from_slice(&len.to_le_bytes());
            buf
        }
        5 => {
            let mut buf = Vec::new();
            random_reply_frame(rng, &mut buf);
            let len = rng.range(0, buf.len() + 16) as u32;
            buf[..4].copy_from_slice(&len.to_le_bytes());
            buf
        }
        _ => {
            // Frames back to back, cut anywhere, with noise after.
            let mut buf = random_request_frame(rng);
            random_reply_frame(rng, &mut buf);
            buf.extend_from_slice(&random_request_frame(rng));
            let cut = rng.range(0, buf.len());
            buf.truncate(cut);
            let len = rng.range(0, 8);
            buf.extend_from_slice(&rng.bytes(len));
            buf
        }
    }
}

#[test]
fn garbage_never_panics_and_the_decoders_agree_with_the_bytes() {
    let tiny = DecodeLimits {
        frame_bytes_max: 40,
        message_bytes_max: 3,
        batch_messages_max: 2,
        topic_name_bytes_max: 2,
        output_bytes_max: 1 << 20,
        fetch_bytes_max: 256,
        idle_timeout_ms: 0,
        group_name_bytes_max: 2,
        tags_per_message_max: 1,
        tag_bytes_max: 2,
        props_bytes_max: 8,
        filter_bytes_max: 4,
        subscription_credit_max: 3,
        key_bytes_max: 2,
        dedup_id_bytes_max: 5,
        nack_reason_bytes_max: 6,
        lookup_results_max: 7,
    };
    let limit_sets = [SMALL, default_limits(), DecodeLimits::CLIENT, tiny];
    for seed in seeds(1000) {
        let _guard = seed_guard("garbage_never_panics_and_the_decoders_agree_with_the_bytes", seed);
        let mut rng = Rng::new(seed);
        for _ in 0..150 {
            let buf = garbage(&mut rng);
            for limits in &limit_sets {
                check_request(&buf, limits, seed);
            }
            check_reply(&buf, usize::MAX, seed);
            check_reply(&buf, 64, seed);
        }
    }
}

#[test]
fn valid_frames_pass_the_same_checks() {
    // The property checks must hold for good input too, or they prove little.
    for seed in seeds(100) {
        let _guard = seed_guard("valid_frames_pass_the_same_checks", seed);
        let mut rng = Rng::new(seed);
        let request = random_request_frame(&mut rng);
        assert!(matches!(decode_request(&request, &SMALL, 1), Ok(Decoded::Frame(..))), "seed {seed}");
        check_request(&request, &SMALL, seed);
        let mut reply = Vec::new();
        random_reply_frame(&mut rng, &mut reply);
        assert!(matches!(decode_reply(&reply, usize::MAX), Ok(Decoded::Frame(..))), "seed {seed}");
        check_reply(&reply, usize::MAX, seed);
    }
}

// ---------------------------------------------------------------------------
// Regression cases for bugs these tests found (since fixed in codec.rs).
// ---------------------------------------------------------------------------

#[test]
fn a_stats_key_over_255_bytes_still_gives_a_valid_reply() {
    let key = "k".repeat(256);
    let mut out = Vec::new();
    let mut w = StatsWriter::begin(&mut out, 1);
    w.section(&mut out, "");
    w.kv(&mut out, &key, 7);
    w.kv(&mut out, "next", 8);
    w.finish(&mut out);
    // Cut at 255 bytes, with a length byte that says so.
    let got = decode_reply(&out, usize::MAX);
    let want = ReplyFrame {
        op: op::STATS,
        request_id: 1,
        reply: Reply::Stats(vec![("", vec![(&key[..255], 7), ("next", 8)])]),
    };
    assert_eq!(got, Ok(Decoded::Frame(want, out.len())));
}

#[test]
fn a_long_error_text_is_cut_at_a_character_boundary() {
    let message = format!("{}é", "a".repeat(u16::MAX as usize - 1));
    let mut out = Vec::new();
    encode_error(&mut out, op::PING, 1, ErrorCode::BadArgument, &message);
    // The text is cut to 65534 bytes, before the 2-byte 'é' that straddles
    // the limit. (Compared piecewise: the whole text is too long to print.)
    match decode_reply(&out, usize::MAX) {
        Ok(Decoded::Frame(ReplyFrame { op, request_id, reply: Reply::Error { code, message: got } }, n)) => {
            assert_eq!((op, request_id, code, n), (op::PING, 1, ErrorCode::BadArgument as u8, out.len()));
            assert!(got == &message[..u16::MAX as usize - 1], "text of {} bytes", got.len());
        }
        other => panic!("expected the error reply, got {:?}", other.map(|_| "another reply")),
    }
}
