//! A broker on a test clock, driven as the reactor drives it — a turn's
//! requests, then its timers, then its commit — with `Now` chosen by the
//! test, so that nothing sleeps: the harness of tests/dedup.rs,
//! tests/schedule.rs, tests/retry.rs and tests/retention.rs, each of which
//! adds the requests it needs.

use std::path::Path;

use runnel::broker::{Broker, Config, ConnKey, LoopStats, Now, Outcome, Session};
use runnel::codec::inspect::{GroupLine, HeldMessage, Inspected};
use runnel::codec::{self, Decoded, Frame, Ids, Props, PropsLimits, Reply, Request};
use runnel::log::LogOptions;

use super::Outs;

/// Where the test clock starts: 2026-01-01, ms since the Unix epoch.
pub const START_WALL_MS: u64 = 1_767_225_600_000;
/// Small segments, bytes, so that compaction soon removes segments,
/// restates groups and copies messages forward.
pub const SEGMENT_BYTES_MAX: u64 = 8 << 10;

/// The clock of a broker's first turn.
pub fn start() -> Now {
    Now { mono_ms: 1, wall_ms: START_WALL_MS }
}

/// A broker on a test clock, with one session.
pub struct Harness {
    pub broker: Broker,
    pub session: Session,
    /// The clock of the next turn.
    pub now: Now,
    /// The request id of the last request.
    pub rid: u32,
}

impl Harness {
    /// Opens a broker on `dir` (segments of `SEGMENT_BYTES_MAX`) at `now`,
    /// with a session that negotiated `version`.
    pub fn open(dir: &Path, now: Now, config: Config, version: u16) -> Harness {
        let log = LogOptions { segment_bytes_max: SEGMENT_BYTES_MAX, ..LogOptions::default() };
        Harness::over(Broker::open(config, dir, log, now).expect("open broker"), now, version)
    }

    /// A harness over `broker` (a memory-only one, say) at `now`, with a
    /// session that negotiated `version`.
    pub fn over(broker: Broker, now: Now, version: u16) -> Harness {
        let mut h = Harness { broker, session: Session { consumer: 1, ..Session::default() }, now, rid: 0 };
        let reply = h.call(Request::Hello { min_version: 1, max_version: version, token: b"" });
        assert!(matches!(reply, Reply::Hello { version: v, .. } if v == version), "{reply:?}");
        h
    }

