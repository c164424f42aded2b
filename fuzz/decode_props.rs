//! Properties of `codec::decode_request` and `codec::decode_reply` on any
//! bytes, shared (through `#[path]`) by the `decode` fuzz target and by
//! `tests/stream_props.rs`. Not only "no panic":
//!
//! - a frame takes at least a header and at most the input, exactly what
//!   its length field says, and decoding only those bytes gives the same;
//! - `decode(encode(f)) == f`: re-encoding a decoded request gives back the
//!   consumed bytes (the decoder takes only canonical requests); a decoded
//!   reply, re-encoded with the broker's encoders, decodes to the same
//!   reply in the same number of bytes;
//! - every strict prefix of a decoded frame is "need more", and "need more"
//!   is said only of a frame that has not all arrived;
//! - an error that skips says `Skip::Bytes(n)` with n >= 12, the frame's
//!   length, and the header's op and request id; only a length below the
//!   minimum loses the boundary.
#![allow(dead_code)]

use runnel::codec::{self, DecodeLimits, Decoded, ErrorCode, HEADER_BYTES, REPLY_BIT, Reply, ReplyFrame, Skip, op};

/// The limits a decode input is checked under, picked by its first byte.
pub const LIMIT_SETS: [DecodeLimits; 4] = [
    // The simulation's (fuzz/sim.rs small_limits).
    DecodeLimits {
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
    },
    // The broker's defaults.
    DecodeLimits {
        frame_bytes_max: 8 << 20,
        message_bytes_max: 1 << 20,
        batch_messages_max: 8192,
        topic_name_bytes_max: 200,
        output_bytes_max: 32 << 20,
        fetch_bytes_max: 8 << 20,
        idle_timeout_ms: 600_000,
        group_name_bytes_max: 200,
        tags_per_message_max: 8,
        tag_bytes_max: 128,
        props_bytes_max: 16 << 10,
        filter_bytes_max: 4096,
        subscription_credit_max: 8192,
        key_bytes_max: 128,
        dedup_id_bytes_max: 64,
        nack_reason_bytes_max: 256,
        lookup_results_max: 32,
    },
    DecodeLimits::CLIENT,
    // Tiny: every bound is a few bytes away.
    DecodeLimits {
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
        subscription_credit_max: 1,
        key_bytes_max: 2,
        dedup_id_bytes_max: 1,
        nack_reason_bytes_max: 1,
        lookup_results_max: 1,
    },
];

/// Strict prefixes checked in full up to this frame size; larger frames get
/// a sample, so one input stays cheap.
const PREFIXES_ALL_MAX: usize = 256;

/// What a header's length field says the frame takes (`buf.len() >= 4`).
fn claimed(buf: &[u8]) -> usize {
    u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize + 4
}

/// Strict prefix lengths of a frame of `n` bytes worth checking.
fn prefixes(n: usize) -> Vec<usize> {
    if n <= PREFIXES_ALL_MAX {
        return (0..n).collect();
    }
    let mut v: Vec<usize> = (0..=HEADER_BYTES + 8).collect();
    v.extend([n / 2, n - 2, n - 1]);
    v
}

