//! The frames of docs/protocol.md's examples of keys and inspection
//! (protocol version 4: a keyed PRODUCE, LOOKUP, PEEK), as codec values:
//! tests/protocol_doc.rs holds the doc's hex dumps to them, and
//! tests/vectors.rs writes them to docs/vectors/protocol-v4.json. Kept
//! apart from `frames.rs` so that each capability's examples are one list.

use runnel::codec::inspect::{GroupLine, HeldMessage, Inspected, State};
use runnel::codec::*;

use super::frames::{BORN_MS, Expect, Named, batch_v2, named, reply};

/// A request in the version-4 layout.
fn request_v4(request_id: u32, request: Request<'static>) -> Expect {
    Expect::Request(Frame { request_id, request }, V4)
}

/// Properties holding one key.
fn key_props(key: &[u8]) -> Props<'static> {
    let mut bytes = Vec::new();
    props::put_key(&mut bytes, key);
    Props::parse(bytes.leak(), V4, &PropsLimits::ANY).expect("valid properties") // ok: test data
}

/// A group line with the fields its state does not use at 0.
fn line(name: &'static str, state: State) -> GroupLine<'static> {
    GroupLine { name, state, deliveries: 0, until_ms: 0, consumer: 0, dead_reason: 0, last_nack_reason: "" }
}

/// Message 4 of the examples, in flight to consumer 7 of billing and
/// ready for audit; with its payload if `payload`.
fn message_4(payload: bool) -> Inspected<'static> {
    let billing =
        GroupLine { deliveries: 1, until_ms: BORN_MS + 30_000, consumer: 7, ..line("billing", State::InFlight) };
    let message = HeldMessage {
        born_ms: BORN_MS,
        dead: None,
        props: key_props(b"order-17"),
        len: 5,
        payload: payload.then_some(&b"hello"[..]),
    };
    Inspected { id: 4, message: Some(message), groups: vec![billing, line("audit", State::Ready)] }
}

/// Every example of keys and inspection docs/protocol.md must carry, in
/// the order of the doc.
pub fn doc_frames_inspect() -> Vec<Named> {
    let orders = "orders";
    let dead = GroupLine { deliveries: 3, dead_reason: DeadReason::Nacked as u8, ..line("audit", State::DeadLettered) };
    let gone = Inspected { id: 2, message: None, groups: vec![line("billing", State::Done), dead] };
    vec![
        named(
            "produce-keyed-request",
            "PRODUCE (version 4) hello to orders with the key order-17.",
            request_v4(
                30,
                Request::Produce { topic: orders, flags: 0, batch: batch_v2(&[(key_props(b"order-17"), b"hello")]) },
            ),
        ),
        named(
            "produce-keyed-reply",
            "It is message 4.",
            reply(op::PRODUCE, 30, Reply::Produced { first_id: 4, count: 1 }),
        ),
        named(
            "lookup-request",
            "LOOKUP the messages of orders with the key order-17.",
            request_v4(31, Request::Lookup { topic: orders, key: b"order-17" }),
        ),
        named(
            "lookup-reply",
            "Two, newest first: message 4, in flight to consumer 7 of billing until 30 s after it was produced and ready for audit; and message 2, which orders no longer holds: billing is done with it, audit dead-lettered it after its third delivery was NACKed.",
            reply(op::LOOKUP, 31, Reply::Inspected(vec![message_4(false), gone])),
        ),
        named("peek-request", "PEEK message 4 of orders.", request_v4(32, Request::Peek { topic: orders, id: 4 })),
        named(
            "peek-reply",
            "Message 4 with its payload, hello, and its state in both groups.",
            reply(op::PEEK, 32, Reply::Inspected(vec![message_4(true)])),
        ),
        named(
            "not-found-reply",
            "PEEK of message 2, which orders no longer holds: NOT_FOUND. The message text is an example.",
            reply(
                op::PEEK,
                33,
                Reply::Error { code: ErrorCode::NotFound as u8, message: "topic orders holds no message 2" },
            ),
        ),
    ]
}
