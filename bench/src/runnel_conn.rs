//! runnel through its own client library, `runnel::client::Client`: the
//! same code a user would write. Pipelining is `send`/`send_produce`, one
//! `flush`, then `recv` in order.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

use runnel::client::{Client, Error, OwnedReply, ProduceMessage};
use runnel::codec::{self, GroupSettings, Ids, Request, Start, TopicSettings};

use crate::conn::{Consumer, Producer, READ_TIMEOUT, SyncCounters, WRITE_TIMEOUT};
use crate::tracker;

fn connect(addr: SocketAddr) -> Result<Client, String> {
    let mut c = Client::connect(addr).map_err(|e| format!("runnel at {addr}: {e}"))?;
    c.set_timeout(Some(READ_TIMEOUT)).map_err(|e| format!("runnel at {addr}: {e}"))?;
    c.stream().set_write_timeout(Some(WRITE_TIMEOUT)).map_err(|e| format!("runnel at {addr}: {e}"))?;
    Ok(c)
}

pub struct RunnelProducer {
    client: Client,
    topic: String,
    /// Tags each message with one of this many tags, `t0`, `t1`, ..., by
    /// its sequence number (0: untagged).
    tags: u32,
    /// Schedules each message this many ms after the broker receives it
    /// (property `delay_ms`, version 3; 0: delivered at once).
    delay_ms: u64,
    /// A request `queue` could not encode, reported by the next `flush`.
    failed: Option<String>,
}

impl RunnelProducer {
    pub fn connect(addr: SocketAddr, topic: &str) -> Result<RunnelProducer, String> {
        Ok(RunnelProducer { client: connect(addr)?, topic: topic.to_string(), tags: 0, delay_ms: 0, failed: None })
    }

    /// A producer scheduling each message `delay_ms` ahead (W7).
    pub fn delayed(addr: SocketAddr, topic: &str, delay_ms: u64) -> Result<RunnelProducer, String> {
        let client = connect(addr)?;
        if client.version < 3 {
            return Err(format!("runnel at {addr} speaks protocol version {}: no scheduled messages", client.version));
        }
        Ok(RunnelProducer { client, topic: topic.to_string(), tags: 0, delay_ms, failed: None })
    }

    /// A producer tagging each message with one of `tags` tags
    /// (`tag_of`).
    pub fn tagged(addr: SocketAddr, topic: &str, tags: u32) -> Result<RunnelProducer, String> {
        let client = version_2(connect(addr)?, addr, "tags")?;
        Ok(RunnelProducer { client, topic: topic.to_string(), tags, delay_ms: 0, failed: None })
    }
}

/// The tag of the message with sequence number `seq`, of `tags` tags.
pub fn tag_of(seq: u64, tags: u32) -> String {
    format!("t{}", seq % u64::from(tags))
}

/// `c`, if it speaks protocol version 2 (groups, tags): the version-1
/// broker of an older build cannot run the workloads that need them.
fn version_2(c: Client, addr: SocketAddr, what: &str) -> Result<Client, String> {
    if c.version < 2 {
        return Err(format!("runnel at {addr} speaks protocol version {}: no {what}", c.version));
    }
    Ok(c)
}

fn produced(r: Result<OwnedReply, Error>) -> Result<u32, String> {
    match r {
        Ok(OwnedReply::Produced { count, .. }) => Ok(count),
        Ok(other) => Err(format!("runnel: unexpected reply to PRODUCE: {other:?}")),
        Err(e) => Err(format!("runnel PRODUCE: {e}")),
    }
}

impl Producer for RunnelProducer {
    fn queue(&mut self, payload: &[u8]) {
        if self.delay_ms > 0 {
            let m = ProduceMessage::new(payload).delay(self.delay_ms);
            if let Err(e) = self.client.send_produce_messages(&self.topic, &[m]) {
                self.failed.get_or_insert(format!("runnel PRODUCE with a delay: {e}"));
            }
            return;
        }
        if self.tags == 0 {
            self.client.send_produce(&self.topic, &[payload]);
            return;
        }
        let tag = tag_of(tracker::read(payload).map_or(0, |(seq, _)| seq), self.tags);
        if let Err(e) = self.client.send_produce_messages(&self.topic, &[ProduceMessage::new(payload).tag(&tag)]) {
            self.failed.get_or_insert(format!("runnel PRODUCE with tag {tag}: {e}"));
        }
    }
    fn queue_batch(&mut self, payloads: &[&[u8]]) {
        self.client.send_produce(&self.topic, payloads);
    }
    fn batch_native(&self) -> bool {
        true
    }
    fn flush(&mut self) -> Result<(), String> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        self.client.flush().map_err(|e| format!("runnel: {e}"))
    }
    fn recv(&mut self) -> Result<u32, String> {
        produced(self.client.recv())
    }
    fn recv_ready(&mut self, on_reply: &mut dyn FnMut(u32)) -> Result<(), String> {
        if self.client.in_flight() == 0 {
            return Ok(());
        }
        // The client reads blocking; to take only what has arrived, the
        // socket is non-blocking around the `recv`s. A WouldBlock leaves the
        // client's buffers as they were (its read fails before consuming).
        self.client.stream().set_nonblocking(true).map_err(|e| format!("runnel: {e}"))?;
        let mut result = Ok(());
        while self.client.in_flight() > 0 {
            match self.client.recv() {
                Err(Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => break,
                r => match produced(r) {
                    Ok(n) => on_reply(n),
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                },
            }
        }
        self.client.stream().set_nonblocking(false).map_err(|e| format!("runnel: {e}"))?;
        result
    }
    fn in_flight(&self) -> usize {
        self.client.in_flight()
    }
    fn fd(&self) -> RawFd {
        self.client.stream().as_raw_fd()
    }
}

