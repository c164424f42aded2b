//! Requests: one short function per op behind a thin match (`serve`), and
//! the one place that says which replies wait for the turn's sync
//! (`Request::waits_for_sync`).
//!
//! A request that waits is served into the turn's held buffer (`hold`):
//! its reply leaves only after the sync that makes its records durable, or
//! becomes STORAGE. Every other reply goes to the connection's output at
//! once (the reactor still writes none before the turn's `write`).

use super::budget::Budget;
use super::subscriptions::SubscribeArgs;
use super::topics::{Entry, dead_letter_name, unknown, unknown_group};
use super::waiters::Waiter;
use super::{
    Broker, ConnKey, GroupTimers, LoopStats, Now, Outcome, Session, Timer, TopicId, dedup, retry, schedule, stats,
};
use crate::codec::group::Start;
use crate::codec::props::PROP_ORIGIN_GROUP;
use crate::codec::{
    self, Batch, DecodeError, ErrorCode, Frame, Ids, Message, Request, Skip, TopicOptions, TopicSettings, op,
};
use crate::queue::{Body, ConsumerId, Group, GroupConfig, GroupId, MsgId, Seq, Settings, TagSetId, Take, Topic};
use crate::record::{MessageRecord, ProduceWriter, PurgeRecord, RemoveReason, RemoveRecord, RequeueRecord};
use crate::wheel::{TimerKey, Wheel};

/// An error reply: its code and its message.
pub(super) type Refusal = (ErrorCode, String);

/// Frames that are not a successful HELLO (failed HELLOs and any other
/// frame before one) after which a connection is closed, when the broker
/// requires a token.
const AUTH_FAILURES_MAX: u32 = 3;

impl Request<'_> {
    /// Whether the reply to this request waits for the turn's sync: it says
    /// something the log must hold first (a produce was stored, a topic was
    /// created, deleted or purged, messages were moved). Every op is named,
    /// so a new one must say.
    pub fn waits_for_sync(&self) -> bool {
        match self {
            Request::Produce { .. }
            | Request::CreateTopic { .. }
            | Request::DeleteTopic { .. }
            | Request::PurgeTopic { .. }
            | Request::Redrive { .. } => true,
            Request::Hello { .. }
            | Request::Ping
            | Request::Fetch { .. }
            | Request::Ack { .. }
            | Request::Nack { .. }
            | Request::Touch { .. }
            | Request::Stats { .. }
            | Request::ListTopics
            | Request::ListGroups { .. } => false,
            // A subscription's replies promise nothing the log holds (as
            // FETCH's); its pushes go out as deliveries do.
            Request::Subscribe { .. } | Request::Credit { .. } | Request::Unsubscribe { .. } => false,
            // Group changes are log records the reply promises, as a
            // topic's are.
            Request::CreateGroup { .. } | Request::DeleteGroup { .. } | Request::ResetGroup { .. } => true,
            // A cancelled or moved schedule is a promise, as a produce is.
            Request::Cancel { .. } | Request::Reschedule { .. } => true,
            // It produces: its reply says the messages are stored.
            Request::AckProduce { .. } => true,
            // They read, and change nothing.
            Request::Lookup { .. } | Request::Peek { .. } => false,
        }
    }
}

/// Where and when a request is served.
#[derive(Clone, Copy)]
struct At<'a> {
    conn: ConnKey,
    request_id: u32,
    now: Now,
    /// The loop's counters (STATS shows them; the buffers' total decides
    /// BUSY).
    loops: &'a LoopStats,
}

impl Broker {
    /// Serves one request from connection `conn`. Its reply goes to `out`,
    /// or, for a request that waits for the sync, is held until it.
    /// `loops` are the loop's counters, as they stand.
    pub fn handle(
        &mut self,
        conn: ConnKey,
        session: &mut Session,
        frame: &Frame<'_>,
        now: Now,
        loops: &LoopStats,
        out: &mut Vec<u8>,
    ) -> Outcome {
        self.turn.assert_open("a request served");
        if !session.hello {
            return self.before_hello(session, frame, out);
        }
        // What the request did counts in the turn's work budget: its
        // items, and the bytes of its reply, held or not.
        let replied = out.len() + self.turn.held_len();
        let outcome = self.handle_hello_done(conn, session, frame, (now, loops), out);
        let (items, bytes) = self.request_work(&frame.request);
        let reply_bytes = (out.len() + self.turn.held_len()).saturating_sub(replied) as u64;
        self.budget.spend(items, bytes + reply_bytes);
        outcome
    }

