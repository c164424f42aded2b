//! What a run leaves behind: `results.md` (the tables), `results.json`
//! (every number), and one SVG latency-percentile plot per workload, all
//! written by hand (no serialization or plotting crates). Where the echo
//! floor ran the same configuration, each row also gives its server CPU per
//! message and its latency percentiles as multiples of the floor's.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use crate::latency::Latency;
use crate::server::{Durability, Kind};
use crate::tracker::Verify;
use crate::workload::RunResult;

/// Facts about the run as a whole.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    pub command: String,
    pub quick: bool,
    pub machine: String,
    /// Where the clients ran (the `--client-core`, or unpinned).
    pub client_cores: String,
    /// Where the servers ran, as the bench set it.
    pub server_cores: String,
    pub versions: Vec<(String, String)>,
    pub started_unix_s: u64,
    pub elapsed_s: f64,
    /// The machine's 1-minute load average at the start and the end.
    pub load_start: Option<f64>,
    pub load_end: Option<f64>,
}

/// A configuration that could not run.
#[derive(Clone, Debug)]
pub struct Failure {
    pub workload: String,
    pub broker: Kind,
    /// runnel's consumer in W3, W3B and W4 ("push" or "fetch").
    pub consumer: Option<&'static str>,
    pub durability: Durability,
    pub config: String,
    pub message: String,
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub meta: Meta,
    /// The disk's own 4 KiB write + fdatasync latency (before and after W2).
    pub disk: Vec<Latency>,
    pub results: Vec<RunResult>,
    pub failures: Vec<Failure>,
    /// Brokers not run, with the reason.
    pub skipped: Vec<String>,
}

const WORKLOADS: [(&str, &str); 15] = [
    ("W1", "W1: produce throughput (1 connection, closed loop)"),
    ("W2", "W2: fan-in (many connections, depth 1)"),
    ("W3", "W3: end-to-end latency, open loop"),
    ("W4", "W4: work queue"),
    ("W5", "W5: backlog fill and drain"),
    ("W6", "W6: fan-out to consumer groups (durable; msgs/s and CPU are per delivery, to every group)"),
    (
        "W7",
        "W7: scheduled delivery lateness (each message scheduled 1 s ahead; Redis Streams has no scheduled delivery)",
    ),
    ("W8", "W8: a backlog drained by 4 consumers of one group, unordered and ordered by key (runnel only)"),
    (
        "W9",
        "W9: a two-stage pipeline, forwarding with ACK_PRODUCE or with PRODUCE then ACK (runnel only; msgs/s through both stages)",
    ),
    ("W10", "W10: end-to-end latency while a group replays a retained topic from the log files (runnel only, durable)"),
    ("W11", "W11: a PING's wait beside loads that can hold the loop (runnel only, log no sync)"),
    ("W3C", "W3C: end-to-end latency while the log is rewritten (durable)"),
    ("W3S", "W3S: end-to-end latency with runnel's --spin-us (log, no sync)"),
    ("W3B", "W3B: end-to-end latency with a busy-polling client (memory only; the client core is 100% busy)"),
    ("R1", "R1: recovery of a durable log after a restart"),
];

/// Writes results.md, results.json and the SVG plots into `dir`; returns
/// the Markdown.
pub fn write(dir: &Path, report: &Report) -> Result<String, String> {
    fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let md = markdown(report);
    let put = |name: &str, text: &str| {
        let p = dir.join(name);
        fs::write(&p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))
    };
    put("results.md", &md)?;
    put("results.json", &json(report))?;
    for (key, (title, lines)) in plots(report) {
        put(&format!("{key}.svg"), &svg(&title, &lines))?;
    }
    Ok(md)
}

// ---------------------------------------------------------------------------
// Markdown.
// ---------------------------------------------------------------------------

pub fn fmt_ns(ns: u64) -> String {
    let v = ns as f64;
    if v < 1e3 {
        format!("{ns} ns")
    } else if v < 1e6 {
        format!("{:.0} µs", v / 1e3)
    } else if v < 1e9 {
        format!("{:.2} ms", v / 1e6)
    } else {
        format!("{:.2} s", v / 1e9)
    }
}

