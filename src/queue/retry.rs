//! A group's failed deliveries across a restart: a message whose last
//! allowed delivery was in flight when the broker died has run out of
//! deliveries (the crash ended that delivery as a lost consumer would), so
//! recovery hands it to the dead-letter topic rather than deliver it once
//! more than `max_deliveries` allows.
//!
//! Also what a group's retries look like to an inspection (when a delayed
//! message is ready again), and a retry policy's waits (`RetryPolicy`):
//! the delay sequence, pure and deterministic, for a group's backoff.

use super::{Group, GroupId, MsgId, Topic};

impl Topic {
    /// Recovery: takes out of group `g`'s retry queue every message whose
    /// deliveries reached the group's `max_deliveries` in a delivery the
    /// crash cut (`Group::cut`), with its deliveries,
    /// for the broker to dead-letter (nothing in a dead-letter topic, whose
    /// messages are never dead-lettered). A group's messages of this kind
    /// are all back for retry after a restart (`replay.rs` moves its
    /// cursor past them).
    pub fn take_exhausted(&mut self, g: GroupId) -> Vec<(MsgId, u16)> {
        let policy = self.policy(g);
        let Some(group) = self.group_mut(g) else { return Vec::new() };
        let cut = std::mem::take(&mut group.cut);
        if !policy.dead_letters {
            return Vec::new();
        }
        let mut out = Vec::new();
        for id in group.retry_ids() {
            let d = group.deliveries(id);
            if d >= policy.max_deliveries && cut.contains_key(&id) && group.take_retried(id) {
                out.push((id, d));
            }
        }
        out
    }
}

impl Topic {
    /// How long message `id`, in flight to group `g`, waits for retry if
    /// this delivery fails, ms: None if the group has no retry policy or
    /// the message is not in flight to it.
    pub fn retry_wait_ms(&self, g: GroupId, id: MsgId) -> Option<u64> {
        let group = self.group(g)?;
        let policy = group.config.retry?;
        let f = group.inflight.get(&id)?;
        Some(policy.wait_ms(id, f.deliveries, g))
    }

    /// Notes that delayed message `id` of group `g` waits for retry (its
    /// delay is the retry policy's, not a NACK's).
    pub fn note_retry_wait(&mut self, g: GroupId, id: MsgId) {
        if let Some(group) = self.group_mut(g)
            && group.delayed.contains_key(&id)
        {
            group.retry_waits.insert(id, ());
        }
    }
}

impl Group {
    /// When message `id`, NACKed with a delay or waiting for retry, is
    /// ready again: wall-clock ms since the Unix epoch, as the log states
    /// it; None if it is not delayed in this group (for an inspection:
    /// "delayed until").
    pub fn delayed_until_wall_ms(&self, id: MsgId) -> Option<u64> {
        self.delayed.contains_key(&id).then(|| self.delay_wall.get(&id).copied()).flatten()
    }

    /// Messages waiting for retry (part of `delayed`).
    pub fn retry_waiting(&self) -> u64 {
        self.retry_waits.len() as u64
    }

    /// Whether delayed message `id` waits for retry (the retry policy's
    /// wait) rather than for a NACK's delay.
    pub fn waits_for_retry(&self, id: MsgId) -> bool {
        self.retry_waits.contains_key(&id)
    }
}

/// A group's retry policy: how long a message waits before it is ready
/// again after a NACK without a delay or a passed ack deadline ("waiting
/// for retry"), by its deliveries so far. Without one a message is ready
/// again at once.
///
/// The wait for the `n`-th failed delivery is `initial_ms × (multiplier_pct
/// / 100)^(n - 1)`, at most `cap_ms` (a multiplier of 100 is a fixed
/// delay), then shortened by up to `jitter_pct` percent, by an amount drawn
/// from a hash of the message id, its deliveries and the group's id: the
/// same wait every time it is computed (tests and a replay agree), and
/// spread over messages so that a burst of failures does not come back at
/// once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait after the first failed delivery, ms (at least 1).
    pub initial_ms: u32,
    /// Each further failed delivery multiplies the wait by this / 100
    /// (100: a fixed delay; 200: doubling).
    pub multiplier_pct: u16,
    /// The longest wait before jitter, ms (at least `initial_ms`).
    pub cap_ms: u32,
    /// The most the jitter shortens a wait, percent (0 to 100).
    pub jitter_pct: u8,
}

/// The most `multiplier_pct` may be: a wait grows at most tenfold per
/// failed delivery.
pub const RETRY_MULTIPLIER_PCT_MAX: u16 = 1000;

