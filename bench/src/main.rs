//! runnel-bench: the same workloads against runnel, Redis Streams and
//! beanstalkd, each started here on a private port and a temporary
//! directory, like against like (durable, a log written and not synced,
//! memory only), with every runnel message checked for delivery; and
//! against the echo floor (`runnel-floor`), the least a server of runnel's
//! protocol spends, which every row is also given as a multiple of.
//!
//! See bench/README.md for the workloads, the durability pairing and the
//! results of a full run.

mod beanstalk_conn;
mod conn;
mod disk;
mod latency;
mod metrics;
mod push_conn;
mod redis_conn;
mod replay;
mod report;
mod runnel_conn;
mod server;
mod stages;
mod stalls;
mod sys;
mod tracker;
mod wire;
mod workload;

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::conn::Target;
use crate::report::{Failure, Meta, Report};
use crate::server::{Kind, Server, Spec};
use crate::workload::{Config, Ctx, Scale};

const USAGE: &str = "\
runnel-bench: runnel side by side with Redis Streams and beanstalkd, and
the echo floor of runnel's protocol (runnel-floor) they are measured against

usage:
  runnel-bench [--quick] [--only runnel|redis|beanstalkd|floor,...] [--workloads W1,...]
               [--server-core N] [--client-core N] [--out DIR] [--runnel PATH]
               [--push-credit N] [--dedup]

  --quick          a small version of every workload (well under a minute;
                   its numbers are not for comparison)
  --only           servers to run (default: all four; a peer missing from
                   PATH, or runnel-floor missing beside this program, is
                   skipped with a note)
  --workloads      W1 produce throughput, W2 fan-in, W3 open-loop latency,
                   W4 work queue, W5 backlog, W6 fan-out to consumer
                   groups, W7 scheduled delivery lateness, W8 ordered
                   by key, W9 two-stage pipeline, W10 latency during
                   a replay from the log files, W11 a PING's wait
                   beside loads that can hold the loop, W3C latency
                   while the log is rewritten, W3S
                   runnel's --spin-us, W3B latency with a busy-polling
                   client (its core 100% busy), R1 recovery of a 1 GiB
                   log (16 MiB with --quick) (default: all)
  --server-core N  pin every server to core N (sched_setaffinity)
  --client-core N  pin the bench's own threads to core N
  --out DIR        where results.md, results.json and the SVGs go (default:
                   a new temporary directory, printed). The committed results
                   change only by `--out bench/results` on a full run; a quick
                   run is refused there
  --runnel PATH    the runnel binary (default: `runnel` beside this one)
  --push-credit N  the credit of runnel's push consumers in W3, W3B and W4
                   (default 1024: the most messages one fetch brings)
  --dedup          W1's runnel producers give every message a dedup id (a
                   producer id and a sequence number), to show what
                   idempotent produce costs; the peers produce as without

Peers: apt-get install -y redis-server beanstalkd";

/// Parsed command line.
struct Options {
    quick: bool,
    brokers: Vec<Kind>,
    workloads: Vec<&'static str>,
    server_core: Option<usize>,
    client_core: Option<usize>,
    /// Where the results go: `--out`, or a new temporary directory.
    out: PathBuf,
    runnel: Option<PathBuf>,
    /// The push consumers' credit, if not the default.
    push_credit: Option<u32>,
    /// W1's runnel producers give every message a dedup id.
    dedup: bool,
}

/// The committed results, which only a full run may write (`--out`).
fn published_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results")
}

/// Where a run's results go when `--out` names nowhere: a new directory
/// under the system's temporary directory, so a try never overwrites the
/// committed results. Its name does not start `runnel-bench-<PID>-`, so
/// `server::remove_stale_dirs` leaves it for the user to read.
fn default_out() -> PathBuf {
    let started = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    std::env::temp_dir().join(format!("runnel-bench-results-{started}-{}", std::process::id()))
}

