//! Generates docs/vectors/protocol-v*.json, the protocol's test vectors
//! for client writers, one file per protocol version, from the codec, and
//! fails when a file in the tree is not what the codec gives.
//!
//! A vector is a frame's bytes with every field decoded: the examples of
//! docs/protocol.md (tests/common/frames.rs, the list tests/protocol_doc.rs
//! holds the doc to) and the edge cases below. Each one is checked before it
//! is written: a valid frame must decode to the frame it was built from and
//! consume all its bytes, a grown reply must decode to the same frame, and a
//! refused request must get the error code it names from the broker's own
//! decoder. The JSON is written by hand (`J` below) rather than with
//! serde_json: the crate has no serde. The files are read back the same
//! way (`json.rs`), and every frame rebuilt from its decoded fields alone
//! by an encoder of its own (`rebuild.rs`), as a client writer would.
//!
//! To add a vector: add it to one of the lists below or in `later.rs` (or,
//! for a new doc example, to `doc_frames` and the doc), then run
//! `RUNNEL_WRITE_VECTORS=1 cargo test --release --test vectors` and commit the
//! file. Without the variable the test compares and prints the first
//! difference. docs/vectors/README.md describes the format.

mod common;
#[path = "vectors/json.rs"]
mod json;
#[path = "vectors/later.rs"]
mod later;
#[path = "vectors/rebuild.rs"]
mod rebuild;

use std::fmt::Write as _;

use common::frames::*;
use runnel::codec::*;
use runnel::limits::Limits;

