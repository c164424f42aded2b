//! W11, a PING's wait beside loads that can hold the loop (runnel only,
//! `--fsync never`, so that no `fdatasync` stands in the turns): a probe
//! connection sends a PING every millisecond, at its intended time whatever
//! happened to the one before, and times each reply from that intended time
//! (no coordinated omission), while another load runs:
//!
//! - **broadcast**: many members of one broadcast group, each with a FETCH
//!   of a whole batch parked, all answered by the same PRODUCE (nothing is
//!   acknowledged: an ACK in a group of many members costs a check of
//!   every member per id, which is the queue's, not the loop's);
//! - **keyed**: producers pipelining batches of keyed messages, every key
//!   distinct, past the key index's bound;
//! - **push**: a backlog, then many push subscribers with a large credit,
//!   subscribing at the same moment (the first burst of pushes);
//! - **list**: many topics, and many connections each asking LIST_TOPICS
//!   several times at once;
//! - **metrics**: many topics, and many HTTP connections that send
//!   `GET /metrics` and never read; the broker's resident memory and its
//!   own count of its buffers (STATS `buffered_bytes`) are read while they
//!   hang, and one scrape that reads is checked whole.
//!
//! The row's latency is the probe's: p50, p99 and the longest wait, which
//! the per-turn work budget (`work_items_per_turn_max`,
//! `reply_bytes_per_turn_max`, `metrics_bytes_per_turn_max`) is there to
//! bound.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use runnel::client::{Client, Error, OwnedReply, ProduceMessage};
use runnel::codec::{self, Decoded, GroupSettings, Request, Start, TopicSettings};

use crate::conn::Consumer;
use crate::latency::{Samples, now_ns};
use crate::metrics;
use crate::push_conn::PushConsumer;
use crate::workload::{Ctx, RunResult};

/// One PING every this many ns.
const PROBE_PERIOD_NS: u64 = 1_000_000;
/// How long the probe waits for the replies still out when it stops.
const PROBE_TAIL: Duration = Duration::from_secs(30);
/// Payload of the loads' messages.
const SIZE: usize = 16;
/// Messages per PRODUCE while filling a backlog, and PRODUCEs in flight.
const FILL_BATCH: usize = 8192;
const FILL_DEPTH: usize = 4;
/// A broadcast member's long poll, ms: it outlasts a round.
const BROADCAST_WAIT_MS: u32 = 30_000;
/// A push subscriber's credit.
const PUSH_CREDIT: u32 = 8192;
/// LIST_TOPICS each listing connection pipelines at once.
const LISTS_PER_CONN: usize = 4;

/// What W11 runs beside its probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    Broadcast,
    Keyed,
    Push,
    List,
    Metrics,
}

impl Load {
    pub const ALL: [Load; 5] = [Load::Broadcast, Load::Keyed, Load::Push, Load::List, Load::Metrics];

    pub fn name(self) -> &'static str {
        match self {
            Load::Broadcast => "broadcast",
            Load::Keyed => "keyed",
            Load::Push => "push",
            Load::List => "list",
            Load::Metrics => "metrics",
        }
    }
}

/// How big each load is: the full run, or `--quick`.
#[derive(Clone, Debug)]
pub struct Sizes {
    /// Broadcast: members, and messages per PRODUCE (and per FETCH).
    pub members: usize,
    pub member_batch: u32,
    /// Keyed: producers, and messages over all of them.
    pub keyed_producers: usize,
    pub keyed_msgs: u64,
    /// Push: subscribers, and the backlog they are pushed.
    pub subscribers: usize,
    pub push_backlog: u64,
    /// List and metrics: topics; listing connections and their rounds.
    pub topics: usize,
    pub listers: usize,
    pub list_rounds: usize,
    /// Metrics: scrapers that never read, and how long they hang.
    pub scrapers: usize,
    pub hang: Duration,
}

