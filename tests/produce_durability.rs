//! Durability per produce (protocol version 3), in process: a PRODUCE with
//! `PRODUCE_FLAG_WRITTEN` is acknowledged once the turn's write stored it,
//! before the `fdatasync`, while a plain PRODUCE of the same turn still
//! waits for the sync, and the messages of both become visible to consumers
//! only at the sync. A write that fails answers the written produce
//! STORAGE, as any produce; replies stay in request order on a connection.
//!
//! As tests/turn_order.rs does, the log's segment file is wrapped so that
//! its writes and syncs land in one event list with the replies the broker
//! puts in output buffers.

mod common;

use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::TempDir;
use runnel::broker::{Broker, Config, ConnKey, LoopStats, Now, Outbox, Outcome, Session};
use runnel::codec::{self, Batch, Decoded, ErrorCode, Frame, PRODUCE_FLAG_WRITTEN, Reply, Request};
use runnel::log::{LogOptions, SegmentFile};

const NOW: Now = Now { mono_ms: 1, wall_ms: 1_700_000_000_000 };
const FAST: usize = 0;
const SAFE: usize = 1;
const WAITER: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Write,
    Sync,
    /// The broker wrote into this connection's output buffer.
    Out(usize),
}

#[derive(Default)]
struct Shared {
    events: Mutex<Vec<Event>>,
    /// Writes fail while set.
    fail_writes: AtomicBool,
}

impl Shared {
    fn push(&self, e: Event) {
        self.events.lock().expect("events").push(e);
    }
    fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.lock().expect("events"))
    }
}

struct Recorded {
    file: std::fs::File,
    shared: Arc<Shared>,
}

impl SegmentFile for Recorded {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.shared.fail_writes.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected write failure"));
        }
        self.shared.push(Event::Write);
        FileExt::write_all_at(&self.file, buf, offset)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        self.shared.push(Event::Sync);
        self.file.sync_data()
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn reserve(&mut self, len: u64) -> io::Result<()> {
        SegmentFile::reserve(&mut self.file, len)
    }
}

struct Outs {
    outs: [Vec<u8>; 3],
    shared: Arc<Shared>,
}

impl Outbox for Outs {
    fn out(&mut self, ConnKey(conn): ConnKey) -> Option<&mut Vec<u8>> {
        let mut events = self.shared.events.lock().expect("events");
        if events.last() != Some(&Event::Out(conn)) {
            events.push(Event::Out(conn));
        }
        self.outs.get_mut(conn)
    }
    fn unblock(&mut self, _conn: ConnKey) {}
}

impl Outs {
    /// The replies in `conn`'s output, decoded, and the output emptied.
    fn replies(&mut self, conn: usize) -> Vec<(u32, Result<u64, ErrorCode>)> {
        let bytes = std::mem::take(&mut self.outs[conn]);
        let mut rest = &bytes[..];
        let mut got = Vec::new();
        while !rest.is_empty() {
            let Ok(Decoded::Frame(f, n)) = codec::decode_reply(rest, usize::MAX) else { panic!("bad reply") };
            let r = match f.reply {
                Reply::Produced { first_id, .. } => Ok(first_id),
                Reply::Messages { messages, .. } => Ok(messages.len() as u64),
                Reply::Error { code, .. } => Err(ErrorCode::from_u8(code).expect("code")),
                other => panic!("unexpected {other:?}"),
            };
            got.push((f.request_id, r));
            rest = &rest[n..];
        }
        got
    }
}

struct Rig {
    broker: Broker,
    sessions: [Session; 3],
    outs: Outs,
    shared: Arc<Shared>,
}

impl Rig {
    fn new(dir: &Path) -> Rig {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let opener = Box::new(move |p: &Path| -> io::Result<Box<dyn SegmentFile>> {
            let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(p)?;
            Ok(Box::new(Recorded { file, shared: s.clone() }))
        });
        let broker = Broker::open_with(Config::default(), dir, LogOptions::default(), opener, NOW).expect("open");
        let sessions = [1, 2, 3].map(|c| Session { consumer: c, ..Session::default() });
        let outs = Outs { outs: Default::default(), shared: shared.clone() };
        let mut rig = Rig { broker, sessions, outs, shared };
        let hello = Request::Hello { min_version: 1, max_version: codec::SINCE_PRODUCE_FLAGS, token: b"" };
        for conn in 0..3 {
            assert_eq!(rig.handle(conn, 1, hello), Outcome::Done);
        }
        let create = Request::CreateTopic { topic: "t", settings: Default::default(), options: Default::default() };
        assert_eq!(rig.handle(SAFE, 2, create), Outcome::Held);
        rig.commit();
        rig.outs.outs = Default::default();
        rig.shared.take();
        rig
    }

    fn handle(&mut self, conn: usize, rid: u32, request: Request<'_>) -> Outcome {
        let mut out = Vec::new();
        let frame = Frame { request_id: rid, request };
        let session = &mut self.sessions[conn];
        let outcome = self.broker.handle(ConnKey(conn), session, &frame, NOW, &LoopStats::default(), &mut out);
        self.outs.outs[conn].extend_from_slice(&out);
        outcome
    }

    /// A FETCH of topic t parks on the waiter's connection.
    fn park_waiter(&mut self) {
        let fetch = Request::Fetch {
            topic: "t",
            group: "",
            max_messages: 10,
            max_bytes: 0,
            wait_ms: 10_000,
            ack_timeout_ms: 0,
        };
        assert_eq!(self.handle(WAITER, 3, fetch), Outcome::Parked);
    }

