//! The loop: one `mio::Poll` owns the listener and every connection, and one
//! thread runs every turn. Nothing here blocks except `poll` itself.
//!
//! The order of a turn, written down once (see `Reactor::turn` and
//! `run_turn`, which the simulation in `fuzz/sim.rs` runs too):
//!
//! 1. **poll**, with a timeout of the next timer deadline (0 when a
//!    connection still has input to serve from last turn, none when idle);
//! 2. **read the clock** once: every deadline and born time of the turn
//!    uses this `now`, so the turn is one instant;
//! 3. **handle readiness**: first the connections the last turn left with
//!    input to serve, in the order it left them; then accept until
//!    WouldBlock; read each readable connection until WouldBlock (or its
//!    fair share), decode every complete frame and hand it to the broker,
//!    whose replies go to the connection's output buffer — except replies
//!    that must wait for the log, which the broker holds; once the turn's
//!    work budget is spent (`broker/budget.rs`), a request that can do
//!    more than a little is left, with its connection's input, for the
//!    next turn; if a held reply waits for an `fdatasync`, poll once more
//!    without waiting and serve what arrived meanwhile the same way, so
//!    that it shares the turn's sync (`Reactor::serve_late`);
//! 4. **advance the timing wheel**: ack deadlines, NACK delays and long-poll
//!    waits that passed;
//! 5. **write**: a step of compaction: a slice of copies appended (at
//!    most 256 KiB), or a cleaned segment's restatement written and synced
//!    on its own and the segment removed; then one `write` of every record
//!    the turn appended (on a full disk, without the turn's produces);
//!    the replies to produces that asked to be acknowledged once written
//!    join the connections' output;
//! 6. **flush early**, if the turn will `fdatasync`: the replies that need
//!    only that write (acks, NACKs, TOUCHes, deliveries of messages made
//!    durable in earlier turns, errors) leave now, so they do not wait for
//!    a sync that is not theirs;
//! 7. **sync**: one `fdatasync` of what step 5 wrote (group commit),
//!    if anything waits on it; then the turn's new messages become visible and
//!    go to parked FETCHes and subscribers while the deliveries' budget
//!    lasts (the groups put off by an earlier turn first), then the held
//!    replies are sent (deliveries first: they are what end-to-end
//!    latency waits for);
//! 8. **flush**: one write per connection with output; WRITABLE interest
//!    only while output is left over;
//! 9. **close** the connections that ended;
//! 10. **buffers**: when the connections' buffers have just become full
//!     (`buffered_bytes_max`), give back every idle buffer and start the
//!     clock of each connection that holds much; once they are no longer
//!     full, serve the starved connections again.
//!
//! Two rules make this order the durability promise, and both are enforced
//! by the code's shape, not by care:
//!
//! - **No reply leaves before the `write` of the records it depends on.**
//!   Every reply to a request reaches its socket through `flush`, and
//!   `flush` takes the `Written` value that only the log write of step 5
//!   returns (the metrics listener in `http.rs` and the TOO_MANY_CONNECTIONS
//!   refusal write their own sockets: they answer no request). So a SIGKILL
//!   can never undo an answered ACK, NACK or TOUCH: once the reply is out,
//!   its record is in the page cache, which outlives the process (not the
//!   machine: that is the sync's job, and an ack synced late only means
//!   redelivery).
//! - **No reply to a PRODUCE or an admin frame leaves before the
//!   `fdatasync` that covers it.** The broker holds those replies (and the
//!   produced messages) out of the connection buffers until step 7, after
//!   the sync, whatever the code in steps 3 and 4 does. That is Redis's
//!   `beforeSleep` rule. A connection may so see two writes in a turn that
//!   syncs: its other replies before the sync, its held ones after.
//!
//! Nothing appends to the log between steps 5 and 7 (the log asserts it):
//! a connection whose socket fails in the early flush is ended after the
//! sync, since ending it can dead-letter its in-flight messages.
//!
//! If the write or the sync fails (a full disk), the held replies become
//! STORAGE errors and the turn's records stay in the log's buffer for the
//! next commit; the other replies are sent all the same, so that consumers
//! keep working. A disk with room for the turn's records but not for its
//! produces (docs/log-format.md, "A full disk") gets the rest written and
//! only the PRODUCE replies answered STORAGE. On a failing disk an answered ACK therefore holds in
//! memory but reaches the log only with the next commit that succeeds: a
//! crash before it redelivers the message (at-least-once).
//!
//! Readiness is a hint (mio's docs): sockets are edge-triggered, so each is
//! drained until WouldBlock or remembered in `hot` to be served next turn.
//!
//! What a connection says and is answered — its undecoded input, the bit
//! bucket, its output, the held, parked and paused stops, and the step that
//! decodes frames and hands them to the broker — is `conn::ConnState`,
//! which has no socket and no clock: this file reads the socket into it,
//! acts on the `Step` it returns, writes its output and runs its timers.
//! `fuzz/sim.rs` drives the same `ConnState` with byte chunks.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;

