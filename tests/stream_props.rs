//! The bounded, `cargo test` version of the fuzz targets in `fuzz/`: the
//! same properties (fuzz/sim.rs, fuzz/decode_props.rs, shared by `#[path]`),
//! on random input drawn from a seeded splitmix64 generator instead of a
//! fuzzer.
//!
//! Streams mix valid frames of every op (random fields, topics from a small
//! pool so that ACK, NACK and REDRIVE meet real messages), oversized frames,
//! malformed frames, unknown ops, lost boundaries and garbage; each is fed
//! to a broker through the reactor's connection logic whole, split at random
//! points, and one piece per turn, under a random configuration; pairs of
//! streams also go to two connections at once. Then a fresh session must
//! work, and the broker must restart (after compaction, with small log
//! segments) with what it held. The tests also check that the generator
//! reaches what it should (every op answered OK, each client error, parked
//! FETCHes, backpressure, compaction), so the properties are not vacuous.
//!
//! A failure names its seed; `RUNNEL_SEED=<seed> cargo test --release --test
//! stream_props` replays only that seed. The fuzz corpus (fuzz/corpus/*)
//! is replayed too, so a crash the fuzzer found stays a regression test.

#[path = "../fuzz/decode_props.rs"]
mod decode_props;
#[path = "../fuzz/sim.rs"]
mod sim;

use std::path::{Path, PathBuf};

use runnel::codec::{
    self, Batch, DecodeLimits, HEADER_BYTES, Ids, NACK_FLAG_DEAD_LETTER, REPLY_BIT, Request, TopicSettings, op,
};
use runnel::testkit::{Rng, SeedGuard, seeds};
use sim::{FuzzInput, SimConfig};

// ---------------------------------------------------------------------------
// Seeded randomness.
// ---------------------------------------------------------------------------

/// An edge-heavy u32, beyond `testkit::Rng`'s basics.
trait EdgeRng {
    fn u32(&mut self) -> u32;
}

impl EdgeRng for Rng {
    /// A u32 that is often at an edge.
    fn u32(&mut self) -> u32 {
        match self.below(4) {
            0 => 0,
            1 => self.range(1, 100) as u32,
            2 => u32::MAX - self.below(2) as u32,
            _ => self.next_u64() as u32,
        }
    }
}

/// Names a panicking test's seed with the command that replays it.
fn seed_guard(test: &'static str, seed: u64) -> SeedGuard {
    SeedGuard { test, seed, replay: "cargo test --release --test stream_props" }
}

// ---------------------------------------------------------------------------
// Random streams.
// ---------------------------------------------------------------------------

/// The simulation's limits (fuzz/sim.rs small_limits), as the decoder holds them.
const LIMITS: DecodeLimits = decode_props::LIMIT_SETS[0];

/// Topics most frames name, so that frames meet each other's messages.
const TOPICS: [&str; 5] = ["a", "b", "a.dlq", "b.dlq", "zz-check"];

const ALL_OPS: [u8; 13] = [
    op::HELLO,
    op::PING,
    op::PRODUCE,
    op::FETCH,
    op::ACK,
    op::NACK,
    op::TOUCH,
    op::STATS,
    op::CREATE_TOPIC,
    op::DELETE_TOPIC,
    op::PURGE_TOPIC,
    op::LIST_TOPICS,
    op::REDRIVE,
];

fn topic(rng: &mut Rng) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";
    match rng.below(10) {
        0 => {
            let len = rng.range(1, LIMITS.topic_name_bytes_max as usize);
            let mut name: String = (0..len).map(|_| rng.pick(ALPHABET) as char).collect();
            if rng.one_in(3) {
                name.push_str(".dlq");
            }
            name
        }
        _ => rng.pick(&TOPICS).to_string(),
    }
}

/// A frame built field by field, for what the encoder will not write.
fn raw_frame(op: u8, status: u8, flags: u16, request_id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    codec::put_u32(&mut out, (HEADER_BYTES - 4 + body.len()) as u32);
    out.extend_from_slice(&[op, status]);
    codec::put_u16(&mut out, flags);
    codec::put_u32(&mut out, request_id);
    out.extend_from_slice(body);
    out
}

