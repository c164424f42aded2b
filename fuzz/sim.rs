//! A broker and its connections without sockets. Each connection runs the
//! reactor's own protocol code, `runnel::conn::ConnState` (not a copy):
//! `serve` for what is buffered and `serve_chunk` for each chunk read (the
//! bit bucket, then frames decoded from the chunk where it lies or from
//! the buffer), which decode, hand frames to the broker, answer and skip
//! bad frames, and stop at a held reply, a parked FETCH, backpressure or an
//! ending. The turn is the reactor's too: `runnel::reactor::run_turn`, the
//! one place the loop's order is written, drives the steps `Sim` gives it
//! (`TurnSteps`). What is simulated around them: the socket (a queue of
//! byte chunks, each one read), the read loop (`Reactor::serve_conn`:
//! serve, then serve each chunk read), a flush that always writes
//! everything, and a clock that moves only when a parked FETCH needs it
//! to. The simulation's own topics (`zz-churn`, `zz-check`) are deleted
//! before it uses them, so whatever a stream did to them cannot fail its
//! checks.
//!
//! Shared, through `#[path]`, by the `stream` fuzz target and by
//! `tests/stream_props.rs`, so that the fuzzer and `cargo test` check the
//! same properties (`check_stream`):
//!
//! - the replies are byte-identical whether the stream comes whole or split
//!   at any points (the chunks are the reads of one turn, as when they are
//!   all in the socket);
//! - arriving one chunk per turn, the stream decodes to the same frames and
//!   errors and gets replies with the same ops and request ids in the same
//!   order (the bytes may differ: STATS counts turns, and a message becomes
//!   visible at a commit);
//! - every request gets one reply, in request order; decode errors get the
//!   error the decoder named;
//! - the decoder consumes at least a header and at most what it was given,
//!   re-encoding each frame gives back the consumed bytes, and every byte of
//!   the stream is accounted for (framed, skipped, discarded, dropped at a
//!   lost boundary, or still buffered);
//! - afterwards a fresh session can HELLO, PRODUCE and FETCH, and the data
//!   directory reopens with the same topics and messages (ids never go
//!   back).
//!
//! What it leaves out, on purpose: the read budget per turn
//! (`read_bytes_per_turn_max`) and the turn's work budget
//! (`work_items_per_turn_max`, `work_bytes_per_turn_max`, set out of reach)
//! — they move turn boundaries, which legitimately changes STATS replies
//! (tests/turn_budget.rs drives the work budget through `ConnState` and
//! the broker instead) — the `bytes_in`/`bytes_out` counters, which
//! depend on read sizes, the `buffered_bytes` count (masked when replies
//! are compared: buffers grow with the reads), `recovery_ms` (zeroed: it
//! is measured by the wall clock), the reactor's connection timeouts
//! (handshake, idle, frame): `serve` keeps the times they count from, but
//! the timers that act on them are the reactor's, and the clock moves only
//! while a FETCH is parked, by far less than those — and partial writes,
//! with the output backlog timeout and output_bytes_max close that come
//! with them.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use runnel::broker::{Broker, Config, ConnKey, LoopStats, Now, Outbox, Written};
use runnel::codec::{
    self, Batch, DecodeError, Decoded, ErrorCode, Frame, HEADER_BYTES, Reply, Request, Skip, TopicSettings,
};
use runnel::conn::{ConnState, Serve, Step, Watch};
use runnel::limits::Limits;
use runnel::log::{FsyncMode, LogOptions};
use runnel::queue::Settings;
use runnel::reactor::{TurnSteps, run_turn};

/// Turns one connection may take to go quiet before the simulation calls
/// it stuck (a parked FETCH that is never answered, input never served).
const TURNS_MAX: usize = 100_000;
/// Idle turns after a stream, so that compaction (which looks for work
/// every 64 turns) runs before the restart check.
const IDLE_TURNS: usize = 150;
/// Rounds of churn and idle turns after a stream, with small segments.
const CHURN_ROUNDS: usize = 3;
/// The topic churn produces to and purges.
const CHURN_TOPIC: &str = "zz-churn";
/// The auth token of configurations with auth.
pub const TOKEN: &[u8] = b"s3cret";
/// The topic the after-stream check produces to.
const CHECK_TOPIC: &str = "zz-check";

// ---------------------------------------------------------------------------
// Configuration.
// ---------------------------------------------------------------------------

/// Limits small enough that random streams reach every bound.
pub fn small_limits() -> Limits {
    Limits {
        frame_bytes_max: 2048,
        message_bytes_max: 64,
        batch_messages_max: 8,
        topic_name_bytes_max: 16,
        // Far more topics than a stream can create (each takes >= 21
        // bytes), so the after-stream check can always create its own.
        topics_max: 10_000,
        topic_messages_max: 16,
        topic_bytes_max: 256,
        connections_max: 16,
        output_bytes_max: 1 << 20,
        fetch_bytes_max: 256,
        fetch_wait_ms_max: 50,
        read_bytes_per_turn_max: 4096,
        work_items_per_turn_max: u32::MAX,
        work_bytes_per_turn_max: u32::MAX,
        // Limits added later keep their defaults.
        ..Limits::default()
    }
}

/// The least output_bytes_max `Limits::check` allows with `limits`' other
/// values (found by bisection, so it follows changes to the check).
fn least_output_bytes_max(limits: &Limits) -> u32 {
    let ok = |v: u32| Limits { output_bytes_max: v, ..limits.clone() }.check().is_ok();
    let (mut lo, mut hi) = (0u32, limits.output_bytes_max);
    assert!(ok(hi), "the simulation's limits must be valid");
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ok(mid) { hi = mid } else { lo = mid }
    }
    hi
}

