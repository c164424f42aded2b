//! The metrics listener (`--metrics`), over real HTTP: `GET /metrics`
//! serves the whole Prometheus exposition, parsed strictly here, with the
//! values the broker's state implies; `/healthz` answers `ok`; a bad
//! request gets its 4xx, and one that never arrives whole gets 408 while
//! the broker goes on serving its clients.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Server, TempDir};
use runnel::client::Fetch;
use runnel::config::Serve;

/// A broker with the metrics listener, configured from `runnel serve`
/// flags the way the command configures itself, plus `flags`.
fn with_metrics(flags: &[&str], dir: &TempDir) -> Server {
    let data = format!("--data={}", dir.path().display());
    let mut args = vec!["--listen=127.0.0.1:0", "--metrics=127.0.0.1:0", data.as_str()];
    args.extend_from_slice(flags);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let serve = Serve::parse(&args).expect("serve flags");
    assert_eq!(serve.cfg.metrics.map(|m| m.port()), Some(0), "{args:?}");
    Server::start_with(serve.cfg)
}

/// Sends `request` to the metrics listener; returns (status, body).
fn http(srv: &Server, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(srv.metrics.expect("metrics listener")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request).unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let text = String::from_utf8(resp).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status");
    if head.lines().any(|l| l == "Transfer-Encoding: chunked") {
        return (status, dechunk(body));
    }
    let Some(length) = head.lines().find_map(|l| l.strip_prefix("Content-Length: ")) else {
        // An HTTP/1.0 scrape: the body is what came before the close.
        assert!(String::from_utf8_lossy(request).contains("HTTP/1.0"), "no length: {head}");
        return (status, body.to_string());
    };
    assert_eq!(body.len(), length.parse::<usize>().expect("length"), "body length matches Content-Length");
    (status, body.to_string())
}

/// The body of a chunked response, checked to end with its last chunk.
fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(size, 16).expect("a hex chunk size");
        if size == 0 {
            assert_eq!(after, "\r\n", "the last chunk ends the body");
            return body;
        }
        body.push_str(&after[..size]);
        rest = after[size..].strip_prefix("\r\n").expect("CRLF after a chunk");
    }
}

/// One sample of the exposition format: name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// Parses a whole Prometheus text exposition body, strictly: every line is a
/// HELP or TYPE comment or a sample of a family whose TYPE came first.
fn parse_exposition(body: &str) -> (HashMap<String, String>, Vec<Sample>) {
    let mut types = HashMap::new();
    let mut samples = Vec::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            assert!(rest.split_once(' ').is_some_and(|(n, h)| n.starts_with("runnel_") && !h.is_empty()), "{line}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(types.insert(name.to_string(), kind.to_string()).is_none(), "TYPE twice: {line}");
            continue;
        }
        assert!(!line.starts_with('#') && !line.is_empty(), "unexpected line {line:?}");
        let (series, value) = line.rsplit_once(' ').expect("sample value");
        let value: f64 =
            if value == "+Inf" { f64::INFINITY } else { value.parse().unwrap_or_else(|_| panic!("{line}")) };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let inner = rest.strip_suffix('}').expect("closing brace");
                let labels = inner
                    .split(',')
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').expect("label k=v");
                        (k.to_string(), v.trim_matches('"').to_string())
                    })
                    .collect();
                (n.to_string(), labels)
            }
            None => (series.to_string(), Vec::new()),
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| types.get(*f).is_some_and(|k| k == "histogram")))
            .unwrap_or(&name);
        assert!(types.contains_key(family), "sample before its TYPE: {line}");
        if types[family] == "counter" {
            assert!(family.ends_with("_total"), "counter without _total: {family}");
        }
        samples.push((name, labels, value));
    }
    (types, samples)
}

fn value(samples: &[Sample], name: &str, topic: Option<&str>) -> f64 {
    samples
        .iter()
        .find(|s| s.0 == name && topic.is_none_or(|t| s.1.iter().any(|(k, v)| k == "topic" && v == t)))
        .unwrap_or_else(|| panic!("no sample {name} {topic:?}"))
        .2
}