fn hello(rng: &mut Rng, request_id: u32, token: &[u8]) -> Vec<u8> {
    let (min_version, max_version) =
        if rng.one_in(8) { (rng.below(4) as u16, rng.below(4) as u16) } else { (1, rng.range(1, 3) as u16) };
    let mut out = Vec::new();
    codec::encode_request(&mut out, request_id, &Request::Hello { min_version, max_version, token }, 1);
    out
}

/// A valid request of a random op with random fields.
fn valid_frame(rng: &mut Rng, request_id: u32, token: &[u8]) -> Vec<u8> {
    let topic = topic(rng);
    let payloads: Vec<Vec<u8>> = (0..rng.range(1, LIMITS.batch_messages_max as usize))
        .map(|_| {
            let len = if rng.one_in(4) { LIMITS.message_bytes_max as usize } else { rng.range(0, 20) };
            rng.bytes(len)
        })
        .collect();
    let mut batch = Vec::new();
    codec::encode_batch(&mut batch, &payloads);
    let ids: Vec<u64> = (0..rng.range(1, LIMITS.batch_messages_max as usize))
        .map(|_| if rng.one_in(8) { rng.next_u64() } else { rng.below(40) as u64 })
        .collect();
    let mut ids_bytes = Vec::new();
    codec::encode_ids(&mut ids_bytes, &ids);
    let ids = Ids { bytes: &ids_bytes };
    let short_ms = |rng: &mut Rng| if rng.one_in(2) { 0 } else { rng.range(1, 60) as u32 };
    let req = match rng.pick(&ALL_OPS) {
        op::HELLO => return hello(rng, request_id, token),
        op::PING => Request::Ping,
        op::PRODUCE => Request::Produce {
            flags: 0,
            topic: &topic,
            batch: Batch { count: payloads.len() as u32, bytes: &batch, with_props: false },
        },
        op::FETCH => Request::Fetch {
            topic: &topic,
            group: "",
            max_messages: if rng.one_in(3) { rng.u32() } else { rng.range(0, 10) as u32 },
            max_bytes: if rng.one_in(2) { rng.u32() } else { rng.range(0, 300) as u32 },
            wait_ms: if rng.one_in(3) { rng.u32() } else { short_ms(rng) },
            ack_timeout_ms: if rng.one_in(3) { rng.u32() } else { short_ms(rng) },
        },
        op::ACK => Request::Ack { topic: &topic, group: "", ids },
        op::NACK => Request::Nack {
            topic: &topic,
            group: "",
            delay_ms: if rng.one_in(3) { rng.u32() } else { short_ms(rng) },
            flags: rng.pick(&[0, NACK_FLAG_DEAD_LETTER]),
            ids,
            reason: "",
        },
        op::TOUCH => Request::Touch { topic: &topic, group: "", ack_timeout_ms: rng.u32(), ids },
        op::STATS => Request::Stats { topic: if rng.one_in(3) { "" } else { &topic } },
        op::CREATE_TOPIC => Request::CreateTopic {
            topic: &topic,
            settings: TopicSettings {
                ack_timeout_ms: if rng.one_in(2) { short_ms(rng) } else { rng.u32() },
                max_deliveries: rng.pick(&[0, 1, 2, 5, u16::MAX]),
            },
            options: Default::default(),
        },
        op::DELETE_TOPIC => Request::DeleteTopic { topic: &topic },
        op::PURGE_TOPIC => Request::PurgeTopic { topic: &topic },
        op::LIST_TOPICS => Request::ListTopics,
        op::REDRIVE => Request::Redrive { topic: &topic, group: "", max_messages: rng.pick(&[0, 1, 3, u32::MAX]) },
        other => unreachable!("op 0x{other:02x}"),
    };
    let mut out = Vec::new();
    codec::encode_request(&mut out, request_id, &req, 1);
    out
}

