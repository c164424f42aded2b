//! A connection's protocol state, without its socket or the clock: the
//! bytes received and not yet decoded, the bit bucket for the body of an
//! oversized frame (beanstalkd's `STATE_BITBUCKET`), the replies not yet
//! written, and the stops that end a serve (a parked FETCH, a held reply,
//! backpressure, an ending).
//!
//! It is given bytes (`serve_chunk`) and a `Now`, never reads a socket
//! or the clock, and never reaches back into the loop: `serve` returns a
//! `Step` and the caller acts on it. So the reactor, which owns the socket,
//! the timers and the turn, and the simulation in `fuzz/sim.rs`, which feeds
//! chunks and moves its own clock, run this same code.

use crate::broker::{Broker, ConnKey, LoopStats, Now, Outcome, Session};
use crate::codec::{self, DecodeError, Decoded, Frame, Skip};
use crate::queue::ConsumerId;

/// Idle buffers larger than this are given back, so thousands of quiet
/// connections cost little. (While the connections' buffers are full, every
/// idle buffer is given back.)
pub(crate) const IDLE_BUFFER_BYTES_MAX: usize = 256 << 10;

/// While the connections' buffers are full (`buffered_bytes_max`), a
/// connection whose own buffers hold this many bytes or more is read no
/// further (it is starved) until it holds less or the total drops below the
/// limit: the connections that hold the most stop growing, and one that
/// reads its replies keeps being served. One read's worth, so a client with
/// a few small replies pending is not starved.
pub(crate) const FULL_HOLDING_BYTES_MAX: usize = 64 << 10;

/// A frame starts with its length (u32 LE), which counts the bytes after
/// it (docs/protocol.md, "Frames").
const LENGTH_FIELD_BYTES: usize = 4;

/// Why a connection ends when the broker says `Outcome::Close`.
const AUTH_FAILURES_END: &str = "too many frames without a successful HELLO";

/// What a serve works with: the broker, the loop's counters (the
/// connections' buffers are counted there) and the turn's clock.
pub struct Serve<'a> {
    pub broker: &'a mut Broker,
    pub loops: &'a mut LoopStats,
    pub now: Now,
}

/// What `ConnState::serve` asks of its caller.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Everything decodable was served; read more.
    Continue,
    /// Read no more now (a FETCH parked, paused for output, or starved
    /// while the connections' buffers are full).
    Stop,
    /// Input is left that must wait for the next turn (after the commit).
    Resume,
    /// End the connection, for this reason (its error reply, if any, is
    /// already in `out`).
    End(String),
}

/// What a caller may watch of `ConnState::serve`, to check the decoder's
/// answers against the bytes they came from. The reactor watches nothing
/// (`()`, which compiles to no code); the simulation records and checks.
pub trait Watch {
    /// The broker handled `frame`, the first `n` bytes of `input`.
    fn handled(&mut self, _frame: &Frame<'_>, _input: &[u8], _n: usize) {}
    /// The decoder refused the frame at the start of `input`, and its
    /// error reply was written (and the input skipped as `error.skip` says).
    fn refused(&mut self, _error: &DecodeError, _input: &[u8]) {}
    /// `n` bytes of a chunk went to the bit bucket (the rest of a refused
    /// frame).
    fn discarded(&mut self, _n: usize) {}
}

impl Watch for () {}

/// One connection's protocol state.
#[derive(Debug, Default)]
pub struct ConnState {
    /// The broker's view of the connection (HELLO, consumer id, auth).
    pub(crate) session: Session,
    /// Received bytes not yet decoded (at most one partial frame, or the
    /// frames after a parked or held request).
    input: Vec<u8>,
    /// Bytes of an oversized frame still to discard as they arrive
    /// (beanstalkd's bit bucket): the frame is answered, never buffered.
    discard_bytes: u64,
    /// Replies not yet written; `out_pos` is how far writing got.
    pub out: Vec<u8>,
    pub(crate) out_pos: usize,
    /// A FETCH is parked: serve no more until the broker answers it (its
    /// `Outbox::unblock` clears this, with `unpark`).
    pub parked: bool,
    /// Decoding paused because pending output reached half of
    /// output_bytes_max; whoever writes the output clears it (and serves
    /// again) once it drains below.
    pub paused: bool,
    /// Decoding stopped because the connections' buffers are full and this
    /// one holds FULL_HOLDING_BYTES_MAX or more; the reactor clears it and
    /// serves again once it holds less or the buffers are no longer full.
    pub starved: bool,
    /// Capacity of `input`, bytes, as counted in the loop's
    /// `LoopStats::buffered_bytes` (`account`).
    counted_input_bytes: usize,
    /// Capacity of `out`, bytes, as counted in the loop's
    /// `LoopStats::buffered_bytes` (`account`).
    counted_out_bytes: usize,
    /// Ending: `end` was called; nothing more is served.
    pub closing: bool,
    /// The peer shut its side (the reactor learns it from an event): a
    /// FETCH that parks now ends the connection, since nobody would read
    /// its reply; otherwise the reader ends it at the EOF, once the input
    /// before it is served.
    pub peer_closed: bool,
    /// Time of the last whole request, ms (idle timeout).
    pub(crate) last_active_ms: u64,
    /// Since when a frame has been incomplete, ms (frame timeout).
    pub(crate) partial_since_ms: Option<u64>,
}

impl ConnState {
    /// A new connection for consumer `consumer`, accepted at `now_ms`.
    pub fn new(consumer: ConsumerId, now_ms: u64) -> ConnState {
        ConnState { session: Session::new(consumer), last_active_ms: now_ms, ..ConnState::default() }
    }