    /// `handle`, for a session that has said HELLO.
    fn handle_hello_done(
        &mut self,
        conn: ConnKey,
        session: &mut Session,
        frame: &Frame<'_>,
        (now, loops): (Now, &LoopStats),
        out: &mut Vec<u8>,
    ) -> Outcome {
        let (req, op) = (&frame.request, frame.request.op());
        let at = At { conn, request_id: frame.request_id, now, loops };
        if !req.waits_for_sync() {
            return self.serve(session, req, at, out).unwrap_or_else(|(code, msg)| {
                codec::encode_error(out, op, at.request_id, code, &msg);
                Outcome::Done
            });
        }
        let after_write = matches!(req, Request::Produce { flags, .. } if flags & codec::PRODUCE_FLAG_WRITTEN != 0);
        self.hold(conn, (op, at.request_id), after_write, |b, held| match b.serve(session, req, at, held) {
            Ok(outcome) => {
                assert_eq!(outcome, Outcome::Held, "a request that waits for the sync is held");
                true
            }
            Err((code, msg)) => {
                codec::encode_error(held, op, at.request_id, code, &msg);
                false
            }
        });
        Outcome::Held
    }

    /// The thin match: one function per op.
    fn serve(
        &mut self,
        session: &mut Session,
        req: &Request<'_>,
        at: At<'_>,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, Refusal> {
        let rid = at.request_id;
        match *req {
            Request::Hello { .. } => Ok(self.hello_again(session, req, rid, out)),
            Request::Ping => {
                codec::encode_empty_reply(out, op::PING, rid);
                Ok(Outcome::Done)
            }
            Request::Fetch { topic, group, max_messages, max_bytes, wait_ms, ack_timeout_ms } => {
                let args = FetchArgs { max_messages, max_bytes, wait_ms, ack_timeout_ms };
                self.fetch(session, (topic, group), args, at, out)
            }
            Request::Ack { topic, group, ids } => self.ack((topic, group, session.consumer), ids, rid, out),
            Request::Touch { topic, group, ack_timeout_ms, ids } => {
                self.touch((topic, group, session.consumer), ack_timeout_ms, ids, at, out)
            }
            Request::Nack { topic, group, delay_ms, flags, ids, reason } => {
                self.nack((topic, group, session.consumer), (delay_ms, flags, reason), ids, at, out)
            }
            Request::Stats { topic } => self.stats(topic, session.version, at, out),
            Request::ListTopics => self.list_topics(at, out),
            Request::Produce { topic, batch, .. } => self.produce(topic, batch, at, out),
            Request::CreateTopic { topic, settings: s, options: o } => self.create_topic(topic, (s, o), rid, out),
            Request::DeleteTopic { topic } => self.delete_topic(topic, rid, out),
            Request::PurgeTopic { topic } => self.purge_topic(topic, rid, out),
            Request::Redrive { topic, group, max_messages } => {
                let moved = self.redrive(topic, group, max_messages)?;
                codec::encode_u64_reply(out, op::REDRIVE, rid, moved);
                Ok(Outcome::Held)
            }
            // Version-2 ops: the codec refuses them in a version-1 session.
            Request::CreateGroup { topic, group, settings, start } => {
                self.create_group_op((topic, group), &settings, start, rid, out)?;
                Ok(Outcome::Held)
            }
            Request::DeleteGroup { topic, group } => {
                self.delete_group_op(topic, group, rid, out)?;
                Ok(Outcome::Held)
            }
            Request::ResetGroup { topic, group, start } => {
                self.reset_group_op((topic, group), start, rid, out)?;
                Ok(Outcome::Held)
            }
            Request::ListGroups { topic } => {
                // Its reply grows with the topic's groups, as LIST_TOPICS's.
                if self.buffers_full(at.loops.buffered_bytes) {
                    return Err(self.busy_refusal());
                }
                self.list_groups_op(topic, session.version, rid, at.now, out)?;
                Ok(Outcome::Done)
            }
            // Version-3 ops: the codec refuses them in an earlier session.
            Request::Subscribe { topic, group, credit, ack_timeout_ms } => {
                let args = SubscribeArgs { topic, group, credit, ack_timeout_ms };
                self.subscribe(at.conn, session, args, rid, out)?;
                Ok(Outcome::Done)
            }
            Request::Credit { subscription, credit } => {
                self.credit(at.conn, (subscription, credit), rid, out)?;
                Ok(Outcome::Done)
            }
            Request::Unsubscribe { subscription } => {
                self.unsubscribe(at.conn, session, subscription, rid, out)?;
                Ok(Outcome::Done)
            }
            Request::Cancel { topic, id } => self.cancel_op(topic, id, rid, out).map(|()| Outcome::Held),
            Request::Reschedule { topic, id, when } => {
                self.reschedule_op((topic, id), when, at.now, rid, out).map(|()| Outcome::Held)
            }
            Request::Lookup { .. } | Request::Peek { .. } => self.inspect_op(req, (at.now, rid, session.version), out),
            Request::AckProduce { topic, group, ids, outputs } => self
                .ack_produce((topic, group, session.consumer), ids, outputs, (rid, at.now), out)
                .map(|()| Outcome::Held),
        }
    }

