//! `Retention`: a topic's settings for keeping done messages for replay
//! (protocol version 4), by age and by size, both off by default.
//!
//! Retention is kept in the commit log, a segment at a time (as Kafka
//! keeps a partition's segments): a done message leaves the topic's
//! memory as any other does, and its record stays in the files while its
//! segment holds a message of the topic within both bounds. Compaction
//! (`compactor.rs`) asks `Retention::keeps` before it cleans a segment.

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
