//! Replay from the log files (protocol version 4): a group created or
//! reset at a position before the oldest message its topic holds in
//! memory reads the retained messages back from the commit log.
//!
//! Each such group has a `Replaying`: a `Reader` in the segment files,
//! started where the topic's `SparseIndex` says the group's first message
//! is. Each loop turn reads at most `replay_read_bytes_per_turn` of the
//! files over all replays together (round robin, a slice of whole records
//! each: `Log::read_slice`), so that a group replaying a gigabyte never
//! stalls the other connections, as Kafka serves old segments a fetch at
//! a time. The messages of the group's topic it meets are put back into
//! the topic (`Topic::put_back`) for the groups before them, and the
//! group reads up to where the replay has got to
//! (`Group::set_replay_until`); ahead of the group's cursor it keeps at
//! most `replay_window_messages_max`, so memory follows the consumer, not
//! the replay. Once acked, a message is released as any other.
//!
//! The replay ends at the first id the topic held in memory when it began
//! (from there on memory holds every message any group needs), or at the
//! end of the durable log.

use super::retain::Retained;
use super::{Broker, GroupTimers, TopicId};
use crate::codec::group::Start;
use crate::log::reader::{Reader, Slice};
use crate::log::{RECORD_HEADER_BYTES, ReadRecord, RecordKind};
use crate::queue::{Body, GroupId, MsgId, Topic};
use crate::record::{GroupStateRecord, Messages, Record};

/// One group's replay.
struct Replaying {
    topic: TopicId,
    group: GroupId,
    /// Where in the files it reads next.
    reader: Reader,
    /// Every message of the topic below it that the group needs is back
    /// in memory: the group reads up to it.
    until: MsgId,
    /// The replay ends at this id: the topic held every message from it on
    /// when the replay began.
    end_id: MsgId,
    /// A start by time: messages born before it are stepped over, and the
    /// group's cursor is moved to the first one born at or after it.
    from_born_ms: Option<u64>,
    /// A replay resumed after a restart: the ids below the group's cursor
    /// that it still owed (in flight at the crash, or back for retry), in
    /// order. They come back for retry; every other id below its cursor
    /// it was done with, and is stepped over.
    owed: Vec<MsgId>,
}

/// Every replay under way.
#[derive(Default)]
pub(crate) struct Replays {
    /// In the order they began.
    list: Vec<Replaying>,
    /// Where the next turn starts in `list`: the budget goes round.
    next: usize,
    /// Bytes of the files read by replays since the broker started.
    pub(crate) read_bytes: u64,
    /// The most bytes one turn's replays read.
    pub(crate) turn_bytes_max: u64,
    /// Paced (`replay_read_bytes_per_sec`): no replay reads before this
    /// monotonic ms, when the bytes read so far are back under the rate.
    next_read_ms: u64,
    /// Whether the last step found `next_read_ms` ahead of it: the loop
    /// may sleep until then.
    waiting: bool,
}

impl Replays {
    /// Whether a replay is under way and may read now (the loop should
    /// not sleep).
    pub(crate) fn busy(&self) -> bool {
        !self.list.is_empty() && !self.waiting
    }

    /// When a paced replay may read next, if it is waiting for that.
    pub(crate) fn next_read_ms(&self) -> Option<u64> {
        (!self.list.is_empty() && self.waiting).then_some(self.next_read_ms)
    }

    /// Whether a replay is under way.
    pub(crate) fn any(&self) -> bool {
        !self.list.is_empty()
    }

    /// Ends group `group`'s replay, if it has one.
    pub(crate) fn stop(&mut self, topic: TopicId, group: GroupId) {
        self.list.retain(|r| (r.topic, r.group) != (topic, group));
    }

    /// Ends the replays of topic `topic`.
    pub(crate) fn stop_topic(&mut self, topic: TopicId) {
        self.list.retain(|r| r.topic != topic);
    }
}

