//! A blocking client that speaks only the wire protocol (docs/protocol.md):
//! whatever it can do, a client in another language can do too.
//!
//! Simple calls (`produce`, `fetch`, `ack`, ...) send one request and wait
//! for its reply. Pipelining is `send` many requests, `flush` once, then
//! `recv` the replies, which come back in request order.
//!
//! The client offers every version its codec speaks and uses the one the
//! broker picks. Against a version-1 broker it speaks version 1: consumer
//! groups and message properties (version 2) are refused with
//! `Error::Version` before anything is sent, and every other call works,
//! on the default group.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

pub use crate::codec::inspect::State;
use crate::codec::props::{self, PropsLimits};
pub use crate::codec::schedule::When;
use crate::codec::{self, DeadInfo, DecodeLimits, Decoded, ErrorCode, GroupSettings, GroupStats, Ids, Props};
use crate::codec::{Reply, Request, Start, TopicOptions, TopicSettings};

#[path = "client/owned.rs"]
mod owned;
pub use owned::*;

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
    /// The broker's limits, from HELLO: a version-1 session is told the
    /// first four, one of versions 2 to 5 the first twelve, and one of
    /// version 6 every one, the limits of push credit, keys, dedup ids,
    /// NACK reasons and LOOKUP among them; a limit not told is 0.
    pub limits: DecodeLimits,
    /// The protocol version the broker chose.
    pub version: u16,
    /// The broker's shard map epoch (version 2); 0 = not sharded.
    pub map_epoch: u64,
    /// Scratch for batch and id bodies.
    body: Vec<u8>,
    /// Messages of push subscriptions received and not yet taken
    /// (`next_pushed`): set aside while replies are read.
    pushed: VecDeque<Pushed>,
    /// The flags every PRODUCE carries (`set_produce_flags`).
    produce_flags: u8,
}

impl Client {
    /// Connects and says HELLO.
    pub fn connect(addr: impl ToSocketAddrs) -> Result<Client> {
        Client::connect_with(addr, b"")
    }

    /// Connects and says HELLO with an auth token.
    pub fn connect_with(addr: impl ToSocketAddrs, token: &[u8]) -> Result<Client> {
        Client::connect_upto(addr, token, codec::CODEC_VERSION_MAX)
    }

