//! Push subscriptions on the wire (protocol version 3): SUBSCRIBE, CREDIT
//! and UNSUBSCRIBE with their replies, and the pushed frame that carries a
//! subscription's messages. docs/protocol.md ("Push subscriptions (version
//! 3)") is the contract.
//!
//! A pushed frame answers no request, so it must be told apart from the
//! replies by its header alone (a client reading replies in request order
//! sets it aside): its op is PUSH with the reply bit, 0xEF, which no reply
//! has (`reply_op`), and its request id is the subscription's id. Its body is a
//! FETCH reply's (topic, count, messages), so a client decodes both alike.

use super::{BodyError, DecodeLimits, ErrorCode, REPLY_BIT, Rd, Request, begin_frame, end_frame, malformed};
use super::{group, op, put_str, put_u32, topic};

/// The first protocol version with push subscriptions. Every version check
/// of this file's frames names it, so renumbering is one line.
pub const SINCE_PUSH: u16 = 3;

/// The body of a push op (`op` is SUBSCRIBE, CREDIT or UNSUBSCRIBE).
pub(super) fn parse_push_op<'a>(op: u8, rd: &mut Rd<'a>, limits: &DecodeLimits) -> Result<Request<'a>, BodyError> {
    let short = || malformed("body too short");
    Ok(match op {
        op::SUBSCRIBE => {
            let topic = topic(rd, limits, false)?;
            let group = group::group(rd, limits)?;
            let credit = rd.u32().ok_or_else(short)?;
            let ack_timeout_ms = rd.u32().ok_or_else(short)?;
            Request::Subscribe { topic, group, credit, ack_timeout_ms }
        }
        op::CREDIT => {
            let subscription = rd.u32().ok_or_else(short)?;
            Request::Credit { subscription, credit: rd.u32().ok_or_else(short)? }
        }
        op::UNSUBSCRIBE => Request::Unsubscribe { subscription: rd.u32().ok_or_else(short)? },
        other => return Err(BodyError(ErrorCode::UnknownOp, format!("unknown opcode 0x{other:02x}"))),
    })
}

/// Appends the body of a version-3 op (ACK_PRODUCE's is `ack_produce.rs`'s).
pub(super) fn encode_push_op(out: &mut Vec<u8>, req: &Request<'_>) {
    match *req {
        Request::Subscribe { topic, group, credit, ack_timeout_ms } => {
            put_str(out, topic.as_bytes());
            put_str(out, group.as_bytes());
            put_u32(out, credit);
            put_u32(out, ack_timeout_ms);
        }
        Request::Credit { subscription, credit } => {
            put_u32(out, subscription);
            put_u32(out, credit);
        }
        Request::Unsubscribe { subscription } => put_u32(out, subscription),
        Request::AckProduce { topic, group, ids, outputs } => {
            super::ack_produce::encode(out, topic, group, ids, outputs)
        }
        _ => unreachable!("not a push op: {req:?}"),
    }
}

/// Appends the reply to SUBSCRIBE: the subscription's id.
pub fn encode_subscribed_reply(out: &mut Vec<u8>, request_id: u32, subscription: u32) {
    let start = begin_frame(out, op::SUBSCRIBE | REPLY_BIT, 0, request_id);
    put_u32(out, subscription);
    end_frame(out, start);
}