/// What one slice of a replay came to, for its turn.
enum Step {
    /// It read, or its window was full: the next replay's go.
    Next,
    /// The replay is over.
    Over,
    /// Its next record does not fit in what is left of the turn's budget:
    /// the turn's reads end, and it reads first in the next turn.
    Full,
}

/// What one slice of a replay met.
#[derive(Default)]
struct Met {
    /// Messages put back.
    loaded: u64,
    /// Bytes of records read.
    bytes: u64,
    /// It met the end id.
    ended: bool,
    /// The first message born at or after the start time (a start by time).
    first_by_time: Option<MsgId>,
}

impl Broker {
    /// Where `start` puts a new or reset group of topic `tid`
    /// (`Topic::start_cursor`); for a topic that retains, a position
    /// before what memory holds whole (every message from there on:
    /// `Seq::whole_from`) reaches back as far as the oldest the files
    /// hold. Also says whether a replay is needed. Below that point memory
    /// may still hold some messages (unacknowledged ones, or another
    /// replay's), but not all: those are not where the group starts.
    pub(super) fn start_cursor(&self, tid: TopicId, start: Start) -> (MsgId, bool) {
        let Some(e) = self.topics.get(tid) else { return (0, false) };
        let t = &e.topic;
        let cursor = t.start_cursor(start);
        let whole = t.seq.whole_from(t.seq.next_id());
        let retained = self.compactor.retained.oldest_id(tid).filter(|_| t.settings.retention.is_on());
        let Some(oldest) = retained.filter(|&o| o < whole) else { return (cursor, false) };
        match start {
            Start::Earliest => (oldest, true),
            Start::Id(id) if id < whole => (id.max(oldest), true),
            // The first message born at or after the time is found by the
            // replay, which moves the cursor to it; born times grow with
            // ids, so if the first message held whole is older, so is
            // every one before it.
            Start::Time(ms) if t.seq.get(whole).is_none_or(|m| m.born_ms >= ms) => (oldest, true),
            _ => (cursor, false),
        }
    }

    /// Group `g` of topic `tid` was created or reset at `cursor`, before
    /// what memory holds (`start_cursor`): its replay begins. `start` says
    /// whether it starts by time.
    pub(super) fn begin_replay(&mut self, tid: TopicId, g: GroupId, cursor: MsgId, start: Start) {
        self.replays.stop(tid, g);
        let r = &self.compactor.retained;
        let Some(pos) = r.index.seek(tid, cursor).or_else(|| r.oldest_id(tid).and_then(|o| r.index.seek(tid, o)))
        else {
            return;
        };
        let Some(e) = self.topics.get_mut(tid) else { return };
        let end_id = e.topic.seq.whole_from(e.topic.seq.next_id());
        e.topic.set_replay_until(g, Some(cursor));
        let from_born_ms = if let Start::Time(ms) = start { Some(ms) } else { None };
        let reader = Reader::new(pos);
        let owed = Vec::new();
        self.replays.list.push(Replaying { topic: tid, group: g, reader, until: cursor, end_id, from_born_ms, owed });
    }

    /// Replays under way (STATS).
    pub(super) fn replays_under_way(&self) -> u64 {
        self.replays.list.len() as u64
    }

    /// Resumes the replays recovery found under way
    /// (`Retained::note_resume`).
    pub(super) fn resume_replays(&mut self) {
        for (tid, g, from, owed) in std::mem::take(&mut self.compactor.retained.resume) {
            self.begin_replay(tid, g, from, Start::Id(from));
            if let Some(r) = self.replays.list.last_mut().filter(|r| (r.topic, r.group) == (tid, g)) {
                r.owed = owed;
            }
        }
    }

