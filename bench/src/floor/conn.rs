//! A floor connection's protocol state, without its socket or the clock:
//! the bytes received and not yet decoded, the replies not yet written,
//! and the stops that end a serve (a parked FETCH, output backpressure).
//! The same shape as runnel's `conn::ConnState`, with less in it: a bad
//! frame is answered and then the connection is closed (the floor serves
//! the bench's own client, which sends none), and there are no timeouts.

use runnel::codec::{self, Decoded, HEADER_BYTES};

use crate::echo::{Echo, Outcome};

/// A frame starts with its length (u32 LE), which counts the bytes after
/// it (docs/protocol.md, "Frames").
const LENGTH_FIELD_BYTES: usize = 4;

/// What `Conn::serve` asks of the loop.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Everything decodable was served; read more.
    Continue,
    /// Read no more now (a FETCH parked, or paused for output).
    Stop,
    /// Close the connection (its error reply, if any, is in `out`).
    End,
}

/// One connection's protocol state.
#[derive(Debug, Default)]
pub struct Conn {
    /// Received bytes not yet decoded: the start of one frame, or what
    /// followed a stop.
    pub input: Vec<u8>,
    /// Replies not yet written; `out_pos` is how far writing got, bytes.
    pub out: Vec<u8>,
    pub out_pos: usize,
    /// The topic a FETCH of this connection is parked on: no more is read
    /// until the echo answers it (and the loop clears this).
    pub parked: Option<usize>,
    /// Decoding paused because pending output reached `out_pause_bytes`;
    /// the flush clears it once the output drains below.
    pub paused: bool,
    /// The peer shut its side: a FETCH that parks now ends the connection.
    pub peer_closed: bool,
    /// Ending: nothing more is served.
    pub closing: bool,
}

impl Conn {
    /// Reply bytes not yet written.
    pub fn pending_out_bytes(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// Serves the buffered input, then `chunk` (bytes just read, or None):
    /// every complete frame is decoded and answered by `echo` into `out`,
    /// until the input runs out or a stop. Frames are decoded from the
    /// chunk where it lies; only a frame begun in an earlier chunk is
    /// completed in the buffer (with just the bytes it lacks), and only an
    /// incomplete frame, or what follows a stop, is copied into it.
    /// `out_pause_bytes` is the pending output at which decoding pauses.
    pub fn serve(
        &mut self,
        key: usize,
        chunk: Option<&[u8]>,
        echo: &mut Echo,
        now_ms: u64,
        out_pause_bytes: usize,
    ) -> Step {
        let Some(mut chunk) = chunk else {
            return self.serve_buffered(key, echo, now_ms, out_pause_bytes);
        };
        if !self.input.is_empty() {
            let take = self.completing_bytes(chunk);
            self.input.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            let step = self.serve_buffered(key, echo, now_ms, out_pause_bytes);
            if step != Step::Continue || !self.input.is_empty() {
                self.input.extend_from_slice(chunk);
                return step;
            }
        }
        let (step, used) = self.serve_from(chunk, key, echo, now_ms, out_pause_bytes);
        self.input.extend_from_slice(&chunk[used..]);
        self.after_serve(step)
    }

    /// Serves what the buffer holds.
    fn serve_buffered(&mut self, key: usize, echo: &mut Echo, now_ms: u64, out_pause_bytes: usize) -> Step {
        let input = std::mem::take(&mut self.input);
        let (step, used) = self.serve_from(&input, key, echo, now_ms, out_pause_bytes);
        self.input = input;
        self.input.drain(..used);
        self.after_serve(step)
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
        let frame = (LENGTH_FIELD_BYTES + u32::from_le_bytes(len) as usize).max(HEADER_BYTES);
        frame.saturating_sub(have).min(chunk.len())
    }

    /// The decode loop over `input`; returns the step and the bytes used.
    fn serve_from(
        &mut self,
        input: &[u8],
        key: usize,
        echo: &mut Echo,
        now_ms: u64,
        out_pause_bytes: usize,
    ) -> (Step, usize) {
        let limits = *echo.decode_limits();
        let mut used = 0;
        while !self.closing && self.parked.is_none() {
            // Backpressure, as runnel: a peer with this much output pending
            // gets no more replies until it reads.
            if self.pending_out_bytes() >= out_pause_bytes {
                self.paused = true;
                return (Step::Stop, used);
            }
            match codec::decode_request(&input[used..], &limits, 1) {
                Ok(Decoded::NeedMore) => return (Step::Continue, used),
                Ok(Decoded::Frame(frame, n)) => {
                    used += n;
                    if let Outcome::Parked(t) = echo.handle(key, &frame, now_ms, &mut self.out) {
                        self.parked = Some(t);
                    }
                }
                Err(e) => {
                    codec::encode_error(&mut self.out, e.op, e.request_id, e.code, &e.message);
                    return (Step::End, input.len());
                }
            }
        }
        (Step::Stop, used)
    }

    /// A FETCH that parked for a peer that has gone ends the connection.
    fn after_serve(&mut self, step: Step) -> Step {
        if step == Step::Stop && self.parked.is_some() && self.peer_closed { Step::End } else { step }
    }
}

#[cfg(test)]
mod tests {
    use runnel::codec::{Batch, Ids, Request, decode_reply, encode_request};

