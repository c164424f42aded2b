//! The disk the servers' data lives on, measured without a broker: each
//! sync of a 4 KiB append (what a durable produce cannot beat), and what a
//! message arriving at a random moment would wait on those syncs run back
//! to back, where a rare long sync weighs by its length.

use std::time::Duration;

use crate::latency::{Latency, Samples};
use crate::sys;
use crate::workload::Scale;

/// Arrivals the back-to-back model of the disk probe places over its syncs.
const PROBE_ARRIVALS: usize = 100_000;

/// The disk's own fdatasync latency, measured in the same directory the
/// servers use: what a durable produce cannot beat. Also what a message
/// arriving at a random moment would wait on those syncs run back to back
/// (`back_to_back_waits`): the bound for a durable broker whose
/// syncs run one after another, as at W3's 10k msgs/s.
pub fn fsync_probe(scale: &Scale) -> Result<(Latency, Option<Latency>), String> {
    let dir = crate::server::temp_dir("fdatasync")?;
    let samples = sys::fdatasync_probe(&dir, scale.fsync_probe_rounds, Duration::from_secs(10))
        .map_err(|e| format!("fdatasync probe in {}: {e}", dir.display()));
    let _ = std::fs::remove_dir_all(&dir);
    let samples = samples?;
    let waits = back_to_back_waits(&samples, PROBE_ARRIVALS)
        .summarize("a message arriving at random on those syncs back to back: the sync in progress, then its own");
    let mut s = Samples::default();
    for v in samples {
        s.push(v);
    }
    let syncs = s.summarize("4 KiB write + fdatasync").ok_or("fdatasync probe took no samples")?;
    Ok((syncs, waits))
}

/// What a message arriving at a uniformly random moment waits on a disk
/// synced back to back with these sync times (in order): the rest of the
/// sync in progress, then the sync that covers it. Every durable broker
/// that acknowledges after a sync waits at least this, and a message is
/// more likely to arrive during a long sync than a short one, so its
/// percentiles sit above the syncs' own (the waiting-time paradox).
/// `arrivals` evenly spaced moments over all but the last sync; empty if
/// there are fewer than two syncs.
pub fn back_to_back_waits(syncs_ns: &[u64], arrivals: usize) -> Samples {
    let mut out = Samples::default();
    if syncs_ns.len() < 2 || arrivals == 0 {
        return out;
    }
    // ends[i]: when sync i ends, from the start of the first.
    let ends: Vec<u64> = syncs_ns
        .iter()
        .scan(0u64, |t, &d| {
            *t += d;
            Some(*t)
        })
        .collect();
    let span = ends[ends.len() - 2] as f64;
    for k in 0..arrivals {
        let at = ((k as f64 + 0.5) * span / arrivals as f64) as u64;
        // The sync in progress at `at`: the first that ends after it.
        let i = ends.partition_point(|&e| e <= at).min(ends.len() - 2);
        out.push(ends[i] - at + syncs_ns[i + 1]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_to_back_waits_weigh_each_sync_by_its_time() {
        // Equal syncs of 100: the rest of one (0 to 100) then another.
        let l = back_to_back_waits(&[100; 11], 1000).summarize("w").expect("samples");
        assert_eq!((l.count, l.p50_ns, l.max_ns), (1000, 150, 200));
        // Nine syncs of 1 and one of 91 (then one of 1): the long one is
        // 1% of the syncs and 91% of the time, so most arrivals wait in it.
        let mut syncs = vec![1; 9];
        syncs.extend([91, 1]);
        let l = back_to_back_waits(&syncs, 1000).summarize("w").expect("samples");
        assert!(l.p50_ns > 40 && l.p99_ns > 85, "{l:?}");
        assert!(back_to_back_waits(&[5], 10).summarize("w").is_none());
    }
}
