//! The turn: what the broker keeps from its requests until the commit, and
//! the steps of a turn that follow them (the reactor's loop order, steps 4
//! to 7: timers, write, sync, publish, held replies).
//!
//! `Turn` owns the held replies — their bytes, and which connections hold
//! one, which is what decides that a connection reads no further this turn
//! (`Broker::must_wait`) — the replies to other connections decided during
//! the turn, the client produces a failed commit withdraws, and the topics
//! whose new messages are published at the sync.

use std::collections::HashSet;
use std::hash::BuildHasherDefault;
use std::ops::Range;
use std::time::Instant;

use super::{Broker, ConnKey, Now, Outbox, Timer, TopicId, stats};
use crate::codec::{self, ErrorCode, Request, op};
use crate::log::{Committed, FsyncMode, WrittenTurn};
use crate::metrics::{Phase, PhaseNanos};
use crate::queue::{GroupId, IdHasher, MsgId};
use crate::record::RequeueRecord;

/// A reply waiting for the commit.
#[derive(Clone, Debug)]
struct Held {
    conn: ConnKey,
    op: u8,
    request_id: u32,
    /// The reply if the commit succeeds, in `Turn::held_bytes`.
    range: Range<usize>,
    /// Whether it depends on the commit (an error reply does not).
    durable: bool,
    /// It may leave once the turn's records are written, before the sync
    /// (a PRODUCE with `PRODUCE_FLAG_WRITTEN`).
    after_write: bool,
}

/// A reply to a connection that is not the one being served, sent at
/// commit (in request order with the held replies).
#[derive(Clone, Debug)]
enum PendingReply {
    /// A parked FETCH whose topic was deleted.
    Error { conn: ConnKey, op: u8, request_id: u32, code: ErrorCode, message: String },
}

/// What a turn keeps until its commit.
#[derive(Default)]
pub(super) struct Turn {
    /// Replies waiting for this turn's commit, in request order.
    held: Vec<Held>,
    /// The bytes of the held replies.
    held_bytes: Vec<u8>,
    /// The connections with a held reply: each reads no further requests
    /// this turn but held ones.
    holders: HashSet<ConnKey, BuildHasherDefault<IdHasher>>,
    /// Replies to parked connections decided during the turn.
    pending: Vec<PendingReply>,
    /// Client produces of this turn, (topic, first id, count): withdrawn
    /// if the commit fails.
    produced: Vec<(TopicId, MsgId, u32)>,
    /// Topics to publish, and whose waiters to serve, at the sync.
    to_publish: Vec<TopicId>,
    /// Shutting down: the last commit syncs whatever it writes.
    stopping: bool,
    /// Between the turn's `write` and its `sync`: nothing may change the
    /// queues or append to the log then.
    written: bool,
    /// Compaction's own work this turn (its calls on the log's files
    /// left out: the log times those), ns.
    compact_nanos: u64,
    /// Deliver records appended since the turn's write: the publish's,
    /// which `Broker::write_published` writes before the flush.
    pub(super) delivered_records: u32,
}

impl Turn {
    /// Holds the reply that `handle` encoded at `start..` of `held_bytes`.
    fn hold(&mut self, conn: ConnKey, op: u8, request_id: u32, start: usize, (durable, after_write): (bool, bool)) {
        // Pipelined produces come from one connection: one insert for them.
        if self.held.last().is_none_or(|h| h.conn != conn) {
            self.holders.insert(conn);
        }
        let range = start..self.held_bytes.len();
        self.held.push(Held { conn, op, request_id, range, durable, after_write });
    }

    /// Bytes of the replies held so far this turn.
    pub fn held_len(&self) -> usize {
        self.held_bytes.len()
    }

    /// Whether `conn` has a reply held for this turn's commit.
    pub fn holds(&self, conn: ConnKey) -> bool {
        !self.holders.is_empty() && self.holders.contains(&conn)
    }

