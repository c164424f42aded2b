//! Shared test support: a broker on port 0 in a thread of the test process,
//! on its own temporary data directory.
#![allow(dead_code)]

pub mod clocked;
pub mod dedup_frames;
pub mod frames;
pub mod inspect_frames;
pub mod logdir;
pub mod power_loss;
pub mod push_frames;
pub mod recorder;
pub mod retry_frames;
pub mod wire;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use runnel::broker::Config;
use runnel::client::{Client, IdsResult};
use runnel::config::ServeConfig;
use runnel::limits::Limits;
use runnel::log::LogOptions;
use runnel::reactor::{Handle, Reactor};

pub use runnel::testkit::TempDir;

/// A broker running in a thread; shut down and joined on drop.
pub struct Server {
    pub addr: SocketAddr,
    /// The metrics listener, when the config asked for one.
    pub metrics: Option<SocketAddr>,
    handle: Handle,
    thread: Option<JoinHandle<()>>,
    pub dir: PathBuf,
}

impl Server {
    pub fn start(config: Config) -> (Server, TempDir) {
        let dir = TempDir::new("srv");
        let s = Server::start_in(config, LogOptions::default(), dir.path());
        (s, dir)
    }

    pub fn start_in(config: Config, log: LogOptions, dir: &Path) -> Server {
        Server::try_start_in(config, log, dir).expect("bind broker")
    }

    /// `start_in`, or why the broker did not start (a refused recovery).
    pub fn try_start_in(config: Config, log: LogOptions, dir: &Path) -> Result<Server, String> {
        let mut cfg = ServeConfig::new("127.0.0.1:0".parse().expect("addr"), dir.to_path_buf());
        cfg.broker = config;
        cfg.log = log;
        Server::try_start_with(cfg)
    }

    /// Starts a broker with a whole `ServeConfig` (listen is used as given).
    pub fn start_with(cfg: ServeConfig) -> Server {
        Server::try_start_with(cfg).expect("bind broker")
    }

    /// `start_with`, or why the broker did not start.
    pub fn try_start_with(cfg: ServeConfig) -> Result<Server, String> {
        let dir = cfg.data_dir.clone();
        let mut reactor = try_bind(cfg)?;
        let addr = reactor.local_addr();
        let metrics = reactor.metrics_addr();
        let handle = reactor.handle();
        let thread = std::thread::spawn(move || reactor.run().expect("reactor run"));
        Ok(Server { addr, metrics, handle, thread: Some(thread), dir })
    }

    /// A client speaking protocol version 1 (what most tests check: its
    /// bytes never change).
    pub fn client(&self) -> Client {
        let mut c = Client::connect_upto(self.addr, b"", 1).expect("connect");
        c.set_timeout(Some(Duration::from_secs(20))).expect("timeout");
        c
    }

    /// A client speaking the newest version both sides know (version 2).
    pub fn client_v2(&self) -> Client {
        let mut c = Client::connect(self.addr).expect("connect");
        c.set_timeout(Some(Duration::from_secs(20))).expect("timeout");
        c
    }

    /// Stops the broker gracefully and waits for its thread.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            t.join().expect("reactor thread panicked");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Small limits that pass `Limits::check`: a frame holds one message of
/// message_bytes_max to a topic of topic_name_bytes_max, with room to spare.
pub fn small_limits() -> Limits {
    let l = Limits {
        frame_bytes_max: 2048,
        message_bytes_max: 1024,
        batch_messages_max: 8,
        topic_name_bytes_max: 16,
        fetch_bytes_max: 1024,
        ..Limits::default()
    };
    l.check().expect("small limits are consistent");
    l
}

/// A broker with `limits` (checked first) and every other setting at its
/// default, on its own temporary directory.
pub fn start(limits: Limits) -> (Server, TempDir) {
    limits.check().expect("limits are consistent");
    Server::start(Config { limits, ..Config::default() })
}

/// A fresh client can PING and round-trip a message: the broker is alive.
pub fn assert_serving(srv: &Server, what: &str) {
    let mut c = srv.client();
    c.ping().unwrap_or_else(|e| panic!("{what}: PING failed: {e}"));
    let id = c.produce("probe", what.as_bytes()).unwrap_or_else(|e| panic!("{what}: PRODUCE failed: {e}"));
    let got = c.fetch("probe", wire::now(1)).unwrap_or_else(|e| panic!("{what}: FETCH failed: {e}"));
    assert_eq!(got.len(), 1, "{what}");
    assert_eq!((got[0].id, got[0].payload.as_slice()), (id, what.as_bytes()), "{what}");
    assert_eq!(c.ack("probe", &[id]).unwrap(), IdsResult { done: 1, failed: vec![] }, "{what}");
}

/// Seeded randomness, shared with the unit tests and the fuzz simulation.
#[allow(unused_imports)] // not every test file draws numbers
pub use runnel::testkit::{Rng, seed};

/// Binds a broker, again while its directory is found locked: a sibling
/// test that spawns `runnel` forks a child holding copies of this process's
/// files until its `exec` closes them, a lock that a test just released
/// among them. That window is the test harness's, not the broker's: a lock
/// another process holds for longer still fails the test.
fn try_bind(cfg: ServeConfig) -> Result<Reactor, String> {
    for _ in 0..50 {
        match Reactor::bind(cfg.clone()) {
            Err(e) if e.contains("is locked by another runnel process") => {
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
    Reactor::bind(cfg)
}

/// One output buffer per connection, for tests that drive a `Broker`
/// directly on a test clock.
#[derive(Default)]
pub struct Outs(pub Vec<Vec<u8>>);

impl runnel::broker::Outbox for Outs {
    fn out(&mut self, runnel::broker::ConnKey(conn): runnel::broker::ConnKey) -> Option<&mut Vec<u8>> {
        if self.0.len() <= conn {
            self.0.resize(conn + 1, Vec::new());
        }
        self.0.get_mut(conn)
    }
    fn unblock(&mut self, _conn: runnel::broker::ConnKey) {}
}
