//! The broker: applies requests to the topic queues, appends what changed to
//! the commit log, and at the end of each turn commits the log and sends
//! the replies that waited on it.
//!
//! It sits between the reactor and the plain data structures, as
//! CONVENTIONS.md asks: the reactor owns sockets and the clock and calls in
//! here with decoded frames and `now`; the queues, the wheel and the log
//! never call back. Replies are written into per-connection output buffers
//! that the reactor lends through `Outbox`.
//!
//! Split by the state each part owns:
//! - `topics`: the topic table (names, ids, the id floor, and the one
//!   function that names a dead-letter topic);
//! - `waiters`: the parked FETCHes, by connection and by (topic, group):
//!   the consumers waiting for messages;
//! - `turn`: what a turn keeps until its commit (held replies, the client
//!   produces a failed commit withdraws, the topics to publish) and the
//!   turn's steps after the requests (timers, write, sync, publish);
//! - `budget`: the turn's work budget, which bounds what its requests and
//!   its deliveries do, and the deliveries it puts off to the next turn;
//! - `dead_letter`: where messages go when their deliveries run out, and
//!   REDRIVE, which brings them back;
//! - `groups`: the consumer-group admin ops (protocol version 2) and the
//!   numbers a group shows;
//! - `requests`: one short function per op behind a thin match, and which
//!   requests wait for the sync (`Request::waits_for_sync`);
//! - `stats`: the counters, STATS and the metrics' view of the topics;
//! - `inspect`: LOOKUP and PEEK, which read a message's state in every
//!   group.
//!
//! Recovery (`replay.rs`) and compaction (`compactor.rs`) are siblings: they
//! read and change the topic table through its interface.
//!
//! The durability rule lives in `turn` and in the reactor's loop order: a
//! reply whose truth depends on the log (PRODUCE and the admin frames) is
//! *held* — encoded into a buffer of the turn's, not into the connection's
//! output — and only `sync`, after the log's write and `fdatasync`, moves it
//! out (or replaces it with a STORAGE error). Every other reply goes to the
//! output at once, but the reactor writes no output to a socket before the
//! turn's `write` (`Written`), so even those never leave before their
//! records. Produced messages stay invisible to consumers until then, so no
//! consumer sees a message that could vanish.

use std::path::Path;

use crate::codec::DecodeLimits;
use crate::compactor::Compactor;
use crate::failure_log::FailureLog;
use crate::filter_table::FilterTable;
use crate::log::{Log, LogOptions, OpenError, Opener, Recovery};
use crate::queue::{ConsumerId, GroupId, MsgId, Settings, Timers};
use crate::replay::Replay;
use crate::wheel::{TimerKey, Wheel};

mod ack_produce;
mod budget;
mod dead_letter;
pub(crate) mod dedup;
mod deliveries;
mod groups;
mod inspect;
mod replay_reader;
mod requests;
pub(crate) mod retain;
mod retry;
mod schedule;
mod stats;
mod subscriptions;
pub(crate) mod topics;
mod turn;
mod waiters;

pub use crate::record::TopicId;
pub use stats::{BrokerStats, GroupMetrics, LoopStats, TopicMetrics};
pub use turn::{TurnReport, Written};

use topics::Topics;
use turn::Turn;
use waiters::{WaiterKey, Waiters};

/// The broker's configuration (the limits, and the behaviour flags).
#[derive(Clone, Debug)]
pub struct Config {
    pub limits: crate::limits::Limits,
    /// PRODUCE and FETCH create a missing topic (`--no-auto-create` clears).
    pub auto_create: bool,
    /// Settings of topics created without their own.
    pub defaults: Settings,
    /// When set, HELLO must carry this token.
    pub auth_token: Option<Vec<u8>>,
    /// The highest protocol version HELLO negotiates: `codec::VERSION_MAX`.
    /// Tests of the version-2 features the broker serves already (message
    /// properties, on the default group) raise it to
    /// `codec::CODEC_VERSION_MAX`, until VERSION_MAX is raised once every
    /// version-2 op is served; it is no `runnel serve` flag.
    pub version_max: u16,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            limits: crate::limits::Limits::default(),
            auto_create: true,
            defaults: Settings::default(),
            auth_token: None,
            version_max: crate::codec::VERSION_MAX,
        }
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

/// A client connection, as the broker and `ConnState` know it: the
/// reactor's slab key (reused once the connection has closed, unlike a
/// `ConsumerId`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnKey(pub usize);