    /// One turn of replays: reads at most `replay_read_bytes_per_turn` of
    /// the files over all of them (or one record, if larger), round robin,
    /// if the pace lets it read at `now_ms`.
    pub(super) fn replay_step(&mut self, now_ms: u64) {
        let rate = self.config.limits.replay_read_bytes_per_sec;
        self.replays.waiting = rate > 0 && now_ms < self.replays.next_read_ms;
        if self.replays.waiting {
            return;
        }
        let turn_bytes = self.replay_reads();
        if rate > 0 && turn_bytes > 0 {
            // The next read waits out what this one read at the rate (at
            // least a ms: the clock's step), so reads come in whole turns'
            // budgets spaced apart, not in slivers every turn.
            let wait_ms = (u128::from(turn_bytes) * 1000).div_ceil(u128::from(rate));
            self.replays.next_read_ms = now_ms.saturating_add(u64::try_from(wait_ms).unwrap_or(u64::MAX).max(1));
        }
    }

    /// Reads one turn's budget over the replays; returns the bytes read.
    /// Only the turn's first read may pass the budget (a record larger
    /// than all of it); a replay whose next record does not fit in what is
    /// left ends the turn's reads, and reads first in the next turn, so
    /// that no replay waits behind the others for good.
    fn replay_reads(&mut self) -> u64 {
        let per_turn = self.config.limits.replay_read_bytes_per_turn;
        let n = self.replays.list.len();
        let (mut turn_bytes, mut i, mut served) = (0, self.replays.next % n.max(1), 0);
        while served < n && turn_bytes < per_turn && i < self.replays.list.len() {
            served += 1;
            let budget = (per_turn - turn_bytes, turn_bytes == 0);
            match self.replay_slice(i, budget, &mut turn_bytes) {
                Step::Over => self.end_replay(i),
                Step::Next => i += 1,
                Step::Full => break,
            }
            if i >= self.replays.list.len() {
                i = 0;
            }
        }
        self.replays.next = i;
        self.replays.read_bytes += turn_bytes;
        self.replays.turn_bytes_max = self.replays.turn_bytes_max.max(turn_bytes);
        turn_bytes
    }

    /// Reads one slice of replay `i`, within `budget` (its bytes, and
    /// whether a record larger than them may be read whole:
    /// `Log::read_slice`).
    fn replay_slice(&mut self, i: usize, budget: (u64, bool), turn_bytes: &mut u64) -> Step {
        let window = u64::from(self.config.limits.replay_window_messages_max);
        let r = &mut self.replays.list[i];
        let Some(e) = self.topics.get_mut(r.topic) else { return Step::Over };
        let Some(cursor) = e.topic.group(r.group).map(|g| g.cursor()) else { return Step::Over };
        // Moved past the replay (a PURGE): nothing more to put back.
        if cursor >= r.end_id {
            return Step::Over;
        }
        if e.topic.seq.live_in(cursor, r.until) >= window {
            return Step::Next;
        }
        let mut met = Met::default();
        // The reader is lent out while the records it reads change `r`.
        let at = r.reader.pos();
        let mut reader = std::mem::replace(&mut r.reader, Reader::new(at));
        let retained = &self.compactor.retained;
        let slice = self.log.read_slice(&mut reader, budget, |rec| {
            met.bytes += (RECORD_HEADER_BYTES + rec.body.len()) as u64;
            if !met.ended {
                put_back_record((&mut e.topic, retained), r, cursor, &rec, &mut met);
            }
        });
        r.reader = reader;
        *turn_bytes += met.bytes;
        // Until a start by time finds its first message, the group reads
        // nothing new.
        e.topic.set_replay_until(r.group, Some(if r.from_born_ms.is_some() { cursor } else { r.until }));
        if met.loaded > 0 {
            self.turn.mark_for_publish(e);
        }
        let (tid, g, until) = (r.topic, r.group, r.until);
        if let Some(first) = met.first_by_time {
            self.replays.list[i].from_born_ms = None;
            self.move_to_time(tid, g, first, until);
        }
        match slice {
            _ if met.ended => Step::Over,
            Ok(Slice::More) => Step::Next,
            Ok(Slice::Full) => Step::Full,
            Ok(Slice::End) | Err(_) => Step::Over,
            // Compaction removed the segment: seek again from where it got.
            Ok(Slice::Gone) => match self.compactor.retained.index.seek(tid, until) {
                Some(pos) => {
                    self.replays.list[i].reader = Reader::new(pos);
                    Step::Next
                }
                None if self.compactor.retained.oldest_id(tid).is_none_or(|o| o <= until) => Step::Over,
                None => Step::Next,
            },
        }
    }

