//! A runnel push subscriber (protocol version 3): SUBSCRIBE once with a
//! credit, then take the messages the broker pushes as they come.
//!
//! It speaks runnel's codec over the bench's own buffered `Wire`, not
//! through `runnel::client::Client`, because a subscriber must not wait for
//! its ACK replies before it reads the next pushed frame: the client's
//! `next_pushed` refuses while replies are unread, and its `recv` would
//! hold pushed messages back until the ACK reply came. Here every frame is
//! taken in arrival order: a pushed frame (op 0xEF) is handed over at
//! once, an ACK reply only settles its count.
//!
//! ACKs are batched as the fetch consumer batches them: everything one
//! call delivered (one read's worth of pushed frames) is acknowledged in
//! one ACK, written at the start of the next call (busy polling: at once,
//! in one write), and its reply is never waited for while messages flow.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

use runnel::codec::{self, Decoded, Ids, Reply, Request};

use crate::conn::Consumer;
use crate::sys;
use crate::wire::Wire;

/// Bytes a single reply frame may have (a pushed frame carries at most a
/// credit's worth of messages, far below this).
const REPLY_BYTES_MAX: usize = 64 << 20;
/// Reads per call while data keeps arriving, so one call cannot run on
/// for as long as the broker keeps pushing.
const READS_PER_CALL_MAX: usize = 4;

pub struct PushConsumer {
    wire: Wire,
    topic: String,
    /// Ids delivered and not yet acknowledged (in the next ACK).
    pending: Vec<u64>,
    /// ACKs written whose replies have not come.
    acks_out: usize,
    /// The next request id (pushed frames carry the subscription's id, so
    /// request ids only tell replies apart in errors).
    next_id: u32,
    /// Scratch for the ACK body.
    body: Vec<u8>,
}

/// What a run of frames held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Taken {
    /// Bytes of whole frames taken.
    pub bytes: usize,
    /// Messages pushed in them.
    pub messages: usize,
    /// ACK replies among them.
    pub ack_replies: usize,
}

/// Takes every whole frame at the start of `input`: each pushed message's
/// payload goes to `on_msg` and its id to `pending`; each ACK reply is
/// counted (one that names a failed id is an error, as is any other reply
/// or a broker error). A partial frame at the end is left for more bytes.
pub fn take_frames(input: &[u8], pending: &mut Vec<u64>, on_msg: &mut dyn FnMut(&[u8])) -> Result<Taken, String> {
    let mut t = Taken::default();
    while let Decoded::Frame(frame, n) =
        codec::decode_reply(&input[t.bytes..], REPLY_BYTES_MAX).map_err(|e| format!("runnel push: {e}"))?
    {
        match frame.reply {
            Reply::Pushed { messages, .. } => {
                for m in &messages {
                    on_msg(m.payload);
                    pending.push(m.id);
                }
                t.messages += messages.len();
            }
            Reply::Ids { failed, .. } if failed.is_empty() => t.ack_replies += 1,
            Reply::Ids { failed, .. } => {
                return Err(format!("runnel push ACK: {} ids failed, first {}", failed.len(), failed[0]));
            }
            Reply::Error { code, message } => return Err(format!("runnel push: error {code}: {message}")),
            other => return Err(format!("runnel push: unexpected reply {other:?}")),
        }
        t.bytes += n;
    }
    Ok(t)
}

impl PushConsumer {
    /// Connects, says HELLO for version 3, and SUBSCRIBEs to the default
    /// group of `topic` with `credit`.
    pub fn connect(addr: SocketAddr, topic: &str, credit: u32) -> Result<PushConsumer, String> {
        let mut c = PushConsumer::greet(addr, topic)?;
        c.send_subscribe(credit)?;
        c.await_subscribed()?;
        Ok(c)
    }

    /// Connects and says HELLO for version 3, subscribing to nothing yet:
    /// many subscribers greeted first can then SUBSCRIBE at the same moment
    /// (`send_subscribe` on each, then `await_subscribed`), so that the
    /// broker pushes to all of them in one turn (W11).
    pub fn greet(addr: SocketAddr, topic: &str) -> Result<PushConsumer, String> {
        let mut c = PushConsumer {
            wire: Wire::connect(addr, "runnel push")?,
            topic: topic.to_string(),
            pending: Vec::new(),
            acks_out: 0,
            next_id: 1,
            body: Vec::new(),
        };
        let v = codec::SINCE_PUSH;
        match c.call(&Request::Hello { min_version: v, max_version: v, token: b"" }, 0)? {
            Reply::Hello { version, .. } if version == v => {}
            other => return Err(format!("runnel at {addr}: no push subscriptions (HELLO: {other:?})")),
        }
        Ok(c)
    }