/// What the reactor should do with the connection after a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The reply is in the output buffer; go on.
    Done,
    /// The reply waits for this turn's sync. Only further held requests
    /// may be read from this connection this turn, so replies stay in order
    /// (`Broker::must_wait`).
    Held,
    /// A FETCH is parked: read nothing more until `Outbox::unblock`.
    Parked,
    /// Close the connection after flushing what is in its output.
    Close,
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
    /// The groups this connection has fetched from: where its in-flight
    /// messages can be, so a disconnect visits only those. It counts as a
    /// consumer of each (`Group::consumers`). Bounded by pruning the
    /// deleted ones (`Broker::prune_fetched`).
    pub fetched: Vec<(TopicId, GroupId)>,
    /// The protocol version HELLO negotiated (1 until then): the layout of
    /// every frame the connection sends and of every reply it gets.
    pub version: u16,
    /// Push subscriptions the connection has: while it has one, it waits
    /// for messages as a parked FETCH does, and is not idle.
    pub subscriptions: u32,
}

impl Session {
    /// A connection's session before its HELLO: version 1's layouts.
    pub fn new(consumer: ConsumerId) -> Session {
        Session { consumer, version: 1, ..Session::default() }
    }
}

/// Output buffers the broker may write to outside `handle` (replies to
/// parked FETCHes, held replies), lent by the reactor.
pub trait Outbox {
    /// The output buffer of `conn`, or None if it is closing.
    fn out(&mut self, conn: ConnKey) -> Option<&mut Vec<u8>>;
    /// `conn`'s parked FETCH was answered: resume reading it.
    fn unblock(&mut self, conn: ConnKey);
    /// Bytes the connections' buffers take (`LoopStats::buffered_bytes`):
    /// what parked FETCHes answered at the sync may add to. Callers with no
    /// connection buffers (tests) leave it at 0.
    fn buffered_bytes(&self) -> u64 {
        0
    }
    /// Whether `conn`'s output holds less than `pending_bytes_max` unread
    /// bytes, so that a push subscription's messages may go to it; if not,
    /// the lender serves `conn` again once it drains below. Callers that
    /// do not bound output (tests) leave it true.
    fn room_for_push(&mut self, _conn: ConnKey, _pending_bytes_max: usize) -> bool {
        true
    }
}

/// What a timer in the wheel stands for.
#[derive(Clone, Copy, Debug)]
enum Timer {
    /// An ack deadline or a NACK delay of a message, for a group.
    Msg { topic: TopicId, group: GroupId, id: MsgId },
    /// The end of a parked FETCH's wait.
    Wait { waiter: WaiterKey },
    /// The earliest scheduled message of a topic is due.
    Due { topic: TopicId },
}

/// One group's view of the wheel: the timers `queue::Group` arms name it.
struct GroupTimers<'a> {
    wheel: &'a mut Wheel<Timer>,
    topic: TopicId,
    group: GroupId,
}

impl Timers for GroupTimers<'_> {
    fn arm(&mut self, deadline_ms: u64, id: MsgId) -> TimerKey {
        self.wheel.insert(deadline_ms, Timer::Msg { topic: self.topic, group: self.group, id })
    }
    fn disarm(&mut self, key: TimerKey) {
        self.wheel.cancel(key);
    }
}

/// Lists reused from request to request, so that serving one allocates
/// nothing.
#[derive(Default)]
struct Scratch {
    /// Ids an ACK, NACK or TOUCH did, or that a Remove record names.
    done_ids: Vec<u64>,
    /// Ids it could not do.
    failed_ids: Vec<u64>,
    /// The timers that fired this turn.
    expired: Vec<(u64, Timer)>,
    /// Ids delivered by the reply or pushed batch at hand, for its Deliver
    /// record (`deliveries.rs`).
    delivered: Vec<MsgId>,
}

/// Topics whose sweep is under way (`Topic::sweep`): a few slices run
/// each turn.
#[derive(Default)]
struct Sweeps(Vec<TopicId>);

impl Sweeps {
    fn note(&mut self, tid: TopicId) {
        if !self.0.contains(&tid) {
            self.0.push(tid);
        }
    }
}

