//! The bound on all connections' buffers together (`buffered_bytes_max`):
//! peers that send requests and never read their replies, or leave large
//! frames half sent, cannot take the broker's memory between them, while a
//! client that reads its replies is served (docs/protocol.md, "Connection
//! limits"). Over real TCP; one test measures the resident memory of a
//! `runnel serve` child. No test asserts how long anything took: waits are
//! for states, with generous limits.

mod common;

use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::wire::*;
use common::{Server, TempDir};
use runnel::broker::Config;
use runnel::client::{Client, OwnedReply};
use runnel::codec::{ErrorCode, Request, TopicSettings};
use runnel::limits::Limits;

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

/// A peer that sends requests and never reads a reply.
struct Hog {
    s: TcpStream,
}

impl Hog {
    /// Connects and completes HELLO (the only reply it reads).
    fn connect(addr: SocketAddr) -> Hog {
        let mut raw = Raw::connect(addr);
        raw.hello();
        raw.s.set_nonblocking(true).expect("nonblocking");
        Hog { s: raw.s }
    }

    /// Writes `frame` over and over, `bytes_max` bytes at most, or until the
    /// socket takes no more (the broker stopped reading). Returns the bytes
    /// written.
    fn send_repeated(&mut self, frame: &[u8], bytes_max: usize) -> usize {
        let burst: Vec<u8> =
            frame.iter().copied().cycle().take(frame.len() * (64usize << 10).div_ceil(frame.len())).collect();
        let mut sent = 0;
        while sent < bytes_max {
            let end = burst.len().min(bytes_max - sent);
            match self.s.write(&burst[..end]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => panic!("hog write: {e}"),
            }
        }
        sent
    }

    /// Writes the first `sent_bytes` of a PRODUCE frame of `frame_bytes`
    /// bytes, and no more: a frame left half sent. (Its one message is
    /// larger than message_bytes_max, but the broker cannot know before the
    /// frame is whole.) Call it while the broker reads: the write blocks.
    fn send_half_frame(&mut self, frame_bytes: usize, sent_bytes: usize) {
        let payload = vec![0x5a; frame_bytes - 12 - 2 - 1 - 4 - 4];
        let body = batch_body(&[payload]);
        let frame = encode(7, &produce_req("h", &body, 1));
        assert_eq!(frame.len(), frame_bytes);
        self.s.set_nonblocking(false).expect("blocking");
        self.s.set_write_timeout(Some(PATIENCE)).expect("write timeout");
        self.s.write_all(&frame[..sent_bytes]).expect("the broker reads a half frame while it has room");
    }
}

/// A counter of the broker's STATS section, asked with STATS of `topic`
/// (one topic's STATS is served while the buffers are full; every topic's
/// is not).
fn broker_stat(c: &mut Client, topic: &str, key: &str) -> u64 {
    let sections = c.stats(Some(topic)).expect("STATS of one topic");
    let broker = sections.iter().find(|s| s.0.is_empty()).expect("the broker section");
    broker.1.iter().find(|kv| kv.0 == key).unwrap_or_else(|| panic!("no broker key {key}")).1
}

/// The encoded STATS request for every topic.
fn stats_all() -> Vec<u8> {
    encode(1, &Request::Stats { topic: "" })
}

/// Creates `n` topics with one pipelined write, so a STATS of every topic
/// is large.
fn create_topics(c: &mut Client, n: usize) {
    let names: Vec<String> = (0..n).map(|i| format!("topic-{i:04}")).collect();
    for name in &names {
        c.send(&Request::CreateTopic { topic: name, settings: TopicSettings::default(), options: Default::default() });
    }
    for _ in &names {
        assert!(matches!(c.recv().expect("CREATE_TOPIC"), OwnedReply::Created(true)));
    }
}

/// Waits until the broker has read nothing from anyone but `c` for a while
/// (the hogs are all paused or starved): `bytes_in` grows by exactly the
/// STATS requests `c` sends to ask. Returns the largest `buffered_bytes`
/// seen meanwhile.
fn wait_for_quiet(c: &mut Client, topic: &str) -> u64 {
    let own_request_bytes = encode(0, &Request::Stats { topic }).len() as u64;
    let start = Instant::now();
    let mut last = broker_stat(c, topic, "bytes_in");
    let (mut quiet, mut buffered_max) = (0, 0);
    while quiet < 25 {
        assert!(start.elapsed() < Duration::from_secs(120), "the broker never stopped reading the hogs");
        std::thread::sleep(Duration::from_millis(20));
        let sections = c.stats(Some(topic)).expect("STATS of one topic");
        let broker = &sections.iter().find(|s| s.0.is_empty()).expect("the broker section").1;
        let get = |key: &str| broker.iter().find(|kv| kv.0 == key).map_or(0, |kv| kv.1);
        buffered_max = buffered_max.max(get("buffered_bytes"));
        let bytes_in = get("bytes_in");
        quiet = if bytes_in == last + own_request_bytes { quiet + 1 } else { 0 };
        last = bytes_in;
    }
    buffered_max
}