use crate::broker::{Broker, ConnKey, LoopStats, Now, Written};
use crate::codec::{self, ErrorCode};
use crate::config::ServeConfig;
use crate::conn::{ConnState, FULL_HOLDING_BYTES_MAX, Serve, Step};
use crate::http::{HttpKey, HttpServer, LoopParts, Scraping};
use crate::limits::Limits;
use crate::log::OpenError;
use crate::metrics::{self, LoopMetrics, PhaseNanos};
use crate::sys;
use crate::wheel::{TimerKey, Wheel};

mod lent;
mod timeouts;

use lent::Lent;

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX - 2);
const SIGNALS: Token = Token(usize::MAX - 3);
const METRICS: Token = Token(usize::MAX - 4);
/// Bytes read per `read` call: large enough that a busy producer needs few
/// syscalls, small enough to keep in cache.
const READ_CHUNK_BYTES: usize = 64 << 10;
/// Readiness events taken per poll.
const EVENTS_PER_POLL: usize = 1024;

/// Stops a running reactor from another thread (tests, signal handlers).
#[derive(Clone)]
pub struct Handle {
    /// The reactor's stop flag.
    stop: Arc<AtomicBool>,
    /// Wakes the reactor's poll to see the flag.
    waker: Arc<Waker>,
}

impl Handle {
    /// Asks the loop to finish its turn, answer parked FETCHes, flush and
    /// return.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // A failed wake only delays the stop to the next event.
        let _ = self.waker.wake();
    }
}

/// One client connection: its socket and its place in the loop; what it
/// says and is answered is in `state`.
struct Conn {
    /// The socket, registered with the connection's key as its token.
    stream: TcpStream,
    /// Input, output, session and the stops (parked, held, paused).
    state: ConnState,
    /// In `hot`: has input to serve next turn.
    hot: bool,
    /// In `dirty`: has output to flush this turn.
    dirty: bool,
    /// WRITABLE interest is registered.
    writable: bool,
    /// Reactor time it was accepted, ms.
    accepted_ms: u64,
    /// Its timeout timer and that timer's deadline, ms.
    timer: Option<(TimerKey, u64)>,
    /// Since when pending output has stayed at or above half of
    /// output_bytes_max, or the connection has held FULL_HOLDING_BYTES_MAX
    /// or more while the buffers were full, ms: a peer that does not read
    /// is closed after frame_timeout_ms of that (Redis's soft output limit).
    backlog_since_ms: Option<u64>,
    /// Listed in the reactor's `starved`, to be served again once the
    /// buffers are no longer full.
    starved_listed: bool,
}

/// The poll token of a client connection's socket: its key (`ConnKey`,
/// its place in `Conns`, which the broker and `ConnState` know it by too).
fn token(key: ConnKey) -> Token {
    Token(key.0)
}

/// The client connections, by key.
struct Conns(Slab<Conn>);