/// Checks `decode_request(buf)` against the bytes, under `limits`, in the
/// layouts of protocol `version`.
pub fn check_request(buf: &[u8], limits: &DecodeLimits, version: u16, ctx: &str) {
    let result = codec::decode_request(buf, limits, version);
    assert_eq!(codec::decode_request(buf, limits, version), result, "{ctx}: not deterministic");
    let max = limits.frame_bytes_max as usize;
    match &result {
        Ok(Decoded::Frame(frame, n)) => {
            let n = *n;
            assert!((HEADER_BYTES..=buf.len()).contains(&n), "{ctx}: consumed {n} of {} bytes", buf.len());
            assert_eq!(n, claimed(buf), "{ctx}: consumed other than the length field says");
            assert!(n <= max, "{ctx}: took a frame over frame_bytes_max");
            let mut again = Vec::with_capacity(n);
            codec::encode_request(&mut again, frame.request_id, &frame.request, version);
            assert!(again == buf[..n], "{ctx}: encode(decode(bytes)) != bytes for {frame:?}");
            assert_eq!(codec::decode_request(&again, limits, version), result, "{ctx}: decode(encode(f)) != f");
            for p in prefixes(n) {
                let r = codec::decode_request(&buf[..p], limits, version);
                assert_eq!(r, Ok(Decoded::NeedMore), "{ctx}: a {p}-byte prefix of a {n}-byte frame");
            }
        }
        Ok(Decoded::NeedMore) => {
            let incomplete = buf.len() < 4
                || (claimed(buf) >= HEADER_BYTES
                    && (buf.len() < HEADER_BYTES || (claimed(buf) <= max && buf.len() < claimed(buf))));
            assert!(incomplete, "{ctx}: need more, but the frame (or its refusal) is all there");
        }
        Err(e) => {
            assert!(!e.message.is_empty(), "{ctx}: an error without a message");
            match e.skip {
                Skip::Close => {
                    assert_eq!((e.code, e.op, e.request_id), (ErrorCode::Malformed, 0, 0), "{ctx}");
                    assert!(buf.len() >= 4 && claimed(buf) < HEADER_BYTES, "{ctx}: lost the boundary of a good length");
                }
                Skip::Bytes(n) => {
                    assert!(n >= HEADER_BYTES, "{ctx}: Skip::Bytes({n}) is shorter than a header");
                    assert!(buf.len() >= HEADER_BYTES, "{ctx}: refused a frame before its header came");
                    assert_eq!(n, claimed(buf), "{ctx}: skips other than the length field says");
                    assert_eq!(
                        (e.op, e.request_id),
                        (buf[4], u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]])),
                        "{ctx}"
                    );
                    if e.code == ErrorCode::FrameTooLarge {
                        assert!(n > max, "{ctx}: {n} bytes is not over frame_bytes_max {max}");
                    } else {
                        assert!(n <= buf.len(), "{ctx}: refused a {n}-byte frame before it all came");
                        assert!(n <= max, "{ctx}: a frame over frame_bytes_max refused as {:?}", e.code);
                        let alone = codec::decode_request(&buf[..n], limits, version);
                        assert_eq!(alone, result, "{ctx}: the refusal depends on bytes after the frame");
                    }
                }
            }
        }
    }
}

/// Encodes `f` with the broker's reply encoders.
pub fn encode_reply(f: &ReplyFrame<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    let rid = f.request_id;
    match &f.reply {
        Reply::Error { code, message } => {
            let start = codec::begin_frame(&mut out, f.op | REPLY_BIT, *code, rid);
            codec::put_str(&mut out, message.as_bytes());
            codec::end_frame(&mut out, start);
        }
        Reply::Hello { version, limits, map_epoch } => {
            codec::encode_hello_reply(&mut out, rid, *version, limits, *map_epoch)
        }
        Reply::Pong => codec::encode_empty_reply(&mut out, f.op, rid),
        Reply::Produced { first_id, count } => codec::encode_produce_reply(&mut out, rid, *first_id, *count),
        Reply::Deduplicated { first_id, count, duplicates } => {
            codec::encode_dedup_produce_reply(&mut out, rid, *first_id, *count, duplicates)
        }
        Reply::Messages { topic, messages } | Reply::Pushed { topic, messages } => {
            // Replies need no version: the highest writes whatever a
            // message carries, and only that.
            let mut w = if f.op == codec::op::PUSH {
                codec::MessagesWriter::begin_pushed(&mut out, rid, topic, codec::CODEC_VERSION_MAX)
            } else {
                codec::MessagesWriter::begin(&mut out, rid, topic, codec::CODEC_VERSION_MAX)
            };
            for m in messages {
                w.push(&mut out, m);
            }
            w.finish(&mut out);
        }
        Reply::Subscribed { subscription } => codec::encode_subscribed_reply(&mut out, rid, *subscription),
        Reply::Credited { inflight } => codec::encode_credit_reply(&mut out, rid, *inflight),
        Reply::AckProduced { done, failed, outputs } => {
            codec::ack_produce::encode_reply(&mut out, rid, *done, failed, outputs)
        }
        Reply::Ids { done, failed } => codec::encode_ids_reply(&mut out, f.op, rid, *done, failed),
        Reply::Stats(sections) => {
            let mut w = codec::StatsWriter::begin(&mut out, rid);
            for (name, kvs) in sections {
                w.section(&mut out, name);
                for (k, v) in kvs {
                    w.kv(&mut out, k, *v);
                }
            }
            w.finish(&mut out);
        }
        Reply::Created { created } => codec::encode_u64_reply(&mut out, op::CREATE_TOPIC, rid, u64::from(*created)),
        Reply::Count(n) => codec::encode_u64_reply(&mut out, f.op, rid, *n),
        Reply::Topics(topics) => codec::encode_topics_reply(&mut out, rid, topics),
        Reply::GroupCreated { created, cursor } => codec::encode_group_created_reply(&mut out, rid, *created, *cursor),
        Reply::Groups(groups) => codec::encode_groups_reply(&mut out, rid, groups),
        Reply::Cursor(cursor) | Reply::Due(cursor) => codec::encode_u64_reply(&mut out, f.op, rid, *cursor),
        Reply::Inspected(entries) => {
            codec::inspect::encode_inspected_reply(&mut out, (f.op, rid), entries, codec::CODEC_VERSION_MAX)
        }
    }
    out
}

