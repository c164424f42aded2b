//! Message properties over the network (protocol version 2): tags and
//! headers given at PRODUCE come back with every delivery, survive a
//! restart, compaction, dead-lettering and REDRIVE; a version-1 consumer
//! gets the payload alone; bad properties get their documented error and
//! disturb nothing else.

mod common;

use common::wire::now;
use common::{Server, TempDir};
use runnel::broker::Config;
use runnel::client::{Client, Delivered, Error, Fetch, OwnedReply, ProduceMessage};
use runnel::codec::group::{GroupSettings, Start};
use runnel::codec::{self, Batch, ErrorCode, Request, TopicSettings};
use runnel::limits::Limits;
use runnel::log::LogOptions;

/// A broker that negotiates version 2 (its message properties, on the
/// default group).
fn v2_config(limits: Limits) -> Config {
    limits.check().expect("limits are consistent");
    Config { limits, version_max: codec::CODEC_VERSION_MAX, ..Config::default() }
}

fn start_v2(limits: Limits) -> (Server, TempDir) {
    Server::start(v2_config(limits))
}

fn v2_client(srv: &Server) -> Client {
    // Version 2 exactly: some tests write version 2's layouts by hand.
    let mut c = Client::connect_upto(srv.addr, b"", 2).expect("connect");
    c.set_timeout(Some(std::time::Duration::from_secs(20))).expect("timeout");
    assert_eq!(c.version, 2, "the broker negotiates version 2");
    c
}

/// A client whose session is version 1: it renegotiates with HELLO 1..=1.
fn v1_client(srv: &Server) -> Client {
    let mut c = srv.client();
    c.send(&Request::Hello { min_version: 1, max_version: 1, token: b"" });
    assert!(matches!(c.recv().expect("HELLO"), OwnedReply::Hello { version: 1, .. }));
    c.version = 1;
    c
}

/// Everything ready in `topic`, fetched (and left unacked), in order.
fn drain(c: &mut Client, topic: &str) -> Vec<Delivered> {
    c.fetch(topic, Fetch { max_messages: 10_000, ack_timeout_ms: 600_000, ..Fetch::default() }).expect("fetch")
}

/// (payload, tags, headers) of each message: what properties promise.
type Seen = (Vec<u8>, Vec<String>, Vec<(String, Vec<u8>)>);

fn seen(msgs: &[Delivered]) -> Vec<Seen> {
    msgs.iter()
        .map(|m| {
            let tags = m.tags().into_iter().map(str::to_string).collect();
            let headers = m.headers().into_iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect();
            (m.payload.clone(), tags, headers)
        })
        .collect()
}

/// Three messages: tagged with a header, plain, headers only.
fn three() -> Vec<ProduceMessage<'static>> {
    vec![
        ProduceMessage::new(b"tagged").tag("eu").tag("red").header("trace", b"\x00\x07"),
        ProduceMessage::new(b"plain"),
        ProduceMessage::new(b"headed").header("k", b"v").header("k", b"w"),
    ]
}

fn three_seen() -> Vec<Seen> {
    let s = |v: &str| v.to_string();
    vec![
        (b"tagged".to_vec(), vec![s("eu"), s("red")], vec![(s("trace"), vec![0, 7])]),
        (b"plain".to_vec(), vec![], vec![]),
        (b"headed".to_vec(), vec![], vec![(s("k"), b"v".to_vec()), (s("k"), b"w".to_vec())]),
    ]
}

fn stat(c: &mut Client, section: &str, key: &str) -> u64 {
    c.stat(section, key).expect("stats").unwrap_or_else(|| panic!("no stat {section}/{key}"))
}

