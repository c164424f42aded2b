//! Unit tests of protocol version 2 in the codec, shaped like
//! codec_tests.rs (which holds version 1's): every version-2 frame
//! round-trips, every strict prefix of one is "need more", any split of a
//! stream of them gives the same frames, each way a version-2 request can
//! be wrong gives its code, and garbage decoded in version 2 never panics.
//! The randomized tests use the seeded `testkit::Rng`; a failure names its
//! seed, and `RUNNEL_SEED=<seed> cargo test --lib codec::v2_tests` replays
//! it.

use super::props::{PROP_HEADER, PROP_TAG, put_header, put_tag};
use super::*;
use crate::testkit::{Rng, SeedGuard, seeds};

/// Small limits, so that every bound is reached with a few bytes.
const LIMITS: DecodeLimits = DecodeLimits {
    frame_bytes_max: 4096,
    message_bytes_max: 64,
    batch_messages_max: 4,
    topic_name_bytes_max: 8,
    output_bytes_max: 1 << 20,
    fetch_bytes_max: 256,
    idle_timeout_ms: 0,
    group_name_bytes_max: 8,
    tags_per_message_max: 2,
    tag_bytes_max: 4,
    props_bytes_max: 40,
    filter_bytes_max: 16,
    subscription_credit_max: 3,
    key_bytes_max: 4,
    dedup_id_bytes_max: 5,
    nack_reason_bytes_max: 6,
    lookup_results_max: 7,
};

fn seed_guard(test: &'static str, seed: u64) -> SeedGuard {
    SeedGuard { test, seed, replay: "cargo test --lib codec::v2_tests" }
}

fn encode(request_id: u32, req: &Request<'_>, version: u16) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(&mut out, request_id, req, version);
    out
}

fn decode(buf: &[u8], version: u16) -> Result<Decoded<Frame<'_>>, DecodeError> {
    decode_request(buf, &LIMITS, version)
}