impl Sizes {
    pub fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                members: 16,
                member_batch: 512,
                keyed_producers: 2,
                keyed_msgs: 20_000,
                subscribers: 4,
                push_backlog: 8_192,
                topics: 200,
                listers: 4,
                list_rounds: 2,
                scrapers: 4,
                hang: Duration::from_millis(300),
            }
        } else {
            Sizes {
                members: 2000,
                member_batch: 8192,
                keyed_producers: 4,
                keyed_msgs: 2_000_000,
                subscribers: 100,
                push_backlog: 819_200,
                // topics_max, with the probe's own topic.
                topics: 9_999,
                listers: 100,
                list_rounds: 5,
                scrapers: 100,
                hang: Duration::from_secs(3),
            }
        }
    }
}

/// The flags W11's server needs: `/metrics` (the metrics load scrapes it,
/// and every row reads the loop's own turn times from it, to tell a turn
/// that held the loop from a machine that took the core away); for the
/// broadcast load, room in the connections' buffers for every member's
/// reply at once (2000 replies of 8192 messages take some 640 MB, past the
/// default 256 MiB, where the broker would answer most of them BUSY), and a
/// timer for each message delivered (16.4M, past the default 10M).
pub fn server_args(load: Load, s: &Sizes) -> Vec<String> {
    let mut args = metrics::args();
    if load == Load::Broadcast {
        args.extend([
            "--buffered-bytes-max".into(),
            (4u64 << 30).to_string(),
            "--timers-max".into(),
            (s.members as u64 * u64::from(s.member_batch) + 1_000_000).to_string(),
        ]);
    }
    args
}

/// Words for the table's config column.
pub fn label(load: Load) -> String {
    let what: String = match load {
        Load::Broadcast => "broadcast members each fetching a whole batch at once, answered by one PRODUCE".into(),
        Load::Keyed => format!("producers pipelining batches of {FILL_BATCH} keyed messages, every key distinct"),
        Load::Push => format!("push subscribers (credit {PUSH_CREDIT}) subscribing at once to a backlog"),
        Load::List => format!("many topics, connections each sending {LISTS_PER_CONN} LIST_TOPICS at once"),
        Load::Metrics => "many topics, HTTP connections that GET /metrics and never read".into(),
    };
    format!("{}: {what}", load.name())
}

/// How big the load was, for the row's notes.
fn sizes_note(load: Load, s: &Sizes) -> String {
    match load {
        Load::Broadcast => format!("{} members, {} messages each", s.members, s.member_batch),
        Load::Keyed => format!("{} producers, {} messages", s.keyed_producers, s.keyed_msgs),
        Load::Push => format!("{} subscribers, a backlog of {}", s.subscribers, s.push_backlog),
        Load::List => format!("{} topics, {} connections, {} rounds", s.topics, s.listers, s.list_rounds),
        Load::Metrics => format!("{} topics, {} scrapers hanging {:?}", s.topics, s.scrapers, s.hang),
    }
}

fn connect(addr: SocketAddr) -> Result<Client, String> {
    let mut c = Client::connect(addr).map_err(|e| format!("runnel at {addr}: {e}"))?;
    c.set_timeout(Some(Duration::from_secs(60))).map_err(|e| format!("runnel at {addr}: {e}"))?;
    Ok(c)
}

fn call<T>(what: &str, r: Result<T, Error>) -> Result<T, String> {
    r.map_err(|e| format!("runnel {what}: {e}"))
}

// ---------------------------------------------------------------------------
// The probe.
// ---------------------------------------------------------------------------

/// A connection that sends PING every `PROBE_PERIOD_NS` and times each
/// reply from the PING's intended send time.
struct PingProbe {
    stop: Arc<AtomicBool>,
    writer: thread::JoinHandle<Result<u64, String>>,
    reader: thread::JoinHandle<Result<Samples, String>>,
    /// The connection (its HELLO done); the threads use clones of its
    /// socket.
    _client: Client,
}