/// The vectors file of protocol `version`.
fn vectors_path(version: u16) -> String {
    format!("{}/docs/vectors/protocol-v{version}.json", env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------
// The vectors.
// ---------------------------------------------------------------------------

/// What a vector holds.
enum Kind {
    /// A frame as the codec encodes it.
    Frame(Expect),
    /// A reply with these bytes after its layout, which a client ignores
    /// (docs/protocol.md, "Replies may grow").
    Grown(Expect, &'static [u8]),
    /// Request bytes the broker refuses with `code`; `closes` when it also
    /// closes the connection (the frame boundary is lost).
    Refused { bytes: Vec<u8>, code: ErrorCode, closes: bool },
}

struct Vector {
    name: &'static str,
    description: &'static str,
    /// One of docs/protocol.md's examples.
    doc_example: bool,
    kind: Kind,
}

fn vector(name: &'static str, description: &'static str, kind: Kind) -> Vector {
    Vector { name, description, doc_example: false, kind }
}

fn frame(name: &'static str, description: &'static str, expect: Expect) -> Vector {
    vector(name, description, Kind::Frame(expect))
}

fn refused(name: &'static str, description: &'static str, bytes: Vec<u8>, code: ErrorCode) -> Vector {
    vector(name, description, Kind::Refused { bytes, code, closes: false })
}

/// A frame from raw parts, for bytes no encoder writes.
fn raw(op: u8, request_id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let start = begin_frame(&mut out, op, 0, request_id);
    out.extend_from_slice(body);
    end_frame(&mut out, start);
    out
}

fn encoded(request_id: u32, request: Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(&mut out, request_id, &request, 1);
    out
}

/// Valid requests and their replies beyond the doc's examples: HELLO,
/// PRODUCE, STATS and NACK.
fn more_frames() -> Vec<Vector> {
    let jobs = "jobs";
    vec![
        frame(
            "hello-token-request",
            "HELLO with a token, as a broker run with --auth-token requires; versions 1 to 2.",
            request(16, Request::Hello { min_version: 1, max_version: 2, token: b"s3cret" }),
        ),
        frame(
            "hello-version-reply",
            "An error reply to HELLO: no common version (VERSION, status 3). The connection stays open. The message text is an example.",
            error(op::HELLO, 16, ErrorCode::Version, "this broker speaks versions 1..=1"),
        ),
        vector(
            "hello-grown-reply",
            "A HELLO reply with 4 bytes after its layout, as a later broker may send: a client decodes the same fields and ignores the rest of the frame.",
            Kind::Grown(
                reply(op::HELLO, 1, Reply::Hello { version: 1, limits: limits().reported(1), map_epoch: 0 }),
                &[0, 0, 0, 2],
            ),
        ),
        frame(
            "produce-empty-payload-request",
            "PRODUCE a batch of one message with an empty payload: a message of 0 bytes is a message.",
            request(17, Request::Produce { flags: 0, topic: jobs, batch: batch(&[b""]) }),
        ),
        frame(
            "produce-empty-payload-reply",
            "Stored as id 3.",
            reply(op::PRODUCE, 17, Reply::Produced { first_id: 3, count: 1 }),
        ),
        frame(
            "stats-all-request",
            "STATS with an empty topic: the broker section and every topic.",
            request(18, Request::Stats { topic: "" }),
        ),
        frame(
            "stats-all-reply",
            "The broker section, then every topic (dead-letter topics included) in byte order of their names, each with a few keys.",
            reply(
                op::STATS,
                18,
                Reply::Stats(vec![
                    ("", vec![("topics", 2), ("output_bytes_max", 32 << 20), ("fetch_bytes_max", 8 << 20)]),
                    (jobs, vec![("ready", 1), ("next_id", 4)]),
                    ("jobs.dlq", vec![("ready", 2), ("next_id", 3)]),
                ]),
            ),
        ),
        frame(
            "nack-dead-letter-request",
            "NACK with the DEAD_LETTER flag: move message 3 to jobs.dlq at once (delay_ms is ignored).",
            request(
                19,
                Request::Nack {
                    topic: jobs,
                    group: "",
                    delay_ms: 0,
                    flags: NACK_FLAG_DEAD_LETTER,
                    ids: ids(&[3]),
                    reason: "",
                },
            ),
        ),
        frame(
            "nack-dead-letter-reply",
            "The reply to NACK: done 1, none failed.",
            reply(op::NACK, 19, Reply::Ids { done: 1, failed: vec![] }),
        ),
    ]
}

/// Edge cases of FETCH, ACK and the admin replies.
fn edge_frames() -> Vec<Vector> {
    let jobs = "jobs";
    vec![
        frame(
            "fetch-long-poll-request",
            "FETCH one message, waiting up to 1 s, with a 10 s ack timeout.",
            request(
                20,
                Request::Fetch {
                    topic: jobs,
                    group: "",
                    max_messages: 1,
                    max_bytes: 0,
                    wait_ms: 1000,
                    ack_timeout_ms: 10_000,
                },
            ),
        ),
        frame(
            "fetch-empty-reply",
            "A FETCH reply with 0 messages: the wait passed and nothing was ready.",
            reply(op::FETCH, 20, Reply::Messages { topic: jobs, messages: vec![] }),
        ),
        frame(
            "fetch-dlq-mixed-reply",
            "A FETCH reply from jobs.dlq with both message layouts: a dead letter (reason ack_timeout, empty payload, on its 3rd delivery here) and a message produced to jobs.dlq by hand, without dead-letter fields.",
            reply(
                op::FETCH,
                21,
                Reply::Messages {
                    topic: "jobs.dlq",
                    messages: vec![
                        message(
                            2,
                            3,
                            Some(DeadInfo { origin_id: 5, origin_deliveries: 16, reason: DeadReason::AckTimeout }),
                            b"",
                        ),
                        message(3, 1, None, b"by hand"),
                    ],
                },
            ),
        ),
        frame(
            "ack-duplicate-request",
            "ACK ids 9, 2 and 2 again: there is no message 9.",
            request(22, Request::Ack { topic: jobs, group: "", ids: ids(&[9, 2, 2]) }),
        ),
        frame(
            "ack-duplicate-reply",
            "Each id counts once, in done or in failed, and failed keeps the request's order: 2 is acknowledged once, and fails the second time.",
            reply(op::ACK, 22, Reply::Ids { done: 1, failed: vec![9, 2] }),
        ),
        frame(
            "create-topic-existing-reply",
            "CREATE_TOPIC of a topic that exists: created 0 (its settings are now the request's).",
            reply(op::CREATE_TOPIC, 11, Reply::Created { created: false }),
        ),
        frame(
            "list-topics-empty-reply",
            "LIST_TOPICS on a broker with no topic.",
            reply(op::LIST_TOPICS, 12, Reply::Topics(vec![])),
        ),
        frame(
            "fetch-bad-argument-reply",
            "An error reply to FETCH with max_messages 0 (BAD_ARGUMENT, status 16). The message text is an example.",
            error(op::FETCH, 25, ErrorCode::BadArgument, "max_messages must be at least 1"),
        ),
    ]
}

/// Requests the broker's decoder refuses, each a check of which error
/// wins (docs/protocol.md, "When several errors apply").
fn refusals() -> Vec<Vector> {
    let limits = DecodeLimits::from(&Limits::default());
    let jobs = "jobs";
    let empty = Batch { count: 0, bytes: &[], with_props: false };
    let mut too_large_body = Vec::new();
    put_str(&mut too_large_body, jobs.as_bytes());
    put_u32(&mut too_large_body, 1);
    put_u32(&mut too_large_body, limits.message_bytes_max + 1);
    vec![
        refused(
            "produce-empty-batch-request",
            "PRODUCE with no messages: BATCH_TOO_LARGE.",
            encoded(30, Request::Produce { flags: 0, topic: jobs, batch: empty }),
            ErrorCode::BatchTooLarge,
        ),
        refused(
            "ack-no-ids-request",
            "ACK with no ids: BATCH_TOO_LARGE.",
            encoded(31, Request::Ack { topic: jobs, group: "", ids: ids(&[]) }),
            ErrorCode::BatchTooLarge,
        ),
        refused(
            "produce-bad-topic-request",
            "PRODUCE of no messages to the topic \"no way\": BAD_TOPIC, because the topic comes before the count in the layout.",
            encoded(32, Request::Produce { flags: 0, topic: "no way", batch: empty }),
            ErrorCode::BadTopic,
        ),
        refused(
            "produce-message-too-large-request",
            "PRODUCE of one message whose length is message_bytes_max + 1: MESSAGE_TOO_LARGE, judged from the length field before the payload (which is not there).",
            raw(op::PRODUCE, 33, &too_large_body),
            ErrorCode::MessageTooLarge,
        ),
        refused(
            "nack-unknown-flag-request",
            "NACK with flags 0x02, a bit this version does not define: MALFORMED.",
            encoded(34, Request::Nack { topic: jobs, group: "", delay_ms: 0, flags: 0x02, ids: ids(&[1]), reason: "" }),
            ErrorCode::Malformed,
        ),
        refused(
            "ping-trailing-byte-request",
            "PING with one byte of body: bytes left over after the layout make a request MALFORMED.",
            raw(op::PING, 35, &[0]),
            ErrorCode::Malformed,
        ),
        refused(
            "ping-reply-bit-request",
            "A request whose op has the reply bit set (0x82): MALFORMED, not UNKNOWN_OP.",
            raw(op::PING | REPLY_BIT, 36, &[]),
            ErrorCode::Malformed,
        ),
    ]
}

/// Refused requests paired with the error replies that answer them (a pair
/// shares its name up to `-request` / `-reply`).
fn refusal_pairs() -> Vec<Vector> {
    let limits = DecodeLimits::from(&Limits::default());
    let oversized = |op: u8, rid: u32| {
        let mut header = raw(op, rid, &[]);
        header[..4].copy_from_slice(&(limits.frame_bytes_max - 3).to_le_bytes());
        header
    };
    vec![
        refused(
            "unknown-op-request",
            "A request with op 0x7f, which no version defines: UNKNOWN_OP. The connection stays usable.",
            raw(0x7f, 23, &[]),
            ErrorCode::UnknownOp,
        ),
        frame(
            "unknown-op-reply",
            "The error reply to op 0x7f: op 0xff (the request's op with the reply bit, even for UNKNOWN_OP). The message text is an example.",
            error(0x7f, 23, ErrorCode::UnknownOp, "unknown opcode 0x7f"),
        ),
        refused(
            "frame-too-large-request",
            "The header of a PRODUCE frame one byte longer than frame_bytes_max (len 8388605): the broker answers FRAME_TOO_LARGE once the header is there, discards the frame's bytes as they arrive, and goes on with the next frame.",
            oversized(op::PRODUCE, 24),
            ErrorCode::FrameTooLarge,
        ),
        frame(
            "frame-too-large-reply",
            "The error reply to an oversized frame: its op and request id. The message text is an example.",
            error(
                op::PRODUCE,
                24,
                ErrorCode::FrameTooLarge,
                "frame is 8388609 bytes, more than frame_bytes_max (8388608)",
            ),
        ),
        refused(
            "frame-too-large-unknown-op-request",
            "The header of an oversized frame with op 0x7f: FRAME_TOO_LARGE wins, because nothing else of an oversized frame is looked at.",
            oversized(0x7f, 26),
            ErrorCode::FrameTooLarge,
        ),
        vector(
            "short-len-request",
            "A frame whose len is 4, below the minimum of 8: MALFORMED, and the broker closes the connection, because the frame boundary is lost.",
            Kind::Refused { bytes: vec![4, 0, 0, 0, op::PING, 0, 0, 0], code: ErrorCode::Malformed, closes: true },
        ),
        frame(
            "short-len-reply",
            "The error reply to a frame whose len is below 8: op 0x80 and request id 0, since it answers no request. The message text is an example.",
            error(0, 0, ErrorCode::Malformed, "frame length below the 8-byte minimum; frame boundary lost"),
        ),
    ]
}

fn doc_vectors(frames: Vec<Named>) -> impl Iterator<Item = Vector> {
    frames.into_iter().map(|f| Vector {
        name: f.name,
        description: f.description,
        doc_example: true,
        kind: Kind::Frame(f.expect),
    })
}

/// Every vector of protocol `version`, the doc's examples first.
fn vectors(version: u16) -> Vec<Vector> {
    match version {
        1 => doc_vectors(doc_frames())
            .chain(more_frames())
            .chain(edge_frames())
            .chain(refusals())
            .chain(refusal_pairs())
            .collect(),
        2 => doc_vectors(doc_frames_v2()).chain(frames_v2()).chain(refusals_v2()).collect(),
        3 => doc_vectors(doc_frames_schedule())
            .chain(doc_vectors(common::push_frames::doc_frames_push()))
            .chain(refusals_schedule())
            .chain(later::refusals_v3_bits())
            .collect(),
        4 => doc_vectors(common::dedup_frames::doc_frames_dedup())
            .chain(refusals_dedup())
            .chain(doc_vectors(common::inspect_frames::doc_frames_inspect()))
            .chain(refusals_inspect())
            .chain(doc_vectors(common::retry_frames::doc_frames_retry()))
            .chain(later::frames_v4())
            .collect(),
        5 => later::frames_v5(),
        6 => doc_vectors(doc_frames_v6()).collect(),
        other => panic!("no vectors of protocol version {other}"),
    }
}

/// The protocol versions with a vectors file: every one the codec speaks.
fn versions() -> impl Iterator<Item = u16> {
    1..=CODEC_VERSION_MAX
}

/// A PRODUCE frame of version 3 or 4 (acknowledged once synced) with one
/// message, `x`, whose properties are `props` as given: the refusals'
/// requests, whose properties the encoder would not write.
fn produce_one(request_id: u32, topic: &str, props: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&(topic.len() as u16).to_le_bytes());
    body.extend_from_slice(topic.as_bytes());
    body.push(0); // flags: acknowledged once synced
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&(props.len() as u16).to_le_bytes());
    body.extend_from_slice(props);
    body.extend_from_slice(&1u32.to_le_bytes());
    body.push(b'x');
    raw(op::PRODUCE, request_id, &body)
}

/// Version-4 requests the broker's decoder refuses: an unknown topic
/// setting, a setting of the wrong size, an empty dedup id.
fn refusals_dedup() -> Vec<Vector> {
    let create = |settings: &[u8]| {
        let mut body = vec![4, 0];
        body.extend_from_slice(b"jobs");
        body.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        body.extend_from_slice(settings);
        raw(op::CREATE_TOPIC, 34, &body)
    };
    vec![
        refused(
            "create-topic-unknown-setting-request",
            "CREATE_TOPIC (version 4) with topic setting id 9, which this version does not define: BAD_ARGUMENT, never skipped.",
            create(&[9, 0, 0]),
            ErrorCode::BadArgument,
        ),
        refused(
            "create-topic-short-setting-request",
            "CREATE_TOPIC (version 4) whose dedup_window_ms setting is 2 bytes, not 4: BAD_ARGUMENT.",
            create(&[1, 2, 0, 0x10, 0x27]),
            ErrorCode::BadArgument,
        ),
        refused(
            "produce-empty-dedup-id-request",
            "PRODUCE (version 4) of a message whose dedup id is empty: BAD_ARGUMENT.",
            produce_one(35, "jobs", &[props::PROP_DEDUP_ID, 0, 0]), // an empty dedup id
            ErrorCode::BadArgument,
        ),
    ]
}

/// Version-4 requests the broker refuses: a LOOKUP with an empty key, and
/// a message with two keys.
fn refusals_inspect() -> Vec<Vector> {
    let mut lookup = Vec::new();
    lookup.extend_from_slice(&6u16.to_le_bytes());
    lookup.extend_from_slice(b"orders");
    lookup.extend_from_slice(&0u16.to_le_bytes());
    let mut keys = Vec::new();
    props::put_key(&mut keys, b"a");
    props::put_key(&mut keys, b"b");
    vec![
        refused(
            "empty-key-request",
            "A LOOKUP (version 4) with an empty key: BAD_ARGUMENT.",
            raw(op::LOOKUP, 40, &lookup),
            ErrorCode::BadArgument,
        ),
        refused(
            "two-keys-request",
            "A PRODUCE (version 4) whose message has two keys: BAD_ARGUMENT.",
            produce_one(41, "orders", &keys),
            ErrorCode::BadArgument,
        ),
    ]
}

/// Version-3 requests the broker refuses: two times on one message, a
/// time of the wrong size, and a frame with PUSH's op, with its reply.
fn refusals_schedule() -> Vec<Vector> {
    let mut delay = Vec::new();
    props::put_time(&mut delay, props::PROP_DELAY, 1000);
    let mut two = delay.clone();
    props::put_time(&mut two, props::PROP_DELIVER_AT, BORN_MS);
    let short = [props::PROP_DELAY, 4, 0, 0xe8, 0x03, 0, 0];
    vec![
        refused(
            "two-times-request",
            "A PRODUCE (version 3) whose message has both a delay_ms and a deliver_at_ms: BAD_ARGUMENT.",
            produce_one(30, "jobs", &two),
            ErrorCode::BadArgument,
        ),
        refused(
            "short-time-request",
            "A PRODUCE (version 3) whose delay_ms property is 4 bytes, not 8: MALFORMED.",
            produce_one(30, "jobs", &short),
            ErrorCode::Malformed,
        ),
        refused(
            "push-op-request",
            "A request with op 0x6f, PUSH's, which is no request: UNKNOWN_OP.",
            raw(op::PUSH, 31, &[]),
            ErrorCode::UnknownOp,
        ),
        frame(
            "push-op-reply",
            "The error reply to op 0x6f: op 0xff, not 0xef, which only a pushed frame has. The message text is an example.",
            error(op::IN_PLACE_OF_PUSH, 31, ErrorCode::UnknownOp, "unknown opcode 0x6f"),
        ),
    ]
}

fn encoded_v2(request_id: u32, request: Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(&mut out, request_id, &request, 2);
    out
}

/// Version-2 frames beyond the doc's examples.
fn frames_v2() -> Vec<Vector> {
    let (jobs, billing) = ("jobs", "billing");
    let broadcast = GroupSettings {
        broadcast: true,
        ack_timeout_ms: 5000,
        max_deliveries: 3,
        filter: r"re:^order\.",
        ordered: false,
        retry: None,
    };
    let audit = GroupStats {
        cursor: 100,
        lag: 4,
        inflight: 3,
        retry: 1,
        delayed: 0,
        dead_lettered: 0,
        oldest_unacked_age_ms: 800,
        consumers: 2,
    };
    let untagged_dead = Message {
        dead: Some(DeadInfo { origin_id: 4, origin_deliveries: 16, reason: DeadReason::AckTimeout }),
        ..message(2, 1, None, b"x")
    };
    vec![
        frame(
            "create-group-broadcast-request",
            "CREATE_GROUP audit of jobs: a broadcast group from message 100 on, a 5 s ack timeout, 3 deliveries, the tags a regular expression matches.",
            request_v2(
                14,
                Request::CreateGroup { topic: jobs, group: "audit", settings: broadcast, start: Start::Id(100) },
            ),
        ),
        frame(
            "create-group-existing-reply",
            "CREATE_GROUP of a group that exists: created 0, its settings changed, its cursor where it was.",
            reply(op::CREATE_GROUP, 14, Reply::GroupCreated { created: false, cursor: 57 }),
        ),
        frame(
            "reset-group-latest-request",
            "RESET_GROUP billing to latest: only messages produced from now on.",
            request_v2(15, Request::ResetGroup { topic: jobs, group: billing, start: Start::Latest }),
        ),
        frame(
            "fetch-default-group-v2-request",
            "FETCH (version 2) for the default group: an empty group name.",
            request_v2(
                16,
                Request::Fetch { topic: jobs, group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 },
            ),
        ),
        frame(
            "fetch-dlq-default-group-v2-reply",
            "A dead letter of the default group, without properties, in a version-2 session: byte for byte the version-1 layout (flags 1, no origin group).",
            reply(op::FETCH, 16, Reply::Messages { topic: "jobs.dlq", messages: vec![untagged_dead] }),
        ),
        frame(
            "list-groups-empty-reply",
            "LIST_GROUPS of a topic with no group yet.",
            reply(op::LIST_GROUPS, 17, Reply::Groups(vec![])),
        ),
        frame(
            "list-groups-broadcast-reply",
            "LIST_GROUPS of jobs with the broadcast group audit (flags 0x01) and its two consumers: its numbers are theirs, in flight, retry and delayed summed, lag and age the largest, the cursor the lowest.",
            reply(
                op::LIST_GROUPS,
                20,
                Reply::Groups(vec![GroupInfo { name: "audit", settings: broadcast, stats: audit }]),
            ),
        ),
        frame(
            "bad-filter-reply",
            "An error reply to CREATE_GROUP with a filter that does not parse (BAD_FILTER, status 19). The message text is an example.",
            error(op::CREATE_GROUP, 18, ErrorCode::BadFilter, "filter \"re:(\": regex parse error"),
        ),
        frame(
            "too-many-groups-reply",
            "An error reply to CREATE_GROUP past groups_per_topic_max (TOO_MANY_GROUPS, status 20). The message text is an example.",
            error(op::CREATE_GROUP, 19, ErrorCode::TooManyGroups, "topic jobs has groups_per_topic_max (64) groups"),
        ),
    ]
}

/// Version-2 requests the decoder refuses.
fn refusals_v2() -> Vec<Vector> {
    let jobs = "jobs";
    let mut unknown_type = Vec::new();
    put_str(&mut unknown_type, jobs.as_bytes());
    put_u32(&mut unknown_type, 1);
    unknown_type.extend_from_slice(&[3, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
    let mut long_tag = Vec::new();
    props::put_tag(&mut long_tag, &"t".repeat(129));
    let mut long_tag_body = Vec::new();
    put_str(&mut long_tag_body, jobs.as_bytes());
    put_u32(&mut long_tag_body, 1);
    put_u16(&mut long_tag_body, long_tag.len() as u16);
    long_tag_body.extend_from_slice(&long_tag);
    put_u32(&mut long_tag_body, 0);
    let mut bad_start = encoded_v2(42, Request::ResetGroup { topic: jobs, group: "g", start: Start::Earliest });
    let n = bad_start.len();
    bad_start[n - 8] = 1;
    let long_filter = "f".repeat(4097);
    let filter_settings = GroupSettings { filter: &long_filter, ..GroupSettings::default() };
    vec![
        refused(
            "produce-unknown-property-request",
            "PRODUCE (version 2) of a message with a property of type 3, which version 2 does not define: BAD_ARGUMENT, never skipped.",
            raw(op::PRODUCE, 40, &unknown_type),
            ErrorCode::BadArgument,
        ),
        refused(
            "produce-long-tag-request",
            "PRODUCE (version 2) of a message with a tag of tag_bytes_max + 1 bytes: BAD_ARGUMENT.",
            raw(op::PRODUCE, 41, &long_tag_body),
            ErrorCode::BadArgument,
        ),
        refused(
            "reset-group-bad-start-request",
            "RESET_GROUP to earliest (kind 0) with a start value other than 0: BAD_ARGUMENT.",
            bad_start,
            ErrorCode::BadArgument,
        ),
        refused(
            "fetch-bad-group-request",
            "FETCH (version 2) for the group \"a b\": BAD_ARGUMENT, since a group name has the topic names' alphabet.",
            encoded_v2(
                43,
                Request::Fetch {
                    topic: jobs,
                    group: "a b",
                    max_messages: 1,
                    max_bytes: 0,
                    wait_ms: 0,
                    ack_timeout_ms: 0,
                },
            ),
            ErrorCode::BadArgument,
        ),
        refused(
            "create-group-long-filter-request",
            "CREATE_GROUP with a filter of filter_bytes_max + 1 bytes: BAD_FILTER, from the decoder.",
            encoded_v2(
                44,
                Request::CreateGroup { topic: jobs, group: "g", settings: filter_settings, start: Start::Latest },
            ),
            ErrorCode::BadFilter,
        ),
    ]
}

// ---------------------------------------------------------------------------
// JSON, by hand.
// ---------------------------------------------------------------------------

/// A JSON value; object keys keep their order (the order of the layout).
enum J {
    Null,
    Bool(bool),
    Num(u64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(&'static str, J)>),
}

/// The largest integer every JSON reader holds exactly (2^53 - 1, the
/// largest a double holds exactly): no vector may carry a larger one.
const JSON_INT_MAX: u64 = (1 << 53) - 1;

fn num(v: impl Into<u64>) -> J {
    let v = v.into();
    assert!(v <= JSON_INT_MAX, "{v} is too large for a JSON number every reader holds exactly");
    J::Num(v)
}

fn text(s: &str) -> J {
    J::Str(s.to_string())
}

fn hex(bytes: &[u8]) -> J {
    J::Str(bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    }))
}

/// Objects whose one-line form is at most this long are written on one line.
const INLINE_CHARS_MAX: usize = 100;

impl J {
    fn is_scalar(&self) -> bool {
        !matches!(self, J::Arr(_) | J::Obj(_))
    }

    /// The value on one line.
    fn inline(&self) -> String {
        let mut out = String::new();
        match self {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Num(n) => out.push_str(&n.to_string()),
            J::Str(s) => write_str(&mut out, s),
            J::Arr(items) => {
                let items: Vec<String> = items.iter().map(J::inline).collect();
                out = format!("[{}]", items.join(", "));
            }
            J::Obj(fields) => {
                let fields: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\": {}", v.inline())).collect();
                out = format!("{{{}}}", fields.join(", "));
            }
        }
        out
    }

    /// The value, indented by `indent` spaces after its first line: arrays
    /// of scalars and short flat objects on one line, the rest one item a
    /// line.
    fn write(&self, out: &mut String, indent: usize) {
        let (items, open, close): (Vec<(Option<&str>, &J)>, char, char) = match self {
            J::Arr(items) if !items.iter().all(J::is_scalar) => (items.iter().map(|v| (None, v)).collect(), '[', ']'),
            J::Obj(fields) if !self.fits_one_line() => (fields.iter().map(|(k, v)| (Some(*k), v)).collect(), '{', '}'),
            _ => return out.push_str(&self.inline()),
        };
        out.push(open);
        for (i, (key, value)) in items.iter().enumerate() {
            out.push('\n');
            out.push_str(&" ".repeat(indent + 2));
            if let Some(k) = key {
                let _ = write!(out, "\"{k}\": ");
            }
            value.write(out, indent + 2);
            if i + 1 < items.len() {
                out.push(',');
            }
        }
        out.push('\n');
        out.push_str(&" ".repeat(indent));
        out.push(close);
    }

    fn fits_one_line(&self) -> bool {
        match self {
            J::Obj(fields) => fields.iter().all(|(_, v)| v.is_scalar()) && self.inline().len() <= INLINE_CHARS_MAX,
            _ => true,
        }
    }
}

/// A JSON string: quotes, backslashes and control characters escaped.
fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

// ---------------------------------------------------------------------------
// Decoded fields, as JSON.
// ---------------------------------------------------------------------------

fn op_name(op: u8) -> J {
    let name = match op {
        op::HELLO => "HELLO",
        op::PING => "PING",
        op::PRODUCE => "PRODUCE",
        op::FETCH => "FETCH",
        op::ACK => "ACK",
        op::NACK => "NACK",
        op::TOUCH => "TOUCH",
        op::STATS => "STATS",
        op::CREATE_TOPIC => "CREATE_TOPIC",
        op::DELETE_TOPIC => "DELETE_TOPIC",
        op::PURGE_TOPIC => "PURGE_TOPIC",
        op::LIST_TOPICS => "LIST_TOPICS",
        op::REDRIVE => "REDRIVE",
        op::CREATE_GROUP => "CREATE_GROUP",
        op::DELETE_GROUP => "DELETE_GROUP",
        op::LIST_GROUPS => "LIST_GROUPS",
        op::RESET_GROUP => "RESET_GROUP",
        op::SUBSCRIBE => "SUBSCRIBE",
        op::CREDIT => "CREDIT",
        op::UNSUBSCRIBE => "UNSUBSCRIBE",
        op::PUSH => "PUSH",
        op::CANCEL => "CANCEL",
        op::RESCHEDULE => "RESCHEDULE",
        op::ACK_PRODUCE => "ACK_PRODUCE",
        op::LOOKUP => "LOOKUP",
        op::PEEK => "PEEK",
        _ => return J::Null,
    };
    text(name)
}

/// The header's fields, as far as the bytes go.
fn header_json(bytes: &[u8]) -> J {
    let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    match read_header(bytes) {
        Ok(Some(h)) => J::Obj(vec![
            ("len", num(len)),
            ("op", num(h.op)),
            ("status", num(h.status)),
            ("flags", num(h.flags)),
            ("request_id", num(h.request_id)),
        ]),
        _ => J::Obj(vec![("len", num(len))]),
    }
}

fn id_list(ids: impl Iterator<Item = u64>) -> J {
    J::Arr(ids.map(num).collect())
}

fn request_body(r: &Request<'_>, version: u16) -> J {
    let topic = |t: &str| ("topic", text(t));
    let mut fields = request_fields(r);
    // Version 2's group follows the topic.
    if let (true, Some(group)) = (version >= 2, request_group(r)) {
        fields.insert(1, ("group", text(group)));
    }
    if let Request::Produce { topic: t, flags, batch } = *r {
        fields = vec![topic(t)];
        // Version 3's flags byte follows the topic.
        if version >= SINCE_PRODUCE_FLAGS {
            fields.push(("flags", num(flags)));
        }
        fields.extend([("count", num(batch.count)), ("messages", batch_json(&batch))]);
    }
    J::Obj(fields)
}

/// The group of a request whose version-2 layout has one after the topic.
fn request_group<'a>(r: &Request<'a>) -> Option<&'a str> {
    match *r {
        Request::Fetch { group, .. }
        | Request::Ack { group, .. }
        | Request::Nack { group, .. }
        | Request::Touch { group, .. }
        | Request::Redrive { group, .. }
        | Request::CreateGroup { group, .. }
        | Request::DeleteGroup { group, .. }
        | Request::ResetGroup { group, .. }
        | Request::Subscribe { group, .. }
        | Request::AckProduce { group, .. } => Some(group),
        _ => None,
    }
}

