//! A group's NACK delays as the commit log keeps them: each delayed
//! message's ready-again time on the wall clock, so that a restart delays
//! it again for what is left of its delay (the wheel's deadlines are on the
//! monotonic clock, which does not survive the process).

use super::group::Group;
use super::{MsgId, Timers};
use crate::wheel::TimerKey;

impl Group {
    /// Notes the wall-clock time delayed message `id` is ready again (the
    /// NACK that delayed it, or recovery).
    pub fn note_delay_wall(&mut self, id: MsgId, ready_at_wall_ms: u64) {
        if self.delayed.contains_key(&id) {
            self.delay_wall.insert(id, ready_at_wall_ms);
        }
    }

    /// Every delayed message with its deliveries so far and its ready-again
    /// wall time, in id order, those waiting for retry (`retry` true) or
    /// the others: what compaction restates beside the group.
    pub fn delays(&self, retry: bool) -> Vec<(MsgId, u16, u64)> {
        let mut v: Vec<(MsgId, u16, u64)> = self
            .delayed
            .iter()
            .filter(|(id, _)| self.retry_waits.contains_key(id) == retry)
            .filter_map(|(id, (_, d))| self.delay_wall.get(id).map(|at| (*id, *d, *at)))
            .collect();
        v.sort_unstable();
        v
    }

    /// Recovery: messages whose delay had not passed, and which of them
    /// wait for retry. They are delayed (the group needs them) without a
    /// timer until `arm_restored`.
    pub fn restore_delays(&mut self, delays: Vec<(MsgId, u16, u64)>, retry_waits: impl Iterator<Item = MsgId>) {
        for &(id, d, at) in &delays {
            self.delayed.insert(id, (TimerKey::NONE, d));
            self.delay_wall.insert(id, at);
        }
        for id in retry_waits.filter(|id| self.delayed.contains_key(id)) {
            self.retry_waits.insert(id, ());
        }
        self.restored_delays = delays;
    }

    /// Arms the delays recovery found, on the broker's clock now (`mono_ms`
    /// and `wall_ms` read at the same moment).
    pub fn arm_restored(&mut self, mono_ms: u64, wall_ms: u64, timers: &mut impl Timers) {
        for (id, _, at) in std::mem::take(&mut self.restored_delays) {
            if let Some(entry) = self.delayed.get_mut(&id) {
                entry.0 = timers.arm(mono_ms + at.saturating_sub(wall_ms), id);
            }
        }
    }
}
