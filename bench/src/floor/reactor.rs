//! The floor's loop: runnel's loop shape with nothing but the echo in it.
//! One thread, one `mio::Poll`, sockets edge-triggered. A turn:
//!
//! 1. **poll**, with a timeout of the next long-poll deadline (0 when a
//!    connection still has input to serve from last turn, none when idle);
//! 2. **read the clock** once;
//! 3. **handle readiness**: accept until WouldBlock; read each readable
//!    connection until WouldBlock (or a short read, or its fair share of
//!    the turn), decode every complete frame and answer it into the
//!    connection's output buffer;
//! 4. **wake** the parked FETCHes of topics that got messages this turn,
//!    and answer those whose wait has passed;
//! 5. **flush**: one write per connection with output; WRITABLE interest
//!    only while output is left over;
//! 6. **close** the connections that ended.
//!
//! It is runnel's turn (`src/reactor.rs`) without the timing wheel, the
//! commit (no log write, no sync, no held replies) and the connection
//! timeouts: what is left is what any server of this protocol on this
//! machine must pay per request.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use runnel::codec::{self, ErrorCode};
use runnel::limits::Limits;
use slab::Slab;

use crate::conn::{Conn, Step};
use crate::echo::{Echo, EchoLimits, Outbox};

const LISTENER: Token = Token(usize::MAX - 1);
/// Bytes read per `read` call (runnel's `READ_CHUNK_BYTES`).
const READ_CHUNK_BYTES: usize = 64 << 10;
/// Readiness events taken per poll (runnel's).
const EVENTS_PER_POLL: usize = 1024;

/// One client connection: its socket, its protocol state and its place in
/// the loop.
struct Client {
    stream: TcpStream,
    state: Conn,
    /// In `hot`: has input to serve next turn.
    hot: bool,
    /// In `dirty`: has output to flush this turn.
    dirty: bool,
    /// WRITABLE interest is registered.
    writable: bool,
}

/// The lists a turn fills: connections to serve next turn, to flush.
#[derive(Default)]
struct Lists {
    hot: Vec<usize>,
    dirty: Vec<usize>,
}

impl Lists {
    fn mark_hot(&mut self, clients: &mut Slab<Client>, key: usize) {
        if let Some(c) = clients.get_mut(key).filter(|c| !c.hot && !c.state.closing) {
            c.hot = true;
            self.hot.push(key);
        }
    }

    fn mark_dirty(&mut self, clients: &mut Slab<Client>, key: usize) {
        if let Some(c) = clients.get_mut(key).filter(|c| !c.dirty) {
            c.dirty = true;
            self.dirty.push(key);
        }
    }
}

/// The connections lent to the echo (`wake`, `expire`).
struct Lent<'a> {
    clients: &'a mut Slab<Client>,
    lists: &'a mut Lists,
}

impl Outbox for Lent<'_> {
    fn out(&mut self, key: usize) -> Option<&mut Vec<u8>> {
        self.lists.mark_dirty(self.clients, key);
        let c = self.clients.get_mut(key).filter(|c| !c.state.closing)?;
        Some(&mut c.state.out)
    }
    fn unpark(&mut self, key: usize) {
        if let Some(c) = self.clients.get_mut(key) {
            c.state.parked = None;
        }
        // It may have pipelined requests behind the FETCH.
        self.lists.mark_hot(self.clients, key);
    }
}

/// The floor's event loop.
pub struct Floor {
    poll: Poll,
    listener: TcpListener,
    clients: Slab<Client>,
    echo: Echo,
    lists: Lists,
    /// Connections to close at the end of the turn.
    closing: Vec<usize>,
    /// Where reads land before they are decoded.
    scratch: Vec<u8>,
    started: Instant,
    /// runnel's default limits: connections_max, output_bytes_max,
    /// read_bytes_per_turn_max are the ones the loop enforces.
    limits: Limits,
}