fn refused(buf: &[u8], version: u16) -> ErrorCode {
    match decode(buf, version) {
        Err(e) => {
            assert_eq!(e.skip, Skip::Bytes(buf.len()), "{e:?}");
            e.code
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn props_of(tags: &[&str], headers: &[(&str, &[u8])]) -> Props<'static> {
    let mut bytes = Vec::new();
    for t in tags {
        put_tag(&mut bytes, t);
    }
    for (k, v) in headers {
        put_header(&mut bytes, k, v);
    }
    Props::parse(bytes.leak(), 2, &LIMITS.props()).expect("valid properties")
}

fn batch_of(messages: &[(Props<'static>, &[u8])]) -> Batch<'static> {
    let mut bytes = Vec::new();
    for (p, payload) in messages {
        encode_message(&mut bytes, p, payload);
    }
    Batch { count: messages.len() as u32, bytes: bytes.leak(), with_props: true }
}

fn ids_of(ids: &[u64]) -> Ids<'static> {
    let mut bytes = Vec::new();
    encode_ids(&mut bytes, ids);
    Ids { bytes: bytes.leak() }
}

// ---------------------------------------------------------------------------
// Random version-2 requests and replies.
// ---------------------------------------------------------------------------

fn name(rng: &mut Rng, min: usize, max: usize) -> &'static str {
    const ALPHABET: &[u8] = b"abcXYZ019._-";
    let len = rng.range(min, max);
    let s: String = (0..len).map(|_| rng.pick(ALPHABET) as char).collect();
    s.leak()
}

fn random_props(rng: &mut Rng) -> Props<'static> {
    let tags: Vec<&str> = (0..rng.below(3)).map(|_| name(rng, 1, 4)).collect();
    let len = rng.below(6);
    let value = rng.bytes(len);
    let headers: Vec<(&str, &[u8])> = if rng.one_in(2) { vec![("k", value.leak())] } else { vec![] };
    props_of(&tags, &headers)
}

fn random_start(rng: &mut Rng) -> Start {
    match rng.below(4) {
        0 => Start::Earliest,
        1 => Start::Latest,
        2 => Start::Id(rng.next_u64()),
        _ => Start::Time(rng.next_u64()),
    }
}

/// A valid request of a random op, in version 2's layouts.
fn random_request(rng: &mut Rng) -> Request<'static> {
    let (topic, group) = (name(rng, 1, 8), name(rng, 0, 8));
    let ids = ids_of(&(0..rng.range(1, 4)).map(|_| rng.next_u64()).collect::<Vec<_>>());
    match rng.below(10) {
        0 => {
            let n = rng.range(1, 4);
            let messages: Vec<(Props, &[u8])> = (0..n)
                .map(|_| {
                    let props = random_props(rng);
                    let len = rng.below(16);
                    (props, &*rng.bytes(len).leak())
                })
                .collect();
            Request::Produce { flags: 0, topic, batch: batch_of(&messages) }
        }
        1 => Request::Fetch { topic, group, max_messages: 3, max_bytes: 0, wait_ms: 9, ack_timeout_ms: 7 },
        2 => Request::Ack { topic, group, ids },
        3 => Request::Nack { topic, group, delay_ms: 5, flags: rng.pick(&[0, NACK_FLAG_DEAD_LETTER]), ids, reason: "" },
        4 => Request::Touch { topic, group, ack_timeout_ms: 1, ids },
        5 => Request::Redrive { topic, group, max_messages: rng.below(3) },
        6 => {
            let filter = rng.pick(&["", "*", "a || b", "re:^a"]);
            let settings = GroupSettings {
                broadcast: rng.one_in(2),
                ack_timeout_ms: 3,
                max_deliveries: 2,
                filter,
                ordered: false,
                retry: None,
            };
            Request::CreateGroup { topic, group, settings, start: random_start(rng) }
        }
        7 => Request::DeleteGroup { topic, group },
        8 => Request::ListGroups { topic },
        _ => Request::ResetGroup { topic, group, start: random_start(rng) },
    }
}

fn random_message(rng: &mut Rng) -> Message<'static> {
    let dead = rng.one_in(2).then(|| DeadInfo {
        origin_id: rng.next_u64(),
        origin_deliveries: 3,
        reason: DeadReason::from_u8(rng.range(1u64, 4) as u8).expect("reasons are 1..=4"), // ok: test data
    });
    Message {
        id: rng.next_u64(),
        born_ms: rng.next_u64(),
        delivery_count: 1,
        dead,
        origin_group: if dead.is_some() { name(rng, 0, 8) } else { "" },
        props: random_props(rng),
        payload: {
            let len = rng.below(8);
            rng.bytes(len).leak()
        },
    }
}

/// A valid version-2 reply of a random shape, appended to `out`.
fn random_reply(rng: &mut Rng, out: &mut Vec<u8>) {
    let rid = rng.next_u64() as u32;
    match rng.below(5) {
        0 => encode_hello_reply(out, rid, 2, &LIMITS, rng.next_u64()),
        1 => {
            let mut w = MessagesWriter::begin(out, rid, "t", 2);
            for _ in 0..rng.below(4) {
                w.push(out, &random_message(rng));
            }
            w.finish(out);
        }
        2 => encode_group_created_reply(out, rid, rng.one_in(2), rng.next_u64()),
        3 => encode_u64_reply(out, rng.pick(&[op::DELETE_GROUP, op::RESET_GROUP]), rid, rng.next_u64()),
        _ => {
            let stats = GroupStats { cursor: rng.next_u64(), consumers: 2, ..GroupStats::default() };
            let g = GroupInfo { name: name(rng, 0, 8), settings: GroupSettings::default(), stats };
            encode_groups_reply(out, rid, &vec![g; rng.below(3)]);
        }
    }
}

// ---------------------------------------------------------------------------
// Round trips, prefixes, splits.
// ---------------------------------------------------------------------------

