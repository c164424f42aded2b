//! Prometheus metrics: latency histograms, the text exposition format, and
//! the tiny HTTP/1.x request parser the reactor's metrics listener uses.
//!
//! No HTTP framework and no thread: the reactor accepts metrics connections
//! on its own poll loop, hands the bytes of a request to `parse_request`,
//! and writes what `respond` returns. Everything here is pure: it never
//! touches a socket or reads a clock.

use std::fmt::Write as _;

use crate::broker::{Broker, Now, TopicMetrics};

/// Upper bounds of the latency histogram buckets, in nanoseconds: 50 µs to
/// 1 s, dense where a durable broker lives (an fdatasync takes 0.1–10 ms).
const BUCKETS_NS: [u64; 14] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
];

/// A fixed-bucket latency histogram.
#[derive(Clone, Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is +Inf.
    counts: [u64; BUCKETS_NS.len() + 1],
    /// Sum of observations, ns.
    sum_ns: u64,
    /// Number of observations.
    count: u64,
}

impl Histogram {
    /// Records `n` observations of `ns` nanoseconds each.
    pub fn observe(&mut self, ns: u64, n: u64) {
        let i = BUCKETS_NS.partition_point(|b| *b < ns);
        self.counts[i] += n;
        self.sum_ns = self.sum_ns.saturating_add(ns.saturating_mul(n));
        self.count += n;
    }
    pub fn count(&self) -> u64 {
        self.count
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, bound) in BUCKETS_NS.iter().enumerate() {
            cumulative += self.counts[i];
            let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cumulative}", seconds(*bound));
        }
        cumulative += self.counts[BUCKETS_NS.len()];
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum {}", seconds(self.sum_ns));
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

fn seconds(ns: u64) -> String {
    let s = format!("{:.9}", ns as f64 / 1e9);
    let s = s.trim_end_matches('0');
    s.strip_suffix('.').map_or_else(|| s.to_string(), |s| s.to_string())
}

/// What the reactor measures about itself.
#[derive(Clone, Debug, Default)]
pub struct LoopMetrics {
    /// Write + fdatasync of each turn's records.
    pub fsync: Histogram,
    /// From the start of the turn a PRODUCE was read in to the release of
    /// its reply, after the sync.
    pub produce_ack: Histogram,
}

/// Escapes a label value (topic names are `[A-Za-z0-9._-]`, but be exact).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

/// A per-topic metric family: name, type, help, and how to read it.
type Family = (&'static str, &'static str, &'static str, fn(&TopicMetrics) -> u64);

/// Renders every metric in the Prometheus text exposition format 0.0.4.
pub fn render(broker: &Broker, lm: &LoopMetrics, now: Now) -> String {
    let mut out = String::with_capacity(4096);
    let s = &broker.stats;
    let log = broker.log();
    metric(&mut out, "runnel_connections", "gauge", "Open client connections.", s.connections);
    metric(&mut out, "runnel_loop_turns_total", "counter", "Turns of the event loop.", s.turns);
    metric(&mut out, "runnel_received_bytes_total", "counter", "Bytes read from clients.", s.bytes_in);
    metric(&mut out, "runnel_sent_bytes_total", "counter", "Bytes written to clients.", s.bytes_out);
    metric(
        &mut out,
        "runnel_buffered_bytes",
        "gauge",
        "Bytes the client connections' input and output buffers take (bounded by buffered_bytes_max).",
        s.buffered_bytes,
    );
    metric(
        &mut out,
        "runnel_busy_replies_total",
        "counter",
        "Requests answered BUSY because the connection buffers were full.",
        s.busy_replies,
    );
    metric(&mut out, "runnel_fsyncs_total", "counter", "fdatasync calls on the commit log.", log.stats.fsyncs);
    metric(&mut out, "runnel_log_bytes", "gauge", "Bytes in the commit log's segments.", log.bytes());
    metric(&mut out, "runnel_log_segments", "gauge", "Segment files of the commit log.", log.segments().len() as u64);
    metric(
        &mut out,
        "runnel_log_compactions_total",
        "counter",
        "Segments removed by compaction.",
        broker.compactions(),
    );
    metric(
        &mut out,
        "runnel_storage_failures_total",
        "counter",
        "Failed commit-log writes or syncs.",
        log.stats.failures,
    );
    metric(&mut out, "runnel_topics", "gauge", "Topics, dead-letter topics included.", broker.topic_count() as u64);
    let _ = writeln!(
        out,
        "# HELP runnel_recovery_seconds Time the last start took to replay the log.\n# TYPE runnel_recovery_seconds gauge\nrunnel_recovery_seconds {}",
        seconds(s.recovery_ms * 1_000_000)
    );
    lm.fsync.render(&mut out, "runnel_fsync_duration_seconds", "Write plus fdatasync of one turn's records.");
    lm.produce_ack.render(
        &mut out,
        "runnel_produce_ack_latency_seconds",
        "From the turn a PRODUCE was read in to its acknowledgement.",
    );
    let topics = broker.topic_metrics(now);
    let families: [Family; 12] = [
        ("runnel_topic_ready_messages", "gauge", "Messages ready for delivery.", |t| t.ready),
        ("runnel_topic_inflight_messages", "gauge", "Messages delivered and not acknowledged.", |t| t.inflight),
        ("runnel_topic_delayed_messages", "gauge", "Messages NACKed with a delay.", |t| t.delayed),
        ("runnel_topic_dead_letter_messages", "gauge", "Messages in the topic's .dlq topic.", |t| t.dead_letter),
        ("runnel_topic_bytes", "gauge", "Payload bytes of unacknowledged messages.", |t| t.bytes),
        ("runnel_topic_produced_total", "counter", "Messages produced.", |t| t.counters.produced),
        ("runnel_topic_delivered_total", "counter", "Deliveries, redeliveries included.", |t| t.counters.delivered),
        ("runnel_topic_redelivered_total", "counter", "Deliveries after the first.", |t| t.counters.redelivered),
        ("runnel_topic_acked_total", "counter", "Messages acknowledged.", |t| t.counters.acked),
        ("runnel_topic_nacked_total", "counter", "Deliveries NACKed.", |t| t.counters.nacked),
        ("runnel_topic_expired_total", "counter", "Ack deadlines that passed.", |t| t.counters.expired),
        ("runnel_topic_dead_lettered_total", "counter", "Messages moved to the .dlq topic.", |t| {
            t.counters.dead_lettered
        }),
    ];
    for (name, kind, help, get) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for t in &topics {
            let _ = writeln!(out, "{name}{{topic=\"{}\"}} {}", label(&t.name), get(t));
        }
    }
    let name = "runnel_topic_oldest_unacked_age_seconds";
    let _ = writeln!(out, "# HELP {name} Age of the oldest unacknowledged message (0 when none).\n# TYPE {name} gauge");
    for t in &topics {
        let _ = writeln!(out, "{name}{{topic=\"{}\"}} {}", label(&t.name), seconds(t.oldest_age_ms * 1_000_000));
    }
    out
}

