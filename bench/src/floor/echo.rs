//! What the floor answers, without sockets or a clock: the least a server
//! speaking runnel's protocol must do to carry a message from a producer
//! to a consumer. A PRODUCE's length-prefixed payloads are appended, as
//! they arrived, to an in-memory FIFO of bytes per topic; a FETCH copies
//! the oldest of them into its reply and forgets them; an ACK is answered
//! as if every id took effect. No log, no ids kept per message, no ack
//! deadlines, no redelivery, no dead letters: a fetched message is gone.
//!
//! A FETCH that finds nothing waits (parks) as runnel's does, so a
//! long-polling consumer costs the floor what it costs runnel: the loop
//! answers it at the end of the turn in which a message arrives
//! (`wake`), or with no message when its wait passes (`expire`).
//!
//! Requests are decoded by runnel's own codec, so the floor's CPU includes
//! the decoding every runnel-protocol server must do and nothing more.

use std::collections::{HashMap, VecDeque};

use runnel::codec::{self, DecodeLimits, ErrorCode, Frame, Message, MessagesWriter, Request, op};
use runnel::limits::Limits;

/// Bytes of a FIFO block: large enough that a block is allocated once per
/// thousands of small messages, small enough that a drained topic gives
/// its memory back soon. A batch larger than this gets a block of its own.
const BLOCK_BYTES: usize = 1 << 20;

/// The bounds of the floor. Those of the protocol are runnel's defaults
/// (`runnel::limits::Limits::default()`), so a client sees the same HELLO
/// limits from both; `queued_bytes_max` is the floor's own.
#[derive(Clone, Copy, Debug)]
pub struct EchoLimits {
    /// What the decoder enforces, as runnel does by default.
    pub decode: DecodeLimits,
    /// Most topics: bounds the topic table.
    pub topics_max: usize,
    /// Most payload bytes of one FETCH reply (runnel's default).
    pub fetch_bytes_max: u32,
    /// Longest long-poll wait, ms (runnel's default).
    pub fetch_wait_ms_max: u32,
    /// Most bytes queued in all topics together (payloads and their 4-byte
    /// length fields): a produce past it gets QUEUE_FULL, so a producer
    /// without a consumer cannot exhaust memory. `--queued-bytes-max`.
    pub queued_bytes_max: u64,
}

impl EchoLimits {
    /// runnel's default limits, with `queued_bytes_max`.
    pub fn new(queued_bytes_max: u64) -> EchoLimits {
        let l = Limits::default();
        EchoLimits {
            decode: DecodeLimits::from(&l),
            topics_max: l.topics_max as usize,
            fetch_bytes_max: l.fetch_bytes_max,
            fetch_wait_ms_max: l.fetch_wait_ms_max,
            queued_bytes_max,
        }
    }
}

/// What became of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Answered in `out`.
    Done,
    /// A FETCH parked on this topic (its index): read no more from the
    /// connection until `wake` or `expire` answers it.
    Parked(usize),
}

/// A FETCH waiting for a message.
#[derive(Clone, Copy, Debug)]
struct Waiter {
    /// The connection's key in the loop.
    key: usize,
    request_id: u32,
    /// Most messages, after clamping.
    max_messages: u32,
    /// Payload budget, bytes, after defaulting and clamping.
    max_bytes: u32,
    /// When to answer with no message, loop ms.
    deadline_ms: u64,
}

/// One topic's queued messages: length-prefixed payloads, oldest first,
/// in blocks (so appending never moves what is queued).
#[derive(Debug, Default)]
struct Topic {
    name: String,
    /// Blocks of `u32 len, payload` records; the front one is read from
    /// `head` on.
    blocks: VecDeque<Vec<u8>>,
    /// Bytes of the front block already handed out.
    head: usize,
    /// Bytes queued (records not yet handed out), length fields included.
    queued_bytes: u64,
    /// Id of the oldest queued message.
    first_id: u64,
    /// Id the next produced message gets.
    next_id: u64,
    /// Parked FETCHes, oldest first (at most one per connection).
    waiters: VecDeque<Waiter>,
    /// In `Echo::to_wake`.
    waking: bool,
}

impl Topic {
    /// Appends a PRODUCE batch's records (`count` of them, as on the wire).
    fn append(&mut self, records: &[u8], count: u32) {
        let fits = self.blocks.back().is_some_and(|b| b.capacity() - b.len() >= records.len());
        if !fits {
            self.blocks.push_back(Vec::with_capacity(records.len().max(BLOCK_BYTES)));
        }
        if let Some(b) = self.blocks.back_mut() {
            b.extend_from_slice(records);
        }
        self.queued_bytes += records.len() as u64;
        self.next_id += u64::from(count);
    }