    /// `conn` closed: its held replies go nowhere.
    pub fn forget(&mut self, conn: ConnKey) {
        if self.holders.remove(&conn) {
            self.held.retain(|h| h.conn != conn);
        }
    }

    /// A client produce of `count` messages from `first` went into `topic`.
    pub fn produced(&mut self, topic: TopicId, first: MsgId, count: u32) {
        self.produced.push((topic, first, count));
    }

    /// `topic` is deleted: nothing of it is withdrawn or published.
    pub fn forget_topic(&mut self, topic: TopicId) {
        self.produced.retain(|p| p.0 != topic);
    }

    /// A parked FETCH on a deleted topic is answered with an error at the
    /// commit.
    pub fn answer_later(&mut self, conn: ConnKey, request_id: u32, code: ErrorCode, message: String) {
        self.pending.push(PendingReply::Error { conn, op: op::FETCH, request_id, code, message });
    }

    /// Marks topic `e` for publishing at the sync (its new or returned
    /// messages become ready, and its waiters are served), once a turn.
    pub fn mark_for_publish(&mut self, e: &mut super::topics::Entry) {
        if !e.to_publish {
            e.to_publish = true;
            self.to_publish.push(e.id);
        }
    }

    /// Asserts that the turn is not between its `write` and its `sync`,
    /// where nothing may append to the log or change what a held reply
    /// says.
    pub fn assert_open(&self, what: &str) {
        assert!(!self.written, "{what} between the turn's write and its sync");
    }

    /// Whether this turn's commit must fdatasync: something waits on it (a
    /// held reply that depends on it, or the last turn). Compaction needs
    /// no sync of the turn: it syncs its copies with its restatement
    /// (`Log::commit_ahead`) before it removes a segment.
    fn sync_wanted(&self) -> bool {
        self.held.iter().any(|h| h.durable) || self.stopping
    }
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
    /// PRODUCE replies sent (acknowledged) this turn.
    pub produces_acked: u64,
    /// Nanoseconds the write and fdatasync took, if the turn synced.
    pub sync_nanos: Option<u64>,
    /// How long the turn's phases that can stall it took: the calls on
    /// the log's files and compaction's work.
    pub phases: PhaseNanos,
}

impl Broker {
    /// Whether request `req` from `conn` must wait for the next turn: the
    /// connection has a held reply and this request would not be held
    /// (its reply would overtake the held one), or the turn's work budget
    /// is spent and the request can do more than a little (`budget.rs`).
    /// A frame the decoder refused (`None`) is only answered: it waits
    /// for the first reason alone.
    pub fn must_wait(&self, conn: ConnKey, req: Option<&Request<'_>>) -> bool {
        (req.is_none_or(|r| !r.waits_for_sync()) && self.turn.holds(conn))
            || req.is_some_and(|r| self.budget.spent() && !r.light())
    }

    /// Whether this turn, as served so far, ends with an `fdatasync`: a
    /// reply waits on it and the log syncs its turns. The reactor then
    /// reads once more before the write, so that requests which arrived
    /// meanwhile share the sync.
    pub fn turn_will_sync(&self) -> bool {
        self.turn.sync_wanted() && !self.log.memory_only() && self.log.fsync_mode() == FsyncMode::Turn
    }

    /// Holds a reply `handle` encoded into the turn's buffer with `encode`
    /// (which says whether it depends on the commit) until the sync, or
    /// only until the write if `after_write`.
    pub(super) fn hold(
        &mut self,
        conn: ConnKey,
        (op, request_id): (u8, u32),
        after_write: bool,
        encode: impl FnOnce(&mut Self, &mut Vec<u8>) -> bool,
    ) {
        let mut bytes = std::mem::take(&mut self.turn.held_bytes);
        let start = bytes.len();
        let durable = encode(self, &mut bytes);
        self.turn.held_bytes = bytes;
        self.turn.hold(conn, op, request_id, start, (durable, after_write));
    }