/// Whether `out` is the committed results directory (however it is spelt).
fn is_published(out: &std::path::Path) -> bool {
    let canonical = |p: &std::path::Path| std::fs::canonicalize(p).ok();
    out == published_dir() || canonical(out).is_some_and(|o| Some(o) == canonical(&published_dir()))
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        quick: false,
        brokers: Kind::ALL.to_vec(),
        workloads: workload::WORKLOADS.to_vec(),
        server_core: None,
        client_core: None,
        out: PathBuf::new(),
        runnel: None,
        push_credit: None,
        dedup: false,
    };
    let mut out = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value = || inline.clone().or_else(|| it.next().cloned()).ok_or_else(|| format!("{flag} needs a value"));
        match flag {
            "--quick" => o.quick = true,
            "--dedup" => o.dedup = true,
            "--only" => {
                o.brokers = value()?
                    .split(',')
                    .map(|b| Kind::parse(b).ok_or_else(|| format!("--only: unknown broker {b:?}")))
                    .collect::<Result<_, _>>()?;
            }
            "--workloads" => {
                o.workloads = value()?
                    .split(',')
                    .map(|w| {
                        let w = w.trim().to_ascii_uppercase();
                        let w = if w.bytes().all(|b| b.is_ascii_digit()) { format!("W{w}") } else { w };
                        workload::WORKLOADS.into_iter().find(|k| *k == w).ok_or_else(|| {
                            format!("--workloads: unknown workload {w:?} ({})", workload::WORKLOADS.join(", "))
                        })
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--server-core" => o.server_core = Some(value()?.parse().map_err(|_| "--server-core: not a number")?),
            "--client-core" => o.client_core = Some(value()?.parse().map_err(|_| "--client-core: not a number")?),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--runnel" => o.runnel = Some(PathBuf::from(value()?)),
            "--push-credit" => {
                o.push_credit = Some(value()?.parse().map_err(|_| "--push-credit: not a number")?);
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    o.out = out.unwrap_or_else(default_out);
    if o.quick && is_published(&o.out) {
        return Err(format!(
            "--quick numbers are not for comparison; they do not go in {} (leave out --out)",
            o.out.display()
        ));
    }
    Ok(o)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse_args(&args) {
        Ok(o) => o,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("runnel-bench: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&opts, &args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("runnel-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the bench; Ok(false) when runnel or the floor failed a run or lost
/// a message.
fn run(opts: &Options, args: &[String]) -> Result<bool, String> {
    let started = Instant::now();
    latency::now_ns();
    // The server gets the `--server-core`, or every core the bench had
    // before it pinned itself.
    let all_cores = sys::current_affinity().map_err(|e| format!("sched_getaffinity: {e}"))?;
    let server_cores = match opts.server_core {
        Some(c) => {
            sys::checked_cpu_set(&[c]).map_err(|e| format!("--server-core: {e}"))?;
            vec![c]
        }
        None => all_cores.clone(),
    };
    if let Some(c) = opts.client_core {
        sys::pin_current_thread(&[c]).map_err(|e| format!("--client-core: {e}"))?;
    }
    let mut scale = Scale::new(opts.quick);
    if let Some(c) = opts.push_credit {
        scale.push_credit = c;
    }
    scale.dedup = opts.dedup;
    sys::progress(&format!("results will go to {}", opts.out.display()));
    let mut report = Report {
        meta: Meta {
            command: std::iter::once("runnel-bench".to_string())
                .chain(args.iter().cloned())
                .collect::<Vec<_>>()
                .join(" "),
            quick: opts.quick,
            machine: machine(),
            client_cores: match opts.client_core {
                Some(c) => format!("{c} (pinned)"),
                None => format!("{} (unpinned)", core_list(&all_cores)),
            },
            server_cores: match opts.server_core {
                Some(c) => format!("{c} (pinned)"),
                None => format!("{} (unpinned)", core_list(&all_cores)),
            },
            versions: Vec::new(),
            started_unix_s: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            elapsed_s: 0.0,
            load_start: sys::loadavg_1m(),
            load_end: None,
        },
        ..Report::default()
    };
    let mut programs = Vec::new();
    for &kind in &opts.brokers {
        match server::locate(kind, opts.runnel.as_deref()) {
            Ok(p) => {
                report.meta.versions.push((kind.name().to_string(), version(kind, &p)));
                programs.push((kind, p));
            }
            Err(e) if kind == Kind::Runnel => return Err(e),
            Err(e) => {
                sys::progress(&format!("skipping {}: {e}", kind.name()));
                report.skipped.push(format!("{}: {e}", kind.name()));
            }
        }
    }
    let stale = server::remove_stale_dirs();
    if stale > 0 {
        sys::progress(&format!("removed {stale} temporary directories left by benches that were killed"));
    }
    let mut runnel_ok = true;
    for &w in &opts.workloads {
        // W2 reports the disk's own fdatasync latency beside the brokers':
        // measured just before and just after it, since a shared disk drifts.
        if w == "W2" {
            probe_disk(&scale, "before W2", &mut report);
        }
        // W3's durable rows (fetch and push) are held to the disk's
        // fdatasync p99: a run without W2 probes the disk before W3.
        if w == "W3" && !opts.workloads.contains(&"W2") {
            probe_disk(&scale, "before W3", &mut report);
        }
        // Configuration by configuration, the brokers back to back, so a
        // drift in the machine's load touches every broker alike.
        for (order, config) in Config::all(w, &scale).into_iter().enumerate() {
            for &durability in config.durabilities() {
                for (kind, program) in programs.iter().filter(|(k, _)| config.applies_to(*k) && k.runs_with(durability))
                {
                    let spec = Spec {
                        kind: *kind,
                        durability,
                        program: program.clone(),
                        cores: server_cores.clone(),
                        extra_args: config.server_args(*kind, &scale),
                    };
                    runnel_ok &= run_config(&spec, config, order, &scale, &mut report) || !kind.is_ours();
                }
            }
        }
        if w == "W2" {
            probe_disk(&scale, "after W2", &mut report);
        }
    }
    report.meta.elapsed_s = started.elapsed().as_secs_f64();
    report.meta.load_end = sys::loadavg_1m();
    let md = report::write(&opts.out, &report)?;
    println!("{md}");
    println!("results, JSON and plots written to {}", opts.out.display());
    for r in report.results.iter().filter(|r| r.broker.is_ours()) {
        if let Some(v) = r.verify.as_ref().filter(|v| !v.ok()) {
            eprintln!(
                "{} lost messages in {} {} {}: {} of {} never delivered; first missing (producer, index): {:?}",
                r.broker.name(),
                r.config.workload(),
                report::durability_label(r.broker, r.durability),
                r.config.label(),
                v.missing,
                v.expected,
                v.first_missing
            );
        }
    }
    if !runnel_ok {
        eprintln!(
            "runnel-bench: FAILED: runnel or the floor failed a run or did not deliver every message (see above)"
        );
    }
    Ok(runnel_ok)
}

/// Starts a server, runs one configuration against it, stops it, and adds
/// the outcome to the report. False if a run failed or lost a message.
fn run_config(spec: &Spec, config: Config, order: usize, scale: &Scale, report: &mut Report) -> bool {
    // The previous run's data directory is gone; flush whatever writeback
    // it left so this run's fsyncs meet an idle disk.
    sys::sync_all();
    let load = sys::loadavg_1m();
    let outcome = Server::start(spec).and_then(|mut server| {
        let target = Target { kind: spec.kind, addr: server.addr() };
        let r = match config {
            Config::R1 { .. } => workload::recovery(&mut server, target, config, order, scale),
            _ => workload::run(&Ctx { server: &server, target, config, order, scale }),
        };
        if r.is_ok() && !server.alive() {
            return Err(format!("the server died: {}", server.log_tail()));
        }
        let r = r.map_err(|e| format!("{e} (server log: {})", server.log_tail()));
        server.stop();
        r
    });
    match outcome {
        Ok(results) => {
            let mut ok = true;
            for mut r in results {
                if let Some(l) = load {
                    r.extra.push(("loadavg_1m_at_start".into(), l));
                }
                sys::progress(&progress_line(&r));
                ok &= r.verify.as_ref().is_none_or(|v| v.ok());
                report.results.push(r);
            }
            ok
        }
        Err(e) => {
            let (w, kind, durability) = (
                config.workload(),
                report::broker_cell(spec.kind, config.consumer_label(spec.kind)),
                report::durability_label(spec.kind, spec.durability),
            );
            sys::progress(&format!("{w} {kind} {durability} {}: FAILED: {e}", config.label()));
            report.failures.push(Failure {
                workload: w.to_string(),
                broker: spec.kind,
                consumer: config.consumer_label(spec.kind),
                durability: spec.durability,
                config: config.label(),
                message: e,
            });
            false
        }
    }
}

fn probe_disk(scale: &Scale, when: &str, report: &mut Report) {
    sys::sync_all();
    match disk::fsync_probe(scale) {
        Ok((mut l, waits)) => {
            sys::progress(&format!(
                "disk {when}: 4 KiB write + fdatasync p50 {} p99 {}",
                report::fmt_ns(l.p50_ns),
                report::fmt_ns(l.p99_ns)
            ));
            l.what = format!("{} ({when})", l.what);
            report.disk.push(l);
            if let Some(mut w) = waits {
                w.what = format!("{} ({when})", w.what);
                report.disk.push(w);
            }
        }
        Err(e) => sys::progress(&format!("disk probe {when} failed: {e}")),
    }
}

fn progress_line(r: &workload::RunResult) -> String {
    let lat = r
        .latency
        .as_ref()
        .map_or(String::new(), |l| format!(", p50 {} p99 {}", report::fmt_ns(l.p50_ns), report::fmt_ns(l.p99_ns)));
    let v = match &r.verify {
        Some(v) if v.ok() => format!(", {} delivered", v.expected),
        Some(v) if v.cut_short => {
            format!(", delivery check cut at its time limit ({} of {} seen)", v.delivered, v.expected)
        }
        Some(v) => format!(", {} of {} MISSING", v.missing, v.expected),
        None => String::new(),
    };
    format!(
        "{} {} {} {}{}: {:.0} msgs/s{lat}{v}{}",
        r.config.workload(),
        report::broker_cell(r.broker, r.config.consumer_label(r.broker)),
        report::durability_label(r.broker, r.durability),
        r.config.label(),
        if r.phase.is_empty() { String::new() } else { format!(" [{}]", r.phase) },
        r.msgs_per_s(),
        if r.notes.is_empty() { String::new() } else { format!(" ({})", r.notes.join("; ")) }
    )
}

fn core_list(cores: &[usize]) -> String {
    cores.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
}

/// Cores, CPU model, memory and kernel, for the report.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:").map(|v| v.trim().trim_end_matches("kB").trim().to_string()))
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or("? GiB".into(), |kb| format!("{:.0} GiB", kb as f64 / (1 << 20) as f64));
    format!("{} cores ({model}), {mem} RAM, Linux {}", sys::online_cores(), kernel.trim())
}

/// The version a broker reports, best effort.
fn version(kind: Kind, program: &std::path::Path) -> String {
    let arg = match kind {
        Kind::Runnel | Kind::Floor => return runnel_version(program),
        Kind::Redis => "--version",
        Kind::Beanstalkd => "-v",
    };
    Command::new(program)
        .arg(arg)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(if o.stdout.is_empty() { &o.stderr } else { &o.stdout }).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// The binary, what its `--version` says, and the source commit it was
/// built from (`--version` names the release, not the commit).
fn runnel_version(program: &std::path::Path) -> String {
    let said = Command::new(program)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().next().map(str::to_string))
        .map_or(String::new(), |v| format!("{v}, "));
    let commit = Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let dirty = Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "status", "--porcelain", "--", "../src"])
        .output()
        .ok()
        .is_some_and(|o| !o.stdout.is_empty());
    match commit {
        Some(c) => format!(
            "{} ({said}source at {c}{})",
            program.display(),
            if dirty { " with uncommitted changes in src/" } else { "" }
        ),
        None if said.is_empty() => program.display().to_string(),
        None => format!("{} ({})", program.display(), said.trim_end_matches(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_run_without_out_writes_to_a_new_temporary_directory() {
        for a in [args(&["--quick"]), args(&[])] {
            let o = parse_args(&a).expect("parse");
            assert!(o.out.starts_with(std::env::temp_dir()), "{a:?} writes to {}", o.out.display());
            assert!(!is_published(&o.out), "{a:?} writes to the committed results");
        }
    }

    #[test]
    fn only_a_full_run_may_write_the_committed_results() {
        let published = published_dir();
        // Spelt another way, the same directory.
        let roundabout = published.join("..").join("results");
        for out in [&published, &roundabout] {
            let out = out.to_str().expect("utf-8 path");
            let quick = parse_args(&args(&["--quick", "--out", out]));
            assert!(quick.is_err_and(|e| e.contains("not for comparison")), "--quick --out {out} was accepted");
            let full = parse_args(&args(&["--out", out])).expect("a full run may publish");
            assert!(is_published(&full.out));
        }
        let elsewhere = std::env::temp_dir().join("runnel-bench-somewhere");
        let quick = parse_args(&args(&["--quick", "--out", elsewhere.to_str().expect("utf-8")])).expect("parse");
        assert_eq!(quick.out, elsewhere);
    }
}
