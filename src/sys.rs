//! Every call into the operating system that Rust's standard library and
//! mio do not wrap, each behind a safe function: a listener with a chosen
//! backlog, pinning the loop to a CPU, raising the open-file limit,
//! reserving space in a file, asking how much space its filesystem has
//! free, mapping a file's reserved space to write it without a system
//! call, and asking the kernel to read a file ahead.
//!
//! The only `unsafe` code in the crate lives here (lib.rs denies it
//! elsewhere), one block per function, each with a SAFETY note that says why
//! the call cannot break memory safety. Callers get `io::Result`s and decide
//! what a failure means; nothing here logs or panics.
//!
//! `runnel consume` asks three things of a pipe or socket it writes to:
//! how much of what it wrote its reader has not taken yet, whether the
//! reader is gone, and to be woken when it goes while it waits for the
//! broker.

use std::fs::File;
use std::io;
use std::mem;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Binds a non-blocking, close-on-exec TCP listener on `addr` (with
/// `SO_REUSEADDR`) that lets the kernel complete up to `backlog`
/// connections before they are accepted. std and mio listen with a backlog
/// of 128 and give no way to choose.
pub fn listen(addr: SocketAddr, backlog: i32) -> io::Result<std::net::TcpListener> {
    let domain = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: socket(2) takes no pointers; the descriptor it returns is
    // owned by the OwnedFd at once, so every early return closes it.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    let len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the option value is a c_int on this stack frame and `len` is
    // exactly its size.
    let rc = unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, (&raw const one).cast(), len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let (storage, sa_len) = sockaddr(addr);
    let sa = (&raw const storage).cast::<libc::sockaddr>();
    // SAFETY: `sa` points at a sockaddr_storage on this stack frame that
    // holds a sockaddr_in or sockaddr_in6 of exactly `sa_len` bytes; bind
    // only reads it, during the call.
    if unsafe { libc::bind(fd, sa, sa_len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen(2) takes no pointers.
    if unsafe { libc::listen(fd, backlog) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(std::net::TcpListener::from(owned))
}

/// `addr` as the C socket address bind(2) takes, and its length.
fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all zeros is a valid value
    // (and the unused bytes of an address must be zero).
    let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large enough and aligned enough
            // for every socket address type (that is its purpose); the
            // reference lives only inside this arm, while `storage` does.
            let sin = unsafe { &mut *(&raw mut storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) };
            mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as for the V4 arm.
            let sin6 = unsafe { &mut *(&raw mut storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// Pins the calling thread to CPU `core` (`sched_setaffinity`). A core at
/// or past the CPU set's size is refused as `InvalidInput`.
pub fn pin_to_core(core: usize) -> io::Result<()> {
    if core >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "beyond the CPU set size"));
    }
    // SAFETY: cpu_set_t is plain data and all zeros is its empty set;
    // CPU_SET writes inside it (core is below CPU_SETSIZE, checked above);
    // sched_setaffinity reads exactly size_of::<cpu_set_t>() bytes of it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Raises this process's open-file limit (`RLIMIT_NOFILE`) to its hard
/// limit, since every connection is a file descriptor. Returns the limit in
/// force afterwards, or None if it cannot be read.
pub fn raise_fd_limit() -> Option<u64> {
    // SAFETY: getrlimit and setrlimit read and write one rlimit struct (plain
    // data, valid when zeroed) that lives on this stack frame.
    unsafe {
        let mut lim: libc::rlimit = mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
        Some(lim.rlim_cur as u64)
    }
}

/// A descriptor that holds what is written to it until a reader takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// A pipe or FIFO.
    Pipe,
    /// A socket.
    Socket,
}

/// Bytes written to `fd`, a pipe or socket, that its reader has not taken
/// yet. A pipe answers `FIONREAD` at either end with its content, which
/// stays there when the reader closes. A socket answers `SIOCOUTQ`
/// (`TIOCOUTQ`, the same request) with its send queue: for a Unix socket
/// what the peer has not read (dropped when the peer closes), for TCP what
/// the peer's host has not acknowledged.
pub fn unread_bytes(fd: BorrowedFd<'_>, stream: Stream) -> io::Result<usize> {
    let request = match stream {
        Stream::Pipe => libc::FIONREAD,
        Stream::Socket => libc::TIOCOUTQ,
    };
    let mut n: libc::c_int = 0;
    // SAFETY: both requests write one c_int, here a local that outlives the
    // call; the descriptor is borrowed for the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, &raw mut n) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// The reading end of a pipe or socket, as `poll` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// Still there.
    There,
    /// Gone without an error (POLLHUP alone): a Unix socket's peer that
    /// closed having read all it was sent.
    Closed,
    /// Gone with an error (POLLERR): a pipe with no reader left (what it
    /// holds stays in it), or a socket that its peer reset or closed with
    /// bytes unread (which are dropped).
    Failed,
}

/// The state of the reading end of `fd`, a pipe or socket. An interrupted
/// poll says `There`: the caller asks again.
pub fn reader(fd: BorrowedFd<'_>) -> io::Result<Reader> {
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: poll reads and writes the one pollfd on this stack frame
    // (count 1) and does not wait (timeout 0).
    let rc = unsafe { libc::poll(&raw mut p, 1, 0) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(Reader::There) } else { Err(e) };
    }
    Ok(if p.revents & libc::POLLERR != 0 {
        Reader::Failed
    } else if p.revents & libc::POLLHUP != 0 {
        Reader::Closed
    } else {
        Reader::There
    })
}

/// What `wait_for_either` saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woke {
    /// The socket has something to read (or its peer closed it: the read
    /// tells).
    Readable,
    /// The reader of the written descriptor went away (POLLERR or POLLHUP).
    ReaderGone,
    /// Neither, within the time.
    TimedOut,
    /// A signal interrupted the wait: the caller waits again, for what is
    /// left of its time.
    Interrupted,
}

/// Waits up to `timeout` (None: for as long as it takes; rounded up to
/// the millisecond) until `readable`, a socket, has something to read, or
/// until the reader of `written`, a pipe or socket, if given, goes away.
/// Where both happened, says the reader went.
pub fn wait_for_either(
    readable: BorrowedFd<'_>,
    written: Option<BorrowedFd<'_>>,
    timeout: Option<std::time::Duration>,
) -> io::Result<Woke> {
    // poll ignores an entry whose descriptor is negative; an entry that asks
    // for no event still reports POLLERR and POLLHUP.
    let mut fds = [
        libc::pollfd { fd: readable.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: written.map_or(-1, |w| w.as_raw_fd()), events: 0, revents: 0 },
    ];
    let ms = timeout.map_or(-1, |t| libc::c_int::try_from(t.as_micros().div_ceil(1000)).unwrap_or(libc::c_int::MAX));
    // SAFETY: poll reads and writes the two pollfds of this stack frame
    // (count 2), for the call only.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(Woke::Interrupted) } else { Err(e) };
    }
    Ok(if fds[1].revents & (libc::POLLERR | libc::POLLHUP) != 0 {
        Woke::ReaderGone
    } else if fds[0].revents != 0 {
        Woke::Readable
    } else {
        Woke::TimedOut
    })
}

