//! The frames of docs/protocol.md's examples, as codec values, and the
//! encoders that turn them into bytes.
//!
//! One list serves two checks: tests/protocol_doc.rs holds the doc's hex
//! dumps to these frames, and tests/vectors.rs publishes them (with more) as
//! docs/vectors/protocol-v1.json. So a doc example and its vector cannot
//! disagree.

use runnel::codec::*;
use runnel::limits::Limits;

/// The wall clock of the examples: 2026-01-01T00:00:00.123Z in ms.
pub const BORN_MS: u64 = 1_767_225_600_123;

/// A frame a test expects: a request, in the layout of a protocol version,
/// or a reply (replies need no version).
#[derive(Clone, Debug)]
pub enum Expect {
    Request(Frame<'static>, u16),
    Reply(ReplyFrame<'static>),
}

/// A frame with its name (the doc's example tag, which ends in `-request`
/// or `-reply`) and a sentence saying what it shows.
#[derive(Clone, Debug)]
pub struct Named {
    pub name: &'static str,
    pub description: &'static str,
    pub expect: Expect,
}

pub fn named(name: &'static str, description: &'static str, expect: Expect) -> Named {
    Named { name, description, expect }
}

pub fn ids(v: &[u64]) -> Ids<'static> {
    let mut bytes = Vec::new();
    encode_ids(&mut bytes, v);
    Ids { bytes: bytes.leak() }
}

pub fn batch(payloads: &[&[u8]]) -> Batch<'static> {
    let mut bytes = Vec::new();
    encode_batch(&mut bytes, payloads);
    Batch { count: payloads.len() as u32, bytes: bytes.leak(), with_props: false }
}

pub fn request(request_id: u32, request: Request<'static>) -> Expect {
    Expect::Request(Frame { request_id, request }, 1)
}

/// A request in the version-2 layout.
pub fn request_v2(request_id: u32, request: Request<'static>) -> Expect {
    Expect::Request(Frame { request_id, request }, 2)
}

pub fn reply(op: u8, request_id: u32, reply: Reply<'static>) -> Expect {
    Expect::Reply(ReplyFrame { op, request_id, reply })
}

pub fn error(op: u8, request_id: u32, code: ErrorCode, message: &'static str) -> Expect {
    reply(op, request_id, Reply::Error { code: code as u8, message })
}

pub fn message(id: u64, delivery_count: u16, dead: Option<DeadInfo>, payload: &'static [u8]) -> Message<'static> {
    Message {
        id,
        born_ms: BORN_MS,
        delivery_count,
        dead,
        payload,
        origin_group: "",
        props: runnel::codec::Props::EMPTY,
    }
}

pub fn settings(ack_timeout_ms: u32, max_deliveries: u16) -> TopicSettings {
    TopicSettings { ack_timeout_ms, max_deliveries }
}

/// The STATS reply of the doc's example: the broker section and the
/// section of `jobs`, with some of the keys the doc defines.
fn doc_stats() -> Reply<'static> {
    let broker = vec![
        ("uptime_ms", 3_600_000),
        ("connections", 2),
        ("turns", 51_234),
        ("topics", 2),
        ("bytes_in", 4096),
        ("bytes_out", 8192),
        ("log_bytes", 1_048_576),
        ("log_segments", 1),
        ("fsyncs", 120),
        ("compactions", 0),
        ("recovery_ms", 12),
    ];
    let jobs = vec![
        ("ready", 0),
        ("inflight", 0),
        ("delayed", 1),
        ("produced", 2),
        ("delivered", 2),
        ("redelivered", 0),
        ("acked", 1),
        ("nacked", 1),
        ("dead_lettered", 0),
        ("expired", 0),
        ("bytes", 5),
    ];
    Reply::Stats(vec![("", broker), ("jobs", jobs)])
}