/// A frame the decoder refuses but can skip.
fn bad_frame(rng: &mut Rng, request_id: u32, token: &[u8]) -> Vec<u8> {
    let good = valid_frame(rng, request_id, token);
    let body = &good[HEADER_BYTES..];
    match rng.below(9) {
        // Status, flags or the reply bit set.
        0 => raw_frame(good[4], rng.range(1, 255) as u8, 0, request_id, body),
        1 => raw_frame(good[4], 0, rng.range(1, 0xffff) as u16, request_id, body),
        2 => raw_frame(good[4] | REPLY_BIT, 0, 0, request_id, body),
        // A byte too many, or the body cut short.
        3 => {
            let mut body = body.to_vec();
            body.push(rng.next_u64() as u8);
            raw_frame(good[4], 0, 0, request_id, &body)
        }
        4 if !body.is_empty() => raw_frame(good[4], 0, 0, request_id, &body[..rng.below(body.len())]),
        // A bad topic name, a message too large, a batch of none.
        5 => raw_frame(op::DELETE_TOPIC, 0, 0, request_id, &[3, 0, b'a', b' ', b'b']),
        6 => {
            let mut body = vec![1, 0, b'a', 1, 0, 0, 0];
            codec::put_u32(&mut body, LIMITS.message_bytes_max + 1);
            body.extend_from_slice(&vec![7; LIMITS.message_bytes_max as usize + 1]);
            raw_frame(op::PRODUCE, 0, 0, request_id, &body)
        }
        7 => raw_frame(op::ACK, 0, 0, request_id, &[1, 0, b'a', 0, 0, 0, 0]),
        // An unknown op.
        _ => {
            let op = rng.pick(&[0x00, 0x03, 0x15, 0x21, 0x40, 0x7f]);
            let len = rng.range(0, 30);
            raw_frame(op, 0, 0, request_id, &rng.bytes(len))
        }
    }
}

/// A frame over frame_bytes_max: answered from its header, its body
/// dropped as it arrives. `whole` says whether all of it is in the stream.
fn oversized_frame(rng: &mut Rng, request_id: u32, whole: bool) -> Vec<u8> {
    let frame_bytes = LIMITS.frame_bytes_max as usize + rng.pick(&[1, 2, 100, 1000]);
    let op = rng.pick(&ALL_OPS);
    let mut out = raw_frame(op, 0, 0, request_id, &rng.bytes(frame_bytes - HEADER_BYTES));
    if !whole {
        out.truncate(rng.range(4, frame_bytes - 1));
    }
    out
}

/// A random stream and the points to cut it at.
fn random_stream(rng: &mut Rng, token: &[u8]) -> (Vec<u8>, Vec<usize>) {
    let mut stream = Vec::new();
    let mut request_id = rng.next_u64() as u32;
    if !rng.one_in(10) {
        let t = if rng.one_in(10) { b"wrong".as_slice() } else { token };
        stream.extend_from_slice(&hello(rng, request_id, t));
    }
    let frames = rng.range(1, 40);
    for i in 0..frames {
        request_id = if rng.one_in(10) { rng.next_u64() as u32 } else { request_id.wrapping_add(1) };
        let last = i + 1 == frames;
        let frame = match rng.below(100) {
            0..75 => valid_frame(rng, request_id, token),
            75..88 => bad_frame(rng, request_id, token),
            88..94 => {
                let whole = !last || rng.one_in(2);
                oversized_frame(rng, request_id, whole)
            }
            // The rest end the stream's framing, so they come last, mostly.
            94..97 if last || rng.one_in(4) => {
                // A length below the minimum: the boundary is lost.
                let mut f = (rng.below(8) as u32).to_le_bytes().to_vec();
                let len = rng.range(0, 20);
                f.extend_from_slice(&rng.bytes(len));
                f
            }
            97.. if last || rng.one_in(4) => {
                let len = rng.range(1, 40);
                rng.bytes(len)
            }
            _ => valid_frame(rng, request_id, token),
        };
        stream.extend_from_slice(&frame);
    }
    // Pieces from a byte at a time to most of the stream.
    let piece_max = rng.pick(&[1, 2, 3, 7, 12, 13, 64, 700, 5000]);
    let mut cuts = Vec::new();
    let mut at = 0;
    while at < stream.len() && cuts.len() < 4096 {
        at += rng.range(1, piece_max);
        cuts.push(at);
    }
    (stream, cuts)
}

// ---------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------