impl PingProbe {
    fn start(addr: SocketAddr) -> Result<PingProbe, String> {
        let client = connect(addr)?;
        let clone = || client.stream().try_clone().map_err(|e| format!("probe socket: {e}"));
        let (mut w, mut r) = (clone()?, clone()?);
        r.set_read_timeout(Some(Duration::from_millis(200))).map_err(|e| format!("probe socket: {e}"))?;
        let version = client.version;
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(u64::MAX));
        let start_ns = now_ns() + 2 * PROBE_PERIOD_NS;
        let (stop_w, sent_w) = (stop.clone(), sent.clone());
        let writer = spawn("w11-probe-send", move || {
            let mut frame = Vec::new();
            let mut i = 0u64;
            while !stop_w.load(Ordering::Acquire) {
                let due = start_ns + i * PROBE_PERIOD_NS;
                let now = now_ns();
                if due > now {
                    thread::sleep(Duration::from_nanos(due - now));
                }
                frame.clear();
                codec::encode_request(&mut frame, i as u32, &Request::Ping, version);
                w.write_all(&frame).map_err(|e| format!("probe PING: {e}"))?;
                i += 1;
            }
            sent_w.store(i, Ordering::Release);
            Ok(i)
        })?;
        let reader = spawn("w11-probe-recv", move || {
            let mut waits = Samples::default();
            let (mut buf, mut chunk) = (Vec::new(), vec![0u8; 4096]);
            let mut got = 0u64;
            let mut tail_from: Option<Instant> = None;
            while got < sent.load(Ordering::Acquire) {
                if sent.load(Ordering::Acquire) != u64::MAX
                    && tail_from.get_or_insert_with(Instant::now).elapsed() > PROBE_TAIL
                {
                    return Err(format!("probe: {} PINGs unanswered", sent.load(Ordering::Acquire) - got));
                }
                let n = match r.read(&mut chunk) {
                    Ok(0) => return Err("probe: the broker closed the connection".into()),
                    Ok(n) => n,
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        continue;
                    }
                    Err(e) => return Err(format!("probe read: {e}")),
                };
                buf.extend_from_slice(&chunk[..n]);
                let now = now_ns();
                let mut used = 0;
                while let Ok(Decoded::Frame(f, len)) = codec::decode_reply(&buf[used..], 1 << 20) {
                    let due = start_ns + u64::from(f.request_id) * PROBE_PERIOD_NS;
                    waits.push(now.saturating_sub(due));
                    used += len;
                    got += 1;
                }
                buf.drain(..used);
            }
            Ok(waits)
        })?;
        Ok(PingProbe { stop, writer, reader, _client: client })
    }

    /// Stops sending and waits for the last replies.
    fn finish(self) -> Result<Samples, String> {
        self.stop.store(true, Ordering::Release);
        let sent = self.writer.join().map_err(|_| "the probe's sender panicked".to_string())??;
        let waits = self.reader.join().map_err(|_| "the probe's reader panicked".to_string())??;
        if sent == 0 {
            return Err("the probe sent no PING".into());
        }
        Ok(waits)
    }
}

fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<thread::JoinHandle<Result<T, String>>, String> {
    thread::Builder::new().name(name.into()).spawn(f).map_err(|e| format!("cannot start a thread: {e}"))
}

