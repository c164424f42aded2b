//! The compactor's notes of the records the log keeps for its next commit
//! (the acks of ACK_PRODUCE records, the ids of Deliver records, the
//! ranges of broker-made Produce records) go with those records when the
//! log drops them past `unwritten_records_bytes_max`: a disk that keeps
//! failing grows neither the log's buffer nor the compactor's lists.

use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::broker::{Broker, Config, ConnKey, LoopStats, Now, Outbox, Session};
use crate::codec::{self, Batch, Decoded, Frame, Ids, Props, Reply, ReplyFrame, Request};
use crate::limits::Limits;
use crate::log::{LogOptions, Opener, SegmentFile};
use crate::testkit::TempDir;

/// The bound under test: a few dozen failed turns' records.
const UNWRITTEN_BYTES_MAX: u64 = 2048;

/// A segment file whose writes fail while `failing` is set.
struct Failing {
    file: std::fs::File,
    failing: Arc<AtomicBool>,
}

impl SegmentFile for Failing {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected: the disk keeps failing"));
        }
        FileExt::write_all_at(&self.file, buf, offset)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn reserve(&mut self, _len: u64) -> io::Result<()> {
        Ok(())
    }
}

fn failing_opener(failing: Arc<AtomicBool>) -> Opener {
    Box::new(move |p: &Path| -> io::Result<Box<dyn SegmentFile>> {
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(p)?;
        Ok(Box::new(Failing { file, failing: failing.clone() }))
    })
}

/// Every reply goes to one buffer.
#[derive(Default)]
struct Out(Vec<u8>);

impl Outbox for Out {
    fn out(&mut self, _conn: ConnKey) -> Option<&mut Vec<u8>> {
        Some(&mut self.0)
    }
    fn unblock(&mut self, _conn: ConnKey) {}
}

/// Serves `req` in a turn of its own and returns its reply.
fn call(broker: &mut Broker, session: &mut Session, req: Request<'_>) -> Reply<'static> {
    let now = Now { mono_ms: 1, wall_ms: 1_700_000_000_000 };
    let mut out = Out::default();
    let frame = Frame { request_id: 1, request: req };
    broker.handle(ConnKey(0), session, &frame, now, &LoopStats::default(), &mut out.0);
    broker.commit(now, &mut out);
    let bytes: &'static [u8] = Box::leak(out.0.into_boxed_slice());
    let Ok(Decoded::Frame(ReplyFrame { reply, .. }, _)) = codec::decode_reply(bytes, usize::MAX) else {
        panic!("no reply in {bytes:?}");
    };
    reply
}

/// FETCHes one message of `in` and returns its id.
fn fetch_one(broker: &mut Broker, session: &mut Session) -> u64 {
    let req =
        Request::Fetch { topic: "in", group: "", max_messages: 1, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 600_000 };
    match call(broker, session, req) {
        Reply::Messages { messages, .. } if messages.len() == 1 => messages[0].id,
        other => panic!("fetch: {other:?}"),
    }
}

/// ACK_PRODUCE of `id` of `in`, with one message to `out`.
fn ack_produce(broker: &mut Broker, session: &mut Session, id: u64) -> Reply<'static> {
    let mut ids = Vec::new();
    codec::encode_ids(&mut ids, &[id]);
    let mut message = Vec::new();
    codec::encode_message(&mut message, &Props::default(), b"result");
    let batch = Batch { count: 1, bytes: &message, with_props: true };
    let mut outputs = Vec::new();
    codec::ack_produce::encode_output(&mut outputs, "out", &batch);
    let outputs = codec::ack_produce::Outputs { count: 1, bytes: &outputs };
    call(broker, session, Request::AckProduce { topic: "in", group: "", ids: Ids { bytes: &ids }, outputs })
}

#[test]
fn the_compactors_notes_go_with_the_records_the_log_drops() {
    let dir = TempDir::new("unwritten-notes");
    let failing = Arc::new(AtomicBool::new(false));
    let limits = Limits { unwritten_records_bytes_max: UNWRITTEN_BYTES_MAX, ..Limits::default() };
    let config = Config { limits, ..Config::default() };
    let opener = failing_opener(failing.clone());
    let mut broker =
        Broker::open_with(config, dir.path(), LogOptions::default(), opener, Now::default()).expect("open");
    let mut session = Session { hello: true, version: 3, consumer: 1, ..Session::default() };
    let payloads = vec![b"job".as_slice(); 301];
    let mut batch = Vec::new();
    codec::encode_batch(&mut batch, &payloads);
    let batch = Batch { count: 301, bytes: &batch, with_props: false };
    let produced = call(&mut broker, &mut session, Request::Produce { flags: 0, topic: "in", batch });
    assert!(matches!(produced, Reply::Produced { .. }), "{produced:?}");
    failing.store(true, Ordering::SeqCst);
    let mut drops = 0;
    for turn in 0..300 {
        let id = fetch_one(&mut broker, &mut session);
        let before = broker.log.unwritten_bytes();
        let r = ack_produce(&mut broker, &mut session, id);
        assert!(matches!(r, Reply::Error { .. }), "turn {turn}: want STORAGE, got {r:?}");
        let kept = broker.log.unwritten_bytes();
        assert!(kept <= UNWRITTEN_BYTES_MAX, "turn {turn}: the log keeps {kept} bytes");
        if kept < before {
            // The log dropped what it kept: nothing may wait for it.
            drops += 1;
            assert_eq!(kept, 0, "turn {turn}: a drop takes every record kept");
            assert_eq!(broker.compactor.unwritten_notes(), 0, "turn {turn}: notes of dropped records");
        }
    }
    assert!(drops >= 5, "the log dropped its records {drops} times in 300 failed turns");
    failing.store(false, Ordering::SeqCst);
    fetch_one(&mut broker, &mut session);
    assert_eq!(broker.log.unwritten_bytes(), 0, "the disk works again");
    assert_eq!(broker.compactor.unwritten_notes(), 0);
}
