//! The broker: applies requests to the topic queues, appends what changed to
//! the commit log, and at the end of each turn commits the log and releases
//! the replies that waited on it.
//!
//! It sits between the reactor and the plain data structures, as
//! CONVENTIONS.md asks: the reactor owns sockets and the clock and calls in
//! here with decoded frames and `now`; the queues, the wheel and the log
//! never call back. Replies are written into per-connection output buffers
//! that the reactor lends through `Outbox`.
//!
//! The durability rule lives here and in the reactor's loop order: a reply
//! whose truth depends on the log (PRODUCE and the admin frames) is *held*
//! — encoded into a scratch buffer, not into the connection's output — and
//! only `sync`, after the log's write and `fdatasync`, moves it out (or
//! replaces it with a STORAGE error). Every other reply goes to the output
//! at once, but the reactor writes no output to a socket before the turn's
//! `write` (`Written`), so even those never leave before their records. Produced messages stay invisible to
//! consumers until then, so no consumer sees a message that could vanish.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::path::Path;

use byteorder::{ByteOrder, LittleEndian};
use slab::Slab;

use crate::codec::{
    self, DeadInfo, DeadReason, DecodeError, DecodeLimits, ErrorCode, Frame, Message, Request, Skip, op,
};
use crate::limits::Limits;
use crate::log::{
    Committed, FsyncMode, Log, LogOptions, OpenError, Opener, ReadRecord, RecordKind, Recovery, WrittenTurn,
};
use crate::queue::{ConsumerId, FastMap, MsgId, Returned, Settings, Timers, Topic};
use crate::wheel::{TimerKey, Wheel};

#[path = "compactor.rs"]
mod compactor;
use compactor::Compactor;
#[path = "failure_log.rs"]
mod failure_log;
use failure_log::FailureLog;

/// A topic's number in the log: assigned at creation, never reused.
pub type TopicId = u32;

/// The broker's configuration (the limits, and the behaviour flags).
#[derive(Clone, Debug)]
pub struct Config {
    pub limits: Limits,
    /// PRODUCE and FETCH create a missing topic (`--no-auto-create` clears).
    pub auto_create: bool,
    /// Settings of topics created without their own.
    pub defaults: Settings,
    /// When set, HELLO must carry this token.
    pub auth_token: Option<Vec<u8>>,
}

impl Default for Config {
    fn default() -> Self {
        Config { limits: Limits::default(), auto_create: true, defaults: Settings::default(), auth_token: None }
    }
}

/// The time, read once per turn by the reactor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Now {
    /// Monotonic ms since the broker started: deadlines.
    pub mono_ms: u64,
    /// Wall clock ms since the Unix epoch: born times.
    pub wall_ms: u64,
}

/// Frames that are not a successful HELLO (failed HELLOs and any other
/// frame before one) after which a connection is closed, when the broker
/// requires a token.
const AUTH_FAILURES_MAX: u32 = 3;

/// The protocol version of every session: this broker negotiates version 1
/// only (codec::VERSION_MAX), so frames are decoded and deliveries written
/// in version 1's layouts. Serving version 2 replaces this with the
/// session's negotiated version.
pub const SESSION_VERSION: u16 = 1;

/// What the reactor should do with the connection after a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The reply is in the output buffer; go on.
    Done,
    /// The reply waits for this turn's commit. Only further held requests
    /// may be read from this connection this turn, so replies stay in order.
    Held,
    /// A FETCH is parked: read nothing more until `Outbox::unblock`.
    Parked,
    /// Close the connection after flushing what is in its output.
    Close,
}

/// Whether a request's reply waits for the commit.
pub fn is_held(op: u8) -> bool {
    matches!(op, op::PRODUCE | op::CREATE_TOPIC | op::DELETE_TOPIC | op::PURGE_TOPIC | op::REDRIVE)
}

/// Per-connection protocol state, owned by the reactor's connection.
#[derive(Clone, Debug, Default)]
pub struct Session {
    /// Unique for the broker's life; owns in-flight messages.
    pub consumer: ConsumerId,
    /// HELLO succeeded.
    pub hello: bool,
    /// Frames since the last successful HELLO that were not a successful
    /// HELLO, counted only when the broker requires a token.
    pub auth_failures: u32,
    /// Topics this connection has fetched from: where its in-flight
    /// messages can be, so a disconnect visits only those.
    pub fetched: Vec<TopicId>,
}

/// Output buffers the broker may write to outside `handle` (replies to
/// parked FETCHes, held replies), lent by the reactor.
pub trait Outbox {
    /// The output buffer of `conn`, or None if it is closing.
    fn out(&mut self, conn: usize) -> Option<&mut Vec<u8>>;
    /// `conn`'s parked FETCH was answered: resume reading it.
    fn unblock(&mut self, conn: usize);
}

/// What a timer in the wheel stands for.
#[derive(Clone, Copy, Debug)]
enum Timer {
    /// An ack deadline or a NACK delay of a message.
    Msg { topic: TopicId, id: MsgId },
    /// The end of a parked FETCH's wait.
    Wait { waiter: usize },
}

/// A parked FETCH.
#[derive(Clone, Copy, Debug)]
struct Waiter {
    conn: usize,
    consumer: ConsumerId,
    request_id: u32,
    topic: TopicId,
    max_messages: u32,
    max_bytes: u64,
    ack_timeout_ms: u32,
    timer: TimerKey,
}

/// A reply waiting for the commit.
#[derive(Clone, Debug)]
struct Held {
    conn: usize,
    op: u8,
    request_id: u32,
    /// The reply if the commit succeeds, in `held_bytes`.
    range: Range<usize>,
    /// Whether it depends on the commit (an error reply does not).
    durable: bool,
}

/// A reply to a connection that is not the one being served, sent at
/// commit (in request order with the held replies).
#[derive(Clone, Debug)]
enum PendingReply {
    /// A parked FETCH whose topic was deleted.
    Error { conn: usize, op: u8, request_id: u32, code: ErrorCode, message: String },
}

/// A topic and what waits on it.
struct Entry {
    topic: Topic,
    id: TopicId,
    /// Parked FETCHes, oldest first (keys into `waiters`).
    waiters: VecDeque<usize>,
    /// Already in this turn's `touched` list.
    touched: bool,
}

/// The topic table.
#[derive(Default)]
struct Topics {
    /// Keyed by the broker's own ids, so the fast `IdMap` hash is safe.
    by_id: FastMap<TopicId, Entry>,
    names: HashMap<Box<str>, TopicId>,
    next_topic_id: TopicId,
    /// First id of the next topic created: above every id any topic ever
    /// had, so ids never repeat, even after delete and re-create.
    id_floor: MsgId,
    /// Topics that are not dead-letter topics (what topics_max counts).
    user_topics: u32,
    /// Recovery only: messages met in the log below their topic's highest
    /// id so far (compaction copied them forward), merged in at the end.
    strays: HashMap<TopicId, BTreeMap<MsgId, Stray>>,
}

/// A message recovered out of id order.
struct Stray {
    born_ms: u64,
    deliveries: u16,
    dead: Option<DeadInfo>,
    payload: Vec<u8>,
}

impl Topics {
    fn id(&self, name: &str) -> Option<TopicId> {
        self.names.get(name).copied()
    }
    fn insert(&mut self, id: TopicId, name: &str, settings: Settings, first_id: MsgId) {
        let topic = Topic::new(name, settings, first_id.max(self.id_floor));
        self.id_floor = self.id_floor.max(topic.seq.next_id());
        self.by_id.insert(id, Entry { topic, id, waiters: VecDeque::new(), touched: false });
        self.name(id, name);
        self.next_topic_id = self.next_topic_id.max(id + 1);
    }
    /// Gives topic `id` its name (at creation, or when recovery meets the
    /// Topic record of a topic whose messages came first).
    fn name(&mut self, id: TopicId, name: &str) {
        let Some(e) = self.by_id.get_mut(&id) else { return };
        e.topic.set_name(name);
        self.names.insert(name.into(), id);
        if !e.topic.is_dlq() {
            self.user_topics += 1;
        }
    }
    fn remove(&mut self, id: TopicId) -> Option<Entry> {
        let e = self.by_id.remove(&id)?;
        if !e.topic.name.is_empty() {
            self.names.remove(&*e.topic.name);
            if !e.topic.is_dlq() {
                self.user_topics -= 1;
            }
        }
        self.id_floor = self.id_floor.max(e.topic.seq.next_id());
        Some(e)
    }

