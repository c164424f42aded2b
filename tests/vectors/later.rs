//! The vectors of versions 3 to 5 beyond the doc's examples: ordering by
//! key, broadcast groups and NACK reasons as they look on the wire, the
//! refusals of version-4 bits in a version-3 session, and the inspection
//! states version 5 adds, beside what a version-4 session is told of the
//! same message.

use runnel::codec::inspect::{GroupLine, HeldMessage, Inspected, State};

use super::*;

/// A request in the layouts of `version`, as the codec encodes it.
fn encoded_in(version: u16, request_id: u32, request: Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(&mut out, request_id, &request, version);
    out
}

/// A request of the version-4 layouts.
fn request_v4(request_id: u32, request: Request<'static>) -> Expect {
    Expect::Request(Frame { request_id, request }, V4)
}

/// A property list of one entry of `kind`, `value` as given.
fn one_prop(kind: u8, value: &[u8]) -> Props<'static> {
    let mut bytes = vec![kind];
    bytes.extend_from_slice(&(value.len() as u16).to_le_bytes());
    bytes.extend_from_slice(value);
    Props::parse(bytes.leak(), V4, &PropsLimits::ANY).expect("valid properties") // ok: test data
}

/// A group line with the fields its state does not use at 0.
fn line(name: &'static str, state: State) -> GroupLine<'static> {
    GroupLine { name, state, deliveries: 0, until_ms: 0, consumer: 0, dead_reason: 0, last_nack_reason: "" }
}

/// A PEEK reply of message `id`, held, with `payload`, `props` and these
/// group lines.
fn peeked(request_id: u32, id: u64, props: Props<'static>, groups: Vec<GroupLine<'static>>) -> Expect {
    let message = HeldMessage { born_ms: BORN_MS, dead: None, props, len: 5, payload: Some(b"hello") };
    reply(op::PEEK, request_id, Reply::Inspected(vec![Inspected { id, message: Some(message), groups }]))
}

/// Requests of version 4 a version-3 session refuses: the bits version 4
/// adds are MALFORMED before it.
pub fn refusals_v3_bits() -> Vec<Vector> {
    let ordered = GroupSettings { ordered: true, ..GroupSettings::default() };
    vec![
        refused(
            "create-group-ordered-v3-request",
            "CREATE_GROUP with flag 0x02 ORDERED in a version-3 session: MALFORMED, the bit is version 4's.",
            encoded_in(
                V4,
                32,
                Request::CreateGroup { topic: "orders", group: "shipping", settings: ordered, start: Start::Earliest },
            ),
            ErrorCode::Malformed,
        ),
        refused(
            "nack-reason-v3-request",
            "NACK with flag 0x02 REASON in a version-3 session: MALFORMED, the bit is version 4's.",
            encoded_in(V4, 33, common::retry_frames::nack_with_reason()),
            ErrorCode::Malformed,
        ),
    ]
}

/// Version-4 frames of ordering by key: a group created ordered, listed,
/// and a delivery of a keyed message.
fn ordering_v4() -> Vec<Vector> {
    let ordered = GroupSettings { ordered: true, ..GroupSettings::default() };
    let shown = GroupSettings { ack_timeout_ms: 30_000, max_deliveries: 16, ..ordered };
    let stats = GroupStats { cursor: 5, lag: 1, inflight: 1, consumers: 2, ..GroupStats::default() };
    let key = one_prop(props::PROP_KEY, b"order-17");
    let keyed = Message { props: key, ..message(4, 1, None, b"hello") };
    vec![
        frame(
            "create-group-ordered-request",
            "CREATE_GROUP (version 4) shipping of orders, ordered by key (flags 0x02), from the earliest message.",
            request_v4(
                50,
                Request::CreateGroup { topic: "orders", group: "shipping", settings: ordered, start: Start::Earliest },
            ),
        ),
        frame(
            "list-groups-ordered-reply",
            "LIST_GROUPS of orders (version 4): shipping, ordered by key (flags 0x02), one message in flight and one waiting behind its key (counted in lag).",
            reply(op::LIST_GROUPS, 51, Reply::Groups(vec![GroupInfo { name: "shipping", settings: shown, stats }])),
        ),
        frame(
            "fetch-keyed-reply",
            "A FETCH reply (version 4) of orders for shipping: message 4 with its key, order-17, a property (type 5, flags bit 1); the next message of the key waits until the group is done with it.",
            reply(op::FETCH, 52, Reply::Messages { topic: "orders", messages: vec![keyed] }),
        ),
    ]
}

/// Version-4 frames of a broadcast group: each member on a line of its own.
fn broadcast_v4() -> Vec<Vector> {
    let member = |consumer, state| GroupLine { consumer, ..line("audit", state) };
    let in_flight = GroupLine { deliveries: 1, until_ms: BORN_MS + 30_000, ..member(7, State::InFlight) };
    vec![frame(
        "peek-broadcast-reply",
        "PEEK (version 4) of message 4 of jobs, whose broadcast group audit has two members: one line each, with the member's consumer: in flight to consumer 7, ready for consumer 9.",
        peeked(53, 4, Props::EMPTY, vec![in_flight, member(9, State::Ready)]),
    )]
}

/// Version-4 frames of NACK reasons: where a reason shows after the NACK
/// that gave it.
fn nack_reasons_v4() -> Vec<Vector> {
    let reason = "db timeout";
    let dead = DeadInfo { origin_id: 1, origin_deliveries: 3, reason: DeadReason::Nacked };
    let dead_letter = Message {
        origin_group: "billing",
        props: one_prop(props::PROP_LAST_NACK_REASON, reason.as_bytes()),
        ..message(1, 1, Some(dead), b"hello")
    };
    let billing = GroupLine { deliveries: 1, last_nack_reason: reason, ..line("billing", State::Ready) };
    let audit = GroupLine {
        deliveries: 3,
        dead_reason: DeadReason::Nacked as u8,
        last_nack_reason: reason,
        ..line("audit", State::DeadLettered)
    };
    vec![
        frame(
            "peek-nack-reason-reply",
            "PEEK (version 4) of message 1 of jobs after NACKs saying db timeout: ready again for billing, with the reason its last NACK gave; dead-lettered by audit on its 3rd delivery (dead_reason 2, nacked), with that NACK's reason.",
            peeked(54, 1, Props::EMPTY, vec![billing, audit]),
        ),
        frame(
            "fetch-dlq-nack-reason-reply",
            "A FETCH reply (version 4) from jobs.dlq: message 1 of jobs, dead-lettered by audit after its 3rd delivery was NACKed, carries the last NACK's reason as property 7 last_nack_reason (flags 0x07: dead-letter fields, properties, origin group).",
            reply(op::FETCH, 55, Reply::Messages { topic: "jobs.dlq", messages: vec![dead_letter] }),
        ),
    ]
}

/// Version-4 requests the broker refuses: a NACK reason that is not UTF-8.
fn refusals_v4() -> Vec<Vector> {
    let mut body = Vec::new();
    put_str(&mut body, b"jobs");
    put_str(&mut body, b"billing");
    put_u32(&mut body, 0);
    body.push(NACK_FLAG_REASON);
    put_ids(&mut body, &[1]);
    put_str(&mut body, &[0xff, 0xfe]);
    vec![refused(
        "nack-reason-not-utf8-request",
        "NACK (version 4) whose reason is the bytes ff fe, not UTF-8: BAD_ARGUMENT.",
        raw(op::NACK, 56, &body),
        ErrorCode::BadArgument,
    )]
}

/// Appends a u32 count and the ids.
fn put_ids(out: &mut Vec<u8>, v: &[u64]) {
    put_u32(out, v.len() as u32);
    encode_ids(out, v);
}

/// The groups of the inspection examples of waits: `billing` with a retry
/// policy, `shipping` ordered by key; message 5 waits in both, as a
/// session of `version` is told.
fn waits(version: u16) -> Vec<GroupLine<'static>> {
    let billing = GroupLine {
        deliveries: 2,
        until_ms: BORN_MS + 1600,
        ..line("billing", State::RetryWaiting.for_version(version))
    };
    vec![billing, line("shipping", State::BehindKey.for_version(version))]
}

