//! The frames of docs/protocol.md's examples of the low-latency path
//! (protocol version 3: push subscriptions, durability per produce), as
//! codec values: tests/protocol_doc.rs holds the doc's hex dumps to them. Kept apart from `frames.rs` so that each capability's
//! examples are one list.

use runnel::codec::*;

use super::frames::{Expect, Named, message, named, reply};

/// The version of the examples' requests.
fn request_v3(request_id: u32, request: Request<'static>) -> Expect {
    Expect::Request(Frame { request_id, request }, SINCE_PUSH)
}

/// ACK_PRODUCE of the doc's example.
fn ack_produce() -> Request<'static> {
    let mut outputs = Vec::new();
    ack_produce::encode_output(&mut outputs, "mail", &hello_batch());
    let outputs = ack_produce::Outputs { count: 1, bytes: outputs.leak() };
    let mut ids = Vec::new();
    encode_ids(&mut ids, &[2]);
    Request::AckProduce { topic: "jobs", group: "billing", ids: Ids { bytes: ids.leak() }, outputs }
}

/// One message, `hello`, without properties, in the version-2 layout.
fn hello_batch() -> Batch<'static> {
    let mut bytes = Vec::new();
    encode_message(&mut bytes, &Props::EMPTY, b"hello");
    Batch { count: 1, bytes: bytes.leak(), with_props: true }
}

/// Every push example docs/protocol.md must carry, in the order of the
/// doc: one session on one connection.
pub fn doc_frames_push() -> Vec<Named> {
    let (jobs, billing) = ("jobs", "billing");
    let subscribe = Request::Subscribe { topic: jobs, group: billing, credit: 10, ack_timeout_ms: 0 };
    vec![
        named(
            "subscribe-request",
            "SUBSCRIBE to billing of jobs with a credit of 10 and the group's ack timeout.",
            request_v3(20, subscribe),
        ),
        named(
            "subscribe-reply",
            "The subscription's id is 3.",
            reply(op::SUBSCRIBE, 20, Reply::Subscribed { subscription: 3 }),
        ),
        named(
            "pushed-reply",
            "A pushed frame of subscription 3: message 2 of jobs. Its op is PUSH with the reply bit (0xef) and its request id the subscription's.",
            reply(op::PUSH, 3, Reply::Pushed { topic: jobs, messages: vec![message(2, 1, None, b"world")] }),
        ),
        named(
            "credit-request",
            "CREDIT: subscription 3 may hold 20 messages.",
            request_v3(21, Request::Credit { subscription: 3, credit: 20 }),
        ),
        named(
            "credit-reply",
            "The connection holds one message of billing.",
            reply(op::CREDIT, 21, Reply::Credited { inflight: 1 }),
        ),
        named(
            "unsubscribe-request",
            "UNSUBSCRIBE subscription 3.",
            request_v3(22, Request::Unsubscribe { subscription: 3 }),
        ),
        named(
            "unsubscribe-reply",
            "The one message it held returns to billing.",
            reply(op::UNSUBSCRIBE, 22, Reply::Count(1)),
        ),
        named(
            "ack-produce-request",
            "ACK_PRODUCE: ack message 2 of jobs for billing and produce hello to mail, all of it or none.",
            request_v3(24, ack_produce()),
        ),
        named(
            "ack-produce-reply",
            "Message 2 is acked; hello is message 7 of mail.",
            reply(op::ACK_PRODUCE, 24, Reply::AckProduced { done: 1, failed: vec![], outputs: vec![(7, 1)] }),
        ),
        named(
            "ack-produce-failed-reply",
            "Message 2 was no longer in flight to this connection: nothing was done.",
            reply(op::ACK_PRODUCE, 24, Reply::AckProduced { done: 0, failed: vec![2], outputs: vec![] }),
        ),
        named(
            "produce-written-request",
            "PRODUCE (version 3) hello to jobs, acknowledged once written (flags 0x01), before the fdatasync.",
            request_v3(23, Request::Produce { topic: jobs, flags: PRODUCE_FLAG_WRITTEN, batch: hello_batch() }),
        ),
    ]
}