fn batch_json(batch: &Batch<'_>) -> J {
    let messages = batch.messages().map(|(props, p)| {
        let mut fields = Vec::new();
        if batch.with_props {
            fields.extend([("props_len", num(props.bytes().len() as u64)), ("props", props_json(&props))]);
        }
        fields.extend([("len", num(p.len() as u64)), ("payload", hex(p))]);
        J::Obj(fields)
    });
    J::Arr(messages.collect())
}

fn props_json(props: &Props<'_>) -> J {
    let entry = |p: props::Prop<'_>| match p {
        props::Prop::Tag(t) => J::Obj(vec![("type", num(props::PROP_TAG)), ("name", text("tag")), ("tag", text(t))]),
        props::Prop::Header { key, value } => J::Obj(vec![
            ("type", num(props::PROP_HEADER)),
            ("name", text("header")),
            ("key", text(key)),
            ("value", hex(value)),
        ]),
        props::Prop::DeliverAt(at) => {
            J::Obj(vec![("type", num(props::PROP_DELIVER_AT)), ("name", text("deliver_at_ms")), ("value", num(at))])
        }
        props::Prop::Delay(ms) => {
            J::Obj(vec![("type", num(props::PROP_DELAY)), ("name", text("delay_ms")), ("value", num(ms))])
        }
        props::Prop::Key(k) => J::Obj(vec![("type", num(props::PROP_KEY)), ("name", text("key")), ("value", hex(k))]),
        props::Prop::DedupId(id) => {
            J::Obj(vec![("type", num(props::PROP_DEDUP_ID)), ("name", text("dedup_id")), ("value", hex(id))])
        }
        props::Prop::LastNackReason(r) => J::Obj(vec![
            ("type", num(props::PROP_LAST_NACK_REASON)),
            ("name", text("last_nack_reason")),
            ("value", text(r)),
        ]),
    };
    J::Arr(props.iter().map(entry).collect())
}