/// A broker configuration and log options, chosen by the bits of `flags`:
/// 1 auth token, 2 no auto-create, 4 the least output limit (backpressure),
/// 8 small segments (rolls and compaction), 16 one delivery and a short ack
/// timeout (dead letters). (0x20 is `FuzzInput`'s: two connections.)
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub broker: Config,
    pub log: LogOptions,
}

impl SimConfig {
    pub fn from_flags(flags: u8) -> SimConfig {
        let mut limits = small_limits();
        if flags & 4 != 0 {
            limits.output_bytes_max = least_output_bytes_max(&limits);
        }
        let defaults = if flags & 16 != 0 {
            Settings { ack_timeout_ms: 10, max_deliveries: 1, dedup_window_ms: None, retention: Default::default() }
        } else {
            Settings { ack_timeout_ms: 1000, max_deliveries: 3, dedup_window_ms: None, retention: Default::default() }
        };
        let broker = Config {
            limits,
            auto_create: flags & 2 == 0,
            defaults,
            auth_token: (flags & 1 != 0).then(|| TOKEN.to_vec()),
            ..Config::default()
        };
        assert_eq!(broker.limits.check(), Ok(()), "the simulation's limits must be valid");
        let segment_bytes_max = if flags & 8 != 0 { 512 } else { 64 << 10 };
        SimConfig { broker, log: LogOptions { segment_bytes_max, fsync: FsyncMode::Never, ..LogOptions::default() } }
    }
}

/// Where simulations keep their data directories: `RUNNEL_SIM_DIR` if
/// set, else `/dev/shm` where it is a writable directory, else
/// `std::env::temp_dir()`. Why not always the temp dir: the log syncs the
/// directory when it opens a segment, and on a disk-backed temp dir those
/// syncs, with creating and removing four directories per stream, are
/// 95% of the time (400 streams: 5.7 s on ext4, 0.2 s on tmpfs); nothing
/// here tests durability.
fn sim_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        if let Some(dir) = std::env::var_os("RUNNEL_SIM_DIR") {
            return PathBuf::from(dir);
        }
        let shm = Path::new("/dev/shm");
        let probe = shm.join(format!("runnel-sim-probe-{}", std::process::id()));
        if std::fs::create_dir_all(&probe).is_ok() {
            let _ = std::fs::remove_dir(&probe);
            return shm.to_path_buf();
        }
        std::env::temp_dir()
    })
}

/// A fresh data directory (see `sim_root`), removed on drop.
pub struct SimDir(PathBuf);

impl SimDir {
    pub fn new() -> SimDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = sim_root().join(format!("runnel-sim-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create the simulation's data directory");
        SimDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Default for SimDir {
    fn default() -> Self {
        SimDir::new()
    }
}

impl Drop for SimDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------
// Connections.
// ---------------------------------------------------------------------------

/// What the input side of a connection did, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A frame of `bytes` bytes was decoded and handed to the broker.
    Frame { op: u8, request_id: u32, bytes: usize },
    /// The decoder refused a frame; its error reply was written.
    Error { code: ErrorCode, op: u8, request_id: u32, skip: Skip },
    /// The connection ended, and why.
    End(String),
}

/// How the bytes of a stream reach the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Every chunk is in the socket before the first turn: the chunks are
    /// the reads of one turn.
    AllAtOnce,
    /// One chunk arrives per turn.
    OnePerTurn,
}

/// One connection: the reactor's protocol state (`runnel::conn`, the code
/// under test) with a queue of chunks for a socket, plus what a test wants
/// to see of it.
#[derive(Default)]
pub struct Conn {
    /// Input, bit bucket, output, session and stops, as in the reactor.
    /// `state.peer_closed` stands for the EOF: a read returns 0 once
    /// `socket` is empty.
    pub state: ConnState,
    /// Has input to serve next turn.
    hot: bool,
    /// Chunks arrived in the socket, not yet read.
    socket: VecDeque<Vec<u8>>,
    /// Every reply flushed, in order.
    pub replies: Vec<u8>,
    pub events: Vec<Event>,
    /// Byte accounting: read from the socket, dropped by the bit bucket
    /// while reading, dropped at a lost boundary.
    pub read_bytes: usize,
    pub discarded_bytes: usize,
    pub dropped_bytes: usize,
    /// Times decoding paused for output.
    pub pauses: usize,
}

impl Conn {
    pub fn closing(&self) -> bool {
        self.state.closing
    }
    pub fn parked(&self) -> bool {
        self.state.parked
    }
    /// Bytes buffered, and bytes of a skipped frame still to come.
    pub fn leftover(&self) -> (usize, u64) {
        (self.state.input().len(), self.state.discard_bytes())
    }
}

/// What `ConnState::serve` showed of one connection: each decoder answer
/// is checked against the bytes it came from and recorded as an `Event`.
struct Seen<'a> {
    ctx: &'a str,
    events: &'a mut Vec<Event>,
    dropped_bytes: &'a mut usize,
    discarded_bytes: &'a mut usize,
}