impl RetryPolicy {
    /// Why the policy is not one the broker takes, if it is not: waits of
    /// at least 1 ms and at most `delay_ms_max`, a multiplier of 100 to
    /// `RETRY_MULTIPLIER_PCT_MAX`, a jitter of at most 100 percent.
    pub fn check(&self, delay_ms_max: u32) -> Result<(), String> {
        if self.initial_ms == 0 || self.cap_ms < self.initial_ms {
            return Err(format!(
                "retry policy: initial wait {} ms must be at least 1 and at most the cap ({} ms)",
                self.initial_ms, self.cap_ms
            ));
        }
        if self.cap_ms > delay_ms_max {
            return Err(format!("retry policy: cap {} ms is over retry_delay_ms_max ({delay_ms_max})", self.cap_ms));
        }
        if !(100..=RETRY_MULTIPLIER_PCT_MAX).contains(&self.multiplier_pct) {
            return Err(format!(
                "retry policy: multiplier {}% must be 100 to {RETRY_MULTIPLIER_PCT_MAX}",
                self.multiplier_pct
            ));
        }
        if self.jitter_pct > 100 {
            return Err(format!("retry policy: jitter {}% is over 100", self.jitter_pct));
        }
        Ok(())
    }

    /// The wait before message `id` of group `group` is ready again after
    /// its `deliveries`-th delivery failed, ms.
    pub fn wait_ms(&self, id: MsgId, deliveries: u16, group: GroupId) -> u64 {
        let cap = u64::from(self.cap_ms);
        let mut wait = u64::from(self.initial_ms);
        // The wait grows over at most 64 failed deliveries, so the work
        // is bounded whatever the count.
        for _ in 1..deliveries.min(64) {
            if wait >= cap {
                break;
            }
            wait = wait * u64::from(self.multiplier_pct) / 100;
        }
        let wait = wait.min(cap);
        let spread = wait * u64::from(self.jitter_pct) / 100;
        if spread == 0 {
            return wait;
        }
        wait - jitter_hash(id, deliveries, group) % (spread + 1)
    }
}

impl RetryPolicy {
    /// Reads the CLI's syntax: `fixed:WAIT` or `exp:INITIAL..CAP`, then
    /// optionally `,xM` (the multiplier, e.g. `x2` or `x1.5`; exp only,
    /// 2 when left out) and `,jitter=P` (percent). A wait is a number
    /// with `ms`, `s`, `m` or `h` (ms when bare). The policy is not
    /// checked against the broker's limits (`check`, the broker's job).
    pub fn parse(text: &str) -> Result<RetryPolicy, String> {
        let bad = |why: &str| format!("retry policy {text:?}: {why} (fixed:500ms, exp:100ms..30s,x2,jitter=20)");
        let mut parts = text.split(',');
        let head = parts.next().unwrap_or("");
        let (kind, waits) = head.split_once(':').ok_or_else(|| bad("want fixed: or exp:"))?;
        let mut p = match kind {
            "fixed" => {
                let w = wait_ms(waits).ok_or_else(|| bad("a wait is a number with ms, s, m or h"))?;
                RetryPolicy { initial_ms: w, multiplier_pct: 100, cap_ms: w, jitter_pct: 0 }
            }
            "exp" => {
                let (a, b) = waits.split_once("..").ok_or_else(|| bad("exp: wants INITIAL..CAP"))?;
                let (a, b) = (wait_ms(a), wait_ms(b));
                let (Some(initial_ms), Some(cap_ms)) = (a, b) else {
                    return Err(bad("a wait is a number with ms, s, m or h"));
                };
                RetryPolicy { initial_ms, multiplier_pct: 200, cap_ms, jitter_pct: 0 }
            }
            _ => return Err(bad("want fixed: or exp:")),
        };
        for part in parts {
            if let Some(j) = part.strip_prefix("jitter=") {
                p.jitter_pct = j.trim_end_matches('%').parse().map_err(|_| bad("jitter=P wants a percent"))?;
            } else if let Some(m) = part.strip_prefix('x').filter(|_| kind == "exp") {
                let m: f64 = m.parse().map_err(|_| bad("xM wants a number"))?;
                if !(1.0..=655.0).contains(&m) {
                    return Err(bad("xM wants a number from 1 to 655"));
                }
                p.multiplier_pct = (m * 100.0).round() as u16;
            } else {
                return Err(bad(&format!("unknown part {part:?}")));
            }
        }
        Ok(p)
    }
}

/// ms of a wait written `N`, `Nms`, `Ns`, `Nm` or `Nh`.
fn wait_ms(v: &str) -> Option<u32> {
    let (digits, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len()));
    let n: u64 = digits.parse().ok()?;
    let scale = match unit {
        "" | "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    u32::try_from(n.checked_mul(scale)?).ok()
}

/// The CLI's syntax (`RetryPolicy::parse` reads it back), waits in ms.
impl std::fmt::Display for RetryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.multiplier_pct == 100 && self.cap_ms == self.initial_ms {
            write!(f, "fixed:{}ms", self.initial_ms)?;
        } else {
            let m = self.multiplier_pct;
            let x = if m.is_multiple_of(100) { format!("{}", m / 100) } else { format!("{}.{:02}", m / 100, m % 100) };
            write!(f, "exp:{}ms..{}ms,x{}", self.initial_ms, self.cap_ms, x.trim_end_matches('0'))?;
        }
        if self.jitter_pct > 0 {
            write!(f, ",jitter={}", self.jitter_pct)?;
        }
        Ok(())
    }
}

