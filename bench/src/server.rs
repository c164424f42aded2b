//! Starting and stopping the brokers under test: each on a private
//! loopback port and a temporary directory, optionally pinned to one core,
//! with its durability set so that like is compared with like.
//!
//! | durability  | runnel          | Redis                                                 | beanstalkd   |
//! |-------------|-----------------|-------------------------------------------------------|--------------|
//! | durable     | `--fsync turn`  | `--appendonly yes --appendfsync always --save ""`     | `-b DIR -f 0`|
//! | log, no sync| `--fsync never` | `--appendonly yes --appendfsync no --save ""`         | `-b DIR -F`  |
//! | memory only | `--memory-only` | `--appendonly no --save ""`                           | no `-b`      |
//!
//! In each durable row a produce is acknowledged only after an fsync that
//! covers it; in each "log, no sync" row it is written to a log that is
//! never synced, so it survives a crash of the process, not one of the
//! machine; in each "memory only" row it survives neither.
//!
//! Beside them runs the echo floor (`runnel-floor`, bench/src/floor/): a
//! server of runnel's protocol with no log and no queue semantics, run once
//! per configuration, which every broker's CPU and latency are divided by.

use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::sys;

/// Which broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Runnel,
    Redis,
    Beanstalkd,
    /// The echo floor, `runnel-floor`: runnel's protocol, no log.
    Floor,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Runnel, Kind::Redis, Kind::Beanstalkd, Kind::Floor];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Runnel => "runnel",
            Kind::Redis => "redis",
            Kind::Beanstalkd => "beanstalkd",
            Kind::Floor => "floor",
        }
    }

    /// Whether it speaks runnel's protocol (the bench drives it with
    /// runnel's own client).
    pub fn speaks_runnel(self) -> bool {
        matches!(self, Kind::Runnel | Kind::Floor)
    }

    /// Whether it is this project's code: every message it acknowledged
    /// must be delivered, or the bench fails (a peer's check is only
    /// reported).
    pub fn is_ours(self) -> bool {
        matches!(self, Kind::Runnel | Kind::Floor)
    }

    /// Whether it runs with `d`. The floor keeps nothing, so durability
    /// means nothing to it: it runs once per configuration, beside the
    /// memory-only rows, and is the floor of every row.
    pub fn runs_with(self, d: Durability) -> bool {
        self != Kind::Floor || d == Durability::Memory
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name().eq_ignore_ascii_case(s.trim()))
    }

    /// The program run for this broker (runnel's comes from `--runnel`).
    fn program(self) -> &'static str {
        match self {
            Kind::Runnel => "runnel",
            Kind::Redis => "redis-server",
            Kind::Beanstalkd => "beanstalkd",
            Kind::Floor => "runnel-floor",
        }
    }
}

/// What an acknowledged produce survives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Durability {
    /// Synced to disk before the acknowledgement: a crash of the machine.
    Durable,
    /// Written to a log that is never synced: a crash of the process, not
    /// of the machine.
    Unsynced,
    /// Kept in memory only: nothing.
    Memory,
}

impl Durability {
    pub const ALL: [Durability; 3] = [Durability::Durable, Durability::Unsynced, Durability::Memory];

    pub fn name(self) -> &'static str {
        match self {
            Durability::Durable => "durable",
            Durability::Unsynced => "log, no sync",
            Durability::Memory => "memory only",
        }
    }
}

/// What to start.
#[derive(Clone, Debug)]
pub struct Spec {
    pub kind: Kind,
    pub durability: Durability,
    /// The program to run.
    pub program: PathBuf,
    /// Cores the server may use: the `--server-core`, or every core the
    /// bench had at start (so a pinned bench does not pin its server too).
    pub cores: Vec<usize>,
    /// Extra arguments (runnel's raised depth limits for W5).
    pub extra_args: Vec<String>,
}

/// A running broker. Dropping it stops the server (SIGTERM, then SIGKILL),
/// reaps it and removes its directory, so every error path that drops it
/// (an early `?`, a panic unwinding) leaves nothing running; a bench that
/// is killed takes its servers with it (PR_SET_PDEATHSIG, see `spawn`).
pub struct Server {
    pub kind: Kind,
    pub durability: Durability,
    pub port: u16,
    pub pid: u32,
    /// The command line, for the report.
    pub command: String,
    /// The cores the kernel says it may run on (Cpus_allowed_list).
    pub cores: String,
    /// Temporary directory: data files and the server's own log.
    pub dir: PathBuf,
    /// How to start it again on the same data (`restart`).
    program: PathBuf,
    args: Vec<String>,
    cpu_set: libc::cpu_set_t,
    child: Option<Child>,
}

/// How long a server may take to accept its first connection.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a restarted server may take to recover its log and answer.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a server may take to exit after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