/// Every example docs/protocol.md must carry, in the order of the doc: one
/// session on one connection, request ids counting up.
pub fn doc_frames() -> Vec<Named> {
    let limits = DecodeLimits::from(&Limits::default());
    let jobs = "jobs";
    let dead = DeadInfo { origin_id: 2, origin_deliveries: 16, reason: DeadReason::Nacked };
    let fetch = |topic, max_messages, wait_ms| Request::Fetch {
        topic,
        group: "",
        max_messages,
        max_bytes: 0,
        wait_ms,
        ack_timeout_ms: 0,
    };
    vec![
        named(
            "hello-request",
            "HELLO: the client speaks versions 1 to 1 and has no token.",
            request(1, Request::Hello { min_version: 1, max_version: 1, token: b"" }),
        ),
        named(
            "hello-reply",
            "The broker chooses version 1 and reports its default limits.",
            reply(op::HELLO, 1, Reply::Hello { version: 1, limits: limits.reported(1), map_epoch: 0 }),
        ),
        named("ping-request", "PING.", request(2, Request::Ping)),
        named("ping-reply", "The reply to PING.", reply(op::PING, 2, Reply::Pong)),
        named(
            "produce-request",
            "PRODUCE a batch of two messages, hello and world, to the topic jobs.",
            request(3, Request::Produce { flags: 0, topic: jobs, batch: batch(&[b"hello", b"world"]) }),
        ),
        named(
            "produce-reply",
            "The batch was stored as ids 1 and 2.",
            reply(op::PRODUCE, 3, Reply::Produced { first_id: 1, count: 2 }),
        ),
        named(
            "fetch-request",
            "FETCH up to 10 messages, the default byte budget, waiting up to 5 s, the topic's ack timeout.",
            request(4, fetch(jobs, 10, 5000)),
        ),
        named(
            "fetch-reply",
            "Both messages, each on its first delivery.",
            reply(
                op::FETCH,
                4,
                Reply::Messages {
                    topic: jobs,
                    messages: vec![message(1, 1, None, b"hello"), message(2, 1, None, b"world")],
                },
            ),
        ),
        named(
            "ack-request",
            "ACK messages 1 and 7; there is no message 7.",
            request(5, Request::Ack { topic: jobs, group: "", ids: ids(&[1, 7]) }),
        ),
        named("ack-reply", "One id took effect; 7 failed.", reply(op::ACK, 5, Reply::Ids { done: 1, failed: vec![7] })),
        named(
            "touch-request",
            "TOUCH: give message 2 another 60 s.",
            request(6, Request::Touch { topic: jobs, group: "", ack_timeout_ms: 60_000, ids: ids(&[2]) }),
        ),
        named(
            "touch-reply",
            "The reply to TOUCH: done 1, none failed.",
            reply(op::TOUCH, 6, Reply::Ids { done: 1, failed: vec![] }),
        ),
        named(
            "nack-request",
            "NACK: give message 2 back, to be ready again in 1 s.",
            request(7, Request::Nack { topic: jobs, group: "", delay_ms: 1000, flags: 0, ids: ids(&[2]), reason: "" }),
        ),
        named(
            "nack-reply",
            "The reply to NACK: done 1, none failed.",
            reply(op::NACK, 7, Reply::Ids { done: 1, failed: vec![] }),
        ),
        named(
            "produce-queue-full-reply",
            "An error reply: a PRODUCE to a full topic gets QUEUE_FULL (status 11) and stores nothing. The message text is an example.",
            error(op::PRODUCE, 8, ErrorCode::QueueFull, "topic jobs is at topic_messages_max (10000000)"),
        ),
        named(
            "fetch-dlq-request",
            "FETCH one message from the dead-letter topic jobs.dlq, without waiting.",
            request(9, fetch("jobs.dlq", 1, 0)),
        ),
        named(
            "fetch-dlq-reply",
            "A dead letter: message 2 of jobs, NACKed on its 16th delivery, is message 1 of jobs.dlq, with its dead-letter fields.",
            reply(
                op::FETCH,
                9,
                Reply::Messages { topic: "jobs.dlq", messages: vec![message(1, 1, Some(dead), b"world")] },
            ),
        ),
        named("stats-request", "STATS of the topic jobs.", request(10, Request::Stats { topic: jobs })),
        named(
            "stats-reply",
            "The broker section and the section of jobs, with some of the keys the doc defines (a real reply has more).",
            reply(op::STATS, 10, doc_stats()),
        ),
        named(
            "create-topic-request",
            "CREATE_TOPIC mail with a 60 s ack timeout and 5 deliveries.",
            request(
                11,
                Request::CreateTopic { topic: "mail", settings: settings(60_000, 5), options: Default::default() },
            ),
        ),
        named("create-topic-reply", "The topic is new.", reply(op::CREATE_TOPIC, 11, Reply::Created { created: true })),
        named("list-topics-request", "LIST_TOPICS.", request(12, Request::ListTopics)),
        named(
            "list-topics-reply",
            "Three topics, a dead-letter topic included, in byte order of their names.",
            reply(
                op::LIST_TOPICS,
                12,
                Reply::Topics(vec![
                    (jobs, settings(30_000, 16)),
                    ("jobs.dlq", settings(30_000, 16)),
                    ("mail", settings(60_000, 5)),
                ]),
            ),
        ),
        named(
            "redrive-request",
            "REDRIVE every ready message of jobs.dlq back to jobs.",
            request(13, Request::Redrive { topic: jobs, group: "", max_messages: 0 }),
        ),
        named("redrive-reply", "One message moved.", reply(op::REDRIVE, 13, Reply::Count(1))),
        named("purge-topic-request", "PURGE_TOPIC jobs.", request(14, Request::PurgeTopic { topic: jobs })),
        named("purge-topic-reply", "Two messages removed.", reply(op::PURGE_TOPIC, 14, Reply::Count(2))),
        named("delete-topic-request", "DELETE_TOPIC mail.", request(15, Request::DeleteTopic { topic: "mail" })),
        named("delete-topic-reply", "No message removed.", reply(op::DELETE_TOPIC, 15, Reply::Count(0))),
        named(
            "too-many-connections-reply",
            "What a new connection receives when the broker is at connections_max, before the broker closes it: op 0x80, request id 0. The message text is an example.",
            error(0, 0, ErrorCode::TooManyConnections, "broker is at connections_max (10000)"),
        ),
    ]
}