/// A hash of (message id, deliveries, group id): splitmix64's finaliser.
fn jitter_hash(id: MsgId, deliveries: u16, group: GroupId) -> u64 {
    let mut z = id ^ (u64::from(deliveries) << 48) ^ (u64::from(group.0).rotate_left(24));
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(initial_ms: u32, multiplier_pct: u16, cap_ms: u32, jitter_pct: u8) -> RetryPolicy {
        RetryPolicy { initial_ms, multiplier_pct, cap_ms, jitter_pct }
    }

    fn waits(p: &RetryPolicy, upto: u16) -> Vec<u64> {
        (1..=upto).map(|d| p.wait_ms(7, d, GroupId(1))).collect()
    }

    #[test]
    fn a_fixed_delay_is_the_same_every_time() {
        assert_eq!(waits(&policy(500, 100, 500, 0), 5), [500; 5]);
    }

    #[test]
    fn an_exponential_wait_grows_by_its_multiplier_up_to_the_cap() {
        assert_eq!(waits(&policy(100, 200, 1000, 0), 6), [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(waits(&policy(100, 150, 10_000, 0), 4), [100, 150, 225, 337]);
        // The cap holds however many deliveries, without overflow.
        assert_eq!(policy(1, 1000, u32::MAX, 0).wait_ms(1, u16::MAX, GroupId(0)), u64::from(u32::MAX));
        assert_eq!(policy(100, 200, 1000, 0).wait_ms(1, 0, GroupId(0)), 100, "0 deliveries: the first wait");
    }

    #[test]
    fn jitter_stays_within_its_bounds_and_is_the_same_for_the_same_message() {
        let p = policy(1000, 100, 1000, 20);
        let mut seen = std::collections::BTreeSet::new();
        for id in 0..2000 {
            for d in 1..4 {
                let w = p.wait_ms(id, d, GroupId(3));
                assert!((800..=1000).contains(&w), "id {id}, deliveries {d}: {w}");
                assert_eq!(w, p.wait_ms(id, d, GroupId(3)), "deterministic");
                seen.insert(w);
            }
        }
        assert!(seen.len() > 100, "the jitter spreads the waits: {} distinct", seen.len());
        assert!(seen.contains(&1000) || seen.iter().any(|&w| w > 990), "up to the full wait");
        assert!(seen.iter().any(|&w| w < 810), "down to 80%");
        let full = policy(1000, 100, 1000, 100);
        assert!((0..1000).map(|id| full.wait_ms(id, 1, GroupId(0))).all(|w| w <= 1000));
    }

    #[test]
    fn the_cli_syntax_reads_and_shows_a_policy() {
        assert_eq!(RetryPolicy::parse("fixed:500ms"), Ok(policy(500, 100, 500, 0)));
        assert_eq!(RetryPolicy::parse("fixed:2s,jitter=10"), Ok(policy(2000, 100, 2000, 10)));
        assert_eq!(RetryPolicy::parse("exp:100ms..30s,x2,jitter=20"), Ok(policy(100, 200, 30_000, 20)));
        assert_eq!(RetryPolicy::parse("exp:100..1m,x1.5"), Ok(policy(100, 150, 60_000, 0)));
        assert_eq!(RetryPolicy::parse("exp:1s..1h"), Ok(policy(1000, 200, 3_600_000, 0)));
        for bad in
            ["", "fixed", "fixed:", "fixed:5d", "exp:1s", "exp:1s..", "fixed:1s,x2", "exp:1..2,y", "exp:1..2,x0.5"]
        {
            assert!(RetryPolicy::parse(bad).is_err(), "{bad:?} is refused");
        }
        for p in
            [policy(500, 100, 500, 0), policy(100, 200, 30_000, 20), policy(100, 150, 60_000, 0), policy(7, 125, 9, 1)]
        {
            assert_eq!(RetryPolicy::parse(&p.to_string()), Ok(p), "{p} reads back");
        }
        assert_eq!(policy(100, 200, 30_000, 20).to_string(), "exp:100ms..30000ms,x2,jitter=20");
    }

    #[test]
    fn check_refuses_what_makes_no_sense() {
        assert!(policy(100, 200, 1000, 20).check(86_400_000).is_ok());
        assert!(policy(0, 100, 0, 0).check(1000).is_err(), "no wait");
        assert!(policy(200, 100, 100, 0).check(1000).is_err(), "cap below initial");
        assert!(policy(100, 100, 2000, 0).check(1000).is_err(), "cap over the limit");
        assert!(policy(100, 99, 1000, 0).check(1000).is_err(), "a shrinking wait");
        assert!(policy(100, 1001, 1000, 0).check(1000).is_err(), "over tenfold");
        assert!(policy(100, 100, 1000, 101).check(1000).is_err(), "jitter over 100%");
    }
}