fn start_json(start: Start) -> [(&'static str, J); 2] {
    let (kind, value) = start.to_wire();
    [("start_kind", num(kind)), ("start_value", num(value))]
}

/// A request's fields in layout order, without version 2's group.
fn request_fields(r: &Request<'_>) -> Vec<(&'static str, J)> {
    let topic = |t: &str| ("topic", text(t));
    match *r {
        Request::Hello { min_version, max_version, token } => {
            vec![("min_version", num(min_version)), ("max_version", num(max_version)), ("token", hex(token))]
        }
        Request::Ping | Request::ListTopics => vec![],
        Request::Produce { .. } => vec![],
        Request::Fetch { topic: t, max_messages, max_bytes, wait_ms, ack_timeout_ms, .. } => vec![
            topic(t),
            ("max_messages", num(max_messages)),
            ("max_bytes", num(max_bytes)),
            ("wait_ms", num(wait_ms)),
            ("ack_timeout_ms", num(ack_timeout_ms)),
        ],
        Request::Ack { topic: t, ids, .. } => {
            vec![topic(t), ("count", num(ids.len() as u64)), ("ids", id_list(ids.iter()))]
        }
        Request::Nack { topic: t, delay_ms, flags, ids, reason, .. } => {
            let mut fields = vec![
                topic(t),
                ("delay_ms", num(delay_ms)),
                ("flags", num(flags)),
                ("count", num(ids.len() as u64)),
                ("ids", id_list(ids.iter())),
            ];
            // Version 4: the reason, with its flag.
            if flags & NACK_FLAG_REASON != 0 {
                fields.push(("reason", text(reason)));
            }
            fields
        }
        Request::Touch { topic: t, ack_timeout_ms, ids, .. } => vec![
            topic(t),
            ("ack_timeout_ms", num(ack_timeout_ms)),
            ("count", num(ids.len() as u64)),
            ("ids", id_list(ids.iter())),
        ],
        Request::Stats { topic: t } | Request::DeleteTopic { topic: t } | Request::PurgeTopic { topic: t } => {
            vec![topic(t)]
        }
        Request::CreateTopic { topic: t, settings, options } => {
            let mut fields = vec![
                topic(t),
                ("ack_timeout_ms", num(settings.ack_timeout_ms)),
                ("max_deliveries", num(settings.max_deliveries)),
            ];
            // Version 4's settings list, when it names any.
            if let Some(ms) = options.dedup_window_ms {
                let entry = J::Obj(vec![("id", num(1u8)), ("name", text("dedup_window_ms")), ("value", num(ms))]);
                fields.push(("settings", J::Arr(vec![entry])));
            }
            fields
        }
        Request::Redrive { topic: t, max_messages, .. } => vec![topic(t), ("max_messages", num(max_messages))],
        Request::CreateGroup { topic: t, settings: g, start, .. } => {
            let mut fields = vec![topic(t), ("flags", num(g.flags()))];
            fields.extend(start_json(start));
            fields.extend([
                ("ack_timeout_ms", num(g.ack_timeout_ms)),
                ("max_deliveries", num(g.max_deliveries)),
                ("filter", text(g.filter)),
            ]);
            fields.extend(retry_json(&g));
            fields
        }
        Request::DeleteGroup { topic: t, .. } | Request::ListGroups { topic: t } => vec![topic(t)],
        Request::ResetGroup { topic: t, start, .. } => {
            let mut fields = vec![topic(t)];
            fields.extend(start_json(start));
            fields
        }
        Request::Subscribe { topic: t, credit, ack_timeout_ms, .. } => {
            vec![topic(t), ("credit", num(credit)), ("ack_timeout_ms", num(ack_timeout_ms))]
        }
        Request::Credit { subscription, credit } => {
            vec![("subscription", num(subscription)), ("credit", num(credit))]
        }
        Request::Unsubscribe { subscription } => vec![("subscription", num(subscription))],
        Request::Cancel { topic: t, id } | Request::Peek { topic: t, id } => vec![topic(t), ("id", num(id))],
        Request::Lookup { topic: t, key } => vec![topic(t), ("key", hex(key))],
        Request::Reschedule { topic: t, id, when } => {
            let (kind, value) = when.to_wire();
            vec![topic(t), ("id", num(id)), ("kind", num(kind)), ("value", num(value))]
        }
        Request::AckProduce { topic: t, ids, outputs, .. } => {
            let output = |(name, batch): (&str, Batch<'_>)| {
                J::Obj(vec![("topic", text(name)), ("count", num(batch.count)), ("messages", batch_json(&batch))])
            };
            vec![
                topic(t),
                ("count", num(ids.len() as u64)),
                ("ids", id_list(ids.iter())),
                ("outputs_count", num(outputs.count)),
                ("outputs", J::Arr(outputs.iter().map(output).collect())),
            ]
        }
    }
}

fn message_json(m: &Message<'_>) -> J {
    let mut fields = vec![("id", num(m.id)), ("born_ms", num(m.born_ms)), ("delivery_count", num(m.delivery_count))];
    let origin_group = m.dead.is_some() && !m.origin_group.is_empty();
    let flag = |on: bool, bit: u8| if on { bit } else { 0 };
    let flags = flag(m.dead.is_some(), MSG_FLAG_DEAD)
        | flag(!m.props.is_empty(), MSG_FLAG_PROPS)
        | flag(origin_group, MSG_FLAG_ORIGIN_GROUP);
    fields.push(("flags", num(flags)));
    if let Some(d) = m.dead {
        fields.extend([
            ("origin_id", num(d.origin_id)),
            ("origin_deliveries", num(d.origin_deliveries)),
            ("reason", num(d.reason as u8)),
            ("reason_name", text(d.reason.name())),
        ]);
    }
    if origin_group {
        fields.push(("origin_group", text(m.origin_group)));
    }
    if !m.props.is_empty() {
        fields.extend([("props_len", num(m.props.bytes().len() as u64)), ("props", props_json(&m.props))]);
    }
    fields.extend([("len", num(m.payload.len() as u64)), ("payload", hex(m.payload))]);
    J::Obj(fields)
}

/// A group's retry policy (version 4), when it has one: `retry_policy`,
/// a name of its own (LIST_GROUPS has a count named `retry` too).
fn retry_json(g: &GroupSettings<'_>) -> Option<(&'static str, J)> {
    let p = g.retry?;
    Some((
        "retry_policy",
        J::Obj(vec![
            ("initial_ms", num(p.initial_ms)),
            ("cap_ms", num(p.cap_ms)),
            ("multiplier_pct", num(p.multiplier_pct)),
            ("jitter_pct", num(p.jitter_pct)),
        ]),
    ))
}

fn group_json(g: &GroupInfo<'_>) -> J {
    let s = &g.stats;
    let mut fields = vec![
        ("name", text(g.name)),
        ("flags", num(g.settings.flags())),
        ("ack_timeout_ms", num(g.settings.ack_timeout_ms)),
        ("max_deliveries", num(g.settings.max_deliveries)),
        ("filter", text(g.settings.filter)),
    ];
    fields.extend(retry_json(&g.settings));
    fields.extend([
        ("cursor", num(s.cursor)),
        ("lag", num(s.lag)),
        ("inflight", num(s.inflight)),
        ("retry", num(s.retry)),
        ("delayed", num(s.delayed)),
        ("dead_lettered", num(s.dead_lettered)),
        ("oldest_unacked_age_ms", num(s.oldest_unacked_age_ms)),
        ("consumers", num(s.consumers)),
    ]);
    J::Obj(fields)
}

/// The limits a HELLO reply of `version` carries, in layout order (the
/// map epoch among them).
fn hello_limits_json(version: u16, l: &DecodeLimits, map_epoch: u64) -> Vec<(&'static str, J)> {
    let mut fields = vec![
        ("frame_bytes_max", num(l.frame_bytes_max)),
        ("message_bytes_max", num(l.message_bytes_max)),
        ("batch_messages_max", num(l.batch_messages_max)),
        ("topic_name_bytes_max", num(l.topic_name_bytes_max)),
    ];
    if version >= 2 {
        fields.extend([
            ("output_bytes_max", num(l.output_bytes_max)),
            ("fetch_bytes_max", num(l.fetch_bytes_max)),
            ("idle_timeout_ms", num(l.idle_timeout_ms)),
            ("map_epoch", num(map_epoch)),
            ("group_name_bytes_max", num(l.group_name_bytes_max)),
            ("tags_per_message_max", num(l.tags_per_message_max)),
            ("tag_bytes_max", num(l.tag_bytes_max)),
            ("props_bytes_max", num(l.props_bytes_max)),
            ("filter_bytes_max", num(l.filter_bytes_max)),
        ]);
    }
    if version >= SINCE_HELLO_FEATURE_LIMITS {
        fields.extend([
            ("subscription_credit_max", num(l.subscription_credit_max)),
            ("key_bytes_max", num(l.key_bytes_max)),
            ("dedup_id_bytes_max", num(l.dedup_id_bytes_max)),
            ("nack_reason_bytes_max", num(l.nack_reason_bytes_max)),
            ("lookup_results_max", num(l.lookup_results_max)),
        ]);
    }
    fields
}

fn reply_body(r: &Reply<'_>) -> J {
    J::Obj(match r {
        Reply::Hello { version, limits, map_epoch } => {
            let mut fields = vec![("version", num(*version))];
            fields.extend(hello_limits_json(*version, limits, *map_epoch));
            fields
        }
        Reply::Pong => vec![],
        Reply::Produced { first_id, count } => vec![("first_id", num(*first_id)), ("count", num(*count))],
        Reply::Deduplicated { first_id, count, duplicates } => {
            let dup = |&(index, id): &(u32, u64)| J::Obj(vec![("index", num(index)), ("id", num(id))]);
            vec![
                ("first_id", num(*first_id)),
                ("count", num(*count)),
                ("duplicate_count", num(duplicates.len() as u64)),
                ("duplicates", J::Arr(duplicates.iter().map(dup).collect())),
            ]
        }
        Reply::Messages { topic, messages } | Reply::Pushed { topic, messages } => vec![
            ("topic", text(topic)),
            ("count", num(messages.len() as u64)),
            ("messages", J::Arr(messages.iter().map(message_json).collect())),
        ],
        Reply::Ids { done, failed } => vec![
            ("done", num(*done)),
            ("failed_count", num(failed.len() as u64)),
            ("failed", id_list(failed.iter().copied())),
        ],
        Reply::Stats(sections) => {
            let section = |(name, kvs): &(&str, Vec<(&str, u64)>)| {
                let pairs = kvs.iter().map(|(k, v)| J::Obj(vec![("key", text(k)), ("value", num(*v))]));
                J::Obj(vec![
                    ("name", text(name)),
                    ("key_count", num(kvs.len() as u64)),
                    ("pairs", J::Arr(pairs.collect())),
                ])
            };
            vec![("sections", J::Arr(sections.iter().map(section).collect()))]
        }
        Reply::Created { created } => vec![("created", num(u8::from(*created)))],
        Reply::Count(n) => vec![("count", num(*n))],
        Reply::Topics(topics) => {
            let topic = |(name, s): &(&str, TopicSettings)| {
                J::Obj(vec![
                    ("name", text(name)),
                    ("ack_timeout_ms", num(s.ack_timeout_ms)),
                    ("max_deliveries", num(s.max_deliveries)),
                ])
            };
            vec![("count", num(topics.len() as u64)), ("topics", J::Arr(topics.iter().map(topic).collect()))]
        }
        Reply::Error { message, .. } => vec![("message", text(message))],
        Reply::GroupCreated { created, cursor } => vec![("created", num(u8::from(*created))), ("cursor", num(*cursor))],
        Reply::Groups(groups) => {
            vec![("count", num(groups.len() as u64)), ("groups", J::Arr(groups.iter().map(group_json).collect()))]
        }
        Reply::Cursor(cursor) => vec![("cursor", num(*cursor))],
        Reply::Subscribed { subscription } => vec![("subscription", num(*subscription))],
        Reply::Credited { inflight } => vec![("inflight", num(*inflight))],
        Reply::Due(at) => vec![("deliver_at_ms", num(*at))],
        Reply::Inspected(entries) => {
            vec![
                ("count", num(entries.len() as u64)),
                ("entries", J::Arr(entries.iter().map(inspected_json).collect())),
            ]
        }
        Reply::AckProduced { done, failed, outputs } => {
            let output = |&(first, count): &(u64, u32)| J::Obj(vec![("first_id", num(first)), ("count", num(count))]);
            vec![
                ("done", num(*done)),
                ("failed_count", num(failed.len() as u64)),
                ("failed", id_list(failed.iter().copied())),
                ("outputs_count", num(outputs.len() as u64)),
                ("outputs", J::Arr(outputs.iter().map(output).collect())),
            ]
        }
    })
}

/// An entry of a LOOKUP or PEEK reply, its fields in layout order.
fn inspected_json(e: &inspect::Inspected<'_>) -> J {
    let held = e.message.map_or(0, |m| {
        inspect::INSPECT_FLAG_HELD
            | if m.dead.is_some() { inspect::INSPECT_FLAG_DEAD } else { 0 }
            | if m.payload.is_some() { inspect::INSPECT_FLAG_PAYLOAD } else { 0 }
    });
    let mut fields = vec![("id", num(e.id)), ("flags", num(held))];
    if let Some(m) = e.message {
        fields.push(("born_ms", num(m.born_ms)));
        if let Some(d) = m.dead {
            fields.extend([
                ("origin_id", num(d.origin_id)),
                ("origin_deliveries", num(d.origin_deliveries)),
                ("reason", num(d.reason as u8)),
                ("reason_name", text(d.reason.name())),
            ]);
        }
        fields.extend([("props_len", num(m.props.bytes().len() as u64)), ("props", props_json(&m.props))]);
        fields.push(("len", num(m.len)));
        if let Some(p) = m.payload {
            fields.push(("payload", hex(p)));
        }
    }
    let line = |g: &inspect::GroupLine<'_>| {
        J::Obj(vec![
            ("name", text(g.name)),
            ("state", num(g.state as u8)),
            ("state_name", text(g.state.name())),
            ("deliveries", num(g.deliveries)),
            ("until_ms", num(g.until_ms)),
            ("consumer", num(g.consumer)),
            ("dead_reason", num(g.dead_reason)),
            ("last_nack_reason", text(g.last_nack_reason)),
        ])
    };
    fields
        .extend([("group_count", num(e.groups.len() as u64)), ("groups", J::Arr(e.groups.iter().map(line).collect()))]);
    J::Obj(fields)
}