/// The broker.
pub struct Broker {
    config: Config,
    decode_limits: DecodeLimits,
    /// The topics and their queues.
    topics: Topics,
    /// Parked FETCHes.
    waiters: Waiters,
    /// Push subscriptions (version 3).
    subs: subscriptions::Subscriptions,
    /// What the turn keeps until its commit.
    turn: Turn,
    /// What the turn's requests, and its deliveries, may still do.
    budget: budget::Budget,
    /// Ack deadlines, NACK delays and the ends of parked FETCHes' waits.
    wheel: Wheel<Timer>,
    log: Log,
    /// Cleans the log's oldest segments.
    compactor: Compactor,
    /// Storage failures, logged at a bounded rate.
    failures: FailureLog,
    scratch: Scratch,
    /// Topics releasing, in slices, what no group needs any more.
    sweeps: Sweeps,
    /// The timer of each topic with scheduled messages.
    due_timers: schedule::DueTimers,
    /// Every topic's dedup window (protocol version 4).
    dedup: dedup::Dedup,
    /// Groups reading retained messages back from the log files.
    replays: replay_reader::Replays,
    /// The groups' compiled tag filters, one per text, and their budget.
    filters: FilterTable,
    pub stats: BrokerStats,
    /// What recovery found at start.
    pub recovery: Recovery,
}

impl Broker {
    /// Opens the data directory, recovers every topic from the log, and
    /// returns a broker ready for its first turn.
    pub fn open(config: Config, dir: &Path, log_options: LogOptions, now: Now) -> Result<Broker, OpenError> {
        let opener = crate::log::opener_for(log_options.fsync);
        Broker::open_with(config, dir, log_options, opener, now)
    }

    /// `open` with a custom segment opener (tests inject storage failures).
    pub fn open_with(
        config: Config,
        dir: &Path,
        log_options: LogOptions,
        opener: Opener,
        now: Now,
    ) -> Result<Broker, OpenError> {
        // The log's bound on what it keeps for a failing disk, and the room
        // produces leave on a full one, are the broker's limits, as the
        // user set them.
        let (unwritten_records_bytes_max, produce_headroom_bytes) =
            (config.limits.unwritten_records_bytes_max, config.limits.produce_headroom_bytes);
        let log_options = LogOptions { unwritten_records_bytes_max, produce_headroom_bytes, ..log_options };
        let mut topics = Topics::default();
        topics.set_key_bounds(&config.limits);
        let mut compactor = Compactor::default();
        let mut dedup = dedup::Dedup::default();
        let window_ms_max = u64::from(config.limits.dedup_window_ms_max);
        let mut filters = FilterTable::default();
        let mut replay = Replay::new(&mut topics, &mut compactor)
            .at_wall_ms(now.wall_ms)
            .with_dedup(&mut dedup, window_ms_max)
            .with_filters(&mut filters);
        let (log, recovery) = Log::open_replaying(dir, log_options, opener, &mut replay)?;
        let fell_due = replay.finish();
        let mut broker = Broker::assemble(config, topics, compactor, log, recovery, now);
        broker.filters = filters;
        broker.restore_dedup(dedup, now);
        broker.resume_replays();
        // What came due while the broker was down is ready now; the first
        // turn writes that, so that no later restart makes it ready again
        // for a group that has acked it since.
        for (topic, ids) in &fell_due {
            crate::record::ScheduledRecord { topic: *topic, ids }
                .append(crate::record::RecordKind::Due, &mut broker.log);
        }
        broker.arm_all_due(now);
        broker.arm_restored_delays(now);
        broker.dead_letter_exhausted();
        Ok(broker)
    }

    /// A broker whose log keeps nothing (`runnel serve --memory-only`): it
    /// starts empty, reads and writes no file, and everything it holds is
    /// lost with the process.
    pub fn in_memory(config: Config, now: Now) -> Broker {
        Broker::assemble(config, Topics::default(), Compactor::default(), Log::in_memory(), Recovery::default(), now)
    }

