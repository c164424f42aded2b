//! The frames of docs/protocol.md's examples of idempotent produce
//! (protocol version 4: a topic's dedup window, dedup ids, the PRODUCE
//! reply that names duplicates), as codec values: tests/protocol_doc.rs
//! holds the doc's hex dumps to them, and tests/vectors.rs publishes them
//! in docs/vectors/protocol-v4.json. Kept apart from `frames.rs` so that
//! each capability's examples are one list.

use runnel::codec::*;

use super::frames::{Expect, Named, batch_v2, error, named, reply};

/// A request in the version-4 layout.
pub fn request_v4(request_id: u32, request: Request<'static>) -> Expect {
    Expect::Request(Frame { request_id, request }, V4)
}

/// Properties holding one dedup id.
pub fn dedup_props(id: &[u8]) -> Props<'static> {
    let mut bytes = Vec::new();
    props::put_dedup_id(&mut bytes, id);
    Props::parse(bytes.leak(), V4, &PropsLimits::ANY).expect("valid properties") // ok: test data
}

/// The examples of idempotent produce, in the doc's order.
pub fn doc_frames_dedup() -> Vec<Named> {
    let settings = TopicSettings { ack_timeout_ms: 0, max_deliveries: 0 };
    let options = TopicOptions { dedup_window_ms: Some(300_000), ..TopicOptions::default() };
    let batch = || batch_v2(&[(dedup_props(b"p1-7"), b"hello"), (dedup_props(b"p1-8"), b"world")]);
    let retry = batch_v2(&[(dedup_props(b"p1-8"), b"world"), (dedup_props(b"p1-9"), b"again")]);
    vec![
        named(
            "create-topic-dedup-request",
            "CREATE_TOPIC (version 4) jobs with the broker's default ack timeout and deliveries and a dedup window of 5 minutes.",
            request_v4(30, Request::CreateTopic { topic: "jobs", settings, options }),
        ),
        named(
            "produce-dedup-request",
            "PRODUCE (version 4) two messages to jobs with the dedup ids p1-7 and p1-8.",
            request_v4(31, Request::Produce { topic: "jobs", flags: 0, batch: batch() }),
        ),
        named(
            "produce-dedup-reply",
            "Both are new: stored as messages 1 and 2. A reply without duplicates is version 1's.",
            reply(op::PRODUCE, 31, Reply::Produced { first_id: 1, count: 2 }),
        ),
        named(
            "produce-dedup-retry-request",
            "PRODUCE (version 4) to jobs of world again with p1-8 (a retry) and a new message, again, with p1-9.",
            request_v4(32, Request::Produce { topic: "jobs", flags: 0, batch: retry }),
        ),
        named(
            "produce-dedup-retry-reply",
            "One message stored, as message 3 (again); message 0 of the batch is a duplicate of message 2 (flags 0x0001 announce the list).",
            reply(op::PRODUCE, 32, Reply::Deduplicated { first_id: 3, count: 1, duplicates: vec![(0, 2)] }),
        ),
        named(
            "dedup-full-reply",
            "An error reply (version 4): the broker holds dedup_entries_max dedup ids (DEDUP_FULL, status 29). The message text is an example.",
            error(op::PRODUCE, 33, ErrorCode::DedupFull, "the broker remembers 1000000 dedup ids"),
        ),
    ]
}