fn status_name(status: u8) -> J {
    match status {
        0 => text("OK"),
        s => ErrorCode::from_u8(s).map_or(J::Null, |c| text(c.name())),
    }
}

// ---------------------------------------------------------------------------
// Each vector checked against the codec, then written.
// ---------------------------------------------------------------------------

/// The limits requests are judged against: the broker's defaults.
fn limits() -> DecodeLimits {
    DecodeLimits::from(&Limits::default())
}

fn bytes_of(v: &Vector) -> Vec<u8> {
    match &v.kind {
        Kind::Frame(expect) => encode(expect),
        Kind::Grown(expect, extra) => {
            let mut bytes = encode(expect);
            bytes.extend_from_slice(extra);
            let len = (bytes.len() - 4) as u32;
            bytes[..4].copy_from_slice(&len.to_le_bytes());
            bytes
        }
        Kind::Refused { bytes, .. } => bytes.clone(),
    }
}

fn direction(name: &str) -> &'static str {
    if name.ends_with("-request") {
        "request"
    } else if name.ends_with("-reply") {
        "reply"
    } else {
        panic!("vector {name}: a name ends in -request or -reply")
    }
}

fn decode_whole_request<'a>(bytes: &'a [u8], version: u16, name: &str) -> Frame<'a> {
    match decode_request(bytes, &limits(), version) {
        Ok(Decoded::Frame(f, n)) if n == bytes.len() => f,
        other => panic!("vector {name}: decode_request gave {other:?} for {} bytes", bytes.len()),
    }
}

