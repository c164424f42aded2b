//! A blocking client that speaks only the wire protocol (docs/protocol.md):
//! whatever it can do, a client in another language can do too.
//!
//! Simple calls (`produce`, `fetch`, `ack`, ...) send one request and wait
//! for its reply. Pipelining is `send` many requests, `flush` once, then
//! `recv` the replies, which come back in request order.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::codec::{self, DeadInfo, DecodeLimits, Decoded, ErrorCode, Ids, Reply, Request, TopicSettings};

/// Why a call failed.
#[derive(Debug)]
pub enum Error {
    Io(io::Error),
    /// The broker answered with an error status.
    Broker {
        code: u8,
        message: String,
    },
    /// The broker sent something this client cannot parse.
    Protocol(String),
}

impl Error {
    /// The broker's error code, if this is a broker error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Broker { code, .. } => ErrorCode::from_u8(*code),
            _ => None,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io(e) => write!(f, "connection: {e}"),
            Error::Broker { code, message } => {
                let name = ErrorCode::from_u8(*code).map_or("UNKNOWN", ErrorCode::name);
                write!(f, "broker error {name} ({code}): {message}")
            }
            Error::Protocol(m) => write!(f, "protocol: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// A delivered message, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    pub id: u64,
    pub born_ms: u64,
    pub delivery_count: u16,
    pub dead: Option<DeadInfo>,
    pub payload: Vec<u8>,
}

/// What an ACK, NACK or TOUCH did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdsResult {
    /// How many ids took effect.
    pub done: u32,
    /// The ids that did not.
    pub failed: Vec<u64>,
}

/// One STATS section: its name ("" for the broker) and its counters.
pub type StatsSection = (String, Vec<(String, u64)>);

/// A reply, owned (for pipelined `recv`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnedReply {
    Hello { version: u16, limits: DecodeLimits },
    Pong,
    Produced { first_id: u64, count: u32 },
    Messages { topic: String, messages: Vec<Delivered> },
    Ids(IdsResult),
    Stats(Vec<StatsSection>),
    Created(bool),
    Count(u64),
    Topics(Vec<(String, TopicSettings)>),
}

/// FETCH parameters.
#[derive(Clone, Copy, Debug)]
pub struct Fetch {
    pub max_messages: u32,
    /// Payload budget; 0 = the broker's fetch_bytes_max.
    pub max_bytes: u32,
    /// Long-poll wait; 0 = answer at once.
    pub wait_ms: u32,
    /// 0 = the topic's.
    pub ack_timeout_ms: u32,
}

impl Default for Fetch {
    fn default() -> Self {
        Fetch { max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 }
    }
}

/// A connection to a broker.
pub struct Client {
    stream: TcpStream,
    /// Requests encoded but not yet written.
    wbuf: Vec<u8>,
    /// Bytes received and not yet decoded.
    rbuf: Vec<u8>,
    /// How much of `rbuf` has been decoded (compacted when it is empty or
    /// half the buffer, not per reply).
    rpos: usize,
    /// Ids of requests sent and not yet answered, in order.
    waiting: VecDeque<u32>,
    next_id: u32,
    /// The broker's limits, from HELLO.
    pub limits: DecodeLimits,
    pub version: u16,
    /// Scratch for batch and id bodies.
    body: Vec<u8>,
}

impl Client {
    /// Connects and says HELLO.
    pub fn connect(addr: impl ToSocketAddrs) -> Result<Client> {
        Client::connect_with(addr, b"")
    }