/// A field of /proc/<pid>/status in bytes (VmRSS, VmHWM: given in kB).
fn proc_status_bytes(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/<pid>/status");
    let line = status.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key} in status"));
    let kib: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a number of kB");
    kib * 1024
}

/// A `runnel serve` child, killed on drop.
struct Broker {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `runnel serve` on `data` with `args` and waits until it answers;
/// retries with another port if the one chosen was taken meanwhile.
fn spawn_broker(data: &Path, args: &[String]) -> Broker {
    for _ in 0..20 {
        let port = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let stderr = data.with_extension("stderr");
        let child = Command::new(env!("CARGO_BIN_EXE_runnel"))
            .args(["serve", "--listen", &addr.to_string(), "--data"])
            .arg(data)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&stderr).expect("stderr file")))
            .spawn()
            .expect("spawn runnel serve");
        let mut b = Broker { child, addr };
        let start = Instant::now();
        loop {
            if let Some(status) = b.child.try_wait().expect("try_wait") {
                let err = std::fs::read_to_string(&stderr).unwrap_or_default();
                assert!(err.contains("cannot listen"), "runnel serve exited with {status}:\n{err}");
                break;
            }
            if Client::connect(addr).is_ok_and(|mut c| c.ping().is_ok()) {
                return b;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "runnel serve did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    panic!("no free port for runnel serve after 20 tries");
}

// ---------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------

/// The attack, scaled down: peers that pipeline STATS or FETCHes of
/// large messages and never read, and peers that leave a large frame half
/// sent. The broker's resident memory grows by at most the budget plus a
/// fixed margin (without the budget, by some 170 MiB), and a client that
/// reads is served meanwhile.
#[test]
fn peers_that_never_read_cannot_take_the_brokers_memory() {
    const MIB: u64 = 1 << 20;
    const BUDGET_BYTES: u64 = 24 * MIB;
    const OUTPUT_BYTES_MAX: u64 = 4 * MIB;
    const FRAME_BYTES_MAX: u64 = MIB;
    const HOGS_PER_KIND: usize = 30;
    const HALF_FRAMES: usize = 20;
    let dir = TempDir::new("membudget");
    let flags = [
        ("--buffered-bytes-max", BUDGET_BYTES),
        ("--output-bytes-max", OUTPUT_BYTES_MAX),
        ("--frame-bytes-max", FRAME_BYTES_MAX),
        ("--fetch-bytes-max", MIB),
        ("--message-bytes-max", 64 << 10),
        // The hogs must stay for the whole test.
        ("--frame-timeout-ms", 600_000),
        ("--idle-timeout-ms", 0),
    ];
    let args: Vec<String> = flags.iter().flat_map(|(k, v)| [k.to_string(), v.to_string()]).collect();
    let broker = spawn_broker(&dir.path().join("data"), &args);
    let pid = broker.child.id();
    let mut c = Client::connect(broker.addr).expect("connect");
    c.set_timeout(Some(PATIENCE)).expect("timeout");

    // 400 topics make each STATS of every topic some 100 KiB. Messages of
    // "big" come back 1 ms after each delivery, so FETCHes always find some.
    create_topics(&mut c, 400);
    c.create_topic("big", TopicSettings { ack_timeout_ms: 1, max_deliveries: u16::MAX }).expect("create big");
    let payload = vec![0xab; 60 << 10];
    for _ in 0..4 {
        c.produce_batch("big", &[payload.as_slice(); 16]).expect("produce big");
    }
    c.produce_batch("small", &[b"one".as_slice(), b"two", b"three"]).expect("produce small");
    let held = c.fetch("small", now(1)).expect("fetch small");
    assert_eq!(held.len(), 1);

    // The peak resident memory counts from here (clear_refs 5 resets it;
    // where the kernel refuses, the peak of the setup counts too, which
    // only makes the check stricter).
    if let Err(e) = std::fs::write(format!("/proc/{pid}/clear_refs"), "5") {
        println!("cannot reset the broker's peak RSS ({e}); measuring from its start");
    }
    let rss_before = proc_status_bytes(pid, "VmRSS");

    let fetch_big = encode(
        1,
        &Request::Fetch { topic: "big", group: "", max_messages: 64, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 },
    );
    // The half frames first, while the buffers have room for them.
    let mut hogs = Vec::new();
    for _ in 0..HALF_FRAMES {
        let mut h = Hog::connect(broker.addr);
        h.send_half_frame(FRAME_BYTES_MAX as usize, 900 << 10);
        hogs.push(h);
    }
    for i in 0..2 * HOGS_PER_KIND {
        let mut h = Hog::connect(broker.addr);
        let frame = if i % 2 == 0 { stats_all() } else { fetch_big.clone() };
        h.send_repeated(&frame, 4 << 20);
        hogs.push(h);
    }
    let buffered_max = wait_for_quiet(&mut c, "small");

    // Each connection may pass the budget by under 192 KiB, and the one
    // buffer that passed it by its growth (at most twice its connection's
    // output limit); the process adds its own allocations and the
    // allocator's slack.
    let connections = (hogs.len() + 1) as u64;
    let margin_bytes = connections * (192 << 10) + 2 * OUTPUT_BYTES_MAX;
    let rss_peak = proc_status_bytes(pid, "VmHWM");
    let rss_grown = rss_peak.saturating_sub(rss_before);
    println!("broker RSS {rss_before} bytes before the hogs, peak {rss_peak}: grew {rss_grown}");
    println!("buffered_bytes peaked at {buffered_max} bytes; budget {BUDGET_BYTES}, margin {margin_bytes}");
    assert!(
        rss_grown <= BUDGET_BYTES + margin_bytes + 16 * MIB,
        "the broker's resident memory grew by {rss_grown} bytes under the hogs (budget {BUDGET_BYTES})"
    );
    assert!(buffered_max >= BUDGET_BYTES, "the hogs did not fill the buffers: {buffered_max}");
    assert!(buffered_max <= BUDGET_BYTES + margin_bytes, "buffered_bytes {buffered_max} over the budget and margin");

    // The client that reads is served: small replies flow, large ones are
    // answered BUSY while the buffers are full.
    c.ping().expect("PING");
    c.produce("small", b"four").expect("PRODUCE");
    assert_eq!(c.ack("small", &[held[0].id]).expect("ACK").done, 1);
    assert_eq!(code(c.fetch("small", now(1))), ErrorCode::Busy);
    assert_eq!(code(c.stats(None)), ErrorCode::Busy);
    assert!(broker_stat(&mut c, "small", "busy_replies") > 0);

    // Once the hogs are gone, the buffers empty and FETCH is served again.
    drop(hogs);
    wait_until("the hogs' buffers to be given back", || broker_stat(&mut c, "small", "buffered_bytes") < BUDGET_BYTES);
    let got = c.fetch("small", now(1)).expect("FETCH after the hogs");
    assert_eq!(got.len(), 1);
}

/// Scrapers of `/metrics` that send their request and never read: each
/// holds one slice of the exposition, its list of topics and its request
/// head, counted in the connections' buffers (STATS `buffered_bytes`, the
/// exposition's `runnel_buffered_bytes`), however large the exposition;
/// the broker's resident memory grows by little (with the whole exposition
/// rendered for each, by some 400 MiB); a PING on another connection is
/// answered while they hang, and a scrape that reads gets the exposition
/// whole.
#[test]
fn scrapers_that_never_read_hold_one_slice_each_in_the_counted_buffers() {
    const MIB: u64 = 1 << 20;
    const TOPICS: usize = 9_000;
    const SCRAPERS: usize = 40;
    let dir = TempDir::new("scrapers");
    let metrics_port = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let metrics: SocketAddr = format!("127.0.0.1:{metrics_port}").parse().expect("addr");
    let args: Vec<String> = ["--fsync", "never", "--metrics", &metrics.to_string()].map(String::from).to_vec();
    let broker = spawn_broker(&dir.path().join("data"), &args);
    let pid = broker.child.id();
    let mut c = Client::connect(broker.addr).expect("connect");
    c.set_timeout(Some(PATIENCE)).expect("timeout");
    // Some 10 MiB of exposition: more than a socket's buffers take.
    create_topics(&mut c, TOPICS);
    let rss_before = proc_status_bytes(pid, "VmRSS");
    let counted_before = broker_stat(&mut c, "topic-0000", "buffered_bytes");

    let mut scrapers = Vec::new();
    for _ in 0..SCRAPERS {
        let mut s = TcpStream::connect(metrics).expect("connect to /metrics");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("GET");
        scrapers.push(s);
    }
    // Each scrape holds its list of topics while it is under way.
    let listed = (SCRAPERS * TOPICS * 4) as u64;
    wait_until("the scrapes to be counted in the buffers", || {
        broker_stat(&mut c, "topic-0000", "buffered_bytes") >= counted_before + listed
    });
    // And they go no further once their sockets take no more: a slice
    // each, its list and its request head at most.
    let held_max = (SCRAPERS * (2 * runnel::http::SCRAPE_SLICE_BYTES + TOPICS * 4 + (16 << 10))) as u64;
    let mut counted = 0;
    for _ in 0..50 {
        c.ping().expect("PING while the scrapers hang");
        counted = broker_stat(&mut c, "topic-0000", "buffered_bytes");
        assert!(counted <= counted_before + held_max, "buffered_bytes {counted}, over {held_max} for the scrapes");
    }
    let rss_grown = proc_status_bytes(pid, "VmRSS").saturating_sub(rss_before);
    println!("scrapers hanging: buffered_bytes {counted}, RSS grew {rss_grown} bytes");
    assert!(rss_grown <= held_max + 32 * MIB, "the broker's RSS grew by {rss_grown} bytes under {SCRAPERS} scrapers");

    // A scrape that reads gets all of it, and the gauge counts the others.
    let mut reader = TcpStream::connect(metrics).expect("connect to /metrics");
    reader.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    reader.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").expect("GET");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut reader, &mut text).expect("the whole scrape");
    let last = format!("runnel_topic_ready_messages{{topic=\"topic-{:04}\"}} 0\n", TOPICS - 1);
    assert!(text.starts_with("HTTP/1.1 200 OK") && text.contains(&last), "{}", &text[..text.len().min(300)]);
    let gauge: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("runnel_buffered_bytes "))
        .and_then(|v| v.parse().ok())
        .expect("runnel_buffered_bytes");
    assert!(gauge >= counted_before + listed, "runnel_buffered_bytes {gauge} does not count the scrapes");
    drop(scrapers);
}