/// What a version-4 session is told of the waits version 5 names.
pub fn frames_v4() -> Vec<Vector> {
    let mut all = ordering_v4();
    all.extend(broadcast_v4());
    all.extend(nack_reasons_v4());
    all.extend(refusals_v4());
    all.push(frame(
        "peek-retry-waiting-v4-reply",
        "PEEK (version 4) of message 5 of orders, which waits for retry in billing (its retry policy) and behind message 4 of its key in shipping: a version-4 session is told waiting (state 3, until the wait ends) and ready (state 1).",
        peeked(57, 5, one_prop(props::PROP_KEY, b"order-17"), waits(V4)),
    ));
    all
}

/// The frames of version 5: its HELLO, and the two inspection states it
/// adds.
pub fn frames_v5() -> Vec<Vector> {
    let limits = DecodeLimits::from(&Limits::default());
    vec![
        frame(
            "hello-v5-request",
            "HELLO: the client speaks versions 1 to 5 and has no token.",
            request(1, Request::Hello { min_version: 1, max_version: 5, token: b"" }),
        ),
        frame(
            "hello-v5-reply",
            "A broker that speaks version 5 chooses it; the reply is laid out as version 2's.",
            reply(op::HELLO, 1, Reply::Hello { version: V5, limits: limits.reported(V5), map_epoch: 0 }),
        ),
        frame(
            "peek-retry-waiting-reply",
            "PEEK (version 5) of message 5 of orders: waiting for retry in billing until its wait ends (state 8, retry_waiting), held back behind message 4 of its key in shipping (state 9, behind_key).",
            peeked(57, 5, one_prop(props::PROP_KEY, b"order-17"), waits(V5)),
        ),
    ]
}