impl Watch for Seen<'_> {
    fn handled(&mut self, frame: &Frame<'_>, input: &[u8], n: usize) {
        let ctx = self.ctx;
        assert!((HEADER_BYTES..=input.len()).contains(&n), "{ctx}: the decoder consumed {n} bytes of {}", input.len());
        let mut again = Vec::with_capacity(n);
        codec::encode_request(&mut again, frame.request_id, &frame.request, 1);
        assert!(again == input[..n], "{ctx}: re-encoding {frame:?} does not give the consumed bytes");
        self.events.push(Event::Frame { op: frame.request.op(), request_id: frame.request_id, bytes: n });
    }

    fn refused(&mut self, e: &DecodeError, input: &[u8]) {
        match e.skip {
            Skip::Bytes(n) => {
                assert!(n >= HEADER_BYTES, "{}: Skip::Bytes({n}) is shorter than a header ({e:?})", self.ctx)
            }
            Skip::Close => *self.dropped_bytes += input.len(),
        }
        self.events.push(Event::Error { code: e.code, op: e.op, request_id: e.request_id, skip: e.skip });
    }

    fn discarded(&mut self, n: usize) {
        *self.discarded_bytes += n;
    }
}

/// The connections, lent to the broker as its `Outbox`.
#[derive(Default)]
pub struct Conns(
    /// The connections, by key.
    pub Vec<Conn>,
    /// The connections' buffers, bytes, as the loop counted them when they
    /// were lent (`Outbox::buffered_bytes`).
    u64,
);

impl Outbox for Conns {
    fn out(&mut self, ConnKey(conn): ConnKey) -> Option<&mut Vec<u8>> {
        self.0.get_mut(conn).filter(|c| !c.state.closing).map(|c| &mut c.state.out)
    }
    fn unblock(&mut self, ConnKey(conn): ConnKey) {
        if let Some(c) = self.0.get_mut(conn) {
            c.state.parked = false;
            if !c.state.closing {
                c.hot = true;
            }
        }
    }
    fn buffered_bytes(&self) -> u64 {
        self.1
    }
}

// ---------------------------------------------------------------------------
// The simulated reactor.
// ---------------------------------------------------------------------------

/// A broker on a data directory and its connections.
pub struct Sim {
    pub broker: Broker,
    /// The loop's counters, as the reactor keeps them.
    pub loops: LoopStats,
    pub conns: Conns,
    pub now: Now,
    cfg: SimConfig,
    dir: PathBuf,
    next_consumer: u64,
    /// Names the case in every assertion (a seed, or "fuzz input").
    pub ctx: String,
    /// FETCHes that parked so far.
    pub parked_fetches: usize,
}

impl Sim {
    pub fn open(cfg: &SimConfig, dir: &Path, ctx: &str) -> Sim {
        let now = Now { mono_ms: 1_000, wall_ms: 1_700_000_000_000 };
        Sim::open_at(cfg, dir, ctx, now)
    }

    fn open_at(cfg: &SimConfig, dir: &Path, ctx: &str, now: Now) -> Sim {
        let mut broker = Broker::open(cfg.broker.clone(), dir, cfg.log.clone(), now)
            .unwrap_or_else(|e| panic!("{ctx}: the broker cannot open {}: {e}", dir.display()));
        // STATS reports how long recovery took, by the wall clock: the one
        // number in a reply that is not a function of the requests.
        broker.stats.recovery_ms = 0;
        Sim {
            broker,
            loops: LoopStats::default(),
            conns: Conns::default(),
            now,
            cfg: cfg.clone(),
            dir: dir.to_path_buf(),
            next_consumer: 1,
            ctx: ctx.to_string(),
            parked_fetches: 0,
        }
    }

    /// Drops the broker (a clean stop: everything was committed) and
    /// recovers it from its directory. Time goes on from where it was.
    pub fn reopen(self) -> Sim {
        let Sim { broker, cfg, dir, ctx, now, .. } = self;
        drop(broker);
        Sim::open_at(&cfg, &dir, &ctx, Now { mono_ms: now.mono_ms + 1, wall_ms: now.wall_ms + 1 })
    }

    /// Accepts a connection; returns its key.
    pub fn connect(&mut self) -> usize {
        let consumer = self.next_consumer;
        self.next_consumer += 1;
        self.conns.0.push(Conn { state: ConnState::new(consumer, self.now.mono_ms), ..Conn::default() });
        self.conns.0.len() - 1
    }

    pub fn conn(&self, key: usize) -> &Conn {
        &self.conns.0[key]
    }

    /// Feeds `chunks` to connection `key` as `arrival` says and runs turns
    /// until the connection is quiet: everything arrived is read and served,
    /// nothing is parked or waiting for a commit (or it ended).
    pub fn feed(&mut self, key: usize, chunks: &[&[u8]], arrival: Arrival) {
        self.feed_all(&[(key, chunks)], arrival);
    }

    /// `feed` for several connections at once: with `OnePerTurn`, each gets
    /// its next chunk every turn. The clock moves (to the next timer) only
    /// when every connection left is parked or quiet.
    pub fn feed_all(&mut self, inputs: &[(usize, &[&[u8]])], arrival: Arrival) {
        let mut pending: Vec<(usize, VecDeque<Vec<u8>>)> = inputs
            .iter()
            .map(|(key, chunks)| (*key, chunks.iter().filter(|c| !c.is_empty()).map(|c| c.to_vec()).collect()))
            .collect();
        for _ in 0..TURNS_MAX {
            for (key, chunks) in &mut pending {
                let n = if arrival == Arrival::AllAtOnce { chunks.len() } else { 1 };
                self.conns.0[*key].socket.extend(chunks.drain(..n.min(chunks.len())));
            }
            self.turn();
            let (mut busy, mut parked) = (false, false);
            for (key, chunks) in &mut pending {
                let c = &mut self.conns.0[*key];
                if c.state.closing {
                    // What the peer still sends is never read.
                    c.socket.extend(chunks.drain(..));
                    continue;
                }
                busy |= !chunks.is_empty() || (!c.state.parked && (c.hot || !c.socket.is_empty()));
                parked |= c.state.parked;
            }
            if busy {
                continue;
            }
            if !parked {
                return;
            }
            self.wait_for_a_timer();
        }
        panic!("{}: connections {inputs:?} did not go quiet in {TURNS_MAX} turns", self.ctx);
    }