/// A client alone, pipelining large requests as fast as it can, is never
/// answered BUSY under the default limits: `Limits::check` makes the budget
/// hold everything one connection can.
#[test]
fn a_lone_client_pipelining_at_full_speed_is_never_busy() {
    let (srv, _dir) = Server::start(Config::default());
    let mut c = srv.client();
    // 2000 topics make each STATS of every topic some 500 KiB.
    create_topics(&mut c, 2000);
    let payload = vec![0xcd; 1 << 20];
    for _ in 0..4 {
        c.produce_batch("big", &[payload.as_slice(); 4]).expect("produce");
    }
    // 16 one-message FETCHes of 1 MiB and 100 STATS of every topic, in one
    // pipeline: some 66 MiB of replies, read as they come.
    for i in 0..116 {
        if i % 7 == 0 && i / 7 < 16 {
            c.send(&Request::Fetch {
                topic: "big",
                group: "",
                max_messages: 1,
                max_bytes: 0,
                wait_ms: 0,
                ack_timeout_ms: 0,
            });
        } else {
            c.send(&Request::Stats { topic: "" });
        }
    }
    let (mut messages, mut stats) = (0, 0);
    for _ in 0..116 {
        match c.recv() {
            Ok(OwnedReply::Messages { messages: m, .. }) => messages += m.len(),
            Ok(OwnedReply::Stats(s)) => {
                assert!(s.len() > 2000);
                stats += 1;
            }
            other => panic!("a lone pipelining client got {other:?}"),
        }
    }
    assert_eq!((messages, stats), (16, 100));
    assert_eq!(stat(&mut c, "", "busy_replies"), 0);
}