fn fmt_count(v: f64) -> String {
    let n = v.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn fmt_bytes(b: f64) -> String {
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.0} MiB", b / (1u64 << 20) as f64)
    }
}

fn verify_note(v: &Verify) -> String {
    let mut s = if v.ok() {
        format!("all {} delivered", fmt_count(v.expected as f64))
    } else if v.cut_short {
        format!(
            "delivery check cut at its time limit: {} of {} seen",
            fmt_count(v.delivered as f64),
            fmt_count(v.expected as f64)
        )
    } else {
        format!("**{} of {} MISSING**", fmt_count(v.missing as f64), fmt_count(v.expected as f64))
    };
    if v.duplicates > 0 {
        let _ = write!(s, ", {} redelivered", fmt_count(v.duplicates as f64));
    }
    s
}

fn notes(r: &RunResult) -> String {
    let mut n: Vec<String> = Vec::new();
    match r.config.workload() {
        "W2" => {
            if let Some(f) = r.extra("fsyncs_per_s").filter(|&f| f > 0.0) {
                let per = r.extra("produces_per_fsync").unwrap_or(0.0);
                n.push(format!("{} fsyncs/s, {per:.1} produces/fsync", fmt_count(f)));
            } else if let Some(w) = r.extra("log_writes_per_s") {
                let per = r.extra("produces_per_log_write").unwrap_or(0.0);
                n.push(format!("no fsync; {} log writes/s, {per:.1} produces/write", fmt_count(w)));
            }
        }
        "W3" | "W3C" | "W3S" | "W3B" | "W7" | "W10" => {
            if let (Some(a), Some(b)) = (r.extra("produce_ack_p50_us"), r.extra("produce_ack_p99_us")) {
                n.push(format!("produce acked p50 {} / p99 {}", fmt_ns((a * 1e3) as u64), fmt_ns((b * 1e3) as u64)));
            }
        }
        _ => {}
    }
    if r.config.workload() == "W3C" {
        if let (Some(a), Some(b)) = (r.extra("compactions_at_start"), r.extra("compactions_at_end")) {
            let seg = |k: &str| r.extra(k).unwrap_or(0.0);
            let done = b - a;
            n.push(format!(
                "{}: {done:.0} segments compacted during the run; log {:.0} → {:.0} segments, {} → {}",
                if done > 0.0 { "compaction ran" } else { "**no compaction ran**" },
                seg("log_segments_at_start"),
                seg("log_segments_at_end"),
                fmt_bytes(seg("log_bytes_at_start")),
                fmt_bytes(seg("log_bytes_at_end"))
            ));
        }
        if let Some(k) = r.extra("aof_rewrites") {
            n.push(format!(
                "BGREWRITEAOF at 1/3 and 2/3 of the run: {k:.0} rewrites done, latest fork {} µs",
                r.extra("latest_fork_usec").unwrap_or(0.0)
            ));
        }
        if let Some(b) = r.extra("backlog_msgs") {
            n.push(format!("{} unacknowledged 100 B messages in old segments", fmt_count(b)));
        }
    }
    match r.config.workload() {
        "R1" => {
            if let (Some(ready), Some(rec)) = (r.extra("ready_ms"), r.extra("recovery_ms")) {
                n.push(format!(
                    "**answered PING {ready:.0} ms after spawn** (its recovery_ms {rec:.0}); log {} in {:.0} segments, {} records; SIGTERM stop took {:.0} ms; filled at {} msgs/s",
                    fmt_bytes(r.extra("log_bytes").unwrap_or(0.0)),
                    r.extra("log_segments").unwrap_or(0.0),
                    fmt_count(r.extra("recovered_records").unwrap_or(0.0)),
                    r.extra("stop_ms").unwrap_or(0.0),
                    fmt_count(r.extra("fill_msgs_per_s").unwrap_or(0.0))
                ));
            }
        }
        "W3B" => {
            if let (Some(busy), Some(per)) = (r.extra("client_cpu_busy"), r.extra("client_cpu_s_per_million")) {
                n.push(format!(
                    "client busy-polls, never sleeps: {:.0}% of its core ({per:.0} CPU s / 1M msgs), a turn every {:.0} ns",
                    busy * 100.0,
                    r.extra("client_turn_ns").unwrap_or(0.0)
                ));
            }
            if let Some(k) = r.extra("client_preemptions") {
                // A thread that never sleeps is switched out only when other
                // work wants its core: each time, every message waits.
                let busy = r.extra("client_cpu_busy").unwrap_or(1.0);
                if busy < 0.9 {
                    n.push(format!(
                        "**client preempted** {k:.0} times (other work on its core): latency not representative"
                    ));
                } else {
                    n.push(format!("client preempted {k:.0} times"));
                }
            }
            if let Some(busy) = r.extra("server_cpu_busy") {
                n.push(format!("server {:.0}% of its core", busy * 100.0));
            }
            if let Some(o) = r.extra("other_cpu_busy") {
                n.push(format!("other processes (and steal) {:.1}% of a core meanwhile", o * 100.0));
            }
        }
        "W4" | "W6" => {
            if let Some(p) = r.extra("produced_msgs_per_s") {
                n.push(format!("produced {} msgs/s", fmt_count(p)));
            }
        }
        "W5" if r.phase == "fill" => {
            if let (Some(per), Some(peak)) = (r.extra("rss_per_queued_msg_bytes"), r.extra("peak_rss_bytes")) {
                n.push(format!("**{per:.0} B RSS per queued msg**, peak RSS {}", fmt_bytes(peak)));
            }
        }
        _ => {}
    }
    n.extend(r.notes.iter().cloned());
    if let Some(v) = &r.verify {
        n.push(verify_note(v));
    }
    n.join("; ")
}

