//! A power-loss simulator: from a trace of a broker's file operations (the
//! recorder, `tests/shim/fileops.rs`, run by `recorder.rs`), what the disk
//! could hold had the power gone at any point of it.
//!
//! The crash model, after what POSIX promises (and SQLite's and
//! PostgreSQL's crash-safety notes assume):
//!
//! - a file's bytes, and its length, are durable once an `fsync` or
//!   `fdatasync` of that file completed after they were written (the sync
//!   covers the calls that returned before it began: the trace's `a`);
//! - a directory entry (a create, `mkdir`, `rename` or `unlink`) is durable
//!   once its directory was synced after it ([`Metadata::Posix`]); or, as a
//!   journal commits them (ext4's `data=ordered`), the entries become
//!   durable in the order they were made, a prefix of them, which holds at
//!   least those a directory sync covered ([`Metadata::Journal`]);
//! - what is not durable at the cut may or may not have reached the disk:
//!   each directory operation not yet durable is kept or not (any subset
//!   under `Posix`, a prefix under `Journal`), and each change to a file's
//!   contents not yet durable (a write, a truncate, an `fallocate`) gets a
//!   [`Keep`]: dropped, kept whole, or, for a write, kept in part (a prefix
//!   of it, or some of its 512-byte sectors), as [`Writes`] allows: in the
//!   order they were made (a prefix of each file's, `Writes::InOrder`),
//!   each on its own (`Writes::Independent`), or sector by sector: each
//!   512-byte sector as some write-back of its page left it, in any order
//!   (`Writes::Sectors`), or any of each write's sectors, each write on its
//!   own (`Writes::EachSector`).
//!
//! A run may begin on a root that already holds files (`Trace::over`, for
//! a start on an existing data directory): they are taken as durable.
//!
//! A cut is a number: the trace's lines numbered below it happened, the rest
//! did not. `Trace::cut` replays those lines and sorts what they did into
//! durable and pending; `CrashModel::choose` draws the pending choices from
//! a seeded `Rng` (or a test names them: `Choices::uniform`); `Cut::disk`
//! applies them and gives the `Disk`, which `Disk::write_to` lays out in a
//! fresh directory for a broker to start on. `Cut::describe` says in words
//! what was chosen, for a failure message with the seed.
//!
//! Extending it: a finer model of what survives of an unsynced write is a
//! new `Keep` variant applied in `Keep::apply` and a new `Writes` variant
//! drawn in `Writes::keeps` (which sees each file's unsynced changes in
//! order); nothing else changes (the sector model is one). The
//! model knows only what the recorder records: renames within one
//! directory, regular files and directories, absolute paths.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};

use runnel::testkit::Rng;

// ---------------------------------------------------------------------------
// The trace.
// ---------------------------------------------------------------------------

/// One recorded call (a line of the trace; `tests/shim/fileops.rs` has the
/// format).
#[derive(Clone, Debug)]
pub struct Op {
    /// The line's number: its place in the order the calls completed.
    pub seq: u64,
    /// `CLOCK_MONOTONIC` when the line was written, after the call returned.
    pub ts_ns: u64,
    /// Whether the call succeeded (a failed one changed nothing).
    pub ok: bool,
    pub kind: OpKind,
}

/// What a call did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    Open {
        fd: i32,
        flags: i32,
        path: PathBuf,
    },
    Close {
        fd: i32,
    },
    /// Bytes written at `at` of the file; `data` is where they are in the
    /// data file.
    Write {
        fd: i32,
        at: u64,
        data: Range<usize>,
    },
    /// An `fsync` (`data_only` false) or `fdatasync`: it covers the calls
    /// numbered below `covers_below`.
    Sync {
        fd: i32,
        data_only: bool,
        covers_below: u64,
    },
    Truncate {
        fd: i32,
        len: u64,
    },
    Allocate {
        fd: i32,
        mode: i32,
        at: u64,
        len: u64,
    },
    Rename {
        from: PathBuf,
        to: PathBuf,
    },
    Unlink {
        path: PathBuf,
    },
    Mkdir {
        path: PathBuf,
    },
}

impl OpKind {
    /// A directory operation, or a sync (whose cut points a test wants).
    pub fn is_dir_op(&self) -> bool {
        matches!(self, OpKind::Rename { .. } | OpKind::Unlink { .. } | OpKind::Mkdir { .. })
            || matches!(self, OpKind::Open { flags, .. } if flags & libc::O_CREAT != 0)
    }
}

/// A recorded run: its calls in order, and the bytes its writes wrote.
pub struct Trace {
    /// The directory the recorder watched; paths in `ops` are under it.
    pub root: PathBuf,
    /// Every line, `ops[i].seq == i`.
    pub ops: Vec<Op>,
    /// The data file: the bytes of every write.
    data: Vec<u8>,
    /// What the root held when the run began, all of it durable (empty:
    /// the run began on an empty root).
    pub initial: Disk,
}