fn decode_whole_reply<'a>(bytes: &'a [u8], name: &str) -> ReplyFrame<'a> {
    match decode_reply(bytes, usize::MAX) {
        Ok(Decoded::Frame(f, n)) if n == bytes.len() => f,
        other => panic!("vector {name}: decode_reply gave {other:?} for {} bytes", bytes.len()),
    }
}

fn refusal(bytes: &[u8], version: u16, name: &str) -> DecodeError {
    match decode_request(bytes, &limits(), version) {
        Err(e) => e,
        other => panic!("vector {name}: expected the decoder to refuse it, got {other:?}"),
    }
}

/// Decodes a vector's bytes with the codec, in the layouts of the file's
/// `version`, checks the result against what the vector was built from,
/// and returns the vector as JSON.
fn vector_json(v: &Vector, version: u16) -> J {
    let bytes = bytes_of(v);
    let dir = direction(v.name);
    let mut fields = vec![
        ("name", text(v.name)),
        ("direction", text(dir)),
        ("description", text(v.description)),
        ("doc_example", J::Bool(v.doc_example)),
        ("hex", hex(&bytes)),
        ("header", header_json(&bytes)),
    ];
    match &v.kind {
        Kind::Frame(Expect::Request(want, request_version)) => {
            assert_eq!(dir, "request", "vector {} holds a request", v.name);
            assert!(*request_version <= version, "vector {}: a version-{request_version} request", v.name);
            let got = decode_whole_request(&bytes, version, v.name);
            assert_eq!(&got, want, "vector {}", v.name);
            fields.extend([("op_name", op_name(got.request.op())), ("body", request_body(&got.request, version))]);
        }
        Kind::Frame(Expect::Reply(want)) | Kind::Grown(Expect::Reply(want), _) => {
            assert_eq!(dir, "reply", "vector {} holds a reply", v.name);
            let got = decode_whole_reply(&bytes, v.name);
            assert_eq!(&got, want, "vector {}", v.name);
            fields.extend([("op_name", op_name(got.op)), ("status_name", status_name(bytes[5]))]);
            if let Kind::Grown(_, extra) = &v.kind {
                fields.push(("bytes_past_layout", num(extra.len() as u64)));
            }
            fields.push(("body", reply_body(&got.reply)));
        }
        Kind::Grown(Expect::Request(..), _) => panic!("vector {}: only replies may grow", v.name),
        Kind::Refused { code, closes, .. } => {
            assert_eq!(dir, "request", "vector {} holds a request", v.name);
            let e = refusal(&bytes, version, v.name);
            assert_eq!((e.code, e.skip == Skip::Close), (*code, *closes), "vector {}: {e:?}", v.name);
            let op = if bytes.len() >= HEADER_BYTES { op_name(bytes[4]) } else { J::Null };
            let refused = J::Obj(vec![
                ("code", num(*code as u8)),
                ("name", text(code.name())),
                ("closes_connection", J::Bool(*closes)),
            ]);
            fields.extend([("op_name", op), ("refused", refused)]);
        }
    }
    J::Obj(fields)
}

