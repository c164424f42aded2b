//! `Retention`: a topic's settings for keeping done messages for replay
//! (protocol version 4), by age and by size, both off by default.
//!
//! Retention is kept in the commit log, a segment at a time (as Kafka
//! keeps a partition's segments): a done message leaves the topic's
//! memory as any other does, and its record stays in the files while its
//! segment holds a message of the topic within both bounds. Compaction
//! (`compactor.rs`) asks `Retention::keeps` before it cleans a segment.

use super::{Body, GroupId, MsgId, Topic};
use crate::codec::DeadInfo;

/// Putting retained messages back for a group that replays them
/// (`broker/replay_reader.rs`).
impl Topic {
    /// Puts back message `id`, which every group was done with, read back
    /// from the log files with its born time (and, in a dead-letter
    /// topic, where it came from). Its tags are interned afresh.
    pub fn put_back<'b>(&mut self, id: MsgId, born_ms: u64, m: impl Into<Body<'b>>, dead: Option<DeadInfo>) {
        let mut m = m.into();
        m.tag_set = self.seq.intern_tags_unbounded(&m.props);
        self.seq.put_back(id, born_ms, m);
        if let Some(d) = dead {
            self.seq.set_dead_info(id, d);
        }
    }

    /// Message `id`, just put back below group `g`'s cursor, comes back
    /// to it for retry if its filter passes it; else it leaves again.
    pub fn requeue_put_back(&mut self, g: GroupId, id: MsgId) {
        // The sequence is lent out while the group decides (its filter
        // caches decisions, so it is borrowed mutably).
        let seq = std::mem::take(&mut self.seq);
        let passes = self.group_mut(g).map(|x| x.passes(&seq, id));
        self.seq = seq;
        match passes {
            Some(true) => self.requeue(g, id, 0),
            _ => {
                self.seq.release(id);
            }
        }
    }

    /// Group `g` may read up to `until` (None: every visible message):
    /// `Group::set_replay_until`.
    pub fn set_replay_until(&mut self, g: GroupId, until: Option<MsgId>) {
        if let Some(group) = self.group_mut(g) {
            group.set_replay_until(until);
        }
    }
}

/// How long and how much of a topic's log is kept for replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// How long after it was written a message stays replayable, ms; 0:
    /// no bound by age.
    pub ms: u64,
    /// Log bytes of the topic's messages kept, counted from the newest;
    /// 0: no bound by size.
    pub bytes: u64,
}

impl Retention {
    /// Whether the topic retains anything: at least one bound is set.
    pub fn is_on(&self) -> bool {
        self.ms > 0 || self.bytes > 0
    }

    /// Whether a segment whose newest message of the topic was written at
    /// `newest_ms` (wall clock), and after which the files hold
    /// `newer_bytes` of the topic's messages, still holds a message within
    /// retention at `now_ms`: the age bound (if set) and the size bound
    /// (if set) both hold for that newest message.
    pub fn keeps(&self, newest_ms: u64, newer_bytes: u64, now_ms: u64) -> bool {
        let young = self.ms == 0 || newest_ms.saturating_add(self.ms) > now_ms;
        let small = self.bytes == 0 || newer_bytes < self.bytes;
        self.is_on() && young && small
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_is_kept_within_both_bounds_and_never_when_off() {
        let off = Retention::default();
        assert!(!off.keeps(1000, 0, 1000), "off keeps nothing");
        let age = Retention { ms: 100, bytes: 0 };
        assert!(age.keeps(1000, u64::MAX, 1099), "99 ms old");
        assert!(!age.keeps(1000, 0, 1100), "100 ms old is expired");
        let size = Retention { ms: 0, bytes: 500 };
        assert!(size.keeps(0, 499, u64::MAX), "499 newer bytes");
        assert!(!size.keeps(0, 500, 0), "500 newer bytes: past the bound");
        let both = Retention { ms: 100, bytes: 500 };
        assert!(both.keeps(1000, 10, 1050));
        assert!(!both.keeps(1000, 10, 1200), "too old");
        assert!(!both.keeps(1000, 600, 1050), "too far from the newest");
    }
}