    fn produce(&mut self, conn: usize, rid: u32, flags: u8) -> Outcome {
        let mut body = Vec::new();
        codec::encode_message(&mut body, &codec::Props::EMPTY, b"m");
        let batch = Batch { count: 1, bytes: &body, with_props: true };
        self.handle(conn, rid, Request::Produce { topic: "t", flags, batch })
    }

    /// The turn's end as the reactor runs it: write, the written replies,
    /// sync.
    fn commit(&mut self) {
        let mut written = self.broker.write(NOW);
        self.broker.send_written(&written, &mut self.outs);
        self.broker.sync(&mut written, NOW, &mut self.outs);
    }
}

#[test]
fn a_written_produce_is_answered_before_the_sync_and_a_synced_one_after() {
    let dir = TempDir::new("durability");
    let mut rig = Rig::new(dir.path());
    rig.park_waiter();
    assert_eq!(rig.produce(FAST, 4, PRODUCE_FLAG_WRITTEN), Outcome::Held);
    assert_eq!(rig.produce(SAFE, 5, 0), Outcome::Held);
    rig.commit();
    assert_eq!(
        rig.shared.take(),
        [Event::Write, Event::Out(FAST), Event::Sync, Event::Out(WAITER), Event::Write, Event::Out(SAFE)],
        "the written produce's reply before the sync; the messages and the synced produce's reply after it, \
         with the waiter's Deliver record written before the reactor flushes them"
    );
    assert_eq!(rig.outs.replies(FAST), [(4, Ok(1))]);
    assert_eq!(rig.outs.replies(SAFE), [(5, Ok(2))]);
    assert_eq!(rig.outs.replies(WAITER), [(3, Ok(2))], "both messages, visible at the sync");
}

#[test]
fn a_turn_of_written_produces_alone_still_syncs_before_they_are_visible() {
    let dir = TempDir::new("durability");
    let mut rig = Rig::new(dir.path());
    rig.park_waiter();
    assert_eq!(rig.produce(FAST, 4, PRODUCE_FLAG_WRITTEN), Outcome::Held);
    rig.commit();
    assert_eq!(rig.shared.take(), [Event::Write, Event::Out(FAST), Event::Sync, Event::Out(WAITER), Event::Write]);
}

#[test]
fn replies_stay_in_request_order_on_a_connection() {
    let dir = TempDir::new("durability");
    let mut rig = Rig::new(dir.path());
    // A synced produce, then a written one, pipelined on one connection:
    // the second waits for the first.
    assert_eq!(rig.produce(FAST, 4, 0), Outcome::Held);
    assert_eq!(rig.produce(FAST, 5, PRODUCE_FLAG_WRITTEN), Outcome::Held);
    rig.commit();
    assert_eq!(rig.shared.take(), [Event::Write, Event::Sync, Event::Out(FAST)]);
    assert_eq!(rig.outs.replies(FAST), [(4, Ok(1)), (5, Ok(2))]);
    // A written one first: it leaves at the write; the synced one after.
    assert_eq!(rig.produce(FAST, 6, PRODUCE_FLAG_WRITTEN), Outcome::Held);
    assert_eq!(rig.produce(FAST, 7, 0), Outcome::Held);
    rig.commit();
    assert_eq!(rig.shared.take(), [Event::Write, Event::Out(FAST), Event::Sync, Event::Out(FAST)]);
    assert_eq!(rig.outs.replies(FAST), [(6, Ok(3)), (7, Ok(4))]);
}

#[test]
fn a_failed_write_answers_a_written_produce_storage() {
    let dir = TempDir::new("durability");
    let mut rig = Rig::new(dir.path());
    rig.shared.fail_writes.store(true, Ordering::SeqCst);
    assert_eq!(rig.produce(FAST, 4, PRODUCE_FLAG_WRITTEN), Outcome::Held);
    rig.commit();
    assert_eq!(rig.outs.replies(FAST), [(4, Err(ErrorCode::Storage))]);
    // The disk works again: the next one is stored and answered at its write.
    rig.shared.fail_writes.store(false, Ordering::SeqCst);
    rig.shared.take();
    assert_eq!(rig.produce(FAST, 5, PRODUCE_FLAG_WRITTEN), Outcome::Held);
    rig.commit();
    assert_eq!(rig.shared.take(), [Event::Write, Event::Out(FAST), Event::Sync]);
    assert!(matches!(rig.outs.replies(FAST)[..], [(5, Ok(_))]));
}

#[test]
fn the_flag_needs_version_3_and_works_over_the_network() {
    let (srv, _dir) = common::Server::start(Config::default());
    let mut old = runnel::client::Client::connect_upto(srv.addr, b"", 2).expect("connect");
    assert!(matches!(
        old.set_produce_flags(PRODUCE_FLAG_WRITTEN),
        Err(runnel::client::Error::Version { needed: 3, version: 2 })
    ));
    let mut c = srv.client_v2();
    c.set_produce_flags(PRODUCE_FLAG_WRITTEN).expect("version 3");
    let (first, n) = c.produce_batch("t", &[b"a", b"b"]).expect("produce");
    let got = c.fetch("t", common::wire::now(10)).expect("fetch");
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), (first..first + u64::from(n)).collect::<Vec<_>>());
}