/// Seeds of the stream test: each runs one stream three ways on three
/// brokers, then restarts one (well under 1 ms each on tmpfs).
const STREAM_SEEDS: u64 = 1500;

/// A configuration (see `SimConfig::from_flags`): auth a quarter of the
/// time, auto-create off a quarter of the time (most frames would only meet
/// UNKNOWN_TOPIC), the other bits even.
fn random_flags(rng: &mut Rng) -> u8 {
    let mut flags = rng.next_u64() as u8 & !0b11;
    if rng.one_in(4) {
        flags |= 1;
    }
    if rng.one_in(4) {
        flags |= 2;
    }
    flags
}

#[test]
fn streams_agree_whole_split_and_trickled() {
    let all_seeds = std::env::var_os("RUNNEL_SEED").is_none();
    let mut replies = std::collections::BTreeSet::new();
    let (mut parked, mut pauses, mut compactions, mut ended) = (0, 0, 0, std::collections::BTreeSet::new());
    for seed in seeds(STREAM_SEEDS) {
        let _guard = seed_guard("streams_agree_whole_split_and_trickled", seed);
        let mut rng = Rng(seed);
        let flags = random_flags(&mut rng);
        let cfg = SimConfig::from_flags(flags);
        let token = cfg.broker.auth_token.clone().unwrap_or_default();
        let (stream, cuts) = random_stream(&mut rng, &token);
        let cov = sim::check_stream(&cfg, &stream, &cuts, &format!("seed {seed} (flags {flags:#04x})"));
        replies.extend(cov.replies);
        parked += cov.parked;
        pauses += cov.pauses;
        compactions += cov.compactions;
        ended.extend(cov.ended.map(|why| why.split(':').next().unwrap_or_default().to_string()));
    }
    if all_seeds {
        // The streams reach what they are meant to: an OK reply to every
        // op, each error a client can cause, parked FETCHes, output
        // backpressure, compaction, and each way a connection ends early.
        for op in ALL_OPS {
            assert!(replies.contains(&(op, 0)), "no stream got an OK reply to op {op:#04x}");
        }
        for code in [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 16] {
            assert!(replies.iter().any(|r| r.1 == code), "no stream got error {code}: {replies:?}");
        }
        assert!(parked > 0, "no FETCH parked");
        assert!(pauses > 0, "no connection paused for its output");
        assert!(compactions > 0, "compaction never ran before a restart");
        assert_eq!(ended.len(), 2, "the ways connections ended: {ended:?}");
    }
}

#[test]
fn two_connections_get_their_replies_in_order() {
    let all_seeds = std::env::var_os("RUNNEL_SEED").is_none();
    let mut woken_by_delete = 0;
    for seed in seeds(STREAM_SEEDS / 3) {
        let _guard = seed_guard("two_connections_get_their_replies_in_order", seed);
        let mut rng = Rng(seed);
        let flags = random_flags(&mut rng);
        let cfg = SimConfig::from_flags(flags);
        let token = cfg.broker.auth_token.clone().unwrap_or_default();
        let (a, cuts_a) = random_stream(&mut rng, &token);
        let (b, cuts_b) = random_stream(&mut rng, &token);
        let ctx = format!("seed {seed} (flags {flags:#04x})");
        let cov = sim::check_two_connections(&cfg, (&a, &cuts_a), (&b, &cuts_b), &ctx);
        if cfg.broker.auto_create {
            // With auto-create, a FETCH meets UNKNOWN_TOPIC only when the
            // other connection deleted the topic while it was parked.
            woken_by_delete += cov.replies.iter().filter(|r| **r == (op::FETCH, 9)).count();
        }
    }
    if all_seeds {
        assert!(woken_by_delete > 0, "no parked FETCH was answered by a DELETE_TOPIC of the other connection");
    }
}