/// Runs `load` with the probe beside it; the load returns what it did (its
/// messages or requests) and notes, the probe the row's latency.
pub fn w11(ctx: &Ctx<'_>, load: Load) -> Result<RunResult, String> {
    let s = &ctx.scale.w11;
    let addr = ctx.target.addr;
    let mut r = RunResult::new(ctx, SIZE, "");
    r.notes.push(sizes_note(load, s));
    // The probe's topic: STATS of it carries the broker's own section.
    call("CREATE_TOPIC", connect(addr)?.create_topic("w11-probe", TopicSettings::default()))?;
    prepare(addr, load, s)?;
    // Connections the load leaves open until the probe has stopped.
    let mut kept = Vec::new();
    let turns_before = metrics::histogram(metrics::TURNS)?;
    let probe = PingProbe::start(addr)?;
    let cpu = ctx.server.cpu_seconds().ok();
    let t0 = Instant::now();
    let done = match load {
        Load::Broadcast => broadcast(addr, s, &mut r, &mut kept),
        Load::Keyed => keyed(addr, s),
        Load::Push => push(addr, s),
        Load::List => list(addr, s),
        Load::Metrics => hang_scrapes(ctx, s, &mut r),
    };
    r.seconds = t0.elapsed().as_secs_f64();
    r.cpu_seconds = cpu.zip(ctx.server.cpu_seconds().ok()).map(|(a, b)| b - a);
    let waits = probe.finish()?;
    let turns = metrics::between(&turns_before, &metrics::histogram(metrics::TURNS)?);
    drop(kept);
    r.extra.push(("turn_p99_bucket_s".into(), turns.p99_s));
    r.extra.push(("turn_max_bucket_s".into(), turns.max_s));
    r.notes.push(format!(
        "the loop's own turns meanwhile (its histogram's buckets): {} turns, p99 ≤ {}, longest ≤ {}",
        turns.count,
        metrics::seconds_label(turns.p99_s),
        metrics::seconds_label(turns.max_s)
    ));
    r.messages = done?;
    r.latency = waits.summarize("PING wait beside the load, from its intended send time");
    Ok(r)
}

/// What a load needs before the probe starts: the push load's backlog,
/// the list and metrics loads' topics.
fn prepare(addr: SocketAddr, load: Load, s: &Sizes) -> Result<(), String> {
    match load {
        Load::Push => fill(addr, "w11-push", s.push_backlog).map(|_| ()),
        Load::List | Load::Metrics => make_topics(addr, s.topics),
        Load::Broadcast | Load::Keyed => Ok(()),
    }
}

/// Produces `n` messages of `SIZE` bytes to `topic`, pipelined.
fn fill(addr: SocketAddr, topic: &str, n: u64) -> Result<u64, String> {
    let mut c = connect(addr)?;
    let payloads = vec![vec![b'b'; SIZE]; FILL_BATCH];
    let (mut sent, mut acked) = (0u64, 0u64);
    while acked < n {
        while c.in_flight() < FILL_DEPTH && sent < n {
            let k = (n - sent).min(FILL_BATCH as u64) as usize;
            c.send_produce(topic, &payloads[..k]);
            sent += k as u64;
        }
        match call("PRODUCE", c.recv())? {
            OwnedReply::Produced { count, .. } => acked += u64::from(count),
            other => return Err(format!("runnel PRODUCE: {other:?}")),
        }
    }
    Ok(acked)
}

