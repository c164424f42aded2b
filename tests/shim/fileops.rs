//! A file-operation recorder, loaded into a `runnel serve` child with
//! `LD_PRELOAD`, for the power-loss tests (`tests/power_loss.rs`, and the
//! simulator that replays what it records, `tests/common/power_loss.rs`).
//!
//! It interposes the libc calls the broker makes on files (`nm -D
//! --undefined-only target/release/runnel` lists them: `open64`, `close`,
//! `write`, `writev`, `pwrite64`, `fsync`, `fdatasync`, `ftruncate64`,
//! `fallocate`, `rename`, `unlink`, `mkdir`; their other names too), calls
//! the real one (`dlsym(RTLD_NEXT, …)`), and, when the call is on a path
//! under `RUNNEL_FILEOPS_ROOT` (an absolute path) or on a descriptor opened
//! there, appends one line to `RUNNEL_FILEOPS_TRACE`; the bytes of a write
//! go to `RUNNEL_FILEOPS_DATA`, the line saying where. Without those three
//! variables it only passes the calls on. With `RUNNEL_FILEOPS_FREE_BYTES`
//! set it also makes `fstatvfs` of a file under the root report that many
//! bytes available, so that the broker runs as on a nearly full disk (not
//! recorded). Paths are taken as given, so only absolute ones are
//! recognised (the broker's `--data` must be absolute).
//! Writes through a shared mapping (`--fsync never`) make no call and are
//! not seen: the power-loss tests run `--fsync turn`.
//!
//! A line, fields separated by one space:
//!
//! ```text
//! seq ts_ns op ret errno fd a b c path1 path2
//! ```
//!
//! `seq` numbers the lines from 0 (the order of the file is the order the
//! calls completed in), `ts_ns` is `CLOCK_MONOTONIC` when the line was
//! appended (after the call returned), `ret` and `errno` what the call gave
//! (errno 0 when it succeeded). Unused numbers are 0 and absent paths `-`;
//! bytes of a path outside `!`..`~`, and `%`, are written `%XX`. By op:
//!
//! | op | fd | a | b | c | path1 | path2 |
//! |---|---|---|---|---|---|---|
//! | `open` | the new fd (`ret`) | flags | mode | | path | |
//! | `close` | fd | | | | | |
//! | `write` (write, writev, pwrite) | fd | file offset | bytes written (`ret`) | offset in the data file | | |
//! | `fsync`, `fdatasync` | fd | `seq` of the first line the call may not cover | | | | |
//! | `ftruncate` | fd | length | | | | |
//! | `fallocate` | fd | mode | offset | length | | |
//! | `rename` | | | | | from | to |
//! | `unlink` | | | | | path | |
//! | `mkdir` | | mode | | | path | |
//!
//! A sync covers every line numbered below its `a`: those calls had
//! returned before it began (a call that returned while it ran may be
//! numbered after it: counted as not covered, the safe side). A `close` is
//! written before the real call, so the number cannot be reused by another
//! thread's `open` before the line is written.
//!
//! Async-signal-safe enough: no allocation, no locks of libc's; lines are
//! appended under a spin lock (the broker's release thread calls in too),
//! so `seq`, `ts_ns` and the data offsets grow together. The broker's
//! signal handlers write only to a pipe, which is not recorded and takes
//! no lock.
//!
//! Built by the test itself, with no crates: `rustc --edition 2021
//! --crate-type cdylib -O -C panic=abort` (`shim` in tests/common/recorder.rs).

#![allow(non_camel_case_types, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

type off_t = i64;
type ssize_t = isize;

/// `struct timespec`.
#[repr(C)]
struct Timespec {
    /// Seconds.
    sec: i64,
    /// Nanoseconds past them.
    nsec: i64,
}

/// `struct iovec`.
#[repr(C)]
pub struct Iovec {
    /// The buffer.
    base: *const u8,
    /// Its bytes.
    len: usize,
}

extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn getenv(name: *const c_char) -> *const c_char;
    fn clock_gettime(clock: c_int, ts: *mut Timespec) -> c_int;
    fn __errno_location() -> *mut c_int;
    fn lseek64(fd: c_int, offset: off_t, whence: c_int) -> off_t;
    fn sched_yield() -> c_int;
}

