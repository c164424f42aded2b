//! Prometheus metrics: latency histograms and the text exposition format,
//! which the metrics listener (`http.rs`) serves.
//!
//! Everything here is pure: it never touches a socket or reads a clock.

use std::fmt::Write as _;

use crate::broker::{Broker, GroupMetrics, LoopStats, Now, TopicId, TopicMetrics};

/// Upper bounds of the latency histogram buckets, in nanoseconds: 10 µs to
/// 1 s, dense where a durable broker lives (an fdatasync takes 0.1–10 ms),
/// and fine enough below that to tell a loop turn's usual tens of µs from
/// a stall.
const BUCKETS_NS: [u64; 16] = [
    10_000,
    25_000,
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
        self.render_series(out, name, "");
    }

    /// The samples of one series of the family `name`; `labels` is empty
    /// or `key="value",` (with the comma) to go before `le`.
    fn render_series(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, bound) in BUCKETS_NS.iter().enumerate() {
            cumulative += self.counts[i];
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{}\"}} {cumulative}", seconds(*bound));
        }
        cumulative += self.counts[BUCKETS_NS.len()];
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {cumulative}");
        let braced = labels.strip_suffix(',').map_or(String::new(), |l| format!("{{{l}}}"));
        let _ = writeln!(out, "{name}_sum{braced} {}", seconds(self.sum_ns));
        let _ = writeln!(out, "{name}_count{braced} {}", self.count);
    }
}

fn seconds(ns: u64) -> String {
    let s = format!("{:.9}", ns as f64 / 1e9);
    let s = s.trim_end_matches('0');
    s.strip_suffix('.').map_or_else(|| s.to_string(), |s| s.to_string())
}

/// The parts of a loop turn that can stall it, each timed on its own so
/// that an operator who sees a slow turn can see its cause. Each is a call
/// into the kernel on the log's files, or compaction's own work; together
/// they are disjoint, and the rest of a turn (reading, decoding and serving
/// requests, timers, writing replies) is "other".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The `write` of the turn's records into the log.
    Write,
    /// The `fdatasync` that makes them durable.
    Fsync,
    /// Reserving the active segment's space ahead of the writes
    /// (`fallocate`), and the free-space check that goes with it
    /// (`fstatvfs`).
    Reserve,
    /// Closing a full segment and creating the next (cutting its reserved
    /// tail, its `fdatasync`, the new file and the directory's sync).
    Roll,
    /// Removing a compacted segment's file from the log: a rename, the
    /// hand-over to the release thread (or, on a short disk, the unlink).
    Release,
    /// Compaction's own work: finding live messages and copying a slice of
    /// them (its writes and syncs count under Write and Fsync).
    Compact,
}

impl Phase {
    pub const ALL: [Phase; 6] =
        [Phase::Write, Phase::Fsync, Phase::Reserve, Phase::Roll, Phase::Release, Phase::Compact];

    /// Its name as the `phase` label gives it.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Write => "write",
            Phase::Fsync => "fsync",
            Phase::Reserve => "reserve",
            Phase::Roll => "roll",
            Phase::Release => "release",
            Phase::Compact => "compact",
        }
    }
}

/// How long each phase took in one turn, ns (0: it did not run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseNanos([u64; Phase::ALL.len()]);

impl PhaseNanos {
    pub fn add(&mut self, phase: Phase, ns: u64) {
        self.0[phase as usize] += ns;
    }
    pub fn get(&self, phase: Phase) -> u64 {
        self.0[phase as usize]
    }
    /// Every phase together, ns.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
    /// Adds every phase of `other`.
    pub fn merge(&mut self, other: &PhaseNanos) {
        for p in Phase::ALL {
            self.add(p, other.get(p));
        }
    }
}

/// A turn that takes longer than this is slow: counted by what took most of
/// it. A millisecond is some ten times a busy turn here, and what a
/// client at depth 1 notices.
pub const SLOW_TURN_NS: u64 = 1_000_000;

