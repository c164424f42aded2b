//! The order of a turn's output, in process (src/reactor.rs, "The order of
//! a turn"): a produced message reaches the consumer parked on its topic
//! before the producer is told it is durable — both after the sync — so
//! end-to-end latency does not wait for the acknowledgement's write.

mod common;

use common::TempDir;
use runnel::broker::{Broker, Config, Now, Outbox, Outcome, Session};
use runnel::codec::{self, Batch, Frame, Request};
use runnel::log::LogOptions;

const NOW: Now = Now { mono_ms: 1, wall_ms: 1_700_000_000_000 };
const CONSUMER_CONN: usize = 1;
const PRODUCER_CONN: usize = 2;

/// Output buffers that remember the order in which connections were
/// first written to.
#[derive(Default)]
struct Recording {
    outs: [Vec<u8>; 3],
    order: Vec<usize>,
}

impl Outbox for Recording {
    fn out(&mut self, conn: usize) -> Option<&mut Vec<u8>> {
        if !self.order.contains(&conn) {
            self.order.push(conn);
        }
        self.outs.get_mut(conn)
    }
    fn unblock(&mut self, _conn: usize) {}
}

fn handle(broker: &mut Broker, conn: usize, session: &mut Session, rid: u32, request: Request<'_>) -> Outcome {
    let mut out = Vec::new();
    broker.handle(conn, session, &Frame { request_id: rid, request }, NOW, &mut out)
}

#[test]
fn a_turn_delivers_before_it_acknowledges() {
    let dir = TempDir::new("turn-order");
    let mut broker = Broker::open(Config::default(), dir.path(), LogOptions::default(), NOW).expect("open broker");
    let hello = || Request::Hello { min_version: codec::VERSION_MIN, max_version: codec::VERSION_MAX, token: b"" };
    let mut consumer = Session { consumer: 1, ..Session::default() };
    let mut producer = Session { consumer: 2, ..Session::default() };
    handle(&mut broker, CONSUMER_CONN, &mut consumer, 1, hello());
    handle(&mut broker, PRODUCER_CONN, &mut producer, 1, hello());
    handle(
        &mut broker,
        PRODUCER_CONN,
        &mut producer,
        2,
        Request::CreateTopic { topic: "t", settings: Default::default() },
    );
    broker.commit(NOW, &mut Recording::default());

    let fetch = Request::Fetch { topic: "t", max_messages: 1, max_bytes: 0, wait_ms: 1000, ack_timeout_ms: 0 };
    assert_eq!(
        handle(&mut broker, CONSUMER_CONN, &mut consumer, 2, fetch),
        Outcome::Parked,
        "setup: nothing to fetch yet"
    );
    let mut body = Vec::new();
    codec::encode_batch(&mut body, &[b"m".as_slice()]);
    let produce = Request::Produce { topic: "t", batch: Batch { count: 1, bytes: &body } };
    assert_eq!(handle(&mut broker, PRODUCER_CONN, &mut producer, 3, produce), Outcome::Held, "a durable produce waits");

    let mut turn = Recording::default();
    broker.commit(NOW, &mut turn);
    assert!(!turn.outs[CONSUMER_CONN].is_empty(), "the parked FETCH got the message");
    assert!(!turn.outs[PRODUCER_CONN].is_empty(), "the PRODUCE got its reply");
    assert_eq!(turn.order, [CONSUMER_CONN, PRODUCER_CONN], "the delivery is written first");
}