    /// Applies one record during recovery. Compaction re-appends a topic's
    /// Topic record and its live messages at the head of the log, so a
    /// topic's messages may come before its Topic record (it is created
    /// nameless and named when the record comes) and in any id order.
    #[allow(clippy::too_many_lines)] // reshaped by the core work
    fn replay(&mut self, r: &ReadRecord<'_>, notes: &mut Compactor) -> Result<(), String> {
        let mut rd = Body { b: r.body, pos: 0 };
        let topic_id = rd.u32()?;
        match r.kind {
            RecordKind::Topic => {
                let next_id = rd.u64()?;
                let settings = Settings { ack_timeout_ms: rd.u32()?, max_deliveries: rd.u16()? };
                let name = rd.str()?;
                match self.by_id.get_mut(&topic_id) {
                    Some(e) => {
                        e.topic.settings = settings;
                        e.topic.seq.bump_next_id(next_id);
                        if e.topic.name.is_empty() {
                            self.name(topic_id, name);
                        }
                    }
                    None => self.insert(topic_id, name, settings, next_id),
                }
                self.id_floor = self.id_floor.max(next_id);
                notes.replayed_topic(r.segment, topic_id);
            }
            RecordKind::Delete => {
                self.id_floor = self.id_floor.max(rd.u64()?);
                self.remove(topic_id);
                self.strays.remove(&topic_id);
                notes.replayed_delete(r.segment);
            }
            RecordKind::Purge => {
                let below = rd.u64()?;
                let e = self.entry(topic_id);
                e.topic.purge(&mut NoTimers);
                e.topic.seq.bump_next_id(below);
                if let Some(strays) = self.strays.get_mut(&topic_id) {
                    strays.retain(|id, _| *id >= below);
                }
            }
            RecordKind::Produce => {
                let count = rd.u32()?;
                for _ in 0..count {
                    let id = rd.u64()?;
                    let born_ms = rd.u64()?;
                    let deliveries = rd.u16()?;
                    let flags = rd.u8()?;
                    let dead = if flags & codec::MSG_FLAG_DEAD != 0 {
                        Some(DeadInfo {
                            origin_id: rd.u64()?,
                            origin_deliveries: rd.u16()?,
                            reason: DeadReason::from_u8(rd.u8()?).ok_or("unknown dead-letter reason")?,
                        })
                    } else {
                        None
                    };
                    let len = rd.u32()? as usize;
                    let payload = rd.bytes(len)?;
                    notes.replayed_produce(r.segment, topic_id, id);
                    let t = &mut self.entry(topic_id).topic;
                    if t.seq.contains(id) {
                        t.restore_deliveries(id, deliveries);
                    } else if id >= t.seq.next_id() {
                        t.restore(id, born_ms, payload, deliveries, dead);
                    } else {
                        let strays = self.strays.entry(topic_id).or_default();
                        let stray = strays.entry(id).or_insert_with(|| Stray {
                            born_ms,
                            deliveries,
                            dead,
                            payload: payload.to_vec(),
                        });
                        stray.deliveries = deliveries;
                    }
                }
            }
            RecordKind::Remove => {
                let _reason = rd.u8()?;
                let count = rd.u32()?;
                for _ in 0..count {
                    let id = rd.u64()?;
                    self.entry(topic_id).topic.release(id);
                    if let Some(strays) = self.strays.get_mut(&topic_id) {
                        strays.remove(&id);
                    }
                }
            }
            RecordKind::Requeue => {
                let count = rd.u32()?;
                for _ in 0..count {
                    let id = rd.u64()?;
                    let deliveries = rd.u16()?;
                    self.entry(topic_id).topic.restore_deliveries(id, deliveries);
                    if let Some(s) = self.strays.get_mut(&topic_id).and_then(|m| m.get_mut(&id)) {
                        s.deliveries = deliveries;
                    }
                }
            }
        }
        if !rd.done() {
            return Err("bytes left over after the record body".into());
        }
        Ok(())
    }

    /// The topic `id`, created nameless if recovery has not met its Topic
    /// record yet.
    fn entry(&mut self, id: TopicId) -> &mut Entry {
        self.next_topic_id = self.next_topic_id.max(id + 1);
        self.by_id.entry(id).or_insert_with(|| Entry {
            topic: Topic::new("", Settings::default(), 1),
            id,
            waiters: VecDeque::new(),
            touched: false,
        })
    }

    /// Ends recovery: merges strays, drops topics whose Topic record never
    /// came (their records belonged to a deleted topic), and makes every
    /// remaining message ready in id order.
    fn finish_recovery(&mut self) {
        for (tid, strays) in std::mem::take(&mut self.strays) {
            if let Some(e) = self.by_id.get_mut(&tid) {
                e.topic.merge(strays.into_iter().map(|(id, s)| (id, s.born_ms, s.payload, s.deliveries, s.dead)));
            }
        }
        let nameless: Vec<TopicId> = self.by_id.values().filter(|e| e.topic.name.is_empty()).map(|e| e.id).collect();
        for tid in nameless {
            if let Some(e) = self.remove(tid) {
                log::warn!(
                    "recovery: dropped {} messages of topic id {tid}, whose topic record is missing from the log",
                    e.topic.seq.live()
                );
            }
        }
        for e in self.by_id.values_mut() {
            e.topic.restore_done();
            self.id_floor = self.id_floor.max(e.topic.seq.next_id());
        }
    }
}

/// A cursor over a record body.
struct Body<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Body<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len()).ok_or("record body too short")?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.bytes(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        self.bytes(2).map(LittleEndian::read_u16)
    }
    fn u32(&mut self) -> Result<u32, String> {
        self.bytes(4).map(LittleEndian::read_u32)
    }
    fn u64(&mut self) -> Result<u64, String> {
        self.bytes(8).map(LittleEndian::read_u64)
    }
    fn str(&mut self) -> Result<&'a str, String> {
        let n = self.u16()? as usize;
        std::str::from_utf8(self.bytes(n)?).map_err(|_| "topic name is not UTF-8".into())
    }
    fn done(&self) -> bool {
        self.pos == self.b.len()
    }
}

/// Timers that do nothing (recovery has no deadlines).
struct NoTimers;
impl Timers for NoTimers {
    fn arm(&mut self, _: u64, _: MsgId) -> TimerKey {
        unreachable!("recovery arms no timers")
    }
    fn disarm(&mut self, _: TimerKey) {}
}

/// A topic's view of the wheel.
struct TopicTimers<'a> {
    wheel: &'a mut Wheel<Timer>,
    topic: TopicId,
}

impl Timers for TopicTimers<'_> {
    fn arm(&mut self, deadline_ms: u64, id: MsgId) -> TimerKey {
        self.wheel.insert(deadline_ms, Timer::Msg { topic: self.topic, id })
    }
    fn disarm(&mut self, key: TimerKey) {
        self.wheel.cancel(key);
    }
}

/// Broker-wide counters; the reactor fills in its own.
#[derive(Clone, Copy, Debug, Default)]
pub struct BrokerStats {
    pub connections: u64,
    pub turns: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub recovery_ms: u64,
    pub started_mono_ms: u64,
    /// Produce batches answered after a commit.
    pub produces_committed: u64,
    /// Bytes the client connections' input and output buffers take (their
    /// capacity), kept up to date by each connection as its buffers change
    /// (`ConnState::account`). What `buffered_bytes_max` bounds.
    pub buffered_bytes: u64,
    /// Requests answered BUSY because the buffers were full (counter).
    pub busy_replies: u64,
}

