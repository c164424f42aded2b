//! The metrics listener: `GET /metrics` and `GET /healthz` over HTTP/1.x,
//! one request per connection, served on the reactor's own poll loop.
//!
//! No HTTP framework and no thread. The reactor hands this file the
//! readiness of the listener and of its connections; it reads a request
//! head (at most `HTTP_REQUEST_BYTES_MAX`), parses it with the pure
//! `parse_request`, and writes what `response` builds, or, for `/metrics`,
//! the exposition a slice at a time (`metrics::Scrape`): a slice of at most
//! `SCRAPE_SLICE_BYTES` is rendered only once the one before is written,
//! and every scrape's slices together at most `metrics_bytes_per_turn_max`
//! a turn (beginning a scrape, which lists the topics, counts as the bytes
//! of its list); a scrape that has used the turn's share waits in `ready`
//! for the next turn, first in line. So a scrape of many topics never holds the
//! loop, and one whose peer does not read holds one slice, its list of
//! topics and its request head. Those buffers count in the connections'
//! buffers (`LoopStats::buffered_bytes`, bounded by `buffered_bytes_max`),
//! and while those are full a new scrape is answered 503. The body of a
//! scrape has no length known ahead: an HTTP/1.1 request gets it in chunks,
//! an HTTP/1.0 one until the connection closes.
//!
//! A request that does not arrive whole within `handshake_timeout_ms` gets
//! 408; a response not read whole within as long again is dropped with its
//! connection.
//!
//! The sockets of these connections are written here, not through the
//! reactor's flush: they answer no request of the protocol, so no reply
//! here ever waits for the log.

use std::io::{self, Read, Write};
use std::net::SocketAddr;

use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};
use slab::Slab;

use crate::limits::Limits;
use crate::metrics::{Scrape, Source};
use crate::wheel::{TimerKey, Wheel};

/// Largest request head the metrics listener buffers.
pub const HTTP_REQUEST_BYTES_MAX: usize = 8 << 10;

/// Most bytes of the exposition one scrape renders before what it
/// rendered is written: what a scraper that does not read makes the
/// broker hold for it, besides its list of topics and its request head.
pub const SCRAPE_SLICE_BYTES: usize = 64 << 10;

/// Poll tokens of metrics connections start here (`HttpKey::token`); the
/// reactor's client connections use the tokens below it.
pub(crate) const HTTP_TOKEN_BASE: usize = 1 << 40;

/// A metrics connection's key in the listener's slab. Its poll token is
/// `HTTP_TOKEN_BASE` past it, so it can never be taken for a client
/// connection's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HttpKey(usize);

impl HttpKey {
    /// The poll token of this connection's socket.
    pub(crate) fn token(self) -> Token {
        Token(HTTP_TOKEN_BASE + self.0)
    }

    /// The connection a poll token stands for, if it is a metrics
    /// connection's (tokens at or past `HTTP_TOKEN_BASE`, below the
    /// reactor's fixed tokens, which it checks first).
    pub(crate) fn from_token(token: Token) -> Option<HttpKey> {
        token.0.checked_sub(HTTP_TOKEN_BASE).map(HttpKey)
    }
}

/// A request the metrics listener understood, or why not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpRequest {
    /// `/metrics`; `chunked`: an HTTP/1.1 request, whose body comes in
    /// chunks (an HTTP/1.0 one ends with the connection).
    Metrics {
        chunked: bool,
    },
    Health,
    /// The status to answer with: 400, 404, 405, 431, 505.
    Refused(u16),
}

/// Parses the head of an HTTP/1.x request, if it has arrived whole.
pub fn parse_request(buf: &[u8]) -> Option<HttpRequest> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return (buf.len() >= HTTP_REQUEST_BYTES_MAX).then_some(HttpRequest::Refused(431));
    };
    let head = &buf[..end];
    let line = head.split(|b| *b == b'\n').next().unwrap_or(&[]);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.split(|b| *b == b' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Some(HttpRequest::Refused(400));
    };
    if !version.starts_with(b"HTTP/1.") {
        return Some(HttpRequest::Refused(if version.starts_with(b"HTTP/") { 505 } else { 400 }));
    }
    if method != b"GET" && method != b"HEAD" {
        return Some(HttpRequest::Refused(405));
    }
    let path = target.split(|b| *b == b'?').next().unwrap_or(&[]);
    Some(match path {
        b"/metrics" => HttpRequest::Metrics { chunked: version != b"HTTP/1.0" },
        b"/healthz" => HttpRequest::Health,
        _ => HttpRequest::Refused(404),
    })
}