/// Appends the reply to CREDIT: how many of the group's messages are in
/// flight to the connection now.
pub fn encode_credit_reply(out: &mut Vec<u8>, request_id: u32, inflight: u32) {
    let start = begin_frame(out, op::CREDIT | REPLY_BIT, 0, request_id);
    put_u32(out, inflight);
    end_frame(out, start);
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::SINCE_PUSH;

    fn requests() -> Vec<Request<'static>> {
        vec![
            Request::Subscribe { topic: "t", group: "g", credit: 7, ack_timeout_ms: 100 },
            Request::Subscribe { topic: "t", group: "", credit: 0, ack_timeout_ms: 0 },
            Request::Credit { subscription: 3, credit: u32::MAX },
            Request::Unsubscribe { subscription: 9 },
        ]
    }

    fn limits() -> DecodeLimits {
        DecodeLimits::from(&crate::limits::Limits::default())
    }

    #[test]
    fn push_requests_round_trip_and_every_prefix_needs_more() {
        for req in requests() {
            assert_eq!(req.version_needed(), SINCE_PUSH);
            let mut bytes = Vec::new();
            encode_request(&mut bytes, 5, &req, SINCE_PUSH);
            match decode_request(&bytes, &limits(), SINCE_PUSH) {
                Ok(Decoded::Frame(f, n)) => assert_eq!((f, n), (Frame { request_id: 5, request: req }, bytes.len())),
                other => panic!("{req:?}: {other:?}"),
            }
            for cut in 0..bytes.len() {
                assert_eq!(decode_request(&bytes[..cut], &limits(), SINCE_PUSH), Ok(Decoded::NeedMore), "{req:?}");
            }
        }
    }

    #[test]
    fn push_ops_are_unknown_before_their_version_and_push_is_no_request() {
        for req in requests() {
            let mut bytes = Vec::new();
            encode_request(&mut bytes, 5, &req, SINCE_PUSH);
            let e = decode_request(&bytes, &limits(), SINCE_PUSH - 1).expect_err("refused");
            assert_eq!((e.code, e.skip), (ErrorCode::UnknownOp, Skip::Bytes(bytes.len())));
        }
        let mut bytes = Vec::new();
        let start = begin_frame(&mut bytes, op::PUSH, 0, 1);
        end_frame(&mut bytes, start);
        let e = decode_request(&bytes, &limits(), SINCE_PUSH).expect_err("refused");
        assert_eq!(e.code, ErrorCode::UnknownOp);
    }

    #[test]
    fn produce_flags_are_a_byte_after_the_topic_from_version_3() {
        let mut body = Vec::new();
        encode_batch(&mut body, &[b"x"]);
        let v3 = |flags| {
            let mut body = Vec::new();
            encode_message(&mut body, &Props::EMPTY, b"x");
            let mut out = Vec::new();
            let batch = Batch { count: 1, bytes: &body, with_props: true };
            encode_request(&mut out, 1, &Request::Produce { topic: "t", flags, batch }, SINCE_PRODUCE_FLAGS);
            out
        };
        let written = v3(PRODUCE_FLAG_WRITTEN);
        assert_eq!(written[12 + 3], PRODUCE_FLAG_WRITTEN, "after the topic string");
        match decode_request(&written, &limits(), SINCE_PRODUCE_FLAGS) {
            Ok(Decoded::Frame(f, _)) => assert!(matches!(f.request, Request::Produce { flags: 1, .. })),
            other => panic!("{other:?}"),
        }
        let unknown = v3(0x80);
        let e = decode_request(&unknown, &limits(), SINCE_PRODUCE_FLAGS).expect_err("refused");
        assert_eq!(e.code, ErrorCode::Malformed);
        let batch = Batch { count: 1, bytes: &body, with_props: false };
        let plain = Request::Produce { topic: "t", flags: 0, batch };
        assert_eq!(plain.version_needed(), 1, "no flags: version 1's layout can carry it");
        let flagged = Request::Produce { topic: "t", flags: PRODUCE_FLAG_WRITTEN, batch };
        assert_eq!(flagged.version_needed(), SINCE_PRODUCE_FLAGS);
    }

    #[test]
    fn no_reply_op_is_the_pushed_frames_op() {
        for op in 0..=u8::MAX {
            let want = match op | REPLY_BIT {
                0xEF => 0xFF,
                other => other,
            };
            assert_eq!(reply_op(op), want, "op {op:#04x}");
            let mut out = Vec::new();
            encode_error(&mut out, op, 1, ErrorCode::UnknownOp, "no");
            assert_ne!(out[4], op::PUSH | REPLY_BIT, "the error reply to op {op:#04x}");
        }
    }

    #[test]
    fn a_push_body_with_bytes_left_over_is_malformed() {
        let mut bytes = Vec::new();
        encode_request(&mut bytes, 5, &Request::Unsubscribe { subscription: 1 }, SINCE_PUSH);
        bytes.push(0);
        let len = (bytes.len() - 4) as u32;
        bytes[..4].copy_from_slice(&len.to_le_bytes());
        assert_eq!(decode_request(&bytes, &limits(), SINCE_PUSH).expect_err("refused").code, ErrorCode::Malformed);
    }

    #[test]
    fn a_pushed_frame_is_told_apart_by_its_op_and_carries_messages() {
        let mut out = Vec::new();
        let mut w = MessagesWriter::begin_pushed(&mut out, 42, "t", SINCE_PUSH);
        let m = Message {
            id: 1,
            born_ms: 2,
            delivery_count: 1,
            dead: None,
            origin_group: "",
            props: Props::EMPTY,
            payload: b"x",
        };
        w.push(&mut out, &m);
        w.finish(&mut out);
        assert_eq!(out[4], 0xEF, "PUSH with the reply bit");
        match decode_reply(&out, usize::MAX) {
            Ok(Decoded::Frame(f, n)) => {
                assert_eq!((f.op, f.request_id, n), (op::PUSH, 42, out.len()));
                assert_eq!(f.reply, Reply::Pushed { topic: "t", messages: vec![m] });
            }
            other => panic!("{other:?}"),
        }
    }
}