    /// The broker answered the parked FETCH at `now_ms` (with messages, at
    /// the end of its wait, or at shutdown): serve again, and count idle
    /// time from now, since a parked FETCH is not silence.
    pub fn unpark(&mut self, now_ms: u64) {
        self.parked = false;
        self.last_active_ms = now_ms;
    }

    /// Bytes received and not yet decoded.
    pub fn input(&self) -> &[u8] {
        &self.input
    }

    /// Bytes of a skipped frame that are still to arrive and be discarded.
    pub fn discard_bytes(&self) -> u64 {
        self.discard_bytes
    }

    /// Reply bytes not yet written.
    pub(crate) fn pending_out_bytes(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// Bytes this connection's buffers take, as last counted.
    pub(crate) fn buffered_bytes(&self) -> usize {
        self.counted_input_bytes + self.counted_out_bytes
    }

    /// Brings `total_bytes` (the loop's `LoopStats::buffered_bytes`) up to
    /// date with this connection's buffers: whoever changes them outside
    /// `serve` (a write, a reply written through the broker's `Outbox`)
    /// calls it after.
    pub(crate) fn account(&mut self, total_bytes: &mut u64) {
        self.account_input(total_bytes);
        self.account_out(total_bytes);
    }

    fn account_input(&mut self, total_bytes: &mut u64) {
        let now = self.input.capacity();
        *total_bytes = *total_bytes - self.counted_input_bytes as u64 + now as u64;
        self.counted_input_bytes = now;
    }

    fn account_out(&mut self, total_bytes: &mut u64) {
        let now = self.out.capacity();
        *total_bytes = *total_bytes - self.counted_out_bytes as u64 + now as u64;
        self.counted_out_bytes = now;
    }

    /// Whether to read and serve no more now because the connections'
    /// buffers are full and this one holds FULL_HOLDING_BYTES_MAX or more;
    /// if so, it is `starved`.
    pub(crate) fn starve_if_full(&mut self, broker: &Broker, loops: &LoopStats) -> bool {
        self.starved = self.buffered_bytes() >= FULL_HOLDING_BYTES_MAX && broker.buffers_full(loops.buffered_bytes);
        self.starved
    }

    /// Gives back the buffers that hold nothing (the buffers are full, so
    /// every idle byte counts) and counts what is left in `total_bytes`.
    pub(crate) fn give_back_idle(&mut self, total_bytes: &mut u64) {
        if self.input.is_empty() {
            self.input = Vec::new();
        }
        if self.pending_out_bytes() == 0 {
            self.out = Vec::new();
            self.out_pos = 0;
        }
        self.account(total_bytes);
    }

    /// Gives back both buffers and takes their bytes out of `total_bytes`:
    /// the connection is gone.
    pub(crate) fn release_buffers(&mut self, total_bytes: &mut u64) {
        self.input = Vec::new();
        self.out = Vec::new();
        self.out_pos = 0;
        self.account(total_bytes);
    }

    /// After a write of `out`: an emptied buffer is cleared, and given back
    /// if it is large or the buffers are `full`; otherwise the written
    /// bytes are dropped once they outnumber the unwritten ones, so the
    /// buffer of a peer that reads steadily but never quite catches up does
    /// not grow with everything ever sent to it (the copy costs at most the
    /// bytes written since the last one).
    pub(crate) fn settle_out(&mut self, full: bool) {
        let pending = self.pending_out_bytes();
        if pending == 0 {
            self.out.clear();
            self.out_pos = 0;
            if full || self.out.capacity() > IDLE_BUFFER_BYTES_MAX {
                self.out = Vec::new();
            }
        } else if self.out_pos >= pending {
            self.out.drain(..self.out_pos);
            self.out_pos = 0;
        }
    }

    /// Serves what is buffered from earlier chunks: every complete frame is
    /// decoded and handed to the broker (connection `key`), whose replies go
    /// to `out`, until the input runs out or a stop: a parked FETCH, a held
    /// reply followed by a request that is not held (`Broker::must_wait`),
    /// half of output_bytes_max pending, or an ending. Bad frames are
    /// answered and skipped, the rest of an oversized one discarded as it
    /// arrives. The buffers' bytes are counted in `loops`.
    pub fn serve(&mut self, key: ConnKey, cx: &mut Serve<'_>, watch: &mut impl Watch) -> Step {
        let input = std::mem::take(&mut self.input);
        let (step, used) = self.serve_from(&input, key, cx, watch);
        self.input = input;
        self.input.drain(..used);
        self.after_serve(step, cx)
    }

    /// Takes a chunk read from the peer and serves it as `serve` does: what
    /// the bit bucket still owes is dropped first. Frames are decoded from
    /// the chunk where it lies; only a frame begun in an earlier chunk is
    /// completed in the buffer (with just the bytes it lacks), and only an
    /// incomplete frame, or frames left for the next turn, are copied into
    /// it. So a payload is not copied on its way in just to be decoded.
    /// Call it only after a serve that returned `Step::Continue` (the buffer
    /// then holds at most the start of one frame).
    pub fn serve_chunk(&mut self, key: ConnKey, chunk: &[u8], cx: &mut Serve<'_>, watch: &mut impl Watch) -> Step {
        let mut chunk = chunk;
        // Twice at most: a frame completed in the buffer, then the rest.
        loop {
            let d = self.discard_bytes.min(chunk.len() as u64) as usize;
            if d > 0 {
                self.discard_bytes -= d as u64;
                watch.discarded(d);
                chunk = &chunk[d..];
            }
            if self.input.is_empty() {
                let (step, used) = self.serve_from(chunk, key, cx, watch);
                self.input.extend_from_slice(&chunk[used..]);
                return self.after_serve(step, cx);
            }
            let take = self.completing_bytes(chunk);
            self.input.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            let step = self.serve(key, cx, watch);
            if chunk.is_empty() {
                return step;
            }
            if step != Step::Continue {
                self.input.extend_from_slice(chunk);
                self.account_input(&mut cx.loops.buffered_bytes);
                return step;
            }
            if !self.input.is_empty() {
                // Not completed after all: serve the rest from the buffer.
                self.input.extend_from_slice(chunk);
                return self.serve(key, cx, watch);
            }
        }
    }

    /// How many bytes of `chunk` the frame begun in the buffer lacks (all
    /// of `chunk` if that is not known yet, or is more).
    fn completing_bytes(&self, chunk: &[u8]) -> usize {
        let have = self.input.len();
        if have + chunk.len() < LENGTH_FIELD_BYTES {
            return chunk.len();
        }
        // The length field may straddle the buffer and the chunk.
        let mut len = [0u8; LENGTH_FIELD_BYTES];
        for (i, b) in len.iter_mut().enumerate() {
            *b = if i < have { self.input[i] } else { chunk[i - have] };
        }
        // A frame is its length field and `len` more bytes, and never less
        // than a header (the decoder waits for one before it looks at the
        // length).
        let frame = (LENGTH_FIELD_BYTES + u32::from_le_bytes(len) as usize).max(codec::HEADER_BYTES);
        frame.saturating_sub(have).min(chunk.len())
    }

    /// The decode loop of `serve` over `input`, which is either the buffer
    /// (taken out of `self` for the call) or a fresh chunk. Returns the step
    /// and how many bytes of `input` were used.
    fn serve_from(&mut self, input: &[u8], key: ConnKey, cx: &mut Serve<'_>, watch: &mut impl Watch) -> (Step, usize) {
        let Serve { broker, loops, now } = cx;
        let now = *now;
        let limits = *broker.decode_limits();
        let out_max = broker.config().limits.output_bytes_max as usize;
        let mut used = 0;
        let mut step = Step::Continue;
        while !self.closing && !self.parked {
            // What the last frame's reply added counts before the next.
            self.account_out(&mut loops.buffered_bytes);
            // Backpressure: a peer with half the output limit pending gets
            // no more replies until it reads (the flush resumes it), so a
            // pipelining peer that does read never reaches the limit.
            if self.pending_out_bytes() >= out_max / 2 {
                self.paused = true;
                step = Step::Stop;
                break;
            }
            // The same across connections: with the buffers full, one that
            // holds much is not served until it holds less.
            if self.starve_if_full(broker, loops) {
                step = Step::Stop;
                break;
            }
            let rest = &input[used..];
            match codec::decode_request(rest, &limits, self.session.version.max(codec::VERSION_MIN)) {
                Ok(Decoded::NeedMore) => break,
                Ok(Decoded::Frame(frame, n)) => {
                    if broker.must_wait(key, Some(&frame.request)) {
                        step = Step::Resume;
                        break;
                    }
                    let outcome = broker.handle(key, &mut self.session, &frame, now, loops, &mut self.out);
                    watch.handled(&frame, rest, n);
                    used += n;
                    self.last_active_ms = now.mono_ms;
                    match outcome {
                        Outcome::Done | Outcome::Held => {}
                        Outcome::Parked => self.parked = true,
                        Outcome::Close => {
                            step = Step::End(AUTH_FAILURES_END.into());
                            break;
                        }
                    }
                }
                Err(e) => {
                    if broker.must_wait(key, None) {
                        step = Step::Resume;
                        break;
                    }
                    let (n, end) = self.refuse(e, rest, broker, watch);
                    used += n;
                    if let Some(end) = end {
                        step = end;
                        break;
                    }
                }
            }
        }
        self.account_out(&mut loops.buffered_bytes);
        (step, used)
    }

    /// A frame the decoder refused at the start of `rest`: its error is
    /// answered, and the frame skipped as the error says (the part not yet
    /// arrived goes to the bit bucket). Returns the bytes of `rest` used,
    /// and the step that ends the serve, if one does.
    fn refuse(
        &mut self,
        e: DecodeError,
        rest: &[u8],
        broker: &Broker,
        watch: &mut impl Watch,
    ) -> (usize, Option<Step>) {
        let (e, outcome) =
            if self.session.hello { (e, Outcome::Done) } else { broker.refuse_before_hello(&mut self.session, e) };
        codec::encode_error(&mut self.out, e.op, e.request_id, e.code, &e.message);
        watch.refused(&e, rest);
        let used = match e.skip {
            Skip::Close => return (rest.len(), Some(Step::End(format!("frame boundary lost: {}", e.message)))),
            Skip::Bytes(n) if n <= rest.len() => n,
            Skip::Bytes(n) => {
                self.discard_bytes = (n - rest.len()) as u64;
                rest.len()
            }
        };
        (used, (outcome == Outcome::Close).then(|| Step::End(AUTH_FAILURES_END.into())))
    }

    /// What every serve ends with: an idle buffer given back (and its
    /// bytes counted), the frame timeout started or stopped, a parked
    /// FETCH's stop.
    fn after_serve(&mut self, mut step: Step, cx: &mut Serve<'_>) -> Step {
        let now = cx.now;
        let idle_max = if cx.broker.buffers_full(cx.loops.buffered_bytes) { 0 } else { IDLE_BUFFER_BYTES_MAX };
        if self.input.is_empty() && self.input.capacity() > idle_max {
            self.input = Vec::new();
        }
        self.account_input(&mut cx.loops.buffered_bytes);
        // A frame that is still arriving (not one we chose to leave for
        // later) starts the frame timeout.
        let partial = step == Step::Continue && !self.parked && (!self.input.is_empty() || self.discard_bytes > 0);
        self.partial_since_ms = if partial { Some(self.partial_since_ms.unwrap_or(now.mono_ms)) } else { None };
        if self.parked && step == Step::Continue {
            if self.peer_closed {
                // Nobody will read the FETCH's reply.
                return Step::End("peer closed; its FETCH would park for nobody".into());
            }
            step = Step::Stop;
        }
        step
    }

    /// Ends the connection: the broker (connection `key`) forgets it now,
    /// and its in-flight messages return to ready. False if it had already
    /// ended.
    pub fn end(&mut self, key: ConnKey, broker: &mut Broker) -> bool {
        if self.closing {
            return false;
        }
        self.closing = true;
        broker.disconnect(key, &self.session);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection whose output holds `len` bytes, `written` of them
    /// written.
    fn with_out(len: usize, written: usize) -> ConnState {
        ConnState { out: (0..len).map(|i| i as u8).collect(), out_pos: written, ..ConnState::default() }
    }

    #[test]
    fn written_bytes_are_dropped_once_they_outnumber_the_rest() {
        let mut c = with_out(1000, 499);
        c.settle_out(false);
        assert_eq!((c.out.len(), c.out_pos), (1000, 499), "fewer written than pending: no copy");
        let mut c = with_out(1000, 500);
        c.settle_out(false);
        assert_eq!((c.out.len(), c.out_pos), (500, 0));
        assert_eq!(c.out[0], (500 % 256) as u8, "the unwritten bytes are kept, in order");
    }

    #[test]
    fn a_reader_that_never_quite_catches_up_keeps_a_bounded_buffer() {
        // Each turn 1000 bytes of replies come and 990 are written: the
        // pending bytes grow slowly, everything written is dropped in time.
        let mut c = ConnState::default();
        for _ in 0..10_000 {
            c.out.extend_from_slice(&[7; 1000]);
            c.out_pos = (c.out_pos + 990).min(c.out.len());
            c.settle_out(false);
        }
        let pending = c.pending_out_bytes();
        assert_eq!(pending, 10_000 * 10);
        assert!(c.out.capacity() <= 4 * pending, "capacity {} for {pending} pending bytes", c.out.capacity());
    }

    #[test]
    fn an_emptied_buffer_is_given_back_when_large_or_when_the_buffers_are_full() {
        let mut c = with_out(1000, 1000);
        c.settle_out(false);
        assert_eq!((c.out.len(), c.out_pos), (0, 0));
        assert!(c.out.capacity() >= 1000, "a small idle buffer is kept for reuse");
        c.out.extend_from_slice(&[1; 10]);
        c.out_pos = 10;
        c.settle_out(true);
        assert_eq!(c.out.capacity(), 0, "the buffers are full: every idle buffer goes");
        let mut c = with_out(IDLE_BUFFER_BYTES_MAX + 1, IDLE_BUFFER_BYTES_MAX + 1);
        c.settle_out(false);
        assert_eq!(c.out.capacity(), 0);
    }

    #[test]
    fn the_count_follows_the_capacity_of_both_buffers() {
        let mut total = 5u64; // another connection's bytes
        let mut c = with_out(1000, 0);
        c.input.reserve_exact(300);
        c.account(&mut total);
        let held = c.input.capacity() + c.out.capacity();
        assert_eq!(c.buffered_bytes(), held);
        assert_eq!(total, 5 + held as u64);
        c.out_pos = 1000;
        c.settle_out(true);
        c.account(&mut total);
        assert_eq!(total, 5 + c.input.capacity() as u64);
        c.release_buffers(&mut total);
        assert_eq!((total, c.buffered_bytes()), (5, 0));
    }
}