    /// The peer closes connection `key`: one turn reads the EOF and ends it.
    pub fn hang_up(&mut self, key: usize) {
        self.conns.0[key].state.peer_closed = true;
        self.turn();
        assert!(self.conns.0[key].state.closing, "{}: connection {key} did not end at EOF", self.ctx);
    }

    /// Moves the clock to the next timer deadline (a parked FETCH's wait
    /// always has one).
    fn wait_for_a_timer(&mut self) {
        let Some(deadline_ms) = self.broker.next_deadline_ms() else {
            panic!("{}: a FETCH is parked but no timer is armed to end its wait", self.ctx);
        };
        let to = deadline_ms.max(self.now.mono_ms + 1);
        self.now.wall_ms += to - self.now.mono_ms;
        self.now.mono_ms = to;
    }

    /// One turn: the reactor's own order (`run_turn`), with the steps
    /// below.
    pub fn turn(&mut self) {
        self.loops.turns += 1;
        let now = self.now;
        run_turn(self, now);
    }

    /// `Reactor::serve_conn`'s loop: serve what is buffered
    /// (`ConnState::serve`), then each chunk as it is read
    /// (`ConnState::serve_chunk`) — the reactor's own code.
    fn serve(&mut self, key: usize) {
        let mut chunk: Option<Vec<u8>> = None;
        loop {
            let c = &mut self.conns.0[key];
            let (was_parked, was_paused) = (c.state.parked, c.state.paused);
            let mut seen = Seen {
                ctx: &self.ctx,
                events: &mut c.events,
                dropped_bytes: &mut c.dropped_bytes,
                discarded_bytes: &mut c.discarded_bytes,
            };
            let mut cx = Serve { broker: &mut self.broker, loops: &mut self.loops, now: self.now };
            let step = match chunk.take() {
                Some(bytes) => c.state.serve_chunk(ConnKey(key), &bytes, &mut cx, &mut seen),
                None => c.state.serve(ConnKey(key), &mut cx, &mut seen),
            };
            self.parked_fetches += usize::from(!was_parked && c.state.parked);
            c.pauses += usize::from(!was_paused && c.state.paused);
            match step {
                Step::Continue => {}
                Step::Stop => return,
                Step::Resume => {
                    c.hot = true;
                    return;
                }
                Step::End(why) => {
                    self.end(key, why);
                    return;
                }
            }
            let Some(next) = c.socket.pop_front() else {
                if c.state.peer_closed {
                    self.end(key, "peer closed".into());
                }
                return;
            };
            c.read_bytes += next.len();
            chunk = Some(next);
        }
    }

    /// `Reactor::end`: the broker forgets the connection now.
    fn end(&mut self, key: usize, why: String) {
        let c = &mut self.conns.0[key];
        if c.state.end(ConnKey(key), &mut self.broker) {
            c.events.push(Event::End(why));
        }
    }