#[test]
fn tags_and_headers_come_back_with_the_message() {
    let (srv, _dir) = start_v2(Limits::default());
    let mut c = v2_client(&srv);
    let (first, count) = c.produce_messages("t", &three()).unwrap();
    assert_eq!(count, 3);
    // The topic's bytes count properties with payloads: the tagged
    // message's two tags (3 + 2, 3 + 3 bytes) and header (3 + 2 + 5 + 2),
    // and the headed one's two headers (3 + 2 + 1 + 1 each).
    assert_eq!(stat(&mut c, "t", "bytes"), (6 + 23) + 5 + (6 + 14));
    let got = drain(&mut c, "t");
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), [first, first + 1, first + 2]);
    assert_eq!(seen(&got), three_seen());
    assert_eq!(got[0].header("trace"), Some(&[0u8, 7][..]));
    // Redelivered after a NACK, with them again.
    assert_eq!(c.nack("t", &[first], 0, false).unwrap().done, 1);
    let again = drain(&mut c, "t");
    assert_eq!((again[0].delivery_count, seen(&again)), (2, vec![three_seen()[0].clone()]));
}

/// FETCH's `max_bytes` counts properties with payloads: two messages of 10
/// payload bytes and 11 of properties (one 8-byte tag) each are 42 bytes,
/// over a budget of 40 (their payloads alone, 20, would fit).
#[test]
fn fetch_max_bytes_counts_properties() {
    let (srv, _dir) = start_v2(Limits::default());
    let mut c = v2_client(&srv);
    let m = ProduceMessage::new(b"0123456789").tag("tag-nine");
    c.produce_messages("t", &[m.clone(), m]).unwrap();
    let got = c.fetch("t", Fetch { max_messages: 10, max_bytes: 40, ..Fetch::default() }).unwrap();
    assert_eq!(got.len(), 1, "the second message passes the budget");
    let got = c.fetch("t", Fetch { max_messages: 10, max_bytes: 40, ..Fetch::default() }).unwrap();
    assert_eq!(got.len(), 1, "the first message is always delivered");
}

/// A version-1 session sees payloads exactly as before: no properties, no
/// flag announcing them.
#[test]
fn a_version_1_consumer_gets_the_payload_alone() {
    let (srv, _dir) = start_v2(Limits::default());
    let mut producer = v2_client(&srv);
    producer.produce_messages("t", &three()).unwrap();
    let mut old = v1_client(&srv);
    let got = drain(&mut old, "t");
    let payloads: Vec<&[u8]> = got.iter().map(|m| m.payload.as_slice()).collect();
    assert_eq!(payloads, [&b"tagged"[..], b"plain", b"headed"]);
    assert!(got.iter().all(|m| m.props.is_empty()), "{got:?}");
}

#[test]
fn properties_survive_a_restart() {
    let dir = TempDir::new("props-restart");
    let srv = Server::start_in(v2_config(Limits::default()), LogOptions::default(), dir.path());
    let mut c = v2_client(&srv);
    c.produce_messages("t", &three()).unwrap();
    drop(c);
    srv.stop();
    let srv = Server::start_in(v2_config(Limits::default()), LogOptions::default(), dir.path());
    let mut c = v2_client(&srv);
    assert_eq!(seen(&drain(&mut c, "t")), three_seen());
}

/// Dead-lettering and REDRIVE move a message with its properties, and the
/// log keeps them in both topics.
#[test]
fn dead_letters_and_redriven_messages_keep_their_properties() {
    let dir = TempDir::new("props-dlq");
    let srv = Server::start_in(v2_config(Limits::default()), LogOptions::default(), dir.path());
    let mut c = v2_client(&srv);
    let (first, _) = c.produce_messages("t", &three()).unwrap();
    drain(&mut c, "t");
    assert_eq!(c.nack("t", &[first, first + 1, first + 2], 0, true).unwrap().done, 3);
    let dead = drain(&mut c, "t.dlq");
    assert!(dead.iter().all(|m| m.dead.is_some()));
    assert_eq!(seen(&dead), three_seen());
    drop(c);
    srv.stop();

    let srv = Server::start_in(v2_config(Limits::default()), LogOptions::default(), dir.path());
    let mut c = v2_client(&srv);
    assert_eq!(seen(&drain(&mut c, "t.dlq")), three_seen(), "dead letters after a restart");
    drop(c);
    let mut c = v2_client(&srv);
    assert_eq!(c.redrive("t", 0).unwrap(), 3);
    assert_eq!(seen(&drain(&mut c, "t")), three_seen(), "redriven");
    drop(c);
    srv.stop();

    let srv = Server::start_in(v2_config(Limits::default()), LogOptions::default(), dir.path());
    let mut c = v2_client(&srv);
    assert_eq!(seen(&drain(&mut c, "t")), three_seen(), "redriven, after a restart");
}

