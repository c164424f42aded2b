//! Storage failures, logged at a bounded rate.
//!
//! On a full disk every turn that writes fails, and a turn comes with every
//! request (a client retrying, each PING): one ERROR line per failure put
//! thousands of lines a minute in the log, all saying the same thing. So
//! the first failure of a run is logged, then a count at most every
//! `REPEAT_LOG_MS`, and the end of the run when a write works again. The
//! time is passed in (CONVENTIONS.md: only the reactor reads the clock),
//! and what to log is decided by a pure step that the tests drive.

use std::fmt::Display;

/// Least time between two log lines about one run of storage failures:
/// often enough that the log shows the failures go on and how many there
/// are, rarely enough that a disk full for a day writes some 17,000 lines
/// instead of millions.
const REPEAT_LOG_MS: u64 = 5_000;

/// A line to log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line {
    /// The first failure of a run.
    First,
    /// `failures` more failures in the last `over_ms`.
    Repeated { failures: u64, over_ms: u64 },
    /// Writes work again after `failures` failures over `over_ms`.
    Recovered { failures: u64, over_ms: u64 },
}

/// The current run of storage failures, if any.
#[derive(Debug, Default)]
pub(crate) struct FailureLog {
    /// When the run began (monotonic ms); None while storage works.
    since_ms: Option<u64>,
    /// When the run's last line was logged (monotonic ms).
    logged_ms: u64,
    /// Failures since that line.
    unlogged: u64,
    /// Failures in the run.
    failures: u64,
}

impl FailureLog {
    /// A write or sync failed at `now_ms`; `what` says which and why.
    pub(crate) fn failed(&mut self, now_ms: u64, what: impl Display) {
        match self.note_failure(now_ms) {
            Some(Line::First) => log::error!(
                "STORAGE: {what}; until a write works again, further failures are counted every {} s",
                REPEAT_LOG_MS / 1000
            ),
            Some(Line::Repeated { failures, over_ms }) => {
                log::error!("STORAGE: {failures} more failures in the last {} ms; the latest: {what}", over_ms)
            }
            _ => {}
        }
    }

    /// A turn's records were written at `now_ms`.
    pub(crate) fn worked(&mut self, now_ms: u64) {
        if let Some(Line::Recovered { failures, over_ms }) = self.note_success(now_ms) {
            log::info!("STORAGE: the commit log writes again, after {failures} failures over {over_ms} ms");
        }
    }

    fn note_failure(&mut self, now_ms: u64) -> Option<Line> {
        if self.since_ms.is_none() {
            *self = FailureLog { since_ms: Some(now_ms), logged_ms: now_ms, unlogged: 0, failures: 1 };
            return Some(Line::First);
        }
        self.failures += 1;
        self.unlogged += 1;
        if now_ms < self.logged_ms + REPEAT_LOG_MS {
            return None;
        }
        let line = Line::Repeated { failures: self.unlogged, over_ms: now_ms - self.logged_ms };
        self.logged_ms = now_ms;
        self.unlogged = 0;
        Some(line)
    }

    fn note_success(&mut self, now_ms: u64) -> Option<Line> {
        let since_ms = self.since_ms?;
        let line = Line::Recovered { failures: self.failures, over_ms: now_ms.saturating_sub(since_ms) };
        *self = FailureLog::default();
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_failure_then_a_count_per_period_then_the_recovery() {
        let mut f = FailureLog::default();
        assert_eq!(f.note_success(5), None, "nothing to say while storage works");
        assert_eq!(f.note_failure(1_000), Some(Line::First));
        // A failing turn per millisecond: quiet until the period ends.
        for t in 1_001..1_000 + REPEAT_LOG_MS {
            assert_eq!(f.note_failure(t), None, "at {t}");
        }
        let period = Line::Repeated { failures: REPEAT_LOG_MS, over_ms: REPEAT_LOG_MS };
        assert_eq!(f.note_failure(1_000 + REPEAT_LOG_MS), Some(period));
        assert_eq!(f.note_failure(1_000 + REPEAT_LOG_MS + 1), None);
        // A long silence: the next failure is counted with the period it ends.
        let late = 1_000 + 10 * REPEAT_LOG_MS;
        assert_eq!(f.note_failure(late), Some(Line::Repeated { failures: 2, over_ms: 9 * REPEAT_LOG_MS }));
        assert_eq!(
            f.note_success(late + 7),
            Some(Line::Recovered { failures: REPEAT_LOG_MS + 3, over_ms: late + 7 - 1_000 })
        );
        assert_eq!(f.note_success(late + 8), None, "said once");
        // A new run starts over.
        assert_eq!(f.note_failure(late + 9), Some(Line::First));
        assert_eq!(f.note_failure(late + 10), None);
        assert_eq!(f.note_success(late + 11), Some(Line::Recovered { failures: 2, over_ms: 2 }));
    }
}