#[test]
fn every_version_2_request_round_trips_and_its_prefixes_need_more() {
    for seed in seeds(300) {
        let _guard = seed_guard("every_version_2_request_round_trips_and_its_prefixes_need_more", seed);
        let mut rng = Rng::new(seed);
        let req = random_request(&mut rng);
        let rid = rng.next_u64() as u32;
        let bytes = encode(rid, &req, 2);
        match decode(&bytes, 2) {
            Ok(Decoded::Frame(f, n)) => assert_eq!((f, n), (Frame { request_id: rid, request: req }, bytes.len())),
            other => panic!("seed {seed}: {req:?} decoded as {other:?}"),
        }
        for p in 0..bytes.len() {
            assert_eq!(decode(&bytes[..p], 2), Ok(Decoded::NeedMore), "seed {seed}: prefix {p} of {req:?}");
        }
    }
}

#[test]
fn every_version_2_reply_round_trips_and_its_prefixes_need_more() {
    for seed in seeds(300) {
        let _guard = seed_guard("every_version_2_reply_round_trips_and_its_prefixes_need_more", seed);
        let mut rng = Rng::new(seed);
        let mut bytes = Vec::new();
        random_reply(&mut rng, &mut bytes);
        let Ok(Decoded::Frame(f, n)) = decode_reply(&bytes, usize::MAX) else {
            panic!("seed {seed}: {bytes:02x?} does not decode")
        };
        assert_eq!(n, bytes.len(), "seed {seed}");
        let mut again = Vec::new();
        encode_like(&mut again, &f);
        assert_eq!(again, bytes, "seed {seed}: {f:?} re-encodes otherwise");
        for p in 0..bytes.len() {
            assert_eq!(decode_reply(&bytes[..p], usize::MAX), Ok(Decoded::NeedMore), "seed {seed}: prefix {p}");
        }
    }
}

/// Encodes a decoded version-2 reply again, with the broker's encoders.
fn encode_like(out: &mut Vec<u8>, f: &ReplyFrame<'_>) {
    match &f.reply {
        Reply::Hello { version, limits, map_epoch } => {
            encode_hello_reply(out, f.request_id, *version, limits, *map_epoch)
        }
        Reply::Messages { topic, messages } => {
            let mut w = MessagesWriter::begin(out, f.request_id, topic, 2);
            for m in messages {
                w.push(out, m);
            }
            w.finish(out);
        }
        Reply::GroupCreated { created, cursor } => encode_group_created_reply(out, f.request_id, *created, *cursor),
        Reply::Count(n) | Reply::Cursor(n) | Reply::Due(n) => encode_u64_reply(out, f.op, f.request_id, *n),
        Reply::Groups(groups) => encode_groups_reply(out, f.request_id, groups),
        other => panic!("not a version-2 reply: {other:?}"),
    }
}

#[test]
fn any_split_of_a_version_2_stream_gives_the_same_frames() {
    for seed in seeds(100) {
        let _guard = seed_guard("any_split_of_a_version_2_stream_gives_the_same_frames", seed);
        let mut rng = Rng::new(seed);
        let reqs: Vec<Request> = (0..rng.range(1, 12)).map(|_| random_request(&mut rng)).collect();
        let stream: Vec<u8> = reqs.iter().enumerate().flat_map(|(i, r)| encode(i as u32, r, 2)).collect();
        // Feed the stream in random pieces into a buffer, as a connection
        // reads it, decoding whatever is whole.
        let (mut buf, mut got, mut at) = (Vec::new(), Vec::new(), 0);
        while at < stream.len() {
            let n = rng.range(1, 40).min(stream.len() - at);
            buf.extend_from_slice(&stream[at..at + n]);
            at += n;
            while let Ok(Decoded::Frame(f, used)) = decode(&buf, 2) {
                got.push(encode(f.request_id, &f.request, 2));
                buf.drain(..used);
            }
        }
        assert!(buf.is_empty(), "seed {seed}: {} bytes left", buf.len());
        assert_eq!(got.len(), reqs.len(), "seed {seed}");
        for (i, (g, r)) in got.iter().zip(&reqs).enumerate() {
            assert_eq!(*g, encode(i as u32, r, 2), "seed {seed}: frame {i}");
        }
    }
}