/// A row's figures as multiples of the floor's row of the same
/// configuration (and phase): each is None where either side lacks it, or
/// measured 0 (CPU under one /proc tick in a tiny run: a ratio of it would
/// say nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct VsFloor {
    /// Server CPU per message ÷ the floor's.
    pub cpu: Option<f64>,
    /// Latency percentiles ÷ the floor's.
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
}

/// `r` against the floor's row of its configuration, if the floor ran it
/// (None for the floor's own rows).
pub fn vs_floor(results: &[RunResult], r: &RunResult) -> Option<VsFloor> {
    if r.broker == Kind::Floor {
        return None;
    }
    // A push row is set against the floor's row of the same load, which
    // fetches: the floor has no push subscriptions.
    let config = r.config.fetching();
    let f = results.iter().find(|f| f.broker == Kind::Floor && f.config == config && f.phase == r.phase)?;
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if a > 0.0 && b > 0.0 => Some(a / b),
        _ => None,
    };
    let lat = |p: fn(&Latency) -> u64| {
        ratio(r.latency.as_ref().map(|l| p(l) as f64), f.latency.as_ref().map(|l| p(l) as f64))
    };
    Some(VsFloor {
        cpu: ratio(r.cpu_s_per_million(), f.cpu_s_per_million()),
        p50: lat(|l| l.p50_ns),
        p99: lat(|l| l.p99_ns),
        p999: lat(|l| l.p999_ns),
    })
}

fn fmt_times(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{v:.2}×"))
}

/// The two "÷ floor" cells of a row: CPU, and p50 / p99 / p99.9.
fn floor_cells(v: Option<VsFloor>) -> (String, String) {
    let Some(v) = v else { return ("—".into(), "—".into()) };
    let n = |x: Option<f64>| x.map_or("—".into(), |x| format!("{x:.2}"));
    let lat = if v.p50.is_none() && v.p99.is_none() && v.p999.is_none() {
        "—".into()
    } else {
        format!("{} / {} / {}", n(v.p50), n(v.p99), n(v.p999))
    };
    (fmt_times(v.cpu), lat)
}