/// A new empty directory under the system's temporary directory.
pub fn temp_dir(what: &str) -> Result<PathBuf, String> {
    let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("runnel-bench-{}-{what}-{n}", std::process::id()));
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("cannot clear {}: {e}", dir.display()))?;
    }
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Removes the temporary directories of earlier benches that no longer
/// run (`runnel-bench-PID-*` whose PID is gone): a bench that was killed
/// could not remove its servers' data (R1's is 1 GiB). Returns how many.
pub fn remove_stale_dirs() -> usize {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else { return 0 };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("runnel-bench-")).and_then(|r| r.split('-').next())
        else {
            continue;
        };
        let gone =
            pid.parse::<u32>().is_ok_and(|p| p != std::process::id() && !Path::new(&format!("/proc/{p}")).exists());
        if gone && fs::remove_dir_all(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Finds `name` on PATH.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// The program for `kind`: `runnel` from `--runnel` (default: beside the
/// bench's executable), `runnel-floor` beside the bench's executable, the
/// peers from PATH. Err says what is missing.
pub fn locate(kind: Kind, runnel: Option<&Path>) -> Result<PathBuf, String> {
    match kind {
        Kind::Runnel => {
            let p = match runnel {
                Some(p) => p.to_path_buf(),
                None => std::env::current_exe()
                    .map_err(|e| format!("cannot find the bench's own executable: {e}"))?
                    .with_file_name("runnel"),
            };
            if p.is_file() {
                Ok(p)
            } else {
                Err(format!(
                    "runnel binary not found at {}; build it with `cargo build --release` or pass --runnel PATH",
                    p.display()
                ))
            }
        }
        Kind::Floor => {
            let p = std::env::current_exe()
                .map_err(|e| format!("cannot find the bench's own executable: {e}"))?
                .with_file_name(kind.program());
            if p.is_file() {
                Ok(p)
            } else {
                Err(format!("{} not found; build it with `cargo build --release --workspace`", p.display()))
            }
        }
        _ => find_on_path(kind.program()).ok_or_else(|| {
            format!("{} not found on PATH (install: apt-get install -y redis-server beanstalkd)", kind.program())
        }),
    }
}

/// A free loopback port (the listener is closed at once; a race with another
/// process taking it in between is possible but harmless: start fails).
fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot find a free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| format!("cannot find a free port: {e}"))
}

impl Server {
    pub fn start(spec: &Spec) -> Result<Server, String> {
        let dir = temp_dir(spec.kind.name())?;
        let data = dir.join("data");
        fs::create_dir_all(&data).map_err(|e| format!("cannot create {}: {e}", data.display()))?;
        let port = free_port()?;
        let args = server_args(spec, port, &data);
        let command =
            format!("{} {}", spec.program.display(), args.iter().map(|a| shell_word(a)).collect::<Vec<_>>().join(" "));
        let cpu_set = sys::checked_cpu_set(&spec.cores).map_err(|e| format!("--server-core: {e}"))?;
        let mut server = Server {
            kind: spec.kind,
            durability: spec.durability,
            port,
            pid: 0,
            command,
            cores: String::new(),
            dir,
            program: spec.program.clone(),
            args,
            cpu_set,
            child: None,
        };
        server.spawn()?;
        server.wait_ready(START_TIMEOUT)?;
        server.cores = sys::allowed_cores(server.pid);
        Ok(server)
    }