impl Conns {
    fn get_mut(&mut self, key: ConnKey) -> Option<&mut Conn> {
        self.0.get_mut(key.0)
    }
    fn remove(&mut self, key: ConnKey) -> Option<Conn> {
        self.0.try_remove(key.0)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    /// The key the next `insert` will take.
    fn vacant_key(&self) -> ConnKey {
        ConnKey(self.0.vacant_key())
    }
    fn insert(&mut self, conn: Conn) -> ConnKey {
        ConnKey(self.0.insert(conn))
    }
    fn keys(&self) -> Vec<ConnKey> {
        self.0.iter().map(|(k, _)| ConnKey(k)).collect()
    }
    fn iter_mut(&mut self) -> impl Iterator<Item = (ConnKey, &mut Conn)> {
        self.0.iter_mut().map(|(k, c)| (ConnKey(k), c))
    }
}

/// What a poll token stands for.
enum Source {
    Listener,
    Waker,
    Signals,
    /// The metrics listener.
    Metrics,
    /// A metrics connection.
    Http(HttpKey),
    /// A client connection.
    Conn(ConnKey),
}

impl Source {
    /// The fixed tokens sit at the top of the token space, metrics
    /// connections' from `HTTP_TOKEN_BASE` below them, client connections'
    /// below that.
    fn of(token: Token) -> Source {
        match token {
            LISTENER => Source::Listener,
            WAKER => Source::Waker,
            SIGNALS => Source::Signals,
            METRICS => Source::Metrics,
            t => HttpKey::from_token(t).map_or(Source::Conn(ConnKey(t.0)), Source::Http),
        }
    }
}

/// What a timer in the reactor's wheel is for.
#[derive(Clone, Copy, Debug)]
enum Timed {
    /// A client connection's timeout (handshake, idle, frame, backlog).
    Conn(ConnKey),
    /// A metrics connection's timeout.
    Http(HttpKey),
}

impl From<HttpKey> for Timed {
    fn from(key: HttpKey) -> Timed {
        Timed::Http(key)
    }
}

/// The broker's event loop.
pub struct Reactor {
    /// The one poll every socket is registered with.
    poll: Poll,
    /// The client listener; None once a shutdown stopped accepting.
    listener: Option<TcpListener>,
    /// Where the client listener is bound.
    local_addr: SocketAddr,
    /// The client connections.
    conns: Conns,
    /// The queues, the log, and the requests' handling.
    broker: Broker,
    /// The readiness found by a turn's second, non-blocking poll
    /// (`serve_late`); kept to reuse its buffer.
    late: Events,
    /// Connections with undecoded input to serve next turn.
    hot: Vec<ConnKey>,
    /// The other half of `hot`'s double buffer.
    hot_spare: Vec<ConnKey>,
    /// Connections with output to flush this turn.
    dirty: Vec<ConnKey>,
    /// Connections to close at the end of the turn.
    closing: Vec<ConnKey>,
    /// Connections whose socket failed in a flush, and why: ended after the
    /// turn's sync, since nothing may append to the log between its write
    /// and its sync.
    unwritable: Vec<(ConnKey, String)>,
    /// Where reads land before they are appended to a connection's input.
    scratch: Vec<u8>,
    /// When the reactor started: its monotonic clock counts ms from here.
    started: Instant,
    /// The consumer id the next accepted connection gets.
    next_consumer: u64,
    /// Set by `Handle::shutdown` or a signal: stop after this turn.
    stop: Arc<AtomicBool>,
    /// Wakes the poll when `stop` is set from another thread.
    waker: Arc<Waker>,
    /// Connection timeouts: handshake, idle, frame and backlog of client
    /// connections, and the request timeout of metrics connections.
    timers: Wheel<Timed>,
    /// The timers that fired this turn (deadline ms, what for); kept to
    /// reuse its buffer.
    expired: Vec<(u64, Timed)>,
    /// What the loop counts (connections, turns, bytes, buffers), which
    /// the broker reads for STATS and the buffers' limit.
    loops: LoopStats,
    /// Connections that stopped being served because the buffers were
    /// full (`ConnState::starved`), each once.
    starved: Vec<ConnKey>,
    /// The buffers were full at the end of the last turn.
    buffers_were_full: bool,
    /// The metrics listener and its connections (`--metrics`).
    http: Option<HttpServer>,
    /// The read end of the signal self-pipe.
    signals: Option<mio::net::UnixStream>,
    /// How long to poll without blocking before sleeping (`--spin-us`).
    spin: Duration,
    /// What the loop measures of itself: fsync and produce-ack latency,
    /// and the time of each turn and of its phases.
    loop_metrics: LoopMetrics,
    /// The broker's limits, as configured.
    limits: Limits,
}

impl Reactor {
    /// Recovers the data directory and binds the listener.
    pub fn bind(cfg: ServeConfig) -> Result<Reactor, String> {
        cfg.broker.limits.check().map_err(|e| format!("bad limits: {e}"))?;
        let started = Instant::now();
        let now = now_at(started);
        let broker = if cfg.memory_only {
            Broker::in_memory(cfg.broker.clone(), now)
        } else {
            let broker = Broker::open(cfg.broker.clone(), &cfg.data_dir, cfg.log.clone(), now)
                .map_err(|e: OpenError| e.to_string())?;
            log::info!("{}", broker.recovery.summary(&cfg.data_dir));
            broker
        };
        let poll = Poll::new().map_err(|e| format!("epoll: {e}"))?;
        let mut listener = listen(cfg.listen).map_err(|e| format!("cannot listen on {}: {e}", cfg.listen))?;
        let local_addr = listener.local_addr().map_err(|e| e.to_string())?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE).map_err(|e| e.to_string())?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(|e| e.to_string())?);
        let http = match cfg.metrics {
            Some(addr) => {
                let l = listen(addr).map_err(|e| format!("cannot listen for metrics on {addr}: {e}"))?;
                Some(HttpServer::new(l, poll.registry(), METRICS, &cfg.broker.limits).map_err(|e| e.to_string())?)
            }
            None => None,
        };
        Ok(Reactor {
            poll,
            listener: Some(listener),
            local_addr,
            conns: Conns(Slab::new()),
            broker,
            hot: Vec::new(),
            hot_spare: Vec::new(),
            late: Events::with_capacity(EVENTS_PER_POLL),
            dirty: Vec::new(),
            closing: Vec::new(),
            unwritable: Vec::new(),
            scratch: vec![0; READ_CHUNK_BYTES],
            started,
            next_consumer: 1,
            stop: Arc::new(AtomicBool::new(false)),
            waker,
            timers: Wheel::new(now.mono_ms),
            expired: Vec::new(),
            loops: LoopStats::default(),
            starved: Vec::new(),
            buffers_were_full: false,
            http,
            signals: None,
            spin: Duration::from_micros(u64::from(cfg.spin_us)),
            loop_metrics: LoopMetrics::default(),
            limits: cfg.broker.limits.clone(),
        })
    }

    /// The metrics listener's address, if `--metrics` was given.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().map(HttpServer::local_addr)
    }

    /// Watches the read end of a signal self-pipe: any byte on it starts a
    /// graceful shutdown (the signal handler only writes the byte).
    pub fn watch_signals(&mut self, pipe: std::os::unix::net::UnixStream) -> io::Result<()> {
        pipe.set_nonblocking(true)?;
        let mut pipe = mio::net::UnixStream::from_std(pipe);
        self.poll.registry().register(&mut pipe, SIGNALS, Interest::READABLE)?;
        self.signals = Some(pipe);
        Ok(())
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn handle(&self) -> Handle {
        Handle { stop: self.stop.clone(), waker: self.waker.clone() }
    }

    /// Runs turns until `Handle::shutdown`.
    pub fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(EVENTS_PER_POLL);
        loop {
            self.turn(&mut events)?;
            if self.stop.load(Ordering::SeqCst) {
                self.finish();
                return Ok(());
            }
        }
    }

    /// One turn, in the order written at the top of this file: the poll
    /// and the clock here, the rest in `run_turn`.
    fn turn(&mut self, events: &mut Events) -> io::Result<()> {
        // 1. poll
        let timeout = self.poll_timeout();
        self.poll_events(events, timeout)?;
        // 2. the clock, once
        let started = Instant::now();
        let now = now_since(self.started, started);
        self.loops.turns += 1;
        let mut turn = ReactorTurn { reactor: self, events, started, phases: PhaseNanos::default() };
        run_turn(&mut turn, now);
        let phases = turn.phases;
        self.loop_metrics.observe_turn(started.elapsed().as_nanos() as u64, &phases);
        Ok(())
    }

    /// Step 3: serves the connections the last turn left with input to
    /// serve, in the order it left them, then accepts, reads and serves
    /// every ready socket. Those left waiting come first, so that what the
    /// turn's work budget put off (`broker/budget.rs`) is served before
    /// anything newer, and no connection starves behind new arrivals.
    fn handle_readiness(&mut self, events: &Events, now: Now) {
        // Swapped with a spare list, so neither is reallocated each turn; the
        // turn may mark connections hot again for the next one.
        let mut hot = std::mem::replace(&mut self.hot, std::mem::take(&mut self.hot_spare));
        for key in &hot {
            if let Some(c) = self.conns.get_mut(*key) {
                c.hot = false;
            }
        }
        self.with_http(now, |http, lp, cx| http.begin_turn(lp, cx));
        for &key in &hot {
            self.serve(key, now);
        }
        for event in events.iter() {
            self.dispatch(event, now);
        }
        hot.clear();
        self.hot_spare = hot;
    }

    /// Step 3, once more, in a turn that will `fdatasync`: a poll that does
    /// not wait, and what it finds served as the first poll's was. The
    /// requests that arrived while the turn was being served (a pipelining
    /// client's next batch, sent moments after the one that woke the loop)
    /// so share this turn's sync instead of waiting a whole turn, sync
    /// included, for the next: a client with N requests in flight would
    /// otherwise have them split between two syncs, N/2 each. A connection
    /// that used its share of the turn is not read again: it is hot, so
    /// the next turn serves it anyway (what its event says besides "read"
    /// is kept, since an edge is said once).
    fn serve_late(&mut self, now: Now) {
        if !self.broker.turn_will_sync() {
            return;
        }
        let mut late = std::mem::replace(&mut self.late, Events::with_capacity(0));
        // A failed poll is not this pass's to report: the next turn's
        // poll says it again.
        if self.poll_once(&mut late, Some(Duration::ZERO)).is_ok() {
            for event in late.iter() {
                match Source::of(event.token()) {
                    Source::Conn(key) if self.conns.get_mut(key).is_some_and(|c| c.hot) => {
                        self.note_edges(key, event);
                    }
                    _ => self.dispatch(event, now),
                }
            }
        }
        self.late = late;
    }

    /// One readiness event of a poll, handed to whatever it is for.
    fn dispatch(&mut self, event: &Event, now: Now) {
        match Source::of(event.token()) {
            Source::Listener => self.accept(now),
            Source::Waker => {}
            Source::Signals => self.drain_signals(),
            Source::Metrics => self.accept_http(now),
            Source::Http(key) => self.serve_http(key, now),
            Source::Conn(key) => self.ready(key, event, now),
        }
    }

    /// A client connection's readiness event.
    fn ready(&mut self, key: ConnKey, event: &Event, now: Now) {
        self.note_edges(key, event);
        if event.is_readable() || event.is_read_closed() || event.is_error() {
            self.serve(key, now);
        }
    }

    /// What a connection's readiness event says besides "read": the peer
    /// closed, or the socket takes output again.
    fn note_edges(&mut self, key: ConnKey, event: &Event) {
        if event.is_read_closed() || event.is_error() {
            // Edge-triggered: this is said once. Remember it, for a
            // connection that parks or pauses before it reads to the EOF.
            if let Some(c) = self.conns.get_mut(key) {
                c.state.peer_closed = true;
            }
        }
        if event.is_writable() {
            self.mark_dirty(key);
        }
    }

    fn poll_timeout(&self) -> Option<Duration> {
        let scraping = self.http.as_ref().is_some_and(HttpServer::has_ready);
        if !self.hot.is_empty() || scraping || self.broker.busy() || self.stop.load(Ordering::SeqCst) {
            return Some(Duration::ZERO);
        }
        let deadline_ms = match (self.broker.next_deadline_ms(), self.timers.next_deadline_ms()) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        // The wheel has 1 ms slots: wake at the end of the deadline's ms.
        let deadline = self.started + Duration::from_millis(deadline_ms + 1);
        Some(deadline.saturating_duration_since(Instant::now()))
    }

    /// Polls, first spinning without blocking for up to `spin` when asked.
    fn poll_events(&mut self, events: &mut Events, timeout: Option<Duration>) -> io::Result<()> {
        let mut timeout = timeout;
        if !self.spin.is_zero() && timeout != Some(Duration::ZERO) {
            let spun = Instant::now();
            loop {
                self.poll_once(events, Some(Duration::ZERO))?;
                if !events.is_empty() || spun.elapsed() >= self.spin {
                    break;
                }
                std::hint::spin_loop();
            }
            if !events.is_empty() {
                return Ok(());
            }
            timeout = timeout.map(|t| t.saturating_sub(spun.elapsed()));
        }
        self.poll_once(events, timeout)
    }

    fn poll_once(&mut self, events: &mut Events, timeout: Option<Duration>) -> io::Result<()> {
        match self.poll.poll(events, timeout) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                events.clear();
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// A signal arrived: drain the pipe and stop after this turn.
    fn drain_signals(&mut self) {
        let Some(pipe) = self.signals.as_mut() else { return };
        let mut buf = [0u8; 64];
        while matches!(pipe.read(&mut buf), Ok(n) if n > 0) {}
        log::info!("signal received: shutting down gracefully (a second signal exits at once)");
        self.stop.store(true, Ordering::SeqCst);
    }

    fn accept(&mut self, now: Now) {
        let Some(listener) = self.listener.as_ref() else { return };
        loop {
            let (mut stream, peer) = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::warn!("accept failed: {e}");
                    return;
                }
            };
            let limit = self.broker.config().limits.connections_max as usize;
            if self.conns.len() >= limit {
                let mut out = Vec::new();
                let msg = format!("the broker is at connections_max ({limit}); try again later");
                codec::encode_error(&mut out, 0, 0, ErrorCode::TooManyConnections, &msg);
                // Best effort: the socket is new, so its buffer has room.
                let _ = stream.write(&out);
                log::warn!("refused {peer}: connections_max ({limit}) reached");
                continue;
            }
            // Latency over packet count: replies go out in one write per turn.
            let _ = stream.set_nodelay(true);
            let key = self.conns.vacant_key();
            if let Err(e) = self.poll.registry().register(&mut stream, token(key), Interest::READABLE) {
                log::warn!("cannot register {peer}: {e}");
                continue;
            }
            let consumer = self.next_consumer;
            self.next_consumer += 1;
            let deadline = now.mono_ms + u64::from(self.limits.handshake_timeout_ms);
            let timer = Some((self.timers.insert(deadline, Timed::Conn(key)), deadline));
            let inserted = self.conns.insert(Conn {
                stream,
                state: ConnState::new(consumer, now.mono_ms),
                hot: false,
                dirty: false,
                writable: false,
                accepted_ms: now.mono_ms,
                timer,
                backlog_since_ms: None,
                starved_listed: false,
            });
            assert_eq!(inserted, key, "a slab inserts at its vacant key");
            self.loops.connections = self.conns.len() as u64;
            log::debug!("accepted {peer} as connection {}", key.0);
        }
    }

    fn mark_dirty(&mut self, key: ConnKey) {
        if let Some(c) = self.conns.get_mut(key)
            && !c.dirty
        {
            c.dirty = true;
            self.dirty.push(key);
        }
    }

    fn mark_hot(&mut self, key: ConnKey) {
        if let Some(c) = self.conns.get_mut(key)
            && !c.hot
        {
            c.hot = true;
            self.hot.push(key);
        }
    }

    /// Ends a connection: the broker forgets it now (its in-flight messages
    /// return to ready); the socket closes after this turn's flush.
    fn end(&mut self, key: ConnKey, why: &str) {
        let Some(c) = self.conns.get_mut(key) else { return };
        if !c.state.end(key, &mut self.broker) {
            return;
        }
        log::debug!("closing connection {}: {why}", key.0);
        if let Some((t, _)) = c.timer.take() {
            self.timers.cancel(t);
        }
        self.closing.push(key);
        self.mark_dirty(key);
    }

    /// Serves a connection: decodes buffered frames, reads more, repeats,
    /// until WouldBlock, a stop (parked, held, closing), or its share of the
    /// turn is used.
    fn serve(&mut self, key: ConnKey, now: Now) {
        self.serve_conn(key, now);
        self.note_starved(key, now);
        self.arm(key);
    }

    /// A connection that stopped because the buffers are full is listed,
    /// to be served again once they are not, and its backlog clock starts.
    fn note_starved(&mut self, key: ConnKey, now: Now) {
        let Some(c) = self.conns.get_mut(key).filter(|c| c.state.starved) else { return };
        if !c.starved_listed {
            c.starved_listed = true;
            self.starved.push(key);
        }
        c.backlog_since_ms.get_or_insert(now.mono_ms);
    }

    fn serve_conn(&mut self, key: ConnKey, now: Now) {
        let budget = self.broker.config().limits.read_bytes_per_turn_max as usize;
        let mut read = 0usize;
        // A read that returned less than asked for emptied the socket (a
        // stream socket, epoll(7)): the next data brings a new edge, so the
        // read that would only say EAGAIN is skipped — one syscall less per
        // request. Unless the peer has closed: then read on to the EOF.
        let mut drained = false;
        // First what earlier turns left buffered, then each chunk as it is
        // read.
        let mut step = self.decode_input(key, now, None);
        loop {
            match step {
                Step::Continue => {}
                Step::Stop => return,
                Step::Resume => {
                    self.mark_hot(key);
                    return;
                }
                Step::End(why) => {
                    self.end(key, &why);
                    return;
                }
            }
            if drained {
                return;
            }
            if read >= budget {
                self.mark_hot(key);
                return;
            }
            let Some(c) = self.conns.get_mut(key) else { return };
            // What it would read now would only be buffered.
            if c.state.starve_if_full(&self.broker, &self.loops) {
                return;
            }
            match c.stream.read(&mut self.scratch) {
                Ok(0) => {
                    self.end(key, "peer closed");
                    return;
                }
                Ok(n) => {
                    read += n;
                    drained = n < self.scratch.len() && !c.state.peer_closed;
                    self.loops.bytes_in += n as u64;
                    step = self.decode_input(key, now, Some(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => step = Step::Continue,
                Err(e) => {
                    self.end(key, &format!("read error: {e}"));
                    return;
                }
            }
        }
    }

    /// Decodes and serves every complete frame in the connection's input
    /// (`ConnState::serve`), or in the first `chunk` bytes just read into
    /// the scratch buffer (`ConnState::serve_chunk`), and notes the output
    /// it leaves to flush (a held reply waits in the broker's turn).
    fn decode_input(&mut self, key: ConnKey, now: Now, chunk: Option<usize>) -> Step {
        let Some(c) = self.conns.get_mut(key) else { return Step::Stop };
        let mut cx = Serve { broker: &mut self.broker, loops: &mut self.loops, now };
        let step = match chunk {
            Some(n) => c.state.serve_chunk(key, &self.scratch[..n], &mut cx, &mut ()),
            None => c.state.serve(key, &mut cx, &mut ()),
        };
        if c.state.pending_out_bytes() > 0 {
            self.mark_dirty(key);
        }
        step
    }

    /// Writes each dirty connection's output with one write. Only after
    /// the turn's log write (`written` proves it): a reply never leaves
    /// before the records it depends on are written. A connection whose
    /// socket fails is ended later, in `end_unwritable`, since ending one
    /// can append records (its in-flight messages may be dead-lettered).
    fn flush(&mut self, now: Now, _written: &Written) {
        let out_max = self.broker.config().limits.output_bytes_max as usize;
        // Taken and given back, so the list's buffer is reused every turn.
        let mut dirty = std::mem::take(&mut self.dirty);
        // What to do after the loop, which holds the connection borrowed:
        // end a connection (why), or arm its timer (a backlog began).
        let mut after: Vec<(ConnKey, Option<String>)> = Vec::new();
        for key in dirty.drain(..) {
            let Some(c) = self.conns.get_mut(key) else { continue };
            c.dirty = false;
            let mut failed = None;
            while c.state.out_pos < c.state.out.len() {
                match c.stream.write(&c.state.out[c.state.out_pos..]) {
                    Ok(n) => {
                        c.state.out_pos += n;
                        self.loops.bytes_out += n as u64;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        failed = Some(format!("write error: {e}"));
                        break;
                    }
                }
            }
            c.state.settle_out(self.broker.buffers_full(self.loops.buffered_bytes));
            c.state.account(&mut self.loops.buffered_bytes);
            let pending = c.state.pending_out_bytes();
            if pending > out_max && failed.is_none() {
                failed = Some(format!(
                    "pending output {pending} over output_bytes_max ({out_max}): the peer is not reading"
                ));
            }
            // Starved, and still holding much: it has not read enough.
            let starved = c.state.starved && c.state.buffered_bytes() >= FULL_HOLDING_BYTES_MAX;
            if pending >= out_max / 2 || starved {
                if c.backlog_since_ms.is_none() {
                    c.backlog_since_ms = Some(now.mono_ms);
                    after.push((key, None));
                }
            } else {
                c.backlog_since_ms = None;
                let resume = std::mem::take(&mut c.state.paused) | std::mem::take(&mut c.state.starved);
                if resume && !c.hot && !c.state.closing {
                    c.hot = true;
                    self.hot.push(key);
                }
            }
            let want_writable = pending > 0 && failed.is_none();
            if want_writable != c.writable {
                let interest = if want_writable { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
                if let Err(e) = self.poll.registry().reregister(&mut c.stream, token(key), interest) {
                    failed = Some(format!("reregister: {e}"));
                }
                c.writable = want_writable;
            }
            if let Some(why) = failed {
                c.state.out.clear();
                c.state.out_pos = 0;
                after.push((key, Some(why)));
            }
        }
        self.dirty = dirty;
        for (key, why) in after {
            match why {
                Some(why) => self.unwritable.push((key, why)),
                None => self.arm(key),
            }
        }
    }

    /// Ends the connections whose socket failed in this turn's flushes.
    fn end_unwritable(&mut self) {
        for (key, why) in std::mem::take(&mut self.unwritable) {
            self.end(key, &why);
        }
    }

    // -----------------------------------------------------------------------
    // The metrics listener (`http.rs`), on this same loop: it is lent the
    // registry and the timers for each call.
    // -----------------------------------------------------------------------

    /// Calls `f` with the metrics listener, the parts of the loop it is
    /// lent and what a scrape renders from.
    fn with_http(&mut self, now: Now, f: impl FnOnce(&mut HttpServer, LoopParts<'_, Timed>, &Scraping<'_>)) {
        let Some(http) = self.http.as_mut() else { return };
        // A copy: the scrape reads the counters the call may change.
        let loops = self.loops;
        let full = self.broker.buffers_full(loops.buffered_bytes);
        let cx = Scraping {
            src: metrics::Source { broker: &self.broker, loops: &loops, lm: &self.loop_metrics, now },
            full,
        };
        let lp = LoopParts {
            registry: self.poll.registry(),
            timers: &mut self.timers,
            buffered: &mut self.loops.buffered_bytes,
        };
        f(http, lp, &cx);
    }

    fn accept_http(&mut self, now: Now) {
        self.with_http(now, |http, lp, _| http.accept(lp, now.mono_ms));
    }

    fn serve_http(&mut self, key: HttpKey, now: Now) {
        self.with_http(now, |http, lp, cx| http.serve(key, lp, cx));
    }

    fn http_timeout(&mut self, key: HttpKey, now: Now) {
        self.with_http(now, |http, lp, cx| http.timeout(key, lp, cx));
    }

    fn close_ended(&mut self) {
        for key in std::mem::take(&mut self.closing) {
            if let Some(mut c) = self.conns.remove(key) {
                c.state.release_buffers(&mut self.loops.buffered_bytes);
                let _ = self.poll.registry().deregister(&mut c.stream);
            }
        }
        self.loops.connections = self.conns.len() as u64;
    }

    /// After the last turn: stop accepting, then one more turn so parked
    /// FETCHes are answered, the log committed and replies flushed.
    fn finish(&mut self) {
        if let Some(mut l) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
        let now = now_at(self.started);
        let mut lent = Lent::new(&mut self.conns, &mut self.hot, &mut self.dirty, &self.loops, now);
        self.broker.shutdown(now, &mut lent);
        let mut written = self.broker.write(now);
        let mut lent = Lent::new(&mut self.conns, &mut self.hot, &mut self.dirty, &self.loops, now);
        self.broker.sync(&mut written, now, &mut lent);
        self.flush(now, &written);
        self.end_unwritable();
        for key in self.conns.keys() {
            self.end(key, "shutdown");
        }
        self.close_ended();
        self.with_http(now, |http, lp, _| http.close_all(lp));
    }
}

/// Steps 3 to 10 of a turn, for whoever owns the connections: the
/// reactor, and the simulation in `fuzz/sim.rs`, which so runs this same
/// order (`run_turn`), not a copy of it.
pub trait TurnSteps {
    /// Step 3: accept, read and serve every ready connection.
    fn serve_ready(&mut self, now: Now);
    /// Step 4: the broker's timers (`Broker::advance`), then the
    /// connections' timeouts.
    fn advance(&mut self, now: Now);
    /// Step 5: `Broker::write`, then `Broker::send_written`.
    fn write(&mut self, now: Now) -> Written;
    /// Steps 6 and 8: write each connection's output (only ever after the
    /// turn's `write`, which `written` proves).
    fn flush(&mut self, now: Now, written: &Written);
    /// Step 7: `Broker::sync`.
    fn sync(&mut self, now: Now, written: &mut Written);
    /// Steps 9 and 10: close the connections that ended, and watch the
    /// buffers.
    fn close_and_watch(&mut self, now: Now);
}

/// Steps 3 to 10 of a turn, in the order written at the top of this file.
pub fn run_turn(steps: &mut impl TurnSteps, now: Now) {
    // 3. readiness
    steps.serve_ready(now);
    // 4. timers: the broker's (deadlines, delays, waits), then the
    // connections' (handshake, idle, frame timeouts)
    steps.advance(now);
    // 5. write: a step of compaction, then one write of the turn's
    // records. No reply has left this turn yet.
    let mut written = steps.write(now);
    // 6. The replies that need only the write (acks, deliveries of
    // messages made durable earlier, errors) go out before the sync, so
    // they do not wait for a sync that is not theirs.
    if written.syncs() {
        steps.flush(now, &written);
    }
    // 7. sync, publish the turn's messages to parked FETCHes, send the
    // held replies.
    steps.sync(now, &mut written);
    // 8. flush
    steps.flush(now, &written);
    // 9. close, 10. buffers
    steps.close_and_watch(now);
}

/// The reactor's turn: its state, this turn's readiness events, when the
/// turn began (for the produce-ack latency and the turn's time), and what
/// its phases took (for the turn's metrics).
struct ReactorTurn<'a> {
    reactor: &'a mut Reactor,
    events: &'a Events,
    started: Instant,
    phases: PhaseNanos,
}

impl TurnSteps for ReactorTurn<'_> {
    fn serve_ready(&mut self, now: Now) {
        self.reactor.handle_readiness(self.events, now);
        self.reactor.serve_late(now);
    }
    fn advance(&mut self, now: Now) {
        let r = &mut *self.reactor;
        r.broker.advance(now, &mut Lent::new(&mut r.conns, &mut r.hot, &mut r.dirty, &r.loops, now));
        r.expire_connections(now);
    }
    fn write(&mut self, now: Now) -> Written {
        let r = &mut *self.reactor;
        let written = r.broker.write(now);
        let acked =
            r.broker.send_written(&written, &mut Lent::new(&mut r.conns, &mut r.hot, &mut r.dirty, &r.loops, now));
        if acked > 0 {
            r.loop_metrics.produce_ack.observe(self.started.elapsed().as_nanos() as u64, acked);
        }
        written
    }
    fn flush(&mut self, now: Now, written: &Written) {
        self.reactor.flush(now, written);
    }
    fn sync(&mut self, now: Now, written: &mut Written) {
        let r = &mut *self.reactor;
        let report = r.broker.sync(written, now, &mut Lent::new(&mut r.conns, &mut r.hot, &mut r.dirty, &r.loops, now));
        if let Some(ns) = report.sync_nanos {
            r.loop_metrics.fsync.observe(ns, 1);
        }
        self.phases = report.phases;
        if report.produces_acked > 0 {
            let ns = self.started.elapsed().as_nanos() as u64;
            r.loop_metrics.produce_ack.observe(ns, report.produces_acked);
        }
    }
    fn close_and_watch(&mut self, now: Now) {
        self.reactor.end_unwritable();
        self.reactor.close_ended();
        self.reactor.watch_buffers(now);
    }
}

/// Connections the kernel may complete before the loop accepts them. The
/// usual 128 overflows when thousands connect at once (each overflow costs a
/// client a one-second SYN retransmit); the kernel caps this at
/// net.core.somaxconn.
const LISTEN_BACKLOG: i32 = 4096;

/// Binds a non-blocking listener with `LISTEN_BACKLOG`.
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    sys::listen(addr, LISTEN_BACKLOG).map(TcpListener::from_std)
}

fn now_at(started: Instant) -> Now {
    now_since(started, Instant::now())
}

/// The clock at `at` (read by the caller), for a loop started at
/// `started`: one monotonic read serves the turn's timing and its clock.
fn now_since(started: Instant, at: Instant) -> Now {
    let wall_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    Now { mono_ms: at.saturating_duration_since(started).as_millis() as u64, wall_ms }
}
