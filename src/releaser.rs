//! Giving back a removed segment's space, off the loop thread.
//!
//! Freeing a file's blocks waits for the disk: on a filesystem mounted with
//! `discard` each `ftruncate` that frees blocks sends the device a discard
//! and waits for it, 0.2 ms on an idle disk here and 3–4 ms when other
//! writers keep it busy, whatever the size of the slice. On the loop thread
//! that was a stall of every connection at each slice of every removed
//! segment (bench/README.md, "The non-durable tail"). So the log renames a
//! removed segment's file out of the log on the loop (a rename frees
//! nothing) and hands it here: one thread, started at the first removal,
//! cuts each file from its end in slices (so that no single call holds the
//! filesystem's allocator long while the loop's writes need it) and then
//! unlinks it, as Kafka deletes segments and RocksDB deletes obsolete files
//! in the background.
//!
//! It keeps a bounded queue of files: the log asks `full` before removing
//! another (compaction waits then). A stop waits for the call in progress
//! and no more: the thread leaves the file it is cutting and those queued,
//! and the next start deletes every `….log.removing` file (once the log is
//! gone the thread is too, so it never races that start). It touches only
//! the files handed to it; errors are logged and the file left to the next
//! start.

use std::fs::{self, File};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;

/// Bytes of a file cut per call: small enough that one call frees little
/// at a time (a 64 MiB unlink took 14 ms in one call here), large enough
/// that a segment takes a few hundred calls.
pub(super) const RELEASE_SLICE_BYTES: u64 = 256 << 10;
/// Files waiting for the thread, at most: compaction removes a segment only
/// after writing one's worth of log, so more waiting means the disk frees
/// slower than the log is written, and compaction waits for it rather than
/// queueing without bound.
const QUEUED_FILES_MAX: usize = 4;

/// A removed segment's file to release.
struct Job {
    /// The file, open for writing.
    file: File,
    /// Its name (`….log.removing`), to unlink once it is empty.
    path: PathBuf,
    /// Its length, bytes.
    len_bytes: u64,
}

/// The loop's side of the release thread.
#[derive(Default)]
pub(super) struct Releaser {
    /// Where files are handed to the thread; None until the first one.
    jobs: Option<SyncSender<Job>>,
    /// Files handed over and not yet released.
    pending: Arc<AtomicUsize>,
    /// Set when the log goes: the thread stops after its current call.
    stop: Arc<AtomicBool>,
    /// The thread, joined when the log goes.
    thread: Option<JoinHandle<()>>,
}

impl Releaser {
    /// Hands `file`, named `path`, of `len_bytes`, to the thread. Gives it
    /// back if the thread cannot take it (its queue is full, or it cannot
    /// be started): the caller removes it at once.
    pub(super) fn hand_over(&mut self, file: File, path: PathBuf, len_bytes: u64) -> Result<(), (File, PathBuf)> {
        if self.jobs.is_none() {
            let (tx, rx) = sync_channel(QUEUED_FILES_MAX);
            let (pending, stop) = (self.pending.clone(), self.stop.clone());
            let started = std::thread::Builder::new()
                .name("runnel-release".into())
                .spawn(move || release_all(rx, &pending, &stop));
            match started {
                Ok(thread) => self.thread = Some(thread),
                Err(e) => {
                    log::warn!("cannot start the thread that releases removed segments: {e}; removing them at once");
                    return Err((file, path));
                }
            }
            self.jobs = Some(tx);
        }
        let Some(jobs) = &self.jobs else { return Err((file, path)) };
        self.pending.fetch_add(1, Ordering::AcqRel);
        match jobs.try_send(Job { file, path, len_bytes }) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => {
                self.pending.fetch_sub(1, Ordering::AcqRel);
                Err((job.file, job.path))
            }
        }
    }

    /// Whether the thread holds as many files as it queues: compaction
    /// removes no other segment until it has released one.
    pub(super) fn full(&self) -> bool {
        self.pending.load(Ordering::Acquire) > QUEUED_FILES_MAX
    }

    /// Files handed over and not yet released.
    pub(super) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }
}

impl Drop for Releaser {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Closing the queue wakes a thread that waits for a file.
        self.jobs = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            log::warn!("the thread that releases removed segments panicked");
        }
    }
}

/// The thread: releases each file handed over, in order, until the log
/// goes.
fn release_all(jobs: Receiver<Job>, pending: &AtomicUsize, stop: &AtomicBool) {
    for job in jobs {
        if stop.load(Ordering::Acquire) {
            return;
        }
        release(job, stop);
        pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Cuts `job`'s file from its end a slice at a time, then unlinks it. On a
/// stop or an error the file stays for the next start to delete.
fn release(job: Job, stop: &AtomicBool) {
    let mut len = job.len_bytes;
    while len > 0 {
        if stop.load(Ordering::Acquire) {
            return;
        }
        len = len.saturating_sub(RELEASE_SLICE_BYTES);
        if let Err(e) = job.file.set_len(len) {
            log::warn!("cannot release {}: {e}; the next start deletes it", job.path.display());
            return;
        }
    }
    drop(job.file);
    if let Err(e) = fs::remove_file(&job.path) {
        log::warn!("cannot remove {}: {e}; the next start deletes it", job.path.display());
    }
}
