//! A connection's deadlines and the buffers' watch: when a connection's
//! handshake, a frame, silence or an unread backlog has gone on too long,
//! and what the loop does when all connections' buffers together reach
//! `buffered_bytes_max`. Methods of the loop (`Reactor`), kept apart
//! because they are the policy of ending connections, not the loop's
//! order.

use super::{Conn, Reactor, Timed};
use crate::broker::{ConnKey, Now};
use crate::conn::FULL_HOLDING_BYTES_MAX;
use crate::limits::Limits;

impl Reactor {
    /// The earliest timeout of a connection, ms: HELLO not yet done, a frame
    /// still arriving, or silence.
    pub(super) fn deadline(c: &Conn, l: &Limits) -> Option<u64> {
        let mut d: Option<u64> = None;
        let mut at = |t: u64| d = Some(d.map_or(t, |d| d.min(t)));
        if !c.state.session.hello {
            at(c.accepted_ms + u64::from(l.handshake_timeout_ms));
        }
        if let Some(since) = c.state.partial_since_ms {
            at(since + u64::from(l.frame_timeout_ms));
        }
        if l.idle_timeout_ms > 0 && !Self::waits_for_messages(c) {
            at(c.state.last_active_ms + u64::from(l.idle_timeout_ms));
        }
        if let Some(since) = c.backlog_since_ms {
            at(since + u64::from(l.frame_timeout_ms));
        }
        d
    }

    /// Whether the connection waits for messages (a parked FETCH, or a push
    /// subscription): silence is then no sign of a vanished peer, and the
    /// idle timeout does not apply.
    pub(super) fn waits_for_messages(c: &Conn) -> bool {
        c.state.parked || c.state.session.subscriptions > 0
    }

    /// Makes sure a timer fires no later than the connection's deadline.
    /// Timers are re-armed lazily: one that fires early is re-armed then,
    /// so a busy connection costs no wheel work per request.
    pub(super) fn arm(&mut self, key: ConnKey) {
        let Some(c) = self.conns.get_mut(key).filter(|c| !c.state.closing) else { return };
        let Some(deadline) = Self::deadline(c, &self.limits) else { return };
        match c.timer {
            Some((_, at)) if at <= deadline => {}
            Some((t, _)) => {
                self.timers.cancel(t);
                c.timer = Some((self.timers.insert(deadline, Timed::Conn(key)), deadline));
            }
            None => c.timer = Some((self.timers.insert(deadline, Timed::Conn(key)), deadline)),
        }
    }

    /// What keeps a connection's backlog clock running, as the reason to
    /// close it when the clock runs out; None when nothing does.
    pub(super) fn backlog(c: &Conn, out_max: usize, full: bool) -> Option<&'static str> {
        if c.state.pending_out_bytes() >= out_max / 2 {
            Some("half of output_bytes_max left unread past frame_timeout_ms: the peer is not reading")
        } else if full && c.state.buffered_bytes() >= FULL_HOLDING_BYTES_MAX {
            Some("held 64 KiB or more past frame_timeout_ms while the buffers were full (buffered_bytes_max)")
        } else {
            None
        }
    }

    /// Closes the connections whose timeouts passed; re-arms the others.
    pub(super) fn expire_connections(&mut self, now: Now) {
        let mut expired = std::mem::take(&mut self.expired);
        self.timers.advance(now.mono_ms, &mut expired);
        let full = self.broker.buffers_full(self.loops.buffered_bytes);
        for (_, timed) in expired.drain(..) {
            match timed {
                Timed::Conn(key) => self.conn_timeout(key, now, full),
                Timed::Http(key) => self.http_timeout(key, now),
            }
        }
        self.expired = expired;
    }

    /// A client connection's timer fired: ends it if one of its timeouts
    /// passed (`full`: the buffers were full when the timers ran), or
    /// re-arms it for the next.
    pub(super) fn conn_timeout(&mut self, key: ConnKey, now: Now, full: bool) {
        let out_max = self.limits.output_bytes_max as usize;
        let Some(c) = self.conns.get_mut(key) else { return };
        c.timer = None;
        let backlog = Self::backlog(c, out_max, full);
        if backlog.is_none() {
            c.backlog_since_ms = None;
        }
        let l = &self.limits;
        let why = if !c.state.session.hello && now.mono_ms >= c.accepted_ms + u64::from(l.handshake_timeout_ms) {
            Some("no HELLO within handshake_timeout_ms")
        } else if c.state.partial_since_ms.is_some_and(|t| now.mono_ms >= t + u64::from(l.frame_timeout_ms)) {
            Some("a frame stayed incomplete past frame_timeout_ms")
        } else if c.backlog_since_ms.is_some_and(|t| now.mono_ms >= t + u64::from(l.frame_timeout_ms)) {
            backlog
        } else if l.idle_timeout_ms > 0
            && !Self::waits_for_messages(c)
            && now.mono_ms >= c.state.last_active_ms + u64::from(l.idle_timeout_ms)
        {
            Some("idle past idle_timeout_ms")
        } else {
            None
        };
        match why {
            Some(why) => self.end(key, why),
            None => self.arm(key),
        }
    }

    /// Step 8. When the buffers have just become full, every idle buffer is
    /// given back and each connection that still holds
    /// FULL_HOLDING_BYTES_MAX or more starts its backlog clock: one that
    /// goes on holding that much for frame_timeout_ms is closed, whether or
    /// not it sends more. Once they are no longer full, the starved
    /// connections are served again.
    pub(super) fn watch_buffers(&mut self, now: Now) {
        let full = self.broker.buffers_full(self.loops.buffered_bytes);
        if full && !self.buffers_were_full {
            let mut holders = Vec::new();
            for (key, c) in self.conns.iter_mut().filter(|(_, c)| !c.state.closing) {
                c.state.give_back_idle(&mut self.loops.buffered_bytes);
                if c.state.buffered_bytes() >= FULL_HOLDING_BYTES_MAX && c.backlog_since_ms.is_none() {
                    c.backlog_since_ms = Some(now.mono_ms);
                    holders.push(key);
                }
            }
            for key in holders {
                self.arm(key);
            }
        }
        if !full {
            let mut starved = std::mem::take(&mut self.starved);
            for key in starved.drain(..) {
                let Some(c) = self.conns.get_mut(key) else { continue };
                c.starved_listed = false;
                if std::mem::take(&mut c.state.starved) {
                    self.mark_hot(key);
                }
            }
            self.starved = starved;
        }
        self.buffers_were_full = full;
    }
}