/// A whole HTTP/1.1 response that closes the connection.
pub fn response(status: u16, content_type: &str, body: &str) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        503 => "Service Unavailable",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// The head of a `/metrics` response, whose body follows in chunks or
/// until the connection closes.
pub fn metrics_head(chunked: bool) -> Vec<u8> {
    let coding = if chunked { "Transfer-Encoding: chunked\r\n" } else { "" };
    format!("HTTP/1.1 200 OK\r\nContent-Type: {METRICS_CONTENT_TYPE}\r\n{coding}Connection: close\r\n\r\n").into_bytes()
}

/// Appends `body` to `out` as one HTTP/1.1 chunk, or as it is.
fn put_body(out: &mut Vec<u8>, body: &str, chunked: bool) {
    if chunked && !body.is_empty() {
        out.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
        out.extend_from_slice(body.as_bytes());
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(body.as_bytes());
    }
}

/// The content type of the Prometheus text exposition format.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The content type of every other response.
const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// A connection to the metrics listener: one request, one response.
struct HttpConn {
    /// The socket, registered with `HttpKey::token`.
    stream: TcpStream,
    /// The request head so far, bytes (at most `HTTP_REQUEST_BYTES_MAX`).
    request: Vec<u8>,
    /// What is left of the response to write: all of it, or for a scrape
    /// its head and a slice of the exposition.
    out: Vec<u8>,
    /// How many bytes of `out` are written.
    out_pos: usize,
    /// The timeout: first for the request to arrive whole, then for the
    /// response to be read.
    timer: TimerKey,
    /// The request is whole and answered (`out` holds the response, or
    /// the start of it).
    answered: bool,
    /// The scrape under way: what is left of the exposition to render once
    /// `out` is written.
    scrape: Option<Scrape>,
    /// A scrape is asked for and not begun: it begins (listing the
    /// topics) in a turn with some of its share left.
    scrape_asked: bool,
    /// The scrape's body goes in HTTP/1.1 chunks.
    chunked: bool,
    /// Listed in the server's `ready`.
    listed: bool,
    /// Bytes its buffers take, as counted in the loop's buffered bytes.
    counted_bytes: usize,
}

impl HttpConn {
    /// Brings `total_bytes` (the loop's `LoopStats::buffered_bytes`) up
    /// to date with this connection's buffers.
    fn account(&mut self, total_bytes: &mut u64) {
        let now = self.request.capacity() + self.out.capacity() + self.scrape.as_ref().map_or(0, Scrape::held_bytes);
        *total_bytes = *total_bytes - self.counted_bytes as u64 + now as u64;
        self.counted_bytes = now;
    }
}

/// What a metrics call needs of the loop: where sockets are registered,
/// the loop's timers, whose values say which connection a timer is for,
/// and its count of the connections' buffers.
pub(crate) struct LoopParts<'a, T> {
    /// The poll's registry.
    pub(crate) registry: &'a Registry,
    /// The loop's timer wheel (deadlines in ms of the reactor's clock).
    pub(crate) timers: &'a mut Wheel<T>,
    /// The loop's `LoopStats::buffered_bytes`, which these connections'
    /// buffers count in.
    pub(crate) buffered: &'a mut u64,
}

/// What a scrape renders from (the broker and the loop), and whether the
/// connections' buffers are full (a new scrape is then answered 503).
pub(crate) struct Scraping<'a> {
    pub(crate) src: Source<'a>,
    pub(crate) full: bool,
}

/// The metrics listener and its connections.
pub(crate) struct HttpServer {
    /// The metrics listener, registered with the reactor's METRICS token.
    listener: TcpListener,
    /// Where it listens (the port chosen, when asked for port 0).
    addr: SocketAddr,
    /// The open metrics connections.
    conns: Slab<HttpConn>,
    /// Most metrics connections at once (the broker's connections_max):
    /// past it a new one is closed unanswered.
    conns_max: usize,
    /// How long a request may take to arrive whole, and then its response
    /// to be read, ms (the broker's handshake_timeout_ms).
    timeout_ms: u64,
    /// Scrapes whose output is written and that have more to render, in
    /// the order they were left: served first in the next turn.
    ready: Vec<HttpKey>,
    /// Bytes of the exposition every scrape together may render per turn
    /// (`metrics_bytes_per_turn_max`), and what is left of them this turn.
    turn_bytes_max: usize,
    turn_bytes_left: usize,
    /// Where a slice is rendered before it goes to a connection's output.
    slice: String,
}

impl HttpServer {
    /// Serves on `listener`, registered with `token`.
    pub(crate) fn new(
        mut listener: TcpListener,
        registry: &Registry,
        token: Token,
        limits: &Limits,
    ) -> io::Result<HttpServer> {
        registry.register(&mut listener, token, Interest::READABLE)?;
        let addr = listener.local_addr()?;
        Ok(HttpServer {
            listener,
            addr,
            conns: Slab::new(),
            conns_max: limits.connections_max as usize,
            timeout_ms: u64::from(limits.handshake_timeout_ms),
            ready: Vec::new(),
            turn_bytes_max: limits.metrics_bytes_per_turn_max as usize,
            turn_bytes_left: limits.metrics_bytes_per_turn_max as usize,
            slice: String::new(),
        })
    }