const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
const CLOCK_MONOTONIC: c_int = 1;
const SEEK_CUR: c_int = 1;
const O_WRONLY: c_int = 0o1;
const O_CREAT: c_int = 0o100;
const O_TRUNC: c_int = 0o1000;
const O_APPEND: c_int = 0o2000;
const O_CLOEXEC: c_int = 0o2000000;

// ---------------------------------------------------------------------------
// The real calls.
// ---------------------------------------------------------------------------

/// The interposed symbols, in the order of `REAL`.
const NAMES: [&[u8]; 20] = [
    b"open\0",
    b"open64\0",
    b"close\0",
    b"write\0",
    b"writev\0",
    b"pwrite\0",
    b"pwrite64\0",
    b"fsync\0",
    b"fdatasync\0",
    b"ftruncate\0",
    b"ftruncate64\0",
    b"fallocate\0",
    b"fallocate64\0",
    b"rename\0",
    b"unlink\0",
    b"mkdir\0",
    b"creat\0",
    b"creat64\0",
    b"fstatvfs\0",
    b"fstatvfs64\0",
];
const OPEN: usize = 0;
const OPEN64: usize = 1;
const CLOSE: usize = 2;
const WRITE: usize = 3;
const WRITEV: usize = 4;
const PWRITE: usize = 5;
const PWRITE64: usize = 6;
const FSYNC: usize = 7;
const FDATASYNC: usize = 8;
const FTRUNCATE: usize = 9;
const FTRUNCATE64: usize = 10;
const FALLOCATE: usize = 11;
const FALLOCATE64: usize = 12;
const RENAME: usize = 13;
const UNLINK: usize = 14;
const MKDIR: usize = 15;
const CREAT: usize = 16;
const CREAT64: usize = 17;
const FSTATVFS: usize = 18;
const FSTATVFS64: usize = 19;

/// The real functions' addresses, looked up at load (and again if a call
/// comes before that).
static REAL: [AtomicUsize; 20] = [const { AtomicUsize::new(0) }; 20];

unsafe fn real(i: usize) -> usize {
    let p = REAL[i].load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    let p = dlsym(RTLD_NEXT, NAMES[i].as_ptr() as *const c_char) as usize;
    REAL[i].store(p, Ordering::Relaxed);
    p
}

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, ...) -> c_int;
type CreatFn = unsafe extern "C" fn(*const c_char, c_uint) -> c_int;
type FdFn = unsafe extern "C" fn(c_int) -> c_int;
type WriteFn = unsafe extern "C" fn(c_int, *const u8, usize) -> ssize_t;
type WritevFn = unsafe extern "C" fn(c_int, *const Iovec, c_int) -> ssize_t;
type PwriteFn = unsafe extern "C" fn(c_int, *const u8, usize, off_t) -> ssize_t;
type TruncFn = unsafe extern "C" fn(c_int, off_t) -> c_int;
type AllocFn = unsafe extern "C" fn(c_int, c_int, off_t, off_t) -> c_int;
type RenameFn = unsafe extern "C" fn(*const c_char, *const c_char) -> c_int;
type PathFn = unsafe extern "C" fn(*const c_char) -> c_int;
type MkdirFn = unsafe extern "C" fn(*const c_char, c_uint) -> c_int;
type StatvfsFn = unsafe extern "C" fn(c_int, *mut u64) -> c_int;

macro_rules! real {
    ($i:expr, $t:ty) => {
        std::mem::transmute::<usize, $t>(real($i))
    };
}

// ---------------------------------------------------------------------------
// What is recorded, and where.
// ---------------------------------------------------------------------------

/// Most bytes of the root path.
const ROOT_BYTES_MAX: usize = 4096;
/// Descriptors below this are tracked; the broker in a test opens far
/// fewer.
const FDS_MAX: usize = 1 << 16;

/// Whether recording is on (the three variables were set).
static ON: AtomicBool = AtomicBool::new(false);
/// `RUNNEL_FILEOPS_ROOT`'s bytes (`ROOT_LEN` of them), written once at load.
static ROOT: [AtomicU8; ROOT_BYTES_MAX] = [const { AtomicU8::new(0) }; ROOT_BYTES_MAX];
static ROOT_LEN: AtomicUsize = AtomicUsize::new(0);
static TRACE_FD: AtomicI32 = AtomicI32::new(-1);
static DATA_FD: AtomicI32 = AtomicI32::new(-1);
/// Which descriptors were opened under the root (1) and are still open.
static TRACKED: [AtomicU8; FDS_MAX] = [const { AtomicU8::new(0) }; FDS_MAX];
/// Lines appended so far: the next line's `seq`.
static SEQ: AtomicU64 = AtomicU64::new(0);
/// Bytes in the data file so far.
static DATA_OFF: AtomicU64 = AtomicU64::new(0);
/// `RUNNEL_FILEOPS_FREE_BYTES`, if set (else `u64::MAX`): the free bytes
/// `fstatvfs` reports for a file under the root, to run the broker as on a
/// nearly full disk.
static FREE_BYTES: AtomicU64 = AtomicU64::new(u64::MAX);
/// Held while a line (and its data) is appended.
static LOCK: AtomicBool = AtomicBool::new(false);