    /// Opens a connection, sends `frames` (HELLO first, with the token when
    /// the configuration has one), hangs up, and returns its replies' bytes
    /// (decode them with `decode_replies`), checked to be a HELLO reply and
    /// then one reply per frame, in order.
    pub fn session(&mut self, frames: &[Request<'_>]) -> Vec<u8> {
        let mut stream = Vec::new();
        let token = self.cfg.broker.auth_token.clone().unwrap_or_default();
        let hello = Request::Hello { min_version: 1, max_version: 1, token: &token };
        codec::encode_request(&mut stream, 1, &hello, 1);
        for (i, req) in frames.iter().enumerate() {
            codec::encode_request(&mut stream, i as u32 + 2, req, 1);
        }
        let key = self.connect();
        self.feed(key, &[&stream], Arrival::AllAtOnce);
        self.hang_up(key);
        let bytes = std::mem::take(&mut self.conns.0[key].replies);
        let replies = decode_replies(&bytes, &self.ctx);
        assert_eq!(replies.len(), frames.len() + 1, "{}: a fresh session got {replies:?}", self.ctx);
        let (_, hello) = &replies[0];
        assert!(matches!(hello, Reply::Hello { version: 1, .. }), "{}: HELLO of a fresh session: {hello:?}", self.ctx);
        for (i, (rid, _)) in replies.iter().enumerate() {
            assert_eq!(*rid, i as u32 + 1, "{}: replies of a fresh session out of order", self.ctx);
        }
        bytes
    }

    /// A fresh session creates its own topic, produces one message and
    /// fetches it back: whatever came before, the broker still serves.
    pub fn check_fresh_session(&mut self) {
        let payload = b"after the stream";
        let mut batch = Vec::new();
        codec::encode_batch(&mut batch, &[payload]);
        let bytes = self.session(&[
            Request::DeleteTopic { topic: CHECK_TOPIC },
            Request::CreateTopic {
                topic: CHECK_TOPIC,
                settings: TopicSettings::default(),
                options: Default::default(),
            },
            Request::Produce {
                flags: 0,
                topic: CHECK_TOPIC,
                batch: Batch { count: 1, bytes: &batch, with_props: false },
            },
            Request::Fetch {
                topic: CHECK_TOPIC,
                group: "",
                max_messages: 10,
                max_bytes: 0,
                wait_ms: 0,
                ack_timeout_ms: 0,
            },
        ]);
        let ctx = &self.ctx;
        let replies = decode_replies(&bytes, ctx);
        let r = &replies[1].1;
        let unknown = ErrorCode::UnknownTopic as u8;
        let deleted = match r {
            Reply::Count(_) => true,
            Reply::Error { code, .. } => *code == unknown,
            _ => false,
        };
        assert!(deleted, "{ctx}: DELETE: {r:?}");
        assert!(matches!(replies[2].1, Reply::Created { created: true }), "{ctx}: CREATE: {:?}", replies[2].1);
        let Reply::Produced { first_id, count: 1 } = replies[3].1 else {
            panic!("{ctx}: PRODUCE after the stream: {:?}", replies[3].1);
        };
        match &replies[4].1 {
            Reply::Messages { messages, .. }
                if messages.len() == 1 && messages[0].id == first_id && messages[0].payload == payload => {}
            other => panic!("{ctx}: FETCH after the stream: {other:?}"),
        }
    }

    /// Produces to a topic of its own and purges it, a few times: log bytes
    /// that hold nothing live.
    fn churn(&mut self) {
        // Within topic_bytes_max (256) of the small limits.
        let payloads = [[b'c'; 64]; 3];
        let mut batch = Vec::new();
        codec::encode_batch(&mut batch, &payloads);
        let produce = Request::Produce {
            flags: 0,
            topic: CHURN_TOPIC,
            batch: Batch { count: 3, bytes: &batch, with_props: false },
        };
        let purge = Request::PurgeTopic { topic: CHURN_TOPIC };
        // The stream may have produced to (or deleted) this topic too: it
        // starts afresh, so the checks see only what churn does.
        let delete = Request::DeleteTopic { topic: CHURN_TOPIC };
        let create = Request::CreateTopic {
            topic: CHURN_TOPIC,
            settings: TopicSettings::default(),
            options: Default::default(),
        };
        let mut frames = vec![delete, create];
        for _ in 0..6 {
            frames.extend([produce, purge]);
        }
        let bytes = self.session(&frames);
        let unknown = ErrorCode::UnknownTopic as u8;
        for (i, (_, r)) in decode_replies(&bytes, &self.ctx).iter().enumerate().skip(1) {
            let deleted_nothing = i == 1 && matches!(r, Reply::Error { code, .. } if *code == unknown);
            let ok = deleted_nothing || matches!(r, Reply::Created { .. } | Reply::Produced { .. } | Reply::Count(_));
            assert!(ok, "{}: churn got {r:?}", self.ctx);
        }
    }

    /// Per topic: its settings, the messages it holds (ready, in flight or
    /// delayed) and its next id, from a fresh session's LIST_TOPICS and
    /// STATS.
    pub fn snapshot(&mut self) -> Vec<TopicState> {
        let bytes = self.session(&[Request::ListTopics, Request::Stats { topic: "" }]);
        let ctx = &self.ctx;
        let replies = decode_replies(&bytes, ctx);
        let Reply::Topics(topics) = &replies[1].1 else { panic!("{ctx}: LIST_TOPICS: {:?}", replies[1].1) };
        let Reply::Stats(sections) = &replies[2].1 else { panic!("{ctx}: STATS: {:?}", replies[2].1) };
        let mut states: Vec<TopicState> = topics
            .iter()
            .map(|(name, settings)| {
                let Some((_, kvs)) = sections.iter().find(|(n, _)| n == name) else {
                    panic!("{ctx}: LIST_TOPICS names {name}, STATS has no section for it");
                };
                let get = |k: &str| kvs.iter().find(|kv| kv.0 == k).map_or(0, |kv| kv.1);
                TopicState {
                    name: name.to_string(),
                    settings: *settings,
                    messages: get("ready") + get("inflight") + get("delayed"),
                    next_id: get("next_id"),
                }
            })
            .collect();
        assert_eq!(states.len() + 1, sections.len(), "{ctx}: STATS has other topics than LIST_TOPICS: {sections:?}");
        states.sort_by(|a, b| a.name.cmp(&b.name));
        states
    }
}

/// The reactor's steps, without sockets: every connection with input is
/// served, a flush always writes everything (the peer reads), and there
/// are no connection timeouts to run or buffers to watch.
impl TurnSteps for Sim {
    fn serve_ready(&mut self, _now: Now) {
        for key in 0..self.conns.0.len() {
            let c = &mut self.conns.0[key];
            let ready = !c.socket.is_empty() || c.state.peer_closed;
            if c.state.closing || !(c.hot || ready) {
                continue;
            }
            c.hot = false;
            self.serve(key);
        }
    }
    fn advance(&mut self, now: Now) {
        self.conns.1 = self.loops.buffered_bytes;
        self.broker.advance(now, &mut self.conns);
    }
    fn write(&mut self, now: Now) -> Written {
        let written = self.broker.write(now);
        self.broker.send_written(&written, &mut self.conns);
        written
    }
    fn flush(&mut self, _now: Now, _written: &Written) {
        for c in &mut self.conns.0 {
            // A connection paused for its output resumes.
            let out = std::mem::take(&mut c.state.out);
            c.replies.extend_from_slice(&out);
            if std::mem::take(&mut c.state.paused) && !c.state.closing {
                c.hot = true;
            }
        }
    }
    fn sync(&mut self, now: Now, written: &mut Written) {
        self.conns.1 = self.loops.buffered_bytes;
        self.broker.sync(written, now, &mut self.conns);
    }
    fn close_and_watch(&mut self, _now: Now) {}
}

/// What a topic holds, for comparing a broker before and after a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicState {
    pub name: String,
    pub settings: TopicSettings,
    pub messages: u64,
    pub next_id: u64,
}