    /// Where it listens.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Accepts every pending connection and starts its request timeout.
    pub(crate) fn accept<T: From<HttpKey>>(&mut self, lp: LoopParts<'_, T>, now_ms: u64) {
        loop {
            let mut stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::warn!("metrics accept failed: {e}");
                    return;
                }
            };
            // Metrics connections are few and short; a flood is refused at
            // the connection limit like any other.
            if self.conns.len() >= self.conns_max {
                continue;
            }
            let entry = self.conns.vacant_entry();
            let key = HttpKey(entry.key());
            let interest = Interest::READABLE | Interest::WRITABLE;
            if lp.registry.register(&mut stream, key.token(), interest).is_err() {
                continue;
            }
            let timer = lp.timers.insert(now_ms + self.timeout_ms, T::from(key));
            entry.insert(HttpConn {
                stream,
                request: Vec::new(),
                out: Vec::new(),
                out_pos: 0,
                timer,
                answered: false,
                scrape: None,
                scrape_asked: false,
                chunked: false,
                listed: false,
                counted_bytes: 0,
            });
        }
    }

    /// A new turn: the scrapes may render `metrics_bytes_per_turn_max`
    /// again, those left by the last turn first.
    pub(crate) fn begin_turn<T: From<HttpKey>>(&mut self, lp: LoopParts<'_, T>, cx: &Scraping<'_>) {
        self.turn_bytes_left = self.turn_bytes_max;
        let LoopParts { registry, timers, buffered } = lp;
        for key in std::mem::take(&mut self.ready) {
            // A key closed since may name a new connection, not listed.
            let Some(h) = self.conns.get_mut(key.0).filter(|h| h.listed) else { continue };
            h.listed = false;
            self.write(key, LoopParts { registry, timers: &mut *timers, buffered: &mut *buffered }, cx);
        }
    }

    /// Whether a scrape waits for the next turn to render more.
    pub(crate) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Serves a ready connection: reads its request until it is whole, then
    /// answers it (a scrape from `cx`) and writes the response.
    pub(crate) fn serve<T: From<HttpKey>>(&mut self, key: HttpKey, lp: LoopParts<'_, T>, cx: &Scraping<'_>) {
        let Some(h) = self.conns.get_mut(key.0) else { return };
        if !h.answered {
            read_request(h);
            let Some(req) = parse_request(&h.request) else {
                h.account(lp.buffered);
                return;
            };
            h.out = match req {
                HttpRequest::Metrics { .. } if cx.full => {
                    let why = "the broker's connection buffers are full (buffered_bytes_max): retry later\n";
                    response(503, TEXT_CONTENT_TYPE, why)
                }
                HttpRequest::Metrics { chunked } => {
                    h.scrape_asked = true;
                    h.chunked = chunked;
                    metrics_head(chunked)
                }
                HttpRequest::Health => response(200, TEXT_CONTENT_TYPE, "ok\n"),
                HttpRequest::Refused(status) => response(status, TEXT_CONTENT_TYPE, "refused\n"),
            };
            h.answered = true;
            h.request = Vec::new();
            // The response has as long again to be read.
            lp.timers.cancel(h.timer);
            h.timer = lp.timers.insert(lp.timers.now_ms() + self.timeout_ms, T::from(key));
        }
        self.write(key, lp, cx);
    }

    /// A connection's timer fired: a request still incomplete gets 408 (and
    /// as long again to be read); a response still unread is dropped.
    pub(crate) fn timeout<T: From<HttpKey>>(&mut self, key: HttpKey, lp: LoopParts<'_, T>, cx: &Scraping<'_>) {
        let Some(h) = self.conns.get_mut(key.0) else { return };
        if !h.answered {
            h.out = response(408, TEXT_CONTENT_TYPE, "request timeout\n");
            h.answered = true;
            let deadline = lp.timers.now_ms() + self.timeout_ms;
            h.timer = lp.timers.insert(deadline, T::from(key));
            self.write(key, lp, cx);
        } else {
            // The peer is not reading its response either.
            self.close(key, lp);
        }
    }

    /// Closes every connection (the broker is stopping).
    pub(crate) fn close_all<T>(&mut self, lp: LoopParts<'_, T>) {
        let keys: Vec<HttpKey> = self.conns.iter().map(|(k, _)| HttpKey(k)).collect();
        let LoopParts { registry, timers, buffered } = lp;
        for key in keys {
            self.close(key, LoopParts { registry, timers: &mut *timers, buffered: &mut *buffered });
        }
    }

    /// Writes what a connection has left, rendering the next slice of its
    /// scrape each time its output is written, while the turn's share
    /// lasts (else it waits in `ready`); closes it when done.
    fn write<T>(&mut self, key: HttpKey, lp: LoopParts<'_, T>, cx: &Scraping<'_>) {
        let Some(h) = self.conns.get_mut(key.0) else { return };
        let done = loop {
            if h.out_pos < h.out.len() {
                match h.stream.write(&h.out[h.out_pos..]) {
                    Ok(n) => h.out_pos += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break false,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break true,
                }
                continue;
            }
            h.out.clear();
            h.out_pos = 0;
            if h.scrape.is_none() && !h.scrape_asked {
                break true;
            }
            if self.turn_bytes_left == 0 {
                if !h.listed {
                    h.listed = true;
                    self.ready.push(key);
                }
                break false;
            }
            // Beginning lists every topic: it counts in the turn's share as
            // the bytes of the list, so that a hundred scrapes asked for
            // at once begin over a few turns.
            if std::mem::take(&mut h.scrape_asked) {
                let scrape = Scrape::new(cx.src.broker);
                self.turn_bytes_left = self.turn_bytes_left.saturating_sub(scrape.held_bytes());
                h.scrape = Some(scrape);
                continue;
            }
            let Some(scrape) = h.scrape.as_mut() else { break true };
            self.slice.clear();
            scrape.render(&cx.src, &mut self.slice, SCRAPE_SLICE_BYTES.min(self.turn_bytes_left));
            self.turn_bytes_left = self.turn_bytes_left.saturating_sub(self.slice.len());
            put_body(&mut h.out, &self.slice, h.chunked);
            if scrape.done() {
                h.scrape = None;
                if h.chunked {
                    h.out.extend_from_slice(b"0\r\n\r\n");
                }
            }
        };
        h.account(lp.buffered);
        if done {
            // FIN first, and drop what the peer still sends, so the close
            // does not turn into a reset that eats the response.
            let _ = h.stream.shutdown(std::net::Shutdown::Write);
            let mut sink = [0u8; 4096];
            for _ in 0..16 {
                if !matches!(h.stream.read(&mut sink), Ok(n) if n > 0) {
                    break;
                }
            }
            self.close(key, lp);
        }
    }

    fn close<T>(&mut self, key: HttpKey, lp: LoopParts<'_, T>) {
        if let Some(mut h) = self.conns.try_remove(key.0) {
            *lp.buffered -= h.counted_bytes as u64;
            lp.timers.cancel(h.timer);
            let _ = lp.registry.deregister(&mut h.stream);
        }
    }
}