#[used]
#[link_section = ".init_array"]
static INIT: unsafe extern "C" fn() = init;

/// Reads the variables and opens the two output files, before `main`.
unsafe extern "C" fn init() {
    for i in 0..NAMES.len() {
        real(i);
    }
    let root = getenv(b"RUNNEL_FILEOPS_ROOT\0".as_ptr() as *const c_char);
    let trace = getenv(b"RUNNEL_FILEOPS_TRACE\0".as_ptr() as *const c_char);
    let data = getenv(b"RUNNEL_FILEOPS_DATA\0".as_ptr() as *const c_char);
    if root.is_null() || trace.is_null() || data.is_null() {
        return;
    }
    let root = cstr(root);
    if root.is_empty() || root.len() > ROOT_BYTES_MAX || root[0] != b'/' {
        return;
    }
    for (slot, &b) in ROOT.iter().zip(root) {
        slot.store(b, Ordering::Relaxed);
    }
    ROOT_LEN.store(root.len(), Ordering::Relaxed);
    let flags = O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC;
    let t = real!(OPEN64, OpenFn)(trace, flags, 0o644 as c_uint);
    let d = real!(OPEN64, OpenFn)(data, flags, 0o644 as c_uint);
    if t < 0 || d < 0 {
        return;
    }
    let free = getenv(b"RUNNEL_FILEOPS_FREE_BYTES\0".as_ptr() as *const c_char);
    if !free.is_null() {
        let n = cstr(free).iter().take_while(|b| b.is_ascii_digit()).fold(0u64, |n, &b| n * 10 + u64::from(b - b'0'));
        FREE_BYTES.store(n, Ordering::Relaxed);
    }
    TRACE_FD.store(t, Ordering::Relaxed);
    DATA_FD.store(d, Ordering::Relaxed);
    ON.store(true, Ordering::Release);
}

/// `n` bytes at `p` (none if `p` is null).
unsafe fn bytes<'a>(p: *const u8, n: usize) -> &'a [u8] {
    if p.is_null() || n == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(p, n)
    }
}

/// The bytes of a C string, without its NUL.
unsafe fn cstr<'a>(p: *const c_char) -> &'a [u8] {
    let mut n = 0;
    while *p.add(n) != 0 {
        n += 1;
    }
    std::slice::from_raw_parts(p as *const u8, n)
}

/// Whether `path` is the root or under it.
unsafe fn under_root(path: *const c_char) -> bool {
    if !ON.load(Ordering::Acquire) || path.is_null() {
        return false;
    }
    let n = ROOT_LEN.load(Ordering::Relaxed);
    let p = cstr(path);
    if p.len() < n || ROOT[..n].iter().zip(p).any(|(r, &b)| r.load(Ordering::Relaxed) != b) {
        return false;
    }
    p.len() == n || p[n] == b'/' || p[n - 1] == b'/'
}

fn tracked(fd: c_int) -> bool {
    ON.load(Ordering::Acquire)
        && fd >= 0
        && (fd as usize) < FDS_MAX
        && TRACKED[fd as usize].load(Ordering::Acquire) != 0
}

fn set_tracked(fd: c_int, on: bool) {
    if fd >= 0 && (fd as usize) < FDS_MAX {
        TRACKED[fd as usize].store(on as u8, Ordering::Release);
    }
}

fn errno() -> c_int {
    unsafe { *__errno_location() }
}

fn set_errno(e: c_int) {
    unsafe { *__errno_location() = e }
}

// ---------------------------------------------------------------------------
// Lines.
// ---------------------------------------------------------------------------

/// Bytes of a line, at most (a longer path is cut).
const LINE_BYTES_MAX: usize = 16 << 10;