pub struct RunnelConsumer {
    client: Client,
    topic: String,
    /// The consumer group ("" the default group, version 1).
    group: String,
    /// Ids delivered by the last `next`, acknowledged by the following one.
    pending: Vec<u64>,
    /// Scratch for the ACK body.
    body: Vec<u8>,
    /// Busy polling: an ACK, and a FETCH, sent and not yet answered.
    ack_out: bool,
    fetch_out: bool,
}

impl RunnelConsumer {
    /// A consumer of `group` ("" the default group).
    pub fn connect(addr: SocketAddr, topic: &str, group: &str) -> Result<RunnelConsumer, String> {
        let client = if group.is_empty() { connect(addr)? } else { version_2(connect(addr)?, addr, "groups")? };
        Ok(RunnelConsumer {
            client,
            topic: topic.to_string(),
            group: group.to_string(),
            pending: Vec::new(),
            body: Vec::new(),
            ack_out: false,
            fetch_out: false,
        })
    }

    /// Queues an ACK of the pending ids; true if one was queued.
    fn send_ack(&mut self) -> bool {
        if self.pending.is_empty() {
            return false;
        }
        self.body.clear();
        codec::encode_ids(&mut self.body, &self.pending);
        self.client.send(&Request::Ack { topic: &self.topic, group: &self.group, ids: Ids { bytes: &self.body } });
        true
    }

    /// Writes an ACK of the pending ids (if any) and a FETCH in one write;
    /// true if an ACK went out (it is answered first).
    fn send_ack_fetch(&mut self, max: u32, wait_ms: u32) -> Result<bool, String> {
        let acked = self.send_ack();
        self.client.send(&Request::Fetch {
            topic: &self.topic,
            group: &self.group,
            max_messages: max,
            max_bytes: 0,
            wait_ms,
            ack_timeout_ms: 0,
        });
        self.client.flush().map_err(|e| format!("runnel: {e}"))?;
        Ok(acked)
    }

    fn recv_ack(&mut self) -> Result<(), String> {
        let reply = self.client.recv();
        self.acked(reply)
    }

    fn acked(&mut self, reply: Result<OwnedReply, Error>) -> Result<(), String> {
        match reply {
            Ok(OwnedReply::Ids(r)) if r.failed.is_empty() => {
                self.pending.clear();
                Ok(())
            }
            Ok(OwnedReply::Ids(r)) => {
                Err(format!("runnel ACK: {} ids failed, first {:?}", r.failed.len(), r.failed[0]))
            }
            Ok(other) => Err(format!("runnel: unexpected reply to ACK: {other:?}")),
            Err(e) => Err(format!("runnel ACK: {e}")),
        }
    }

    /// Hands a FETCH reply's messages to `on_msg`; they become pending.
    fn fetched(&mut self, reply: Result<OwnedReply, Error>, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        match reply {
            Ok(OwnedReply::Messages { messages, .. }) => {
                for m in &messages {
                    on_msg(&m.payload);
                    self.pending.push(m.id);
                }
                Ok(messages.len())
            }
            Ok(other) => Err(format!("runnel: unexpected reply to FETCH: {other:?}")),
            Err(e) => Err(format!("runnel FETCH: {e}")),
        }
    }

    /// Busy polling: takes the replies that have arrived (all of them, when
    /// `block` is false: the socket is non-blocking around the `recv`s, and
    /// a WouldBlock leaves the client's buffers as they were) until the
    /// outstanding FETCH is answered; with `block`, waits for it. Returns
    /// the messages delivered, None if the FETCH is still outstanding.
    fn take_fetch(&mut self, block: bool, on_msg: &mut dyn FnMut(&[u8])) -> Result<Option<usize>, String> {
        if !block {
            self.client.stream().set_nonblocking(true).map_err(|e| format!("runnel: {e}"))?;
        }
        let mut result = Ok(None);
        while self.fetch_out {
            let reply = self.client.recv();
            // (Blocking, a WouldBlock is the read timeout: an error.)
            if let Err(Error::Io(e)) = &reply
                && e.kind() == io::ErrorKind::WouldBlock
                && !block
            {
                break;
            }
            if self.ack_out {
                self.ack_out = false;
                if let Err(e) = self.acked(reply) {
                    result = Err(e);
                    break;
                }
            } else {
                self.fetch_out = false;
                result = self.fetched(reply, on_msg).map(Some);
            }
        }
        if !block {
            self.client.stream().set_nonblocking(false).map_err(|e| format!("runnel: {e}"))?;
        }
        result
    }
}