/// Valid frames, with some bytes flipped or the length changed, or noise.
fn decode_input(rng: &mut Rng) -> Vec<u8> {
    let mut buf = match rng.below(3) {
        0 => {
            let len = rng.range(0, 60);
            rng.bytes(len)
        }
        _ => {
            let request_id = rng.next_u64() as u32;
            valid_frame(rng, request_id, b"")
        }
    };
    match rng.below(4) {
        0 => {}
        1 if !buf.is_empty() => {
            for _ in 0..rng.range(1, 3) {
                let at = rng.below(buf.len());
                buf[at] ^= rng.range(1, 255) as u8;
            }
        }
        2 if buf.len() >= 4 => {
            let len = rng.range(0, buf.len() + 8) as u32;
            buf[..4].copy_from_slice(&len.to_le_bytes());
        }
        _ => {
            // As a reply: the reply bit set, sometimes a status.
            if buf.len() > 5 {
                buf[4] |= REPLY_BIT;
                if rng.one_in(2) {
                    buf[5] = rng.range(1, 20) as u8;
                }
            }
        }
    }
    buf
}

#[test]
fn the_decoders_agree_with_the_bytes() {
    for seed in seeds(2000) {
        let _guard = seed_guard("the_decoders_agree_with_the_bytes", seed);
        let mut rng = Rng(seed);
        for _ in 0..20 {
            let buf = decode_input(&mut rng);
            for (i, limits) in decode_props::LIMIT_SETS.iter().enumerate() {
                for version in [1, 2] {
                    decode_props::check_request(&buf, limits, version, &format!("seed {seed}, limits {i}, v{version}"));
                }
            }
            decode_props::check_reply(&buf, usize::MAX, &format!("seed {seed}"));
            decode_props::check_reply(&buf, 64, &format!("seed {seed}"));
        }
    }
}

/// Every broker reply, re-encoded, decodes to itself (decode(encode(f)) ==
/// f for the reply side, on replies the broker really writes).
#[test]
fn replies_the_broker_writes_round_trip() {
    for seed in seeds(50) {
        let _guard = seed_guard("replies_the_broker_writes_round_trip", seed);
        let mut rng = Rng(seed);
        let cfg = SimConfig::from_flags(0);
        let (stream, _) = random_stream(&mut rng, b"");
        let dir = sim::SimDir::new();
        let ctx = format!("seed {seed}");
        let s = sim::run_stream(&cfg, dir.path(), &stream, &[], sim::Arrival::AllAtOnce, &ctx);
        let mut buf = &s.conn(0).replies[..];
        while !buf.is_empty() {
            let n = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize + 4;
            decode_props::check_reply(&buf[..n], usize::MAX, &ctx);
            buf = &buf[n..];
        }
    }
}

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz").join("corpus").join(target)
}

/// The corpus files kept in git: named for what they are. Files libFuzzer
/// adds while it runs are named by their SHA-1 and are not replayed (nor
/// committed: fuzz/.gitignore).
fn corpus_files(target: &str) -> Vec<PathBuf> {
    let kept = |p: &Path| {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or(".");
        let sha1 = name.len() == 40 && name.bytes().all(|b| b.is_ascii_hexdigit());
        p.is_file() && !sha1 && !name.starts_with('.')
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir(target))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| kept(p)).collect())
        .unwrap_or_default();
    files.sort();
    files
}

/// The fuzz corpus, regression cases included, passes the same checks.
#[test]
fn the_fuzz_corpus_replays_clean() {
    if std::env::var_os("RUNNEL_WRITE_CORPUS").is_some() {
        write_seed_corpus();
    }
    let decode = corpus_files("decode");
    let stream = corpus_files("stream");
    assert!(!decode.is_empty() && !stream.is_empty(), "fuzz/corpus/{{decode,stream}} hold the seed corpus");
    for path in decode {
        let data = std::fs::read(&path).expect("read corpus file");
        decode_props::check_decode(&data, &path.display().to_string());
    }
    for path in stream {
        let data = std::fs::read(&path).expect("read corpus file");
        FuzzInput::parse(&data).check(&path.display().to_string());
    }
}