    /// Moves up to `max_messages` of the oldest messages into a FETCH reply
    /// (at least one if any is queued, then while `max_bytes` of payload
    /// allows). Returns the bytes they took in the queue.
    fn take(&mut self, w: &mut MessagesWriter, out: &mut Vec<u8>, max_messages: u32, max_bytes: u32) -> u64 {
        let (mut taken, mut payload_bytes) = (0u64, 0u64);
        while w.count() < max_messages && taken < self.queued_bytes {
            if self.blocks.front().is_some_and(|b| self.head == b.len()) {
                // Handed out whole; what is still queued is in the next.
                self.blocks.pop_front();
                self.head = 0;
            }
            let Some(block) = self.blocks.front() else { break };
            let at = self.head;
            let len = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]) as usize;
            if w.count() > 0 && payload_bytes + len as u64 > u64::from(max_bytes) {
                break;
            }
            let payload = &block[at + 4..at + 4 + len];
            w.push(
                out,
                &Message {
                    id: self.first_id,
                    born_ms: 0,
                    delivery_count: 1,
                    dead: None,
                    payload,
                    origin_group: "",
                    props: runnel::codec::Props::EMPTY,
                },
            );
            self.head += 4 + len;
            self.first_id += 1;
            payload_bytes += len as u64;
            taken += 4 + len as u64;
        }
        self.queued_bytes -= taken;
        if self.queued_bytes == 0 {
            // Keep one block, emptied, so a topic drained as fast as it
            // fills reuses it instead of allocating.
            self.blocks.truncate(1);
            if let Some(b) = self.blocks.front_mut() {
                b.clear();
            }
            self.head = 0;
        }
        taken
    }
}

/// Every topic, and the parked FETCHes.
pub struct Echo {
    limits: EchoLimits,
    /// Topic index by name.
    names: HashMap<String, usize>,
    topics: Vec<Topic>,
    /// Bytes queued in all topics.
    queued_bytes: u64,
    /// Topics with waiters that got messages this turn.
    to_wake: Vec<usize>,
    /// The earliest wait deadline of a parked FETCH, loop ms.
    next_deadline_ms: Option<u64>,
}

impl Echo {
    pub fn new(limits: EchoLimits) -> Echo {
        Echo {
            limits,
            names: HashMap::new(),
            topics: Vec::new(),
            queued_bytes: 0,
            to_wake: Vec::new(),
            next_deadline_ms: None,
        }
    }

    pub fn decode_limits(&self) -> &DecodeLimits {
        &self.limits.decode
    }