impl Consumer for RunnelConsumer {
    fn next(&mut self, max: u32, wait_ms: u32, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        // ACK and FETCH go out in one write; the ACK is answered first.
        if self.send_ack_fetch(max, wait_ms)? {
            self.recv_ack()?;
        }
        let reply = self.client.recv();
        self.fetched(reply, on_msg)
    }

    fn ack_pending(&mut self) -> Result<(), String> {
        if self.send_ack() {
            self.client.flush().map_err(|e| format!("runnel: {e}"))?;
            self.recv_ack()?;
        }
        Ok(())
    }

    fn poll(&mut self, max: u32, wait_ms: u32, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        let got = if self.fetch_out { self.take_fetch(false, on_msg)? } else { Some(0) };
        match got {
            None => Ok(0),
            Some(n) => {
                // Answered (or none sent yet): acknowledge and fetch again.
                self.ack_out = self.send_ack_fetch(max, wait_ms)?;
                self.fetch_out = true;
                Ok(n)
            }
        }
    }

    fn end_poll(&mut self, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        let n = if self.fetch_out { self.take_fetch(true, on_msg)?.unwrap_or(0) } else { 0 };
        self.ack_pending()?;
        Ok(n)
    }

    fn fd(&self) -> RawFd {
        self.client.stream().as_raw_fd()
    }
}

/// Creates the consumer groups `groups` of `topic` (and the topic), each
/// from the earliest message, with its tag filter ("" for every message).
pub fn create_groups(addr: SocketAddr, topic: &str, groups: &[(String, String)]) -> Result<(), String> {
    let mut c = version_2(connect(addr)?, addr, "groups")?;
    c.create_topic(topic, TopicSettings::default()).map_err(|e| format!("runnel CREATE_TOPIC {topic}: {e}"))?;
    for (group, filter) in groups {
        let settings = GroupSettings { filter, ..GroupSettings::default() };
        c.create_group(topic, group, settings, Start::Earliest)
            .map_err(|e| format!("runnel CREATE_GROUP {topic}/{group}: {e}"))?;
    }
    Ok(())
}

/// Moves group i of `groups` to message i * msgs / groups of `topic`
/// (a new topic's ids start at 1).
pub fn spread_groups(addr: SocketAddr, topic: &str, groups: &[(String, String)], msgs: u64) -> Result<(), String> {
    let mut c = version_2(connect(addr)?, addr, "groups")?;
    for (i, (group, _)) in groups.iter().enumerate() {
        let id = 1 + i as u64 * msgs / groups.len() as u64;
        c.reset_group(topic, group, Start::Id(id)).map_err(|e| format!("runnel RESET_GROUP {topic}/{group}: {e}"))?;
    }
    Ok(())
}

pub fn delete_topic(addr: SocketAddr, topic: &str) -> Result<(), String> {
    let mut c = connect(addr)?;
    c.delete_topic(topic).map(|_| ()).map_err(|e| format!("runnel DELETE_TOPIC {topic}: {e}"))
}

pub fn sync_counters(addr: SocketAddr) -> Result<SyncCounters, String> {
    let mut c = connect(addr)?;
    let stats = c.stats(None).map_err(|e| format!("runnel STATS: {e}"))?;
    let broker = stats.iter().find(|s| s.0.is_empty()).ok_or("runnel STATS: no broker section")?;
    let get = |k: &str| broker.1.iter().find(|kv| kv.0 == k).map(|kv| kv.1);
    Ok(SyncCounters {
        fsyncs: get("fsyncs").ok_or("runnel STATS: no fsyncs key")?,
        log_commits: get("log_commits").ok_or("runnel STATS: no log_commits key")?,
        produces_committed: get("produces_committed").ok_or("runnel STATS: no produces_committed key")?,
    })
}

/// The broker section of STATS: every counter, by name.
pub fn broker_stats(addr: SocketAddr) -> Result<Vec<(String, u64)>, String> {
    let mut c = connect(addr)?;
    let stats = c.stats(None).map_err(|e| format!("runnel STATS: {e}"))?;
    let broker = stats.into_iter().find(|s| s.0.is_empty()).ok_or("runnel STATS: no broker section")?;
    Ok(broker.1)
}

/// One counter of `broker_stats`; Err if the broker does not report it.
pub fn stat(stats: &[(String, u64)], key: &str) -> Result<u64, String> {
    stats.iter().find(|kv| kv.0 == key).map(|kv| kv.1).ok_or_else(|| format!("runnel STATS: no {key} key"))
}
