//! Compaction keeps the log bounded under a steady produce/ack load, and a
//! restart after it finds exactly the same queue contents.

mod common;

use common::{Server, TempDir};
use runnel::broker::Config;
use runnel::client::{Client, Fetch};
use runnel::codec::TopicSettings;
use runnel::log::LogOptions;

const SEGMENT_BYTES: u64 = 16 << 10;

fn small_segments() -> LogOptions {
    LogOptions { segment_bytes_max: SEGMENT_BYTES, ..LogOptions::default() }
}

fn stat(c: &mut Client, key: &str) -> u64 {
    c.stat("", key).expect("stats").unwrap_or_else(|| panic!("no broker stat {key}"))
}

/// Everything ready in `topic`, fetched (and left unacked), in order.
fn drain(c: &mut Client, topic: &str) -> Vec<(u64, u16, Vec<u8>)> {
    let f = Fetch { max_messages: 100_000, wait_ms: 0, ack_timeout_ms: 600_000, ..Fetch::default() };
    c.fetch(topic, f).expect("fetch").into_iter().map(|m| (m.id, m.delivery_count, m.payload)).collect()
}

#[test]
fn steady_produce_ack_keeps_the_log_bounded_and_restart_sees_the_same_queue() {
    let dir = TempDir::new("compaction");
    let srv = Server::start_in(Config::default(), small_segments(), dir.path());
    let mut c = srv.client();
    c.create_topic("slow", TopicSettings { ack_timeout_ms: 600_000, max_deliveries: 100 }).unwrap();

    // Long-unacked messages, spread over the early segments.
    let mut slow = Vec::new();
    for i in 0..40u32 {
        let payload = format!("slow-{i}-{}", "s".repeat(300)).into_bytes();
        let id = c.produce("slow", &payload).unwrap();
        slow.push((id, payload));
        // Quickly acked traffic between them.
        for _ in 0..5 {
            let batch: Vec<Vec<u8>> = (0..10).map(|j| format!("fast-{j}-{}", "f".repeat(200)).into_bytes()).collect();
            c.produce_batch("fast", &batch).unwrap();
            let got = c.fetch("fast", Fetch { max_messages: 100, ..Fetch::default() }).unwrap();
            let ids: Vec<u64> = got.iter().map(|m| m.id).collect();
            assert_eq!(c.ack("fast", &ids).unwrap().done as usize, ids.len());
        }
    }
    // One slow message was delivered and NACKed: its delivery count (1) is
    // state that compaction must carry forward.
    let first = c.fetch("slow", Fetch { max_messages: 1, ..Fetch::default() }).unwrap();
    assert_eq!(first[0].id, slow[0].0);
    assert_eq!(c.nack("slow", &[first[0].id], 0, false).unwrap().done, 1);

    // Keep the steady load going: about 40 times the live data written and
    // acked. Compaction (in slices inside the broker's turns) must keep the
    // log near its policy bound — twice the live data plus two segments —
    // plus the segment being cleaned and the one being filled, whatever the
    // volume written.
    let live_bytes: u64 = slow.iter().map(|(_, p)| p.len() as u64 + 23).sum();
    let bound = 2 * live_bytes + 6 * SEGMENT_BYTES;
    let mut max_log_bytes = 0;
    for round in 0..600 {
        let batch: Vec<Vec<u8>> = (0..10).map(|_| vec![b'x'; 200]).collect();
        c.produce_batch("fast", &batch).unwrap();
        let ids: Vec<u64> =
            c.fetch("fast", Fetch { max_messages: 100, ..Fetch::default() }).unwrap().iter().map(|m| m.id).collect();
        c.ack("fast", &ids).unwrap();
        if round >= 100 {
            max_log_bytes = max_log_bytes.max(stat(&mut c, "log_bytes"));
        }
    }
    let compactions = stat(&mut c, "compactions");
    assert!(compactions >= 20, "only {compactions} segments compacted");
    assert!(max_log_bytes <= bound, "log reached {max_log_bytes} bytes; bound {bound} (live {live_bytes})");
    drop(c);
    srv.stop();

    // Restart: exactly the slow messages, in produce order, the NACKed one
    // with its delivery count carried; nothing of the acked traffic.
    let srv = Server::start_in(Config::default(), small_segments(), dir.path());
    let mut c = srv.client();
    let got = drain(&mut c, "slow");
    let want: Vec<(u64, Vec<u8>)> = slow.clone();
    assert_eq!(got.iter().map(|m| (m.0, m.2.clone())).collect::<Vec<_>>(), want, "slow topic after restart");
    assert_eq!(got[0].1, 2, "the NACKed message keeps its delivery count");
    assert!(got[1..].iter().all(|m| m.1 == 1));
    assert!(drain(&mut c, "fast").is_empty(), "acked messages came back");
    let next = c.produce("fast", b"after").unwrap();
    assert!(next > 0);
}

/// A closed segment none of whose messages is live is removed at once,
/// however small the log is next to its segments: nothing is copied, only
/// its topic records are restated. (The size rule alone would keep two
/// segments here: the log is never more than twice the live data plus two
/// segments.)
#[test]
fn a_segment_of_freed_messages_is_removed_whatever_the_log_size() {
    let dir = TempDir::new("compaction-dead");
    let segments = LogOptions { segment_bytes_max: 1 << 20, ..LogOptions::default() };
    let srv = Server::start_in(Config::default(), segments.clone(), dir.path());
    let mut c = srv.client();
    let batch: Vec<Vec<u8>> = (0..64).map(|_| vec![b'd'; 1000]).collect();
    while stat(&mut c, "log_segments") < 3 {
        c.produce_batch("t", &batch).unwrap();
    }
    c.produce("kept", b"kept").unwrap();
    assert_eq!(c.purge_topic("t").unwrap() % 64, 0);
    // Each STATS is a loop turn; compaction removes a segment per turn.
    let started = std::time::Instant::now();
    while stat(&mut c, "log_segments") > 1 {
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "closed segments of purged messages stay");
    }
    assert!(stat(&mut c, "compactions") >= 2);
    drop(c);
    srv.stop();

    let srv = Server::start_in(Config::default(), segments, dir.path());
    let mut c = srv.client();
    assert!(drain(&mut c, "t").is_empty(), "purged messages came back");
    assert_eq!(drain(&mut c, "kept").into_iter().map(|m| m.2).collect::<Vec<_>>(), vec![b"kept".to_vec()]);
}