    /// Writes a SUBSCRIBE to the default group of the topic with `credit`.
    pub fn send_subscribe(&mut self, credit: u32) -> Result<(), String> {
        let sub = Request::Subscribe { topic: &self.topic, group: "", credit, ack_timeout_ms: 0 };
        codec::encode_request(&mut self.wire.out, self.next_id, &sub, codec::SINCE_PUSH);
        self.next_id = self.next_id.wrapping_add(1);
        self.wire.flush()
    }

    /// Waits for the SUBSCRIBE's reply (what is pushed after it stays in
    /// the buffer for `next`).
    pub fn await_subscribed(&mut self) -> Result<(), String> {
        match self.reply()? {
            Reply::Subscribed { .. } => Ok(()),
            other => Err(format!("runnel SUBSCRIBE {}: {other:?}", self.topic)),
        }
    }

    /// Sends `req` (in `version`'s layout) and waits for its reply; only
    /// before the subscription starts, when nothing can be pushed.
    fn call(&mut self, req: &Request<'_>, version: u16) -> Result<Reply<'static>, String> {
        codec::encode_request(&mut self.wire.out, self.next_id, req, version);
        self.next_id = self.next_id.wrapping_add(1);
        self.wire.flush()?;
        self.reply()
    }

    /// Waits for the next frame, a reply before the subscription starts.
    fn reply(&mut self) -> Result<Reply<'static>, String> {
        loop {
            if let Decoded::Frame(f, n) = codec::decode_reply(self.wire.input(), REPLY_BYTES_MAX)? {
                let reply = match f.reply {
                    Reply::Hello { version, limits, map_epoch } => Reply::Hello { version, limits, map_epoch },
                    Reply::Subscribed { subscription } => Reply::Subscribed { subscription },
                    other => return Err(format!("runnel push: unexpected reply {other:?}")),
                };
                self.wire.consume(n);
                return Ok(reply);
            }
            self.wire.fill()?;
        }
    }

    /// Queues an ACK of the pending ids; true if one was queued.
    fn queue_ack(&mut self) -> bool {
        if self.pending.is_empty() {
            return false;
        }
        self.body.clear();
        codec::encode_ids(&mut self.body, &self.pending);
        let req = Request::Ack { topic: &self.topic, group: "", ids: Ids { bytes: &self.body } };
        codec::encode_request(&mut self.wire.out, self.next_id, &req, codec::SINCE_PUSH);
        self.next_id = self.next_id.wrapping_add(1);
        self.pending.clear();
        self.acks_out += 1;
        true
    }

    /// Takes the whole frames in the buffer.
    fn take(&mut self, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        let t = take_frames(self.wire.input(), &mut self.pending, on_msg)?;
        self.wire.consume(t.bytes);
        self.acks_out = self.acks_out.saturating_sub(t.ack_replies);
        Ok(t.messages)
    }

    /// Reads what has arrived (a few reads at most) and takes its frames.
    fn read_now(&mut self, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        let mut n = self.take(on_msg)?;
        for _ in 0..READS_PER_CALL_MAX {
            if !self.wire.fill_now()? {
                break;
            }
            n += self.take(on_msg)?;
        }
        Ok(n)
    }
}

impl Consumer for PushConsumer {
    /// Acknowledges what the last call delivered, then hands over what has
    /// been pushed, waiting up to `wait_ms` for some (`max` is the credit's
    /// business: the broker pushes no more than it).
    fn next(&mut self, _max: u32, wait_ms: u32, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        if self.queue_ack() {
            self.wire.flush()?;
        }
        let n = self.read_now(on_msg)?;
        if n > 0 {
            return Ok(n);
        }
        let wait = Duration::from_millis(u64::from(wait_ms));
        if sys::wait_readable(self.wire.fd(), wait).map_err(|e| format!("ppoll: {e}"))? {
            return self.read_now(on_msg);
        }
        Ok(0)
    }