/// Creates topics `w11-topic-00000-…` (names of 40 bytes), pipelined.
fn make_topics(addr: SocketAddr, n: usize) -> Result<(), String> {
    let mut c = connect(addr)?;
    let settings = TopicSettings::default();
    for chunk in (0..n).collect::<Vec<_>>().chunks(256) {
        for i in chunk {
            let name = format!("w11-topic-{i:05}-{}", "x".repeat(24));
            c.send(&Request::CreateTopic { topic: &name, settings, options: Default::default() });
        }
        for _ in chunk {
            call("CREATE_TOPIC", c.recv())?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The loads.
// ---------------------------------------------------------------------------

/// Broadcast members, each with a FETCH of `member_batch` parked, all
/// answered by one PRODUCE of that many. Returns the messages delivered;
/// the members are left in `kept`, to close after the probe has stopped
/// (closing a connection returns what it holds at once: the members'
/// closing is not this load).
fn broadcast(addr: SocketAddr, s: &Sizes, r: &mut RunResult, kept: &mut Vec<Client>) -> Result<u64, String> {
    let topic = "w11-broadcast";
    let mut producer = connect(addr)?;
    call("CREATE_TOPIC", producer.create_topic(topic, TopicSettings::default()))?;
    let settings = GroupSettings { broadcast: true, ..GroupSettings::default() };
    call("CREATE_GROUP", producer.create_group(topic, "bc", settings, Start::Latest))?;
    let fetch = Request::Fetch {
        topic,
        group: "bc",
        max_messages: s.member_batch,
        max_bytes: 0,
        wait_ms: BROADCAST_WAIT_MS,
        ack_timeout_ms: 0,
    };
    let mut members = Vec::with_capacity(s.members);
    for _ in 0..s.members {
        let mut c = connect(addr)?;
        c.send(&fetch);
        call("FETCH", c.flush())?;
        members.push(c);
    }
    // Let every member's FETCH park before the produce that answers them.
    thread::sleep(Duration::from_millis(500));
    let payloads = vec![vec![b'm'; SIZE]; s.member_batch as usize];
    call("PRODUCE", producer.produce_batch(topic, &payloads))?;
    let (mut delivered, mut busy) = (0u64, 0u64);
    for c in &mut members {
        match c.recv() {
            Ok(OwnedReply::Messages { messages, .. }) => delivered += messages.len() as u64,
            Err(e) if e.code() == Some(codec::ErrorCode::Busy) => busy += 1,
            other => return Err(format!("runnel FETCH of a broadcast member: {other:?}")),
        }
    }
    if busy > 0 {
        r.notes.push(format!("{busy} members were answered BUSY"));
    }
    *kept = members;
    Ok(delivered)
}

/// Producers of keyed messages, each key distinct. Returns the messages
/// produced.
fn keyed(addr: SocketAddr, s: &Sizes) -> Result<u64, String> {
    let per = s.keyed_msgs / s.keyed_producers as u64;
    let mut threads = Vec::new();
    for p in 0..s.keyed_producers {
        threads.push(spawn("w11-keyed", move || {
            let mut c = connect(addr)?;
            let payload = [b'k'; SIZE];
            let (mut sent, mut acked) = (0u64, 0u64);
            while acked < per {
                while c.in_flight() < FILL_DEPTH && sent < per {
                    let k = (per - sent).min(FILL_BATCH as u64);
                    let keys: Vec<String> = (sent..sent + k).map(|i| format!("p{p}-{i:012}")).collect();
                    let msgs: Vec<ProduceMessage<'_>> =
                        keys.iter().map(|key| ProduceMessage::new(&payload).key(key.as_bytes())).collect();
                    call("PRODUCE", c.send_produce_messages("w11-keyed", &msgs))?;
                    sent += k;
                }
                match call("PRODUCE", c.recv())? {
                    OwnedReply::Produced { count, .. } => acked += u64::from(count),
                    other => return Err(format!("runnel PRODUCE: {other:?}")),
                }
            }
            Ok(acked)
        })?);
    }
    let mut produced = 0;
    for t in threads {
        produced += t.join().map_err(|_| "a keyed producer panicked".to_string())??;
    }
    Ok(produced)
}

/// Push subscribers that subscribe at the same moment to a backlog, each
/// acknowledging what it is pushed, until the backlog is through. Returns
/// the messages pushed.
fn push(addr: SocketAddr, s: &Sizes) -> Result<u64, String> {
    let topic = "w11-push";
    let mut subs = Vec::with_capacity(s.subscribers);
    for _ in 0..s.subscribers {
        subs.push(PushConsumer::greet(addr, topic)?);
    }
    for c in &mut subs {
        c.send_subscribe(PUSH_CREDIT)?;
    }
    let total = Arc::new(AtomicU64::new(0));
    let backlog = s.push_backlog;
    let mut threads = Vec::new();
    for mut c in subs {
        let total = total.clone();
        threads.push(spawn("w11-push", move || {
            c.await_subscribed()?;
            let mut idle = Instant::now();
            while total.load(Ordering::Relaxed) < backlog && idle.elapsed() < Duration::from_secs(5) {
                let n = c.next(PUSH_CREDIT, 100, &mut |_| {})?;
                if n > 0 {
                    total.fetch_add(n as u64, Ordering::Relaxed);
                    idle = Instant::now();
                }
            }
            c.ack_pending()
        })?);
    }
    for t in threads {
        t.join().map_err(|_| "a push subscriber panicked".to_string())??;
    }
    let pushed = total.load(Ordering::Relaxed);
    if pushed < backlog {
        return Err(format!("push: {pushed} of the backlog's {backlog} messages were pushed"));
    }
    Ok(pushed)
}

/// Connections that each send `LISTS_PER_CONN` LIST_TOPICS at once, for
/// `list_rounds` rounds. Returns the replies.
fn list(addr: SocketAddr, s: &Sizes) -> Result<u64, String> {
    let mut conns = Vec::with_capacity(s.listers);
    for _ in 0..s.listers {
        conns.push(connect(addr)?);
    }
    let mut replies = 0u64;
    for _ in 0..s.list_rounds {
        for c in &mut conns {
            for _ in 0..LISTS_PER_CONN {
                c.send(&Request::ListTopics);
            }
            call("LIST_TOPICS", c.flush())?;
        }
        for c in &mut conns {
            for _ in 0..LISTS_PER_CONN {
                match call("LIST_TOPICS", c.recv())? {
                    OwnedReply::Topics(t) if t.len() >= s.topics => replies += 1,
                    other => return Err(format!("runnel LIST_TOPICS: {other:?}")),
                }
            }
        }
    }
    Ok(replies)
}

/// Scrapers that send `GET /metrics` and never read, for `hang`; then the
/// broker's memory and buffer count while they hang, and one scrape that
/// reads, checked whole. Returns 0: it counts no messages.
fn hang_scrapes(ctx: &Ctx<'_>, s: &Sizes, r: &mut RunResult) -> Result<u64, String> {
    let addr = metrics::addr();
    let (rss_before, _) = ctx.server.rss()?;
    let mut hanging = Vec::with_capacity(s.scrapers);
    for _ in 0..s.scrapers {
        let mut h = TcpStream::connect(addr).map_err(|e| format!("/metrics at {addr}: {e}"))?;
        h.write_all(b"GET /metrics HTTP/1.1\r\nHost: runnel\r\n\r\n").map_err(|e| format!("/metrics: {e}"))?;
        hanging.push(h);
    }
    thread::sleep(s.hang);
    let (rss, _) = ctx.server.rss()?;
    let mut c = connect(ctx.target.addr)?;
    let buffered = call("STATS", c.stats(Some("w11-probe")))?
        .iter()
        .find(|s| s.0.is_empty())
        .and_then(|s| s.1.iter().find(|kv| kv.0 == "buffered_bytes").map(|kv| kv.1))
        .unwrap_or(0);
    r.extra.push(("rss_growth_bytes".into(), rss.saturating_sub(rss_before) as f64));
    r.extra.push(("buffered_bytes".into(), buffered as f64));
    r.notes.push(format!(
        "while they hung: the broker's RSS grew by {:.1} MiB, STATS buffered_bytes {buffered}",
        rss.saturating_sub(rss_before) as f64 / (1 << 20) as f64
    ));
    let text = metrics::scrape()?;
    drop(hanging);
    let last = format!("runnel_topic_ready_messages{{topic=\"w11-topic-{:05}-", s.topics - 1);
    if !text.contains(&last) || !text.ends_with('\n') {
        return Err(format!("a scrape beside the hanging ones is not whole ({} bytes)", text.len()));
    }
    r.notes.push(format!("a scrape that read got all of the exposition, {} bytes", text.len()));
    Ok(0)
}