/// `%XX`-escaped bytes back to a path.
fn unescape(s: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).expect("hex escape");
            out.push(u8::from_str_radix(hex, 16).expect("hex escape"));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

impl Trace {
    /// A trace of `ops` (numbered in order) whose writes' bytes are in
    /// `data`: for a test of the simulator itself.
    pub fn from_parts(root: &Path, ops: Vec<Op>, data: Vec<u8>) -> Trace {
        for (i, op) in ops.iter().enumerate() {
            assert_eq!(op.seq, i as u64, "ops numbered in order");
        }
        Trace { root: root.to_path_buf(), ops, data, initial: Disk::default() }
    }

    /// This trace of a run that began on a root holding `initial` (durably).
    pub fn over(self, initial: Disk) -> Trace {
        Trace { initial, ..self }
    }

    /// Reads a trace and its data file, recorded under `root`.
    pub fn load(root: &Path, trace: &Path, data: &Path) -> Trace {
        let text = std::fs::read_to_string(trace).expect("read the trace");
        let data = std::fs::read(data).expect("read the trace's data file");
        let ops = text.lines().enumerate().map(|(i, l)| parse_line(i as u64, l)).collect();
        Trace { root: root.to_path_buf(), ops, data, initial: Disk::default() }
    }

    /// The bytes of a write.
    pub fn bytes(&self, r: &Range<usize>) -> &[u8] {
        &self.data[r.clone()]
    }

    /// Cuts past the end: every line happened.
    pub fn end(&self) -> u64 {
        self.ops.len() as u64
    }

    /// The timestamp of the first line that did not happen at `cut` (none
    /// for the end): anything a client saw before it, the lines below the
    /// cut had done.
    pub fn cut_ts_ns(&self, cut: u64) -> u64 {
        self.ops.get(cut as usize).map_or(u64::MAX, |o| o.ts_ns)
    }

    /// The line of `op` in words (path names relative to the root).
    pub fn describe_op(&self, seq: u64) -> String {
        let Some(op) = self.ops.get(seq as usize) else { return format!("#{seq} (the end)") };
        let rel = |p: &Path| p.strip_prefix(&self.root).unwrap_or(p).display().to_string();
        let what = match &op.kind {
            OpKind::Open { fd, flags, path } => format!("open {} flags {flags:#o} -> fd {fd}", rel(path)),
            OpKind::Close { fd } => format!("close fd {fd}"),
            OpKind::Write { fd, at, data } => format!("write fd {fd} {} bytes at {at}", data.len()),
            OpKind::Sync { fd, data_only, covers_below } => {
                format!("{} fd {fd} (covers below #{covers_below})", if *data_only { "fdatasync" } else { "fsync" })
            }
            OpKind::Truncate { fd, len } => format!("ftruncate fd {fd} to {len}"),
            OpKind::Allocate { fd, mode, at, len } => format!("fallocate fd {fd} mode {mode} {at}+{len}"),
            OpKind::Rename { from, to } => format!("rename {} -> {}", rel(from), rel(to)),
            OpKind::Unlink { path } => format!("unlink {}", rel(path)),
            OpKind::Mkdir { path } => format!("mkdir {}", rel(path)),
        };
        format!("#{seq} {what}{}", if op.ok { "" } else { " (failed)" })
    }
}

fn parse_line(i: u64, line: &str) -> Op {
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!(f.len(), 11, "trace line {i} has {} fields: {line:?}", f.len());
    let n = |k: usize| -> i64 { f[k].parse().unwrap_or_else(|e| panic!("trace line {i} field {k}: {e}: {line:?}")) };
    let seq = n(0) as u64;
    assert_eq!(seq, i, "trace line {i} is numbered {seq}");
    let (ret, fd, a, b, c) = (n(3), n(5) as i32, n(6), n(7), n(8));
    let path = |k: usize| unescape(f[k]);
    let kind = match f[2] {
        "open" => OpKind::Open { fd, flags: a as i32, path: path(9) },
        "close" => OpKind::Close { fd },
        "write" => OpKind::Write { fd, at: a as u64, data: c as usize..(c + b) as usize },
        "fsync" | "fdatasync" => OpKind::Sync { fd, data_only: f[2] == "fdatasync", covers_below: a as u64 },
        "ftruncate" => OpKind::Truncate { fd, len: a as u64 },
        "fallocate" => OpKind::Allocate { fd, mode: a as i32, at: b as u64, len: c as u64 },
        "rename" => OpKind::Rename { from: path(9), to: path(10) },
        "unlink" => OpKind::Unlink { path: path(9) },
        "mkdir" => OpKind::Mkdir { path: path(9) },
        other => panic!("trace line {i}: unknown op {other:?}"),
    };
    Op { seq, ts_ns: n(1) as u64, ok: ret >= 0, kind }
}

