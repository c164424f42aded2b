//! The few Linux calls the bench needs that std does not offer: CPU
//! affinity, a nanosecond-timeout wait on one socket, epoll over many,
//! timer slack, and reading a process's CPU time and memory from /proc.
//!
//! Everything unsafe in the bench is here, each block with the reason it is
//! sound; the rest of the bench calls plain functions.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::RawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// A CPU set of the given cores.
pub fn cpu_set(cores: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cores {
        // SAFETY: CPU_SET only writes inside `set` for c < CPU_SETSIZE, which
        // `checked_cpu_set` checks and the other callers pass.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    set
}

/// The cores the calling thread may run on.
pub fn current_affinity() -> io::Result<Vec<usize>> {
    // SAFETY: as above, all zeroes is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the size passed is the size of `set`, which the kernel fills.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CPU_ISSET reads inside `set` for every index below CPU_SETSIZE.
    Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

/// Cores the machine has online (not only those this thread may use).
pub fn online_cores() -> usize {
    // SAFETY: sysconf reads a constant.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 { n as usize } else { 1 }
}

/// A CPU set of `cores`, after checking each is a core this machine has.
pub fn checked_cpu_set(cores: &[usize]) -> io::Result<libc::cpu_set_t> {
    let online = online_cores();
    if cores.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no core given"));
    }
    if let Some(&c) = cores.iter().find(|&&c| c >= online.max(1) || c >= libc::CPU_SETSIZE as usize) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("core {c} does not exist (this machine has cores 0..{})", online - 1),
        ));
    }
    Ok(cpu_set(cores))
}

/// Restricts the calling thread (and the threads and processes it starts
/// later) to the cores in `set`. Makes one system call and allocates
/// nothing, so it may run between fork and exec.
pub fn set_affinity(set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: `set` lives across the call and its size is passed with it.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Restricts the calling thread (and the threads it starts later) to
/// `cores`.
pub fn pin_current_thread(cores: &[usize]) -> io::Result<()> {
    set_affinity(&checked_cpu_set(cores)?)
}

/// Asks the kernel to SIGKILL the calling process when the thread that
/// started it exits (the bench killed, interrupted or crashed), so no
/// server outlives the bench. SIGKILL, not SIGTERM: a server busy in a
/// graceful stop, or one that handles SIGTERM, must not be left behind.
/// If the parent (`parent`, read before the fork) is already gone, the
/// signal would never come: fail, so the child never execs. Two system
/// calls, so it may run between fork and exec.
pub fn die_with_parent(parent: libc::pid_t) -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and touches no memory.
    let r = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getppid has no arguments and cannot fail.
    if unsafe { libc::getppid() } != parent {
        return Err(io::Error::other("the bench exited before its server started"));
    }
    Ok(())
}

/// Drops the page cache of the file at `path` (POSIX_FADV_DONTNEED), so
/// the next read comes from the disk. Only clean pages are dropped: sync
/// the file first.
pub fn drop_page_cache(path: &std::path::Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path)?;
    // SAFETY: the descriptor is open for the duration of the call.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// Lets sleeps of the calling thread end within `ns` of their deadline
/// (the default slack is 50 µs, too coarse for a 10 µs send schedule).
pub fn set_timer_slack_ns(ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches no
    // memory of ours. A failure only leaves the default slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
}

/// Waits until `fd` is readable or `timeout` passes; true if readable.
pub fn wait_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as _ };
    // SAFETY: one pollfd and one timespec, both live across the call.
    let r = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
    match r {
        -1 => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(e) }
        }
        0 => Ok(false),
        _ => Ok(true),
    }
}

/// Which of `fds` are readable (or closed, or in error) right now, without
/// waiting: one `poll` with a zero timeout, no allocation. A busy-polling
/// loop calls this once per turn instead of one read attempt per socket.
pub fn readable_now<const N: usize>(fds: [RawFd; N]) -> io::Result<[bool; N]> {
    let mut pfds = fds.map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
    // SAFETY: `pfds` holds N entries and lives across the call.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), N as libc::nfds_t, 0) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok([false; N]) } else { Err(e) };
    }
    Ok(pfds.map(|p| p.revents != 0))
}

/// CPU seconds (user + system) the calling thread has used so far.
pub fn thread_cpu_seconds() -> io::Result<f64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` lives across the call, which only writes it.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9)
}

/// Times the calling thread was preempted so far (involuntary context
/// switches, `getrusage(RUSAGE_THREAD)`): a thread that never sleeps is
/// switched out only when other work wants its core.
pub fn thread_preemptions() -> io::Result<u64> {
    // SAFETY: all zeroes is a valid rusage, which the call only writes.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` lives across the call.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ru.ru_nivcsw as u64)
}

/// A level-triggered epoll set: one token per socket.
pub struct Epoll {
    fd: RawFd,
    events: Vec<libc::epoll_event>,
}