    // -----------------------------------------------------------------------
    // HELLO, and what comes before it.
    // -----------------------------------------------------------------------

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
        let version = max_version.min(self.config.version_max);
        if version < min_version.max(codec::VERSION_MIN) {
            let msg = format!("this broker speaks versions {}..={}", codec::VERSION_MIN, self.config.version_max);
            codec::encode_error(out, op::HELLO, rid, ErrorCode::Version, &msg);
            return self.failed_before_hello(session);
        }
        session.hello = true;
        session.auth_failures = 0;
        session.version = version;
        codec::encode_hello_reply(out, rid, version, &self.decode_limits, codec::MAP_EPOCH_UNSHARDED);
        Outcome::Done
    }

    /// A repeated HELLO negotiates afresh: if it fails, the connection is
    /// back to "HELLO required".
    fn hello_again(&mut self, session: &mut Session, req: &Request<'_>, rid: u32, out: &mut Vec<u8>) -> Outcome {
        session.hello = false;
        session.version = codec::VERSION_MIN;
        self.before_hello(session, &Frame { request_id: rid, request: *req }, out)
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

    /// The group of topic `tid` named `name` that consumer `c`'s request
    /// acts on (version 1 names none: the default group, `""`); in a
    /// broadcast group, `c`'s member, which a FETCH (`create`) makes. A
    /// FETCH makes a missing group, at the earliest message retained: the
    /// default group always, a named one unless `--no-auto-create`. Another
    /// request naming a missing default group (or a broadcast group it is
    /// no member of) acts on none: its ids fail; one naming a missing named
    /// group is UNKNOWN_GROUP.
    pub(super) fn group_of(
        &mut self,
        tid: TopicId,
        name: &str,
        create: bool,
        c: ConsumerId,
    ) -> Result<GroupId, Refusal> {
        let Some(e) = self.topics.get_mut(tid) else {
            return Err((ErrorCode::UnknownTopic, "no such topic".into()));
        };
        if let Some(g) = e.topic.group_named(name).map(Group::id) {
            let member = if create { e.topic.join_member(g, c) } else { e.topic.member(g, c) };
            return Ok(member.unwrap_or(GroupId::NONE));
        }
        if create && (name.is_empty() || self.config.auto_create) {
            return self.create_group(tid, name, GroupConfig::default(), Start::Earliest);
        }
        let Some(e) = self.topics.get(tid) else { return Err(unknown_group("", name)) };
        if name.is_empty() {
            return Ok(GroupId::DEFAULT);
        }
        Err(unknown_group(&e.topic.name, name))
    }

    /// Creates group `name` of topic `tid` reading from `start`, and logs
    /// it (the Topic record with the next group id, then the Group record).
    /// TOO_MANY_GROUPS past `groups_per_topic_max`. The default group (the
    /// empty name) has id 0.
    pub(super) fn create_group(
        &mut self,
        tid: TopicId,
        name: &str,
        config: GroupConfig,
        start: Start,
    ) -> Result<GroupId, Refusal> {
        let max = self.config.limits.groups_per_topic_max;
        let Some(e) = self.topics.get_mut(tid) else { return Err((ErrorCode::UnknownTopic, "no such topic".into())) };
        let t = &mut e.topic;
        if t.groups().count() >= max as usize {
            let msg = format!("topic {} has groups_per_topic_max ({max}) groups", t.name);
            return Err((ErrorCode::TooManyGroups, msg));
        }
        // A broadcast group needs nothing itself: its members do, each from
        // the tail on.
        let broadcast = config.broadcast;
        let (cursor, replay) = if broadcast { (MsgId::MAX, false) } else { self.start_cursor(tid, start) };
        let Some(e) = self.topics.get_mut(tid) else { return Err((ErrorCode::UnknownTopic, "no such topic".into())) };
        let t = &mut e.topic;
        let g = if name.is_empty() {
            t.insert_group(Group::with(GroupId::DEFAULT, "", config, cursor));
            GroupId::DEFAULT
        } else {
            t.add_group(name, config, cursor)
        };
        self.sweeps.note(tid);
        self.log_topic(tid);
        self.log_group(tid, g);
        if replay {
            self.begin_replay(tid, g, cursor, start);
        }
        Ok(g)
    }

    /// Appends a Group record stating group `g` of `tid` as it is now.
    pub(super) fn log_group(&mut self, tid: TopicId, g: GroupId) {
        let Some(group) = self.topics.get(tid).and_then(|e| e.topic.group(g)) else { return };
        crate::compactor::group_record(tid, group).append(&mut self.log);
        self.compactor.note_group(tid, g);
    }

    /// The BUSY error, counted: a request with a large reply came while
    /// the buffers were full, and nothing was done.
    fn busy_refusal(&mut self) -> Refusal {
        self.stats.busy_replies += 1;
        (ErrorCode::Busy, stats::BUSY_MESSAGE.into())
    }

    /// The BUSY error, counted, for a FETCH that would need a timer when
    /// the broker holds `timers_max`: nothing was done.
    fn timers_full(&mut self) -> Refusal {
        self.stats.busy_replies += 1;
        let max = self.config.limits.timers_max;
        let msg = format!(
            "the broker holds timers_max ({max}) messages in flight or delayed and parked FETCHes; nothing was done: ack what you hold, or back off and retry"
        );
        (ErrorCode::Busy, msg)
    }

    // -----------------------------------------------------------------------
    // Consumers.
    // -----------------------------------------------------------------------
    /// FETCH: delivers what is ready, or parks until something is (or the
    /// wait ends).
    fn fetch(
        &mut self,
        session: &mut Session,
        (topic, group): (&str, &str),
        args: FetchArgs,
        at: At<'_>,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, Refusal> {
        if args.max_messages == 0 {
            return Err((ErrorCode::BadArgument, "max_messages must be at least 1".into()));
        }
        let tid = self.topic_for(topic, self.config.auto_create)?;
        let group = self.group_of(tid, group, true, session.consumer)?;
        self.join(session, tid, group);
        let w = args.waiter(at, session, tid, group, &self.config.limits);
        let full = self.buffers_full(at.loops.buffered_bytes);
        let timers_max = self.config.limits.timers_max;
        let Some(e) = self.topics.get_mut(tid) else { return Err(unknown(topic)) };
        let ready = e.topic.has_ready(group);
        if full && ready {
            return Err(self.busy_refusal());
        }
        // Each delivery and a parked FETCH take a timer.
        if timer_room(timers_max, &self.wheel) == 0 && (ready || args.wait_ms > 0) {
            return Err(self.timers_full());
        }
        if args.wait_ms == 0 || ready {
            let room = delivery_room(&self.budget, timers_max, &self.wheel);
            let n = deliver(e, &mut self.wheel, &w, at.now, room, (out, &mut self.scratch.delivered));
            // Its reply's bytes count with every reply's, in `handle`.
            self.budget.spend(u64::from(n), 0);
            self.log_delivered(tid, group);
            return Ok(Outcome::Done);
        }
        let wait_ms = args.wait_ms.min(self.config.limits.fetch_wait_ms_max);
        let timer =
            self.wheel.insert(at.now.mono_ms + u64::from(wait_ms), Timer::Wait { waiter: self.waiters.vacant_key() });
        self.waiters.park(Waiter { timer, ..w });
        Ok(Outcome::Parked)
    }

    /// ACK: the group is done with each id.
    fn ack(
        &mut self,
        (topic, group, c): (&str, &str, ConsumerId),
        ids: Ids<'_>,
        rid: u32,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, Refusal> {
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        let group = self.group_of(tid, group, false, c)?;
        self.ids_op(tid, group, ids, |t, id, timers| t.ack(group, id, timers));
        // A broadcast member's state is not logged: it ends with its
        // connection.
        if !self.scratch.done_ids.is_empty() && !group.is_member() {
            let ids = &self.scratch.done_ids;
            RemoveRecord { topic: tid, group, reason: RemoveReason::Acked, ids }.append(&mut self.log);
            self.compactor.note_group(tid, group);
            self.credit_freed(tid, group);
        }
        self.ids_reply(op::ACK, rid, out);
        Ok(Outcome::Done)
    }

    /// TOUCH: each id's ack deadline counts again from now.
    fn touch(
        &mut self,
        (topic, group, c): (&str, &str, ConsumerId),
        ack_timeout_ms: u32,
        ids: Ids<'_>,
        at: At<'_>,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, Refusal> {
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        let group = self.group_of(tid, group, false, c)?;
        // The deadline counts from this turn's clock (the wheel's own time
        // is the last turn's, which may be long ago).
        self.ids_op(tid, group, ids, |t, id, timers| {
            let timeout = t.ack_timeout_ms(group, ack_timeout_ms);
            t.touch(group, id, at.now.mono_ms + u64::from(timeout), timers)
        });
        self.ids_reply(op::TOUCH, at.request_id, out);
        Ok(Outcome::Done)
    }

    /// Applies `f` to each id, sorting them into done and failed.
    fn ids_op(
        &mut self,
        tid: TopicId,
        group: GroupId,
        ids: Ids<'_>,
        mut f: impl FnMut(&mut Topic, MsgId, &mut GroupTimers<'_>) -> bool,
    ) {
        self.scratch.done_ids.clear();
        self.scratch.failed_ids.clear();
        let Some(e) = self.topics.get_mut(tid) else { return };
        let mut timers = GroupTimers { wheel: &mut self.wheel, topic: tid, group };
        for id in ids.iter() {
            let list = if f(&mut e.topic, id, &mut timers) {
                &mut self.scratch.done_ids
            } else {
                &mut self.scratch.failed_ids
            };
            list.push(id);
        }
    }

    /// The ids reply of ACK, NACK and TOUCH, from what `ids_op` sorted.
    fn ids_reply(&self, op: u8, rid: u32, out: &mut Vec<u8>) {
        codec::encode_ids_reply(out, op, rid, self.scratch.done_ids.len() as u32, &self.scratch.failed_ids);
    }

    /// NACK: each id goes back to ready (now or after a delay), or to the
    /// dead-letter topic; a reason is kept with each (`retry.rs`).
    fn nack(
        &mut self,
        (topic, group, c): (&str, &str, ConsumerId),
        (delay_ms, flags, reason): (u32, u8, &str),
        ids: Ids<'_>,
        at: At<'_>,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, Refusal> {
        retry::check_nack_reason(reason, &self.config.limits)?;
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        let group = self.group_of(tid, group, false, c)?;
        let dead_letter = flags & codec::NACK_FLAG_DEAD_LETTER != 0;
        let mut back = retry::Returns::default();
        self.ids_op(tid, group, ids, |t, id, timers| {
            retry::nack_one(t, (group, id), (delay_ms, dead_letter), at.now, timers, &mut back)
        });
        if !back.requeued.is_empty()
            && let Some(e) = self.topics.get_mut(tid)
        {
            self.turn.mark_for_publish(e);
        }
        self.ids_reply(op::NACK, at.request_id, out);
        if !self.scratch.done_ids.is_empty() {
            self.credit_freed(tid, group);
        }
        if !group.is_member() {
            self.log_returned(tid, group, &back.requeued, &back.delayed);
        }
        self.log_waits(&mut back.waits.iter().map(|w| (tid, group, w.0, w.1, w.2)).collect::<Vec<_>>());
        self.keep_nack_reasons(tid, group, &back, reason);
        for (id, info) in back.dead {
            self.dead_letter_nacked(tid, group, id, info, reason);
        }
        Ok(Outcome::Done)
    }

    /// Appends the records of messages back in group `group` after a
    /// failed delivery: ready now (Requeue), or delayed (Delay).
    pub(super) fn log_returned(
        &mut self,
        tid: TopicId,
        group: GroupId,
        requeued: &[(MsgId, u16)],
        delayed: &[(MsgId, u16, u64)],
    ) {
        if !requeued.is_empty() {
            RequeueRecord { topic: tid, group, entries: requeued }.append(&mut self.log);
            self.compactor.note_group(tid, group);
        }
        if !delayed.is_empty() {
            crate::record::DelayRecord { topic: tid, group, retry: false, entries: delayed }.append(&mut self.log);
            self.compactor.note_group(tid, group);
        }
    }

    // -----------------------------------------------------------------------
    // Producers and admin: their replies wait for the sync.
    // -----------------------------------------------------------------------

    /// PRODUCE: stores the batch with its messages' properties (the codec
    /// validated them), invisible until the sync; QUEUE_FULL if the topic
    /// has no room for it, or for the tag sets it brings.
    fn produce(&mut self, topic: &str, batch: Batch<'_>, at: At<'_>, out: &mut Vec<u8>) -> Result<Outcome, Refusal> {
        dedup::check_ids(&batch, &self.config.limits)?;
        let tid = self.topic_for(topic, self.config.auto_create)?;
        let Some(e) = self.topics.get_mut(tid) else { return Err(unknown(topic)) };
        let t = &mut e.topic;
        let l = &self.config.limits;
        let window_ms = dedup::window_ms(&t.settings, &self.config.defaults, l);
        let plan = self.dedup.plan(tid, &batch, (t.seq.next_id(), at.now.wall_ms, window_ms), l)?;
        room_for(t, u64::from(plan.count), plan.bytes, l)?;
        self.check_schedules(&batch, at.now)?;
        let Some(e) = self.topics.get_mut(tid) else { return Err(unknown(topic)) };
        let t = &mut e.topic;
        let tag_sets = intern_batch(&mut t.seq, &batch, self.config.limits.tag_sets_per_topic_max)?;
        let first = t.seq.next_id();
        let mut w = ProduceWriter::begin(&mut self.log, tid);
        let (mut buf, mut scheduled) = (Vec::new(), false);
        for (i, (props, payload)) in batch.messages().enumerate() {
            let tag_set = tag_sets.get(i).copied().flatten();
            if plan.duplicate(i) {
                t.seq.untake_tags(tag_set);
                continue;
            }
            let (props, due) = schedule::stored_props(props, at.now.wall_ms, &mut buf);
            let (id, born_ms) = t.produce(at.now.wall_ms, Body { props, tag_set, payload });
            if let Some(dedup_id) = props.dedup_id().filter(|_| window_ms > 0) {
                self.dedup.insert(tid, dedup_id, id, born_ms);
                self.compactor.note_dedup(tid);
            }
            if let Some(due) = due {
                t.schedule(id, due);
                scheduled = true;
            }
            w.push(&mut self.log, &MessageRecord { id, born_ms, deliveries: 0, dead: None, props, payload });
            self.compactor.note_client_produce(tid, id);
        }
        // If the commit fails, this record goes (the produce is answered
        // STORAGE and withdrawn); the turn's others stay.
        w.end_withdrawable(&mut self.log);
        if plan.count > 0 {
            self.turn.produced(tid, first, plan.count);
            self.turn.mark_for_publish(e);
        }
        if scheduled {
            self.arm_due(tid, at.now);
        }
        let first_id = if plan.count > 0 { first } else { 0 };
        codec::encode_dedup_produce_reply(out, at.request_id, first_id, plan.count, &plan.duplicates);
        Ok(Outcome::Held)
    }

    /// CREATE_TOPIC: creates the topic, or changes an existing one's
    /// settings (0 = the broker's default).
    fn create_topic(
        &mut self,
        topic: &str,
        (settings, options): (TopicSettings, TopicOptions),
        rid: u32,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, Refusal> {
        let max = self.config.limits.dedup_window_ms_max;
        if let Some(ms) = options.dedup_window_ms.filter(|&ms| ms > max) {
            let msg = format!("dedup_window_ms {ms} is more than dedup_window_ms_max ({max})");
            return Err((ErrorCode::BadArgument, msg));
        }
        self.check_retention(&options)?;
        let exists = self.topics.id(topic);
        let tid = match exists {
            Some(tid) => tid,
            None => self.topics.create(topic, self.config.defaults, self.config.limits.topics_max)?,
        };
        let d = self.config.defaults;
        if let Some(e) = self.topics.get_mut(tid) {
            // A window the request does not name stays as it is (a new
            // topic has the broker's default).
            let window = options.dedup_window_ms.or(e.topic.settings.dedup_window_ms);
            let retention = super::retain::retention_of(&options, e.topic.settings.retention);
            e.topic.settings = Settings {
                ack_timeout_ms: if settings.ack_timeout_ms == 0 { d.ack_timeout_ms } else { settings.ack_timeout_ms },
                max_deliveries: if settings.max_deliveries == 0 { d.max_deliveries } else { settings.max_deliveries },
                dedup_window_ms: window,
                retention,
            };
        }
        self.log_topic(tid);
        codec::encode_u64_reply(out, op::CREATE_TOPIC, rid, u64::from(exists.is_none()));
        Ok(Outcome::Held)
    }

    /// DELETE_TOPIC: the topic and its messages go; its parked FETCHes are
    /// answered UNKNOWN_TOPIC at the commit.
    fn delete_topic(&mut self, topic: &str, rid: u32, out: &mut Vec<u8>) -> Result<Outcome, Refusal> {
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        let removed = self.delete(tid);
        codec::encode_u64_reply(out, op::DELETE_TOPIC, rid, removed);
        Ok(Outcome::Held)
    }

    /// PURGE_TOPIC: every unacknowledged message goes.
    fn purge_topic(&mut self, topic: &str, rid: u32, out: &mut Vec<u8>) -> Result<Outcome, Refusal> {
        let tid = self.topics.id(topic).ok_or_else(|| unknown(topic))?;
        let Some(e) = self.topics.get_mut(tid) else { return Err(unknown(topic)) };
        let mut timers = GroupTimers { wheel: &mut self.wheel, topic: tid, group: GroupId::DEFAULT };
        let removed = e.topic.purge(&mut timers);
        let below_id = e.topic.seq.next_id();
        PurgeRecord { topic: tid, below_id }.append(&mut self.log);
        self.compactor.retained.purged(tid, below_id);
        self.compactor.nudge();
        codec::encode_u64_reply(out, op::PURGE_TOPIC, rid, removed);
        Ok(Outcome::Held)
    }

    // -----------------------------------------------------------------------
    // STATS and LIST_TOPICS.
    // -----------------------------------------------------------------------

    fn stats(&mut self, topic: &str, version: u16, at: At<'_>, out: &mut Vec<u8>) -> Result<Outcome, Refusal> {
        if !topic.is_empty() && self.topics.id(topic).is_none() {
            return Err(unknown(topic));
        }
        // One topic's section is small; every topic's grows with them.
        if topic.is_empty() && self.buffers_full(at.loops.buffered_bytes) {
            return Err(self.busy_refusal());
        }
        self.write_stats(topic, version, at.request_id, at.now, at.loops, out);
        Ok(Outcome::Done)
    }

    fn list_topics(&mut self, at: At<'_>, out: &mut Vec<u8>) -> Result<Outcome, Refusal> {
        if self.buffers_full(at.loops.buffered_bytes) {
            return Err(self.busy_refusal());
        }
        let list: Vec<(&str, TopicSettings)> = self
            .topics
            .sorted("")
            .into_iter()
            .map(|e| {
                let s = e.topic.settings;
                (&*e.topic.name, TopicSettings { ack_timeout_ms: s.ack_timeout_ms, max_deliveries: s.max_deliveries })
            })
            .collect();
        codec::encode_topics_reply(out, at.request_id, &list);
        Ok(Outcome::Done)
    }

    // -----------------------------------------------------------------------
    // The topic table's changes, logged.
    // -----------------------------------------------------------------------

    /// The topic named `name`, created with default settings if missing and
    /// `create` allows.
    pub(super) fn topic_for(&mut self, name: &str, create: bool) -> Result<TopicId, Refusal> {
        if let Some(tid) = self.topics.id(name) {
            return Ok(tid);
        }
        if !create {
            return Err(unknown(name));
        }
        let tid = self.topics.create(name, self.config.defaults, self.config.limits.topics_max)?;
        self.log_topic(tid);
        Ok(tid)
    }

    /// Appends a Topic record stating `tid`'s name, settings and next id.
    pub(super) fn log_topic(&mut self, tid: TopicId) {
        if let Some(r) = self.topics.record(tid) {
            r.append(&mut self.log);
            self.compactor.note_topic(tid);
        }
    }

    /// Deletes topic `tid`; returns how many messages it held.
    fn delete(&mut self, tid: TopicId) -> u64 {
        let Some(mut e) = self.topics.remove(tid) else { return 0 };
        let mut timers = GroupTimers { wheel: &mut self.wheel, topic: tid, group: GroupId::DEFAULT };
        let removed = e.topic.purge(&mut timers);
        crate::record::DeleteRecord { topic: tid, next_id: e.topic.seq.next_id() }.append(&mut self.log);
        self.compactor.note_delete();
        self.compactor.forget_topic(tid);
        self.compactor.nudge();
        self.turn.forget_topic(tid);
        self.dedup.forget_topic(tid);
        self.replays.stop_topic(tid);
        for w in self.waiters.drain_topic(tid) {
            self.wheel.cancel(w.timer);
            let message = format!("topic {} was deleted", e.topic.name);
            self.turn.answer_later(w.conn, w.request_id, ErrorCode::UnknownTopic, message);
        }
        removed
    }

    /// The name of `tid`'s dead-letter topic.
    pub(super) fn dead_letter_name_of(&self, tid: TopicId) -> Option<String> {
        self.topics.get(tid).map(|e| dead_letter_name(&e.topic.name))
    }
}

/// QUEUE_FULL unless topic `t` has room for `count` more messages of
/// `bytes` payload bytes in all.
pub(super) fn room_for(t: &Topic, count: u64, bytes: u64, l: &crate::limits::Limits) -> Result<(), Refusal> {
    if t.seq.live() + count <= l.topic_messages_max && t.seq.live_bytes() + bytes <= l.topic_bytes_max {
        return Ok(());
    }
    Err((
        ErrorCode::QueueFull,
        format!(
            "topic {} holds {} messages / {} bytes; limits are topic_messages_max {} and topic_bytes_max {}",
            t.name,
            t.seq.live(),
            t.seq.live_bytes(),
            l.topic_messages_max,
            l.topic_bytes_max
        ),
    ))
}

/// The tag sets of `batch`'s messages in `seq`'s table, a reference taken
/// for each (`Seq::intern_tags`; empty for a batch without properties), or
/// QUEUE_FULL, with none taken, if the sets it brings pass
/// `tag_sets_per_topic_max`.
pub(super) fn intern_batch(seq: &mut Seq, batch: &Batch<'_>, max: u32) -> Result<Vec<Option<TagSetId>>, Refusal> {
    // A version-1 batch has no properties: not even a scan of it.
    if !batch.with_props || !batch.messages().any(|(props, _)| !props.is_empty()) {
        return Ok(Vec::new());
    }
    let mut sets = Vec::with_capacity(batch.count as usize);
    for (props, _) in batch.messages() {
        match seq.intern_tags(&props, max) {
            Ok(set) => sets.push(set),
            Err(full) => {
                sets.into_iter().for_each(|set| seq.untake_tags(set));
                let message = format!(
                    "the topic's messages have {} distinct sets of tags, the most tag_sets_per_topic_max allows",
                    full.max
                );
                return Err((ErrorCode::QueueFull, message));
            }
        }
    }
    Ok(sets)
}

/// What a FETCH asks for.
#[derive(Clone, Copy)]
struct FetchArgs {
    max_messages: u32,
    max_bytes: u32,
    wait_ms: u32,
    ack_timeout_ms: u32,
}

impl FetchArgs {
    /// The FETCH as a waiter (its limits clamped to the broker's), whether
    /// it parks or is answered now.
    fn waiter(
        &self,
        at: At<'_>,
        session: &Session,
        topic: TopicId,
        group: GroupId,
        l: &crate::limits::Limits,
    ) -> Waiter {
        let max_bytes = if self.max_bytes == 0 { l.fetch_bytes_max } else { self.max_bytes.min(l.fetch_bytes_max) };
        Waiter {
            conn: at.conn,
            consumer: session.consumer,
            request_id: at.request_id,
            version: session.version,
            topic,
            group,
            max_messages: self.max_messages.min(l.batch_messages_max),
            max_bytes: u64::from(max_bytes),
            ack_timeout_ms: self.ack_timeout_ms,
            timer: TimerKey::NONE,
        }
    }
}

/// Timers the wheel has room for under `timers_max`.
pub(super) fn timer_room(timers_max: u32, wheel: &Wheel<Timer>) -> u32 {
    timers_max.saturating_sub(u32::try_from(wheel.len()).unwrap_or(u32::MAX))
}

/// The most messages, and bytes of them, a delivery may take now: what
/// the turn's work budget has left (`Budget::room`), and no more messages
/// than the wheel has timers for (`timers_max`).
pub(super) fn delivery_room(budget: &Budget, timers_max: u32, wheel: &Wheel<Timer>) -> (u32, u64) {
    let (messages, bytes) = budget.room();
    (messages.min(timer_room(timers_max, wheel)), bytes)
}

/// Writes a FETCH reply for `w` from the ready messages of `e`: as many as
/// it asks for and `room` allows (messages, bytes: `delivery_room`). The
/// ids delivered are added to `delivered` (for their Deliver record).
/// Returns how many it delivered.
pub(super) fn deliver(
    e: &mut Entry,
    wheel: &mut Wheel<Timer>,
    w: &Waiter,
    now: Now,
    room: (u32, u64),
    (out, delivered): (&mut Vec<u8>, &mut Vec<MsgId>),
) -> u32 {
    let timeout = e.topic.ack_timeout_ms(w.group, w.ack_timeout_ms);
    let deadline = now.mono_ms + u64::from(timeout);
    let (max_messages, max_bytes) = (w.max_messages.min(room.0), w.max_bytes.min(room.1));
    let mut writer = codec::MessagesWriter::begin(out, w.request_id, &e.topic.name, w.version);
    let take = Take { owner: w.consumer, max_messages, max_bytes, deadline_ms: deadline };
    let n = write_taken(e, wheel, w.group, take, &mut writer, (out, delivered));
    writer.finish(out);
    n
}

/// Takes what `take` says from group `group`'s ready messages into flight
/// and appends each to `writer`'s frame (a FETCH reply or a pushed frame),
/// and its id to `delivered`. Returns how many it took.
pub(super) fn write_taken(
    e: &mut Entry,
    wheel: &mut Wheel<Timer>,
    group: GroupId,
    take: Take,
    writer: &mut codec::MessagesWriter,
    (out, delivered): (&mut Vec<u8>, &mut Vec<MsgId>),
) -> u32 {
    let before = delivered.len();
    let mut timers = GroupTimers { wheel, topic: e.id, group };
    e.topic.fetch(group, take, &mut timers, |seq, d| {
        delivered.push(d.id);
        if let Some(m) = seq.get(d.id) {
            let dead = seq.dead_info(d.id);
            let msg = Message {
                id: d.id,
                born_ms: m.born_ms,
                delivery_count: d.deliveries,
                dead,
                origin_group: m.props.broker_entry(PROP_ORIGIN_GROUP).unwrap_or(""),
                props: m.props.public(),
                payload: m.payload,
            };
            writer.push(out, &msg);
        }
    });
    (delivered.len() - before) as u32
}

/// Compares secrets in time independent of where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0
}