impl Floor {
    /// Binds the listener.
    pub fn bind(listen: SocketAddr, queued_bytes_max: u64) -> io::Result<Floor> {
        let poll = Poll::new()?;
        let mut listener = TcpListener::bind(listen)?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        Ok(Floor {
            poll,
            listener,
            clients: Slab::new(),
            echo: Echo::new(EchoLimits::new(queued_bytes_max)),
            lists: Lists::default(),
            closing: Vec::new(),
            scratch: vec![0; READ_CHUNK_BYTES],
            started: Instant::now(),
            limits: Limits::default(),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Runs turns until an error of the poll itself (a signal ends it).
    pub fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(EVENTS_PER_POLL);
        loop {
            self.turn(&mut events)?;
        }
    }

    /// One turn, in the order written at the top of this file.
    fn turn(&mut self, events: &mut Events) -> io::Result<()> {
        // 1. poll
        match self.poll.poll(events, self.poll_timeout()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => events.clear(),
            Err(e) => return Err(e),
        }
        // 2. the clock, once
        let now_ms = self.started.elapsed().as_millis() as u64;
        // 3. readiness: events, then what last turn left to serve
        let hot = std::mem::take(&mut self.lists.hot);
        for key in &hot {
            if let Some(c) = self.clients.get_mut(*key) {
                c.hot = false;
            }
        }
        for event in events.iter() {
            match event.token() {
                LISTENER => self.accept(),
                Token(key) => {
                    let Some(c) = self.clients.get_mut(key) else { continue };
                    if event.is_read_closed() || event.is_error() {
                        c.state.peer_closed = true;
                    }
                    if event.is_writable() {
                        self.lists.mark_dirty(&mut self.clients, key);
                    }
                    if event.is_readable() || event.is_read_closed() || event.is_error() {
                        self.serve(key, now_ms);
                    }
                }
            }
        }
        for key in hot {
            self.serve(key, now_ms);
        }
        // 4. parked FETCHes
        let mut lent = Lent { clients: &mut self.clients, lists: &mut self.lists };
        self.echo.wake(&mut lent);
        self.echo.expire(now_ms, &mut lent);
        // 5. flush
        self.flush();
        // 6. close
        self.close_ended();
        Ok(())
    }

    fn poll_timeout(&self) -> Option<Duration> {
        if !self.lists.hot.is_empty() {
            return Some(Duration::ZERO);
        }
        let deadline = self.started + Duration::from_millis(self.echo.next_deadline_ms()?);
        Some(deadline.saturating_duration_since(Instant::now()))
    }

    fn accept(&mut self) {
        loop {
            let mut stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("runnel-floor: accept failed: {e}");
                    return;
                }
            };
            let limit = self.limits.connections_max as usize;
            if self.clients.len() >= limit {
                let mut out = Vec::new();
                let msg = format!("runnel-floor is at connections_max ({limit})");
                codec::encode_error(&mut out, 0, 0, ErrorCode::TooManyConnections, &msg);
                // Best effort: the socket is new, so its buffer has room.
                let _ = stream.write(&out);
                continue;
            }
            // Latency over packet count: replies go out in one write per turn.
            let _ = stream.set_nodelay(true);
            let entry = self.clients.vacant_entry();
            if let Err(e) = self.poll.registry().register(&mut stream, Token(entry.key()), Interest::READABLE) {
                eprintln!("runnel-floor: cannot register a connection: {e}");
                continue;
            }
            entry.insert(Client { stream, state: Conn::default(), hot: false, dirty: false, writable: false });
        }
    }