/// Limits for the in-process tests: 1 MiB of output per connection, 5 MiB
/// for all (frames and messages small enough for `Limits::check` to allow
/// that).
fn full_limits(frame_timeout_ms: u32) -> Limits {
    let l = Limits {
        frame_bytes_max: 64 << 10,
        message_bytes_max: 16 << 10,
        fetch_bytes_max: 16 << 10,
        output_bytes_max: 1 << 20,
        buffered_bytes_max: 5 << 20,
        frame_timeout_ms,
        ..Limits::default()
    };
    l.check().expect("limits are consistent");
    l
}

/// Hogs that never read, added until the buffers are full: each pipelines
/// STATS of every topic, two at a time (some 20 KiB of replies), until the
/// broker holds 96 KiB more than before it came (the kernel's socket
/// buffers take the first megabytes), so each holds well under half of its
/// output limit and is never paused for it. `observer` asks STATS of
/// `topic`.
fn fill_buffers(srv: &Server, observer: &mut Client, topic: &str) -> Vec<Hog> {
    let budget_bytes = 5 << 20;
    let pair = stats_all().repeat(2);
    let mut hogs = Vec::new();
    loop {
        let before = broker_stat(observer, topic, "buffered_bytes");
        if before >= budget_bytes {
            return hogs;
        }
        let mut h = Hog::connect(srv.addr);
        loop {
            assert_eq!(h.send_repeated(&pair, pair.len()), pair.len(), "the broker stopped reading a hog");
            let now = broker_stat(observer, topic, "buffered_bytes");
            if now >= before + (96 << 10) || now >= budget_bytes {
                break;
            }
        }
        hogs.push(h);
    }
}

