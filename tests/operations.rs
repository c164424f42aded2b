//! Operations: the metrics endpoint, auth, connection timeouts, many idle
//! connections, signals and the config file.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, TempDir};
use runnel::broker::Config;
use runnel::client::{Client, Fetch, OwnedReply};
use runnel::codec::{self, ErrorCode, Request};
use runnel::config::ServeConfig;
use runnel::limits::Limits;

fn with_metrics(config: Config, dir: &TempDir) -> Server {
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap(), dir.path().to_path_buf());
    cfg.broker = config;
    cfg.metrics = Some("127.0.0.1:0".parse().unwrap());
    Server::start_with(cfg)
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
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.parse().ok())
        .expect("content length");
    assert_eq!(body.len(), length, "body length matches Content-Length");
    (status, body.to_string())
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
    let srv = with_metrics(Config::default(), &dir);
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
    for family in ["runnel_loop_turns_total", "runnel_received_bytes_total", "runnel_sent_bytes_total"] {
        assert!(value(&samples, family, None) > 0.0, "{family}");
    }
    assert_eq!(types.get("runnel_buffered_bytes").map(String::as_str), Some("gauge"));
    assert_eq!(value(&samples, "runnel_busy_replies_total", None), 0.0);
}

#[test]
fn metrics_listener_answers_bad_and_slow_requests_with_4xx() {
    let dir = TempDir::new("metrics-bad");
    let limits = Limits { handshake_timeout_ms: 200, ..Limits::default() };
    let srv = with_metrics(Config { limits, ..Config::default() }, &dir);
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

#[test]
fn auth_token_is_required_and_failures_close_the_connection() {
    let config = Config { auth_token: Some(b"s3cret".to_vec()), ..Config::default() };
    let (srv, _dir) = Server::start(config);
    // The right token works.
    let mut ok = Client::connect_with(srv.addr, b"s3cret").unwrap();
    ok.produce("t", b"x").unwrap();
    // A wrong token is UNAUTHENTICATED.
    match Client::connect_with(srv.addr, b"wrong") {
        Err(e) => assert_eq!(e.code(), Some(ErrorCode::Unauthenticated), "{e}"),
        Ok(_) => panic!("a wrong token was accepted"),
    }
    // Frames before an authenticated HELLO are UNAUTHENTICATED, and the
    // connection closes after a few failures.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut out = Vec::new();
    for rid in 1..=5 {
        codec::encode_request(&mut out, rid, &Request::Ping);
    }
    s.write_all(&out).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    let mut replies = 0;
    let mut rest = &got[..];
    while let Ok(codec::Decoded::Frame(f, n)) = codec::decode_reply(rest, usize::MAX) {
        assert!(matches!(f.reply, codec::Reply::Error { code, .. } if code == ErrorCode::Unauthenticated as u8));
        replies += 1;
        rest = &rest[n..];
    }
    assert_eq!(replies, 3, "three UNAUTHENTICATED replies, then the broker closed");
    ok.ping().unwrap();
}

/// Reads until EOF or error; true if the broker closed the connection.
fn closed_by_broker(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

#[test]
fn handshake_idle_and_frame_timeouts_close_connections() {
    let limits = Limits { handshake_timeout_ms: 100, idle_timeout_ms: 300, frame_timeout_ms: 100, ..Limits::default() };
    let (srv, _dir) = Server::start(Config { limits, ..Config::default() });
    // Never says HELLO.
    let mut silent = TcpStream::connect(srv.addr).unwrap();
    assert!(closed_by_broker(&mut silent), "handshake timeout");
    // Says HELLO, then nothing.
    let idle = srv.client();
    let mut idle_stream = idle.stream().try_clone().unwrap();
    assert!(closed_by_broker(&mut idle_stream), "idle timeout");
    // Trickles half a frame (slowloris).
    let mut slow = srv.client();
    let mut frame = Vec::new();
    codec::encode_request(&mut frame, 9, &Request::Ping);
    slow.write_raw(&frame[..5]).unwrap();
    let mut slow_stream = slow.stream().try_clone().unwrap();
    assert!(closed_by_broker(&mut slow_stream), "frame timeout");
    // A parked FETCH is not idle: it gets its (empty) reply after its wait.
    let mut parked = srv.client();
    let got = parked.fetch("t", Fetch { wait_ms: 600, ..Fetch::default() }).unwrap();
    assert!(got.is_empty());
    // And a client that keeps talking is served throughout.
    let mut busy = srv.client();
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        busy.ping().unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The idle clock restarts when a parked FETCH is answered, by a message or
/// by the end of its wait: a consumer that polls again after its answer is
/// not closed, however long its FETCH was parked.
#[test]
fn an_answered_long_poll_restarts_the_idle_clock() {
    let limits = Limits { idle_timeout_ms: 1000, ..Limits::default() };
    let (srv, _dir) = Server::start(Config { limits, ..Config::default() });
    let long_poll =
        |topic, wait_ms| Request::Fetch { topic, max_messages: 1, max_bytes: 0, wait_ms, ack_timeout_ms: 0 };
    // Both park for longer than idle_timeout_ms: one until its wait ends,
    // one until a message comes.
    let mut waits = srv.client();
    waits.send(&long_poll("quiet", 1500));
    waits.flush().unwrap();
    let mut gets = srv.client();
    gets.send(&long_poll("busy", 60_000));
    gets.flush().unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    let id = srv.client().produce("busy", b"at last").unwrap();
    match gets.recv().unwrap() {
        OwnedReply::Messages { messages, .. } => assert_eq!(messages.iter().map(|m| m.id).collect::<Vec<_>>(), [id]),
        other => panic!("the long poll on busy got {other:?}"),
    }
    match waits.recv().unwrap() {
        OwnedReply::Messages { messages, .. } => assert!(messages.is_empty()),
        other => panic!("the long poll on quiet got {other:?}"),
    }
    // Long after the FETCHes were sent, soon after they were answered.
    std::thread::sleep(Duration::from_millis(100));
    waits.ping().expect("the connection whose wait ended is still open");
    gets.ping().expect("the connection that got a message is still open");
}

#[test]
fn thousands_of_idle_connections_do_not_stop_a_normal_client() {
    // Both ends of every connection live in this process.
    let fds = runnel::sys::raise_fd_limit().expect("read the open-file limit");
    let n = (((fds.saturating_sub(200)) / 2) as usize).min(4000);
    assert!(n >= 1000, "the open-file limit ({fds}) allows only {n} connections");
    let (srv, _dir) = Server::start(Config::default());
    let mut idle = Vec::with_capacity(n);
    let mut hello = Vec::new();
    codec::encode_request(&mut hello, 1, &Request::Hello { min_version: 1, max_version: 1, token: b"" });
    for i in 0..n {
        let mut s = TcpStream::connect(srv.addr).unwrap();
        // Half say HELLO and go quiet; half never say anything.
        if i % 2 == 0 {
            s.write_all(&hello).unwrap();
        }
        idle.push(s);
    }
    let mut c = srv.client();
    let id = c.produce("t", b"still served").unwrap();
    let got = c.fetch("t", Fetch::default()).unwrap();
    assert_eq!((got[0].id, got[0].payload.as_slice()), (id, b"still served".as_slice()));
    // The kernel completes connects before the broker accepts them (the
    // listen backlog may hold some back): wait for every one to be counted.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let open = c.stat("", "connections").unwrap().unwrap();
        if open > n as u64 {
            break;
        }
        assert!(Instant::now() < until, "{open} connections counted, {n} idle plus this one open");
        std::thread::sleep(Duration::from_millis(20));
    }
    c.ping().unwrap();
}

#[test]
fn connection_limit_refuses_with_a_clear_error() {
    let limits = Limits { connections_max: 2, ..Limits::default() };
    let (srv, _dir) = Server::start(Config { limits, ..Config::default() });
    let mut a = srv.client();
    let _b = srv.client();
    match Client::connect(srv.addr) {
        Err(e) => assert_eq!(e.code(), Some(ErrorCode::TooManyConnections), "{e}"),
        Ok(_) => panic!("a third connection was accepted"),
    }
    a.ping().unwrap();
}

fn runnel() -> Command {
    Command::new(env!("CARGO_BIN_EXE_runnel"))
}

#[test]
fn config_file_keys_are_the_flags_and_flags_override_them() {
    let dir = TempDir::new("config");
    let path = dir.path().join("runnel.conf");
    std::fs::write(
        &path,
        "# a comment\nfsync = never\nmax-deliveries = 5\nidle-timeout-ms = 1234\nno-auto-create = true\n",
    )
    .unwrap();
    let out = runnel()
        .args(["serve", "--config", path.to_str().unwrap(), "--max-deliveries", "7", "--print-config"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for line in ["fsync = never", "max-deliveries = 7", "idle-timeout-ms = 1234", "no-auto-create = true"] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    // What --print-config prints is itself a config file that says the same.
    let printed = dir.path().join("printed.conf");
    std::fs::write(&printed, &text).unwrap();
    let again = runnel().args(["serve", "--config", printed.to_str().unwrap(), "--print-config"]).output().unwrap();
    assert_eq!(String::from_utf8(again.stdout).unwrap(), text);
    // An unknown key is refused by name.
    std::fs::write(&path, "no-such-key = 1\n").unwrap();
    let bad = runnel().args(["serve", "--config", path.to_str().unwrap(), "--print-config"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no-such-key"));
}

/// A free port for a child broker (bind to 0, read it, let it go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn connect_retry(addr: &str) -> Client {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match Client::connect(addr) {
            Ok(c) => return c,
            Err(e) if Instant::now() < until => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("broker at {addr} never came up: {e}"),
        }
    }
}

#[test]
fn sigterm_answers_parked_fetches_syncs_and_exits_zero() {
    let dir = TempDir::new("sigterm");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = runnel()
        .args(["serve", "--listen", &addr, "--data", dir.path().to_str().unwrap(), "--pin-core", "0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut c = connect_retry(&addr);
    let ids: Vec<u64> = (0..50).map(|i| c.produce("t", format!("m{i}").as_bytes()).unwrap()).collect();
    // A long poll parked on another topic.
    let mut parked = connect_retry(&addr);
    let waiter = std::thread::spawn(move || parked.fetch("empty", Fetch { wait_ms: 60_000, ..Fetch::default() }));
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: kill(2) with the child's pid, which we own.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let answered = waiter.join().unwrap().expect("the parked FETCH is answered before the broker exits");
    assert!(answered.is_empty());
    let status = child.wait().unwrap();
    assert!(status.success(), "graceful shutdown exits 0, got {status}");
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("pinned the event loop to CPU 0"), "{err}");
    assert!(err.contains("stopped cleanly"), "{err}");

    // A restart finds nothing torn and every message.
    let mut child =
        runnel().args(["serve", "--listen", &addr, "--data", dir.path().to_str().unwrap()]).spawn().unwrap();
    let mut c = connect_retry(&addr);
    let got = c.fetch("t", Fetch { max_messages: 100, ..Fetch::default() }).unwrap();
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), ids);
    assert_eq!(c.stat("", "recovery_truncated_bytes").unwrap(), Some(0), "nothing torn");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_second_signal_exits_at_once() {
    let dir = TempDir::new("sig2");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = runnel()
        .args(["serve", "--listen", &addr, "--data", dir.path().to_str().unwrap()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut c = connect_retry(&addr);
    c.produce("t", b"x").unwrap();
    let pid = child.id() as i32;
    // Stopped, the broker cannot act on the first signal before the second
    // arrives: both are pending when it continues (two different signals,
    // as two of the same would merge into one), and the second exits at
    // once, with status 1 rather than a graceful 0.
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // Wait until it is really stopped (state T in /proc/PID/stat).
    let until = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap().split(") ").nth(1).unwrap().starts_with('T') {
        assert!(Instant::now() < until, "the broker never stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: as above.
    unsafe {
        assert_eq!(libc::kill(pid, libc::SIGINT), 0);
        assert_eq!(libc::kill(pid, libc::SIGTERM), 0);
        assert_eq!(libc::kill(pid, libc::SIGCONT), 0);
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "a second signal exits at once with status 1, got {status}");
}
