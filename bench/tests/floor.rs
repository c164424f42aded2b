//! The echo floor (`runnel-floor`) over real TCP, driven by runnel's own
//! client as the bench drives it: what is produced comes back in order, a
//! long-polling FETCH is answered by a produce on another connection or
//! when its wait passes, pipelined requests are answered in order, and a
//! large batch crosses the floor's blocks intact. The floor is started on
//! port 0 and killed at the end (timeouts are safety nets only).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::Duration;

use runnel::client::{Client, Fetch, OwnedReply};

/// A running floor, killed when dropped.
struct Floor {
    child: Child,
    addr: SocketAddr,
    /// Kept open, so the floor can still write to it.
    _stderr: BufReader<ChildStderr>,
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> Floor {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_runnel-floor"));
    let mut child = Command::new(&exe)
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()));
    // It says where it listens on its first line.
    let mut line = String::new();
    let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
    stderr.read_line(&mut line).expect("read the floor's first line");
    let addr = line
        .split_whitespace()
        .find_map(|w| w.parse::<SocketAddr>().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    Floor { child, addr, _stderr: stderr }
}

fn connect(addr: SocketAddr) -> Client {
    let mut c = Client::connect(addr).expect("connect and HELLO");
    c.set_timeout(Some(Duration::from_secs(30))).expect("set a timeout");
    c
}

#[test]
fn produced_messages_come_back_in_order_and_acks_are_answered() {
    let floor = start();
    let mut p = connect(floor.addr);
    p.ping().expect("PING");
    assert_eq!(p.produce_batch("t", &[b"a".as_slice(), b"bb"]).expect("produce"), (1, 2));
    assert_eq!(p.produce("t", b"ccc").expect("produce"), 3);
    let mut c = connect(floor.addr);
    let got = c.fetch("t", Fetch { max_messages: 10, ..Fetch::default() }).expect("fetch");
    let got: Vec<(u64, Vec<u8>)> = got.into_iter().map(|m| (m.id, m.payload)).collect();
    assert_eq!(got, vec![(1, b"a".to_vec()), (2, b"bb".to_vec()), (3, b"ccc".to_vec())]);
    let acked = c.ack("t", &[1, 2, 3]).expect("ack");
    assert_eq!((acked.done, acked.failed.len()), (3, 0));
    assert!(c.fetch("t", Fetch { max_messages: 10, ..Fetch::default() }).expect("fetch").is_empty());
}

#[test]
fn a_long_poll_is_answered_by_a_produce_or_when_its_wait_passes() {
    let floor = start();
    let mut c = connect(floor.addr);
    // Nothing comes: answered empty once the wait passes.
    assert!(c.fetch("t", Fetch { max_messages: 10, wait_ms: 20, ..Fetch::default() }).expect("fetch").is_empty());
    // A produce on another connection answers the parked FETCH.
    let req = runnel::codec::Request::Fetch {
        topic: "t",
        group: "",
        max_messages: 10,
        max_bytes: 0,
        wait_ms: 60_000,
        ack_timeout_ms: 0,
    };
    c.send(&req);
    c.send(&runnel::codec::Request::Ping);
    c.flush().expect("write the FETCH and a PING behind it");
    let mut p = connect(floor.addr);
    p.produce("t", b"late").expect("produce");
    match c.recv().expect("the parked FETCH's reply") {
        OwnedReply::Messages { messages, .. } => {
            assert_eq!(messages.iter().map(|m| m.payload.as_slice()).collect::<Vec<_>>(), vec![b"late"]);
        }
        other => panic!("not messages: {other:?}"),
    }
    assert_eq!(c.recv().expect("the PING behind it"), OwnedReply::Pong);
}

#[test]
fn pipelined_produces_and_a_large_batch_arrive_whole() {
    let floor = start();
    let mut p = connect(floor.addr);
    // 256 pipelined produces of 16 KiB: frames straddle the reads.
    let payloads: Vec<Vec<u8>> = (0..256u32).map(|i| vec![(i % 251) as u8; 16 << 10]).collect();
    for m in &payloads {
        p.send_produce("t", &[m]);
    }
    for i in 0..256u64 {
        match p.recv().expect("produce reply") {
            OwnedReply::Produced { first_id, count: 1 } => assert_eq!(first_id, i + 1),
            other => panic!("not a produce reply: {other:?}"),
        }
    }
    // A batch larger than one of the floor's blocks.
    let big: Vec<Vec<u8>> = (0..3u32).map(|i| vec![i as u8; 1 << 20]).collect();
    assert_eq!(p.produce_batch("t", &big).expect("a large batch"), (257, 3));
    let mut got = Vec::new();
    while got.len() < 259 {
        let f = Fetch { max_messages: 100, max_bytes: 1 << 20, ..Fetch::default() };
        let batch = p.fetch("t", f).expect("fetch");
        assert!(!batch.is_empty(), "ran out after {} messages", got.len());
        got.extend(batch.into_iter().map(|m| m.payload));
    }
    let want: Vec<Vec<u8>> = payloads.into_iter().chain(big).collect();
    assert!(got == want, "the payloads came back changed or out of order");
}