/// The whole file of protocol `version`, as the codec gives it.
fn generate(version: u16) -> String {
    let l = limits();
    let top = J::Obj(vec![
        (
            "description",
            text(
                "Test vectors of the runnel wire protocol (docs/protocol.md), generated from the broker's codec by \
                 tests/vectors.rs. docs/vectors/README.md describes the format.",
            ),
        ),
        ("protocol_version", num(version)),
        ("limits", J::Obj(hello_limits_json(version, &l, MAP_EPOCH_UNSHARDED))),
        ("vectors", J::Arr(vectors(version).iter().map(|v| vector_json(v, version)).collect())),
    ]);
    let mut out = String::new();
    top.write(&mut out, 0);
    out.push('\n');
    out
}

/// Where two texts first differ, with a few lines around it from each.
fn first_difference(file: &str, codec: &str) -> String {
    let (f, c): (Vec<&str>, Vec<&str>) = (file.lines().collect(), codec.lines().collect());
    let at = f.iter().zip(&c).position(|(a, b)| a != b).unwrap_or(f.len().min(c.len()));
    let from = at.saturating_sub(3);
    let show = |lines: &[&str], mark: char| {
        let to = (at + 6).min(lines.len());
        lines[from.min(to)..to].iter().map(|l| format!("{mark} {l}")).collect::<Vec<_>>().join("\n")
    };
    format!(
        "first difference at line {} ({} lines in the file, {} from the codec):\n{}\n---\n{}",
        at + 1,
        f.len(),
        c.len(),
        show(&f, '-'),
        show(&c, '+')
    )
}