    /// Between `write` and the early flush: the held replies of produces
    /// that asked to be acknowledged once written (`PRODUCE_FLAG_WRITTEN`)
    /// go to their connections now, if the write stored the turn's
    /// produces, so that they leave before the sync. One behind another
    /// held reply of its connection waits with it, so replies stay in
    /// request order. If the write failed, or dropped the produces on a
    /// full disk, they wait for `sync`, which answers them STORAGE. Their
    /// messages still become visible only at the sync. Returns how many
    /// PRODUCEs it acknowledged.
    pub fn send_written(&mut self, written: &Written, outbox: &mut impl Outbox) -> u64 {
        let Some(Ok(t)) = &written.turn else { return 0 };
        if t.withdrawn() || !self.turn.held.iter().any(|h| h.after_write) {
            return 0;
        }
        let mut acked = 0;
        let mut waiting: Vec<ConnKey> = Vec::new();
        for h in std::mem::take(&mut self.turn.held) {
            if h.after_write && !waiting.contains(&h.conn) {
                if let Some(out) = outbox.out(h.conn) {
                    out.extend_from_slice(&self.turn.held_bytes[h.range]);
                    self.stats.produces_committed += u64::from(h.durable);
                    acked += u64::from(h.durable && h.op == op::PRODUCE);
                }
                continue;
            }
            if !waiting.contains(&h.conn) {
                waiting.push(h.conn);
            }
            self.turn.held.push(h);
        }
        acked
    }