    /// Serves one request in a turn of its own (requests, timers, commit)
    /// and returns its reply.
    pub fn call(&mut self, request: Request<'_>) -> Reply<'static> {
        self.rid += 1;
        let mut out = Vec::new();
        let frame = Frame { request_id: self.rid, request };
        let outcome =
            self.broker.handle(ConnKey(0), &mut self.session, &frame, self.now, &LoopStats::default(), &mut out);
        let mut outs = Outs::default();
        self.broker.advance(self.now, &mut outs);
        self.broker.commit(self.now, &mut outs);
        if outcome == Outcome::Held {
            out = std::mem::take(&mut outs.0[0]);
        }
        let reply = match codec::decode_reply(&out, usize::MAX) {
            Ok(Decoded::Frame(f, n)) if n == out.len() => f.reply,
            other => panic!("not one reply: {other:?}"),
        };
        // The reply borrows `out`: keep what the tests read.
        owned(reply)
    }

    /// The session's connection closes (what it held in flight returns)
    /// and a new one, of the same version, takes its place.
    pub fn reconnect(&mut self) {
        self.broker.disconnect(ConnKey(0), &self.session);
        let mut outs = super::Outs::default();
        self.broker.commit(self.now, &mut outs);
        let version = self.session.version;
        self.session = Session { consumer: self.session.consumer + 1, ..Session::default() };
        let reply = self.call(Request::Hello { min_version: 1, max_version: version, token: b"" });
        assert!(matches!(reply, Reply::Hello { version: v, .. } if v == version), "{reply:?}");
    }

    /// Fetches and acks everything ready in `topic`'s default group;
    /// returns how many.
    pub fn ack_all(&mut self, topic: &'static str) -> usize {
        let mut n = 0;
        loop {
            let fetch =
                Request::Fetch { topic, group: "", max_messages: 1000, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
            let Reply::Messages { messages, .. } = self.call(fetch) else { panic!("fetch") };
            if messages.is_empty() {
                return n;
            }
            let ids: Vec<u64> = messages.iter().map(|m| m.id).collect();
            n += ids.len();
            let mut body = Vec::new();
            codec::encode_ids(&mut body, &ids);
            let ack = self.call(Request::Ack { topic, group: "", ids: Ids { bytes: &body } });
            assert!(matches!(ack, Reply::Ids { failed, .. } if failed.is_empty()));
        }
    }

    /// A turn with no request at wall clock `to_wall_ms` (the monotonic
    /// clock moves as far): the timers that are due fire.
    pub fn tick_to(&mut self, to_wall_ms: u64) {
        let ahead = to_wall_ms.saturating_sub(self.now.wall_ms);
        self.now = Now { mono_ms: self.now.mono_ms + ahead, wall_ms: self.now.wall_ms + ahead };
        let mut outs = Outs::default();
        self.broker.advance(self.now, &mut outs);
        self.broker.commit(self.now, &mut outs);
    }
}

/// A reply, owned (its strings and messages leaked: tests only).
pub fn owned(r: Reply<'_>) -> Reply<'static> {
    match r {
        Reply::Messages { topic, messages } => Reply::Messages {
            topic: String::from(topic).leak(),
            messages: messages
                .into_iter()
                .map(|m| codec::Message {
                    origin_group: String::from(m.origin_group).leak(),
                    props: Props::parse(m.props.bytes().to_vec().leak(), codec::CODEC_VERSION_MAX, &PropsLimits::ANY)
                        .expect("props"),
                    payload: m.payload.to_vec().leak(),
                    ..m
                })
                .collect(),
        },
        Reply::Error { code, message } => Reply::Error { code, message: String::from(message).leak() },
        Reply::Stats(s) => Reply::Stats(
            s.into_iter()
                .map(|(n, kv)| {
                    let kv = kv.into_iter().map(|(k, v)| (&*String::from(k).leak(), v)).collect();
                    (&*String::from(n).leak(), kv)
                })
                .collect(),
        ),
        Reply::Hello { version, limits, map_epoch } => Reply::Hello { version, limits, map_epoch },
        Reply::Produced { first_id, count } => Reply::Produced { first_id, count },
        Reply::Deduplicated { first_id, count, duplicates } => Reply::Deduplicated { first_id, count, duplicates },
        Reply::Ids { done, failed } => Reply::Ids { done, failed },
        Reply::Due(at) => Reply::Due(at),
        Reply::Count(n) => Reply::Count(n),
        Reply::Created { created } => Reply::Created { created },
        Reply::GroupCreated { created, cursor } => Reply::GroupCreated { created, cursor },
        Reply::Cursor(c) => Reply::Cursor(c),
        Reply::AckProduced { done, failed, outputs } => Reply::AckProduced { done, failed, outputs },
        Reply::Inspected(entries) => Reply::Inspected(entries.into_iter().map(owned_inspected).collect()),
        other => panic!("a reply these tests do not expect: {other:?}"),
    }
}

/// An inspection entry, owned.
fn owned_inspected(e: Inspected<'_>) -> Inspected<'static> {
    let message = e.message.map(|m| HeldMessage {
        props: Props::parse(m.props.bytes().to_vec().leak(), codec::CODEC_VERSION_MAX, &PropsLimits::ANY)
            .expect("props"),
        payload: m.payload.map(|p| &*p.to_vec().leak()),
        ..m
    });
    let groups = e
        .groups
        .into_iter()
        .map(|g| GroupLine {
            name: String::from(g.name).leak(),
            last_nack_reason: String::from(g.last_nack_reason).leak(),
            ..g
        })
        .collect();
    Inspected { id: e.id, message, groups }
}
