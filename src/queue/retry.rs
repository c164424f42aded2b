//! A group's failed deliveries across a restart: a message whose last
//! allowed delivery was in flight when the broker died has run out of
//! deliveries (the crash ended that delivery as a lost consumer would), so
//! recovery hands it to the dead-letter topic rather than deliver it once
//! more than `max_deliveries` allows.

use super::{GroupId, MsgId, Topic};

impl Topic {
    /// Recovery: takes out of group `g`'s retry queue every message whose
    /// deliveries reached the group's `max_deliveries`, with its deliveries,
    /// for the broker to dead-letter (nothing in a dead-letter topic, whose
    /// messages are never dead-lettered). A group's messages of this kind
    /// are all back for retry after a restart (`replay.rs` moves its
    /// cursor past them).
    pub fn take_exhausted(&mut self, g: GroupId) -> Vec<(MsgId, u16)> {
        let policy = self.policy(g);
        if !policy.dead_letters {
            return Vec::new();
        }
        let Some(group) = self.group_mut(g) else { return Vec::new() };
        let mut out = Vec::new();
        for id in group.retry_ids() {
            let d = group.deliveries(id);
            if d >= policy.max_deliveries && group.take_retried(id) {
                out.push((id, d));
            }
        }
        out
    }
}