    /// Connects and says HELLO with an auth token.
    pub fn connect_with(addr: impl ToSocketAddrs, token: &[u8]) -> Result<Client> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        let mut c = Client {
            stream,
            wbuf: Vec::new(),
            rbuf: Vec::new(),
            rpos: 0,
            waiting: VecDeque::new(),
            next_id: 1,
            limits: DecodeLimits::CLIENT,
            version: 0,
            body: Vec::new(),
        };
        let req = Request::Hello { min_version: codec::VERSION_MIN, max_version: codec::VERSION_MAX, token };
        match c.call(&req)? {
            OwnedReply::Hello { version, limits } => {
                c.version = version;
                c.limits = limits;
                Ok(c)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// A read timeout for replies (None waits forever).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> Result<()> {
        self.stream.set_read_timeout(timeout)?;
        Ok(())
    }

    /// Queues a request; returns its request id. Nothing is written until
    /// `flush` (or a call that waits for a reply).
    pub fn send(&mut self, req: &Request<'_>) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        codec::encode_request(&mut self.wbuf, id, req);
        self.waiting.push_back(id);
        id
    }

    /// Queues a PRODUCE of `payloads`.
    pub fn send_produce<P: AsRef<[u8]>>(&mut self, topic: &str, payloads: &[P]) -> u32 {
        let mut body = std::mem::take(&mut self.body);
        body.clear();
        codec::encode_batch(&mut body, payloads);
        let id =
            self.send(&Request::Produce { topic, batch: codec::Batch { count: payloads.len() as u32, bytes: &body } });
        self.body = body;
        id
    }

    /// Writes every queued request.
    pub fn flush(&mut self) -> Result<()> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf)?;
            self.wbuf.clear();
        }
        Ok(())
    }

    /// Requests sent and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.waiting.len()
    }

    /// Waits for the next reply. A broker error comes back as `Err`.
    pub fn recv(&mut self) -> Result<OwnedReply> {
        self.flush()?;
        loop {
            match codec::decode_reply(&self.rbuf[self.rpos..], usize::MAX) {
                Ok(Decoded::Frame(frame, n)) => {
                    let expected = self.waiting.pop_front();
                    let (op, request_id) = (frame.op, frame.request_id);
                    let reply = own(frame.reply);
                    self.rpos += n;
                    if self.rpos == self.rbuf.len() {
                        self.rbuf.clear();
                        self.rpos = 0;
                    } else if self.rpos > self.rbuf.len() / 2 {
                        self.rbuf.drain(..self.rpos);
                        self.rpos = 0;
                    }
                    // Connection-level errors (op 0) answer no request.
                    if op == 0 {
                        if let Some(e) = expected {
                            self.waiting.push_front(e);
                        }
                        return reply;
                    }
                    if expected != Some(request_id) {
                        return Err(Error::Protocol(format!(
                            "reply for request {request_id} while waiting for {expected:?}"
                        )));
                    }
                    return reply;
                }
                Ok(Decoded::NeedMore) => {}
                Err(e) => return Err(Error::Protocol(e)),
            }
            let mut chunk = [0u8; 64 << 10];
            // A signal delivered to this thread interrupts the read; nothing
            // was read, so read again (std's read does not retry EINTR).
            let n = loop {
                match self.stream.read(&mut chunk) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    r => break r?,
                }
            };
            if n == 0 {
                return Err(Error::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "broker closed the connection")));
            }
            self.rbuf.extend_from_slice(&chunk[..n]);
        }
    }

    fn call(&mut self, req: &Request<'_>) -> Result<OwnedReply> {
        if !self.waiting.is_empty() {
            return Err(Error::Protocol("a simple call while pipelined replies are unread".into()));
        }
        self.send(req);
        self.recv()
    }

    pub fn ping(&mut self) -> Result<()> {
        match self.call(&Request::Ping)? {
            OwnedReply::Pong => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Produces one message; returns its id once the broker acknowledged it.
    pub fn produce(&mut self, topic: &str, payload: &[u8]) -> Result<u64> {
        self.produce_batch(topic, &[payload]).map(|(first, _)| first)
    }

    /// Produces a batch atomically; returns (first id, count).
    pub fn produce_batch<P: AsRef<[u8]>>(&mut self, topic: &str, payloads: &[P]) -> Result<(u64, u32)> {
        if !self.waiting.is_empty() {
            return Err(Error::Protocol("a simple call while pipelined replies are unread".into()));
        }
        self.send_produce(topic, payloads);
        match self.recv()? {
            OwnedReply::Produced { first_id, count } => Ok((first_id, count)),
            other => Err(unexpected(&other)),
        }
    }

    pub fn fetch(&mut self, topic: &str, f: Fetch) -> Result<Vec<Delivered>> {
        let req = Request::Fetch {
            topic,
            max_messages: f.max_messages,
            max_bytes: f.max_bytes,
            wait_ms: f.wait_ms,
            ack_timeout_ms: f.ack_timeout_ms,
        };
        match self.call(&req)? {
            OwnedReply::Messages { messages, .. } => Ok(messages),
            other => Err(unexpected(&other)),
        }
    }

    /// Encodes `ids` into the scratch body (given back by the caller).
    fn ids_body(&mut self, ids: &[u64]) -> Vec<u8> {
        let mut body = std::mem::take(&mut self.body);
        body.clear();
        codec::encode_ids(&mut body, ids);
        body
    }

    pub fn ack(&mut self, topic: &str, ids: &[u64]) -> Result<IdsResult> {
        let body = self.ids_body(ids);
        let r = self.call(&Request::Ack { topic, ids: Ids { bytes: &body } });
        self.body = body;
        ids_result(r)
    }

    /// NACK: back to ready after `delay_ms` (0 = now), or to the
    /// dead-letter topic at once with `dead_letter`.
    pub fn nack(&mut self, topic: &str, ids: &[u64], delay_ms: u32, dead_letter: bool) -> Result<IdsResult> {
        let flags = if dead_letter { codec::NACK_FLAG_DEAD_LETTER } else { 0 };
        let body = self.ids_body(ids);
        let r = self.call(&Request::Nack { topic, delay_ms, flags, ids: Ids { bytes: &body } });
        self.body = body;
        ids_result(r)
    }

    pub fn touch(&mut self, topic: &str, ids: &[u64], ack_timeout_ms: u32) -> Result<IdsResult> {
        let body = self.ids_body(ids);
        let r = self.call(&Request::Touch { topic, ack_timeout_ms, ids: Ids { bytes: &body } });
        self.body = body;
        ids_result(r)
    }

    /// STATS for one topic, or every topic with `None`.
    pub fn stats(&mut self, topic: Option<&str>) -> Result<Vec<StatsSection>> {
        match self.call(&Request::Stats { topic: topic.unwrap_or("") })? {
            OwnedReply::Stats(s) => Ok(s),
            other => Err(unexpected(&other)),
        }
    }

    /// One counter of one section ("" = broker), if present.
    pub fn stat(&mut self, section: &str, key: &str) -> Result<Option<u64>> {
        let topic = if section.is_empty() { None } else { Some(section) };
        let stats = self.stats(topic)?;
        Ok(stats.iter().find(|s| s.0 == section).and_then(|s| s.1.iter().find(|kv| kv.0 == key)).map(|kv| kv.1))
    }

    /// Creates a topic or updates its settings; true if it was created.
    pub fn create_topic(&mut self, topic: &str, settings: TopicSettings) -> Result<bool> {
        match self.call(&Request::CreateTopic { topic, settings })? {
            OwnedReply::Created(c) => Ok(c),
            other => Err(unexpected(&other)),
        }
    }

    fn count_call(&mut self, req: &Request<'_>) -> Result<u64> {
        match self.call(req)? {
            OwnedReply::Count(n) => Ok(n),
            other => Err(unexpected(&other)),
        }
    }

    pub fn delete_topic(&mut self, topic: &str) -> Result<u64> {
        self.count_call(&Request::DeleteTopic { topic })
    }
    pub fn purge_topic(&mut self, topic: &str) -> Result<u64> {
        self.count_call(&Request::PurgeTopic { topic })
    }
    /// Moves up to `max_messages` (0 = all) from `<topic>.dlq` back to `topic`.
    pub fn redrive(&mut self, topic: &str, max_messages: u32) -> Result<u64> {
        self.count_call(&Request::Redrive { topic, max_messages })
    }
    pub fn list_topics(&mut self) -> Result<Vec<(String, TopicSettings)>> {
        match self.call(&Request::ListTopics)? {
            OwnedReply::Topics(t) => Ok(t),
            other => Err(unexpected(&other)),
        }
    }

    /// Writes raw bytes (tests of malformed input).
    pub fn write_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Expects a reply to a request written with `write_raw`.
    pub fn expect_reply(&mut self, request_id: u32) {
        self.waiting.push_back(request_id);
    }

    /// The socket, for tests that need to half-close or time out.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }
}

fn ids_result(r: Result<OwnedReply>) -> Result<IdsResult> {
    match r? {
        OwnedReply::Ids(r) => Ok(r),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(r: &OwnedReply) -> Error {
    Error::Protocol(format!("unexpected reply {r:?}"))
}

fn own(r: Reply<'_>) -> Result<OwnedReply> {
    Ok(match r {
        Reply::Hello { version, limits } => OwnedReply::Hello { version, limits },
        Reply::Pong => OwnedReply::Pong,
        Reply::Produced { first_id, count } => OwnedReply::Produced { first_id, count },
        Reply::Messages { topic, messages } => OwnedReply::Messages {
            topic: topic.to_string(),
            messages: messages
                .into_iter()
                .map(|m| Delivered {
                    id: m.id,
                    born_ms: m.born_ms,
                    delivery_count: m.delivery_count,
                    dead: m.dead,
                    payload: m.payload.to_vec(),
                })
                .collect(),
        },
        Reply::Ids { done, failed } => OwnedReply::Ids(IdsResult { done, failed }),
        Reply::Stats(s) => OwnedReply::Stats(
            s.into_iter()
                .map(|(n, kv)| (n.to_string(), kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
                .collect(),
        ),
        Reply::Created { created } => OwnedReply::Created(created),
        Reply::Count(n) => OwnedReply::Count(n),
        Reply::Topics(t) => OwnedReply::Topics(t.into_iter().map(|(n, s)| (n.to_string(), s)).collect()),
        Reply::Error { code, message } => return Err(Error::Broker { code, message: message.to_string() }),
    })
}
