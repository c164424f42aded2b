//! The file-operation recorder: builds the `LD_PRELOAD` shim
//! (`tests/shim/fileops.rs`) with the toolchain's own `rustc`, and runs a
//! `runnel serve` child under it on a data directory inside a watched root,
//! so that the simulator (`power_loss.rs`) can replay what it did.
//!
//! The shim is built once per source: into the target directory, named by
//! a hash of its source, by `rustc` directly (a nested `cargo` could wait on
//! the build lock the running `cargo test` holds). `rustc` is taken from
//! `RUSTC`, else beside `CARGO`, else the `PATH`: wherever `cargo test`
//! runs, one is there.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use runnel::testkit::TempDir;

use super::power_loss::{Disk, Trace};

/// How long a broker may take to say it listens.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// `CLOCK_MONOTONIC` in nanoseconds: the clock the shim stamps its lines
/// with, so that what a client saw can be placed among them.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec on this stack frame.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The `rustc` to build the shim with.
fn rustc() -> PathBuf {
    if let Some(r) = std::env::var_os("RUSTC") {
        return r.into();
    }
    if let Some(cargo) = std::env::var_os("CARGO") {
        let beside = Path::new(&cargo).with_file_name("rustc");
        if beside.is_file() {
            return beside;
        }
    }
    "rustc".into()
}

/// FNV-1a: names the built shim by its source.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The shim's shared object, built if this source has not been yet.
pub fn shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shim/fileops.rs");
        let text = std::fs::read(&src).expect("read the shim's source");
        let dir = Path::new(env!("CARGO_BIN_EXE_runnel")).parent().expect("target dir").join("fileops-shim");
        let out = dir.join(format!("libfileops-{:016x}.so", fnv(&text)));
        if out.is_file() {
            return out;
        }
        std::fs::create_dir_all(&dir).expect("create the shim's directory");
        // Built under a name of its own, then renamed: another test binary
        // may be building it at the same time.
        let tmp = dir.join(format!("building-{}.so", std::process::id()));
        let built = Command::new(rustc())
            .args(["--edition", "2021", "--crate-type", "cdylib", "-O", "-C", "panic=abort", "--crate-name", "fileops"])
            .arg(&src)
            .arg("-o")
            .arg(&tmp)
            .output()
            .expect("run rustc to build the shim");
        assert!(built.status.success(), "rustc could not build the shim:\n{}", String::from_utf8_lossy(&built.stderr));
        std::fs::rename(&tmp, &out).expect("move the built shim into place");
        out
    })
}

/// A `runnel serve` child running under the recorder.
pub struct Traced {
    child: Child,
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    /// The watched root: the data directory is inside it (taken by `stop`).
    root: Option<TempDir>,
    /// The data directory (`--data`).
    pub data: PathBuf,
    /// Where the trace, its data file and the broker's stderr go.
    out: TempDir,
    /// What the root held before the start.
    initial: Disk,
}

/// What a traced run left: the trace, and the directory it ran on.
pub struct Recorded {
    pub trace: Trace,
    pub root: TempDir,
    /// The data directory, inside `root`.
    pub data: PathBuf,
    /// The broker's stderr.
    pub stderr: String,
}

impl Traced {
    /// Starts `runnel serve --data <root>/<data_rel>` with `args` under the
    /// recorder (`data_rel` may name directories that do not exist yet),
    /// and waits until it says where it listens.
    pub fn spawn(data_rel: &str, args: &[&str]) -> Traced {
        Traced::spawn_over(&Disk::default(), data_rel, args, &[])
    }

    /// `spawn`, on a root that holds `initial` (laid out before the start,
    /// and taken as durable: `Trace::over`), with `env` set for the broker
    /// (`RUNNEL_FILEOPS_FREE_BYTES`, say: the shim's header).
    pub fn spawn_over(initial: &Disk, data_rel: &str, args: &[&str], env: &[(&str, &str)]) -> Traced {
        let root = TempDir::new("fileops-root");
        initial.write_to(root.path());
        let out = TempDir::new("fileops-out");
        let data = root.path().join(data_rel);
        let stderr = std::fs::File::create(out.path().join("stderr")).expect("stderr file");
        let child = Command::new(env!("CARGO_BIN_EXE_runnel"))
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--data"])
            .arg(&data)
            .args(args)
            .env("LD_PRELOAD", shim())
            .env("RUNNEL_FILEOPS_ROOT", root.path())
            .env("RUNNEL_FILEOPS_TRACE", out.path().join("trace"))
            .env("RUNNEL_FILEOPS_DATA", out.path().join("data"))
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn runnel serve under the recorder");
        let addr = "0.0.0.0:0".parse().expect("addr");
        let mut t = Traced { child, addr, root: Some(root), data, out, initial: initial.clone() };
        t.addr = t.wait_listening();
        t
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.out.path().join("stderr")).unwrap_or_default()
    }

    /// The address its start line names.
    fn wait_listening(&mut self) -> std::net::SocketAddr {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let err = self.stderr();
            if let Some(at) = err.find("runnel serving on ") {
                let rest = &err[at + "runnel serving on ".len()..];
                let addr = rest.split_whitespace().next().expect("an address after 'serving on'");
                return addr.parse().unwrap_or_else(|e| panic!("bad address {addr:?}: {e}"));
            }
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!("the traced broker exited with {status} while starting:\n{err}");
            }
            assert!(Instant::now() < deadline, "the traced broker did not start within {START_TIMEOUT:?}:\n{err}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the broker with SIGTERM (a graceful stop: it must exit 0), or
    /// SIGKILL, and reads what it did.
    pub fn stop(mut self, graceful: bool) -> Recorded {
        let sig = if graceful { libc::SIGTERM } else { libc::SIGKILL };
        // SAFETY: kill(2) on the child's pid, which this handle owns and
        // has not reaped.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0, "signal the traced broker");
        let status = self.child.wait().expect("wait for the traced broker");
        let stderr = self.stderr();
        if graceful {
            assert!(status.success(), "the traced broker's graceful stop exited {status}:\n{stderr}");
        }
        let root = self.root.take().expect("stopped once");
        let trace = Trace::load(root.path(), &self.out.path().join("trace"), &self.out.path().join("data"))
            .over(std::mem::take(&mut self.initial));
        Recorded { trace, root, data: self.data.clone(), stderr }
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