/// Checks `decode_reply(buf, frame_bytes_max)` against the bytes.
pub fn check_reply(buf: &[u8], frame_bytes_max: usize, ctx: &str) {
    let result = codec::decode_reply(buf, frame_bytes_max);
    assert_eq!(codec::decode_reply(buf, frame_bytes_max), result, "{ctx}: not deterministic");
    match &result {
        Ok(Decoded::Frame(f, n)) => {
            let n = *n;
            assert!((HEADER_BYTES..=buf.len()).contains(&n), "{ctx}: consumed {n} of {} bytes", buf.len());
            assert!(n <= frame_bytes_max, "{ctx}: took a reply over the client's limit");
            assert_eq!(n, claimed(buf), "{ctx}: consumed other than the length field says");
            assert!(buf[4] & REPLY_BIT != 0, "{ctx}: took a request for a reply");
            assert_eq!(
                (f.op, f.request_id),
                (buf[4] & !REPLY_BIT, u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]])),
                "{ctx}"
            );
            assert_eq!(codec::decode_reply(&buf[..n], frame_bytes_max), result, "{ctx}: looked past the frame");
            // Bytes past a reply's layout are ignored (docs/protocol.md,
            // "Replies may grow"), so the re-encoding may be shorter.
            let again = encode_reply(f);
            assert!(again.len() <= n, "{ctx}: {f:?} re-encodes longer than {n} bytes");
            match codec::decode_reply(&again, usize::MAX) {
                Ok(Decoded::Frame(g, m)) => {
                    assert_eq!((&g, m), (f, again.len()), "{ctx}: decode(encode(reply)) != reply")
                }
                other => panic!("{ctx}: {f:?} re-encoded does not decode: {other:?}"),
            }
            for p in prefixes(n) {
                let r = codec::decode_reply(&buf[..p], frame_bytes_max);
                assert_eq!(r, Ok(Decoded::NeedMore), "{ctx}: a {p}-byte prefix of a {n}-byte reply");
            }
        }
        Ok(Decoded::NeedMore) => {
            let incomplete = buf.len() < HEADER_BYTES || buf.len() < claimed(buf);
            assert!(incomplete, "{ctx}: need more, but the reply is all there");
        }
        Err(e) => assert!(!e.is_empty(), "{ctx}: an error without a message"),
    }
}

/// The decode fuzz target's whole check: the first byte picks the limits
/// (its low bits) and the protocol version (bit 0x40), the rest is the
/// buffer, decoded as a request and as a reply.
pub fn check_decode(data: &[u8], ctx: &str) {
    let (pick, buf) = match data.split_first() {
        Some((p, rest)) => (*p, rest),
        None => (0, data),
    };
    let limits = &LIMIT_SETS[pick as usize % LIMIT_SETS.len()];
    let version = if pick & 0x40 != 0 { 2 } else { 1 };
    check_request(buf, limits, version, ctx);
    let reply_max = if pick & 0x80 != 0 { 64 } else { usize::MAX };
    check_reply(buf, reply_max, ctx);
}