/// Allocates `file`'s blocks for bytes `[0, len)` and extends its size to
/// at least `len` (`fallocate` mode 0): writes below `len` then change
/// neither its size nor its allocation. Written data is never touched.
pub fn allocate(file: &File, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::other("reservation past off_t"))?;
    // SAFETY: fallocate takes no pointers; the descriptor is borrowed from
    // a File that stays open for the call.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Asks the kernel to read `file`'s bytes `[at, at + len)` into the page
/// cache in the background (`posix_fadvise` `WILLNEED`), without waiting
/// for them: a later read of them then finds them there.
pub fn will_need(file: &File, at: u64, len: u64) -> io::Result<()> {
    let at = libc::off_t::try_from(at).map_err(|_| io::Error::other("offset past off_t"))?;
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::other("length past off_t"))?;
    // SAFETY: posix_fadvise takes no pointers; the descriptor is borrowed
    // from a File that stays open for the call.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), at, len, libc::POSIX_FADV_WILLNEED) };
    if rc == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(rc)) }
}

/// Bytes free on `file`'s filesystem for an unprivileged writer
/// (`fstatvfs`: available blocks times the fragment size).
pub fn free_bytes(file: &File) -> io::Result<u64> {
    // SAFETY: statvfs is plain data, valid when zeroed; fstatvfs fills the
    // one on this stack frame, and the descriptor is borrowed from a File
    // that stays open for the call.
    let (rc, st) = unsafe {
        let mut st: libc::statvfs = mem::zeroed();
        (libc::fstatvfs(file.as_raw_fd(), &mut st), st)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // The field types differ between targets (u32 on some 32-bit ones).
    #[allow(clippy::useless_conversion)]
    Ok(u64::from(st.f_bavail).saturating_mul(u64::from(st.f_frsize)))
}

/// A file's bytes `[0, len)` mapped shared and writable: a copy into it
/// goes straight into the page cache, as a `pwrite` would, without the
/// system call. The mapping is owned here alone (no reference into it ever
/// leaves this type) and unmapped when it drops.
///
/// A write through it needs the file to stay at least `len` bytes long:
/// the caller maps only space it has reserved (`allocate`) and drops the
/// mapping before it shrinks the file. If another process shrank the file
/// underneath, a write would raise SIGBUS and end the broker; it cannot
/// break memory safety.
pub struct SharedMap {
    /// The first mapped byte.
    ptr: std::ptr::NonNull<u8>,
    /// Bytes mapped.
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value alone; moving it
// to another thread moves that ownership with it.
unsafe impl Send for SharedMap {}

impl SharedMap {
    /// Maps `file`'s bytes `[0, len)`; the file must be open for reading
    /// and writing and at least `len` bytes long.
    pub fn new(file: &File, len: u64) -> io::Result<SharedMap> {
        let len = usize::try_from(len).map_err(|_| io::Error::other("mapping past usize"))?;
        if len == 0 {
            return Err(io::Error::other("an empty mapping"));
        }
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh mapping at an address the kernel picks, so no
        // existing memory is touched; the descriptor is borrowed from a File
        // that stays open for the call (the mapping outlives the descriptor
        // safely: it holds its own reference to the file).
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(SharedMap { ptr, len })
    }

    /// Bytes mapped.
    pub fn mapped_bytes(&self) -> u64 {
        self.len as u64
    }

    /// Copies `buf` to byte `offset` of the mapping; false (nothing
    /// written) if it does not fit inside it.
    pub fn write_at(&mut self, buf: &[u8], offset: u64) -> bool {
        let Ok(at) = usize::try_from(offset) else { return false };
        if at.checked_add(buf.len()).is_none_or(|end| end > self.len) {
            return false;
        }
        // SAFETY: `[at, at + buf.len())` lies inside the mapping (checked
        // above), which this value owns alone, and `buf` is caller memory
        // that cannot overlap it (nothing hands out a pointer into it).
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), self.ptr.as_ptr().add(at), buf.len()) };
        true
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range `new` mapped, once; no reference
        // into it exists.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_binds_both_families_and_accepts() {
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(l) = listen(addr.parse().expect("addr"), 16) else {
                // A machine without IPv6 on loopback cannot bind [::1].
                assert!(addr.starts_with('['), "cannot listen on {addr}");
                continue;
            };
            let bound = l.local_addr().expect("local addr");
            assert_ne!(bound.port(), 0, "{addr}: the kernel chose a port");
            let _client = std::net::TcpStream::connect(bound).expect("connect");
            l.set_nonblocking(false).expect("blocking accept for the test");
            l.accept().expect("accept");
        }
    }

    #[test]
    fn the_free_space_of_a_file_s_filesystem_is_known() {
        let f = File::open(std::env::temp_dir()).expect("open the temporary directory");
        free_bytes(&f).expect("fstatvfs on an open descriptor");
    }

    #[test]
    fn a_core_past_the_cpu_set_is_refused() {
        let e = pin_to_core(libc::CPU_SETSIZE as usize).expect_err("refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
