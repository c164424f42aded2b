//! `runnel::Client` and the protocol versions: against this build's broker,
//! which negotiates version 1, the version-2 calls are refused before
//! anything is sent and every other call works on the default group;
//! against a fake broker on a socket that speaks version 2 (the codec's
//! encoders on the broker side), every version-2 call sends the frame the
//! codec decodes to the request meant, and every reply comes back whole.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use common::Server;
use runnel::broker::Config;
use runnel::client::{Client, Error, Fetch, ProduceMessage};
use runnel::codec::{self, *};
use runnel::limits::Limits;

fn now(max_messages: u32) -> Fetch {
    Fetch { max_messages, ..Fetch::default() }
}

fn is_version_error<T: std::fmt::Debug>(r: Result<T, Error>) -> bool {
    matches!(r, Err(Error::Version { needed: 2, version: 1 }))
}

#[test]
fn against_a_version_1_broker_version_2_calls_are_refused_and_the_rest_works() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    assert_eq!((c.version, c.map_epoch), (1, 0), "this build's broker negotiates version 1");
    let tagged = [ProduceMessage::new(b"x").tag("eu")];
    assert!(is_version_error(c.produce_messages("t", &tagged)));
    assert!(is_version_error(c.fetch_group("t", "billing", now(1))));
    assert!(is_version_error(c.ack_group("t", "billing", &[1])));
    assert!(is_version_error(c.nack_group("t", "billing", &[1], 0, false)));
    assert!(is_version_error(c.touch_group("t", "billing", &[1], 0)));
    assert!(is_version_error(c.redrive_group("t", "billing", 0)));
    assert!(is_version_error(c.create_group("t", "g", GroupSettings::default(), Start::Earliest)));
    assert!(is_version_error(c.delete_group("t", "g")));
    assert!(is_version_error(c.list_groups("t")));
    assert!(is_version_error(c.reset_group("t", "g", Start::Latest)));
    let e = c.list_groups("t").expect_err("refused");
    assert!(e.to_string().contains("protocol version 2"), "{e}");
    // Nothing was sent: the connection is in step, and version 1 works.
    assert_eq!(c.in_flight(), 0);
    let plain = [ProduceMessage::new(b"one"), ProduceMessage::new(b"two")];
    let (first, n) = c.produce_messages("t", &plain).expect("untagged messages fit version 1");
    assert_eq!(n, 2);
    let got = c.fetch_group("t", "", now(2)).expect("the default group by name");
    assert_eq!(got.iter().map(|d| d.id).collect::<Vec<_>>(), [first, first + 1]);
    assert!(got.iter().all(|d| d.tags().is_empty() && d.headers().is_empty() && d.origin_group.is_empty()));
    assert_eq!(c.ack_group("t", "", &[first]).expect("ack").done, 1);
    assert_eq!(c.ack("t", &[first + 1]).expect("ack").done, 1);
    c.ping().expect("still in step");
}

// ---------------------------------------------------------------------------
// A fake broker speaking version 2.
// ---------------------------------------------------------------------------

/// A request the fake broker received: its bytes, decoded in version 2.
type Received = Vec<u8>;

/// Starts a broker on a thread that negotiates up to `version`, answers
/// each request with a fixed reply of its op, and sends the bytes of each
/// request it reads (HELLO's included) down the channel.
fn fake_broker(version: u16) -> (SocketAddr, mpsc::Receiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let Ok((stream, _)) = listener.accept() else { return };
        serve(stream, version, &tx);
    });
    (addr, rx)
}

