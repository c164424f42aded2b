//! What opening the log reports and replays into: the `Replayer` that
//! recovery reads the records into, why a start stopped (`OpenError`),
//! and what recovery found (`Recovery`).

use std::io;
use std::path::PathBuf;

use super::{Damage, Inspection, ReadRecord};

/// What recovery reads the records into, in log order.
pub trait Replayer {
    /// Whether the log is read twice: every record into `scan` first,
    /// then every record into `apply`.
    fn scans(&self) -> bool {
        false
    }
    /// A record of the first pass, which reads each segment up to its first
    /// record that is not valid, stepping over Produce and Dedup records
    /// without checking them (recovery.rs, `scan_records`). Records that
    /// do not decode are for `apply` to refuse.
    fn scan(&mut self, _r: &ReadRecord<'_>) {}
    /// A record of the (second) pass: an error stops the start.
    fn apply(&mut self, r: &ReadRecord<'_>) -> Result<(), String>;
}

/// A closure as a `Replayer` that reads the log once.
pub(super) struct Applier<F>(pub(super) F);

impl<F: FnMut(&ReadRecord<'_>) -> Result<(), String>> Replayer for Applier<F> {
    fn apply(&mut self, r: &ReadRecord<'_>) -> Result<(), String> {
        (self.0)(r)
    }
}

/// Why recovery stopped.
#[derive(Debug)]
pub enum OpenError {
    /// Another process holds the directory (its path).
    Locked(PathBuf),
    Io(PathBuf, io::Error),
    /// The log is damaged in a way a start does not cut on its own: the
    /// first damage found (a segment's file and byte offset; for a gap, the
    /// file after it at offset 0), and what a full read found, which is
    /// what `--repair` would drop.
    Corrupt {
        file: PathBuf,
        offset: u64,
        why: String,
        report: Option<Box<Inspection>>,
    },
    /// The broker could not apply a record.
    Apply {
        file: PathBuf,
        offset: u64,
        why: String,
    },
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Locked(p) => {
                write!(
                    f,
                    "data directory {} is locked by another runnel process; stop it or use another --data",
                    p.display()
                )
            }
            OpenError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            OpenError::Corrupt { file, offset, why, report } => {
                writeln!(f, "commit log corrupt in {} at byte {offset}: {why}", file.display())?;
                if let Some(r) = report {
                    write!(f, "{}", r.damage_text())?;
                }
                write!(
                    f,
                    "start with --repair to drop the damaged bytes and keep every valid record (docs/log-format.md, \"Repair\", says what dropping a record means), or with --repair --dry-run to see this again without changing anything"
                )
            }
            OpenError::Apply { file, offset, why } => {
                write!(f, "commit log record in {} at byte {offset} cannot be applied: {why}", file.display())
            }
        }
    }
}

impl std::error::Error for OpenError {}

/// What recovery found.
#[derive(Clone, Debug, Default)]
pub struct Recovery {
    pub records: u64,
    pub bytes: u64,
    pub segments: usize,
    /// Bytes cut from the tail of the last segment (a torn write, and the
    /// space reserved after it).
    pub truncated_bytes: u64,
    /// Bytes dropped by --repair (damaged stretches of segment files).
    pub repaired_bytes: u64,
    /// The first damaged or missing stretches --repair found (listed up to
    /// a bound; `repaired_bytes` counts them all).
    pub damage: Vec<Damage>,
    /// Whether the previous run stopped cleanly (its marker was found and
    /// the log matched it).
    pub clean_stop: bool,
    pub millis: u64,
}

impl Recovery {
    /// What recovery found in `data_dir`, in a line (the broker logs it at
    /// start).
    pub fn summary(&self, data_dir: &std::path::Path) -> String {
        format!(
            "recovered {} records, {} bytes in {} segments from {} in {} ms; the last run {}{}",
            self.records,
            self.bytes,
            self.segments,
            data_dir.display(),
            self.millis,
            if self.clean_stop { "stopped cleanly" } else { "may have crashed" },
            if self.truncated_bytes > 0 {
                format!(" (cut a torn tail of {} bytes)", self.truncated_bytes)
            } else {
                String::new()
            }
        )
    }
}