/// One topic's numbers, for metrics.
#[derive(Clone, Debug)]
pub struct TopicMetrics {
    pub name: String,
    pub ready: u64,
    pub inflight: u64,
    pub delayed: u64,
    /// Live messages in `<name>.dlq`.
    pub dead_letter: u64,
    pub bytes: u64,
    pub counters: crate::queue::Counters,
    /// Age of the oldest unacknowledged message, 0 when none.
    pub oldest_age_ms: u64,
}

/// A turn's records, written and not yet synced: what `Broker::write`
/// returns and `Broker::sync` finishes. The reactor's flush takes one by
/// reference, so that no reply can reach a socket in a turn before the
/// turn's `write`: the only way to get one is to write.
#[must_use = "a written turn must be synced (Broker::sync)"]
pub struct Written {
    /// The log's half-done commit (or why the write failed), until `sync`
    /// takes it.
    turn: Option<std::io::Result<WrittenTurn>>,
    /// Whether `sync` will `fdatasync`.
    syncs: bool,
}

impl Written {
    /// Whether `Broker::sync` will `fdatasync`: then the replies that do
    /// not wait for it are worth flushing first.
    pub fn syncs(&self) -> bool {
        self.syncs
    }
}

/// What a turn's commit stored.
#[derive(Clone, Copy, Debug)]
struct Stored {
    /// The turn's records other than client produces are written.
    records: bool,
    /// Its client produces are written too.
    produces: bool,
}

/// What a turn's commit did, for the reactor's latency metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct TurnReport {
    /// PRODUCE replies released (acknowledged) this turn.
    pub produces_acked: u64,
    /// Nanoseconds the write and fdatasync took, if the turn synced.
    pub sync_nanos: Option<u64>,
}

/// The broker.
pub struct Broker {
    config: Config,
    decode_limits: DecodeLimits,
    topics: Topics,
    wheel: Wheel<Timer>,
    waiters: Slab<Waiter>,
    /// The parked FETCH of each connection (at most one).
    parked: FastMap<usize, usize>,
    log: Log,
    /// Replies waiting for this turn's commit, in request order.
    held: Vec<Held>,
    /// The bytes of the held replies.
    held_bytes: Vec<u8>,
    /// Replies to parked connections decided during the turn.
    pending_replies: Vec<PendingReply>,
    /// Client produces of this turn: withdrawn if the commit fails.
    produced: Vec<(TopicId, MsgId, u32)>,
    /// Topics to publish and whose waiters to serve at commit.
    touched: Vec<TopicId>,
    /// Scratch lists, kept to avoid allocating per request.
    done_ids: Vec<u64>,
    failed_ids: Vec<u64>,
    expired: Vec<(u64, Timer)>,
    /// Cleans the log's oldest segments.
    compactor: Compactor,
    /// Storage failures, logged at a bounded rate.
    failures: FailureLog,
    /// Shutting down: the last commit syncs whatever it writes.
    stopping: bool,
    pub stats: BrokerStats,
    /// What recovery found at start.
    pub recovery: Recovery,
}

impl Broker {
    /// Opens the data directory, recovers every topic from the log, and
    /// returns a broker ready for its first turn.
    pub fn open(config: Config, dir: &Path, log_options: LogOptions, now: Now) -> Result<Broker, OpenError> {
        Broker::open_with(config, dir, log_options, Box::new(crate::log::open_file), now)
    }

    /// `open` with a custom segment opener (tests inject storage failures).
    pub fn open_with(
        config: Config,
        dir: &Path,
        log_options: LogOptions,
        opener: Opener,
        now: Now,
    ) -> Result<Broker, OpenError> {
        let mut topics = Topics::default();
        let mut compactor = Compactor::default();
        let (log, recovery) = Log::open_with(dir, log_options, opener, |r| topics.replay(r, &mut compactor))?;
        topics.finish_recovery();
        Ok(Broker::with_log(config, log, recovery, topics, compactor, now))
    }

    fn with_log(
        config: Config,
        log: Log,
        recovery: Recovery,
        topics: Topics,
        compactor: Compactor,
        now: Now,
    ) -> Broker {
        let decode_limits = DecodeLimits::from(&config.limits);
        Broker {
            config,
            decode_limits,
            topics,
            wheel: Wheel::new(now.mono_ms),
            waiters: Slab::new(),
            parked: FastMap::default(),
            log,
            held: Vec::new(),
            held_bytes: Vec::new(),
            pending_replies: Vec::new(),
            produced: Vec::new(),
            touched: Vec::new(),
            done_ids: Vec::new(),
            failed_ids: Vec::new(),
            expired: Vec::new(),
            compactor,
            failures: FailureLog::default(),
            stopping: false,
            stats: BrokerStats { recovery_ms: recovery.millis, started_mono_ms: now.mono_ms, ..BrokerStats::default() },
            recovery,
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }
    pub fn decode_limits(&self) -> &DecodeLimits {
        &self.decode_limits
    }
    pub fn log(&self) -> &Log {
        &self.log
    }
    /// The earliest time a timer may fire, for the poll timeout.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.wheel.next_deadline_ms()
    }
    /// Whether this turn's commit will fdatasync: something waits on it (a
    /// held reply, or the last turn). Compaction needs no sync of the turn:
    /// it syncs its copies with its restatement (`Log::commit_ahead`)
    /// before it removes a segment.
    fn sync_wanted(&self) -> bool {
        self.held.iter().any(|h| h.durable) || self.stopping
    }

    /// Segments removed by compaction.
    pub fn compactions(&self) -> u64 {
        self.compactor.compactions
    }