// ---------------------------------------------------------------------------
// The crash model: the seam.
// ---------------------------------------------------------------------------

/// Which pending directory operations a power loss may keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metadata {
    /// Any subset: an entry is durable only once its directory was synced
    /// after it (POSIX).
    Posix,
    /// A prefix, in the order they were made (a journaling filesystem:
    /// ext4 `data=ordered`).
    Journal,
}

/// What may survive of the unsynced changes to a file's contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writes {
    /// Each is lost.
    Dropped,
    /// Each reached the disk.
    Kept,
    /// A prefix of each file's unsynced changes, in the order they were
    /// made, the last of it possibly in part (a write torn at any byte): a
    /// device that writes a file back in order. What the recovery rules of
    /// docs/log-format.md take a torn tail to be.
    InOrder,
    /// Each change dropped, kept or (a write) kept in part, independently
    /// of the others: an earlier write can be torn while a later one
    /// survives whole. The last segment's records are then damaged with
    /// whole records after them (issue #34).
    Independent,
    /// The unsynced writes reach the disk sector by sector, in any order
    /// (pages written back in any order, a device that keeps each 512-byte
    /// sector whole or not at all): each sector holds what some write-back
    /// of it took, the file's unsynced writes to it up to some point, so
    /// any subset of a write's sectors survives, and a later write's bytes
    /// in a sector only with every earlier write's there. A truncate or an
    /// `fallocate` is kept or not.
    Sectors,
    /// As `Sectors`, but each write's sectors drawn on its own, with a
    /// share drawn per file (so that crashes keeping nearly none and nearly
    /// all come up): this also leaves states a disk cannot reach (a later
    /// write's bytes in a sector without an earlier write's, which the page
    /// held when it was written back), a superset of what a power cut can
    /// leave that the log's recovery survives too.
    EachSector,
}

/// What survives of one unsynced change to a file's contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Keep {
    /// None of it.
    Drop,
    /// All of it.
    Whole,
    /// The first this many bytes of a write (a truncate or an `fallocate`
    /// is all or nothing: taken as `Whole`).
    Prefix(usize),
    /// The bytes of the file's `index`th of `of` unsynced writes in the
    /// 512-byte sectors whose write-back, drawn from `seed`, came after it
    /// (`sector_version`); a truncate or an `fallocate`: taken as `Whole`.
    Sectors { seed: u32, index: u16, of: u16 },
    /// The write's bytes in the file's 512-byte sectors that `seed` keeps,
    /// each with `percent`% odds (`sector_kept`); a truncate or an
    /// `fallocate`: taken as `Whole`.
    EachSector { seed: u32, percent: u8 },
}

/// The sector a power cut keeps or loses whole.
pub const SECTOR_BYTES: u64 = 512;

/// A hash of a crash's `seed` and a sector, so that a choice is a small
/// value that names the same sectors every time.
fn sector_hash(seed: u32, sector: u64) -> u64 {
    let mut h = (u64::from(seed) << 32 | 0x9e37_79b9) ^ sector.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ h >> 33
}

/// Whether `Keep::EachSector { seed, percent }` keeps the file's sector
/// `sector`.
pub fn sector_kept(seed: u32, percent: u8, sector: u64) -> bool {
    sector_hash(seed, sector) % 100 < u64::from(percent)
}

/// Under `Keep::Sectors`, how many of a file's `of` unsynced writes (the
/// first ones) the last write-back of its sector `sector` took: 0 to `of`.
pub fn sector_version(seed: u32, of: u16, sector: u64) -> u16 {
    (sector_hash(seed, sector) % (u64::from(of) + 1)) as u16
}

impl Keep {
    /// Applies `change` to `file` as far as this choice keeps it.
    fn apply(self, change: &Change, trace: &Trace, file: &mut Vec<u8>) {
        if self == Keep::Drop {
            return;
        }
        match (self, change) {
            (Keep::Sectors { .. } | Keep::EachSector { .. }, Change::Write { at, data }) => {
                let bytes = trace.bytes(data);
                let (start, end) = (*at, *at + bytes.len() as u64);
                let mut from = start;
                while from < end {
                    let sector = from / SECTOR_BYTES;
                    let to = ((sector + 1) * SECTOR_BYTES).min(end);
                    if self.keeps_sector(sector) {
                        put(file, from, &bytes[(from - start) as usize..(to - start) as usize]);
                    }
                    from = to;
                }
            }
            (_, Change::Write { at, data }) => {
                let bytes = trace.bytes(data);
                let n = match self {
                    Keep::Prefix(n) => n.min(bytes.len()),
                    _ => bytes.len(),
                };
                put(file, *at, &bytes[..n]);
            }
            (_, Change::SetLen(len)) => file.resize(*len as usize, 0),
            (_, Change::Extend(end)) => {
                if file.len() < *end as usize {
                    file.resize(*end as usize, 0);
                }
            }
        }
    }
}