/// A line being formatted on the stack.
struct Line {
    /// Its bytes (`len` of them).
    buf: [u8; LINE_BYTES_MAX],
    len: usize,
}

impl Line {
    fn byte(&mut self, b: u8) {
        if self.len < LINE_BYTES_MAX - 1 {
            self.buf[self.len] = b;
            self.len += 1;
        }
    }
    /// Begins a field: a space unless it is the first.
    fn sep(&mut self) {
        if self.len > 0 {
            self.byte(b' ');
        }
    }
    fn num(&mut self, v: i64) {
        self.sep();
        if v < 0 {
            self.byte(b'-');
        }
        let mut u = v.unsigned_abs();
        let mut digits = [0u8; 20];
        let mut n = 0;
        loop {
            digits[n] = b'0' + (u % 10) as u8;
            n += 1;
            u /= 10;
            if u == 0 {
                break;
            }
        }
        for i in (0..n).rev() {
            self.byte(digits[i]);
        }
    }
    fn word(&mut self, w: &[u8]) {
        self.sep();
        for &b in w {
            self.byte(b);
        }
    }
    unsafe fn path(&mut self, p: *const c_char) {
        if p.is_null() {
            return self.word(b"-");
        }
        self.sep();
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        for &b in cstr(p) {
            if (b'!'..=b'~').contains(&b) && b != b'%' {
                self.byte(b);
            } else {
                self.byte(b'%');
                self.byte(HEX[(b >> 4) as usize]);
                self.byte(HEX[(b & 15) as usize]);
            }
        }
    }
}

/// The bytes a write wrote.
#[derive(Clone, Copy)]
enum Data<'a> {
    /// Not a write.
    None,
    Buf(&'a [u8]),
    /// The first `written` bytes of `count` buffers (`writev`).
    Iov {
        iov: *const Iovec,
        count: usize,
        written: usize,
    },
}

impl Data<'_> {
    /// Appends the bytes to the data file at `at`; where they end.
    unsafe fn append(self, fd: c_int, at: u64) -> u64 {
        match self {
            Data::None => at,
            Data::Buf(b) => {
                write_all_at(fd, b, at);
                at + b.len() as u64
            }
            Data::Iov { iov, count, written } => {
                let (mut at, mut left) = (at, written);
                for i in 0..count {
                    let v = &*iov.add(i);
                    let take = v.len.min(left);
                    write_all_at(fd, bytes(v.base, take), at);
                    at += take as u64;
                    left -= take;
                }
                at
            }
        }
    }
}

/// One recorded call: the fields of its line (the table above).
struct Call<'a> {
    /// The op's name.
    op: &'static [u8],
    /// What the call returned, and its errno (0 when it succeeded).
    ret: i64,
    errno: c_int,
    /// The descriptor (-1: none).
    fd: c_int,
    /// The op's numbers.
    a: i64,
    b: i64,
    c: i64,
    /// Bytes written, for a write (its `c` is where they go).
    data: Data<'a>,
    /// The op's paths (null: none).
    path1: *const c_char,
    path2: *const c_char,
}

impl<'a> Call<'a> {
    fn new(op: &'static [u8], ret: i64, errno: c_int) -> Call<'a> {
        Call {
            op,
            ret,
            errno,
            fd: -1,
            a: 0,
            b: 0,
            c: 0,
            data: Data::None,
            path1: std::ptr::null(),
            path2: std::ptr::null(),
        }
    }
}

unsafe fn lock() {
    let mut spins = 0u32;
    while LOCK.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        spins += 1;
        if spins % 64 == 0 {
            sched_yield();
        } else {
            std::hint::spin_loop();
        }
    }
}

unsafe fn unlock() {
    LOCK.store(false, Ordering::Release);
}

/// Appends `c`'s line (and its bytes to the data file), keeping errno.
unsafe fn record(c: Call<'_>) {
    let saved = errno();
    let mut line = Line { buf: [0; LINE_BYTES_MAX], len: 0 };
    lock();
    let seq = SEQ.load(Ordering::Relaxed);
    let mut ts = Timespec { sec: 0, nsec: 0 };
    clock_gettime(CLOCK_MONOTONIC, &mut ts);
    let data_at = DATA_OFF.load(Ordering::Relaxed);
    DATA_OFF.store(c.data.append(DATA_FD.load(Ordering::Relaxed), data_at), Ordering::Relaxed);
    line.num(seq as i64);
    line.num(ts.sec * 1_000_000_000 + ts.nsec);
    line.word(c.op);
    line.num(c.ret);
    line.num(c.errno as i64);
    line.num(c.fd as i64);
    line.num(c.a);
    line.num(c.b);
    line.num(if matches!(c.data, Data::None) { c.c } else { data_at as i64 });
    line.path(c.path1);
    line.path(c.path2);
    line.byte(b'\n');
    let w = real!(WRITE, WriteFn);
    w(TRACE_FD.load(Ordering::Relaxed), line.buf.as_ptr(), line.len);
    SEQ.store(seq + 1, Ordering::Release);
    unlock();
    set_errno(saved);
}

