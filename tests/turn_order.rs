//! The order of a turn's end, in process (src/reactor.rs, "The order of a
//! turn"): the broker's two halves do what the loop relies on.
//! `Broker::write` writes the turn's records and syncs nothing, so the
//! replies that need only the write (an ACK) may leave after it and before
//! the sync; `Broker::sync` syncs, then delivers a produced message to the
//! consumer parked on its topic, then releases the producer's reply — so
//! end-to-end latency does not wait for the acknowledgement's write.
//!
//! The log's segment file is wrapped so that its writes and syncs land in
//! the same event list as the replies the broker puts in output buffers.

mod common;

use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use common::TempDir;
use runnel::broker::{Broker, Config, ConnKey, LoopStats, Now, Outbox, Outcome, Session};
use runnel::codec::{self, Batch, Frame, Ids, Request};
use runnel::log::{LogOptions, SegmentFile, WRITE_RECORD_BYTES};

const NOW: Now = Now { mono_ms: 1, wall_ms: 1_700_000_000_000 };
const ACKER_CONN: usize = 0;
const WAITER_CONN: usize = 1;
const PRODUCER_CONN: usize = 2;

/// What happened, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// The log wrote this many bytes to its segment.
    Write(usize),
    /// The log synced its segment.
    Sync,
    /// The broker wrote a reply into this connection's output buffer.
    Out(usize),
}

type Events = Arc<Mutex<Vec<Event>>>;

fn take(events: &Events) -> Vec<Event> {
    std::mem::take(&mut *events.lock().expect("events lock"))
}

/// A segment file that records its writes and syncs.
struct Recorded {
    file: std::fs::File,
    events: Events,
}

impl SegmentFile for Recorded {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.events.lock().expect("events lock").push(Event::Write(buf.len()));
        FileExt::write_all_at(&self.file, buf, offset)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        self.events.lock().expect("events lock").push(Event::Sync);
        self.file.sync_data()
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn reserve(&mut self, len: u64) -> io::Result<()> {
        SegmentFile::reserve(&mut self.file, len)
    }
}

/// Output buffers that record, in the same list, each write into them.
struct Recording {
    outs: [Vec<u8>; 3],
    events: Events,
}

impl Outbox for Recording {
    fn out(&mut self, ConnKey(conn): ConnKey) -> Option<&mut Vec<u8>> {
        let mut events = self.events.lock().expect("events lock");
        if events.last() != Some(&Event::Out(conn)) {
            events.push(Event::Out(conn));
        }
        self.outs.get_mut(conn)
    }
    fn unblock(&mut self, _conn: ConnKey) {}
}

fn open(dir: &Path, events: &Events) -> Broker {
    let events = events.clone();
    let opener = Box::new(move |p: &Path| -> io::Result<Box<dyn SegmentFile>> {
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(p)?;
        Ok(Box::new(Recorded { file, events: events.clone() }))
    });
    Broker::open_with(Config::default(), dir, LogOptions::default(), opener, NOW).expect("open broker")
}

fn handle(broker: &mut Broker, conn: usize, session: &mut Session, rid: u32, request: Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    let outcome = broker.handle(
        ConnKey(conn),
        session,
        &Frame { request_id: rid, request },
        NOW,
        &LoopStats::default(),
        &mut out,
    );
    assert_eq!(outcome, Outcome::Done, "request {rid} on connection {conn}");
    out
}

/// Three sessions past HELLO, and topic `t`.
fn setup(broker: &mut Broker, events: &Events) -> [Session; 3] {
    let mut sessions = [0, 1, 2].map(|c| Session { consumer: c + 1, ..Session::default() });
    let hello = Request::Hello { min_version: codec::VERSION_MIN, max_version: codec::VERSION_MAX, token: b"" };
    for (conn, s) in sessions.iter_mut().enumerate() {
        handle(broker, conn, s, 1, hello);
    }
    let create = Request::CreateTopic { topic: "t", settings: Default::default(), options: Default::default() };
    let mut out = Vec::new();
    let frame = Frame { request_id: 2, request: create };
    assert_eq!(
        broker.handle(
            ConnKey(PRODUCER_CONN),
            &mut sessions[PRODUCER_CONN],
            &frame,
            NOW,
            &LoopStats::default(),
            &mut out
        ),
        Outcome::Held
    );
    broker.commit(NOW, &mut Recording { outs: Default::default(), events: events.clone() });
    sessions
}

