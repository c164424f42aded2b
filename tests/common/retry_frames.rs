//! The frames of docs/protocol.md's examples of retries that back off
//! (protocol version 4: a group's retry policy in CREATE_GROUP and
//! LIST_GROUPS, a NACK's reason), as codec values: tests/protocol_doc.rs holds the doc's
//! hex dumps to them, and tests/vectors.rs publishes them in
//! docs/vectors/protocol-v4.json. Kept apart from `frames.rs` so that
//! each capability's examples are one list.

use runnel::codec::group::{GroupInfo, GroupStats, Start};
use runnel::codec::*;
use runnel::queue::RetryPolicy;

use super::dedup_frames::request_v4;
use super::frames::{Named, ids, named, reply};

/// The policy of the examples: 100 ms, doubling, at most 30 s, up to 20%
/// shorter (`exp:100ms..30s,x2,jitter=20`).
pub const EXAMPLE_POLICY: RetryPolicy =
    RetryPolicy { initial_ms: 100, multiplier_pct: 200, cap_ms: 30_000, jitter_pct: 20 };

/// The NACK of the examples that says why: message 1 of `jobs` back to
/// `billing`, because of a `db timeout`.
pub fn nack_with_reason() -> Request<'static> {
    Request::Nack {
        topic: "jobs",
        group: "billing",
        delay_ms: 0,
        flags: NACK_FLAG_REASON,
        ids: ids(&[1]),
        reason: "db timeout",
    }
}

/// The examples of retries that back off, in the doc's order.
pub fn doc_frames_retry() -> Vec<Named> {
    let settings = GroupSettings { retry: Some(EXAMPLE_POLICY), ..GroupSettings::default() };
    let shown = GroupSettings { ack_timeout_ms: 30_000, max_deliveries: 16, ..settings };
    let stats = GroupStats { cursor: 9, inflight: 1, delayed: 2, consumers: 1, ..GroupStats::default() };
    vec![
        named(
            "create-group-retry-request",
            "CREATE_GROUP (version 4) billing of jobs with the retry policy exp:100ms..30s,x2,jitter=20.",
            request_v4(40, Request::CreateGroup { topic: "jobs", group: "billing", settings, start: Start::Earliest }),
        ),
        named(
            "list-groups-retry-reply",
            "LIST_GROUPS of jobs (version 4): billing with its retry policy, two messages waiting (NACK delays and retry waits).",
            reply(op::LIST_GROUPS, 41, Reply::Groups(vec![GroupInfo { name: "billing", settings: shown, stats }])),
        ),
        named(
            "nack-reason-request",
            "NACK (version 4) message 1 for billing, saying why: db timeout.",
            request_v4(42, nack_with_reason()),
        ),
    ]
}