    /// Per-topic numbers for metrics, sorted by name.
    pub fn topic_metrics(&self, now: Now) -> Vec<TopicMetrics> {
        let mut v: Vec<TopicMetrics> = self
            .topics
            .by_id
            .values()
            .map(|e| {
                let t = &e.topic;
                let dlq = self.topics.id(&format!("{}.dlq", t.name)).and_then(|d| self.topics.by_id.get(&d));
                TopicMetrics {
                    name: t.name.to_string(),
                    ready: t.ready(),
                    inflight: t.inflight(),
                    delayed: t.delayed(),
                    dead_letter: dlq.map_or(0, |d| d.topic.seq.live()),
                    bytes: t.seq.live_bytes(),
                    counters: t.counters,
                    oldest_age_ms: t.seq.oldest_born_ms().map_or(0, |b| now.wall_ms.saturating_sub(b)),
                }
            })
            .collect();
        v.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Whether background work (compaction) wants another turn soon.
    pub fn busy(&self) -> bool {
        self.compactor.busy() || self.log.releasing()
    }
    /// Whether the client connections' buffers hold `buffered_bytes_max`
    /// or more. While they do, requests with large replies are answered
    /// BUSY and the connections that hold the most are not read.
    pub fn buffers_full(&self) -> bool {
        self.stats.buffered_bytes >= self.config.limits.buffered_bytes_max
    }

    /// The BUSY error, counted: a request with a large reply came while
    /// the buffers were full, and nothing was done.
    fn busy_error(&mut self) -> (ErrorCode, String) {
        self.stats.busy_replies += 1;
        (ErrorCode::Busy, BUSY_MESSAGE.into())
    }

    /// Number of topics (dead-letter topics included).
    pub fn topic_count(&self) -> usize {
        self.topics.by_id.len()
    }

    // -----------------------------------------------------------------------
    // Requests.
    // -----------------------------------------------------------------------

    /// Serves one request from connection `conn`. Its reply goes to `out`,
    /// or, for a held request, waits for `commit`.
    pub fn handle(
        &mut self,
        conn: usize,
        session: &mut Session,
        frame: &Frame<'_>,
        now: Now,
        out: &mut Vec<u8>,
    ) -> Outcome {
        let rid = frame.request_id;
        let op = frame.request.op();
        if !session.hello {
            return self.before_hello(session, frame, out);
        }
        if is_held(op) {
            let start = self.held_bytes.len();
            let mut scratch = std::mem::take(&mut self.held_bytes);
            let durable = match self.handle_held(&frame.request, rid, now, &mut scratch) {
                Ok(()) => true,
                Err((code, msg)) => {
                    codec::encode_error(&mut scratch, op, rid, code, &msg);
                    false
                }
            };
            self.held_bytes = scratch;
            self.held.push(Held { conn, op, request_id: rid, range: start..self.held_bytes.len(), durable });
            return Outcome::Held;
        }
        match self.handle_now(conn, session, &frame.request, rid, now, out) {
            Ok(outcome) => outcome,
            Err((code, msg)) => {
                codec::encode_error(out, op, rid, code, &msg);
                Outcome::Done
            }
        }
    }

    /// A frame before a successful HELLO (docs/protocol.md, "Opening:
    /// HELLO"): a HELLO is checked for its token first (so a peer without
    /// it learns nothing else), then for a common version; any other op is
    /// refused unread. A success resets the failure count.
    fn before_hello(&mut self, session: &mut Session, frame: &Frame<'_>, out: &mut Vec<u8>) -> Outcome {
        let rid = frame.request_id;
        let Request::Hello { min_version, max_version, token } = frame.request else {
            let (code, message) = self.hello_required();
            codec::encode_error(out, frame.request.op(), rid, code, message);
            return self.failed_before_hello(session);
        };
        // A token sent to a broker that requires none is ignored, so that
        // clients can be given the token before the broker requires it.
        if let Some(expected) = &self.config.auth_token
            && !constant_time_eq(expected, token)
        {
            codec::encode_error(out, op::HELLO, rid, ErrorCode::Unauthenticated, "wrong or missing auth token");
            return self.failed_before_hello(session);
        }
        let version = max_version.min(codec::VERSION_MAX);
        if version < min_version.max(codec::VERSION_MIN) {
            let msg = format!("this broker speaks versions {}..={}", codec::VERSION_MIN, codec::VERSION_MAX);
            codec::encode_error(out, op::HELLO, rid, ErrorCode::Version, &msg);
            return self.failed_before_hello(session);
        }
        session.hello = true;
        session.auth_failures = 0;
        codec::encode_hello_reply(out, rid, version, &self.decode_limits, codec::MAP_EPOCH_UNSHARDED);
        Outcome::Done
    }

    /// What a frame other than HELLO gets before a successful HELLO.
    fn hello_required(&self) -> (ErrorCode, &'static str) {
        match self.config.auth_token {
            Some(_) => (ErrorCode::Unauthenticated, "send HELLO with the auth token first"),
            None => (ErrorCode::HelloRequired, "send HELLO first"),
        }
    }

    /// Counts a frame that was not a successful HELLO, when the broker
    /// requires a token: the connection closes at `AUTH_FAILURES_MAX`, so a
    /// peer without the token cannot keep sending until the handshake
    /// timeout.
    fn failed_before_hello(&self, session: &mut Session) -> Outcome {
        if self.config.auth_token.is_none() {
            return Outcome::Done;
        }
        session.auth_failures += 1;
        if session.auth_failures >= AUTH_FAILURES_MAX { Outcome::Close } else { Outcome::Done }
    }

    /// The error to send for a frame the codec refused before a successful
    /// HELLO, and what follows it. A lost frame boundary (MALFORMED, then
    /// the close) and a frame over frame_bytes_max (FRAME_TOO_LARGE, and it
    /// is discarded) keep their error, because they are about the byte
    /// stream; so does a malformed HELLO. Any other op gets what any frame
    /// but HELLO gets, whatever is wrong with it. Each one counts as a
    /// failure when a token is required.
    pub fn refuse_before_hello(&self, session: &mut Session, e: DecodeError) -> (DecodeError, Outcome) {
        if e.skip == Skip::Close {
            return (e, Outcome::Done);
        }
        let e = if e.code == ErrorCode::FrameTooLarge || e.op == op::HELLO {
            e
        } else {
            let (code, message) = self.hello_required();
            DecodeError { code, message: message.into(), ..e }
        };
        (e, self.failed_before_hello(session))
    }

    #[allow(clippy::too_many_lines)] // reshaped by the core work
    fn handle_now(
        &mut self,
        conn: usize,
        session: &mut Session,
        req: &Request<'_>,
        rid: u32,
        now: Now,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, (ErrorCode, String)> {
        match *req {
            // A repeated HELLO negotiates afresh: if it fails, the connection
            // is back to "HELLO required".
            Request::Hello { .. } => Ok({
                session.hello = false;
                self.before_hello(session, &Frame { request_id: rid, request: *req }, out)
            }),
            Request::Ping => {
                codec::encode_empty_reply(out, op::PING, rid);
                Ok(Outcome::Done)
            }
            Request::Fetch { topic, max_messages, max_bytes, wait_ms, ack_timeout_ms, .. } => {
                if max_messages == 0 {
                    return Err((ErrorCode::BadArgument, "max_messages must be at least 1".into()));
                }
                let tid = self.topic_for(topic, self.config.auto_create)?;
                if !session.fetched.contains(&tid) {
                    session.fetched.push(tid);
                }
                let l = &self.config.limits;
                let mut w = Waiter {
                    conn,
                    consumer: session.consumer,
                    request_id: rid,
                    topic: tid,
                    max_messages: max_messages.min(l.batch_messages_max),
                    max_bytes: u64::from(if max_bytes == 0 {
                        l.fetch_bytes_max
                    } else {
                        max_bytes.min(l.fetch_bytes_max)
                    }),
                    ack_timeout_ms,
                    timer: TimerKey::NONE,
                };
                let full = self.buffers_full();
                let Some(e) = self.topics.by_id.get_mut(&tid) else { return Err(unknown(topic)) };
                if full && e.topic.has_ready() {
                    return Err(self.busy_error());
                }
                if wait_ms == 0 || e.topic.has_ready() {
                    deliver(e, &mut self.wheel, &w, now, out);
                    return Ok(Outcome::Done);
                }
                let wait_ms = wait_ms.min(l.fetch_wait_ms_max);
                let slot = self.waiters.vacant_entry();
                let key = slot.key();
                w.timer = self.wheel.insert(now.mono_ms + u64::from(wait_ms), Timer::Wait { waiter: key });
                slot.insert(w);
                e.waiters.push_back(key);
                self.parked.insert(conn, key);
                Ok(Outcome::Parked)
            }
            Request::Ack { topic, ids, .. } => {
                let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
                self.ids_op(tid, op::ACK, ids.iter(), rid, out, |t, id, timers| t.ack(id, timers));
                Ok(Outcome::Done)
            }
            Request::Touch { topic, ack_timeout_ms, ids, .. } => {
                let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
                // The deadline counts from this turn's clock (the wheel's
                // own time is the last turn's, which may be long ago).
                self.ids_op(tid, op::TOUCH, ids.iter(), rid, out, |t, id, timers| {
                    let timeout = if ack_timeout_ms == 0 { t.settings.ack_timeout_ms } else { ack_timeout_ms };
                    t.touch(id, now.mono_ms + u64::from(timeout), timers)
                });
                Ok(Outcome::Done)
            }
            Request::Nack { topic, delay_ms, flags, ids, .. } => {
                let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
                self.nack(tid, delay_ms, flags & codec::NACK_FLAG_DEAD_LETTER != 0, ids.iter(), rid, now, out);
                Ok(Outcome::Done)
            }
            Request::Stats { topic } => {
                if !topic.is_empty() && self.topics.id(topic).is_none() {
                    return Err(unknown(topic));
                }
                // One topic's section is small; every topic's grows with them.
                if topic.is_empty() && self.buffers_full() {
                    return Err(self.busy_error());
                }
                self.write_stats(topic, rid, now, out);
                Ok(Outcome::Done)
            }
            Request::ListTopics => {
                if self.buffers_full() {
                    return Err(self.busy_error());
                }
                let mut list: Vec<(&str, codec::TopicSettings)> = self
                    .topics
                    .by_id
                    .values()
                    .map(|e| {
                        let s = e.topic.settings;
                        (
                            &*e.topic.name,
                            codec::TopicSettings { ack_timeout_ms: s.ack_timeout_ms, max_deliveries: s.max_deliveries },
                        )
                    })
                    .collect();
                list.sort_unstable_by(|a, b| a.0.cmp(b.0));
                codec::encode_topics_reply(out, rid, &list);
                Ok(Outcome::Done)
            }
            Request::Produce { .. }
            | Request::CreateTopic { .. }
            | Request::DeleteTopic { .. }
            | Request::PurgeTopic { .. }
            | Request::Redrive { .. } => unreachable!("held requests go through handle_held"),
            // Version-2 ops: the codec refuses them in a version-1 session.
            Request::CreateGroup { .. }
            | Request::DeleteGroup { .. }
            | Request::ListGroups { .. }
            | Request::ResetGroup { .. } => {
                Err((ErrorCode::UnknownOp, format!("opcode 0x{:02x} needs protocol version 2", req.op())))
            }
        }
    }

    /// Requests whose reply waits for the commit. Ok means the OK reply is
    /// in `out`.
    #[allow(clippy::too_many_lines)] // reshaped by the core work
    fn handle_held(
        &mut self,
        req: &Request<'_>,
        rid: u32,
        now: Now,
        out: &mut Vec<u8>,
    ) -> Result<(), (ErrorCode, String)> {
        match *req {
            Request::Produce { topic, batch } => {
                let tid = self.topic_for(topic, self.config.auto_create)?;
                let l = &self.config.limits;
                let Some(e) = self.topics.by_id.get_mut(&tid) else { return Err(unknown(topic)) };
                let t = &mut e.topic;
                if t.seq.live() + u64::from(batch.count) > l.topic_messages_max
                    || t.seq.live_bytes() + batch.payload_bytes() > l.topic_bytes_max
                {
                    return Err((
                        ErrorCode::QueueFull,
                        format!(
                            "topic {topic} holds {} messages / {} bytes; limits are topic_messages_max {} and topic_bytes_max {}",
                            t.seq.live(),
                            t.seq.live_bytes(),
                            l.topic_messages_max,
                            l.topic_bytes_max
                        ),
                    ));
                }
                let first = t.seq.next_id();
                let at = self.log.begin(RecordKind::Produce);
                let b = self.log.body();
                codec::put_u32(b, tid);
                codec::put_u32(b, batch.count);
                for payload in batch.iter() {
                    let (id, born) = t.append_born(now.wall_ms, payload);
                    put_message_record(b, id, born, 0, None, payload);
                    self.compactor.note_client_produce(tid, id);
                }
                // If the commit fails, this record goes (the produce is
                // answered STORAGE and withdrawn); the turn's others stay.
                self.log.end_withdrawable(at);
                self.produced.push((tid, first, batch.count));
                touch(e, &mut self.touched);
                codec::encode_produce_reply(out, rid, first, batch.count);
                Ok(())
            }
            Request::CreateTopic { topic, settings } => {
                let exists = self.topics.id(topic);
                let tid = match exists {
                    Some(tid) => tid,
                    None => self.create_topic(topic)?,
                };
                let d = self.config.defaults;
                let s = Settings {
                    ack_timeout_ms: if settings.ack_timeout_ms == 0 {
                        d.ack_timeout_ms
                    } else {
                        settings.ack_timeout_ms
                    },
                    max_deliveries: if settings.max_deliveries == 0 {
                        d.max_deliveries
                    } else {
                        settings.max_deliveries
                    },
                };
                if let Some(e) = self.topics.by_id.get_mut(&tid) {
                    e.topic.settings = s;
                }
                self.log_topic(tid);
                codec::encode_u64_reply(out, op::CREATE_TOPIC, rid, u64::from(exists.is_none()));
                Ok(())
            }
            Request::DeleteTopic { topic } => {
                let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
                let removed = self.delete_topic(tid);
                codec::encode_u64_reply(out, op::DELETE_TOPIC, rid, removed);
                Ok(())
            }
            Request::PurgeTopic { topic } => {
                let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
                let Some(e) = self.topics.by_id.get_mut(&tid) else { return Err(unknown(topic)) };
                let removed = e.topic.purge(&mut TopicTimers { wheel: &mut self.wheel, topic: tid });
                let below = e.topic.seq.next_id();
                let at = self.log.begin(RecordKind::Purge);
                codec::put_u32(self.log.body(), tid);
                codec::put_u64(self.log.body(), below);
                self.log.end(at);
                self.compactor.nudge();
                codec::encode_u64_reply(out, op::PURGE_TOPIC, rid, removed);
                Ok(())
            }
            Request::Redrive { topic, max_messages, .. } => {
                let moved = self.redrive(topic, max_messages)?;
                codec::encode_u64_reply(out, op::REDRIVE, rid, moved);
                Ok(())
            }
            _ => unreachable!("only held requests come here"),
        }
    }

    /// The topic named `name`, created with default settings if missing and
    /// `create` allows.
    fn topic_for(&mut self, name: &str, create: bool) -> Result<TopicId, (ErrorCode, String)> {
        if let Some(tid) = self.topics.id(name) {
            return Ok(tid);
        }
        if !create {
            return Err(unknown(name));
        }
        let tid = self.create_topic(name)?;
        self.log_topic(tid);
        Ok(tid)
    }

    fn create_topic(&mut self, name: &str) -> Result<TopicId, (ErrorCode, String)> {
        let is_dlq = name.ends_with(".dlq");
        if !is_dlq && self.topics.user_topics >= self.config.limits.topics_max {
            return Err((
                ErrorCode::TooManyTopics,
                format!("the broker holds topics_max ({}) topics", self.config.limits.topics_max),
            ));
        }
        let tid = self.topics.next_topic_id;
        let floor = self.topics.id_floor;
        self.topics.insert(tid, name, self.config.defaults, floor);
        Ok(tid)
    }

    /// Appends a Topic record stating `tid`'s name, settings and next id.
    fn log_topic(&mut self, tid: TopicId) {
        if self.put_topic_record(tid) {
            self.compactor.note_topic(tid);
        }
    }

    /// Appends a Topic record for `tid`, if it exists; says whether it did.
    fn put_topic_record(&mut self, tid: TopicId) -> bool {
        let Some(e) = self.topics.by_id.get(&tid) else { return false };
        let at = self.log.begin(RecordKind::Topic);
        let b = self.log.body();
        codec::put_u32(b, tid);
        codec::put_u64(b, e.topic.seq.next_id());
        codec::put_u32(b, e.topic.settings.ack_timeout_ms);
        codec::put_u16(b, e.topic.settings.max_deliveries);
        codec::put_str(b, e.topic.name.as_bytes());
        self.log.end(at);
        true
    }

    fn delete_topic(&mut self, tid: TopicId) -> u64 {
        let Some(mut e) = self.topics.remove(tid) else { return 0 };
        let removed = e.topic.purge(&mut TopicTimers { wheel: &mut self.wheel, topic: tid });
        let at = self.log.begin(RecordKind::Delete);
        codec::put_u32(self.log.body(), tid);
        codec::put_u64(self.log.body(), e.topic.seq.next_id());
        self.log.end(at);
        self.compactor.note_delete();
        self.compactor.forget_topic(tid);
        self.compactor.nudge();
        self.produced.retain(|p| p.0 != tid);
        for key in e.waiters.drain(..) {
            let w = self.waiters.remove(key);
            self.wheel.cancel(w.timer);
            self.parked.remove(&w.conn);
            self.pending_replies.push(PendingReply::Error {
                conn: w.conn,
                op: op::FETCH,
                request_id: w.request_id,
                code: ErrorCode::UnknownTopic,
                message: format!("topic {} was deleted", e.topic.name),
            });
        }
        removed
    }

    /// Applies ACK or TOUCH to each id and writes the ids reply.
    fn ids_op(
        &mut self,
        tid: TopicId,
        op: u8,
        ids: impl Iterator<Item = u64>,
        rid: u32,
        out: &mut Vec<u8>,
        mut f: impl FnMut(&mut Topic, MsgId, &mut TopicTimers<'_>) -> bool,
    ) {
        self.done_ids.clear();
        self.failed_ids.clear();
        if let Some(e) = self.topics.by_id.get_mut(&tid) {
            let mut timers = TopicTimers { wheel: &mut self.wheel, topic: tid };
            for id in ids {
                if f(&mut e.topic, id, &mut timers) {
                    self.done_ids.push(id);
                } else {
                    self.failed_ids.push(id);
                }
            }
        }
        if op == op::ACK && !self.done_ids.is_empty() {
            self.log_ids(RecordKind::Remove, tid, REMOVE_ACKED);
        }
        codec::encode_ids_reply(out, op, rid, self.done_ids.len() as u32, &self.failed_ids);
    }

    /// Appends a Remove record for `done_ids`.
    fn log_ids(&mut self, kind: RecordKind, tid: TopicId, reason: u8) {
        let at = self.log.begin(kind);
        let b = self.log.body();
        codec::put_u32(b, tid);
        b.push(reason);
        codec::put_u32(b, self.done_ids.len() as u32);
        for id in &self.done_ids {
            codec::put_u64(b, *id);
        }
        self.log.end(at);
    }

    #[allow(clippy::too_many_arguments)]
    fn nack(
        &mut self,
        tid: TopicId,
        delay_ms: u32,
        dead_letter: bool,
        ids: impl Iterator<Item = u64>,
        rid: u32,
        now: Now,
        out: &mut Vec<u8>,
    ) {
        self.done_ids.clear();
        self.failed_ids.clear();
        let mut dead = Vec::new();
        let mut requeued = Vec::new();
        let delay = (delay_ms > 0).then(|| now.mono_ms + u64::from(delay_ms));
        if let Some(e) = self.topics.by_id.get_mut(&tid) {
            let mut timers = TopicTimers { wheel: &mut self.wheel, topic: tid };
            for id in ids {
                match e.topic.nack(id, delay, dead_letter, &mut timers) {
                    None => self.failed_ids.push(id),
                    Some(Returned::Retry) => {
                        self.done_ids.push(id);
                        requeued.push((id, e.topic.deliveries(id)));
                    }
                    Some(Returned::Dead(info)) => {
                        self.done_ids.push(id);
                        dead.push((id, info));
                    }
                }
            }
            if delay.is_none() && !requeued.is_empty() {
                touch(e, &mut self.touched);
            }
        }
        codec::encode_ids_reply(out, op::NACK, rid, self.done_ids.len() as u32, &self.failed_ids);
        self.log_requeue(tid, &requeued);
        for (id, info) in dead {
            self.dead_letter(tid, id, info);
        }
    }

    fn log_requeue(&mut self, tid: TopicId, entries: &[(MsgId, u16)]) {
        if entries.is_empty() {
            return;
        }
        let at = self.log.begin(RecordKind::Requeue);
        let b = self.log.body();
        codec::put_u32(b, tid);
        codec::put_u32(b, entries.len() as u32);
        for (id, d) in entries {
            codec::put_u64(b, *id);
            codec::put_u16(b, *d);
        }
        self.log.end(at);
    }

    /// Moves message `id` of `tid` to `<topic>.dlq`. If the dead-letter
    /// topic is full (or cannot be created), the message goes back to ready
    /// instead: it is never dropped.
    fn dead_letter(&mut self, tid: TopicId, id: MsgId, info: DeadInfo) {
        let Some(name) = self.topics.by_id.get(&tid).map(|e| format!("{}.dlq", e.topic.name)) else { return };
        let dlq = match self.topics.id(&name) {
            Some(d) => d,
            None => match self.create_topic(&name) {
                Ok(d) => {
                    self.log_topic(d);
                    d
                }
                Err((_, why)) => {
                    log::warn!("cannot create dead-letter topic {name}: {why}; message {id} stays in its topic");
                    self.requeue_undead(tid, id, info);
                    return;
                }
            },
        };
        let l = &self.config.limits;
        let [Some(src), Some(dst)] = self.topics.by_id.get_disjoint_mut([&tid, &dlq]) else { return };
        let Some(m) = src.topic.seq.get(id) else { return };
        if dst.topic.seq.live() + 1 > l.topic_messages_max
            || dst.topic.seq.live_bytes() + m.payload.len() as u64 > l.topic_bytes_max
        {
            log::warn!("dead-letter topic {name} is full; message {id} stays in its topic");
            self.requeue_undead(tid, id, info);
            return;
        }
        let new_id = dst.topic.append_dead(m.born_ms, m.payload, info);
        let at = self.log.begin(RecordKind::Produce);
        let b = self.log.body();
        codec::put_u32(b, dlq);
        codec::put_u32(b, 1);
        put_message_record(b, new_id, m.born_ms, 0, Some(info), m.payload);
        self.log.end(at);
        self.compactor.note_produce(dlq, new_id);
        src.topic.release(id);
        src.topic.counters.dead_lettered += 1;
        touch(dst, &mut self.touched);
        self.done_ids.clear();
        self.done_ids.push(id);
        self.log_ids(RecordKind::Remove, tid, REMOVE_DEAD);
    }

    fn requeue_undead(&mut self, tid: TopicId, id: MsgId, info: DeadInfo) {
        if let Some(e) = self.topics.by_id.get_mut(&tid) {
            e.topic.requeue(id, info.origin_deliveries);
            touch(e, &mut self.touched);
        }
    }

    fn redrive(&mut self, topic: &str, max_messages: u32) -> Result<u64, (ErrorCode, String)> {
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        let dlq_name = format!("{topic}.dlq");
        let dlq = self.topics.id(&dlq_name).ok_or_else(|| unknown(&dlq_name))?;
        let max = if max_messages == 0 { u64::MAX } else { u64::from(max_messages) };
        let l = &self.config.limits;
        let [Some(dst), Some(src)] = self.topics.by_id.get_disjoint_mut([&tid, &dlq]) else {
            return Err(unknown(topic));
        };
        self.done_ids.clear();
        let mut moved = Vec::new();
        let log = &mut self.log;
        let compactor = &mut self.compactor;
        let n = src.topic.drain_ready(max, |m, _| {
            if dst.topic.seq.live() + 1 > l.topic_messages_max
                || dst.topic.seq.live_bytes() + m.payload.len() as u64 > l.topic_bytes_max
            {
                return false;
            }
            let new_id = dst.topic.append_kept(m.born_ms, m.payload);
            moved.push((new_id, m.id));
            let at = log.begin(RecordKind::Produce);
            let b = log.body();
            codec::put_u32(b, tid);
            codec::put_u32(b, 1);
            put_message_record(b, new_id, m.born_ms, 0, None, m.payload);
            log.end(at);
            compactor.note_produce(tid, new_id);
            true
        });
        if n > 0 {
            touch(dst, &mut self.touched);
            self.done_ids.extend(moved.iter().map(|m| m.1));
            self.log_ids(RecordKind::Remove, dlq, REMOVE_REDRIVEN);
        }
        Ok(n)
    }

    // -----------------------------------------------------------------------
    // The turn.
    // -----------------------------------------------------------------------

    /// Fires every timer due at `now`: ack deadlines, NACK delays, and ends
    /// of long-poll waits.
    pub fn advance(&mut self, now: Now, outbox: &mut impl Outbox) {
        let mut expired = std::mem::take(&mut self.expired);
        self.wheel.advance(now.mono_ms, &mut expired);
        let mut requeued: Vec<(TopicId, MsgId, u16)> = Vec::new();
        for (_, timer) in expired.drain(..) {
            match timer {
                Timer::Msg { topic, id } => {
                    let Some(e) = self.topics.by_id.get_mut(&topic) else { continue };
                    let mut timers = TopicTimers { wheel: &mut self.wheel, topic };
                    match e.topic.timer_fired(id, &mut timers) {
                        Some(Returned::Retry) => {
                            requeued.push((topic, id, e.topic.deliveries(id)));
                            touch(e, &mut self.touched);
                        }
                        Some(Returned::Dead(info)) => self.dead_letter(topic, id, info),
                        None => {}
                    }
                }
                Timer::Wait { waiter } => {
                    let Some(w) = self.waiters.try_remove(waiter) else { continue };
                    self.parked.remove(&w.conn);
                    if let Some(e) = self.topics.by_id.get_mut(&w.topic) {
                        e.waiters.retain(|k| *k != waiter);
                        if let Some(out) = outbox.out(w.conn) {
                            codec::MessagesWriter::begin(out, w.request_id, &e.topic.name, SESSION_VERSION).finish(out);
                        }
                    }
                    outbox.unblock(w.conn);
                }
            }
        }
        self.expired = expired;
        requeued.sort_unstable_by_key(|r| r.0);
        for chunk in requeued.chunk_by(|a, b| a.0 == b.0) {
            let entries: Vec<(MsgId, u16)> = chunk.iter().map(|r| (r.1, r.2)).collect();
            self.log_requeue(chunk[0].0, &entries);
        }
    }

    /// Ends a turn's work in one call: `write`, then `sync`. For callers
    /// that send no reply between the two (tests, the simulation).
    pub fn commit(&mut self, now: Now, outbox: &mut impl Outbox) -> TurnReport {
        let mut written = self.write(now);
        self.sync(&mut written, now, outbox)
    }

    /// The first half of a turn's end: a step of compaction (which may
    /// write and sync a restatement of its own and remove a segment, or
    /// append a slice of copies), then one `write` of every record the turn
    /// appended. On a full disk that write may drop the turn's produces and
    /// write the rest; `sync` answers them STORAGE. Its result is the proof
    /// the reactor's flush asks for: a reply that does not wait for the
    /// sync (an ACK, a delivery, an error) may leave once the records it
    /// depends on are written, never before. Nothing may be appended to the
    /// log until `sync`.
    pub fn write(&mut self, now: Now) -> Written {
        self.compact_step(now);
        let turn = self.log.write(self.sync_wanted());
        let syncs = turn.as_ref().is_ok_and(|t| t.syncs());
        Written { turn: Some(turn), syncs }
    }

    /// The second half: a slice of a removed segment's space is released
    /// (no reply waits on that, so it comes after the early flush), then
    /// the `fdatasync` (if the turn needs one); if the write or the sync
    /// failed, or the write dropped the produces, withdraws the turn's
    /// produced messages; then publishes this turn's messages and serves
    /// parked FETCHes; then releases the held replies (or answers STORAGE
    /// to the durable ones whose records were not committed: all of them
    /// if the commit failed, the produces alone if only they were dropped).
    /// Once per `write`; a second call does nothing.
    pub fn sync(&mut self, written: &mut Written, now: Now, outbox: &mut impl Outbox) -> TurnReport {
        let Some(turn) = written.turn.take() else { return TurnReport::default() };
        if let Err(e) = self.log.release_step() {
            log::warn!("compaction could not release a removed segment's space: {e}");
        }
        let mut report = TurnReport::default();
        let committed = turn.and_then(|t| self.log.sync(t));
        let stored = self.settle(committed, now, &mut report);
        if stored.records && self.stopping {
            // The last turn of a graceful stop: the log is whole, so the next
            // start may take any damage in it for corruption, not a crash.
            if let Err(e) = self.log.mark_clean_stop() {
                log::warn!(
                    "could not mark the commit log as stopped cleanly: {e}; the next start reads it as after a crash"
                );
            }
        }
        if !stored.produces {
            for (tid, first, count) in self.produced.drain(..) {
                if let Some(e) = self.topics.by_id.get_mut(&tid) {
                    e.topic.withdraw(first, count);
                }
            }
        }
        self.produced.clear();
        self.publish(now, outbox);
        self.release_held(stored, outbox, &mut report);
        report
    }

    /// What a commit's outcome means for compaction, and its log line
    /// (storage failures at a bounded rate). Says what the turn stored.
    fn settle(&mut self, committed: std::io::Result<Committed>, now: Now, report: &mut TurnReport) -> Stored {
        match committed {
            Ok(c) => {
                report.sync_nanos = c.synced.then_some(c.nanos);
                if c.withdrawn {
                    self.compactor.failed();
                    let n = self.produced.len();
                    let what = if n > 0 {
                        format!("PRODUCE answered STORAGE ({n} requests)")
                    } else {
                        "compaction's copies put off".into()
                    };
                    self.failures.failed(
                        now.mono_ms,
                        format_args!("the disk is full: {what}; the turn's acks and admin records were written"),
                    );
                } else if c.bytes > 0 {
                    self.failures.worked(now.mono_ms);
                }
                let last = self.log.segments().last().map_or(0, |s| s.base);
                self.compactor.committed(last);
                Stored { records: true, produces: !c.withdrawn }
            }
            Err(e) => {
                self.compactor.failed();
                let held = self.held.iter().filter(|h| h.durable).count();
                self.failures.failed(
                    now.mono_ms,
                    format_args!(
                        "commit log write/fdatasync failed: {e}; {held} held replies answered STORAGE, nothing acknowledged; will retry on later turns"
                    ),
                );
                Stored { records: false, produces: false }
            }
        }
    }

    /// Makes the turn's new ready messages visible and serves the parked
    /// FETCHes on their topics. The turn's messages reach their waiting
    /// consumers before the produces that made them are acknowledged: both
    /// go out in this turn's flush, and the consumer's is the one a
    /// message's end-to-end latency waits for (Redis serves its blocked
    /// readers first too).
    fn publish(&mut self, now: Now, outbox: &mut impl Outbox) {
        let touched = std::mem::take(&mut self.touched);
        let mut grown_bytes = 0;
        for &tid in &touched {
            self.publish_topic(tid, now, outbox, &mut grown_bytes);
        }
        self.touched = touched;
        self.touched.clear();
    }

    /// Moves the held replies to their connections (a durable one becomes
    /// STORAGE if its records were not stored), then the replies decided
    /// for other connections during the turn.
    fn release_held(&mut self, stored: Stored, outbox: &mut impl Outbox, report: &mut TurnReport) {
        for h in self.held.drain(..) {
            let Some(out) = outbox.out(h.conn) else { continue };
            let produce = h.op == op::PRODUCE;
            if h.durable && !(if produce { stored.produces } else { stored.records }) {
                let msg = if stored.records {
                    "the disk is full: produces are refused until space is freed; nothing was acknowledged, retry later"
                } else {
                    "the commit log could not write or sync; nothing was acknowledged, retry later"
                };
                codec::encode_error(out, h.op, h.request_id, ErrorCode::Storage, msg);
            } else {
                if h.op == op::PRODUCE && h.durable {
                    self.stats.produces_committed += 1;
                    report.produces_acked += 1;
                }
                out.extend_from_slice(&self.held_bytes[h.range]);
            }
        }
        self.held_bytes.clear();
        for r in self.pending_replies.drain(..) {
            match r {
                PendingReply::Error { conn, op, request_id, code, message } => {
                    if let Some(out) = outbox.out(conn) {
                        codec::encode_error(out, op, request_id, code, &message);
                    }
                    outbox.unblock(conn);
                }
            }
        }
    }

    /// Makes topic `tid`'s new messages ready and answers its parked
    /// FETCHes while messages are ready: with messages, or BUSY when the
    /// connections' buffers are full. `grown_bytes` counts the buffer
    /// capacity these answers added, which the count does not see until the
    /// reactor brings it up to date after the commit.
    fn publish_topic(&mut self, tid: TopicId, now: Now, outbox: &mut impl Outbox, grown_bytes: &mut u64) {
        let Some(e) = self.topics.by_id.get_mut(&tid) else { return };
        e.touched = false;
        e.topic.publish();
        while e.topic.has_ready() {
            let Some(key) = e.waiters.pop_front() else { break };
            let Some(w) = self.waiters.try_remove(key) else { continue };
            self.wheel.cancel(w.timer);
            self.parked.remove(&w.conn);
            if let Some(out) = outbox.out(w.conn) {
                let before = out.capacity();
                if self.stats.buffered_bytes + *grown_bytes >= self.config.limits.buffered_bytes_max {
                    self.stats.busy_replies += 1;
                    codec::encode_error(out, op::FETCH, w.request_id, ErrorCode::Busy, BUSY_MESSAGE);
                } else {
                    deliver(e, &mut self.wheel, &w, now, out);
                }
                *grown_bytes += out.capacity().saturating_sub(before) as u64;
            }
            outbox.unblock(w.conn);
        }
    }

    /// A connection closed: drop its parked FETCH and return every message
    /// in flight to it to ready (or to the dead-letter topic).
    pub fn disconnect(&mut self, conn: usize, session: &Session) {
        if let Some(key) = self.parked.remove(&conn)
            && let Some(w) = self.waiters.try_remove(key)
        {
            self.wheel.cancel(w.timer);
            if let Some(e) = self.topics.by_id.get_mut(&w.topic) {
                e.waiters.retain(|k| *k != key);
            }
        }
        self.held.retain(|h| h.conn != conn);
        for &tid in &session.fetched {
            let Some(e) = self.topics.by_id.get_mut(&tid) else { continue };
            let mut dead = Vec::new();
            let mut timers = TopicTimers { wheel: &mut self.wheel, topic: tid };
            let returned = e.topic.disconnect(session.consumer, &mut timers, |_, id, info| dead.push((id, info)));
            if returned > 0 {
                touch(e, &mut self.touched);
            }
            for (id, info) in dead {
                self.dead_letter(tid, id, info);
            }
        }
    }

    /// Graceful stop: every parked FETCH is answered now, with what is
    /// ready or with nothing, and the last commit syncs everything.
    pub fn shutdown(&mut self, now: Now, outbox: &mut impl Outbox) {
        self.stopping = true;
        let keys: Vec<usize> = self.waiters.iter().map(|(k, _)| k).collect();
        for key in keys {
            let w = self.waiters.remove(key);
            self.wheel.cancel(w.timer);
            self.parked.remove(&w.conn);
            if let Some(e) = self.topics.by_id.get_mut(&w.topic) {
                e.waiters.retain(|k| *k != key);
                if let Some(out) = outbox.out(w.conn) {
                    deliver(e, &mut self.wheel, &w, now, out);
                }
            }
            outbox.unblock(w.conn);
        }
    }

    fn write_stats(&self, only: &str, rid: u32, now: Now, out: &mut Vec<u8>) {
        let mut w = codec::StatsWriter::begin(out, rid);
        let s = &self.stats;
        let ls = &self.log.stats;
        w.section(out, "");
        for (k, v) in [
            ("uptime_ms", now.mono_ms.saturating_sub(s.started_mono_ms)),
            ("connections", s.connections),
            ("turns", s.turns),
            ("topics", self.topics.by_id.len() as u64),
            ("bytes_in", s.bytes_in),
            ("bytes_out", s.bytes_out),
            ("log_bytes", self.log.bytes()),
            ("log_segments", self.log.segments().len() as u64),
            ("fsyncs", ls.fsyncs),
            ("log_commits", ls.commits),
            ("log_records", ls.records),
            ("storage_failures", ls.failures),
            ("produces_committed", s.produces_committed),
            ("compactions", self.compactor.compactions),
            ("recovery_ms", s.recovery_ms),
            ("recovered_records", self.recovery.records),
            ("recovery_truncated_bytes", self.recovery.truncated_bytes),
            ("recovery_repaired_bytes", self.recovery.repaired_bytes),
            ("fsync_turn", u64::from(self.log.fsync_mode() == FsyncMode::Turn)),
            // The limits a client sizes its reply buffer and its pings by,
            // which the HELLO reply does not carry.
            ("output_bytes_max", self.config.limits.output_bytes_max.into()),
            ("fetch_bytes_max", self.config.limits.fetch_bytes_max.into()),
            ("idle_timeout_ms", self.config.limits.idle_timeout_ms.into()),
            ("buffered_bytes", s.buffered_bytes),
            ("busy_replies", s.busy_replies),
        ] {
            w.kv(out, k, v);
        }
        let mut names: Vec<&Entry> =
            self.topics.by_id.values().filter(|e| only.is_empty() || *e.topic.name == *only).collect();
        names.sort_unstable_by(|a, b| a.topic.name.cmp(&b.topic.name));
        for e in names {
            let t = &e.topic;
            let c = &t.counters;
            w.section(out, &t.name);
            for (k, v) in [
                ("ready", t.ready()),
                ("inflight", t.inflight()),
                ("delayed", t.delayed()),
                ("produced", c.produced),
                ("delivered", c.delivered),
                ("redelivered", c.redelivered),
                ("acked", c.acked),
                ("nacked", c.nacked),
                ("dead_lettered", c.dead_lettered),
                ("expired", c.expired),
                ("bytes", t.seq.live_bytes()),
                ("next_id", t.seq.next_id()),
                ("waiters", e.waiters.len() as u64),
                ("id", u64::from(e.id)),
            ] {
                w.kv(out, k, v);
            }
        }
        w.finish(out);
    }
}

/// The message of a BUSY reply.
const BUSY_MESSAGE: &str =
    "the broker's connection buffers are full (buffered_bytes_max); nothing was done: back off and retry";

/// Reasons in a Remove record (part of the log format).
const REMOVE_ACKED: u8 = 1;
const REMOVE_DEAD: u8 = 2;
const REMOVE_REDRIVEN: u8 = 3;

fn unknown(name: &str) -> (ErrorCode, String) {
    (ErrorCode::UnknownTopic, format!("no topic named {name}"))
}

fn touch(e: &mut Entry, touched: &mut Vec<TopicId>) {
    if !e.touched {
        e.touched = true;
        touched.push(e.id);
    }
}

/// Writes a FETCH reply for `w` from the ready messages of `e`.
fn deliver(e: &mut Entry, wheel: &mut Wheel<Timer>, w: &Waiter, now: Now, out: &mut Vec<u8>) {
    let timeout = if w.ack_timeout_ms == 0 { e.topic.settings.ack_timeout_ms } else { w.ack_timeout_ms };
    let deadline = now.mono_ms + u64::from(timeout);
    let mut writer = codec::MessagesWriter::begin(out, w.request_id, &e.topic.name, SESSION_VERSION);
    let mut timers = TopicTimers { wheel, topic: e.id };
    e.topic.fetch(w.consumer, w.max_messages, w.max_bytes, deadline, &mut timers, |t, d| {
        if let Some(m) = t.seq.get(d.id) {
            let msg = Message {
                id: d.id,
                born_ms: m.born_ms,
                delivery_count: d.deliveries,
                dead: t.dead_info(d.id),
                origin_group: "",
                props: codec::Props::EMPTY,
                payload: m.payload,
            };
            writer.push(out, &msg);
        }
    });
    writer.finish(out);
}

/// Appends one message to a Produce record body.
fn put_message_record(
    b: &mut Vec<u8>,
    id: MsgId,
    born_ms: u64,
    deliveries: u16,
    dead: Option<DeadInfo>,
    payload: &[u8],
) {
    codec::put_u64(b, id);
    codec::put_u64(b, born_ms);
    codec::put_u16(b, deliveries);
    match dead {
        None => b.push(0),
        Some(d) => {
            b.push(codec::MSG_FLAG_DEAD);
            codec::put_u64(b, d.origin_id);
            codec::put_u16(b, d.origin_deliveries);
            b.push(d.reason as u8);
        }
    }
    codec::put_u32(b, payload.len() as u32);
    b.extend_from_slice(payload);
}

/// Compares secrets in time independent of where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0
}
