//! `runnel serve` as a child process, for tests that must end the broker as
//! a user would: SIGTERM (a graceful stop) or SIGKILL (a crash, which no
//! broker in a thread of the test can undergo). Its log goes to a file the
//! test names, at `info` unless `RUNNEL_CHILD_LOG` gives another `RUST_LOG`
//! (`RUNNEL_CHILD_LOG=info,runnel::compactor=debug` says what compaction
//! decides).

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use runnel::client::Client;

/// How long a broker may take to start answering.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client waits for a reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(20);

/// A `runnel serve` child; killed on drop if still running.
pub struct ChildBroker {
    child: Child,
    pub addr: SocketAddr,
    /// Where its stderr goes (a file, so a chatty broker never blocks).
    pub stderr: PathBuf,
}

/// How a child broker is ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// SIGTERM: a graceful stop, which must exit 0.
    Stop,
    /// SIGKILL: a crash of the process (not of the machine).
    Kill,
}

impl ChildBroker {
    /// Starts `runnel serve --data data` with `args`, its stderr in `stderr`,
    /// and waits until it answers a PING; retries with another port if the
    /// one chosen was taken meanwhile.
    pub fn start(data: &Path, args: &[String], stderr: &Path) -> ChildBroker {
        for _ in 0..20 {
            let port = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
            let child = Command::new(env!("CARGO_BIN_EXE_runnel"))
                .args(["serve", "--listen", &addr.to_string(), "--data"])
                .arg(data)
                .args(args)
                .env("RUST_LOG", std::env::var("RUNNEL_CHILD_LOG").unwrap_or_else(|_| "info".into()))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(File::create(stderr).expect("stderr file")))
                .spawn()
                .expect("spawn runnel serve");
            let mut b = ChildBroker { child, addr, stderr: stderr.to_path_buf() };
            let started = Instant::now();
            loop {
                if let Some(status) = b.child.try_wait().expect("try_wait") {
                    let err = b.log();
                    assert!(err.contains("cannot listen"), "runnel serve exited with {status}:\n{err}");
                    break;
                }
                if Client::connect(addr).is_ok_and(|mut c| c.ping().is_ok()) {
                    return b;
                }
                assert!(started.elapsed() < START_TIMEOUT, "runnel serve did not start:\n{}", b.log());
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        panic!("no free port for runnel serve after 20 tries");
    }

    /// A client of the newest protocol version.
    pub fn client(&self) -> Client {
        let mut c = Client::connect(self.addr).expect("connect");
        c.set_timeout(Some(REPLY_TIMEOUT)).expect("timeout");
        c
    }

    /// What it wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Ends it `how` and waits for it; a graceful stop must exit 0.
    pub fn end(mut self, how: End) {
        match how {
            End::Kill => self.child.kill().expect("SIGKILL"),
            End::Stop => {
                // SAFETY: kill(2) with the child's pid, which we own.
                assert_eq!(unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) }, 0, "SIGTERM");
            }
        }
        let status = self.child.wait().expect("wait for runnel serve");
        if how == End::Stop {
            assert!(status.success(), "a graceful stop exited with {status}:\n{}", self.log());
        }
    }
}

impl Drop for ChildBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