/// A stream that fills the simulation's own churn topic (whose produces
/// then get QUEUE_FULL, as they should) does not make the checks after it
/// fail: churn starts its topic afresh. (The fuzzer found this in about a
/// minute.)
#[test]
fn a_stream_that_fills_the_churn_topic_passes() {
    let mut stream = Vec::new();
    codec::encode_request(&mut stream, 1, &Request::Hello { min_version: 1, max_version: 1, token: b"" }, 1);
    let payloads = [[b'x'; 1]; 8];
    let mut batch = Vec::new();
    codec::encode_batch(&mut batch, &payloads);
    for rid in 2..4 {
        let produce = Request::Produce {
            flags: 0,
            topic: "zz-churn",
            batch: Batch { count: 8, bytes: &batch, with_props: false },
        };
        codec::encode_request(&mut stream, rid, &produce, 1);
    }
    // Flag 8: small segments, so the checks after the stream churn.
    let cov = FuzzInput { flags: 8, cuts: vec![], stream: &stream }.check("the churn topic filled");
    assert!(cov.replies.iter().filter(|r| r.0 == op::PRODUCE && r.1 == 0).count() == 2, "{:?}", cov.replies);
}

/// One request of each op version 2 adds or lays out anew, encoded in
/// version 2, named for the op.
fn version_2_requests() -> Vec<(&'static str, Vec<u8>)> {
    let mut props = Vec::new();
    codec::props::put_tag(&mut props, "a");
    codec::props::put_header(&mut props, "k", b"v");
    let props = codec::Props::parse(&props, 2, &LIMITS.props()).expect("valid properties");
    let mut batch = Vec::new();
    codec::encode_message(&mut batch, &props, b"one");
    codec::encode_message(&mut batch, &codec::Props::EMPTY, b"two");
    let mut ids = Vec::new();
    codec::encode_ids(&mut ids, &[1, 2]);
    let ids = Ids { bytes: &ids };
    let (topic, group) = ("a", "g");
    let settings = codec::GroupSettings {
        broadcast: true,
        ack_timeout_ms: 5,
        max_deliveries: 2,
        filter: "a || b",
        ordered: false,
        retry: None,
    };
    let requests = [
        ("produce", Request::Produce { flags: 0, topic, batch: Batch { count: 2, bytes: &batch, with_props: true } }),
        ("fetch", Request::Fetch { topic, group, max_messages: 2, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 }),
        ("ack", Request::Ack { topic, group, ids }),
        ("nack", Request::Nack { topic, group, delay_ms: 5, flags: 0, ids, reason: "" }),
        ("touch", Request::Touch { topic, group, ack_timeout_ms: 5, ids }),
        ("redrive", Request::Redrive { topic, group, max_messages: 0 }),
        ("create-group", Request::CreateGroup { topic, group, settings, start: codec::Start::Id(3) }),
        ("delete-group", Request::DeleteGroup { topic, group }),
        ("list-groups", Request::ListGroups { topic }),
        ("reset-group", Request::ResetGroup { topic, group, start: codec::Start::Time(9) }),
    ];
    requests
        .iter()
        .map(|(name, req)| {
            let mut frame = Vec::new();
            codec::encode_request(&mut frame, 7, req, 2);
            (*name, frame)
        })
        .collect()
}