/// Decodes a connection's replies; every byte must belong to one.
pub fn decode_replies<'a>(mut buf: &'a [u8], ctx: &str) -> Vec<(u32, Reply<'a>)> {
    let mut replies = Vec::new();
    while !buf.is_empty() {
        match codec::decode_reply(buf, usize::MAX) {
            Ok(Decoded::Frame(f, n)) => {
                replies.push((f.request_id, f.reply));
                buf = &buf[n..];
            }
            other => panic!("{ctx}: the broker wrote a reply that does not decode: {other:?}"),
        }
    }
    replies
}

// ---------------------------------------------------------------------------
// The properties.
// ---------------------------------------------------------------------------

/// The replies in `buf` with the value of STATS's `buffered_bytes` zeroed:
/// it counts the capacity of connection buffers, which depends on how the
/// stream was split into reads. (The key is in the broker's section, the
/// first; keys are ASCII, so a match is the key.)
fn without_buffered_bytes(buf: &[u8]) -> Vec<u8> {
    let mut out = buf.to_vec();
    let mut at = 0;
    while at < out.len() {
        let Ok(Decoded::Frame(_, n)) = codec::decode_reply(&out[at..], usize::MAX) else { break };
        if out[at + 4] == codec::op::STATS | 0x80 && out[at + 5] == 0 {
            let body = &mut out[at + HEADER_BYTES..at + n];
            let name_bytes = u16::from_le_bytes([body[0], body[1]]) as usize;
            let keys = u16::from_le_bytes([body[2 + name_bytes], body[3 + name_bytes]]);
            let mut pos = 4 + name_bytes;
            for _ in 0..keys {
                let key_bytes = body[pos] as usize;
                let value = pos + 1 + key_bytes;
                if &body[pos + 1..value] == b"buffered_bytes" {
                    body[value..value + 8].fill(0);
                }
                pos = value + 8;
            }
        }
        at += n;
    }
    out
}

/// (op, request id, status) of each reply in `buf`, in order.
pub fn reply_heads(mut buf: &[u8], ctx: &str) -> Vec<(u8, u32, u8)> {
    let mut heads = Vec::new();
    while !buf.is_empty() {
        match codec::decode_reply(buf, usize::MAX) {
            Ok(Decoded::Frame(f, n)) => {
                heads.push((f.op, f.request_id, buf[5]));
                if buf[5] != 0 {
                    assert!(ErrorCode::from_u8(buf[5]).is_some(), "{ctx}: reply with unknown status {}", buf[5]);
                }
                buf = &buf[n..];
            }
            other => panic!("{ctx}: the broker wrote a reply that does not decode: {other:?}"),
        }
    }
    heads
}

/// Checks that the replies answer the events one for one, in order.
fn check_replies_follow_requests(c: &Conn, ctx: &str) {
    let heads = reply_heads(&c.replies, ctx);
    let mut want = Vec::new();
    for e in &c.events {
        match *e {
            Event::Frame { op, request_id, .. } => want.push((op, request_id, None)),
            // An error reply echoes the frame's op, unless that is a
            // pushed frame's (docs/protocol.md, "Frames").
            Event::Error { code, op, request_id, .. } => {
                want.push((codec::reply_op(op) & !codec::REPLY_BIT, request_id, Some(code as u8)))
            }
            Event::End(_) => {}
        }
    }
    assert!(
        heads.len() == want.len(),
        "{ctx}: {} replies to {} requests\nreplies:  {heads:?}\nrequests: {want:?}",
        heads.len(),
        want.len()
    );
    for (i, (got, want)) in heads.iter().zip(&want).enumerate() {
        let same = got.0 == want.0 && got.1 == want.1 && want.2.is_none_or(|code| code == got.2);
        assert!(same, "{ctx}: reply {i} is {got:?}, the request was {want:?}\nevents: {:?}", c.events);
    }
}

/// Checks that every byte of a stream of `len` bytes is accounted for.
fn check_accounting(c: &Conn, len: usize, limits: &codec::DecodeLimits, ctx: &str) {
    let mut claimed = 0usize;
    for e in &c.events {
        match *e {
            Event::Frame { bytes, .. } => claimed += bytes,
            Event::Error { skip: Skip::Bytes(n), .. } => claimed += n,
            _ => {}
        }
    }
    let unread: usize = c.socket.iter().map(Vec::len).sum();
    assert_eq!(c.read_bytes + unread, len, "{ctx}: bytes read + unread");
    let (buffered, to_discard) = c.leftover();
    assert_eq!(
        claimed + c.dropped_bytes + buffered,
        c.read_bytes + to_discard as usize,
        "{ctx}: frames and skips ({claimed}) + dropped ({}) + buffered ({buffered}) != read ({}) + still to discard ({to_discard})\nevents: {:?}",
        c.dropped_bytes,
        c.read_bytes,
        c.events
    );
    assert!(c.discarded_bytes <= claimed, "{ctx}: discarded more than the skipped frames held");
    if !c.closing() {
        // A connection that did not end consumed every whole frame.
        let rest = c.state.input();
        assert!(
            to_discard == 0 || rest.is_empty(),
            "{ctx}: bytes buffered while a skipped frame is still being discarded"
        );
        if to_discard == 0 && !rest.is_empty() {
            let r = codec::decode_request(rest, limits, 1);
            assert!(matches!(r, Ok(Decoded::NeedMore)), "{ctx}: a decodable frame was left buffered: {r:?}");
        }
    }
}