impl Keep {
    /// Whether a sector choice keeps the file's sector `sector` of the
    /// write it was made for (every other choice keeps or drops the write
    /// whole).
    fn keeps_sector(self, sector: u64) -> bool {
        match self {
            Keep::Sectors { seed, index, of } => index < sector_version(seed, of, sector),
            Keep::EachSector { seed, percent } => sector_kept(seed, percent, sector),
            Keep::Drop => false,
            Keep::Whole | Keep::Prefix(_) => true,
        }
    }
}

/// Writes `bytes` at `at` of `file`, growing it (with zeros) to hold them.
fn put(file: &mut Vec<u8>, at: u64, bytes: &[u8]) {
    let (at, end) = (at as usize, at as usize + bytes.len());
    if file.len() < end {
        file.resize(end, 0);
    }
    file[at..end].copy_from_slice(bytes);
}

impl Writes {
    /// Draws what survives of `changes`, one file's unsynced changes in
    /// the order they were made.
    fn keeps(self, changes: &[Change], rng: &mut Rng) -> Vec<Keep> {
        let torn = |c: &Change, rng: &mut Rng| match c {
            Change::Write { data, .. } if data.len() > 1 => Keep::Prefix(rng.below(data.len())),
            _ => Keep::Drop,
        };
        match self {
            Writes::Dropped => vec![Keep::Drop; changes.len()],
            Writes::Kept => vec![Keep::Whole; changes.len()],
            Writes::InOrder => {
                let whole = rng.range(0, changes.len());
                let mut v: Vec<Keep> =
                    (0..changes.len()).map(|i| if i < whole { Keep::Whole } else { Keep::Drop }).collect();
                if whole < changes.len() && rng.one_in(2) {
                    v[whole] = torn(&changes[whole], rng);
                }
                v
            }
            Writes::Independent => changes
                .iter()
                .map(|c| match rng.below(3) {
                    0 => Keep::Drop,
                    1 => torn(c, rng),
                    _ => Keep::Whole,
                })
                .collect(),
            Writes::Sectors => {
                let seed = rng.next_u64() as u32;
                let of =
                    changes.iter().filter(|c| matches!(c, Change::Write { .. })).count().min(u16::MAX as usize) as u16;
                let mut index = 0u16;
                changes
                    .iter()
                    .map(|c| match c {
                        Change::Write { .. } => {
                            index = index.saturating_add(1);
                            Keep::Sectors { seed, index: index - 1, of }
                        }
                        _ if rng.one_in(2) => Keep::Whole,
                        _ => Keep::Drop,
                    })
                    .collect()
            }
            Writes::EachSector => {
                let percent = rng.below(101u64) as u8;
                changes
                    .iter()
                    .map(|c| match c {
                        Change::Write { .. } => Keep::EachSector { seed: rng.next_u64() as u32, percent },
                        _ if rng.percent(u64::from(percent)) => Keep::Whole,
                        _ => Keep::Drop,
                    })
                    .collect()
            }
        }
    }
}

/// What a power loss may leave: the seam a finer model extends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashModel {
    pub metadata: Metadata,
    pub writes: Writes,
}

/// The choices for one crash: for each pending directory operation and
/// each pending change to a file's contents of a `Cut`, in trace order,
/// whether (or how much of) it survives.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Choices {
    /// For each of `Cut::pending_dir_ops`: kept.
    pub dir_ops: Vec<bool>,
    /// For each of `Cut::pending_changes`: what of it is kept.
    pub changes: Vec<Keep>,
}

impl Choices {
    /// Every pending directory operation kept or not, every pending change
    /// kept as `keep`.
    pub fn uniform(cut: &Cut<'_>, dir_ops: bool, keep: Keep) -> Choices {
        Choices { dir_ops: vec![dir_ops; cut.pending_dir_ops.len()], changes: vec![keep; cut.pending_changes.len()] }
    }