/// Writes the seed corpus of both targets (RUNNEL_WRITE_CORPUS=1): one of
/// each request, edge cases, and a few random streams.
fn write_seed_corpus() {
    let write = |target: &str, name: &str, data: &[u8]| {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).expect("create corpus dir");
        std::fs::write(dir.join(name), data).expect("write corpus file");
    };
    let mut rng = Rng(0x5eed);
    // decode: one frame of every op under the simulation's limits, a reply
    // of each shape the broker writes, and edge cases.
    for &o in &ALL_OPS {
        let mut f = valid_frame(&mut rng, 7, b"");
        while f[4] != o {
            f = valid_frame(&mut rng, 7, b"");
        }
        write("decode", &format!("request-{o:02x}"), &[[0].as_slice(), &f].concat());
    }
    let cfg = SimConfig::from_flags(0);
    let mut hello = Vec::new();
    codec::encode_request(&mut hello, 1, &Request::Hello { min_version: 1, max_version: 1, token: b"" }, 1);
    let mut all = hello.clone();
    for i in 0..40 {
        all.extend_from_slice(&valid_frame(&mut rng, 100 + i, b""));
    }
    let dir = sim::SimDir::new();
    let s = sim::run_stream(&cfg, dir.path(), &all, &[], sim::Arrival::AllAtOnce, "corpus");
    let mut buf = &s.conn(0).replies[..];
    let mut seen = std::collections::BTreeSet::new();
    while !buf.is_empty() {
        let n = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize + 4;
        if seen.insert((buf[4], buf[5])) {
            write("decode", &format!("reply-{:02x}-{:02x}", buf[4], buf[5]), &[[0].as_slice(), &buf[..n]].concat());
        }
        buf = &buf[n..];
    }
    write("decode", "empty", &[]);
    write("decode", "length-below-minimum", &[0, 7, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0]);
    write("decode", "frame-too-large-header", &[0, 0x10, 0, 0, 0, 0x10, 0, 0, 0, 1, 0, 0, 0]);
    write("decode", "ping-with-flags", &[0, 8, 0, 0, 0, 2, 0, 1, 0, 9, 0, 0, 0]);
    write("decode", "unknown-op", &[0, 8, 0, 0, 0, 0x7f, 0, 0, 0, 9, 0, 0, 0]);
    // decode, version 2 (first byte 0x40): a request of each op version 2
    // adds or lays out anew.
    for (name, frame) in version_2_requests() {
        write("decode", &format!("request-v2-{name}"), &[[0x40].as_slice(), &frame].concat());
    }

    // stream: a session of every op, edge cases, random streams.
    write("stream", "session-every-op", &FuzzInput::encode(0, &[], &all));
    write("stream", "session-every-op-split", &FuzzInput::encode(0, &[3, 12, 13, 50, 51, 200], &all));
    let mut produce_fetch = hello.clone();
    let mut batch = Vec::new();
    codec::encode_batch(&mut batch, &[b"one".as_slice(), b"two"]);
    codec::encode_request(
        &mut produce_fetch,
        2,
        &Request::Produce { flags: 0, topic: "a", batch: Batch { count: 2, bytes: &batch, with_props: false } },
        1,
    );
    let fetch = Request::Fetch { topic: "a", group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 5 };
    codec::encode_request(&mut produce_fetch, 3, &fetch, 1);
    let mut nack = Vec::new();
    codec::encode_ids(&mut nack, &[1]);
    let nack = Request::Nack {
        topic: "a",
        group: "",
        delay_ms: 0,
        flags: NACK_FLAG_DEAD_LETTER,
        ids: Ids { bytes: &nack },
        reason: "",
    };
    codec::encode_request(&mut produce_fetch, 4, &nack, 1);
    let fetch_dlq =
        Request::Fetch { topic: "a.dlq", group: "", max_messages: 5, max_bytes: 0, wait_ms: 30, ack_timeout_ms: 0 };
    codec::encode_request(&mut produce_fetch, 5, &fetch_dlq, 1);
    write("stream", "produce-fetch-nack-dlq", &FuzzInput::encode(0, &[], &produce_fetch));
    write("stream", "produce-fetch-nack-dlq-auth-split", &FuzzInput::encode(0x11, &[1, 30, 31], &produce_fetch));
    let mut oversized = hello.clone();
    oversized.extend_from_slice(&oversized_frame(&mut rng, 2, true));
    codec::encode_request(&mut oversized, 3, &Request::Ping, 1);
    write("stream", "oversized-then-ping", &FuzzInput::encode(0, &[20, 100, 1000, 2000], &oversized));
    let mut lost = hello.clone();
    lost.extend_from_slice(&[3, 0, 0, 0]);
    codec::encode_request(&mut lost, 3, &Request::Ping, 1);
    write("stream", "lost-boundary", &FuzzInput::encode(0, &[], &lost));
    // Two connections (flag 0x20): the first cut divides the stream.
    let mut two = produce_fetch.clone();
    let at = two.len();
    two.extend_from_slice(&all);
    write("stream", "two-connections", &FuzzInput::encode(sim::TWO_CONNECTIONS, &[at, at + 40], &two));
    for i in 0..8 {
        let flags = random_flags(&mut rng);
        let token = SimConfig::from_flags(flags).broker.auth_token.unwrap_or_default();
        let (stream, cuts) = random_stream(&mut rng, &token);
        let cuts: Vec<usize> = cuts.into_iter().step_by(3).collect();
        write("stream", &format!("random-{i}"), &FuzzInput::encode(flags, &cuts, &stream));
    }
}