/// What each value of the durability column means, broker by broker, so
/// that no row is read against the wrong peer.
const DURABILITY_LEGEND: &str = "
| durability | what a produce survives once acknowledged | runnel | Redis | beanstalkd |
|---|---|---|---|---|
| durable | a crash of the machine | `--fsync turn` | `appendonly yes`, `appendfsync always` | `-b DIR -f 0` |
| log, no sync | a crash of the process, not of the machine | `--fsync never` | `appendonly yes`, `appendfsync no` | `-b DIR -F` |
| memory only | nothing: lost with the process | `--memory-only` | `appendonly no` | no `-b` |
| no log | (the echo floor: nothing kept, the floor of every row) | | | |
";

/// The broker column: the broker's name, and for runnel's rows of W3, W3B
/// and W4 its consumer ("runnel push", "runnel fetch").
pub fn broker_cell(kind: Kind, consumer: Option<&str>) -> String {
    match consumer {
        Some(c) => format!("{} {c}", kind.name()),
        None => kind.name().to_string(),
    }
}

/// The durability column: the floor has no log to be durable with.
pub fn durability_label(kind: Kind, durability: Durability) -> &'static str {
    if kind == Kind::Floor { "no log" } else { durability.name() }
}

fn sorted(results: &[RunResult], workload: &str) -> Vec<RunResult> {
    let mut rows: Vec<RunResult> = results.iter().filter(|r| r.config.workload() == workload).cloned().collect();
    rows.sort_by(|a, b| {
        (config_key(a), a.durability, a.broker, a.phase).cmp(&(config_key(b), b.durability, b.broker, b.phase))
    });
    rows
}

/// Orders rows by configuration (runnel's extra batch row sorts with its
/// size), so the brokers of one configuration sit together.
fn config_key(r: &RunResult) -> (u64, u64) {
    use crate::workload::{Config, Produce};
    match r.config {
        Config::W1 { size, produce: Produce::Depth(d) } => (size as u64, d as u64),
        Config::W1 { size, produce: Produce::Batch(_) } => (size as u64, u64::MAX),
        Config::W2 { conns } => (conns as u64, 0),
        Config::W3 { rate, .. } | Config::W3Compact { rate } | Config::W7 { rate } => (rate, 0),
        Config::W3Spin { rate, spin_us } | Config::W3Busy { rate, spin_us, .. } => (rate, u64::from(spin_us)),
        _ => (r.order as u64, 0),
    }
}

pub fn markdown(report: &Report) -> String {
    let m = &report.meta;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# runnel-bench results{}\n",
        if m.quick { " (--quick: small runs, not for comparison)" } else { "" }
    );
    let _ = writeln!(s, "- command: `{}`", m.command);
    let _ = writeln!(s, "- machine: {}", m.machine);
    let _ = writeln!(s, "- servers on cores: {}; clients on cores: {}", m.server_cores, m.client_cores);
    for (k, v) in &m.versions {
        let _ = writeln!(s, "- {k}: {v}");
    }
    let load = |l: Option<f64>| l.map_or("?".into(), |v| format!("{v:.2}"));
    let _ = writeln!(
        s,
        "- run took {:.0} s; 1-minute load average {} at the start, {} at the end",
        m.elapsed_s,
        load(m.load_start),
        load(m.load_end)
    );
    for d in &report.disk {
        let _ = writeln!(
            s,
            "- disk, {} ({} samples, same filesystem as the servers' data): p50 {}, p99 {}, p99.9 {}, max {}",
            d.what,
            d.count,
            fmt_ns(d.p50_ns),
            fmt_ns(d.p99_ns),
            fmt_ns(d.p999_ns),
            fmt_ns(d.max_ns)
        );
    }
    for sk in &report.skipped {
        let _ = writeln!(s, "- skipped: {sk}");
    }
    s.push_str(DURABILITY_LEGEND);
    for (w, title) in WORKLOADS {
        let rows = sorted(&report.results, w);
        let fails: Vec<&Failure> = report.failures.iter().filter(|f| f.workload == w).collect();
        if rows.is_empty() && fails.is_empty() {
            continue;
        }
        let _ = writeln!(s, "\n## {title}\n");
        if let Some(l) = rows.iter().find_map(|r| r.latency.as_ref()) {
            let _ = writeln!(s, "Latency: {}.\n", l.what);
        }
        // The "÷ floor" columns, where the floor ran this workload.
        let with_floor = rows.iter().any(|r| r.broker == Kind::Floor);
        let _ = writeln!(
            s,
            "| broker | durability | config | msgs/s | MB/s | p50 | p99 | p99.9 | max | server CPU s / 1M msgs |{} notes |",
            if with_floor { " server CPU ÷ floor | p50 / p99 / p99.9 ÷ floor |" } else { "" }
        );
        let _ =
            writeln!(s, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|{}---|", if with_floor { "--:|--:|" } else { "" });
        for r in &rows {
            s.push_str(&row_line(report, r, with_floor));
        }
        for f in fails {
            let _ = writeln!(
                s,
                "| {} | {} | {} | FAILED | | | | | | |{} {} |",
                broker_cell(f.broker, f.consumer),
                durability_label(f.broker, f.durability),
                f.config,
                if with_floor { " | |" } else { "" },
                f.message.replace('|', "/")
            );
        }
    }
    s
}