    /// Every subset of `cut`'s pending directory operations kept (what
    /// `Metadata::Posix` allows), each with every pending change kept as
    /// `keep`; none if there are more than `pending_max` of them.
    pub fn every_dir_subset(cut: &Cut<'_>, keep: Keep, pending_max: usize) -> Vec<Choices> {
        let n = cut.pending_dir_ops.len();
        if n > pending_max {
            return Vec::new();
        }
        (0..1u64 << n)
            .map(|bits| Choices {
                dir_ops: (0..n).map(|i| bits & (1 << i) != 0).collect(),
                changes: vec![keep; cut.pending_changes.len()],
            })
            .collect()
    }
}

impl CrashModel {
    /// Draws the choices for `cut` from `rng`. The directory operations:
    /// under `Posix` each is kept or not, with a probability drawn per crash
    /// (so that crashes keeping nearly none and nearly all come up);
    /// under `Journal` a prefix of them.
    pub fn choose(&self, cut: &Cut, rng: &mut Rng) -> Choices {
        let n = cut.pending_dir_ops.len();
        let dir_ops = match self.metadata {
            Metadata::Posix => {
                let p = rng.below(101u64);
                (0..n).map(|_| rng.percent(p)).collect()
            }
            Metadata::Journal => {
                let kept = rng.range(cut.journal_kept_min(), n);
                (0..n).map(|i| i < kept).collect()
            }
        };
        // Drawn file by file, then put in trace order.
        let mut by_file: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
        for (at, &(node, _)) in cut.pending_changes.iter().enumerate() {
            by_file.entry(node).or_default().push(at);
        }
        let mut changes = vec![Keep::Whole; cut.pending_changes.len()];
        for ats in by_file.values() {
            let file: Vec<Change> = ats.iter().map(|&at| cut.change(cut.pending_changes[at])).collect();
            for (&at, keep) in ats.iter().zip(self.writes.keeps(&file, rng)) {
                changes[at] = keep;
            }
        }
        Choices { dir_ops, changes }
    }
}

// ---------------------------------------------------------------------------
// Replaying a trace to a cut.
// ---------------------------------------------------------------------------

type NodeId = usize;

/// A change to a file's contents.
#[derive(Clone, Debug)]
pub enum Change {
    Write {
        at: u64,
        data: Range<usize>,
    },
    /// `ftruncate`, or an open with `O_TRUNC` (to 0).
    SetLen(u64),
    /// An `fallocate` that grows the file to at least this length.
    Extend(u64),
}

/// A file or a directory, as the replay knows it.
struct Node {
    /// A directory's entries as the running broker saw them (None: a file).
    entries: Option<BTreeMap<std::ffi::OsString, NodeId>>,
    /// A file's contents when the run began (durable).
    initial: Vec<u8>,
    /// A file's changes in order, with the line each was made by.
    changes: Vec<(u64, Change)>,
    /// Lines below this are covered by a completed sync of this node.
    synced_below: u64,
}

/// A change to a directory's entries.
#[derive(Clone, Debug)]
enum DirChange {
    /// A create or `mkdir`: `name` now names `node`.
    Link {
        name: std::ffi::OsString,
        node: NodeId,
    },
    Unlink {
        name: std::ffi::OsString,
        node: NodeId,
    },
    Rename {
        from: std::ffi::OsString,
        to: std::ffi::OsString,
        node: NodeId,
    },
}

/// A directory operation: the line, the directory, the change.
#[derive(Clone, Debug)]
struct DirOp {
    /// The line that made it.
    seq: u64,
    /// The directory whose entries it changes.
    dir: NodeId,
    change: DirChange,
}

/// The trace replayed up to a cut: what is durable there, and what is
/// pending (the choices a crash makes).
pub struct Cut<'t> {
    trace: &'t Trace,
    /// The lines numbered below it happened.
    pub cut: u64,
    /// Every file and directory the replay met (0: the root).
    nodes: Vec<Node>,
    /// The entries the root held when the run began: (directory, name,
    /// node), durable.
    initial: Vec<(NodeId, std::ffi::OsString, NodeId)>,
    /// Every directory operation below the cut, in order.
    dir_ops: Vec<DirOp>,
    /// Indexes into `dir_ops` of those not yet durable.
    pub pending_dir_ops: Vec<usize>,
    /// (node, index into its changes) of the changes not yet durable, in
    /// trace order.
    pub pending_changes: Vec<(NodeId, usize)>,
}