    use super::*;
    use crate::echo::EchoLimits;

    /// The bytes of `reqs`, as a client sends them.
    fn requests(reqs: &[Request<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            encode_request(&mut out, i as u32 + 1, r, 1);
        }
        out
    }

    /// Decodes every reply in `out`: (op, request id, reply).
    fn replies(out: &[u8]) -> Vec<(u8, u32, String)> {
        let mut v = Vec::new();
        let mut at = 0;
        while at < out.len() {
            match decode_reply(&out[at..], usize::MAX).expect("a valid reply") {
                Decoded::Frame(f, n) => {
                    v.push((f.op, f.request_id, format!("{:?}", f.reply)));
                    at += n;
                }
                Decoded::NeedMore => panic!("a partial reply"),
            }
        }
        v
    }

    fn produce<'a>(topic: &'a str, records: &'a [u8]) -> Request<'a> {
        Request::Produce { flags: 0, topic, batch: Batch { count: 1, bytes: records, with_props: false } }
    }

    #[test]
    fn any_split_of_a_stream_gives_the_same_replies() {
        let mut records = Vec::new();
        codec::encode_batch(&mut records, &[vec![7u8; 300]]);
        let ids = 5u64.to_le_bytes();
        let stream = requests(&[
            Request::Hello { min_version: 1, max_version: 1, token: b"" },
            produce("t", &records),
            produce("t", &records),
            Request::Fetch { topic: "t", group: "", max_messages: 10, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 },
            Request::Ack { topic: "t", group: "", ids: Ids { bytes: &ids } },
            Request::Ping,
        ]);
        let whole = {
            let mut c = Conn::default();
            let mut echo = Echo::new(EchoLimits::new(1 << 20));
            assert_eq!(c.serve(0, Some(&stream), &mut echo, 0, 1 << 20), Step::Continue);
            assert!(c.input.is_empty());
            c.out
        };
        assert_eq!(replies(&whole).len(), 6);
        for cut in [1, 3, 4, 5, 11, 12, 13, 40, stream.len() / 2, stream.len() - 1] {
            let mut c = Conn::default();
            let mut echo = Echo::new(EchoLimits::new(1 << 20));
            for piece in stream.chunks(cut) {
                assert_eq!(c.serve(0, Some(piece), &mut echo, 0, 1 << 20), Step::Continue, "chunks of {cut}");
            }
            assert!(c.input.is_empty(), "chunks of {cut}");
            assert_eq!(c.out, whole, "chunks of {cut}");
        }
    }

    #[test]
    fn a_parked_fetch_stops_decoding_and_keeps_what_follows() {
        let stream = requests(&[
            Request::Fetch { topic: "t", group: "", max_messages: 1, max_bytes: 0, wait_ms: 100, ack_timeout_ms: 0 },
            Request::Ping,
        ]);
        let mut c = Conn::default();
        let mut echo = Echo::new(EchoLimits::new(1 << 20));
        assert_eq!(c.serve(3, Some(&stream), &mut echo, 0, 1 << 20), Step::Stop);
        assert_eq!(c.parked, Some(0));
        assert!(c.out.is_empty());
        let ping = requests(&[Request::Ping, Request::Ping]);
        assert_eq!(c.input, ping[ping.len() / 2..], "the PING waits undecoded");
        c.peer_closed = true;
        c.parked = None;
        assert_eq!(c.serve(3, None, &mut echo, 0, 1 << 20), Step::Continue);
        assert_eq!(replies(&c.out), vec![(codec::op::PING, 2, "Pong".into())]);
    }

    #[test]
    fn a_bad_frame_is_answered_then_ends_the_connection() {
        let mut c = Conn::default();
        let mut echo = Echo::new(EchoLimits::new(1 << 20));
        let bad = [4u8, 0, 0, 0, 1, 0, 0, 0];
        assert_eq!(c.serve(0, Some(&bad), &mut echo, 0, 1 << 20), Step::End);
        let r = replies(&c.out);
        assert_eq!(r.len(), 1);
        assert!(r[0].2.starts_with("Error { code: 1,"), "MALFORMED: {r:?}");
    }

    #[test]
    fn output_backpressure_pauses_decoding() {
        let stream = requests(&[Request::Ping, Request::Ping, Request::Ping]);
        let mut c = Conn::default();
        let mut echo = Echo::new(EchoLimits::new(1 << 20));
        // A PING reply is 12 bytes: the third request waits.
        assert_eq!(c.serve(0, Some(&stream), &mut echo, 0, 24), Step::Stop);
        assert!(c.paused);
        assert_eq!(replies(&c.out).len(), 2);
    }
}