/// One row of a workload's table, with the "÷ floor" cells if asked.
fn row_line(report: &Report, r: &RunResult, with_floor: bool) -> String {
    let lat = |f: fn(&Latency) -> u64| r.latency.as_ref().map_or("—".into(), |l| fmt_ns(f(l)));
    let config = if r.phase.is_empty() { r.config.label() } else { format!("{} {}", r.phase, r.config.label()) };
    let floor = if with_floor {
        let (cpu, lat) = floor_cells(vs_floor(&report.results, r));
        format!(" {cpu} | {lat} |")
    } else {
        String::new()
    };
    format!(
        "| {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} |{floor} {} |\n",
        broker_cell(r.broker, r.config.consumer_label(r.broker)),
        durability_label(r.broker, r.durability),
        config,
        fmt_count(r.msgs_per_s()),
        r.mb_per_s(),
        lat(|l| l.p50_ns),
        lat(|l| l.p99_ns),
        lat(|l| l.p999_ns),
        lat(|l| l.max_ns),
        r.cpu_s_per_million().map_or("—".into(), |c| format!("{c:.2}")),
        notes(r)
    )
}

// ---------------------------------------------------------------------------
// JSON.
// ---------------------------------------------------------------------------

fn jstr(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn jnum(v: f64) -> String {
    if v.is_finite() { format!("{v}") } else { "null".into() }
}

fn jopt(v: Option<f64>) -> String {
    v.map_or("null".into(), jnum)
}

fn jlatency(l: &Option<Latency>) -> String {
    let Some(l) = l else { return "null".into() };
    let curve: Vec<String> = l.curve.iter().map(|(x, ns)| format!("[{},{ns}]", jnum(*x))).collect();
    format!(
        "{{\"what\":{},\"count\":{},\"p50_ns\":{},\"p90_ns\":{},\"p99_ns\":{},\"p999_ns\":{},\"max_ns\":{},\"mean_ns\":{},\"curve_nines_ns\":[{}]}}",
        jstr(&l.what),
        l.count,
        l.p50_ns,
        l.p90_ns,
        l.p99_ns,
        l.p999_ns,
        l.max_ns,
        l.mean_ns,
        curve.join(",")
    )
}

fn jvs_floor(v: Option<VsFloor>) -> String {
    let Some(v) = v else { return "null".into() };
    format!(
        "{{\"server_cpu_per_msg\":{},\"p50\":{},\"p99\":{},\"p999\":{}}}",
        jopt(v.cpu),
        jopt(v.p50),
        jopt(v.p99),
        jopt(v.p999)
    )
}

fn jverify(v: &Option<Verify>) -> String {
    let Some(v) = v else { return "null".into() };
    let first: Vec<String> = v.first_missing.iter().map(|(p, i)| format!("[{p},{i}]")).collect();
    format!(
        "{{\"ok\":{},\"cut_short\":{},\"expected\":{},\"delivered\":{},\"missing\":{},\"duplicates\":{},\"unacknowledged\":{},\"first_missing\":[{}]}}",
        v.ok(),
        v.cut_short,
        v.expected,
        v.delivered,
        v.missing,
        v.duplicates,
        v.unacknowledged,
        first.join(",")
    )
}

pub fn json(report: &Report) -> String {
    let m = &report.meta;
    let versions: Vec<String> = m.versions.iter().map(|(k, v)| format!("{}:{}", jstr(k), jstr(v))).collect();
    let mut s = String::new();
    let _ = write!(
        s,
        "{{\"meta\":{{\"command\":{},\"quick\":{},\"machine\":{},\"client_cores\":{},\"server_cores\":{},\"versions\":{{{}}},\"started_unix_s\":{},\"elapsed_s\":{},\"loadavg_1m_start\":{},\"loadavg_1m_end\":{}}},\"disk_fdatasync\":[{}],\"skipped\":[{}],\"results\":[",
        jstr(&m.command),
        m.quick,
        jstr(&m.machine),
        jstr(&m.client_cores),
        jstr(&m.server_cores),
        versions.join(","),
        m.started_unix_s,
        jnum(m.elapsed_s),
        jopt(m.load_start),
        jopt(m.load_end),
        report.disk.iter().map(|d| jlatency(&Some(d.clone()))).collect::<Vec<_>>().join(","),
        report.skipped.iter().map(|x| jstr(x)).collect::<Vec<_>>().join(",")
    );
    for (i, r) in report.results.iter().enumerate() {
        let extra: Vec<String> = r.extra.iter().map(|(k, v)| format!("{}:{}", jstr(k), jnum(*v))).collect();
        let notes: Vec<String> = r.notes.iter().map(|n| jstr(n)).collect();
        let _ = write!(
            s,
            "{}\n{{\"workload\":{},\"phase\":{},\"broker\":{},\"durability\":{},\"config\":{},\"consumer\":{},\"server_cores\":{},\"messages\":{},\"message_bytes\":{},\"seconds\":{},\"msgs_per_s\":{},\"mb_per_s\":{},\"server_cpu_s\":{},\"server_cpu_s_per_million\":{},\"latency\":{},\"vs_floor\":{},\"extra\":{{{}}},\"notes\":[{}],\"verify\":{}}}",
            if i > 0 { "," } else { "" },
            jstr(r.config.workload()),
            jstr(r.phase),
            jstr(r.broker.name()),
            jstr(durability_label(r.broker, r.durability)),
            jstr(&r.config.label()),
            r.config.consumer_label(r.broker).map_or("null".into(), jstr),
            jstr(&r.server_cores),
            r.messages,
            r.size,
            jnum(r.seconds),
            jnum(r.msgs_per_s()),
            jnum(r.mb_per_s()),
            jopt(r.cpu_seconds),
            jopt(r.cpu_s_per_million()),
            jlatency(&r.latency),
            jvs_floor(vs_floor(&report.results, r)),
            extra.join(","),
            notes.join(","),
            jverify(&r.verify)
        );
    }
    s.push_str("\n],\"failures\":[");
    for (i, f) in report.failures.iter().enumerate() {
        let _ = write!(
            s,
            "{}{{\"workload\":{},\"broker\":{},\"durability\":{},\"config\":{},\"message\":{}}}",
            if i > 0 { "," } else { "" },
            jstr(&f.workload),
            jstr(f.broker.name()),
            jstr(durability_label(f.broker, f.durability)),
            jstr(&f.config),
            jstr(&f.message)
        );
    }
    s.push_str("]}\n");
    s
}

// ---------------------------------------------------------------------------
// SVG.
// ---------------------------------------------------------------------------

/// One line of a plot.
pub struct Line {
    pub label: String,
    pub kind: Kind,
    pub durability: Durability,
    /// A second line of the same broker and durability (W3B's runnel with
    /// `--spin-us`): dotted.
    pub variant: bool,
    pub curve: Vec<(f64, u64)>,
}

/// The plots, by file name: title and lines.
fn plots(report: &Report) -> BTreeMap<String, (String, Vec<Line>)> {
    let mut out: BTreeMap<String, (String, Vec<Line>)> = BTreeMap::new();
    let mut rows: Vec<&RunResult> = report.results.iter().collect();
    rows.sort_by_key(|r| (r.broker, r.durability));
    for r in rows {
        let (Some((key, title)), Some(l)) = (r.config.plot(), r.latency.as_ref()) else { continue };
        if r.phase == "drain" {
            continue;
        }
        let variant = r.config.plot_variant();
        let consumer = r.config.consumer_label(r.broker);
        // runnel's push line is the second of its broker and durability.
        let pushed = consumer == Some("push");
        out.entry(key).or_insert_with(|| (title, Vec::new())).1.push(Line {
            label: match &variant {
                Some(v) => format!("{} {v}", r.broker.name()),
                None => format!("{} {}", broker_cell(r.broker, consumer), durability_label(r.broker, r.durability)),
            },
            kind: r.broker,
            durability: r.durability,
            variant: variant.is_some() || pushed,
            curve: l.curve.clone(),
        });
    }
    out
}

fn color(k: Kind) -> &'static str {
    match k {
        Kind::Runnel => "#1f6fd1",
        Kind::Redis => "#d1331f",
        Kind::Beanstalkd => "#2a9d3c",
        Kind::Floor => "#777777",
    }
}