    /// Starts the process (its output appended to `server.log`).
    fn spawn(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "spawn over a running server");
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        if self.kind == Kind::Runnel {
            cmd.env("RUST_LOG", "warn");
        }
        let log_path = self.dir.join("server.log");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
        let log2 = log.try_clone().map_err(|e| format!("cannot clone a file handle: {e}"))?;
        cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
        // Its own process group, so stopping it reaches anything it started
        // (a wrapper given as --runnel, such as a profiler, included), and a
        // terminal's Ctrl-C reaches only the bench, whose death then kills
        // the server (PR_SET_PDEATHSIG).
        cmd.process_group(0);
        let set = self.cpu_set;
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the child between fork and exec and
        // only makes system calls (sched_setaffinity, prctl, getppid), which
        // are async-signal-safe; it allocates nothing (the set and the
        // parent's pid were made before the fork and are copied in).
        unsafe {
            cmd.pre_exec(move || {
                sys::set_affinity(&set)?;
                sys::die_with_parent(parent)
            });
        }
        let child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", self.command))?;
        self.pid = child.id();
        self.child = Some(child);
        Ok(())
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if self.answers() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("{} exited at start ({status}): {}", self.command, self.log_tail()));
            }
            if started.elapsed() > timeout {
                return Err(format!("{} did not answer within {timeout:?}: {}", self.command, self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether the server accepts a connection (runnel and the floor: and
    /// answer PING).
    fn answers(&self) -> bool {
        let Ok(stream) = TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)) else {
            return false;
        };
        if !self.kind.speaks_runnel() {
            return true;
        }
        drop(stream);
        runnel::client::Client::connect(self.addr())
            .and_then(|mut c| {
                c.set_timeout(Some(RECOVERY_TIMEOUT))?;
                c.ping()
            })
            .is_ok()
    }

    /// Stops the server gracefully (SIGTERM, waiting for it to exit) and
    /// starts it again on the same data directory and port. Returns how
    /// long the server took to exit, and how long from the new process's
    /// spawn until it answered (for runnel: a PING).
    pub fn restart(
        &mut self,
        before_start: impl FnOnce(&Path) -> Result<(), String>,
    ) -> Result<(Duration, Duration), String> {
        let t = Instant::now();
        match self.terminate() {
            // A wrapper given as --runnel (perf, strace) may die of the
            // SIGTERM itself once its child has exited.
            Some(status) if status.success() || status.signal() == Some(libc::SIGTERM) => {}
            Some(status) => return Err(format!("{} exited with {status} on SIGTERM", self.command)),
            None => return Err(format!("{} did not exit within {STOP_TIMEOUT:?} of SIGTERM", self.command)),
        }
        let stopped = t.elapsed();
        before_start(&self.dir.join("data"))?;
        let t = Instant::now();
        self.spawn()?;
        self.wait_ready(RECOVERY_TIMEOUT)?;
        Ok((stopped, t.elapsed()))
    }

    /// The end of the server's own log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(8).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// CPU seconds the server has used so far.
    pub fn cpu_seconds(&self) -> Result<f64, String> {
        sys::cpu_seconds(self.pid).map_err(|e| format!("reading the CPU time of {}: {e}", self.kind.name()))
    }

    /// Resident set size now and its peak, in bytes (VmRSS, VmHWM).
    pub fn rss(&self) -> Result<(u64, u64), String> {
        let e = |e: std::io::Error| format!("reading the memory of {}: {e}", self.kind.name());
        Ok((sys::vm_bytes(self.pid, "VmRSS").map_err(e)?, sys::vm_bytes(self.pid, "VmHWM").map_err(e)?))
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Stops the server (SIGTERM, then SIGKILL) and removes its directory.
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// SIGTERM to the server's process group; SIGKILL if it has not exited
    /// within STOP_TIMEOUT. Always reaps it. The exit status if it exited
    /// on SIGTERM; None if it had to be killed (or was not running).
    fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let group = -(child.id() as libc::pid_t);
        // SAFETY: signalling the process group our child leads; its pid
        // (the group id) stays ours until we reap it below.
        unsafe { libc::kill(group, libc::SIGTERM) };
        let started = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Err(_) => {
                    // SAFETY: as above.
                    unsafe { libc::kill(group, libc::SIGKILL) };
                    let _ = child.wait();
                    return None;
                }
                Ok(None) if started.elapsed() > STOP_TIMEOUT => {
                    // SAFETY: as above.
                    unsafe { libc::kill(group, libc::SIGKILL) };
                    let _ = child.wait();
                    return None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }

    fn shutdown(&mut self) {
        self.terminate();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn server_args(spec: &Spec, port: u16, data: &Path) -> Vec<String> {
    let data = data.display().to_string();
    let mut a: Vec<String> = match (spec.kind, spec.durability) {
        (Kind::Runnel, d) => {
            let mut a: Vec<String> = vec!["serve".into(), "--listen".into(), format!("127.0.0.1:{port}")];
            match d {
                Durability::Durable => a.extend(["--data".into(), data, "--fsync".into(), "turn".into()]),
                Durability::Unsynced => a.extend(["--data".into(), data, "--fsync".into(), "never".into()]),
                Durability::Memory => a.push("--memory-only".into()),
            }
            a
        }
        (Kind::Redis, d) => {
            let mut a: Vec<String> = [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--dir",
                &data,
                "--save",
                "",
                "--daemonize",
                "no",
                "--logfile",
                "",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            // No automatic AOF rewrite: its fork would land in a random
            // run. This favours Redis and is said in the README.
            let aof = |fsync: &str| {
                ["--appendonly", "yes", "--appendfsync", fsync, "--auto-aof-rewrite-percentage", "0"].map(String::from)
            };
            match d {
                Durability::Durable => a.extend(aof("always")),
                Durability::Unsynced => a.extend(aof("no")),
                Durability::Memory => a.extend(["--appendonly", "no"].map(String::from)),
            }
            a
        }
        (Kind::Beanstalkd, d) => {
            let mut a: Vec<String> = vec!["-l".into(), "127.0.0.1".into(), "-p".into(), port.to_string()];
            match d {
                Durability::Durable => a.extend(["-b".into(), data, "-f".into(), "0".into()]),
                Durability::Unsynced => a.extend(["-b".into(), data, "-F".into()]),
                Durability::Memory => {}
            }
            a
        }
        (Kind::Floor, _) => vec!["--listen".into(), format!("127.0.0.1:{port}")],
    };
    a.extend(spec.extra_args.iter().cloned());
    a
}

/// Quotes a word for a shell command line in the report.
fn shell_word(s: &str) -> String {
    if s.is_empty() {
        "\"\"".into()
    } else if s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=".contains(&b)) {
        s.into()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}