/// Properties of the version-2 examples: tag `eu`, header `trace` = `7f`.
pub fn example_props() -> Props<'static> {
    let mut bytes = Vec::new();
    props::put_tag(&mut bytes, "eu");
    props::put_header(&mut bytes, "trace", b"7f");
    Props::parse(bytes.leak(), 2, &PropsLimits::ANY).expect("valid properties") // ok: test data
}

/// A version-2 PRODUCE batch of (properties, payload).
pub fn batch_v2(messages: &[(Props<'static>, &[u8])]) -> Batch<'static> {
    let mut bytes = Vec::new();
    for (props, payload) in messages {
        encode_message(&mut bytes, props, payload);
    }
    Batch { count: messages.len() as u32, bytes: bytes.leak(), with_props: true }
}

/// The settings of the `billing` group of the version-2 examples.
pub fn billing_settings() -> GroupSettings<'static> {
    GroupSettings {
        broadcast: false,
        ack_timeout_ms: 0,
        max_deliveries: 0,
        filter: "eu || us",
        ordered: false,
        retry: None,
    }
}

/// Every version-2 example docs/protocol.md must carry, in the order of
/// the doc: one version-2 session, request ids counting up.
pub fn doc_frames_v2() -> Vec<Named> {
    let limits = DecodeLimits::from(&Limits::default());
    let (jobs, billing) = ("jobs", "billing");
    let props = example_props();
    let dead = DeadInfo { origin_id: 1, origin_deliveries: 5, reason: DeadReason::Nacked };
    let tagged = Message { props, ..message(1, 1, None, b"hello") };
    let dead_letter = Message { origin_group: billing, props, ..message(1, 1, Some(dead), b"hello") };
    let mut frames = vec![
        named(
            "hello-v2-request",
            "HELLO: the client speaks versions 1 to 2 and has no token.",
            request(1, Request::Hello { min_version: 1, max_version: 2, token: b"" }),
        ),
        named(
            "hello-v2-reply",
            "A broker that speaks version 2 chooses it and reports every limit a version-2 client needs.",
            reply(op::HELLO, 1, Reply::Hello { version: 2, limits: limits.reported(2), map_epoch: 0 }),
        ),
        named(
            "produce-v2-request",
            "PRODUCE (version 2) two messages to jobs: hello with the tag eu and the header trace = 7f, and world without properties.",
            request_v2(
                2,
                Request::Produce {
                    flags: 0,
                    topic: jobs,
                    batch: batch_v2(&[(props, b"hello"), (Props::EMPTY, b"world")]),
                },
            ),
        ),
        named(
            "create-group-request",
            "CREATE_GROUP billing on jobs: competing consumers, from the earliest message, the topic's ack timeout and max deliveries, tags eu or us.",
            request_v2(
                3,
                Request::CreateGroup {
                    topic: jobs,
                    group: billing,
                    settings: billing_settings(),
                    start: Start::Earliest,
                },
            ),
        ),
        named(
            "create-group-reply",
            "The group is new; its cursor is message 1.",
            reply(op::CREATE_GROUP, 3, Reply::GroupCreated { created: true, cursor: 1 }),
        ),
        named(
            "fetch-v2-request",
            "FETCH (version 2) for the group billing: up to 10 messages, waiting up to 5 s.",
            request_v2(
                4,
                Request::Fetch {
                    topic: jobs,
                    group: billing,
                    max_messages: 10,
                    max_bytes: 0,
                    wait_ms: 5000,
                    ack_timeout_ms: 0,
                },
            ),
        ),
        named(
            "fetch-v2-reply",
            "Message 1 with its properties (flags bit 1); world has no tag, so billing's filter passed it over.",
            reply(op::FETCH, 4, Reply::Messages { topic: jobs, messages: vec![tagged] }),
        ),
    ];
    frames.extend(doc_frames_v2_consumer(jobs, billing));
    frames.extend([
        named(
            "fetch-dlq-v2-request",
            "FETCH (version 2) one message of jobs.dlq for its default group, without waiting.",
            request_v2(8, Request::Fetch { topic: "jobs.dlq", group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 }),
        ),
        named(
            "fetch-dlq-v2-reply",
            "From jobs.dlq (version 2): message 1 of jobs, NACKed on its 5th delivery in the group billing, with the origin group (flags bit 2) and its properties.",
            reply(op::FETCH, 8, Reply::Messages { topic: "jobs.dlq", messages: vec![dead_letter] }),
        ),
        named(
            "redrive-v2-request",
            "REDRIVE (version 2) every dead letter of the group billing back to it.",
            request_v2(9, Request::Redrive { topic: jobs, group: billing, max_messages: 0 }),
        ),
    ]);
    frames.extend(doc_frames_v2_admin(jobs, billing));
    frames
}

/// ACK, NACK and TOUCH of the version-2 examples.
fn doc_frames_v2_consumer(jobs: &'static str, billing: &'static str) -> Vec<Named> {
    vec![
        named(
            "ack-v2-request",
            "ACK (version 2) message 1 for the group billing only.",
            request_v2(5, Request::Ack { topic: jobs, group: billing, ids: ids(&[1]) }),
        ),
        named(
            "nack-v2-request",
            "NACK (version 2) message 1 for the group billing, to be ready again in 1 s.",
            request_v2(
                6,
                Request::Nack { topic: jobs, group: billing, delay_ms: 1000, flags: 0, ids: ids(&[1]), reason: "" },
            ),
        ),
        named(
            "touch-v2-request",
            "TOUCH (version 2): give message 1 another 60 s in the group billing.",
            request_v2(7, Request::Touch { topic: jobs, group: billing, ack_timeout_ms: 60_000, ids: ids(&[1]) }),
        ),
    ]
}

/// The group admin frames of the version-2 examples.
fn doc_frames_v2_admin(jobs: &'static str, billing: &'static str) -> Vec<Named> {
    let default_group = GroupInfo {
        name: "",
        settings: GroupSettings {
            broadcast: false,
            ack_timeout_ms: 30_000,
            max_deliveries: 16,
            filter: "",
            ordered: false,
            retry: None,
        },
        stats: GroupStats { cursor: 3, lag: 0, inflight: 0, ..GroupStats::default() },
    };
    let billing_group = GroupInfo {
        name: billing,
        settings: GroupSettings { ack_timeout_ms: 30_000, max_deliveries: 16, ..billing_settings() },
        stats: GroupStats {
            cursor: 2,
            lag: 0,
            inflight: 1,
            retry: 0,
            delayed: 0,
            dead_lettered: 1,
            oldest_unacked_age_ms: 1500,
            consumers: 2,
        },
    };
    vec![
        named("list-groups-request", "LIST_GROUPS of jobs.", request_v2(10, Request::ListGroups { topic: jobs })),
        named(
            "list-groups-reply",
            "Two groups, the default group first: its settings in effect and its numbers.",
            reply(op::LIST_GROUPS, 10, Reply::Groups(vec![default_group, billing_group])),
        ),
        named(
            "reset-group-request",
            "RESET_GROUP billing to the first message born at or after 2026-01-01T00:00:00.123Z.",
            request_v2(11, Request::ResetGroup { topic: jobs, group: billing, start: Start::Time(BORN_MS) }),
        ),
        named(
            "reset-group-reply",
            "The group's new cursor is message 1.",
            reply(op::RESET_GROUP, 11, Reply::Cursor(1)),
        ),
        named(
            "delete-group-request",
            "DELETE_GROUP billing.",
            request_v2(12, Request::DeleteGroup { topic: jobs, group: billing }),
        ),
        named("delete-group-reply", "It held one message.", reply(op::DELETE_GROUP, 12, Reply::Count(1))),
        named(
            "unknown-group-reply",
            "An error reply (version 2): an ACK for billing after DELETE_GROUP gets UNKNOWN_GROUP (status 18). The message text is an example.",
            error(op::ACK, 13, ErrorCode::UnknownGroup, "no group billing in topic jobs"),
        ),
    ]
}

// ---------------------------------------------------------------------------
// Encoding, with the encoders the broker and the client use.
// ---------------------------------------------------------------------------

/// Appends `frame` as the broker's encoders write it.
pub fn encode_reply(out: &mut Vec<u8>, frame: &ReplyFrame<'_>) {
    let (op, id) = (frame.op, frame.request_id);
    match &frame.reply {
        Reply::Hello { version, limits, map_epoch } => encode_hello_reply(out, id, *version, limits, *map_epoch),
        Reply::Pong => encode_empty_reply(out, op, id),
        Reply::Produced { first_id, count } => encode_produce_reply(out, id, *first_id, *count),
        Reply::Deduplicated { first_id, count, duplicates } => {
            runnel::codec::encode_dedup_produce_reply(out, id, *first_id, *count, duplicates)
        }
        Reply::Messages { topic, messages } | Reply::Pushed { topic, messages } => {
            // Replies need no version: a message's flags say what it
            // carries, and the highest version writes whatever it has.
            let mut w = if op == runnel::codec::op::PUSH {
                MessagesWriter::begin_pushed(out, id, topic, CODEC_VERSION_MAX)
            } else {
                MessagesWriter::begin(out, id, topic, CODEC_VERSION_MAX)
            };
            for m in messages {
                w.push(out, m);
            }
            w.finish(out);
        }
        Reply::Subscribed { subscription } => encode_subscribed_reply(out, id, *subscription),
        Reply::Credited { inflight } => encode_credit_reply(out, id, *inflight),
        Reply::AckProduced { done, failed, outputs } => {
            runnel::codec::ack_produce::encode_reply(out, id, *done, failed, outputs)
        }
        Reply::Ids { done, failed } => encode_ids_reply(out, op, id, *done, failed),
        Reply::Stats(sections) => {
            let mut w = StatsWriter::begin(out, id);
            for (name, kvs) in sections {
                w.section(out, name);
                for (key, value) in kvs {
                    w.kv(out, key, *value);
                }
            }
            w.finish(out);
        }
        Reply::Created { created } => encode_u64_reply(out, op, id, u64::from(*created)),
        Reply::Count(n) => encode_u64_reply(out, op, id, *n),
        Reply::Topics(topics) => encode_topics_reply(out, id, topics),
        Reply::GroupCreated { created, cursor } => encode_group_created_reply(out, id, *created, *cursor),
        Reply::Groups(groups) => encode_groups_reply(out, id, groups),
        Reply::Cursor(cursor) | Reply::Due(cursor) => encode_u64_reply(out, op, id, *cursor),
        Reply::Inspected(entries) => {
            runnel::codec::inspect::encode_inspected_reply(out, (op, id), entries, runnel::codec::CODEC_VERSION_MAX)
        }
        Reply::Error { code, message } => {
            let code = ErrorCode::from_u8(*code).unwrap_or_else(|| panic!("error code {code} is not an ErrorCode"));
            encode_error(out, op, id, code, message);
        }
    }
}

/// The bytes of an expected frame.
pub fn encode(expect: &Expect) -> Vec<u8> {
    let mut out = Vec::new();
    match expect {
        Expect::Request(f, version) => encode_request(&mut out, f.request_id, &f.request, *version),
        Expect::Reply(f) => encode_reply(&mut out, f),
    }
    out
}

// ---------------------------------------------------------------------------
// Scheduled messages (version 3): docs/protocol.md, "Scheduled messages
// (version 3)".
// ---------------------------------------------------------------------------

/// A request in the version-3 layout.
pub fn request_v3(request_id: u32, request: Request<'static>) -> Expect {
    Expect::Request(Frame { request_id, request }, 3)
}

/// Properties holding one time property.
fn time_props(kind: u8, ms: u64) -> Props<'static> {
    let mut bytes = Vec::new();
    props::put_time(&mut bytes, kind, ms);
    Props::parse(bytes.leak(), 3, &PropsLimits::ANY).expect("valid properties") // ok: test data
}

/// The examples of scheduled messages, in the doc's order.
pub fn doc_frames_schedule() -> Vec<Named> {
    let jobs = "jobs";
    let in_a_minute = time_props(props::PROP_DELAY, 60_000);
    let at_one = time_props(props::PROP_DELIVER_AT, BORN_MS + 3_600_000);
    vec![
        named(
            "produce-scheduled-request",
            "PRODUCE (version 3) two messages to jobs: hello, due a minute after the broker receives it, and later, due at 2026-01-01T01:00:00.123Z.",
            request_v3(
                20,
                Request::Produce {
                    topic: jobs,
                    flags: 0,
                    batch: batch_v2(&[(in_a_minute, b"hello"), (at_one, b"later")]),
                },
            ),
        ),
        named(
            "produce-scheduled-reply",
            "Both are stored, as messages 1 and 2, and scheduled.",
            reply(op::PRODUCE, 20, Reply::Produced { first_id: 1, count: 2 }),
        ),
        named(
            "reschedule-request",
            "RESCHEDULE message 2 of jobs to 2026-01-01T02:00:00.123Z.",
            request_v3(21, Request::Reschedule { topic: jobs, id: 2, when: schedule::When::At(BORN_MS + 7_200_000) }),
        ),
        named("reschedule-reply", "Its new delivery time.", reply(op::RESCHEDULE, 21, Reply::Due(BORN_MS + 7_200_000))),
        named("cancel-request", "CANCEL message 1 of jobs.", request_v3(22, Request::Cancel { topic: jobs, id: 1 })),
        named(
            "cancel-reply",
            "It is gone; it was due at 2026-01-01T00:01:00.123Z (received at 00:00:00.123).",
            reply(op::CANCEL, 22, Reply::Due(BORN_MS + 60_000)),
        ),
        named(
            "not-scheduled-reply",
            "An error reply (version 3): a second CANCEL of message 1 gets NOT_SCHEDULED (status 25). The message text is an example.",
            error(op::CANCEL, 23, ErrorCode::NotScheduled, "message 1 of topic jobs is not scheduled"),
        ),
    ]
}

// ---------------------------------------------------------------------------
// Version 6: docs/protocol.md, "HELLO (0x01)".
// ---------------------------------------------------------------------------

/// The examples of version 6: a HELLO that negotiates it, and its reply
/// with every limit.
pub fn doc_frames_v6() -> Vec<Named> {
    let limits = DecodeLimits::from(&Limits::default());
    vec![
        named(
            "hello-v6-request",
            "HELLO: the client speaks versions 1 to 6 and has no token.",
            request(1, Request::Hello { min_version: 1, max_version: V6, token: b"" }),
        ),
        named(
            "hello-v6-reply",
            "A broker that speaks version 6 chooses it and reports every limit, those of push credit, keys, dedup ids, NACK reasons and LOOKUP included: its defaults here.",
            reply(op::HELLO, 1, Reply::Hello { version: V6, limits: limits.reported(V6), map_epoch: 0 }),
        ),
    ]
}