const NINES_LABELS: [&str; 7] = ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%", "99.9999%"];

/// A percentile plot: x = nines (log of 1/(1-p)), y = latency on a log
/// scale. Durable lines are solid, log-no-sync dashed, memory-only
/// dash-dotted, variants dotted.
pub fn svg(title: &str, lines: &[Line]) -> String {
    let (w, h) = (860.0, 500.0);
    let (left, right, top, bottom) = (80.0, 220.0, 50.0, 60.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let all = || lines.iter().flat_map(|l| l.curve.iter());
    let x_max = all().map(|p| p.0).fold(1.0f64, f64::max).ceil().clamp(1.0, 6.0);
    let lo = all().map(|p| p.1.max(1)).min().unwrap_or(1) as f64;
    let hi = all().map(|p| p.1.max(1)).max().unwrap_or(1000) as f64;
    let y0 = lo.log10().floor();
    let y1 = hi.log10().ceil().max(y0 + 1.0);
    let px = |x: f64| left + x.min(x_max) / x_max * pw;
    let py = |ns: u64| top + ph - ((ns.max(1) as f64).log10() - y0) / (y1 - y0) * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{}" y="28" font-size="15" font-weight="bold">{}</text>"#, left, esc(title));
    // Horizontal grid: one line per decade of latency.
    let mut d = y0 as i32;
    while d as f64 <= y1 {
        let ns = 10f64.powi(d) as u64;
        let y = py(ns);
        let _ = writeln!(s, r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/>"##, left + pw);
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#, left - 6.0, y + 4.0, decade(d));
        d += 1;
    }
    // Vertical grid: one line per nine.
    for i in 0..=(x_max as usize) {
        let x = px(i as f64);
        let _ = writeln!(s, r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/>"##, top + ph);
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            top + ph + 18.0,
            NINES_LABELS.get(i).copied().unwrap_or("")
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">percentile (log scale of nines; each line ends at its maximum)</text>"#,
        left + pw / 2.0,
        h - 14.0
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">latency</text>"#,
        top + ph / 2.0,
        top + ph / 2.0
    );
    let _ = writeln!(s, r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##);
    for (i, l) in lines.iter().enumerate() {
        let pts: Vec<String> = l.curve.iter().map(|&(x, ns)| format!("{:.1},{:.1}", px(x), py(ns))).collect();
        let dash = if l.variant {
            r#" stroke-dasharray="2 3""#
        } else {
            match l.durability {
                Durability::Durable => "",
                Durability::Unsynced => r#" stroke-dasharray="6 4""#,
                Durability::Memory => r#" stroke-dasharray="10 3 2 3""#,
            }
        };
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="2"{dash} points="{}"/>"#,
            color(l.kind),
            pts.join(" ")
        );
        let ly = top + 10.0 + i as f64 * 20.0;
        let lx = left + pw + 16.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"{dash}/>"#,
            lx + 28.0,
            color(l.kind)
        );
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, lx + 34.0, ly + 4.0, esc(&l.label));
    }
    s.push_str("</svg>\n");
    s
}

fn decade(d: i32) -> &'static str {
    match d {
        0 => "1 ns",
        1 => "10 ns",
        2 => "100 ns",
        3 => "1 µs",
        4 => "10 µs",
        5 => "100 µs",
        6 => "1 ms",
        7 => "10 ms",
        8 => "100 ms",
        9 => "1 s",
        10 => "10 s",
        _ => "",
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_get_thousands_separators() {
        assert_eq!(fmt_count(1234567.4), "1,234,567");
        assert_eq!(fmt_count(999.0), "999");
        assert_eq!(fmt_count(1000.0), "1,000");
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(jstr("a\"b\\c\n\u{1}"), r#""a\"b\\c\n\u0001""#);
        assert_eq!(jnum(f64::NAN), "null");
    }

    fn row(broker: Kind, durability: Durability, cpu_seconds: Option<f64>, p50_us: u64) -> RunResult {
        use crate::workload::{Config, Produce};
        let mut samples = crate::latency::Samples::default();
        samples.push(p50_us * 1000);
        RunResult {
            config: Config::W1 { size: 128, produce: Produce::Depth(1) },
            order: 0,
            broker,
            durability,
            server_cores: "1".into(),
            messages: 1_000_000,
            size: 128,
            seconds: 1.0,
            cpu_seconds,
            latency: samples.summarize("request round trip"),
            extra: Vec::new(),
            notes: Vec::new(),
            verify: None,
            phase: "",
        }
    }

    #[test]
    fn rows_are_divided_by_the_floor_of_their_configuration() {
        let floor = row(Kind::Floor, Durability::Memory, Some(4.0), 20);
        let runnel = row(Kind::Runnel, Durability::Durable, Some(6.0), 50);
        let redis = row(Kind::Redis, Durability::Memory, Some(0.0), 30);
        let mut other_config = row(Kind::Beanstalkd, Durability::Memory, Some(8.0), 40);
        other_config.config = crate::workload::Config::W1 { size: 16, produce: crate::workload::Produce::Depth(1) };
        let results = vec![runnel.clone(), floor.clone(), redis.clone(), other_config.clone()];
        let v = vs_floor(&results, &runnel).expect("a floor row");
        assert_eq!((v.cpu, v.p50, v.p99), (Some(1.5), Some(2.5), Some(2.5)));
        // Under one /proc tick: no CPU ratio, the latency one stays.
        let v = vs_floor(&results, &redis).expect("a floor row");
        assert_eq!((v.cpu, v.p50), (None, Some(1.5)));
        assert_eq!(vs_floor(&results, &other_config), None, "no floor row of its configuration");
        assert_eq!(vs_floor(&results, &floor), None, "the floor is not divided by itself");
        let report = Report { results, ..Report::default() };
        let md = markdown(&report);
        assert!(md.contains("server CPU ÷ floor | p50 / p99 / p99.9 ÷ floor |"), "{md}");
        assert!(md.contains("| 1.50× | 2.50 / 2.50 / 2.50 |"), "{md}");
        assert!(md.contains("| floor | no log |"), "{md}");
        let json = json(&report);
        assert!(json.contains(r#""vs_floor":{"server_cpu_per_msg":1.5,"p50":2.5,"p99":2.5,"p999":2.5}"#), "{json}");
        assert!(json.contains(r#""durability":"no log""#), "{json}");
    }

    #[test]
    fn tables_without_a_floor_row_have_no_floor_columns() {
        let report =
            Report { results: vec![row(Kind::Runnel, Durability::Durable, Some(6.0), 50)], ..Report::default() };
        assert!(!markdown(&report).contains("÷ floor"));
        assert!(json(&report).contains(r#""vs_floor":null"#));
    }

    #[test]
    fn svg_has_one_polyline_per_line() {
        let line = |k| Line {
            label: "x".into(),
            kind: k,
            durability: Durability::Durable,
            variant: false,
            curve: vec![(0.0, 1000), (1.0, 5000), (2.5, 90_000)],
        };
        let s = svg("t <1>", &[line(Kind::Runnel), line(Kind::Redis)]);
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains("t &lt;1&gt;") && s.ends_with("</svg>\n"));
    }
}