    /// Connects and says HELLO offering versions up to `max_version` (a
    /// client that wants version 1's layouts whatever the broker speaks).
    pub fn connect_upto(addr: impl ToSocketAddrs, token: &[u8], max_version: u16) -> Result<Client> {
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
            map_epoch: 0,
            body: Vec::new(),
            pushed: VecDeque::new(),
            produce_flags: 0,
        };
        let req = Request::Hello { min_version: codec::VERSION_MIN, max_version, token };
        match c.call(&req)? {
            OwnedReply::Hello { version, .. }
                if !(codec::VERSION_MIN..=codec::CODEC_VERSION_MAX).contains(&version) =>
            {
                Err(Error::Protocol(format!("the broker chose version {version}, which this client did not offer")))
            }
            OwnedReply::Hello { version, limits, map_epoch } => {
                c.version = version;
                c.limits = limits;
                c.map_epoch = map_epoch;
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

    /// Queues a request, in the negotiated version's layout; returns its
    /// request id. Nothing is written until `flush` (or a call that waits
    /// for a reply). A request the version cannot carry is a programmer
    /// error here (it panics); `try_send` returns `Error::Version`.
    pub fn send(&mut self, req: &Request<'_>) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        codec::encode_request(&mut self.wbuf, id, req, self.version);
        self.waiting.push_back(id);
        id
    }

    /// `send`, or `Error::Version` if the request needs a version the
    /// broker does not speak.
    pub fn try_send(&mut self, req: &Request<'_>) -> Result<u32> {
        self.require(req.version_needed())?;
        Ok(self.send(req))
    }

    /// `Error::Version` unless the broker speaks version `needed` (before
    /// HELLO, version 0: the layouts of version 1, HELLO's among them).
    fn require(&self, needed: u16) -> Result<()> {
        if self.version.max(1) < needed {
            return Err(Error::Version { needed, version: self.version });
        }
        Ok(())
    }

    /// Queues a PRODUCE of `payloads`.
    pub fn send_produce<P: AsRef<[u8]>>(&mut self, topic: &str, payloads: &[P]) -> u32 {
        let mut body = std::mem::take(&mut self.body);
        body.clear();
        let with_props = self.version >= 2;
        for p in payloads {
            if with_props {
                codec::encode_message(&mut body, &Props::EMPTY, p.as_ref());
            } else {
                codec::encode_batch(&mut body, &[p]);
            }
        }
        let batch = codec::Batch { count: payloads.len() as u32, bytes: &body, with_props };
        let id = self.send(&Request::Produce { topic, flags: self.produce_flags, batch });
        self.body = body;
        id
    }

    /// Queues a PRODUCE of messages with tags and headers (version 2, or
    /// version 1 when none has any).
    pub fn send_produce_messages(&mut self, topic: &str, messages: &[ProduceMessage<'_>]) -> Result<u32> {
        if self.version < 2 {
            if messages.iter().any(ProduceMessage::has_props) {
                self.require(2)?;
            }
            let payloads: Vec<&[u8]> = messages.iter().map(|m| m.payload).collect();
            return Ok(self.send_produce(topic, &payloads));
        }
        let mut body = std::mem::take(&mut self.body);
        body.clear();
        if let Err(e) = self.encode_messages(&mut body, messages) {
            self.body = body;
            return Err(e);
        }
        let batch = codec::Batch { count: messages.len() as u32, bytes: &body, with_props: true };
        let id = self.send(&Request::Produce { topic, flags: self.produce_flags, batch });
        self.body = body;
        Ok(id)
    }

    /// Appends `messages` to `body` in version 2's layout, their properties
    /// checked against the wire's bounds (the broker judges its limits).
    fn encode_messages(&self, body: &mut Vec<u8>, messages: &[ProduceMessage<'_>]) -> Result<()> {
        let limits = PropsLimits { props_bytes_max: u32::from(u16::MAX), ..PropsLimits::ANY };
        for (i, m) in messages.iter().enumerate() {
            let parsed = match &m.invalid {
                Some(why) => Err(why.clone()),
                None => Props::parse(&m.props, self.version, &limits).map_err(|e| e.message),
            };
            match parsed {
                Ok(p) => codec::encode_message(body, &p, m.payload),
                Err(e) => return Err(Error::Invalid(format!("message {i}: {e}"))),
            }
        }
        Ok(())
    }

    /// ACK_PRODUCE (version 3): acks `ids` of `group` of `topic` and
    /// produces each output's messages to its topic, all of it or none.
    /// If `failed` in the result is not empty, those ids were not in
    /// flight to this connection and nothing was done.
    pub fn ack_produce(
        &mut self,
        (topic, group): (&str, &str),
        ids: &[u64],
        outputs: &[(&str, &[ProduceMessage<'_>])],
    ) -> Result<AckProduced> {
        self.require(codec::SINCE_PUSH)?;
        let mut out_bytes = Vec::new();
        let mut messages = Vec::new();
        for (name, batch) in outputs {
            messages.clear();
            self.encode_messages(&mut messages, batch)?;
            let b = codec::Batch { count: batch.len() as u32, bytes: &messages, with_props: true };
            codec::ack_produce::encode_output(&mut out_bytes, name, &b);
        }
        let ids_bytes = self.ids_body(ids);
        let outputs = codec::ack_produce::Outputs { count: outputs.len() as u16, bytes: &out_bytes };
        let req = Request::AckProduce { topic, group, ids: codec::Ids { bytes: &ids_bytes }, outputs };
        let r = self.call(&req);
        self.body = ids_bytes;
        match r? {
            OwnedReply::AckProduced(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// Sets the flags every PRODUCE from now on carries (version 3): with
    /// `codec::PRODUCE_FLAG_WRITTEN`, a produce is acknowledged once the
    /// broker has written it, before its `fdatasync` (docs/protocol.md,
    /// "Durability per produce").
    pub fn set_produce_flags(&mut self, flags: u8) -> Result<()> {
        if flags != 0 {
            self.require(codec::SINCE_PRODUCE_FLAGS)?;
        }
        self.produce_flags = flags;
        Ok(())
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
    /// Pushed frames that arrive first are set aside for `next_pushed`.
    pub fn recv(&mut self) -> Result<OwnedReply> {
        self.flush()?;
        loop {
            let Some((op, request_id, reply)) = self.read_frame()? else { continue };
            // Connection-level errors (op 0) answer no request.
            if op == 0 {
                return reply;
            }
            let expected = self.waiting.pop_front();
            if expected != Some(request_id) {
                return Err(Error::Protocol(format!("reply for request {request_id} while waiting for {expected:?}")));
            }
            return reply;
        }
    }

    /// Waits for the next message of a push subscription (version 3): one
    /// set aside while replies were read, or the next pushed frame's. No
    /// reply may be awaited (read those with `recv` first).
    pub fn next_pushed(&mut self) -> Result<Pushed> {
        self.no_pipelined_replies()?;
        self.flush()?;
        loop {
            if let Some(p) = self.pushed.pop_front() {
                return Ok(p);
            }
            if let Some((_, _, reply)) = self.read_frame()? {
                return Err(unexpected(&reply?));
            }
        }
    }

    /// Messages of push subscriptions received and not yet taken.
    pub fn pushed_waiting(&self) -> usize {
        self.pushed.len()
    }

    /// Reads the next frame: a pushed frame's messages are set aside (and
    /// None returned); a reply is returned with its op and request id.
    fn read_frame(&mut self) -> Result<Option<(u8, u32, Result<OwnedReply>)>> {
        loop {
            match codec::decode_reply(&self.rbuf[self.rpos..], usize::MAX) {
                Ok(Decoded::Frame(frame, n)) => {
                    let (op, request_id) = (frame.op, frame.request_id);
                    let reply = match frame.reply {
                        Reply::Pushed { topic, messages } => {
                            let topic = topic.to_string();
                            self.pushed.extend(messages.iter().map(|m| Pushed {
                                subscription: request_id,
                                topic: topic.clone(),
                                message: own_message(m),
                            }));
                            None
                        }
                        other => Some((op, request_id, own(other))),
                    };
                    self.consumed(n);
                    return Ok(reply);
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
                let cut = Closed { partial_frame_bytes: self.rbuf.len() - self.rpos };
                return Err(Error::Io(io::Error::new(io::ErrorKind::UnexpectedEof, cut)));
            }
            self.rbuf.extend_from_slice(&chunk[..n]);
        }
    }

    /// `n` bytes of the read buffer were decoded: drops them once they are
    /// all of it or half of it.
    fn consumed(&mut self, n: usize) {
        self.rpos += n;
        if self.rpos == self.rbuf.len() {
            self.rbuf.clear();
            self.rpos = 0;
        } else if self.rpos > self.rbuf.len() / 2 {
            self.rbuf.drain(..self.rpos);
            self.rpos = 0;
        }
    }

    /// Sends `req` and waits for its reply; `Error::Version` (nothing
    /// sent) if the broker's version cannot carry it.
    fn call(&mut self, req: &Request<'_>) -> Result<OwnedReply> {
        self.no_pipelined_replies()?;
        self.try_send(req)?;
        self.recv()
    }

    fn no_pipelined_replies(&self) -> Result<()> {
        if !self.waiting.is_empty() {
            return Err(Error::Protocol("a simple call while pipelined replies are unread".into()));
        }
        Ok(())
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
        self.no_pipelined_replies()?;
        self.send_produce(topic, payloads);
        produced(self.recv())
    }

    /// Produces messages with tags and headers atomically (version 2);
    /// returns (first id, count).
    pub fn produce_messages(&mut self, topic: &str, messages: &[ProduceMessage<'_>]) -> Result<(u64, u32)> {
        self.no_pipelined_replies()?;
        self.send_produce_messages(topic, messages)?;
        produced(self.recv())
    }

    /// Produces messages atomically, some with dedup ids (version 4);
    /// returns each message's id, a duplicate's being the original's.
    pub fn produce_messages_ids(&mut self, topic: &str, messages: &[ProduceMessage<'_>]) -> Result<Vec<u64>> {
        self.no_pipelined_replies()?;
        self.send_produce_messages(topic, messages)?;
        let reply = self.recv()?;
        crate::producer::message_ids(messages.len(), &reply).ok_or_else(|| unexpected(&reply))
    }

    /// FETCH for the default group.
    pub fn fetch(&mut self, topic: &str, f: Fetch) -> Result<Vec<Delivered>> {
        self.fetch_group(topic, "", f)
    }

    /// FETCH for `group` ("" = the default group; any other needs version
    /// 2). A group that does not exist yet is created from the topic's
    /// newest message on (docs/protocol.md, "Consumer groups").
    pub fn fetch_group(&mut self, topic: &str, group: &str, f: Fetch) -> Result<Vec<Delivered>> {
        let req = Request::Fetch {
            topic,
            group,
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
        self.ack_group(topic, "", ids)
    }

    /// ACK for `group`: the messages are done for that group alone.
    pub fn ack_group(&mut self, topic: &str, group: &str, ids: &[u64]) -> Result<IdsResult> {
        let body = self.ids_body(ids);
        let r = self.call(&Request::Ack { topic, group, ids: Ids { bytes: &body } });
        self.body = body;
        ids_result(r)
    }

    /// NACK: back to ready after `delay_ms` (0 = now), or to the
    /// dead-letter topic at once with `dead_letter`.
    pub fn nack(&mut self, topic: &str, ids: &[u64], delay_ms: u32, dead_letter: bool) -> Result<IdsResult> {
        self.nack_group(topic, "", ids, delay_ms, dead_letter)
    }

    /// NACK for `group`.
    pub fn nack_group(
        &mut self,
        topic: &str,
        group: &str,
        ids: &[u64],
        delay_ms: u32,
        dead_letter: bool,
    ) -> Result<IdsResult> {
        self.nack_why(topic, group, ids, (delay_ms, dead_letter), "")
    }

    /// `nack_group` saying why (version 4; empty: no reason): the broker
    /// keeps the reason with each message as its last NACK reason, shows
    /// it in PEEK and LOOKUP, and puts it in a dead letter's copy
    /// (property `last_nack_reason`). At most `nack_reason_bytes_max`
    /// bytes.
    pub fn nack_why(
        &mut self,
        topic: &str,
        group: &str,
        ids: &[u64],
        (delay_ms, dead_letter): (u32, bool),
        reason: &str,
    ) -> Result<IdsResult> {
        let mut flags = if dead_letter { codec::NACK_FLAG_DEAD_LETTER } else { 0 };
        if !reason.is_empty() {
            self.require(codec::SINCE_NACK_REASON)?;
            flags |= codec::NACK_FLAG_REASON;
        }
        let body = self.ids_body(ids);
        let r = self.call(&Request::Nack { topic, group, delay_ms, flags, ids: Ids { bytes: &body }, reason });
        self.body = body;
        ids_result(r)
    }

    pub fn touch(&mut self, topic: &str, ids: &[u64], ack_timeout_ms: u32) -> Result<IdsResult> {
        self.touch_group(topic, "", ids, ack_timeout_ms)
    }

    /// TOUCH for `group`.
    pub fn touch_group(&mut self, topic: &str, group: &str, ids: &[u64], ack_timeout_ms: u32) -> Result<IdsResult> {
        let body = self.ids_body(ids);
        let r = self.call(&Request::Touch { topic, group, ack_timeout_ms, ids: Ids { bytes: &body } });
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
        self.create_topic_with(topic, settings, TopicOptions::default())
    }

    /// CREATE_TOPIC with the settings list of version 4 (a dedup window):
    /// `Error::Version` from a broker that does not speak it.
    pub fn create_topic_with(&mut self, topic: &str, settings: TopicSettings, options: TopicOptions) -> Result<bool> {
        let req = Request::CreateTopic { topic, settings, options };
        self.require(req.version_needed())?;
        match self.call(&req)? {
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
        self.redrive_group(topic, "", max_messages)
    }
    /// Moves up to `max_messages` (0 = all) of the dead letters `group`
    /// made back to `topic`, for that group only (version 2 for a group
    /// other than the default one).
    pub fn redrive_group(&mut self, topic: &str, group: &str, max_messages: u32) -> Result<u64> {
        self.count_call(&Request::Redrive { topic, group, max_messages })
    }
    pub fn list_topics(&mut self) -> Result<Vec<(String, TopicSettings)>> {
        match self.call(&Request::ListTopics)? {
            OwnedReply::Topics(t) => Ok(t),
            other => Err(unexpected(&other)),
        }
    }

    /// Creates a consumer group starting at `start`, or changes the
    /// settings of an existing one (not its position). Returns whether it
    /// was created, and its cursor. Version 2.
    pub fn create_group(
        &mut self,
        topic: &str,
        group: &str,
        settings: GroupSettings<'_>,
        start: Start,
    ) -> Result<(bool, u64)> {
        match self.call(&Request::CreateGroup { topic, group, settings, start })? {
            OwnedReply::GroupCreated { created, cursor } => Ok((created, cursor)),
            other => Err(unexpected(&other)),
        }
    }

    /// Deletes a group; returns how many messages it held. Version 2.
    pub fn delete_group(&mut self, topic: &str, group: &str) -> Result<u64> {
        self.count_call(&Request::DeleteGroup { topic, group })
    }

    /// Every group of `topic`, with its settings and state. Version 2.
    pub fn list_groups(&mut self, topic: &str) -> Result<Vec<GroupEntry>> {
        match self.call(&Request::ListGroups { topic })? {
            OwnedReply::Groups(g) => Ok(g),
            other => Err(unexpected(&other)),
        }
    }

    /// Moves a group's cursor to `start`, dropping what it had in flight;
    /// returns the new cursor. Version 2.
    pub fn reset_group(&mut self, topic: &str, group: &str, start: Start) -> Result<u64> {
        match self.call(&Request::ResetGroup { topic, group, start })? {
            OwnedReply::Cursor(c) => Ok(c),
            other => Err(unexpected(&other)),
        }
    }

    /// SUBSCRIBE to `group` of `topic` (version 3) with `credit`, the most
    /// messages it may hold unacknowledged, and an ack timeout (0: the
    /// group's); returns the subscription's id. Its messages come through
    /// `next_pushed` (or `subscription`); ACK or NACK each as usual, for
    /// the same group.
    pub fn subscribe(&mut self, topic: &str, group: &str, credit: u32, ack_timeout_ms: u32) -> Result<u32> {
        match self.call(&Request::Subscribe { topic, group, credit, ack_timeout_ms })? {
            OwnedReply::Subscribed(id) => Ok(id),
            other => Err(unexpected(&other)),
        }
    }

    /// Cancels scheduled message `id`: it leaves the topic. Returns the
    /// time it was due. Version 3.
    pub fn cancel(&mut self, topic: &str, id: u64) -> Result<u64> {
        match self.call(&Request::Cancel { topic, id })? {
            OwnedReply::Due(at) => Ok(at),
            other => Err(unexpected(&other)),
        }
    }

    /// Sets a subscription's credit (0 pauses it); returns how many of its
    /// group's messages this connection holds.
    pub fn credit(&mut self, subscription: u32, credit: u32) -> Result<u32> {
        match self.call(&Request::Credit { subscription, credit })? {
            OwnedReply::Credited(n) => Ok(n),
            other => Err(unexpected(&other)),
        }
    }

    /// Moves scheduled message `id` to a new time; returns that time (ms
    /// since the Unix epoch, the broker's clock). Version 3.
    pub fn reschedule(&mut self, topic: &str, id: u64, when: When) -> Result<u64> {
        match self.call(&Request::Reschedule { topic, id, when })? {
            OwnedReply::Due(at) => Ok(at),
            other => Err(unexpected(&other)),
        }
    }

    /// LOOKUP (version 4): the most recent messages of `topic` with key
    /// `key`, newest first, without their payloads, each with its state in
    /// every group.
    pub fn lookup(&mut self, topic: &str, key: &[u8]) -> Result<Vec<Inspection>> {
        match self.call(&Request::Lookup { topic, key })? {
            OwnedReply::Inspected(entries) => Ok(entries),
            other => Err(unexpected(&other)),
        }
    }

    /// PEEK (version 4): message `id` of `topic` with its payload and its
    /// state in every group, without delivering it. NOT_FOUND if the
    /// topic does not hold it.
    pub fn peek(&mut self, topic: &str, id: u64) -> Result<Inspection> {
        match self.call(&Request::Peek { topic, id })? {
            OwnedReply::Inspected(mut entries) if entries.len() == 1 => Ok(entries.remove(0)),
            other => Err(unexpected(&other)),
        }
    }

    /// Ends a subscription; what this connection held of its group returns
    /// to ready. Returns how many messages that was. Messages pushed before
    /// the reply may still be waiting in `next_pushed`.
    pub fn unsubscribe(&mut self, subscription: u32) -> Result<u64> {
        match self.call(&Request::Unsubscribe { subscription })? {
            OwnedReply::Count(n) => Ok(n),
            other => Err(unexpected(&other)),
        }
    }

    /// The pushed messages as an iterator that waits for each
    /// (`next_pushed`); it ends at the first error, which it yields.
    pub fn subscription(&mut self) -> impl Iterator<Item = Result<Pushed>> + '_ {
        let mut failed = false;
        std::iter::from_fn(move || {
            if failed {
                return None;
            }
            let next = self.next_pushed();
            failed = next.is_err();
            Some(next)
        })
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

    /// Bytes received from the broker and not yet decoded: a frame, or
    /// part of one, that a read already took from the socket, so that a
    /// wait for the socket to be readable would not see it.
    pub fn buffered_bytes(&self) -> usize {
        self.rbuf.len() - self.rpos
    }

    /// The socket: for a caller that waits for it to be readable (with
    /// `buffered_bytes` and `pushed_waiting` first), and for tests that
    /// need to half-close or time out.
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

fn produced(r: Result<OwnedReply>) -> Result<(u64, u32)> {
    match r? {
        OwnedReply::Produced { first_id, count } => Ok((first_id, count)),
        other => Err(unexpected(&other)),
    }
}

fn own_inspected(e: &codec::inspect::Inspected<'_>) -> Inspection {
    let message = e.message.map(|m| InspectedMessage {
        born_ms: m.born_ms,
        dead: m.dead,
        props: m.props.bytes().to_vec(),
        len: m.len,
        payload: m.payload.map(<[u8]>::to_vec),
    });
    let line = |g: &codec::inspect::GroupLine<'_>| GroupLine {
        group: g.name.to_string(),
        state: g.state,
        deliveries: g.deliveries,
        until_ms: g.until_ms,
        consumer: g.consumer,
        dead_reason: g.dead_reason,
        last_nack_reason: g.last_nack_reason.to_string(),
    };
    Inspection { id: e.id, message, groups: e.groups.iter().map(line).collect() }
}

fn unexpected(r: &OwnedReply) -> Error {
    Error::Protocol(format!("unexpected reply {r:?}"))
}

fn own_message(m: &codec::Message<'_>) -> Delivered {
    Delivered {
        id: m.id,
        born_ms: m.born_ms,
        delivery_count: m.delivery_count,
        dead: m.dead,
        origin_group: m.origin_group.to_string(),
        props: m.props.bytes().to_vec(),
        payload: m.payload.to_vec(),
    }
}

fn own_group(g: &codec::GroupInfo<'_>) -> GroupEntry {
    GroupEntry {
        name: g.name.to_string(),
        broadcast: g.settings.broadcast,
        ordered: g.settings.ordered,
        ack_timeout_ms: g.settings.ack_timeout_ms,
        max_deliveries: g.settings.max_deliveries,
        filter: g.settings.filter.to_string(),
        retry: g.settings.retry,
        stats: g.stats,
    }
}

fn own(r: Reply<'_>) -> Result<OwnedReply> {
    Ok(match r {
        Reply::Hello { version, limits, map_epoch } => OwnedReply::Hello { version, limits, map_epoch },
        Reply::Pong => OwnedReply::Pong,
        Reply::Produced { first_id, count } => OwnedReply::Produced { first_id, count },
        Reply::Deduplicated { first_id, count, duplicates } => OwnedReply::Deduplicated { first_id, count, duplicates },
        Reply::Messages { topic, messages } => {
            OwnedReply::Messages { topic: topic.to_string(), messages: messages.iter().map(own_message).collect() }
        }
        Reply::Ids { done, failed } => OwnedReply::Ids(IdsResult { done, failed }),
        Reply::Stats(s) => OwnedReply::Stats(
            s.into_iter()
                .map(|(n, kv)| (n.to_string(), kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
                .collect(),
        ),
        Reply::Created { created } => OwnedReply::Created(created),
        Reply::Count(n) => OwnedReply::Count(n),
        Reply::Topics(t) => OwnedReply::Topics(t.into_iter().map(|(n, s)| (n.to_string(), s)).collect()),
        Reply::GroupCreated { created, cursor } => OwnedReply::GroupCreated { created, cursor },
        Reply::Groups(g) => OwnedReply::Groups(g.iter().map(own_group).collect()),
        Reply::Cursor(c) => OwnedReply::Cursor(c),
        Reply::Subscribed { subscription } => OwnedReply::Subscribed(subscription),
        Reply::Credited { inflight } => OwnedReply::Credited(inflight),
        Reply::AckProduced { done, failed, outputs } => OwnedReply::AckProduced(AckProduced { done, failed, outputs }),
        // `read_frame` sets pushed frames aside before this.
        Reply::Pushed { topic, messages } => {
            OwnedReply::Messages { topic: topic.to_string(), messages: messages.iter().map(own_message).collect() }
        }
        Reply::Due(at) => OwnedReply::Due(at),
        Reply::Inspected(entries) => OwnedReply::Inspected(entries.iter().map(own_inspected).collect()),
        Reply::Error { code, message } => return Err(Error::Broker { code, message: message.to_string() }),
    })
}