#[test]
fn metrics_endpoint_serves_the_whole_exposition() {
    let dir = TempDir::new("metrics");
    let srv = with_metrics(&[], &dir);
    let mut c = srv.client();
    c.produce_batch("orders", &[b"a".as_slice(), b"b", b"c"]).unwrap();
    let got = c.fetch("orders", Fetch { max_messages: 2, ..Fetch::default() }).unwrap();
    c.ack("orders", &[got[0].id]).unwrap();

    let (status, body) = http(&srv, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 200);
    let (types, samples) = parse_exposition(&body);
    assert_eq!(value(&samples, "runnel_topic_ready_messages", Some("orders")), 1.0);
    assert_eq!(value(&samples, "runnel_topic_inflight_messages", Some("orders")), 1.0);
    assert_eq!(value(&samples, "runnel_topic_produced_total", Some("orders")), 3.0);
    assert_eq!(value(&samples, "runnel_topic_acked_total", Some("orders")), 1.0);
    assert_eq!(value(&samples, "runnel_topic_dead_letter_messages", Some("orders")), 0.0);
    assert_eq!(value(&samples, "runnel_topic_tag_sets", Some("orders")), 0.0);
    assert!(value(&samples, "runnel_topic_oldest_unacked_age_seconds", Some("orders")) >= 0.0);
    assert!(value(&samples, "runnel_connections", None) >= 1.0);
    assert!(value(&samples, "runnel_fsyncs_total", None) >= 1.0);
    assert!(value(&samples, "runnel_log_bytes", None) > 0.0);
    for h in ["runnel_fsync_duration_seconds", "runnel_produce_ack_latency_seconds"] {
        assert_eq!(types.get(h).map(String::as_str), Some("histogram"), "{h}");
        let count = value(&samples, &format!("{h}_count"), None);
        assert!(count >= 1.0, "{h} observed nothing");
        let inf = samples.iter().find(|s| s.0 == format!("{h}_bucket") && s.1[0].1 == "+Inf").unwrap().2;
        assert_eq!(inf, count, "{h}: +Inf bucket equals count");
    }
    // Every turn is timed, and each phase in the turns it ran in: these
    // turns wrote and synced the log.
    assert_eq!(types.get("runnel_loop_turn_duration_seconds").map(String::as_str), Some("histogram"));
    assert!(value(&samples, "runnel_loop_turn_duration_seconds_count", None) >= 1.0);
    let phase = |name: &str, phase: &str| {
        let s = samples.iter().find(|s| s.0 == name && s.1.iter().any(|(k, v)| k == "phase" && v == phase));
        s.unwrap_or_else(|| panic!("no sample {name} for phase {phase}")).2
    };
    for p in ["write", "fsync"] {
        assert!(phase("runnel_loop_phase_duration_seconds_count", p) >= 1.0, "phase {p} observed nothing");
    }
    for p in ["write", "fsync", "reserve", "roll", "release", "compact", "other"] {
        assert!(phase("runnel_loop_slow_turns_total", p) >= 0.0);
    }
    for family in ["runnel_loop_turns_total", "runnel_received_bytes_total", "runnel_sent_bytes_total"] {
        assert!(value(&samples, family, None) > 0.0, "{family}");
    }
    assert_eq!(types.get("runnel_buffered_bytes").map(String::as_str), Some("gauge"));
    assert_eq!(value(&samples, "runnel_busy_replies_total", None), 0.0);
}

/// A per-group sample: the one of `name` labelled with `topic` and `group`.
fn group_value(samples: &[Sample], name: &str, topic: &str, group: &str) -> f64 {
    let has = |s: &Sample, k: &str, v: &str| s.1.iter().any(|(lk, lv)| lk == k && lv == v);
    samples
        .iter()
        .find(|s| s.0 == name && has(s, "topic", topic) && has(s, "group", group))
        .unwrap_or_else(|| panic!("no sample {name} {topic}/{group}"))
        .2
}