/// A request the metrics listener understood, or why not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpRequest {
    Metrics,
    Health,
    /// The status to answer with: 400, 404, 405, 431, 505.
    Refused(u16),
}

/// Largest request head the metrics listener buffers.
pub const HTTP_REQUEST_BYTES_MAX: usize = 8 << 10;

/// Parses the head of an HTTP/1.x request, if it has arrived whole.
pub fn parse_request(buf: &[u8]) -> Option<HttpRequest> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return (buf.len() >= HTTP_REQUEST_BYTES_MAX).then_some(HttpRequest::Refused(431));
    };
    let head = &buf[..end];
    let line = head.split(|b| *b == b'\n').next().unwrap_or(&[]);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.split(|b| *b == b' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Some(HttpRequest::Refused(400));
    };
    if !version.starts_with(b"HTTP/1.") {
        return Some(HttpRequest::Refused(if version.starts_with(b"HTTP/") { 505 } else { 400 }));
    }
    if method != b"GET" && method != b"HEAD" {
        return Some(HttpRequest::Refused(405));
    }
    let path = target.split(|b| *b == b'?').next().unwrap_or(&[]);
    Some(match path {
        b"/metrics" => HttpRequest::Metrics,
        b"/healthz" => HttpRequest::Health,
        _ => HttpRequest::Refused(404),
    })
}

/// A whole HTTP/1.1 response that closes the connection.
pub fn response(status: u16, content_type: &str, body: &str) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_parsed_or_refused() {
        assert_eq!(parse_request(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Some(HttpRequest::Metrics));
        assert_eq!(parse_request(b"GET /healthz?x=1 HTTP/1.0\r\n\r\n"), Some(HttpRequest::Health));
        assert_eq!(parse_request(b"GET /metrics HTTP/1.1\r\nHost"), None);
        assert_eq!(parse_request(b"POST /metrics HTTP/1.1\r\n\r\n"), Some(HttpRequest::Refused(405)));
        assert_eq!(parse_request(b"GET /nope HTTP/1.1\r\n\r\n"), Some(HttpRequest::Refused(404)));
        assert_eq!(parse_request(b"garbage\r\n\r\n"), Some(HttpRequest::Refused(400)));
        assert_eq!(parse_request(b"GET / HTTP/2\r\n\r\n"), Some(HttpRequest::Refused(505)));
        assert_eq!(parse_request(&[b'a'; HTTP_REQUEST_BYTES_MAX]), Some(HttpRequest::Refused(431)));
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::default();
        h.observe(40_000, 1);
        h.observe(50_000, 1);
        h.observe(3_000_000, 2);
        h.observe(5_000_000_000, 1);
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.00005\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.005\"} 4\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"1\"} 4\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 5\n"), "{out}");
        assert!(out.contains("x_count 5\n"), "{out}");
        assert_eq!(seconds(1_500_000_000), "1.5");
        assert_eq!(seconds(0), "0");
    }
}