/// Runs `stream` on a fresh broker, cut into `cuts`-separated chunks
/// arriving as `arrival` says; returns the broker and the connection's key.
pub fn run_stream(cfg: &SimConfig, dir: &Path, stream: &[u8], cuts: &[usize], arrival: Arrival, ctx: &str) -> Sim {
    let mut sim = Sim::open(cfg, dir, ctx);
    let chunks = split_at(stream, cuts);
    let key = sim.connect();
    assert_eq!(key, 0);
    sim.feed(key, &chunks, arrival);
    let c = sim.conn(key);
    check_accounting(c, stream.len(), sim.broker.decode_limits(), ctx);
    sim
}

/// The pieces of `stream` between the cut points (any order, any value;
/// out-of-range cuts are ignored).
pub fn split_at<'a>(stream: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut cuts: Vec<usize> = cuts.iter().copied().filter(|&c| c > 0 && c < stream.len()).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut pieces = Vec::with_capacity(cuts.len() + 1);
    let mut at = 0;
    for cut in cuts {
        pieces.push(&stream[at..cut]);
        at = cut;
    }
    pieces.push(&stream[at..]);
    pieces
}

/// What one stream exercised (of its whole run), for tests that check the
/// generator reaches what it should.
#[derive(Clone, Debug, Default)]
pub struct Coverage {
    /// (op, status) of every reply.
    pub replies: Vec<(u8, u8)>,
    /// Why the connection ended before the stream did, if it did.
    pub ended: Option<String>,
    /// FETCHes that parked.
    pub parked: usize,
    /// Times decoding paused for pending output.
    pub pauses: usize,
    /// Turns the connection took.
    pub turns: u64,
    /// Log segments compaction removed, by the restart.
    pub compactions: u64,
}

/// After the streams: the peers hang up (their messages in flight return),
/// a fresh session still works, and a restart finds what was there.
fn check_afterwards(mut sim: Sim, ctx: &str) -> u64 {
    for key in 0..sim.conns.0.len() {
        if !sim.conn(key).closing() {
            sim.hang_up(key);
        }
    }
    // Idle turns: compaction looks for work every 64 turns, and the
    // restart below checks what it left. With small segments, churn on a
    // topic of its own first makes the log big enough for compaction to
    // clean the segments the stream wrote (copying its live messages).
    let churn = sim.cfg.log.segment_bytes_max < 4096;
    for _ in 0..if churn { CHURN_ROUNDS } else { 1 } {
        if churn {
            sim.churn();
        }
        for _ in 0..IDLE_TURNS {
            sim.turn();
        }
    }
    let compactions = sim.broker.compactions();
    sim.check_fresh_session();
    let before = sim.snapshot();
    let mut again = sim.reopen();
    let after = again.snapshot();
    assert_eq!(
        after.iter().map(|t| (&t.name, t.settings, t.messages)).collect::<Vec<_>>(),
        before.iter().map(|t| (&t.name, t.settings, t.messages)).collect::<Vec<_>>(),
        "{ctx}: a restart changed the topics or what they hold"
    );
    for (b, a) in before.iter().zip(&after) {
        assert!(a.next_id >= b.next_id, "{ctx}: after a restart topic {} would reuse ids: {b:?} -> {a:?}", b.name);
    }
    again.check_fresh_session();
    compactions
}

/// Two connections at once, each fed its stream one piece per turn, so
/// that one's requests act on the other's (a PRODUCE wakes a parked FETCH,
/// a DELETE_TOPIC answers it): each connection gets one reply per request,
/// in order, every byte is accounted for, and the checks after a stream
/// hold. (Whole against split does not apply: the interleaving changes.)
pub fn check_two_connections(cfg: &SimConfig, a: (&[u8], &[usize]), b: (&[u8], &[usize]), ctx: &str) -> Coverage {
    let dir = SimDir::new();
    let mut sim = Sim::open(cfg, dir.path(), ctx);
    let (ka, kb) = (sim.connect(), sim.connect());
    let (pieces_a, pieces_b) = (split_at(a.0, a.1), split_at(b.0, b.1));
    sim.feed_all(&[(ka, &pieces_a), (kb, &pieces_b)], Arrival::OnePerTurn);
    let limits = *sim.broker.decode_limits();
    let mut coverage = Coverage { parked: sim.parked_fetches, turns: sim.loops.turns, ..Coverage::default() };
    for (key, len) in [(ka, a.0.len()), (kb, b.0.len())] {
        let c = sim.conn(key);
        let ctx = format!("{ctx} (connection {key})");
        check_accounting(c, len, &limits, &ctx);
        check_replies_follow_requests(c, &ctx);
        coverage.replies.extend(reply_heads(&c.replies, &ctx).iter().map(|h| (h.0, h.2)));
        coverage.pauses += c.pauses;
    }
    coverage.compactions = check_afterwards(sim, ctx);
    coverage
}