fn serve(mut stream: TcpStream, version_max: u16, tx: &mpsc::Sender<Received>) {
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let limits = DecodeLimits::from(&Limits::default());
    let (mut buf, mut session) = (Vec::new(), 0u16);
    let mut chunk = [0u8; 4096];
    loop {
        while let Ok(Decoded::Frame(f, n)) = decode_request(&buf, &limits, session) {
            let mut out = Vec::new();
            if let Request::Hello { max_version, .. } = f.request {
                session = max_version.min(version_max);
            }
            answer(&mut out, &f, session, &limits);
            if tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
            buf.drain(..n);
            if stream.write_all(&out).is_err() {
                return;
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The message every FETCH of the fake broker delivers: a dead letter of
/// the group `billing`, tagged `eu`, with the header `trace`.
fn delivered() -> Message<'static> {
    let mut props = Vec::new();
    props::put_tag(&mut props, "eu");
    props::put_header(&mut props, "trace", b"7f");
    Message {
        id: 5,
        born_ms: 6,
        delivery_count: 1,
        dead: Some(DeadInfo { origin_id: 2, origin_deliveries: 3, reason: DeadReason::Nacked }),
        origin_group: "billing",
        props: Props::parse(props.leak(), 2, &PropsLimits::ANY).expect("valid"),
        payload: b"hello",
    }
}

fn answer(out: &mut Vec<u8>, f: &Frame<'_>, version: u16, limits: &DecodeLimits) {
    let rid = f.request_id;
    match f.request {
        Request::Hello { .. } => encode_hello_reply(out, rid, version, limits, 5),
        Request::Produce { batch, .. } => encode_produce_reply(out, rid, 1, batch.count),
        Request::Fetch { .. } => {
            let mut w = MessagesWriter::begin(out, rid, "t", version);
            w.push(out, &delivered());
            w.finish(out);
        }
        Request::Ack { ids, .. } | Request::Nack { ids, .. } | Request::Touch { ids, .. } => {
            encode_ids_reply(out, f.request.op(), rid, ids.len() as u32, &[])
        }
        Request::CreateGroup { .. } => encode_group_created_reply(out, rid, true, 1),
        Request::ListGroups { .. } => {
            let stats = GroupStats { cursor: 3, lag: 4, consumers: 2, ..GroupStats::default() };
            let settings = GroupSettings {
                broadcast: true,
                ack_timeout_ms: 9,
                max_deliveries: 2,
                filter: "a || b",
                ordered: false,
                retry: None,
            };
            encode_groups_reply(out, rid, &[GroupInfo { name: "billing", settings, stats }]);
        }
        Request::DeleteGroup { .. } | Request::ResetGroup { .. } | Request::Redrive { .. } => {
            encode_u64_reply(out, f.request.op(), rid, 4)
        }
        _ => encode_empty_reply(out, f.request.op(), rid),
    }
}

/// The request of the next frame the fake broker read, checked against
/// `want` by re-encoding it in version 2 (the bytes the client must send).
fn assert_sent(rx: &mpsc::Receiver<Received>, want: &Request<'_>) {
    let got = rx.recv_timeout(Duration::from_secs(20)).expect("a request reached the fake broker");
    let mut expected = Vec::new();
    encode_request(&mut expected, u32::from_le_bytes([got[8], got[9], got[10], got[11]]), want, 2);
    assert_eq!(got, expected, "the client sent {got:02x?} for {want:?}");
}

fn connect_v2() -> (Client, mpsc::Receiver<Received>) {
    let (addr, rx) = fake_broker(2);
    let c = Client::connect(addr).expect("connect");
    let hello = rx.recv_timeout(Duration::from_secs(20)).expect("hello");
    let max = codec::CODEC_VERSION_MAX.to_le_bytes();
    assert_eq!(&hello[12..16], &[1, 0, max[0], max[1]], "the client offers versions 1 to the newest it speaks");
    (c, rx)
}

#[test]
fn the_client_negotiates_version_2_and_learns_every_limit() {
    let (c, _rx) = connect_v2();
    assert_eq!((c.version, c.map_epoch), (2, 5));
    // Every limit a HELLO reply carries (not key_bytes_max: none does).
    assert_eq!(c.limits, DecodeLimits::from(&Limits::default()).reported(2));
}

#[test]
fn produce_with_tags_and_headers_sends_its_properties() {
    let (mut c, rx) = connect_v2();
    let messages = [ProduceMessage::new(b"hello").tag("eu").header("trace", b"7f"), ProduceMessage::new(b"world")];
    assert_eq!(c.produce_messages("t", &messages).expect("produce"), (1, 2));
    let mut props = Vec::new();
    props::put_tag(&mut props, "eu");
    props::put_header(&mut props, "trace", b"7f");
    let props = Props::parse(&props, 2, &PropsLimits::ANY).expect("valid");
    let mut bytes = Vec::new();
    encode_message(&mut bytes, &props, b"hello");
    encode_message(&mut bytes, &Props::EMPTY, b"world");
    let batch = Batch { count: 2, bytes: &bytes, with_props: true };
    assert_sent(&rx, &Request::Produce { topic: "t", flags: 0, batch });
    // Plain payloads go out in version 2's layout too, without properties.
    c.produce("t", b"x").expect("produce");
    let mut bytes = Vec::new();
    encode_message(&mut bytes, &Props::EMPTY, b"x");
    assert_sent(
        &rx,
        &Request::Produce { topic: "t", flags: 0, batch: Batch { count: 1, bytes: &bytes, with_props: true } },
    );
}

#[test]
fn a_bad_tag_is_refused_before_anything_is_sent() {
    let (mut c, rx) = connect_v2();
    for bad in [
        ProduceMessage::new(b"x").tag("a b"),
        ProduceMessage::new(b"x").tag(""),
        ProduceMessage::new(b"x").tag(&"t".repeat(70_000)),
    ] {
        assert!(matches!(c.produce_messages("t", &[bad]), Err(Error::Invalid(_))));
    }
    assert_eq!(c.in_flight(), 0);
    c.ping().expect("in step");
    rx.recv_timeout(Duration::from_secs(20)).expect("the ping");
    assert!(rx.try_recv().is_err(), "only the ping was sent");
}

#[test]
fn group_calls_send_their_group_and_deliveries_carry_their_properties() {
    let (mut c, rx) = connect_v2();
    let got = c.fetch_group("t", "billing", now(3)).expect("fetch");
    assert_sent(
        &rx,
        &Request::Fetch { topic: "t", group: "billing", max_messages: 3, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 },
    );
    let d = &got[0];
    assert_eq!((d.id, d.payload.as_slice(), d.origin_group.as_str()), (5, &b"hello"[..], "billing"));
    assert_eq!((d.tags(), d.header("trace"), d.headers().len()), (vec!["eu"], Some(&b"7f"[..]), 1));
    c.fetch("t", now(1)).expect("the default group");
    assert_sent(
        &rx,
        &Request::Fetch { topic: "t", group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 },
    );

    let mut ids = Vec::new();
    codec::encode_ids(&mut ids, &[5, 6]);
    let ids = Ids { bytes: &ids };
    assert_eq!(c.ack_group("t", "billing", &[5, 6]).expect("ack").done, 2);
    assert_sent(&rx, &Request::Ack { topic: "t", group: "billing", ids });
    c.nack_group("t", "billing", &[5, 6], 1000, true).expect("nack");
    assert_sent(
        &rx,
        &Request::Nack { topic: "t", group: "billing", delay_ms: 1000, flags: NACK_FLAG_DEAD_LETTER, ids, reason: "" },
    );
    c.touch_group("t", "billing", &[5, 6], 60_000).expect("touch");
    assert_sent(&rx, &Request::Touch { topic: "t", group: "billing", ack_timeout_ms: 60_000, ids });
    assert_eq!(c.redrive_group("t", "billing", 0).expect("redrive"), 4);
    assert_sent(&rx, &Request::Redrive { topic: "t", group: "billing", max_messages: 0 });
}

#[test]
fn group_admin_calls_round_trip() {
    let (mut c, rx) = connect_v2();
    let settings = GroupSettings {
        broadcast: true,
        ack_timeout_ms: 9,
        max_deliveries: 2,
        filter: "a || b",
        ordered: false,
        retry: None,
    };
    assert_eq!(c.create_group("t", "billing", settings, Start::Time(7)).expect("create"), (true, 1));
    assert_sent(&rx, &Request::CreateGroup { topic: "t", group: "billing", settings, start: Start::Time(7) });
    let groups = c.list_groups("t").expect("list");
    assert_sent(&rx, &Request::ListGroups { topic: "t" });
    assert_eq!(groups.len(), 1);
    let g = &groups[0];
    assert_eq!(
        (g.name.as_str(), g.broadcast, g.filter.as_str(), g.stats.lag, g.stats.consumers),
        ("billing", true, "a || b", 4, 2)
    );
    assert_eq!(c.reset_group("t", "billing", Start::Id(3)).expect("reset"), 4);
    assert_sent(&rx, &Request::ResetGroup { topic: "t", group: "billing", start: Start::Id(3) });
    assert_eq!(c.delete_group("t", "billing").expect("delete"), 4);
    assert_sent(&rx, &Request::DeleteGroup { topic: "t", group: "billing" });
}

#[test]
fn a_fake_version_1_broker_gets_version_1_layouts() {
    let (addr, rx) = fake_broker(1);
    let mut c = Client::connect(addr).expect("connect");
    rx.recv_timeout(Duration::from_secs(20)).expect("hello");
    assert_eq!(c.version, 1);
    c.fetch("t", now(1)).expect("fetch");
    let got = rx.recv_timeout(Duration::from_secs(20)).expect("fetch");
    let mut v1 = Vec::new();
    let fetch = Request::Fetch { topic: "t", group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
    encode_request(&mut v1, 2, &fetch, 1);
    assert_eq!(got, v1, "version 1's FETCH, without a group");
    let d = c.fetch("t", now(1)).expect("fetch");
    assert!(d[0].props.is_empty() && d[0].origin_group.is_empty(), "a version-1 delivery carries neither");
}

// ---------------------------------------------------------------------------
// Version 6: HELLO reports the limits of versions 3 and 4.
// ---------------------------------------------------------------------------

/// Limits of versions 3 and 4 away from their defaults, so that no field
/// can match by chance.
fn feature_limits() -> Limits {
    Limits {
        subscription_credit_max: 100,
        key_bytes_max: 50,
        dedup_id_bytes_max: 40,
        nack_reason_bytes_max: 30,
        lookup_results_max: 20,
        ..Limits::default()
    }
}

/// The HELLO reply to a client offering versions 1 to `max`, as bytes.
fn hello_reply_bytes(addr: SocketAddr, max: u16) -> Vec<u8> {
    let mut r = common::wire::Raw::connect(addr);
    let mut hello = vec![14, 0, 0, 0, 1, 0, 0, 0, 9, 0, 0, 0, 1, 0];
    hello.extend_from_slice(&max.to_le_bytes());
    hello.extend_from_slice(&[0, 0]);
    r.write(&hello);
    r.recv().frame
}

/// A version-6 HELLO reply carries, after version 2's fields (which end
/// at body offset 58), the limits a client of versions 3 and 4 needs and
/// can learn nowhere else; a version-5 one is version 2's layout, byte
/// for byte, and the two agree on every field they share.
#[test]
fn a_version_6_hello_reply_reports_the_limits_of_versions_3_and_4() {
    let (srv, _dir) = common::start(feature_limits());
    let v6 = hello_reply_bytes(srv.addr, 6);
    assert_eq!((v6[4], u16::from_le_bytes([v6[12], v6[13]])), (0x81, 6), "{v6:02x?}");
    assert_eq!(v6.len(), 12 + 58 + 5 * 4, "{v6:02x?}");
    let at = |i: usize| u32::from_le_bytes([v6[70 + 4 * i], v6[71 + 4 * i], v6[72 + 4 * i], v6[73 + 4 * i]]);
    // subscription_credit_max, key_bytes_max, dedup_id_bytes_max,
    // nack_reason_bytes_max, lookup_results_max.
    assert_eq!((0..5).map(at).collect::<Vec<_>>(), [100, 50, 40, 30, 20]);
    let v5 = hello_reply_bytes(srv.addr, 5);
    assert_eq!((v5.len(), u16::from_le_bytes([v5[12], v5[13]])), (12 + 58, 5), "{v5:02x?}");
    assert_eq!(v5[14..], v6[14..70], "versions 5 and 6 report the fields they share alike");
}

/// `runnel::Client` offers version 6, and learns and exposes those limits;
/// a client that offers at most version 5 is told none of them (0).
#[test]
fn the_client_learns_the_limits_a_version_6_hello_reports() {
    let (srv, _dir) = common::start(feature_limits());
    let c = Client::connect(srv.addr).expect("connect");
    assert_eq!(c.version, 6);
    assert_eq!(c.limits, DecodeLimits::from(&feature_limits()));
    let l = &c.limits;
    let got = (l.subscription_credit_max, l.key_bytes_max, l.dedup_id_bytes_max, l.nack_reason_bytes_max);
    assert_eq!((got, l.lookup_results_max), ((100, 50, 40, 30), 20));
    let old = Client::connect_upto(srv.addr, b"", 5).expect("connect");
    assert_eq!(old.version, 5);
    assert_eq!(old.limits, DecodeLimits::from(&feature_limits()).reported(5));
    assert_eq!((old.limits.key_bytes_max, old.limits.lookup_results_max), (0, 0), "not reported before version 6");
}