/// Compaction copies a long-unacked message forward with its properties:
/// after its original segment is gone, a restart still finds them.
#[test]
fn compaction_copies_properties_forward() {
    const SEGMENT_BYTES: u64 = 16 << 10;
    let log = LogOptions { segment_bytes_max: SEGMENT_BYTES, ..LogOptions::default() };
    let dir = TempDir::new("props-compaction");
    let srv = Server::start_in(v2_config(Limits::default()), log.clone(), dir.path());
    let mut c = v2_client(&srv);
    c.create_topic("slow", TopicSettings { ack_timeout_ms: 600_000, max_deliveries: 100 }).unwrap();
    c.produce_messages("slow", &three()).unwrap();
    // Acked traffic, tagged too, until segments holding the slow messages
    // were compacted away.
    let fast = [b'f'; 300];
    for round in 0..400 {
        let batch: Vec<ProduceMessage<'_>> =
            (0..10).map(|i| ProduceMessage::new(&fast).tag(if i % 2 == 0 { "even" } else { "odd" })).collect();
        c.produce_messages("fast", &batch).unwrap();
        let ids: Vec<u64> = drain(&mut c, "fast").iter().map(|m| m.id).collect();
        assert_eq!(c.ack("fast", &ids).unwrap().done, 10, "round {round}");
    }
    assert!(stat(&mut c, "", "compactions") >= 10, "segments were compacted");
    assert_eq!(seen(&drain(&mut c, "slow")), three_seen());
    drop(c);
    srv.stop();

    let srv = Server::start_in(v2_config(Limits::default()), log, dir.path());
    let mut c = v2_client(&srv);
    assert_eq!(seen(&drain(&mut c, "slow")), three_seen(), "after compaction and a restart");
    assert!(drain(&mut c, "fast").is_empty());
}

// ---------------------------------------------------------------------------
// Bad properties: a documented error, and nothing else disturbed.
// ---------------------------------------------------------------------------

/// A version-2 PRODUCE frame of one message with the properties blob
/// `props` as given (not checked).
fn raw_produce(request_id: u32, topic: &str, props: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&(props.len() as u16).to_le_bytes());
    bytes.extend_from_slice(props);
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(payload);
    let mut frame = Vec::new();
    let batch = Batch { count: 1, bytes: &bytes, with_props: true };
    codec::encode_request(&mut frame, request_id, &Request::Produce { flags: 0, topic, batch }, 2);
    frame
}

/// A tag entry: type 1, its length, the tag.
fn tag_entry(tag: &[u8]) -> Vec<u8> {
    let mut e = vec![codec::props::PROP_TAG];
    e.extend_from_slice(&(tag.len() as u16).to_le_bytes());
    e.extend_from_slice(tag);
    e
}