#[test]
fn while_the_buffers_are_full_large_replies_are_busy_and_small_ones_flow() {
    let (srv, _dir) = Server::start(Config { limits: full_limits(600_000), ..Config::default() });
    let mut c = srv.client();
    create_topics(&mut c, 40);
    c.produce_batch("jobs", &[b"a".as_slice(), b"b", b"c"]).expect("produce");
    let held = c.fetch("jobs", now(1)).expect("fetch");
    // A consumer parks a long poll before the hogs come.
    let mut consumer = srv.client();
    consumer.send(&Request::Fetch {
        topic: "later",
        group: "",
        max_messages: 1,
        max_bytes: 0,
        wait_ms: 60_000,
        ack_timeout_ms: 0,
    });
    consumer.flush().expect("send the long poll");
    wait_until("the long poll to park", || stat(&mut c, "later", "waiters") == 1);

    let hogs = fill_buffers(&srv, &mut c, "jobs");

    c.ping().expect("PING");
    c.produce("jobs", b"d").expect("PRODUCE");
    assert_eq!(c.ack("jobs", &[held[0].id]).expect("ACK").done, 1);
    assert_eq!(c.nack("jobs", &[999], 0, false).expect("NACK").failed, vec![999]);
    assert_eq!(broker_stat(&mut c, "jobs", "topics"), 42);
    assert_eq!(code(c.fetch("jobs", now(1))), ErrorCode::Busy);
    assert_eq!(code(c.stats(None)), ErrorCode::Busy);
    assert_eq!(code(c.list_topics()), ErrorCode::Busy);
    assert!(c.fetch("empty", now(1)).expect("a FETCH that finds nothing").is_empty());
    // Messages for the parked long poll: it is answered BUSY, not with them.
    c.produce("later", b"x").expect("PRODUCE to later");
    assert_eq!(code(consumer.recv()), ErrorCode::Busy);
    assert!(broker_stat(&mut c, "jobs", "busy_replies") >= 4);

    drop(hogs);
    wait_until("the buffers to empty", || broker_stat(&mut c, "jobs", "buffered_bytes") < 5 << 20);
    assert_eq!(c.fetch("jobs", now(4)).expect("FETCH").len(), 3);
    assert_eq!(consumer.fetch("later", now(1)).expect("FETCH later").len(), 1);
    assert_eq!(c.list_topics().expect("LIST_TOPICS").len(), 43);
}

/// Hogs that hold their replies while the buffers are full are closed after
/// frame_timeout_ms, though they send nothing more (so are never starved),
/// and the buffers have room again. (Nothing else closes them: their
/// frames are whole, and the idle timeout is ten minutes.)
#[test]
fn peers_that_hold_much_while_the_buffers_are_full_are_closed() {
    let (srv, _dir) = Server::start(Config { limits: full_limits(2000), ..Config::default() });
    let mut c = srv.client();
    create_topics(&mut c, 40);
    c.produce("jobs", b"a").expect("produce");
    let hogs = fill_buffers(&srv, &mut c, "jobs");
    let connections = hogs.len() as u64 + 1;
    wait_until("hogs to be closed and the buffers to have room", || {
        broker_stat(&mut c, "jobs", "connections") < connections
            && broker_stat(&mut c, "jobs", "buffered_bytes") < 5 << 20
    });
    assert_eq!(c.fetch("jobs", now(1)).expect("FETCH").len(), 1);
}