/// What the reactor measures about itself.
#[derive(Clone, Debug, Default)]
pub struct LoopMetrics {
    /// Write + fdatasync of each turn's records.
    pub fsync: Histogram,
    /// From the start of the turn a PRODUCE was read in to the release of
    /// its reply, after the sync.
    pub produce_ack: Histogram,
    /// Each turn, from the end of its poll to the end of its flush.
    pub turn: Histogram,
    /// Each phase's time in the turns it ran in, by `Phase`.
    pub phases: [Histogram; Phase::ALL.len()],
    /// Turns over `SLOW_TURN_NS`, by the part that took longest: the
    /// phases in `Phase` order, then "other".
    pub slow_turns: [u64; Phase::ALL.len() + 1],
}

impl LoopMetrics {
    /// Records a turn that took `turn_ns`, `phases` of it in the phases.
    pub fn observe_turn(&mut self, turn_ns: u64, phases: &PhaseNanos) {
        self.turn.observe(turn_ns, 1);
        for p in Phase::ALL {
            if phases.get(p) > 0 {
                self.phases[p as usize].observe(phases.get(p), 1);
            }
        }
        if turn_ns > SLOW_TURN_NS {
            let other = turn_ns.saturating_sub(phases.total());
            let longest = Phase::ALL.iter().copied().max_by_key(|p| phases.get(*p));
            let slot = match longest {
                Some(p) if phases.get(p) >= other => p as usize,
                _ => Phase::ALL.len(),
            };
            self.slow_turns[slot] += 1;
        }
    }

    /// The turn histogram, the phases' and the slow turns' counters.
    fn render_turns(&self, out: &mut String) {
        self.turn.render(
            out,
            "runnel_loop_turn_duration_seconds",
            "Each turn of the event loop, from the end of its poll to the end of its flush.",
        );
        let name = "runnel_loop_phase_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time a turn spent in each part that can stall it, in the turns it ran in.\n# TYPE {name} histogram"
        );
        for p in Phase::ALL {
            self.phases[p as usize].render_series(out, name, &format!("phase=\"{}\",", p.name()));
        }
        let name = "runnel_loop_slow_turns_total";
        let _ = writeln!(
            out,
            "# HELP {name} Turns over 1 ms, by the phase that took longest (other: requests, timers, replies).\n# TYPE {name} counter"
        );
        let names = Phase::ALL.iter().map(|p| p.name()).chain(std::iter::once("other"));
        for (name_of, n) in names.zip(self.slow_turns) {
            let _ = writeln!(out, "{name}{{phase=\"{name_of}\"}} {n}");
        }
    }
}

/// Escapes a label value (topic names are `[A-Za-z0-9._-]`, but be exact).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

/// What a scrape renders from: the broker and the loop as they stand in
/// the turn at hand.
pub struct Source<'a> {
    pub broker: &'a Broker,
    pub loops: &'a LoopStats,
    pub lm: &'a LoopMetrics,
    pub now: Now,
}

/// A sample's value: a count, or a time in ns (rendered in seconds).
#[derive(Clone, Copy)]
enum Value {
    Count(u64),
    Nanos(u64),
}