fn produce(broker: &mut Broker, session: &mut Session, rid: u32, payload: &[u8]) -> Outcome {
    let mut body = Vec::new();
    codec::encode_batch(&mut body, &[payload]);
    let request = Request::Produce { flags: 0, topic: "t", batch: Batch { count: 1, bytes: &body, with_props: false } };
    broker.handle(
        ConnKey(PRODUCER_CONN),
        session,
        &Frame { request_id: rid, request },
        NOW,
        &LoopStats::default(),
        &mut Vec::new(),
    )
}

#[test]
fn a_turn_writes_then_syncs_then_delivers_then_acknowledges() {
    let dir = TempDir::new("turn-order");
    let events: Events = Arc::default();
    let mut broker = open(dir.path(), &events);
    let [mut acker, mut waiter, mut producer] = setup(&mut broker, &events);
    // The acker holds message 1 in flight; the waiter parks on the topic.
    assert_eq!(produce(&mut broker, &mut producer, 3, b"first"), Outcome::Held);
    broker.commit(NOW, &mut Recording { outs: Default::default(), events: events.clone() });
    let fetch =
        |wait_ms| Request::Fetch { topic: "t", group: "", max_messages: 1, max_bytes: 0, wait_ms, ack_timeout_ms: 0 };
    let got = handle(&mut broker, ACKER_CONN, &mut acker, 4, fetch(0));
    assert!(got.len() > 40, "setup: the acker got the first message");
    let frame = Frame { request_id: 5, request: fetch(1000) };
    assert_eq!(
        broker.handle(ConnKey(WAITER_CONN), &mut waiter, &frame, NOW, &LoopStats::default(), &mut Vec::new()),
        Outcome::Parked
    );
    take(&events);

    // One turn: an ACK (answered into the acker's buffer at once) and a
    // PRODUCE (held).
    let mut ids = Vec::new();
    codec::encode_ids(&mut ids, &[1]);
    let ack = handle(
        &mut broker,
        ACKER_CONN,
        &mut acker,
        6,
        Request::Ack { topic: "t", group: "", ids: Ids { bytes: &ids } },
    );
    assert!(!ack.is_empty(), "the ACK is answered into its buffer");
    assert_eq!(produce(&mut broker, &mut producer, 7, b"second"), Outcome::Held, "a durable produce waits");
    assert_eq!(take(&events), [], "nothing is written while requests are served");

    let mut written = broker.write(NOW);
    let at_write = take(&events);
    assert!(matches!(at_write[..], [Event::Write(n)] if n > 0), "write: one write, no sync: {at_write:?}");
    assert!(written.syncs(), "the held PRODUCE needs a sync");
    // Here the reactor flushes the ACK's reply: its record is written.

    let mut turn = Recording { outs: Default::default(), events: events.clone() };
    broker.sync(&mut written, NOW, &mut turn);
    assert_eq!(
        take(&events),
        // The Deliver record (32 bytes) after its write's Write record.
        [Event::Sync, Event::Out(WAITER_CONN), Event::Write(32 + WRITE_RECORD_BYTES), Event::Out(PRODUCER_CONN)],
        "sync, then the delivery and the write of its Deliver record, then the PRODUCE's reply"
    );
    assert!(!turn.outs[WAITER_CONN].is_empty(), "the parked FETCH got the message");
    assert!(!turn.outs[PRODUCER_CONN].is_empty(), "the PRODUCE got its reply");
    broker.sync(&mut written, NOW, &mut turn);
    assert_eq!(take(&events), [], "a second sync of the same write does nothing");
}

#[test]
fn a_turn_of_only_acks_writes_and_does_not_sync() {
    let dir = TempDir::new("turn-order-acks");
    let events: Events = Arc::default();
    let mut broker = open(dir.path(), &events);
    let [mut acker, _, mut producer] = setup(&mut broker, &events);
    assert_eq!(produce(&mut broker, &mut producer, 3, b"only"), Outcome::Held);
    broker.commit(NOW, &mut Recording { outs: Default::default(), events: events.clone() });
    let fetch = Request::Fetch { topic: "t", group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 0 };
    handle(&mut broker, ACKER_CONN, &mut acker, 4, fetch);
    take(&events);

    let mut ids = Vec::new();
    codec::encode_ids(&mut ids, &[1]);
    handle(&mut broker, ACKER_CONN, &mut acker, 5, Request::Ack { topic: "t", group: "", ids: Ids { bytes: &ids } });
    let mut written = broker.write(NOW);
    assert!(!written.syncs(), "nothing waits on a sync");
    broker.sync(&mut written, NOW, &mut Recording { outs: Default::default(), events: events.clone() });
    let got = take(&events);
    assert!(matches!(got[..], [Event::Write(n)] if n > 0), "one write and no sync: {got:?}");
}