/// Reads what the socket holds into the request head, until it would
/// block, ends, or the head is whole past its limit.
fn read_request(h: &mut HttpConn) {
    let mut buf = [0u8; 2048];
    loop {
        if h.request.len() >= HTTP_REQUEST_BYTES_MAX && parse_request(&h.request).is_some() {
            return;
        }
        match h.stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                // Past the limit the rest is read and dropped, so closing
                // does not reset the connection under the peer before it
                // reads the 431.
                let room = HTTP_REQUEST_BYTES_MAX.saturating_sub(h.request.len());
                h.request.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_parsed_or_refused() {
        assert_eq!(
            parse_request(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(HttpRequest::Metrics { chunked: true })
        );
        assert_eq!(parse_request(b"GET /metrics HTTP/1.0\r\n\r\n"), Some(HttpRequest::Metrics { chunked: false }));
        assert_eq!(parse_request(b"GET /healthz?x=1 HTTP/1.0\r\n\r\n"), Some(HttpRequest::Health));
        assert_eq!(parse_request(b"GET /metrics HTTP/1.1\r\nHost"), None);
        assert_eq!(parse_request(b"POST /metrics HTTP/1.1\r\n\r\n"), Some(HttpRequest::Refused(405)));
        assert_eq!(parse_request(b"GET /nope HTTP/1.1\r\n\r\n"), Some(HttpRequest::Refused(404)));
        assert_eq!(parse_request(b"garbage\r\n\r\n"), Some(HttpRequest::Refused(400)));
        assert_eq!(parse_request(b"GET / HTTP/2\r\n\r\n"), Some(HttpRequest::Refused(505)));
        assert_eq!(parse_request(&[b'a'; HTTP_REQUEST_BYTES_MAX]), Some(HttpRequest::Refused(431)));
    }

    #[test]
    fn a_token_names_the_key_it_was_made_from() {
        for key in [0, 1, 4095, 1 << 20] {
            assert_eq!(HttpKey::from_token(HttpKey(key).token()), Some(HttpKey(key)));
        }
        assert_eq!(HttpKey::from_token(Token(HTTP_TOKEN_BASE - 1)), None, "a client connection's token");
    }
}