    /// When the next parked FETCH's wait passes, loop ms.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.next_deadline_ms
    }

    /// Answers `frame`, from connection `key`, into `out` (or parks it).
    pub fn handle(&mut self, key: usize, frame: &Frame<'_>, now_ms: u64, out: &mut Vec<u8>) -> Outcome {
        let rid = frame.request_id;
        match frame.request {
            Request::Hello { min_version, max_version, .. } => {
                // The floor decodes version 1's layouts only, whatever the
                // broker negotiates.
                if min_version <= 1 && max_version >= codec::VERSION_MIN {
                    let version = 1;
                    codec::encode_hello_reply(out, rid, version, &self.limits.decode, 0);
                } else {
                    codec::encode_error(out, op::HELLO, rid, ErrorCode::Version, "runnel-floor speaks version 1");
                }
            }
            Request::Ping => codec::encode_empty_reply(out, op::PING, rid),
            Request::Produce { topic, batch, .. } => self.produce(topic, batch.bytes, batch.count, rid, out),
            Request::Fetch { topic, max_messages, max_bytes, wait_ms, .. } => {
                let fetch = Waiter { key, request_id: rid, max_messages, max_bytes, deadline_ms: 0 };
                return self.fetch(topic, fetch, wait_ms, now_ms, out);
            }
            Request::Ack { ids, .. } => codec::encode_ids_reply(out, op::ACK, rid, ids.len() as u32, &[]),
            other => codec::encode_error(
                out,
                other.op(),
                rid,
                ErrorCode::UnknownOp,
                "runnel-floor answers HELLO, PING, PRODUCE, FETCH and ACK only",
            ),
        }
        Outcome::Done
    }

    /// The topic's index, created on first use; None at topics_max.
    fn topic(&mut self, name: &str) -> Option<usize> {
        if let Some(&t) = self.names.get(name) {
            return Some(t);
        }
        if self.topics.len() >= self.limits.topics_max {
            return None;
        }
        let t = self.topics.len();
        self.topics.push(Topic { name: name.to_string(), next_id: 1, first_id: 1, ..Topic::default() });
        self.names.insert(name.to_string(), t);
        Some(t)
    }

    fn produce(&mut self, topic: &str, records: &[u8], count: u32, rid: u32, out: &mut Vec<u8>) {
        let Some(t) = self.topic(topic) else {
            return codec::encode_error(out, op::PRODUCE, rid, ErrorCode::TooManyTopics, "topics_max reached");
        };
        if self.queued_bytes + records.len() as u64 > self.limits.queued_bytes_max {
            let msg = format!("queued_bytes_max ({}) reached", self.limits.queued_bytes_max);
            return codec::encode_error(out, op::PRODUCE, rid, ErrorCode::QueueFull, &msg);
        }
        let topic = &mut self.topics[t];
        let first_id = topic.next_id;
        topic.append(records, count);
        self.queued_bytes += records.len() as u64;
        if !topic.waiters.is_empty() && !topic.waking {
            topic.waking = true;
            self.to_wake.push(t);
        }
        codec::encode_produce_reply(out, rid, first_id, count);
    }

    fn fetch(&mut self, topic: &str, mut f: Waiter, wait_ms: u32, now_ms: u64, out: &mut Vec<u8>) -> Outcome {
        if f.max_messages == 0 {
            let msg = "max_messages must be at least 1";
            codec::encode_error(out, op::FETCH, f.request_id, ErrorCode::BadArgument, msg);
            return Outcome::Done;
        }
        let Some(t) = self.topic(topic) else {
            codec::encode_error(out, op::FETCH, f.request_id, ErrorCode::TooManyTopics, "topics_max reached");
            return Outcome::Done;
        };
        f.max_messages = f.max_messages.min(self.limits.decode.batch_messages_max);
        let budget = self.limits.fetch_bytes_max;
        f.max_bytes = if f.max_bytes == 0 { budget } else { f.max_bytes.min(budget) };
        if self.topics[t].queued_bytes > 0 || wait_ms == 0 {
            self.answer(t, &f, out);
            return Outcome::Done;
        }
        f.deadline_ms = now_ms + u64::from(wait_ms.min(self.limits.fetch_wait_ms_max));
        self.topics[t].waiters.push_back(f);
        self.next_deadline_ms = Some(self.next_deadline_ms.map_or(f.deadline_ms, |d| d.min(f.deadline_ms)));
        Outcome::Parked(t)
    }

    /// Writes the FETCH reply of `f` on topic `t`, with what is queued.
    fn answer(&mut self, t: usize, f: &Waiter, out: &mut Vec<u8>) {
        let topic = &mut self.topics[t];
        let mut w = MessagesWriter::begin(out, f.request_id, &topic.name, 1);
        self.queued_bytes -= topic.take(&mut w, out, f.max_messages, f.max_bytes);
        w.finish(out);
    }

    /// Answers the parked FETCHes of the topics that got messages this
    /// turn, oldest first, while messages last.
    pub fn wake(&mut self, outbox: &mut impl Outbox) {
        let mut to_wake = std::mem::take(&mut self.to_wake);
        for t in to_wake.drain(..) {
            self.topics[t].waking = false;
            while self.topics[t].queued_bytes > 0 {
                let Some(f) = self.topics[t].waiters.pop_front() else { break };
                if let Some(out) = outbox.out(f.key) {
                    self.answer(t, &f, out);
                    outbox.unpark(f.key);
                }
            }
        }
        self.to_wake = to_wake;
    }

    /// Answers, with no message, every parked FETCH whose wait has passed
    /// at `now_ms`.
    pub fn expire(&mut self, now_ms: u64, outbox: &mut impl Outbox) {
        if self.next_deadline_ms.is_none_or(|d| d > now_ms) {
            return;
        }
        let mut next: Option<u64> = None;
        for t in 0..self.topics.len() {
            let mut i = 0;
            while let Some(&f) = self.topics[t].waiters.get(i) {
                if f.deadline_ms > now_ms {
                    next = Some(next.map_or(f.deadline_ms, |d| d.min(f.deadline_ms)));
                    i += 1;
                    continue;
                }
                self.topics[t].waiters.remove(i);
                if let Some(out) = outbox.out(f.key) {
                    self.answer(t, &f, out);
                    outbox.unpark(f.key);
                }
            }
        }
        self.next_deadline_ms = next;
    }

    /// Forgets connection `key`, whose FETCH was parked on topic `t`.
    pub fn disconnect(&mut self, key: usize, t: usize) {
        if let Some(topic) = self.topics.get_mut(t) {
            topic.waiters.retain(|f| f.key != key);
        }
    }
}

