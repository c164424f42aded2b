//! runnel's `/metrics` as the bench reads it: a histogram's cumulative
//! bucket counts, read before and after a window of a run, give how many
//! events the window had and the buckets its p99 and its longest fall in.
//! W10 reads the loop's turn times; W3's durable runnel rows read each
//! turn's write + fdatasync, the disk as runnel met it during the row.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

/// The loop's turn times.
pub const TURNS: &str = "runnel_loop_turn_duration_seconds";
/// Each turn's write plus fdatasync of its records.
pub const FSYNCS: &str = "runnel_fsync_duration_seconds";

/// The port runnel serves `/metrics` on (`args` picks a free one when the
/// server's arguments are made; one server runs at a time).
static PORT: AtomicU16 = AtomicU16::new(0);

/// The flags that start runnel with `/metrics` on a free local port.
pub fn args() -> Vec<String> {
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_or(0, |a| a.port());
    PORT.store(port, Ordering::Relaxed);
    vec!["--metrics".into(), format!("127.0.0.1:{port}")]
}

/// Where runnel serves `/metrics` (after `args`).
pub fn addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], PORT.load(Ordering::Relaxed)))
}

/// One whole scrape of `/metrics`: the exposition, without the response's
/// head (an HTTP/1.0 request, so the body ends with the connection).
pub fn scrape() -> Result<String, String> {
    let addr = addr();
    let mut s = TcpStream::connect(addr).map_err(|e| format!("runnel /metrics at {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| format!("/metrics: {e}"))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: runnel\r\n\r\n").map_err(|e| format!("/metrics: {e}"))?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| format!("/metrics: {e}"))?;
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => Err(format!("/metrics answered {:?}", text.lines().next().unwrap_or(""))),
    }
}

/// The cumulative counts of histogram `name`, by upper bound (s).
pub fn histogram(name: &str) -> Result<Vec<(f64, u64)>, String> {
    let text = scrape()?;
    let prefix = format!("{name}_bucket{{le=\"");
    let mut out = Vec::new();
    for line in text.lines().filter_map(|l| l.strip_prefix(prefix.as_str())) {
        let Some((le, count)) = line.split_once("\"} ") else { continue };
        let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().map_err(|_| format!("/metrics: {le:?}"))? };
        out.push((bound, count.trim().parse().map_err(|_| format!("/metrics: {count:?}"))?));
    }
    if out.is_empty() {
        return Err(format!("runnel /metrics has no histogram {name}"));
    }
    Ok(out)
}

/// What a histogram counted between two readings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// Events.
    pub count: u64,
    /// Upper bound (s) of the bucket holding their p99.
    pub p99_s: f64,
    /// Upper bound (s) of the bucket holding the longest.
    pub max_s: f64,
    /// Events over `OVER_S`.
    pub over: u64,
}

/// The bound `Window::over` counts above, s.
pub const OVER_S: f64 = 0.01;

/// From two readings of one histogram, `before` and `after`.
pub fn between(before: &[(f64, u64)], after: &[(f64, u64)]) -> Window {
    let counts: Vec<(f64, u64)> = after.iter().zip(before).map(|(a, b)| (a.0, a.1.saturating_sub(b.1))).collect();
    let count = counts.last().map_or(0, |c| c.1);
    let p99_at = count - count / 100;
    let p99_s = counts.iter().find(|c| c.1 >= p99_at.max(1)).map_or(0.0, |c| c.0);
    let max_s = counts.iter().find(|c| c.1 >= count).map_or(0.0, |c| c.0);
    let within = counts.iter().filter(|c| c.0 <= OVER_S).map(|c| c.1).max().unwrap_or(0);
    Window { count, p99_s, max_s, over: count.saturating_sub(within) }
}

/// A bucket bound for the report: µs below 1 ms, else ms.
pub fn seconds_label(s: f64) -> String {
    if s.is_infinite() {
        "+Inf".into()
    } else if s < 1e-3 {
        format!("{:.0} µs", s * 1e6)
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_comes_from_the_bucket_differences() {
        let before = [(0.0001, 10), (0.001, 20), (0.01, 20), (f64::INFINITY, 20)];
        // 200 events between the readings: 198 under 100 µs, 1 under 1 ms,
        // 1 under 10 ms.
        let after = [(0.0001, 208), (0.001, 219), (0.01, 220), (f64::INFINITY, 220)];
        assert_eq!(between(&before, &after), Window { count: 200, p99_s: 0.0001, max_s: 0.01, over: 0 });
        // Two more over 10 ms.
        let later = [(0.0001, 208), (0.001, 219), (0.01, 220), (f64::INFINITY, 222)];
        let w = between(&before, &later);
        assert_eq!((w.count, w.max_s, w.over), (202, f64::INFINITY, 2));
    }
}