#[test]
fn garbage_decoded_in_version_2_never_panics_and_skips_whole_frames() {
    for seed in seeds(300) {
        let _guard = seed_guard("garbage_decoded_in_version_2_never_panics_and_skips_whole_frames", seed);
        let mut rng = Rng::new(seed);
        let mut buf = encode(1, &random_request(&mut rng), 2);
        // Mutate a few bytes past the length field, so the frame stays whole.
        for _ in 0..rng.range(1, 4) {
            let i = rng.range(4, buf.len() - 1);
            buf[i] = rng.next_u64() as u8;
        }
        match decode(&buf, 2) {
            Ok(Decoded::Frame(f, n)) => {
                assert_eq!(n, buf.len(), "seed {seed}");
                assert_eq!(encode(f.request_id, &f.request, 2), buf, "seed {seed}: not canonical");
            }
            Ok(Decoded::NeedMore) => panic!("seed {seed}: a whole frame needs more"),
            Err(e) => assert_eq!(e.skip, Skip::Bytes(buf.len()), "seed {seed}: {e:?}"),
        }
        let _ = decode_reply(&buf, usize::MAX);
    }
}

// ---------------------------------------------------------------------------
// Versions: one opcode, its layout by version.
// ---------------------------------------------------------------------------

#[test]
fn a_version_1_session_decodes_version_1_layouts_into_the_default_group() {
    let fetch = Request::Fetch { topic: "t", group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
    let v1 = encode(3, &fetch, 1);
    let v2 = encode(3, &fetch, 2);
    assert_eq!(v2.len(), v1.len() + 2, "version 2 adds the group's length");
    assert_eq!(decode(&v1, 1), Ok(Decoded::Frame(Frame { request_id: 3, request: fetch }, v1.len())));
    assert_eq!(decode(&v2, 2), Ok(Decoded::Frame(Frame { request_id: 3, request: fetch }, v2.len())));
    assert_eq!(decode(&v1, 0), decode(&v1, 1), "before HELLO: version 1's layouts");
    // Each in the other's session is read as another body, and refused
    // here (v2's is too long for v1; v1's group would be a 0x00 byte).
    assert_eq!(refused(&v2, 1), ErrorCode::Malformed);
    assert_eq!(refused(&v1, 2), ErrorCode::BadArgument);
}

#[test]
fn a_version_1_session_refuses_the_group_ops_as_unknown() {
    let reqs = [
        Request::CreateGroup { topic: "t", group: "g", settings: GroupSettings::default(), start: Start::Earliest },
        Request::DeleteGroup { topic: "t", group: "g" },
        Request::ListGroups { topic: "t" },
        Request::ResetGroup { topic: "t", group: "g", start: Start::Latest },
    ];
    for req in reqs {
        assert_eq!(req.version_needed(), 2);
        let bytes = encode(9, &req, 2);
        assert_eq!(refused(&bytes, 1), ErrorCode::UnknownOp, "{req:?}");
        assert_eq!(op::since(req.op()), Some(2));
    }
    assert_eq!(op::since(0x44), None);
    assert_eq!(refused(&encode_raw(0x44, b""), 2), ErrorCode::UnknownOp);
}

fn encode_raw(op: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let start = begin_frame(&mut out, op, 0, 5);
    out.extend_from_slice(body);
    end_frame(&mut out, start);
    out
}

#[test]
fn version_1_needs_no_group_and_no_properties() {
    let plain = Request::Ack { topic: "t", group: "", ids: ids_of(&[1]) };
    assert_eq!(plain.version_needed(), 1);
    assert_eq!(Request::Ack { topic: "t", group: "g", ids: ids_of(&[1]) }.version_needed(), 2);
    let untagged = Request::Produce { flags: 0, topic: "t", batch: batch_of(&[(Props::EMPTY, b"x")]) };
    assert_eq!(untagged.version_needed(), 1, "a version-2 batch without properties fits version 1");
    let tagged = Request::Produce { flags: 0, topic: "t", batch: batch_of(&[(props_of(&["a"], &[]), b"x")]) };
    assert_eq!(tagged.version_needed(), 2);
}

#[test]
#[should_panic(expected = "needs protocol version 2")]
fn encoding_a_group_in_version_1_is_a_programmer_error() {
    encode(1, &Request::Touch { topic: "t", group: "g", ack_timeout_ms: 0, ids: ids_of(&[1]) }, 1);
}

// ---------------------------------------------------------------------------
// Each way a version-2 request can be wrong.
// ---------------------------------------------------------------------------

#[test]
fn group_names_follow_the_topic_rules_and_may_be_empty() {
    let fetch =
        |group| Request::Fetch { topic: "t", group, max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
    for good in ["", "a", "Az09._-x"] {
        assert!(matches!(decode(&encode(1, &fetch(good), 2), 2), Ok(Decoded::Frame(..))), "{good:?}");
    }
    for bad in ["a b", "é", "123456789", "a/b"] {
        assert_eq!(refused(&encode(1, &fetch(bad), 2), 2), ErrorCode::BadArgument, "{bad:?}");
    }
    assert_eq!(check_group_name(b"abc", 3), Ok("abc"));
    assert!(check_group_name(b"abcd", 3).is_err());
    // A bad topic wins over a bad group: it comes first.
    let both_bad =
        Request::Fetch { topic: "a b", group: "a b", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
    assert_eq!(refused(&encode(1, &both_bad, 2), 2), ErrorCode::BadTopic);
}

/// A PRODUCE body of one message with raw properties and a payload.
fn produce_raw(props: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    put_str(&mut body, b"t");
    put_u32(&mut body, 1);
    put_u16(&mut body, props.len() as u16);
    body.extend_from_slice(props);
    put_u32(&mut body, payload.len() as u32);
    body.extend_from_slice(payload);
    encode_raw(op::PRODUCE, &body)
}

#[test]
fn properties_are_judged_message_by_message() {
    let good = props_of(&["ab"], &[("k", b"v")]);
    let ok = produce_raw(good.bytes(), b"x");
    let Ok(Decoded::Frame(f, _)) = decode(&ok, 2) else { panic!("valid") };
    let Request::Produce { batch, .. } = f.request else { panic!("{f:?}") };
    let (props, payload) = batch.messages().next().expect("one message");
    assert_eq!(
        (props.tags().collect::<Vec<_>>(), props.header("k"), payload),
        (vec!["ab"], Some(&b"v"[..]), &b"x"[..])
    );
    assert_eq!(batch.iter().collect::<Vec<_>>(), [&b"x"[..]], "iter gives the payloads");
    assert_eq!(batch.payload_bytes(), (good.bytes().len() + 1) as u64);

    assert_eq!(refused(&produce_raw(&[9, 0, 0], b""), 2), ErrorCode::BadArgument, "an unknown type");
    assert_eq!(refused(&produce_raw(&[PROP_TAG, 5, 0, b'a'], b""), 2), ErrorCode::Malformed, "past the list");
    assert_eq!(refused(&produce_raw(&[PROP_TAG, 5, 0, b'a', b'b', b'c', b'd', b'e'], b""), 2), ErrorCode::BadArgument);
    let three = props_of(&["a", "b"], &[]).bytes().iter().chain(&[PROP_TAG, 1, 0, b'c']).copied().collect::<Vec<_>>();
    assert_eq!(refused(&produce_raw(&three, b""), 2), ErrorCode::BadArgument, "tags_per_message_max + 1");
    let key_only = [PROP_HEADER, 2, 0, 0, 0];
    assert_eq!(refused(&produce_raw(&key_only, b""), 2), ErrorCode::BadArgument, "an empty header key");
    // props_bytes_max, judged from the length before the bytes.
    let mut over = produce_raw(&[0; 41], b"");
    assert_eq!(refused(&over, 2), ErrorCode::BadArgument);
    over.truncate(over.len() - 10);
    let len = (over.len() - 4) as u32;
    over[..4].copy_from_slice(&len.to_le_bytes());
    assert_eq!(refused(&over, 2), ErrorCode::BadArgument, "judged before the bytes are there");
}

#[test]
fn properties_count_toward_message_bytes_max() {
    let p = props_of(&["ab"], &[]);
    let fits = vec![7; LIMITS.message_bytes_max as usize - p.bytes().len()];
    assert!(matches!(decode(&produce_raw(p.bytes(), &fits), 2), Ok(Decoded::Frame(..))));
    let over = vec![7; fits.len() + 1];
    assert_eq!(refused(&produce_raw(p.bytes(), &over), 2), ErrorCode::MessageTooLarge);
}

/// A CREATE_GROUP body with raw flags, start and filter fields.
fn create_group_raw(flags: u8, kind: u8, value: u64, filter: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    put_str(&mut body, b"t");
    put_str(&mut body, b"g");
    body.push(flags);
    body.push(kind);
    put_u64(&mut body, value);
    put_u32(&mut body, 0);
    put_u16(&mut body, 0);
    put_str(&mut body, filter);
    encode_raw(op::CREATE_GROUP, &body)
}

#[test]
fn create_group_fields_are_checked() {
    let bytes = create_group_raw(GROUP_FLAG_BROADCAST, 3, 42, b"a || b");
    let Ok(Decoded::Frame(f, _)) = decode(&bytes, 2) else { panic!("valid") };
    let want = GroupSettings {
        broadcast: true,
        ack_timeout_ms: 0,
        max_deliveries: 0,
        filter: "a || b",
        ordered: false,
        retry: None,
    };
    assert_eq!(f.request, Request::CreateGroup { topic: "t", group: "g", settings: want, start: Start::Time(42) });
    assert_eq!(refused(&create_group_raw(0x02, 0, 0, b""), 2), ErrorCode::Malformed, "an unknown flag");
    assert_eq!(refused(&create_group_raw(0x02, 0, 0, b""), 3), ErrorCode::Malformed, "ordered before version 4");
    assert_eq!(refused(&create_group_raw(0x04, 0, 0, b""), 4), ErrorCode::Malformed, "an unknown flag in version 4");
    let both = create_group_raw(0x03, 0, 0, b"");
    let Ok(Decoded::Frame(f, _)) = decode(&both, 4) else { panic!("valid") };
    let Request::CreateGroup { settings, .. } = f.request else { panic!("CREATE_GROUP") };
    assert!(settings.ordered && settings.broadcast, "version 4: ordered by key, and broadcast");
    assert_eq!(refused(&create_group_raw(0, 4, 0, b""), 2), ErrorCode::BadArgument, "an unknown start kind");
    assert_eq!(refused(&create_group_raw(0, 1, 5, b""), 2), ErrorCode::BadArgument, "latest takes no value");
    let long = [b'a'; 17];
    assert_eq!(refused(&create_group_raw(0, 0, 0, &long), 2), ErrorCode::BadFilter, "filter_bytes_max + 1");
    assert!(matches!(decode(&create_group_raw(0, 0, 0, &long[..16]), 2), Ok(Decoded::Frame(..))), "at the limit");
    assert_eq!(refused(&create_group_raw(0, 0, 0, &[0xff]), 2), ErrorCode::BadFilter, "not UTF-8");
    for start in [Start::Earliest, Start::Latest, Start::Id(7), Start::Time(8)] {
        let (kind, value) = start.to_wire();
        assert_eq!(Start::from_wire(kind, value), Some(start));
    }
}

// ---------------------------------------------------------------------------
// Replies: HELLO's version-2 fields, a delivered message's flags.
// ---------------------------------------------------------------------------

#[test]
fn a_hello_reply_carries_the_fields_of_its_version() {
    for (version, extra) in [(1u16, 0usize), (2, 4 * 8 + 8), (5, 4 * 8 + 8), (6, 4 * 8 + 8 + 5 * 4)] {
        let mut out = Vec::new();
        encode_hello_reply(&mut out, 1, version, &LIMITS, 77);
        assert_eq!(out.len(), HEADER_BYTES + 18 + extra, "version {version}");
        let Ok(Decoded::Frame(f, _)) = decode_reply(&out, usize::MAX) else { panic!("version {version}") };
        let map_epoch = if version >= 2 { 77 } else { 0 };
        assert_eq!(f.reply, Reply::Hello { version, limits: LIMITS.reported(version), map_epoch });
    }
    assert_eq!(LIMITS.reported(1).tag_bytes_max, 0, "version 1 does not report it");
    assert_eq!(LIMITS.reported(5).lookup_results_max, 0, "version 5 does not report it");
    assert_eq!(LIMITS.reported(6), LIMITS, "version 6 reports every limit");
}

#[test]
fn a_version_1_session_gets_messages_without_version_2_fields() {
    let m = Message {
        id: 1,
        born_ms: 2,
        delivery_count: 3,
        dead: Some(DeadInfo { origin_id: 4, origin_deliveries: 5, reason: DeadReason::Rejected }),
        origin_group: "g",
        props: props_of(&["a"], &[]),
        payload: b"p",
    };
    let bare = Message { origin_group: "", props: Props::EMPTY, ..m };
    let write = |version, m: &Message<'_>| {
        let mut out = Vec::new();
        let mut w = MessagesWriter::begin(&mut out, 1, "t", version);
        w.push(&mut out, m);
        w.finish(&mut out);
        out
    };
    assert_eq!(write(1, &m), write(1, &bare), "version 1 drops the properties and the origin group");
    assert_eq!(write(2, &bare), write(1, &bare), "without them, version 2 writes version 1's bytes");
    let v2 = write(2, &m);
    let Ok(Decoded::Frame(f, _)) = decode_reply(&v2, usize::MAX) else { panic!("decodes") };
    assert_eq!(f.reply, Reply::Messages { topic: "t", messages: vec![m] });
    for version in [1, 2] {
        let whole = write(version, &m).len() - (HEADER_BYTES + 2 + 1 + 4);
        assert_eq!(message_wire_bytes(&m, version), whole, "version {version}");
    }
}

#[test]
fn a_message_with_flags_no_broker_writes_is_an_error() {
    let mut out = Vec::new();
    let mut w = MessagesWriter::begin(&mut out, 1, "t", 2);
    w.push(&mut out, &Message { props: props_of(&["a"], &[]), ..message_plain() });
    w.finish(&mut out);
    let flags_at = HEADER_BYTES + 2 + 1 + 4 + 8 + 8 + 2;
    assert_eq!(out[flags_at], MSG_FLAG_PROPS);
    for bad in [0x08, MSG_FLAG_ORIGIN_GROUP | MSG_FLAG_PROPS] {
        let mut b = out.clone();
        b[flags_at] = bad;
        assert!(decode_reply(&b, usize::MAX).is_err(), "flags {bad:#04x}");
    }
    // Properties announced but empty are not what a broker writes.
    let mut empty = Vec::new();
    let mut w = MessagesWriter::begin(&mut empty, 1, "t", 2);
    w.push(&mut empty, &message_plain());
    w.finish(&mut empty);
    empty[flags_at] = MSG_FLAG_PROPS;
    let at = flags_at + 1;
    empty.splice(at..at, [0, 0]);
    let len = (empty.len() - 4) as u32;
    empty[..4].copy_from_slice(&len.to_le_bytes());
    assert!(decode_reply(&empty, usize::MAX).is_err());
}

fn message_plain() -> Message<'static> {
    Message { id: 1, born_ms: 2, delivery_count: 1, dead: None, origin_group: "", props: Props::EMPTY, payload: b"x" }
}