impl Epoll {
    pub fn new(capacity: usize) -> io::Result<Epoll> {
        // SAFETY: no pointers are passed.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Epoll { fd, events: vec![libc::epoll_event { events: 0, u64: 0 }; capacity.max(1)] })
    }

    /// Watches `fd` for input, reporting `token`.
    pub fn add(&mut self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: token };
        // SAFETY: `ev` lives across the call.
        let r = unsafe { libc::epoll_ctl(self.fd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits up to `timeout_ms` and returns the tokens of readable sockets.
    pub fn wait(&mut self, timeout_ms: i32, tokens: &mut Vec<u64>) -> io::Result<()> {
        tokens.clear();
        // SAFETY: the buffer holds `events.len()` entries and outlives the call.
        let n = unsafe { libc::epoll_wait(self.fd, self.events.as_mut_ptr(), self.events.len() as i32, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(()) } else { Err(e) };
        }
        tokens.extend(self.events[..n as usize].iter().map(|e| e.u64));
        Ok(())
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: we own the descriptor and close it once.
        unsafe { libc::close(self.fd) };
    }
}

/// Clock ticks per second, the unit of /proc/PID/stat's CPU times.
pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf reads a constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// CPU seconds (user + system, every thread) a process has used so far,
/// from fields 14 and 15 of /proc/PID/stat.
pub fn cpu_seconds(pid: u32) -> io::Result<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces; fields resume after ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> io::Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("/proc/{pid}/stat: no field {}", i + 3)))
    };
    // After ')' the first field is field 3 (state): utime is 14, stime 15.
    let ticks = field(14 - 3)? + field(15 - 3)?;
    Ok(ticks as f64 / clock_ticks_per_sec() as f64)
}

/// CPU seconds every core of the machine has spent running processes, or
/// stolen by the hypervisor, so far (user, nice, system and steal of
/// /proc/stat's `cpu` line; not irq and softirq, where a kernel that
/// accounts them apart puts the loopback traffic of the bench itself): with
/// the bench's and the server's own CPU taken away, what else ran.
pub fn machine_busy_seconds() -> io::Result<f64> {
    let stat = fs::read_to_string("/proc/stat")?;
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "/proc/stat has no cpu line"))?;
    let f: Vec<u64> = line.split_whitespace().skip(1).map(|v| v.parse().unwrap_or(0)).collect();
    // user nice system idle iowait irq softirq steal ...
    let busy: u64 = [0, 1, 2, 7].iter().filter_map(|&i| f.get(i)).sum();
    Ok(busy as f64 / clock_ticks_per_sec() as f64)
}

/// A `Vm*` line of /proc/PID/status (VmRSS, VmHWM), in bytes.
pub fn vm_bytes(pid: u32, key: &str) -> io::Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    for line in status.lines() {
        if let Some(v) = line.strip_prefix(key).and_then(|r| r.strip_prefix(':')) {
            let kib: u64 = v.trim().trim_end_matches("kB").trim().parse().map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidData, format!("/proc/{pid}/status: bad {key} line {line:?}"))
            })?;
            return Ok(kib * 1024);
        }
    }
    Err(io::Error::new(io::ErrorKind::NotFound, format!("/proc/{pid}/status has no {key}")))
}

/// The `Cpus_allowed_list` of a process: which cores it may run on.
pub fn allowed_cores(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:").map(|v| v.trim().to_string())))
        .unwrap_or_else(|| "?".into())
}

/// Times `count` appends of 4 KiB, each followed by `fdatasync`, to a new
/// file in `dir` (stopping early after `time_max`). Returns each sync's
/// latency in nanoseconds (write included, as a broker's commit does both).
pub fn fdatasync_probe(dir: &Path, count: usize, time_max: Duration) -> io::Result<Vec<u64>> {
    let path = dir.join("fdatasync-probe");
    let file: File = OpenOptions::new().create(true).truncate(true).write(true).open(&path)?;
    let block = [0x5au8; 4096];
    let mut samples = Vec::with_capacity(count);
    let started = Instant::now();
    for i in 0..count {
        let t = Instant::now();
        file.write_all_at(&block, (i * block.len()) as u64)?;
        file.sync_data()?;
        samples.push(t.elapsed().as_nanos() as u64);
        if started.elapsed() > time_max {
            break;
        }
    }
    drop(file);
    fs::remove_file(&path)?;
    Ok(samples)
}

/// Writes every dirty page of the machine to disk (sync(2)), so one run's
/// leftover writeback does not slow the next run's fsyncs.
pub fn sync_all() {
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// The 1-minute load average: how busy the machine was besides the bench.
pub fn loadavg_1m() -> Option<f64> {
    fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// Prints to stderr without failing the bench if stderr is gone.
pub fn progress(line: &str) {
    let mut e = io::stderr().lock();
    let _ = writeln!(e, "{line}");
}