    /// Serves a connection: decodes buffered frames, reads more, repeats,
    /// until WouldBlock, a short read, a stop (parked, paused, closing), or
    /// its share of the turn is used.
    fn serve(&mut self, key: usize, now_ms: u64) {
        let budget = self.limits.read_bytes_per_turn_max as usize;
        let mut read = 0usize;
        // A read that returned less than asked for emptied the socket (a
        // stream socket, epoll(7)): the next data brings a new edge, so the
        // read that would only say EAGAIN is skipped, as runnel does.
        let mut drained = false;
        let mut step = self.decode(key, now_ms, None);
        loop {
            match step {
                Step::Continue => {}
                Step::Stop => return,
                Step::End => return self.end(key),
            }
            if drained {
                return;
            }
            if read >= budget {
                return self.lists.mark_hot(&mut self.clients, key);
            }
            let Some(c) = self.clients.get_mut(key) else { return };
            match c.stream.read(&mut self.scratch) {
                Ok(0) => return self.end(key),
                Ok(n) => {
                    read += n;
                    drained = n < self.scratch.len() && !c.state.peer_closed;
                    step = self.decode(key, now_ms, Some(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => step = Step::Continue,
                Err(_) => return self.end(key),
            }
        }
    }

    /// Serves the connection's buffered input, then the first `chunk`
    /// bytes of the scratch buffer, and marks it for the flush.
    fn decode(&mut self, key: usize, now_ms: u64, chunk: Option<usize>) -> Step {
        let Some(c) = self.clients.get_mut(key) else { return Step::Stop };
        if c.state.closing || c.state.parked.is_some() || c.state.paused {
            // Read nothing now: the socket keeps what arrives meanwhile.
            return Step::Stop;
        }
        let pause_bytes = self.limits.output_bytes_max as usize / 2;
        let chunk = chunk.map(|n| &self.scratch[..n]);
        let step = c.state.serve(key, chunk, &mut self.echo, now_ms, pause_bytes);
        if c.state.pending_out_bytes() > 0 {
            self.lists.mark_dirty(&mut self.clients, key);
        }
        step
    }

    /// Ends a connection: the echo forgets its parked FETCH now; the socket
    /// closes after this turn's flush (which sends an error reply, if any).
    fn end(&mut self, key: usize) {
        let Some(c) = self.clients.get_mut(key).filter(|c| !c.state.closing) else { return };
        c.state.closing = true;
        if let Some(t) = c.state.parked.take() {
            self.echo.disconnect(key, t);
        }
        self.closing.push(key);
        self.lists.mark_dirty(&mut self.clients, key);
    }

    /// Writes each dirty connection's output with one write.
    fn flush(&mut self) {
        let pause_bytes = self.limits.output_bytes_max as usize / 2;
        let mut dirty = std::mem::take(&mut self.lists.dirty);
        let mut failed = Vec::new();
        for key in dirty.drain(..) {
            let Some(c) = self.clients.get_mut(key) else { continue };
            c.dirty = false;
            let state = &mut c.state;
            let mut ok = true;
            while state.pending_out_bytes() > 0 {
                match c.stream.write(&state.out[state.out_pos..]) {
                    Ok(n) => {
                        state.out_pos += n;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        ok = false;
                        break;
                    }
                }
            }
            let pending = state.pending_out_bytes();
            if pending == 0 {
                state.out.clear();
                state.out_pos = 0;
            }
            // Output drained below the pause: serve its input again.
            if pending < pause_bytes && std::mem::take(&mut state.paused) && !c.hot && !state.closing {
                c.hot = true;
                self.lists.hot.push(key);
            }
            let want_writable = pending > 0 && ok;
            if want_writable != c.writable {
                let interest = if want_writable { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
                ok &= self.poll.registry().reregister(&mut c.stream, Token(key), interest).is_ok();
                c.writable = want_writable;
            }
            if !ok {
                failed.push(key);
            }
        }
        self.lists.dirty = dirty;
        for key in failed {
            self.end(key);
        }
    }

    /// Closes the connections that ended this turn.
    fn close_ended(&mut self) {
        for key in self.closing.drain(..) {
            if self.clients.contains(key) {
                let mut c = self.clients.remove(key);
                let _ = self.poll.registry().deregister(&mut c.stream);
            }
        }
    }
}