/// Writes all of `buf` at `at` of `fd` (the data file), retrying short
/// writes.
unsafe fn write_all_at(fd: c_int, buf: &[u8], mut at: u64) {
    let pw = real!(PWRITE64, PwriteFn);
    let mut done = 0;
    while done < buf.len() {
        let n = pw(fd, buf.as_ptr().add(done), buf.len() - done, at as off_t);
        if n <= 0 {
            return;
        }
        done += n as usize;
        at += n as u64;
    }
}

/// The `ret` and `errno` fields of a call that returned `ret`.
fn outcome(ret: i64) -> (i64, c_int) {
    (ret, if ret < 0 { errno() } else { 0 })
}

// ---------------------------------------------------------------------------
// The interposed calls.
// ---------------------------------------------------------------------------

unsafe fn opened(path: *const c_char, flags: c_int, mode: c_uint, fd: c_int) -> c_int {
    if under_root(path) {
        let (ret, e) = outcome(fd as i64);
        if fd >= 0 {
            set_tracked(fd, true);
        }
        let mut c = Call::new(b"open", ret, e);
        (c.fd, c.a, c.b, c.path1) = (fd, flags as i64, mode as i64, path);
        record(c);
    }
    fd
}

#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let fd = real!(OPEN, OpenFn)(path, flags, mode);
    opened(path, flags, mode, fd)
}

#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let fd = real!(OPEN64, OpenFn)(path, flags, mode);
    opened(path, flags, mode, fd)
}

#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: c_uint) -> c_int {
    let fd = real!(CREAT, CreatFn)(path, mode);
    opened(path, O_WRONLY | O_CREAT | O_TRUNC, mode, fd)
}

#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: c_uint) -> c_int {
    let fd = real!(CREAT64, CreatFn)(path, mode);
    opened(path, O_WRONLY | O_CREAT | O_TRUNC, mode, fd)
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if tracked(fd) {
        set_tracked(fd, false);
        let mut c = Call::new(b"close", 0, 0);
        c.fd = fd;
        record(c);
    }
    real!(CLOSE, FdFn)(fd)
}

/// Records a write to `fd` of `data` that returned `n`, ending at the file
/// position (`at` None) or begun at `at`.
unsafe fn wrote(fd: c_int, data: Data<'_>, n: ssize_t, at: Option<off_t>) {
    let (ret, e) = outcome(n as i64);
    let written = n.max(0) as usize;
    let start = match at {
        Some(at) => at,
        None => lseek64(fd, 0, SEEK_CUR) - written as off_t,
    };
    let data = match data {
        Data::Buf(b) => Data::Buf(&b[..written.min(b.len())]),
        Data::Iov { iov, count, .. } => Data::Iov { iov, count, written },
        Data::None => Data::None,
    };
    let mut c = Call::new(b"write", ret, e);
    (c.fd, c.a, c.b, c.data) = (fd, start, written as i64, data);
    record(c);
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const u8, len: usize) -> ssize_t {
    let n = real!(WRITE, WriteFn)(fd, buf, len);
    if tracked(fd) {
        wrote(fd, Data::Buf(bytes(buf, len)), n, None);
    }
    n
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const Iovec, count: c_int) -> ssize_t {
    let n = real!(WRITEV, WritevFn)(fd, iov, count);
    if tracked(fd) {
        wrote(fd, Data::Iov { iov, count: count.max(0) as usize, written: 0 }, n, None);
    }
    n
}

unsafe fn pwrote(fd: c_int, buf: *const u8, len: usize, n: ssize_t, at: off_t) {
    if tracked(fd) {
        wrote(fd, Data::Buf(bytes(buf, len)), n, Some(at));
    }
}

#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const u8, len: usize, at: off_t) -> ssize_t {
    let n = real!(PWRITE, PwriteFn)(fd, buf, len, at);
    pwrote(fd, buf, len, n, at);
    n
}