    /// Step 4: fires every timer due at `now`: ack deadlines, NACK delays,
    /// and ends of long-poll waits.
    pub fn advance(&mut self, now: Now, outbox: &mut impl Outbox) {
        self.turn.assert_open("timers fired");
        let mut expired = std::mem::take(&mut self.scratch.expired);
        self.wheel.advance(now.mono_ms, &mut expired);
        let mut requeued: Vec<(TopicId, GroupId, MsgId, u16)> = Vec::new();
        let mut waits = Vec::new();
        for (_, timer) in expired.drain(..) {
            match timer {
                Timer::Msg { topic, group, id } => {
                    self.msg_timer_fired((topic, group, id), now, &mut requeued, &mut waits);
                }
                Timer::Wait { waiter } => self.wait_over(waiter, outbox),
                Timer::Due { topic } => self.due_fired(topic, now),
            }
        }
        self.scratch.expired = expired;
        requeued.sort_unstable_by_key(|r| (r.0, r.1.0));
        // A broadcast member's state is not logged.
        requeued.retain(|r| !r.1.is_member());
        for chunk in requeued.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            let entries: Vec<(MsgId, u16)> = chunk.iter().map(|r| (r.2, r.3)).collect();
            RequeueRecord { topic: chunk[0].0, group: chunk[0].1, entries: &entries }.append(&mut self.log);
            self.compactor.note_group(chunk[0].0, chunk[0].1);
        }
        self.log_waits(&mut waits);
        self.sweep();
        self.expire_dedup(now);
        if self.replays.any() {
            self.replay_step(now.mono_ms);
        }
    }

    /// A slice of each pending sweep: releases messages no group needs any
    /// more (after a group was created, deleted or moved).
    fn sweep(&mut self) {
        let (topics, compactor) = (&mut self.topics, &mut self.compactor);
        self.sweeps.0.retain(|tid| {
            let Some(e) = topics.get_mut(*tid) else { return false };
            e.topic.sweep();
            if e.topic.sweeping() {
                return true;
            }
            // Segments whose messages it released may be dead now.
            compactor.nudge();
            false
        });
    }

    /// A parked FETCH's wait is over: it is answered with no message.
    fn wait_over(&mut self, waiter: super::WaiterKey, outbox: &mut impl Outbox) {
        let Some(w) = self.waiters.take(waiter) else { return };
        if let Some(e) = self.topics.get(w.topic)
            && let Some(out) = outbox.out(w.conn)
        {
            codec::MessagesWriter::begin(out, w.request_id, &e.topic.name, w.version).finish(out);
        }
        outbox.unblock(w.conn);
    }

    /// Ends a turn's work in one call: `write`, then `sync`. For callers
    /// that send no reply between the two (tests).
    pub fn commit(&mut self, now: Now, outbox: &mut impl Outbox) -> TurnReport {
        let mut written = self.write(now);
        let _ = self.send_written(&written, outbox);
        self.sync(&mut written, now, outbox)
    }

    /// Step 5, the first half of a turn's end: a step of compaction (which
    /// may write and sync a restatement of its own and remove a segment, or
    /// append a slice of copies), then one `write` of every record the turn
    /// appended. On a full disk that write may drop the turn's produces and
    /// write the rest; `sync` answers them STORAGE. Its result is the proof
    /// the reactor's flush asks for: a reply that does not wait for the
    /// sync (an ACK, a delivery, an error) may leave once the records it
    /// depends on are written, never before. Nothing may be appended to the
    /// log until `sync`.
    pub fn write(&mut self, now: Now) -> Written {
        self.turn.assert_open("a second write");
        self.turn.written = true;
        // This write covers the Deliver records appended so far.
        self.turn.delivered_records = 0;
        // A memory-only log has nothing to compact.
        if !self.log.memory_only() {
            let in_files = self.log.phases().total();
            let started = Instant::now();
            self.compactor.step((&self.topics, &self.dedup), &mut self.log, &mut self.failures, now);
            let step_nanos = started.elapsed().as_nanos() as u64;
            self.turn.compact_nanos = step_nanos.saturating_sub(self.log.phases().total() - in_files);
        }
        let turn = self.log.write(self.turn.sync_wanted());
        let syncs = turn.as_ref().is_ok_and(|t| t.syncs());
        Written { turn: Some(turn), syncs }
    }

    /// Step 7, the second half: the `fdatasync` (if the turn needs one);
    /// if the write
    /// or the sync failed, or the write dropped the produces, withdraws the
    /// turn's produced messages; then publishes this turn's messages and
    /// serves parked FETCHes; then sends the held replies (or STORAGE to
    /// the durable ones whose records were not committed: all of them if
    /// the commit failed, the produces alone if only they were dropped).
    /// Once per `write`; a second call does nothing.
    pub fn sync(&mut self, written: &mut Written, now: Now, outbox: &mut impl Outbox) -> TurnReport {
        let Some(turn) = written.turn.take() else { return TurnReport::default() };
        assert!(self.turn.written, "a sync without its write");
        self.turn.written = false;
        let mut report = TurnReport::default();
        let committed = turn.and_then(|t| self.log.sync(t));
        let stored = self.settle(committed, now, &mut report);
        if stored.records && self.turn.stopping {
            // The last turn of a graceful stop: the log is whole, so the next
            // start may take any damage in it for corruption, not a crash.
            if let Err(e) = self.log.mark_clean_stop() {
                log::warn!(
                    "could not mark the commit log as stopped cleanly: {e}; the next start reads it as after a crash"
                );
            }
        }
        let produced = std::mem::take(&mut self.turn.produced);
        if !stored.produces {
            for &(tid, first, count) in &produced {
                if let Some(e) = self.topics.get_mut(tid) {
                    e.topic.withdraw(first, count);
                }
                self.dedup.withdraw(tid, first);
            }
        }
        self.turn.produced = produced;
        self.turn.produced.clear();
        // The deliveries at the sync have a budget of their own, so that
        // the turn's requests cannot starve them, nor they the requests.
        self.budget.refill();
        self.publish(now, outbox);
        self.write_published();
        self.send_held(stored, outbox, &mut report);
        self.budget.refill();
        report.phases = self.log.take_phases();
        report.phases.add(Phase::Compact, std::mem::take(&mut self.turn.compact_nanos));
        let t = &self.turn;
        assert!(t.held.is_empty() && t.holders.is_empty() && t.pending.is_empty(), "replies kept past the sync");
        assert!(t.produced.is_empty() && t.to_publish.is_empty(), "produces kept past the sync");
        report
    }

    /// What a commit's outcome means for compaction, and its log line
    /// (storage failures at a bounded rate). Says what the turn stored.
    fn settle(&mut self, committed: std::io::Result<Committed>, now: Now, report: &mut TurnReport) -> Stored {
        match committed {
            Ok(c) => {
                report.sync_nanos = c.synced.then_some(c.nanos);
                if c.withdrawn || c.copies_withdrawn {
                    self.compactor.withdrawn(c.withdrawn, c.copies_withdrawn);
                    let n = self.turn.produced.len();
                    let what = match (c.withdrawn, c.copies_withdrawn) {
                        (true, false) => format!("PRODUCE answered STORAGE ({n} requests)"),
                        (true, true) => format!("PRODUCE answered STORAGE ({n} requests), compaction's copies put off"),
                        (false, _) => "compaction's copies put off".into(),
                    };
                    self.failures.failed(
                        now.mono_ms,
                        format_args!("the disk is full: {what}; the turn's acks and admin records were written"),
                    );
                } else if c.bytes > 0 {
                    self.failures.worked(now.mono_ms);
                }
                if self.log.memory_only() {
                    self.compactor.discarded();
                } else {
                    let last = self.log.segments().last().map_or(0, |s| s.base);
                    self.compactor.committed(last);
                    self.compactor.retained.note_turn(&mut self.log, now.wall_ms);
                }
                Stored { records: true, produces: !c.withdrawn }
            }
            Err(e) => {
                self.compactor.failed();
                if self.log.take_unwritten_dropped() {
                    self.compactor.dropped();
                }
                let held = self.turn.held.iter().filter(|h| h.durable).count();
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
    /// The groups an earlier sync's budget put off go first, in the order
    /// they were put off (`budget.rs`).
    fn publish(&mut self, now: Now, outbox: &mut impl Outbox) {
        let to_publish = std::mem::take(&mut self.turn.to_publish);
        let mut grown_bytes = 0;
        self.push_held_back(now, outbox, &mut grown_bytes);
        // The groups left when the budget runs out stay where they are.
        while !self.budget.spent() {
            let Some((tid, group)) = self.budget.next_deferred() else { break };
            self.serve_group(tid, group, now, outbox, &mut grown_bytes);
        }
        for &tid in &to_publish {
            self.publish_topic(tid, now, outbox, &mut grown_bytes);
        }
        self.turn.to_publish = to_publish;
        self.turn.to_publish.clear();
    }

    /// Makes topic `tid`'s new messages ready and answers its parked
    /// FETCHes while messages are ready: with messages, or BUSY when the
    /// connections' buffers are full; then pushes to its subscribers. `grown_bytes` counts the buffer
    /// capacity these answers added, which the count does not see until the
    /// reactor brings it up to date after the commit.
    fn publish_topic(&mut self, tid: TopicId, now: Now, outbox: &mut impl Outbox, grown_bytes: &mut u64) {
        let Some(e) = self.topics.get_mut(tid) else { return };
        e.to_publish = false;
        e.topic.publish();
        // The waiters of each group the topic has (a broadcast group's
        // members included), in creation order.
        let mut i = 0;
        while let Some(group) = self.topics.get(tid).and_then(|e| e.topic.group_id_at(i)) {
            i += 1;
            self.serve_group(tid, group, now, outbox, grown_bytes);
        }
    }

    /// Answers group `group`'s parked FETCHes, then pushes to its
    /// subscribers, while the deliveries' budget lasts: a group it does not
    /// reach, or leaves with messages ready, is put off to the next sync
    /// (which finds out whether it still has any: asking here would cost
    /// as much for every group put off as serving it).
    fn serve_group(&mut self, tid: TopicId, group: GroupId, now: Now, outbox: &mut impl Outbox, grown: &mut u64) {
        let (waiting, subscribed) = (self.waiters.waiting(tid, group) > 0, self.subs.any(tid, group));
        if !waiting && !subscribed {
            return;
        }
        if self.budget.spent() {
            self.budget.defer(tid, group);
            return;
        }
        if waiting {
            self.serve_waiters(tid, group, now, outbox, grown);
        }
        if subscribed {
            self.push_ready(tid, group, now, outbox, grown);
        }
    }

    /// Answers group `group`'s parked FETCHes, oldest first, while it has
    /// messages ready and the deliveries' budget lasts (what it stops
    /// short of is put off to the next sync).
    fn serve_waiters(
        &mut self,
        tid: TopicId,
        group: GroupId,
        now: Now,
        outbox: &mut impl Outbox,
        grown_bytes: &mut u64,
    ) {
        let Some(e) = self.topics.get_mut(tid) else { return };
        let buffered_bytes = outbox.buffered_bytes();
        while e.topic.has_ready(group) {
            if self.budget.spent() {
                self.budget.defer(tid, group);
                break;
            }
            let Some(w) = self.waiters.next(tid, group) else { break };
            self.wheel.cancel(w.timer);
            if let Some(out) = outbox.out(w.conn) {
                let (before, len) = (out.capacity(), out.len());
                if buffered_bytes + *grown_bytes >= self.config.limits.buffered_bytes_max {
                    self.stats.busy_replies += 1;
                    codec::encode_error(out, op::FETCH, w.request_id, ErrorCode::Busy, stats::BUSY_MESSAGE);
                } else {
                    let room = super::requests::delivery_room(&self.budget, self.config.limits.timers_max, &self.wheel);
                    let delivered = &mut self.scratch.delivered;
                    let n = super::requests::deliver(e, &mut self.wheel, &w, now, room, (out, delivered));
                    self.budget.spend(u64::from(n), (out.len() - len) as u64);
                }
                *grown_bytes += out.capacity().saturating_sub(before) as u64;
            }
            outbox.unblock(w.conn);
        }
        self.log_delivered(tid, group);
    }

    /// Sends the held replies to their connections (a durable one becomes
    /// STORAGE if its records were not stored), then the replies decided
    /// for other connections during the turn.
    fn send_held(&mut self, stored: Stored, outbox: &mut impl Outbox, report: &mut TurnReport) {
        for h in self.turn.held.drain(..) {
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
                if produce && h.durable {
                    self.stats.produces_committed += 1;
                    report.produces_acked += 1;
                }
                out.extend_from_slice(&self.turn.held_bytes[h.range]);
            }
        }
        self.turn.held_bytes.clear();
        self.turn.holders.clear();
        for r in self.turn.pending.drain(..) {
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

    /// Graceful stop: every parked FETCH is answered now, with what is
    /// ready or with nothing, and the last commit syncs everything.
    pub fn shutdown(&mut self, now: Now, outbox: &mut impl Outbox) {
        self.turn.assert_open("a shutdown");
        self.turn.stopping = true;
        for w in self.waiters.drain_all() {
            self.wheel.cancel(w.timer);
            if let Some(e) = self.topics.get_mut(w.topic)
                && let Some(out) = outbox.out(w.conn)
            {
                // The last turn: every parked FETCH is answered, whatever
                // the budget.
                let room = (super::requests::timer_room(self.config.limits.timers_max, &self.wheel), u64::MAX);
                super::requests::deliver(e, &mut self.wheel, &w, now, room, (out, &mut self.scratch.delivered));
            }
            self.log_delivered(w.topic, w.group);
            outbox.unblock(w.conn);
        }
    }
}

#[cfg(test)]
#[path = "unwritten_tests.rs"]
mod unwritten_tests;
