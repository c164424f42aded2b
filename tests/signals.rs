//! Stopping `runnel serve` (the binary, in a child process) with signals:
//! SIGTERM answers parked FETCHes, syncs, marks the log clean and exits 0,
//! so a restart finds nothing torn; a second signal exits at once with
//! status 1.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::TempDir;
use runnel::client::{Client, Fetch};

fn runnel() -> Command {
    Command::new(env!("CARGO_BIN_EXE_runnel"))
}

/// A free port for a child broker (bind to 0, read it, let it go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn connect_retry(addr: &str) -> Client {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match Client::connect(addr) {
            Ok(c) => return c,
            Err(e) if Instant::now() < until => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("broker at {addr} never came up: {e}"),
        }
    }
}

#[test]
fn sigterm_answers_parked_fetches_syncs_and_exits_zero() {
    let dir = TempDir::new("sigterm");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = runnel()
        .args(["serve", "--listen", &addr, "--data", dir.path().to_str().unwrap(), "--pin-core", "0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut c = connect_retry(&addr);
    let ids: Vec<u64> = (0..50).map(|i| c.produce("t", format!("m{i}").as_bytes()).unwrap()).collect();
    // A long poll parked on another topic.
    let mut parked = connect_retry(&addr);
    let waiter = std::thread::spawn(move || parked.fetch("empty", Fetch { wait_ms: 60_000, ..Fetch::default() }));
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: kill(2) with the child's pid, which we own.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let answered = waiter.join().unwrap().expect("the parked FETCH is answered before the broker exits");
    assert!(answered.is_empty());
    let status = child.wait().unwrap();
    assert!(status.success(), "graceful shutdown exits 0, got {status}");
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("pinned the event loop to CPU 0"), "{err}");
    assert!(err.contains("stopped cleanly"), "{err}");

    // A restart finds nothing torn and every message.
    let mut child =
        runnel().args(["serve", "--listen", &addr, "--data", dir.path().to_str().unwrap()]).spawn().unwrap();
    let mut c = connect_retry(&addr);
    let got = c.fetch("t", Fetch { max_messages: 100, ..Fetch::default() }).unwrap();
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), ids);
    assert_eq!(c.stat("", "recovery_truncated_bytes").unwrap(), Some(0), "nothing torn");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_second_signal_exits_at_once() {
    let dir = TempDir::new("sig2");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = runnel()
        .args(["serve", "--listen", &addr, "--data", dir.path().to_str().unwrap()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut c = connect_retry(&addr);
    c.produce("t", b"x").unwrap();
    let pid = child.id() as i32;
    // Stopped, the broker cannot act on the first signal before the second
    // arrives: both are pending when it continues (two different signals,
    // as two of the same would merge into one), and the second exits at
    // once, with status 1 rather than a graceful 0.
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // Wait until it is really stopped (state T in /proc/PID/stat).
    let until = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap().split(") ").nth(1).unwrap().starts_with('T') {
        assert!(Instant::now() < until, "the broker never stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: as above.
    unsafe {
        assert_eq!(libc::kill(pid, libc::SIGINT), 0);
        assert_eq!(libc::kill(pid, libc::SIGTERM), 0);
        assert_eq!(libc::kill(pid, libc::SIGCONT), 0);
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "a second signal exits at once with status 1, got {status}");
}