/// The loop's connections, as `wake` and `expire` reach them.
pub trait Outbox {
    /// The output buffer of connection `key`, to be flushed this turn; None
    /// if the connection is gone.
    fn out(&mut self, key: usize) -> Option<&mut Vec<u8>>;
    /// Connection `key`'s parked FETCH was answered: serve it again.
    fn unpark(&mut self, key: usize);
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use runnel::codec::{Batch, Decoded, Ids, Reply, decode_reply, encode_batch};
    use runnel::testkit::{Rng, SeedGuard, seeds};

    use super::*;

    /// Connections' outputs, as the loop lends them.
    #[derive(Default)]
    struct Outs {
        out: HashMap<usize, Vec<u8>>,
        unparked: Vec<usize>,
    }

    impl Outbox for Outs {
        fn out(&mut self, key: usize) -> Option<&mut Vec<u8>> {
            Some(self.out.entry(key).or_default())
        }
        fn unpark(&mut self, key: usize) {
            self.unparked.push(key);
        }
    }

    /// The one reply in `out`, decoded, with its request id.
    fn reply(out: &[u8]) -> (u32, Reply<'_>) {
        match decode_reply(out, usize::MAX) {
            Ok(Decoded::Frame(f, n)) => {
                assert_eq!(n, out.len(), "one reply");
                (f.request_id, f.reply)
            }
            other => panic!("not one whole reply: {other:?}"),
        }
    }

    fn produce(echo: &mut Echo, topic: &str, payloads: &[&[u8]]) -> Vec<u8> {
        let mut records = Vec::new();
        encode_batch(&mut records, payloads);
        let batch = Batch { count: payloads.len() as u32, bytes: &records, with_props: false };
        let mut out = Vec::new();
        let frame = Frame { request_id: 9, request: Request::Produce { flags: 0, topic, batch } };
        assert_eq!(echo.handle(1, &frame, 0, &mut out), Outcome::Done);
        out
    }

    fn fetch(echo: &mut Echo, key: usize, max_messages: u32, max_bytes: u32, wait_ms: u32) -> (Outcome, Vec<u8>) {
        let mut out = Vec::new();
        let request = Request::Fetch { topic: "t", group: "", max_messages, max_bytes, wait_ms, ack_timeout_ms: 0 };
        let outcome = echo.handle(key, &Frame { request_id: 4, request }, 0, &mut out);
        (outcome, out)
    }

    /// (id, payload) of every message of a FETCH reply.
    fn messages(out: &[u8]) -> Vec<(u64, Vec<u8>)> {
        match reply(out).1 {
            Reply::Messages { topic, messages } => {
                assert_eq!(topic, "t");
                messages.iter().map(|m| (m.id, m.payload.to_vec())).collect()
            }
            other => panic!("not a FETCH reply: {other:?}"),
        }
    }

    #[test]
    fn a_fetch_hands_back_what_was_produced_in_order() {
        let mut echo = Echo::new(EchoLimits::new(1 << 20));
        assert_eq!(reply(&produce(&mut echo, "t", &[b"a", b"bb"])).1, Reply::Produced { first_id: 1, count: 2 });
        assert_eq!(reply(&produce(&mut echo, "t", &[b"ccc"])).1, Reply::Produced { first_id: 3, count: 1 });
        let (_, out) = fetch(&mut echo, 2, 2, 0, 0);
        assert_eq!(messages(&out), vec![(1, b"a".to_vec()), (2, b"bb".to_vec())]);
        // A budget smaller than the next message still gets one.
        let (_, out) = fetch(&mut echo, 2, 5, 1, 0);
        assert_eq!(messages(&out), vec![(3, b"ccc".to_vec())]);
        let (_, out) = fetch(&mut echo, 2, 5, 0, 0);
        assert_eq!(messages(&out), vec![]);
        assert_eq!(echo.queued_bytes, 0);
    }

    #[test]
    fn a_parked_fetch_is_answered_by_the_next_produce_or_its_wait() {
        let mut echo = Echo::new(EchoLimits::new(1 << 20));
        assert_eq!(fetch(&mut echo, 7, 10, 0, 100), (Outcome::Parked(0), Vec::new()));
        assert_eq!(fetch(&mut echo, 8, 10, 0, 50), (Outcome::Parked(0), Vec::new()));
        assert_eq!(echo.next_deadline_ms(), Some(50));
        produce(&mut echo, "t", &[b"x"]);
        let mut outs = Outs::default();
        echo.wake(&mut outs);
        // The oldest waiter gets the message; the other waits on.
        assert_eq!(outs.unparked, vec![7]);
        assert_eq!(messages(&outs.out[&7]), vec![(1, b"x".to_vec())]);
        echo.expire(49, &mut outs);
        assert_eq!(outs.unparked, vec![7]);
        echo.expire(50, &mut outs);
        assert_eq!(outs.unparked, vec![7, 8]);
        assert_eq!(messages(&outs.out[&8]), vec![]);
        assert_eq!(echo.next_deadline_ms(), None);
    }