impl Trace {
    /// Replays the lines numbered below `cut`.
    pub fn cut(&self, cut: u64) -> Cut<'_> {
        let mut r = Replay { trace: self, nodes: Vec::new(), fds: HashMap::new(), dir_ops: Vec::new() };
        r.new_node(true, Vec::new());
        let initial = r.lay_out(&self.initial);
        for op in self.ops.iter().take(cut as usize).filter(|o| o.ok) {
            r.apply(op);
        }
        let Replay { nodes, dir_ops, .. } = r;
        // A directory operation is durable once its directory was synced
        // after it; a journal keeps more (`journal_kept_min`).
        let durable = |d: &DirOp| d.seq < nodes[d.dir].synced_below;
        let pending_dir_ops = (0..dir_ops.len()).filter(|&i| !durable(&dir_ops[i])).collect();
        let mut pending_changes: Vec<(u64, NodeId, usize)> = Vec::new();
        for (id, n) in nodes.iter().enumerate() {
            for (i, (seq, _)) in n.changes.iter().enumerate() {
                if *seq >= n.synced_below {
                    pending_changes.push((*seq, id, i));
                }
            }
        }
        pending_changes.sort_unstable();
        let pending_changes = pending_changes.into_iter().map(|(_, n, i)| (n, i)).collect();
        Cut { trace: self, cut, nodes, initial, dir_ops, pending_dir_ops, pending_changes }
    }
}

/// The state of a replay in progress.
struct Replay<'t> {
    trace: &'t Trace,
    /// Every file and directory met so far (0: the root).
    nodes: Vec<Node>,
    /// Open descriptors: the node each names.
    fds: HashMap<i32, NodeId>,
    /// The directory operations so far, in order.
    dir_ops: Vec<DirOp>,
}

impl Replay<'_> {
    /// The directory holding `path`, and its last component.
    fn parent(&self, path: &Path) -> (NodeId, std::ffi::OsString) {
        let rel =
            path.strip_prefix(&self.trace.root).unwrap_or_else(|_| panic!("{} is not under the root", path.display()));
        let name = rel.file_name().unwrap_or_else(|| panic!("{} has no name", path.display())).to_os_string();
        let dir = rel
            .parent()
            .map_or(Some(0), |p| self.lookup(p))
            .unwrap_or_else(|| panic!("no directory for {}", path.display()));
        (dir, name)
    }

    /// The node at `rel` (relative to the root), as the broker saw it.
    fn lookup(&self, rel: &Path) -> Option<NodeId> {
        let mut at = 0;
        for c in rel.components() {
            at = *self.nodes[at].entries.as_ref()?.get(c.as_os_str())?;
        }
        Some(at)
    }

    /// A new node: a directory, or a file holding `initial` (durably).
    fn new_node(&mut self, dir: bool, initial: Vec<u8>) -> NodeId {
        self.nodes.push(Node { entries: dir.then(BTreeMap::new), initial, changes: Vec::new(), synced_below: 0 });
        self.nodes.len() - 1
    }

    /// Puts `disk` under the root as what it held when the run began; its
    /// entries (directory, name, node), all durable.
    fn lay_out(&mut self, disk: &Disk) -> Vec<(NodeId, std::ffi::OsString, NodeId)> {
        let mut entries = Vec::new();
        // Parents sort before their children.
        let dirs = disk.dirs.iter().map(|d| (d, None));
        for (rel, bytes) in dirs.chain(disk.files.iter().map(|(f, b)| (f, Some(b)))) {
            let (dir, name) = self.parent(&self.trace.root.join(rel));
            let node = self.new_node(bytes.is_none(), bytes.cloned().unwrap_or_default());
            self.entries(dir).insert(name.clone(), node);
            entries.push((dir, name, node));
        }
        entries
    }

    fn entries(&mut self, dir: NodeId) -> &mut BTreeMap<std::ffi::OsString, NodeId> {
        self.nodes[dir].entries.as_mut().expect("a directory")
    }

    fn node_of(&self, fd: i32, seq: u64) -> NodeId {
        *self.fds.get(&fd).unwrap_or_else(|| panic!("trace line {seq}: fd {fd} was not opened under the root"))
    }

    fn change(&mut self, fd: i32, seq: u64, c: Change) {
        let n = self.node_of(fd, seq);
        self.nodes[n].changes.push((seq, c));
    }

    fn apply(&mut self, op: &Op) {
        let seq = op.seq;
        match &op.kind {
            OpKind::Open { fd, flags, path } => self.open(seq, *fd, *flags, path),
            OpKind::Close { fd } => {
                self.fds.remove(fd);
            }
            OpKind::Write { fd, at, data } => self.change(*fd, seq, Change::Write { at: *at, data: data.clone() }),
            OpKind::Truncate { fd, len } => self.change(*fd, seq, Change::SetLen(*len)),
            OpKind::Allocate { fd, mode, at, len } => {
                assert!(
                    *mode & !libc::FALLOC_FL_KEEP_SIZE == 0,
                    "trace line {seq}: fallocate mode {mode} is not modelled"
                );
                if *mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
                    self.change(*fd, seq, Change::Extend(at + len));
                }
            }
            OpKind::Sync { fd, covers_below, .. } => {
                let n = self.node_of(*fd, seq);
                let s = &mut self.nodes[n].synced_below;
                *s = (*s).max(*covers_below);
            }
            OpKind::Mkdir { path } => {
                let (dir, name) = self.parent(path);
                let node = self.new_node(true, Vec::new());
                self.entries(dir).insert(name.clone(), node);
                self.dir_ops.push(DirOp { seq, dir, change: DirChange::Link { name, node } });
            }
            OpKind::Unlink { path } => {
                let (dir, name) = self.parent(path);
                let node = self
                    .entries(dir)
                    .remove(&name)
                    .unwrap_or_else(|| panic!("trace line {seq}: unlink of a missing name"));
                self.dir_ops.push(DirOp { seq, dir, change: DirChange::Unlink { name, node } });
            }
            OpKind::Rename { from, to } => {
                let ((dir, from), (to_dir, to)) = (self.parent(from), self.parent(to));
                assert_eq!(dir, to_dir, "trace line {seq}: a rename between directories is not modelled");
                let node = self
                    .entries(dir)
                    .remove(&from)
                    .unwrap_or_else(|| panic!("trace line {seq}: rename of a missing name"));
                self.entries(dir).insert(to.clone(), node);
                self.dir_ops.push(DirOp { seq, dir, change: DirChange::Rename { from, to, node } });
            }
        }
    }

    fn open(&mut self, seq: u64, fd: i32, flags: i32, path: &Path) {
        let rel = path.strip_prefix(&self.trace.root).expect("under the root");
        let node = match self.lookup(rel) {
            Some(n) => {
                if flags & libc::O_TRUNC != 0 && self.nodes[n].entries.is_none() {
                    self.nodes[n].changes.push((seq, Change::SetLen(0)));
                }
                n
            }
            None => {
                assert!(flags & libc::O_CREAT != 0, "trace line {seq}: {} opened without being there", path.display());
                let (dir, name) = self.parent(path);
                let node = self.new_node(false, Vec::new());
                self.entries(dir).insert(name.clone(), node);
                self.dir_ops.push(DirOp { seq, dir, change: DirChange::Link { name, node } });
                node
            }
        };
        self.fds.insert(fd, node);
    }
}