/// A per-topic metric family: name, type, help, and how to read it.
type Family = (&'static str, &'static str, &'static str, fn(&TopicMetrics) -> Value);

/// The per-topic families, one sample per topic in each.
const TOPIC_FAMILIES: [Family; 14] = [
    ("runnel_topic_ready_messages", "gauge", "Messages ready for delivery.", |t| Value::Count(t.ready)),
    ("runnel_topic_inflight_messages", "gauge", "Messages delivered and not acknowledged.", |t| {
        Value::Count(t.inflight)
    }),
    ("runnel_topic_delayed_messages", "gauge", "Messages NACKed with a delay.", |t| Value::Count(t.delayed)),
    ("runnel_topic_dead_letter_messages", "gauge", "Messages in the topic's .dlq topic.", |t| {
        Value::Count(t.dead_letter)
    }),
    ("runnel_topic_bytes", "gauge", "Payload and property bytes of unacknowledged messages.", |t| {
        Value::Count(t.bytes)
    }),
    ("runnel_topic_tag_sets", "gauge", "Distinct tag sets among the messages.", |t| Value::Count(t.tag_sets)),
    ("runnel_topic_produced_total", "counter", "Messages produced.", |t| Value::Count(t.counters.produced)),
    ("runnel_topic_delivered_total", "counter", "Deliveries, redeliveries included.", |t| {
        Value::Count(t.counters.delivered)
    }),
    ("runnel_topic_redelivered_total", "counter", "Deliveries after the first.", |t| {
        Value::Count(t.counters.redelivered)
    }),
    ("runnel_topic_acked_total", "counter", "Messages acknowledged.", |t| Value::Count(t.counters.acked)),
    ("runnel_topic_nacked_total", "counter", "Deliveries NACKed.", |t| Value::Count(t.counters.nacked)),
    ("runnel_topic_expired_total", "counter", "Ack deadlines that passed.", |t| Value::Count(t.counters.expired)),
    ("runnel_topic_dead_lettered_total", "counter", "Messages moved to the .dlq topic.", |t| {
        Value::Count(t.counters.dead_lettered)
    }),
    (
        "runnel_topic_oldest_unacked_age_seconds",
        "gauge",
        "Age of the oldest unacknowledged message (0 when none).",
        |t| Value::Nanos(t.oldest_age_ms * 1_000_000),
    ),
];

/// A per-group metric family: name, type, help, and how to read it.
type GroupFamily = (&'static str, &'static str, &'static str, fn(&GroupMetrics) -> Value);

/// The per-group families, one sample per consumer group in each,
/// labelled with its topic and its name (empty for the default group).
const GROUP_FAMILIES: [GroupFamily; 11] = [
    ("runnel_group_lag_messages", "gauge", "Messages not yet delivered to the group.", |g| Value::Count(g.stats.lag)),
    ("runnel_group_inflight_messages", "gauge", "Messages delivered and not acknowledged.", |g| {
        Value::Count(g.stats.inflight)
    }),
    ("runnel_group_retry_messages", "gauge", "Messages waiting for redelivery.", |g| Value::Count(g.stats.retry)),
    ("runnel_group_delayed_messages", "gauge", "Messages NACKed with a delay.", |g| Value::Count(g.stats.delayed)),
    ("runnel_group_consumers", "gauge", "Connections consuming from the group.", |g| {
        Value::Count(g.stats.consumers.into())
    }),
    ("runnel_group_dead_lettered_total", "counter", "Messages the group dead-lettered.", |g| {
        Value::Count(g.stats.dead_lettered)
    }),
    ("runnel_group_delivered_total", "counter", "Deliveries, redeliveries included.", |g| {
        Value::Count(g.counters.delivered)
    }),
    ("runnel_group_redelivered_total", "counter", "Deliveries after the first.", |g| {
        Value::Count(g.counters.redelivered)
    }),
    ("runnel_group_acked_total", "counter", "Messages acknowledged.", |g| Value::Count(g.counters.acked)),
    ("runnel_group_filtered_total", "counter", "Messages the group's tag filter passed over.", |g| {
        Value::Count(g.counters.filtered)
    }),
    (
        "runnel_group_oldest_unacked_age_seconds",
        "gauge",
        "Age of the oldest message in flight to the group (0 when none).",
        |g| Value::Nanos(g.stats.oldest_unacked_age_ms * 1_000_000),
    ),
];

/// Where a scrape is in the exposition: the parts are rendered in order,
/// a slice at a time (`Scrape::render`), so that a scrape of many topics
/// costs each loop turn no more than `metrics_bytes_per_turn_max` of
/// formatting. A family is always whole, and each sample is read when it
/// is rendered: a scrape that spans turns shows each series as it was in
/// one turn, not every series as of the same turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// The broker's own numbers and the loop's histograms: a few KiB, in
    /// one go.
    Head,
    /// The HELP and TYPE lines of per-topic family `.0`.
    TopicFamily(usize),
    /// Per-topic family `.0`'s sample of topic `.1` of the scrape's list.
    Topic(usize, usize),
    /// The HELP and TYPE lines of per-group family `.0`.
    GroupFamily(usize),
    /// Per-group family `.0`'s samples of the groups of topic `.1`.
    Group(usize, usize),
    Done,
}

/// A scrape under way.
#[derive(Debug)]
pub struct Scrape {
    /// The topics, in the order they were created, as they were when the
    /// scrape began: one created since is in the next scrape; one deleted
    /// since is passed over.
    topics: Vec<TopicId>,
    /// What is rendered next.
    at: Part,
}

impl Scrape {
    /// A scrape of the broker's topics as they are now.
    pub fn new(broker: &Broker) -> Scrape {
        Scrape { topics: broker.topics_by_id(), at: Part::Head }
    }

    /// Bytes the scrape holds while under way (its list of topics).
    pub fn held_bytes(&self) -> usize {
        self.topics.capacity() * std::mem::size_of::<TopicId>()
    }

    /// Whether the whole exposition has been rendered.
    pub fn done(&self) -> bool {
        self.at == Part::Done
    }

    /// Renders the parts that follow into `out`, until it has grown by
    /// `bytes_max` or more (one part may pass it: a line, or one topic's
    /// groups), or the exposition is done.
    pub fn render(&mut self, src: &Source<'_>, out: &mut String, bytes_max: usize) {
        let start = out.len();
        while out.len() - start < bytes_max && !self.done() {
            self.at = self.render_part(src, out);
        }
    }

    /// Renders the part at hand; returns the next.
    fn render_part(&self, src: &Source<'_>, out: &mut String) -> Part {
        match self.at {
            Part::Head => {
                render_head(out, src);
                Part::TopicFamily(0)
            }
            Part::TopicFamily(f) if f == TOPIC_FAMILIES.len() => Part::GroupFamily(0),
            Part::TopicFamily(f) => {
                let (name, kind, help, _) = TOPIC_FAMILIES[f];
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
                Part::Topic(f, 0)
            }
            Part::Topic(f, i) if i == self.topics.len() => Part::TopicFamily(f + 1),
            Part::Topic(f, i) => {
                let (name, _, _, get) = TOPIC_FAMILIES[f];
                if let Some(t) = src.broker.topic_metrics_of(self.topics[i], src.now) {
                    sample(out, name, &format!("topic=\"{}\"", label(&t.name)), get(&t));
                }
                Part::Topic(f, i + 1)
            }
            Part::GroupFamily(f) if f == GROUP_FAMILIES.len() => Part::Done,
            Part::GroupFamily(f) => {
                let (name, kind, help, _) = GROUP_FAMILIES[f];
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
                Part::Group(f, 0)
            }
            Part::Group(f, i) if i == self.topics.len() => Part::GroupFamily(f + 1),
            Part::Group(f, i) => {
                let (name, _, _, get) = GROUP_FAMILIES[f];
                for g in src.broker.group_metrics_of(self.topics[i], src.now) {
                    sample(out, name, &group_labels(&g), get(&g));
                }
                Part::Group(f, i + 1)
            }
            Part::Done => Part::Done,
        }
    }
}

/// One sample line.
fn sample(out: &mut String, name: &str, labels: &str, v: Value) {
    let _ = match v {
        Value::Count(n) => writeln!(out, "{name}{{{labels}}} {n}"),
        Value::Nanos(ns) => writeln!(out, "{name}{{{labels}}} {}", seconds(ns)),
    };
}

/// Renders every metric in the Prometheus text exposition format 0.0.4,
/// at once (a scrape renders it a slice a turn: `Scrape`).
pub fn render(src: &Source<'_>) -> String {
    let mut out = String::with_capacity(4096);
    let mut scrape = Scrape::new(src.broker);
    scrape.render(src, &mut out, usize::MAX);
    out
}

/// The head of the exposition: the broker's own numbers, then the loop's
/// histograms.
fn render_head(out: &mut String, src: &Source<'_>) {
    let lm = src.lm;
    render_broker(out, src.broker, src.loops);
    lm.fsync.render(out, "runnel_fsync_duration_seconds", "Write plus fdatasync of one turn's records.");
    lm.produce_ack.render(
        out,
        "runnel_produce_ack_latency_seconds",
        "From the turn a PRODUCE was read in to its acknowledgement (after the sync, or the write for a written one).",
    );
    lm.render_turns(out);
}

/// The broker's own gauges and counters: connections, the loop, the log.
fn render_broker(out: &mut String, broker: &Broker, loops: &LoopStats) {
    let s = &broker.stats;
    let log = broker.log();
    metric(out, "runnel_connections", "gauge", "Open client connections.", loops.connections);
    metric(out, "runnel_loop_turns_total", "counter", "Turns of the event loop.", loops.turns);
    metric(out, "runnel_received_bytes_total", "counter", "Bytes read from clients.", loops.bytes_in);
    metric(out, "runnel_sent_bytes_total", "counter", "Bytes written to clients.", loops.bytes_out);
    metric(
        out,
        "runnel_buffered_bytes",
        "gauge",
        "Bytes the client connections' input and output buffers take (bounded by buffered_bytes_max).",
        loops.buffered_bytes,
    );
    metric(
        out,
        "runnel_busy_replies_total",
        "counter",
        "Requests answered BUSY because the connection buffers were full, or a FETCH because timers_max was reached.",
        s.busy_replies,
    );
    metric(
        out,
        "runnel_loop_turns_over_budget_total",
        "counter",
        "Turns whose requests, or whose deliveries, used up their work budget and left the rest for the next turn.",
        broker.turns_over_budget(),
    );
    metric(out, "runnel_fsyncs_total", "counter", "fdatasync calls on the commit log.", log.stats.fsyncs);
    metric(out, "runnel_log_bytes", "gauge", "Bytes in the commit log's segments.", log.bytes());
    metric(out, "runnel_log_segments", "gauge", "Segment files of the commit log.", log.segments().len() as u64);
    metric(out, "runnel_log_compactions_total", "counter", "Segments removed by compaction.", broker.compactions());
    metric(out, "runnel_storage_failures_total", "counter", "Failed commit-log writes or syncs.", log.stats.failures);
    metric(out, "runnel_topics", "gauge", "Topics, dead-letter topics included.", broker.topic_count() as u64);
    let _ = writeln!(
        out,
        "# HELP runnel_recovery_seconds Time the last start took to replay the log.\n# TYPE runnel_recovery_seconds gauge\nrunnel_recovery_seconds {}",
        seconds(s.recovery_ms * 1_000_000)
    );
}

/// A group's labels: its topic and its name.
fn group_labels(g: &GroupMetrics) -> String {
    format!("topic=\"{}\",group=\"{}\"", label(&g.topic), label(&g.group))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_slow_turn_is_counted_by_what_took_longest() {
        let mut lm = LoopMetrics::default();
        let mut phases = PhaseNanos::default();
        phases.add(Phase::Write, 20_000);
        phases.add(Phase::Reserve, 1_500_000);
        // Slow, most of it in the reservation.
        lm.observe_turn(2_000_000, &phases);
        // Slow, most of it in none of the phases.
        lm.observe_turn(3_000_000, &PhaseNanos::default());
        // Fast: not a slow turn, though its phases are observed.
        let mut fast = PhaseNanos::default();
        fast.add(Phase::Write, 5_000);
        lm.observe_turn(SLOW_TURN_NS, &fast);
        let mut out = String::new();
        lm.render_turns(&mut out);
        assert!(out.contains("runnel_loop_slow_turns_total{phase=\"reserve\"} 1\n"), "{out}");
        assert!(out.contains("runnel_loop_slow_turns_total{phase=\"other\"} 1\n"), "{out}");
        assert!(out.contains("runnel_loop_slow_turns_total{phase=\"write\"} 0\n"), "{out}");
        assert!(out.contains("runnel_loop_turn_duration_seconds_count 3\n"), "{out}");
        // A phase is observed in the turns it ran in, and only those.
        assert!(out.contains("runnel_loop_phase_duration_seconds_count{phase=\"write\"} 2\n"), "{out}");
        assert!(out.contains("runnel_loop_phase_duration_seconds_count{phase=\"reserve\"} 1\n"), "{out}");
        assert!(out.contains("runnel_loop_phase_duration_seconds_count{phase=\"fsync\"} 0\n"), "{out}");
        let bucket = "runnel_loop_phase_duration_seconds_bucket{phase=\"reserve\",le=\"0.0025\"} 1\n";
        assert!(out.contains(bucket), "{out}");
    }
}
