//! The connections' output buffers, lent to the broker for a step of the
//! turn (`broker::Outbox`): what it writes marks the connection for the
//! flush, and what it unblocks (a parked FETCH answered) is served again
//! next turn. Only the reactor owns connections; the broker sees them
//! through this.

use super::Conns;
use crate::broker::{ConnKey, LoopStats, Now, Outbox};

/// The lent output buffers (see `broker::Outbox`).
pub(super) struct Lent<'a> {
    /// The connections whose output buffers are lent.
    conns: &'a mut Conns,
    /// The reactor's `hot`: an unblocked connection is served next turn.
    hot: &'a mut Vec<ConnKey>,
    /// The reactor's `dirty`: a connection written to is flushed.
    dirty: &'a mut Vec<ConnKey>,
    /// The turn's clock, ms: a parked FETCH answered now restarts its
    /// connection's idle clock.
    now_ms: u64,
    /// The connections' buffers, bytes, as counted when they were lent.
    buffered_bytes: u64,
}

impl<'a> Lent<'a> {
    pub(super) fn new(
        conns: &'a mut Conns,
        hot: &'a mut Vec<ConnKey>,
        dirty: &'a mut Vec<ConnKey>,
        loops: &LoopStats,
        now: Now,
    ) -> Lent<'a> {
        Lent { conns, hot, dirty, now_ms: now.mono_ms, buffered_bytes: loops.buffered_bytes }
    }
}

impl Outbox for Lent<'_> {
    fn out(&mut self, key: ConnKey) -> Option<&mut Vec<u8>> {
        let c = self.conns.get_mut(key).filter(|c| !c.state.closing)?;
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(key);
        }
        Some(&mut c.state.out)
    }
    fn unblock(&mut self, key: ConnKey) {
        if let Some(c) = self.conns.get_mut(key) {
            c.state.unpark(self.now_ms);
            if !c.hot && !c.state.closing {
                c.hot = true;
                self.hot.push(key);
            }
        }
    }
    fn buffered_bytes(&self) -> u64 {
        self.buffered_bytes
    }
    fn room_for_push(&mut self, key: ConnKey, pending_bytes_max: usize) -> bool {
        let Some(c) = self.conns.get_mut(key) else { return false };
        if c.state.pending_out_bytes() < pending_bytes_max {
            return true;
        }
        // Paused as a peer with that much unread is: the flush that
        // drains its output below the mark serves it again, which brings
        // the turn whose publish pushes to it again.
        c.state.paused = true;
        false
    }
}