// ---------------------------------------------------------------------------
// What the disk holds after the crash.
// ---------------------------------------------------------------------------

/// The files and directories a crash left, relative to the root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Disk {
    pub dirs: BTreeSet<PathBuf>,
    pub files: BTreeMap<PathBuf, Vec<u8>>,
}

impl Disk {
    /// Lays the disk out under `dir` (which exists and is empty).
    pub fn write_to(&self, dir: &Path) {
        for d in &self.dirs {
            std::fs::create_dir_all(dir.join(d)).expect("create a directory of the crashed disk");
        }
        for (p, bytes) in &self.files {
            std::fs::write(dir.join(p), bytes).expect("write a file of the crashed disk");
        }
    }

    /// What is under `dir` now, the same way (to compare with a trace's
    /// end: the recorder saw every call that made it).
    pub fn read(dir: &Path) -> Disk {
        fn walk(base: &Path, rel: &Path, disk: &mut Disk) {
            for e in std::fs::read_dir(base.join(rel)).expect("read a directory") {
                let e = e.expect("a directory entry");
                let rel = rel.join(e.file_name());
                if e.file_type().expect("file type").is_dir() {
                    disk.dirs.insert(rel.clone());
                    walk(base, &rel, disk);
                } else {
                    disk.files.insert(rel.clone(), std::fs::read(base.join(&rel)).expect("read a file"));
                }
            }
        }
        let mut disk = Disk::default();
        walk(dir, Path::new(""), &mut disk);
        disk
    }

    /// This disk moved under `rel` (its parents made).
    pub fn under(&self, rel: &Path) -> Disk {
        let mut d = Disk::default();
        for a in rel.ancestors().filter(|a| !a.as_os_str().is_empty()) {
            d.dirs.insert(a.to_path_buf());
        }
        d.dirs.extend(self.dirs.iter().map(|p| rel.join(p)));
        d.files.extend(self.files.iter().map(|(p, b)| (rel.join(p), b.clone())));
        d
    }

    /// A hash of the whole disk, to start a broker once per distinct disk.
    pub fn digest(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.dirs.hash(&mut h);
        self.files.hash(&mut h);
        h.finish()
    }

    /// Names and lengths, for a failure message.
    pub fn listing(&self) -> String {
        let mut s = String::new();
        for d in &self.dirs {
            let _ = write!(s, "{}/ ", d.display());
        }
        for (p, b) in &self.files {
            let _ = write!(s, "{} ({} bytes) ", p.display(), b.len());
        }
        s
    }
}