/// Every property of one stream: see the top of this file.
pub fn check_stream(cfg: &SimConfig, stream: &[u8], cuts: &[usize], ctx: &str) -> Coverage {
    let (dir_whole, dir_split, dir_trickle) = (SimDir::new(), SimDir::new(), SimDir::new());
    let whole = run_stream(cfg, dir_whole.path(), stream, &[], Arrival::AllAtOnce, &format!("{ctx} (whole)"));
    let split = run_stream(cfg, dir_split.path(), stream, cuts, Arrival::AllAtOnce, &format!("{ctx} (split)"));
    let trickle = run_stream(cfg, dir_trickle.path(), stream, cuts, Arrival::OnePerTurn, &format!("{ctx} (trickle)"));
    let (w, s, t) = (whole.conn(0), split.conn(0), trickle.conn(0));

    check_replies_follow_requests(w, &whole.ctx);
    let shown = &cuts[..cuts.len().min(16)];
    let split_at = format!("split at {} points {shown:?}{}", cuts.len(), if cuts.len() > 16 { "..." } else { "" });
    assert_eq!(s.events, w.events, "{ctx}: {split_at}, the stream decodes to other frames");
    if !w.closing() {
        assert_eq!(s.leftover(), w.leftover(), "{ctx}: {split_at}, other bytes are left over");
    }
    let (w_replies, s_replies) = (without_buffered_bytes(&w.replies), without_buffered_bytes(&s.replies));
    if s_replies != w_replies {
        let (a, b) = (decode_replies(&w_replies, ctx), decode_replies(&s_replies, ctx));
        let i = a.iter().zip(&b).position(|(a, b)| a != b).unwrap_or(a.len().min(b.len()));
        panic!(
            "{ctx}: {split_at}, reply {i} of {} differs\nwhole: {:?}\nsplit: {:?}\nevents: {:?}",
            a.len(),
            a.get(i),
            b.get(i),
            w.events
        );
    }
    // Arriving over many turns, the same frames get the same kind of reply.
    assert_eq!(t.events, w.events, "{ctx}: one chunk per turn, the stream decodes to other frames");
    let heads = |buf: &[u8]| -> Vec<(u8, u32)> { reply_heads(buf, ctx).iter().map(|h| (h.0, h.1)).collect() };
    assert_eq!(heads(&t.replies), heads(&w.replies), "{ctx}: one chunk per turn, other replies");
    check_replies_follow_requests(t, &trickle.ctx);
    drop((split, trickle));

    let coverage = Coverage {
        replies: reply_heads(&w.replies, ctx).iter().map(|h| (h.0, h.2)).collect(),
        ended: w.events.iter().find_map(|e| if let Event::End(why) = e { Some(why.clone()) } else { None }),
        parked: whole.parked_fetches,
        pauses: w.pauses,
        turns: whole.loops.turns,
        compactions: 0,
    };
    let compactions = check_afterwards(whole, ctx);
    Coverage { compactions, ..coverage }
}

// ---------------------------------------------------------------------------
// The stream fuzz target's input format.
// ---------------------------------------------------------------------------

/// The flag that runs a fuzz input as two connections.
pub const TWO_CONNECTIONS: u8 = 0x20;

/// Most cut points one input carries.
pub const CUTS_MAX: usize = 32;

/// A stream fuzz input: `[flags u8][n u8][n cut points, u16 LE][stream]`.
/// `flags` picks the configuration (`SimConfig::from_flags`); each cut is
/// taken modulo the stream length plus one; n is taken modulo CUTS_MAX + 1.
/// Any bytes parse: what is missing counts as zero.
pub struct FuzzInput<'a> {
    pub flags: u8,
    pub cuts: Vec<usize>,
    pub stream: &'a [u8],
}

impl<'a> FuzzInput<'a> {
    pub fn parse(data: &'a [u8]) -> FuzzInput<'a> {
        let flags = data.first().copied().unwrap_or(0);
        let n = data.get(1).map_or(0, |&n| n as usize % (CUTS_MAX + 1));
        let header = (2 + 2 * n).min(data.len());
        let raw: Vec<u16> =
            data.get(2..header).unwrap_or(&[]).chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        let stream = &data[header..];
        let cuts = raw.iter().map(|&c| c as usize % (stream.len() + 1)).collect();
        FuzzInput { flags, cuts, stream }
    }

    /// The bytes that parse back to `flags`, `cuts` and `stream`.
    pub fn encode(flags: u8, cuts: &[usize], stream: &[u8]) -> Vec<u8> {
        let cuts = &cuts[..cuts.len().min(CUTS_MAX)];
        let mut out = vec![flags, cuts.len() as u8];
        for &c in cuts {
            out.extend_from_slice(&(c.min(u16::MAX as usize) as u16).to_le_bytes());
        }
        out.extend_from_slice(stream);
        out
    }

    /// Runs every property of the stream (`check_stream`); with flag 0x20,
    /// the stream is cut in two at the first cut point and the halves go to
    /// two connections at once (`check_two_connections`).
    pub fn check(&self, ctx: &str) -> Coverage {
        let cfg = SimConfig::from_flags(self.flags);
        if self.flags & TWO_CONNECTIONS == 0 {
            return check_stream(&cfg, self.stream, &self.cuts, ctx);
        }
        let at = self.cuts.first().copied().unwrap_or(self.stream.len() / 2);
        let (a, b) = self.stream.split_at(at);
        let cuts_a: Vec<usize> = self.cuts.iter().copied().filter(|&c| c < at).collect();
        let cuts_b: Vec<usize> = self.cuts.iter().filter(|&&c| c > at).map(|&c| c - at).collect();
        check_two_connections(&cfg, (a, &cuts_a), (b, &cuts_b), ctx)
    }
}