// ---------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------

/// Writes (with RUNNEL_WRITE_VECTORS=1) or checks the file of `version`.
fn check_file(version: u16) {
    let (path, want) = (vectors_path(version), generate(version));
    if std::env::var_os("RUNNEL_WRITE_VECTORS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &want).unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
        eprintln!("wrote {path}");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{path} is not what the codec gives; if the change is meant, regenerate it with\n  \
         RUNNEL_WRITE_VECTORS=1 cargo test --release --test vectors\nreview the diff and commit it.\n\n{}",
        first_difference(&have, &want)
    );
}

#[test]
fn the_vectors_file_is_what_the_codec_gives() {
    check_file(1);
}

#[test]
fn the_version_2_vectors_file_is_what_the_codec_gives() {
    check_file(2);
}

#[test]
fn the_version_3_vectors_file_is_what_the_codec_gives() {
    check_file(3);
}

#[test]
fn the_version_4_vectors_file_is_what_the_codec_gives() {
    check_file(4);
}

#[test]
fn the_version_5_vectors_file_is_what_the_codec_gives() {
    check_file(5);
}

#[test]
fn the_version_6_vectors_file_is_what_the_codec_gives() {
    check_file(6);
}

/// The promise of docs/vectors/README.md, kept as a client writer would
/// test it: each file read as JSON, every vector's frame is rebuilt from
/// its `header` and its `body` alone, field by field, by an encoder written
/// from docs/protocol.md's layouts that shares nothing with the codec
/// (tests/vectors/rebuild.rs), and is the vector's `hex` byte for byte (up
/// to a grown reply's `bytes_past_layout`, which the body does not hold).
#[test]
fn every_vector_rebuilds_its_frame_from_its_body_alone() {
    for version in versions() {
        let path = vectors_path(version);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
        let file = json::parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(file.get("protocol_version"), Some(&json::Value::Num(version.into())), "{path}");
        let Some(json::Value::Arr(all)) = file.get("vectors") else { panic!("{path}: no vectors") };
        for v in all {
            let Some(rebuilt) = rebuild::frame(v, version) else { continue };
            let Some(json::Value::Str(want)) = v.get("hex") else { panic!("{path}: a vector without hex") };
            let extra = match v.get("bytes_past_layout") {
                Some(json::Value::Num(n)) => 2 * *n as usize,
                _ => 0,
            };
            let J::Str(got) = hex(&rebuilt) else { unreachable!("hex is a string") };
            let name = v.get("name");
            assert_eq!(got.len(), want.len(), "{path}: {name:?} rebuilds to another length");
            assert_eq!(got[..got.len() - extra], want[..want.len() - extra], "{path}: {name:?}");
        }
    }
}

#[test]
fn vector_names_are_unique() {
    for version in versions() {
        let all = vectors(version);
        for (i, v) in all.iter().enumerate() {
            assert!(!all[..i].iter().any(|w| w.name == v.name), "vector name {} is used twice", v.name);
        }
    }
}

/// Every op of version 1 has a request and an OK reply in the version-1
/// file, and every op version 2 adds or lays out anew in the version-2 one;
/// both have error replies and refused requests.
#[test]
fn every_op_has_a_request_and_a_reply() {
    check_ops(1, &|code| op::since(code) == Some(1));
    let relaid = [op::PRODUCE, op::FETCH, op::ACK, op::NACK, op::TOUCH, op::REDRIVE];
    check_ops(2, &|code| op::since(code) == Some(2) || relaid.contains(&code));
    check_ops(3, &|code| op::since(code) == Some(3));
    check_ops(4, &|code| op::since(code) == Some(4));
}

fn check_ops(version: u16, wanted: &dyn Fn(u8) -> bool) {
    let all = vectors(version);
    let has = |want: &dyn Fn(&Expect) -> bool| {
        all.iter().any(|v| matches!(&v.kind, Kind::Frame(e) | Kind::Grown(e, _) if want(e)))
    };
    for code in (0u8..REPLY_BIT).filter(|&o| !matches!(op_name(o), J::Null) && wanted(o)) {
        assert!(
            has(&|e| matches!(e, Expect::Request(f, _) if f.request.op() == code)),
            "no request vector of op {code:#04x} in version {version}'s file"
        );
        // A reply version 2 does not lay out anew is in version 1's file.
        let reply_version = op::since(code).filter(|&v| v >= 2).unwrap_or(1);
        let ok_reply =
            |e: &Expect| matches!(e, Expect::Reply(f) if f.op == code && !matches!(f.reply, Reply::Error { .. }));
        let replies = vectors(reply_version);
        let has_reply = replies.iter().any(|v| matches!(&v.kind, Kind::Frame(e) | Kind::Grown(e, _) if ok_reply(e)));
        assert!(has_reply, "no OK reply vector of op {code:#04x}");
    }
    assert!(has(&|e| matches!(e, Expect::Reply(ReplyFrame { reply: Reply::Error { .. }, .. }))));
    assert!(all.iter().any(|v| matches!(v.kind, Kind::Refused { .. })));
}

/// A refused request and the error reply of the same name agree: the reply
/// carries the op, request id and code the decoder gives for the request.
#[test]
fn refused_requests_match_their_error_replies() {
    for version in versions() {
        check_refusal_pairs(version);
    }
}

fn check_refusal_pairs(version: u16) {
    let all = vectors(version);
    for v in &all {
        let Kind::Refused { bytes, .. } = &v.kind else { continue };
        let reply_name = v.name.replace("-request", "-reply");
        let Some(r) = all.iter().find(|w| w.name == reply_name) else { continue };
        let Kind::Frame(Expect::Reply(f)) = &r.kind else { panic!("{reply_name} is not a reply") };
        let e = refusal(bytes, version, v.name);
        let Reply::Error { code, .. } = f.reply else { panic!("{reply_name} is not an error reply") };
        let sent = reply_op(e.op) & !REPLY_BIT;
        assert_eq!((f.op, f.request_id, code), (sent, e.request_id, e.code as u8), "{} and {reply_name}", v.name);
    }
}

#[test]
fn json_strings_and_numbers_are_written_as_json_readers_expect() {
    let mut out = String::new();
    write_str(&mut out, "a\"b\\c\nd\u{1}é");
    assert_eq!(out, r#""a\"b\\c\nd\u0001é""#);
    assert_eq!(J::Arr(vec![num(1u8), J::Null, J::Bool(true)]).inline(), "[1, null, true]");
    assert!(std::panic::catch_unwind(|| num(JSON_INT_MAX + 1)).is_err(), "2^53 must be refused");
}