impl Cut<'_> {
    /// Under `Journal`, how many of the pending directory operations a
    /// crash keeps at least: those before the last one a directory sync
    /// made durable (a journal commits in order).
    pub fn journal_kept_min(&self) -> usize {
        let last_durable =
            (0..self.dir_ops.len()).filter(|i| !self.pending_dir_ops.contains(i)).map(|i| self.dir_ops[i].seq).max();
        let Some(last) = last_durable else { return 0 };
        self.pending_dir_ops.iter().filter(|&&i| self.dir_ops[i].seq < last).count()
    }

    /// A pending change: the `i`th change of `node`.
    fn change(&self, (node, i): (NodeId, usize)) -> Change {
        self.nodes[node].changes[i].1.clone()
    }

    /// What the disk holds after a crash at this cut that makes `choices`.
    pub fn disk(&self, choices: &Choices) -> Disk {
        assert_eq!(choices.dir_ops.len(), self.pending_dir_ops.len(), "choices for another cut");
        assert_eq!(choices.changes.len(), self.pending_changes.len(), "choices for another cut");
        let dropped: BTreeSet<usize> =
            self.pending_dir_ops.iter().zip(&choices.dir_ops).filter(|(_, k)| !**k).map(|(i, _)| *i).collect();
        // The entries the disk holds: those it held when the run began,
        // then the kept operations, in order. An operation whose name is not as it found it (the
        // create before it was lost) changes nothing.
        let mut entries: HashMap<NodeId, BTreeMap<std::ffi::OsString, NodeId>> = HashMap::new();
        for (dir, name, node) in &self.initial {
            entries.entry(*dir).or_default().insert(name.clone(), *node);
        }
        for (i, d) in self.dir_ops.iter().enumerate() {
            if dropped.contains(&i) {
                continue;
            }
            let e = entries.entry(d.dir).or_default();
            match &d.change {
                DirChange::Link { name, node } => {
                    e.insert(name.clone(), *node);
                }
                DirChange::Unlink { name, node } => {
                    if e.get(name) == Some(node) {
                        e.remove(name);
                    }
                }
                DirChange::Rename { from, to, node } => {
                    if e.get(from) == Some(node) {
                        e.remove(from);
                        e.insert(to.clone(), *node);
                    }
                }
            }
        }
        let keeps: HashMap<(NodeId, usize), Keep> =
            self.pending_changes.iter().zip(&choices.changes).map(|(&c, &k)| (c, k)).collect();
        let mut disk = Disk::default();
        let mut stack = vec![(0usize, PathBuf::new())];
        while let Some((dir, rel)) = stack.pop() {
            for (name, &node) in entries.get(&dir).into_iter().flatten() {
                let path = rel.join(name);
                if self.nodes[node].entries.is_some() {
                    disk.dirs.insert(path.clone());
                    stack.push((node, path));
                } else {
                    disk.files.insert(path, self.contents(node, &keeps));
                }
            }
        }
        disk
    }

    /// A file's contents: its durable changes, then the pending ones as
    /// `keeps` says.
    fn contents(&self, node: NodeId, keeps: &HashMap<(NodeId, usize), Keep>) -> Vec<u8> {
        let mut file = self.nodes[node].initial.clone();
        for (i, (_, c)) in self.nodes[node].changes.iter().enumerate() {
            let keep = keeps.get(&(node, i)).copied().unwrap_or(Keep::Whole);
            keep.apply(c, self.trace, &mut file);
        }
        file
    }

    /// What `choices` chose, in words: the pending operations dropped and
    /// the pending changes not kept whole.
    pub fn describe(&self, choices: &Choices) -> String {
        let mut s = format!("cut {} (after {})", self.cut, self.trace.describe_op(self.cut.saturating_sub(1)));
        let dropped: Vec<String> = self
            .pending_dir_ops
            .iter()
            .zip(&choices.dir_ops)
            .filter(|(_, k)| !**k)
            .map(|(&i, _)| self.trace.describe_op(self.dir_ops[i].seq))
            .collect();
        let kept = choices.dir_ops.iter().filter(|k| **k).count();
        let _ = write!(s, "; directory operations not yet durable: {kept} kept, dropped [{}]", dropped.join(", "));
        let changes: Vec<String> = self
            .pending_changes
            .iter()
            .zip(&choices.changes)
            .filter(|(_, k)| **k != Keep::Whole)
            .map(|(&(n, i), k)| format!("{} {k:?}", self.trace.describe_op(self.nodes[n].changes[i].0)))
            .collect();
        let whole = choices.changes.iter().filter(|k| **k == Keep::Whole).count();
        let _ = write!(s, "; unsynced changes: {whole} kept whole, the others [{}]", changes.join(", "));
        s
    }
}