#[test]
fn metrics_have_every_consumer_group_labelled() {
    let dir = TempDir::new("metrics-groups");
    let srv = with_metrics(&[], &dir);
    let mut c = srv.client_v2();
    let (first, _) = c.produce_batch("orders", &[b"a".as_slice(), b"b", b"c"]).unwrap();
    let all = Fetch { max_messages: 10, ack_timeout_ms: 600_000, ..Fetch::default() };
    c.fetch_group("orders", "billing", all).unwrap();
    c.ack_group("orders", "billing", &[first]).unwrap();
    c.nack_group("orders", "billing", &[first + 1], 0, false).unwrap();
    c.fetch_group("orders", "audit", Fetch { max_messages: 1, ..all }).unwrap();
    let (_, body) = http(&srv, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let (types, samples) = parse_exposition(&body);
    let g = |name: &str, group: &str| group_value(&samples, name, "orders", group);
    assert_eq!(g("runnel_group_inflight_messages", "billing"), 1.0);
    assert_eq!(g("runnel_group_retry_messages", "billing"), 1.0);
    assert_eq!(g("runnel_group_acked_total", "billing"), 1.0);
    assert_eq!(g("runnel_group_delivered_total", "billing"), 3.0);
    // The first was gone (billing, the only group, had acked it): b and c.
    assert_eq!(g("runnel_group_lag_messages", "audit"), 1.0);
    assert_eq!(g("runnel_group_consumers", "audit"), 1.0);
    assert_eq!(g("runnel_group_filtered_total", "audit"), 0.0);
    assert!(g("runnel_group_oldest_unacked_age_seconds", "audit") >= 0.0);
    assert_eq!(types.get("runnel_group_redelivered_total").map(String::as_str), Some("counter"));
    assert_eq!(types.get("runnel_group_delayed_messages").map(String::as_str), Some("gauge"));
    assert_eq!(types.get("runnel_group_dead_lettered_total").map(String::as_str), Some("counter"));
}

/// With a turn's share of the exposition far smaller than one scrape, a
/// scrape spans hundreds of turns and is still one valid exposition: every
/// family whole, once, with every topic and group once, in the order the
/// topics were created;
/// the same over HTTP/1.0, whose body ends with the connection.
#[test]
fn a_scrape_rendered_a_slice_a_turn_is_whole_and_valid() {
    const TOPICS: usize = 300;
    let dir = TempDir::new("metrics-slices");
    let srv = with_metrics(&["--metrics-bytes-per-turn-max=1024"], &dir);
    let mut c = srv.client_v2();
    let names: Vec<String> = (0..TOPICS).map(|i| format!("topic-{i:03}")).collect();
    for name in &names {
        c.produce(name, b"m").unwrap();
        c.fetch_group(name, "g", Fetch { max_messages: 1, ..Fetch::default() }).unwrap();
    }
    for request in [&b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"[..], b"GET /metrics HTTP/1.0\r\n\r\n"] {
        let (status, body) = http(&srv, request);
        assert_eq!(status, 200);
        assert!(body.len() > 100 * 1024, "{} bytes: not many slices", body.len());
        let (_, samples) = parse_exposition(&body);
        for family in ["runnel_topic_ready_messages", "runnel_group_inflight_messages"] {
            let topics: Vec<&str> = samples
                .iter()
                .filter(|s| s.0 == family)
                .filter_map(|s| s.1.iter().find(|(k, _)| k == "topic").map(|(_, v)| v.as_str()))
                .collect();
            assert_eq!(topics, names.iter().map(String::as_str).collect::<Vec<_>>(), "{family}");
        }
        assert_eq!(group_value(&samples, "runnel_group_inflight_messages", "topic-299", "g"), 1.0);
    }
}

#[test]
fn metrics_listener_answers_bad_and_slow_requests_with_4xx() {
    let dir = TempDir::new("metrics-bad");
    let srv = with_metrics(&["--handshake-timeout-ms=200"], &dir);
    assert_eq!(http(&srv, b"GET /healthz HTTP/1.1\r\n\r\n"), (200, "ok\n".to_string()));
    assert_eq!(http(&srv, b"GET /nope HTTP/1.1\r\n\r\n").0, 404);
    assert_eq!(http(&srv, b"POST /metrics HTTP/1.1\r\n\r\n").0, 405);
    assert_eq!(http(&srv, b"\x00\x01garbage\r\n\r\n").0, 400);
    assert_eq!(http(&srv, &[b'a'; 9000]).0, 431);
    // A request that never completes gets 408 once the timeout passes, and
    // the broker serves clients meanwhile.
    let mut slow = TcpStream::connect(srv.metrics.unwrap()).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    let mut c = srv.client();
    c.ping().unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut resp = String::new();
    slow.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 408 "), "{resp}");
}

/// A PRODUCE acknowledged once written (version 3) counts in the produce
/// acknowledgement histogram as a synced one does: three of each, six.
#[test]
fn produce_ack_latency_counts_written_and_synced_produces() {
    let dir = TempDir::new("metrics-written");
    let srv = with_metrics(&["--fsync=turn"], &dir);
    let mut c = runnel::client::Client::connect(srv.addr).unwrap();
    for _ in 0..3 {
        c.produce("t", b"synced").unwrap();
    }
    c.set_produce_flags(runnel::codec::PRODUCE_FLAG_WRITTEN).unwrap();
    for _ in 0..3 {
        c.produce("t", b"written").unwrap();
    }
    let (status, body) = http(&srv, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 200);
    let (_, samples) = parse_exposition(&body);
    assert_eq!(value(&samples, "runnel_produce_ack_latency_seconds_count", None), 6.0);
}