    /// A start by time found its first message, `first`: the group's
    /// cursor moves to it, logged as a reset is, so a restart starts there.
    fn move_to_time(&mut self, tid: TopicId, g: GroupId, first: MsgId, until: MsgId) {
        let Some(e) = self.topics.get_mut(tid) else { return };
        e.topic.reset_group(g, first, &mut GroupTimers { wheel: &mut self.wheel, topic: tid, group: g });
        e.topic.set_replay_until(g, Some(until));
        GroupStateRecord { topic: tid, group: g, cursor: first, entries: &[] }.append(&mut self.log);
        self.compactor.note_group(tid, g);
        self.sweeps.note(tid);
    }

    /// Replay `i` is over: its group reads every visible message.
    fn end_replay(&mut self, i: usize) {
        let r = self.replays.list.remove(i);
        if let Some(e) = self.topics.get_mut(r.topic) {
            e.topic.set_replay_until(r.group, None);
            self.turn.mark_for_publish(e);
        }
    }
}

/// Puts back the messages of record `rec` that replay `r` needs (its
/// group at `cursor`), moving `r.until` on; notes in `met` what it met.
fn put_back_record(
    (t, retained): (&mut Topic, &Retained),
    r: &mut Replaying,
    cursor: MsgId,
    rec: &ReadRecord<'_>,
    met: &mut Met,
) {
    if !matches!(rec.kind, RecordKind::Produce | RecordKind::AckProduce) {
        return;
    }
    let messages = match Record::decode(rec.kind, rec.version, rec.body) {
        Ok(Record::Produce { topic, messages }) if topic == r.topic => messages,
        // An ACK_PRODUCE's output to the topic: messages produced as any.
        Ok(Record::AckProduce { outputs, .. }) => {
            let Some((_, messages)) = outputs.filter_map(Result::ok).find(|(topic, _)| *topic == r.topic) else {
                return;
            };
            messages
        }
        _ => return,
    };
    put_back_messages((t, retained), r, cursor, messages, met);
}

/// `put_back_record`'s messages of the replay's topic.
fn put_back_messages(
    (t, retained): (&mut Topic, &Retained),
    r: &mut Replaying,
    cursor: MsgId,
    messages: Messages<'_>,
    met: &mut Met,
) {
    for m in messages {
        let Ok(m) = m else { return };
        // A compaction copy, or a message before the group's start.
        if m.id < r.until {
            continue;
        }
        if m.id >= r.end_id {
            met.ended = true;
            return;
        }
        r.until = m.id + 1;
        if r.from_born_ms.is_some_and(|ms| m.born_ms < ms) {
            continue;
        }
        if r.from_born_ms.is_some() && met.first_by_time.is_none() {
            met.first_by_time = Some(m.id);
        }
        // Below the group's cursor (a replay resumed after a restart), only
        // what the group still owed comes back.
        let below = m.id < cursor;
        let canceled = retained.was_canceled(r.topic, m.id);
        if canceled || t.seq.contains(m.id) || (below && r.owed.binary_search(&m.id).is_err()) {
            continue;
        }
        t.put_back(m.id, m.born_ms, Body { props: m.props, tag_set: None, payload: m.payload }, m.dead);
        met.loaded += 1;
        // In flight at the crash: back for retry, unless the group's
        // filter drops it.
        if below {
            t.requeue_put_back(r.group, m.id);
        }
    }
}