    /// Acknowledges what was delivered and waits for every ACK reply.
    /// Messages pushed meanwhile are not handed over: they stay in flight,
    /// and return to ready when the connection closes.
    fn ack_pending(&mut self) -> Result<(), String> {
        if self.queue_ack() {
            self.wire.flush()?;
        }
        let mut late = Vec::new();
        while self.acks_out > 0 {
            let t = take_frames(self.wire.input(), &mut late, &mut |_| {})?;
            self.wire.consume(t.bytes);
            self.acks_out = self.acks_out.saturating_sub(t.ack_replies);
            if self.acks_out > 0 {
                self.wire.fill()?;
            }
        }
        Ok(())
    }

    /// Busy polling: hands over what has arrived and acknowledges it at
    /// once, in one write; never waits.
    fn poll(&mut self, _max: u32, _wait_ms: u32, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        let n = self.read_now(on_msg)?;
        if self.queue_ack() {
            self.wire.flush()?;
        }
        Ok(n)
    }

    fn end_poll(&mut self, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize, String> {
        let n = self.read_now(on_msg)?;
        self.ack_pending()?;
        Ok(n)
    }

    fn fd(&self) -> RawFd {
        self.wire.fd()
    }
}

#[cfg(test)]
mod tests {
    use runnel::codec::{Message, MessagesWriter, Props, op};

    use super::*;

    /// A pushed frame of `ids`, each message's payload its id's bytes.
    fn pushed(out: &mut Vec<u8>, ids: &[u64]) {
        let payloads: Vec<[u8; 8]> = ids.iter().map(|id| id.to_le_bytes()).collect();
        let mut w = MessagesWriter::begin_pushed(out, 7, "t", codec::SINCE_PUSH);
        for (id, p) in ids.iter().zip(&payloads) {
            let m = Message {
                id: *id,
                born_ms: 0,
                delivery_count: 1,
                dead: None,
                origin_group: "",
                props: Props::EMPTY,
                payload: p,
            };
            w.push(out, &m);
        }
        w.finish(out);
    }

    #[test]
    fn pushed_frames_and_ack_replies_are_taken_in_any_order_and_split() {
        let mut stream = Vec::new();
        pushed(&mut stream, &[1, 2]);
        codec::encode_ids_reply(&mut stream, op::ACK, 9, 2, &[]);
        pushed(&mut stream, &[3]);
        codec::encode_ids_reply(&mut stream, op::ACK, 10, 1, &[]);
        // However the stream is cut, the frames before the cut are taken
        // and the rest waits for more bytes; all of it gives every message
        // once, in order, and both ACK replies.
        for cut in 0..=stream.len() {
            let (mut pending, mut seen) = (Vec::new(), Vec::new());
            let mut on_msg = |p: &[u8]| seen.push(u64::from_le_bytes(p.try_into().expect("8 bytes")));
            let a = take_frames(&stream[..cut], &mut pending, &mut on_msg).expect("first part");
            let mut rest = stream[a.bytes..].to_vec();
            let b = take_frames(&rest, &mut pending, &mut on_msg).expect("the rest");
            rest.drain(..b.bytes);
            assert!(rest.is_empty(), "cut {cut}: {} bytes left", rest.len());
            assert_eq!(seen, [1, 2, 3], "cut {cut}");
            assert_eq!(pending, [1, 2, 3], "cut {cut}");
            assert_eq!((a.messages + b.messages, a.ack_replies + b.ack_replies), (3, 2), "cut {cut}");
        }
    }

    #[test]
    fn a_failed_ack_or_a_broker_error_is_an_error() {
        let mut failed = Vec::new();
        codec::encode_ids_reply(&mut failed, op::ACK, 9, 1, &[5]);
        let e = take_frames(&failed, &mut Vec::new(), &mut |_| {}).expect_err("a failed id");
        assert!(e.contains("1 ids failed, first 5"), "{e}");
        let mut err = Vec::new();
        codec::encode_error(&mut err, op::ACK, 9, codec::ErrorCode::BadArgument, "no");
        assert!(take_frames(&err, &mut Vec::new(), &mut |_| {}).is_err());
    }
}