fn error_of(c: &mut Client, request_id: u32, frame: &[u8]) -> (ErrorCode, String) {
    c.write_raw(frame).expect("write");
    c.expect_reply(request_id);
    match c.recv() {
        Err(e @ Error::Broker { .. }) => (e.code().expect("a known code"), e.to_string()),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn bad_properties_get_their_error_and_disturb_nothing() {
    let limits = Limits { tags_per_message_max: 2, tag_bytes_max: 8, message_bytes_max: 64, ..common::small_limits() };
    let (srv, _dir) = start_v2(limits);
    let mut c = v2_client(&srv);
    let (first, _) = c.produce_messages("t", &[ProduceMessage::new(b"before").tag("ok")]).unwrap();
    let three_tags = [tag_entry(b"a"), tag_entry(b"b"), tag_entry(b"c")].concat();
    let mut unknown_type = vec![9, 1, 0, b'x'];
    unknown_type.extend_from_slice(&tag_entry(b"a"));
    let cases: Vec<(&str, Vec<u8>, ErrorCode, &str)> = vec![
        ("too many tags", raw_produce(11, "t", &three_tags, b"p"), ErrorCode::BadArgument, "tags_per_message_max"),
        (
            "a tag too long",
            raw_produce(11, "t", &tag_entry(b"123456789"), b"p"),
            ErrorCode::BadArgument,
            "tag_bytes_max",
        ),
        ("an unknown property type", raw_produce(11, "t", &unknown_type, b"p"), ErrorCode::BadArgument, "type 9"),
        ("a tag with a space", raw_produce(11, "t", &tag_entry(b"a b"), b"p"), ErrorCode::BadArgument, "whitespace"),
        (
            "properties and payload over message_bytes_max",
            raw_produce(11, "t", &tag_entry(b"tag"), &[0; 60]),
            ErrorCode::MessageTooLarge,
            "message_bytes_max",
        ),
        ("a property past its blob", raw_produce(11, "t", &[1, 9, 0, b'x'], b"p"), ErrorCode::Malformed, "runs past"),
    ];
    for (what, frame, code, says) in cases {
        let (got, message) = error_of(&mut c, 11, &frame);
        assert_eq!(got, code, "{what}: {message}");
        assert!(message.contains(says), "{what}: {message:?} names {says}");
        c.ping().unwrap_or_else(|e| panic!("usable after {what}: {e}"));
    }
    // The message that was there is the only one, untouched.
    let got = drain(&mut c, "t");
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), [first]);
    assert_eq!(got[0].tags(), ["ok"]);
    assert_eq!(stat(&mut c, "t", "produced"), 1);
}

/// Past tag_sets_per_topic_max distinct tag sets among a topic's messages,
/// a PRODUCE bringing a new one gets QUEUE_FULL and stores nothing of its
/// batch; known sets and untagged messages still come in, and once the
/// messages holding a set are acked, a new set takes its room.
#[test]
fn tag_sets_past_their_limit_get_queue_full() {
    let (srv, _dir) = start_v2(Limits { tag_sets_per_topic_max: 2, ..Limits::default() });
    let mut c = v2_client(&srv);
    let (a, _) = c.produce_messages("t", &[ProduceMessage::new(b"a").tag("a")]).unwrap();
    // {b, c} is one set, whatever the order and repeats.
    c.produce_messages("t", &[ProduceMessage::new(b"bc").tag("b").tag("c").tag("b")]).unwrap();
    c.produce_messages("t", &[ProduceMessage::new(b"cb").tag("c").tag("b")]).unwrap();
    let batch = [ProduceMessage::new(b"known").tag("a"), ProduceMessage::new(b"new").tag("d")];
    let err = c.produce_messages("t", &batch).expect_err("a third set");
    assert_eq!(err.code(), Some(ErrorCode::QueueFull), "{err}");
    assert!(err.to_string().contains("tag_sets_per_topic_max"), "{err}");
    assert_eq!(stat(&mut c, "t", "produced"), 3, "nothing of the refused batch");
    assert_eq!(stat(&mut c, "t", "tag_sets"), 2);
    c.produce_messages("t", &[ProduceMessage::new(b"plain"), ProduceMessage::new(b"a2").tag("a")]).unwrap();
    // Once no message holds {a}, {d} takes its room.
    let held: Vec<u64> = drain(&mut c, "t").iter().filter(|m| m.tags() == ["a"]).map(|m| m.id).collect();
    assert_eq!(held.len(), 2);
    assert_eq!(held[0], a);
    assert_eq!(c.ack("t", &held).unwrap().done, 2);
    let (d, _) = c.produce_messages("t", &[ProduceMessage::new(b"d").tag("d")]).unwrap();
    let got = drain(&mut c, "t");
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), [d]);
    assert_eq!(got[0].tags(), ["d"]);
    assert_eq!(stat(&mut c, "t", "tag_sets"), 2);
}