    /// A broker over `log`, holding what was recovered from it.
    fn assemble(
        config: Config,
        topics: Topics,
        compactor: Compactor,
        log: Log,
        recovery: Recovery,
        now: Now,
    ) -> Broker {
        let decode_limits = DecodeLimits::from(&config.limits);
        let budget = budget::Budget::new(&config.limits);
        let mut topics = topics;
        topics.set_key_bounds(&config.limits);
        Broker {
            config,
            decode_limits,
            topics,
            waiters: Waiters::default(),
            subs: subscriptions::Subscriptions::default(),
            turn: Turn::default(),
            budget,
            wheel: Wheel::new(now.mono_ms),
            log,
            compactor,
            failures: FailureLog::default(),
            scratch: Scratch::default(),
            sweeps: Sweeps::default(),
            due_timers: schedule::DueTimers::default(),
            dedup: dedup::Dedup::default(),
            replays: replay_reader::Replays::default(),
            filters: FilterTable::default(),
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
    /// The earliest time a timer may fire or a paced replay may read, for
    /// the poll timeout.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        match (self.wheel.next_deadline_ms(), self.replays.next_read_ms()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
    /// Segments removed by compaction.
    pub fn compactions(&self) -> u64 {
        self.compactor.compactions
    }
    /// Number of topics (dead-letter topics included).
    pub fn topic_count(&self) -> usize {
        self.topics.len()
    }
    /// Whether background work (compaction), or deliveries the last
    /// turn's budget put off, want another turn soon.
    pub fn busy(&self) -> bool {
        self.compactor.busy()
            || self.log.releasing()
            || !self.sweeps.0.is_empty()
            || self.replays.busy()
            || self.deliveries_deferred()
    }
    /// Whether the connections' buffers, `buffered_bytes` of them, are at
    /// `buffered_bytes_max`. While they are, requests with large replies
    /// are answered BUSY and the connections that hold the most are not
    /// read.
    pub fn buffers_full(&self, buffered_bytes: u64) -> bool {
        buffered_bytes >= self.config.limits.buffered_bytes_max
    }

    /// A connection closed: drop its parked FETCH and its held replies, and
    /// return every message in flight to it to ready (or to the
    /// dead-letter topic).
    pub fn disconnect(&mut self, conn: ConnKey, session: &Session) {
        // Ending a connection can dead-letter what it held: never between
        // the turn's write and its sync (the reactor ends a connection whose
        // socket failed in the early flush only after the sync).
        self.turn.assert_open("a connection ended");
        if let Some(w) = self.waiters.leave(conn) {
            self.wheel.cancel(w.timer);
        }
        self.turn.forget(conn);
        self.end_subscriptions(conn);
        for &(tid, group) in &session.fetched {
            self.leave_group(tid, group, session.consumer);
        }
    }

    /// Drops from `session.fetched` the groups (and topics) deleted since
    /// the connection fetched from them, each time the list reaches a power
    /// of two from 64 on. Topic and group ids are never reused, so a stale
    /// entry names nothing; the live ones are at most `topics_max` x
    /// `groups_per_topic_max` (a broadcast member is one of its topic's
    /// groups), so the list stays under twice that however many topics
    /// and groups come and go in a connection's life.
    fn prune_fetched(&self, session: &mut Session) {
        let n = session.fetched.len();
        if n < 64 || !n.is_power_of_two() {
            return;
        }
        session.fetched.retain(|&(tid, g)| self.topics.get(tid).is_some_and(|e| e.topic.group(g).is_some()));
    }

    /// Consumer `c` becomes a consumer of group `group` of `tid` (its first
    /// FETCH or SUBSCRIBE of it): its disconnect visits the group.
    fn join(&mut self, session: &mut Session, tid: TopicId, group: GroupId) {
        if !session.fetched.contains(&(tid, group)) {
            self.prune_fetched(session);
            session.fetched.push((tid, group));
            if let Some(e) = self.topics.get_mut(tid) {
                e.topic.join(group);
            }
        }
    }

    /// Consumer `c` leaves group `group` of `tid` (its connection closed,
    /// or it unsubscribed): everything in flight to it returns to ready or
    /// goes to the dead-letter topic. Returns how many messages it held.
    fn leave_group(&mut self, tid: TopicId, group: GroupId, c: ConsumerId) -> u64 {
        let Some(e) = self.topics.get_mut(tid) else { return 0 };
        let mut dead = Vec::new();
        let mut timers = GroupTimers { wheel: &mut self.wheel, topic: tid, group };
        e.topic.leave(group);
        let returned = e.topic.disconnect(group, c, &mut timers, |id, info| dead.push((id, info)));
        if !returned.is_empty() {
            self.turn.mark_for_publish(e);
        }
        let held = (returned.len() + dead.len()) as u64;
        // Logged as a timeout's return is: a restart that met only the
        // Deliver would take a message whose count reached a
        // max_deliveries lowered since for one the crash cut (replay.rs,
        // `GroupReplay::cut`) and dead-letter it.
        if !group.is_member() {
            self.log_returned(tid, group, &returned, &[]);
        }
        for (id, info) in dead {
            self.dead_letter(tid, group, id, info);
        }
        // A broadcast member leaves with its connection, and with it its
        // position and what it held.
        if group.is_member()
            && let Some(e) = self.topics.get_mut(tid)
        {
            let mut timers = GroupTimers { wheel: &mut self.wheel, topic: tid, group };
            e.topic.leave_member(group, c, &mut timers);
            self.sweeps.note(tid);
        }
        held
    }
}