    #[test]
    fn a_closed_connection_is_no_longer_waited_for() {
        let mut echo = Echo::new(EchoLimits::new(1 << 20));
        assert_eq!(fetch(&mut echo, 7, 10, 0, 100).0, Outcome::Parked(0));
        echo.disconnect(7, 0);
        produce(&mut echo, "t", &[b"x"]);
        let mut outs = Outs::default();
        echo.wake(&mut outs);
        echo.expire(1000, &mut outs);
        assert!(outs.unparked.is_empty());
        assert_eq!(messages(&fetch(&mut echo, 2, 10, 0, 0).1), vec![(1, b"x".to_vec())]);
    }

    #[test]
    fn limits_and_unserved_ops_get_error_replies() {
        let mut echo = Echo::new(EchoLimits::new(10));
        let code = |out: &[u8]| match reply(out).1 {
            Reply::Error { code, .. } => code,
            other => panic!("not an error: {other:?}"),
        };
        assert!(matches!(reply(&produce(&mut echo, "t", &[b"123456"])).1, Reply::Produced { .. }));
        assert_eq!(code(&produce(&mut echo, "t", &[b"1"])), ErrorCode::QueueFull as u8);
        assert_eq!(code(&fetch(&mut echo, 2, 0, 0, 0).1), ErrorCode::BadArgument as u8);
        let mut out = Vec::new();
        let nack =
            Request::Nack { topic: "t", group: "", delay_ms: 0, flags: 0, ids: Ids { bytes: &[0; 8] }, reason: "" };
        echo.handle(1, &Frame { request_id: 3, request: nack }, 0, &mut out);
        assert_eq!(code(&out), ErrorCode::UnknownOp as u8);
        let mut out = Vec::new();
        let hello = Request::Hello { min_version: 2, max_version: 3, token: b"" };
        echo.handle(1, &Frame { request_id: 3, request: hello }, 0, &mut out);
        assert_eq!(code(&out), ErrorCode::Version as u8);
    }

    /// Random produces and fetches against a plain VecDeque of payloads:
    /// the floor hands back exactly what was produced, in order, with
    /// consecutive ids, across block boundaries and budgets.
    #[test]
    fn the_queue_behaves_as_a_fifo() {
        for seed in seeds(20) {
            let _guard = SeedGuard { test: "the_queue_behaves_as_a_fifo", seed, replay: "cargo test -p runnel-bench" };
            let mut rng = Rng::new(seed);
            let mut echo = Echo::new(EchoLimits::new(1 << 30));
            let mut model: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
            let mut next_id = 1;
            for _ in 0..300 {
                if rng.percent(55) {
                    // Mostly small; now and then large enough that a batch
                    // spills into the next block or gets a block of its own.
                    let mut payloads: Vec<Vec<u8>> = Vec::new();
                    for i in 0..rng.range(1u64, 20) {
                        let len =
                            if rng.one_in(8) { rng.range(0usize, BLOCK_BYTES / 3) } else { rng.range(0usize, 200) };
                        payloads.push(vec![((next_id + i) % 251) as u8; len]);
                    }
                    let refs: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
                    produce(&mut echo, "t", &refs);
                    for p in payloads {
                        model.push_back((next_id, p));
                        next_id += 1;
                    }
                } else {
                    let (max_messages, max_bytes) = (rng.range(1u32, 30), rng.range(0u32, 200_000));
                    let got = messages(&fetch(&mut echo, 2, max_messages, max_bytes, 0).1);
                    let budget = if max_bytes == 0 { echo.limits.fetch_bytes_max } else { max_bytes } as usize;
                    let (mut want, mut bytes) = (Vec::new(), 0);
                    while let Some((_, p)) = model.front() {
                        if want.len() == max_messages as usize || (!want.is_empty() && bytes + p.len() > budget) {
                            break;
                        }
                        bytes += p.len();
                        want.extend(model.pop_front());
                    }
                    assert_eq!(got, want, "seed {seed}");
                }
                let queued: usize = model.iter().map(|(_, p)| 4 + p.len()).sum();
                assert_eq!(echo.queued_bytes, queued as u64, "seed {seed}");
            }
        }
    }
}