/// Replay interns the tags afresh: after a restart the topic's sets are
/// those of its messages, and the limit holds against them.
#[test]
fn a_restart_interns_the_tag_sets_of_the_messages_it_finds() {
    let dir = TempDir::new("props-tag-sets");
    let config = || v2_config(Limits { tag_sets_per_topic_max: 2, ..Limits::default() });
    let srv = Server::start_in(config(), LogOptions::default(), dir.path());
    let mut c = v2_client(&srv);
    let (a, _) = c.produce_messages("t", &[ProduceMessage::new(b"a").tag("a")]).unwrap();
    c.produce_messages("t", &[ProduceMessage::new(b"b").tag("b"), ProduceMessage::new(b"ab").tag("b").tag("a")])
        .unwrap_err();
    c.produce_messages("t", &[ProduceMessage::new(b"b").tag("b"), ProduceMessage::new(b"plain")]).unwrap();
    drain(&mut c, "t");
    assert_eq!(c.ack("t", &[a]).unwrap().done, 1);
    drop(c);
    srv.stop();

    let srv = Server::start_in(config(), LogOptions::default(), dir.path());
    let mut c = v2_client(&srv);
    assert_eq!(stat(&mut c, "t", "tag_sets"), 1, "only {{b}} is held");
    c.produce_messages("t", &[ProduceMessage::new(b"c").tag("c")]).unwrap();
    let err = c.produce_messages("t", &[ProduceMessage::new(b"d").tag("d")]).expect_err("a third set");
    assert_eq!(err.code(), Some(ErrorCode::QueueFull), "{err}");
    let got = drain(&mut c, "t");
    let tags: Vec<Vec<&str>> = got.iter().map(|m| m.tags()).collect();
    assert_eq!(tags, [vec!["b"], vec![], vec!["c"]]);
}

/// Consumer groups filter by the tags messages carry: each gets the
/// messages one of whose tags its filter passes (an untagged message passes
/// only `*`), and counts the others as filtered.
#[test]
fn groups_filter_by_the_tags_messages_carry() {
    let (srv, _dir) = start_v2(Limits::default());
    let mut c = v2_client(&srv);
    let msgs = [
        ProduceMessage::new(b"a").tag("eu"),
        ProduceMessage::new(b"b").tag("us"),
        ProduceMessage::new(b"c"),
        ProduceMessage::new(b"d").tag("us").tag("eu"),
    ];
    c.produce_messages("t", &msgs).unwrap();
    // Group all first: while it needs them, the messages the filters of
    // the others drop stay (a message every group's filter drops leaves).
    for (group, filter) in [("all", ""), ("eu", "eu"), ("u", "re:^u"), ("none", "nowhere")] {
        let settings = GroupSettings { filter, ..GroupSettings::default() };
        c.create_group("t", group, settings, Start::Earliest).unwrap();
    }
    let mut got = |group: &str| -> Vec<Vec<u8>> {
        c.fetch_group("t", group, now(10)).unwrap().into_iter().map(|m| m.payload).collect()
    };
    assert_eq!(got("eu"), [b"a".to_vec(), b"d".to_vec()]);
    assert_eq!(got("all"), [b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]);
    assert_eq!(got("u"), [b"b".to_vec(), b"d".to_vec()]);
    assert_eq!(got("none"), Vec::<Vec<u8>>::new());
    let stats = c.stats(Some("t")).unwrap();
    let filtered = |group: &str| {
        let section = stats.iter().find(|s| s.0 == format!("t/{group}"));
        section.and_then(|s| s.1.iter().find(|kv| kv.0 == "filtered")).map(|kv| kv.1)
    };
    assert_eq!((filtered("eu"), filtered("all"), filtered("none")), (Some(2), Some(0), Some(4)));
}