#[no_mangle]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const u8, len: usize, at: off_t) -> ssize_t {
    let n = real!(PWRITE64, PwriteFn)(fd, buf, len, at);
    pwrote(fd, buf, len, n, at);
    n
}

/// A sync of `fd` by the real call `i`, named `op`.
unsafe fn sync(i: usize, op: &'static [u8], fd: c_int) -> c_int {
    if !tracked(fd) {
        return real!(i, FdFn)(fd);
    }
    let begin = SEQ.load(Ordering::Acquire);
    let r = real!(i, FdFn)(fd);
    let (ret, e) = outcome(r as i64);
    let mut c = Call::new(op, ret, e);
    (c.fd, c.a) = (fd, begin as i64);
    record(c);
    r
}

#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    sync(FSYNC, b"fsync", fd)
}

#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    sync(FDATASYNC, b"fdatasync", fd)
}

unsafe fn truncated(fd: c_int, len: off_t, r: c_int) -> c_int {
    if tracked(fd) {
        let (ret, e) = outcome(r as i64);
        let mut c = Call::new(b"ftruncate", ret, e);
        (c.fd, c.a) = (fd, len);
        record(c);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    truncated(fd, len, real!(FTRUNCATE, TruncFn)(fd, len))
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off_t) -> c_int {
    truncated(fd, len, real!(FTRUNCATE64, TruncFn)(fd, len))
}

unsafe fn allocated(fd: c_int, mode: c_int, at: off_t, len: off_t, r: c_int) -> c_int {
    if tracked(fd) {
        let (ret, e) = outcome(r as i64);
        let mut c = Call::new(b"fallocate", ret, e);
        (c.fd, c.a, c.b, c.c) = (fd, mode as i64, at, len);
        record(c);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, at: off_t, len: off_t) -> c_int {
    allocated(fd, mode, at, len, real!(FALLOCATE, AllocFn)(fd, mode, at, len))
}

#[no_mangle]
pub unsafe extern "C" fn fallocate64(fd: c_int, mode: c_int, at: off_t, len: off_t) -> c_int {
    allocated(fd, mode, at, len, real!(FALLOCATE64, AllocFn)(fd, mode, at, len))
}

#[no_mangle]
pub unsafe extern "C" fn rename(from: *const c_char, to: *const c_char) -> c_int {
    let r = real!(RENAME, RenameFn)(from, to);
    if under_root(from) || under_root(to) {
        let (ret, e) = outcome(r as i64);
        let mut c = Call::new(b"rename", ret, e);
        (c.path1, c.path2) = (from, to);
        record(c);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    let r = real!(UNLINK, PathFn)(path);
    if under_root(path) {
        let (ret, e) = outcome(r as i64);
        let mut c = Call::new(b"unlink", ret, e);
        c.path1 = path;
        record(c);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: c_uint) -> c_int {
    let r = real!(MKDIR, MkdirFn)(path, mode);
    if under_root(path) {
        let (ret, e) = outcome(r as i64);
        let mut c = Call::new(b"mkdir", ret, e);
        (c.a, c.path1) = (mode as i64, path);
        record(c);
    }
    r
}

/// `struct statvfs` as `u64`s: `f_frsize` is the second, `f_bavail` the
/// fifth (on the 64-bit Linux targets).
const STATVFS_FRSIZE: usize = 1;
const STATVFS_BAVAIL: usize = 4;

/// With `RUNNEL_FILEOPS_FREE_BYTES` set, a file under the root reports that
/// many bytes available (in fragments of its real size); not recorded.
unsafe fn statvfs_of(fd: c_int, st: *mut u64, r: c_int) -> c_int {
    let free = FREE_BYTES.load(Ordering::Relaxed);
    if r == 0 && free != u64::MAX && tracked(fd) {
        let frsize = (*st.add(STATVFS_FRSIZE)).max(1);
        *st.add(STATVFS_BAVAIL) = free / frsize;
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn fstatvfs(fd: c_int, st: *mut u64) -> c_int {
    statvfs_of(fd, st, real!(FSTATVFS, StatvfsFn)(fd, st))
}

#[no_mangle]
pub unsafe extern "C" fn fstatvfs64(fd: c_int, st: *mut u64) -> c_int {
    statvfs_of(fd, st, real!(FSTATVFS64, StatvfsFn)(fd, st))
}
