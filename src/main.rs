//! The `runnel` command: `serve` runs the broker; the other subcommands are
//! small clients built on `runnel::client`.

use std::io::{self, BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use runnel::client::{Client, Fetch};
use runnel::codec::TopicSettings;
use runnel::limits::Limits;
use runnel::log::{FsyncMode, Log};
use runnel::reactor::{Reactor, ServeConfig};

/// Where `runnel serve` listens and clients connect by default.
const DEFAULT_ADDR: &str = "127.0.0.1:7700";
/// Where `runnel serve` keeps its commit log by default.
const DEFAULT_DATA: &str = "runnel-data";

const USAGE: &str = "\
runnel: a durable message broker on one thread

usage:
  runnel serve   [--config FILE] [--print-config] [--listen ADDR] [--data DIR]
                 [--fsync turn|never] [--no-auto-create] [--segment-bytes-max N] [--repair [--dry-run]]
                 [--ack-timeout-ms N] [--max-deliveries N] [--auth-token TOKEN]
                 [--metrics ADDR] [--pin-core N] [--spin-us N] [--<limit> N ...]
  runnel produce [--addr ADDR] [--batch N] TOPIC        each stdin line becomes one message
  runnel consume [--addr ADDR] [--count N] [--wait-ms MS] TOPIC
  runnel stats   [--addr ADDR] [--json] [TOPIC]
  runnel topics  [--addr ADDR]                          list topics and settings
  runnel create  [--addr ADDR] [--ack-timeout-ms N] [--max-deliveries N] TOPIC
  runnel delete  [--addr ADDR] TOPIC
  runnel purge   [--addr ADDR] TOPIC
  runnel redrive [--addr ADDR] [--count N] TOPIC         move TOPIC.dlq back to TOPIC

limits (runnel serve; defaults in docs/protocol.md and README.md):
  --frame-bytes-max --message-bytes-max --batch-messages-max --topic-name-bytes-max
  --topics-max --topic-messages-max --topic-bytes-max --connections-max
  --output-bytes-max --fetch-bytes-max --fetch-wait-ms-max --read-bytes-per-turn-max
  --handshake-timeout-ms --idle-timeout-ms --frame-timeout-ms

defaults: --listen/--addr 127.0.0.1:7700, --data ./runnel-data, --fsync turn.
RUST_LOG sets the log level (default info).";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let Some((cmd, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match cmd.as_str() {
        "serve" => serve(rest),
        "produce" => produce(rest),
        "consume" => consume(rest),
        "stats" => stats(rest),
        "topics" | "create" | "delete" | "purge" | "redrive" => admin(cmd, rest),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        other => Err(format!("unknown command {other:?}\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("runnel {cmd}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Parsed `--flag value` pairs, bare `--switch`es and positional words.
struct Args {
    flags: Vec<(String, Option<String>)>,
    words: Vec<String>,
}

/// Flags that take no value.
const SWITCHES: &[&str] = &["--json", "--repair", "--dry-run", "--no-auto-create", "--print-config"];

impl Args {
    fn parse(args: &[String]) -> Result<Args, String> {
        let mut flags = Vec::new();
        let mut words = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if let Some((k, v)) = a.split_once('=').filter(|_| a.starts_with("--")) {
                flags.push((k.to_string(), Some(v.to_string())));
            } else if SWITCHES.contains(&a.as_str()) {
                flags.push((a.clone(), None));
            } else if a.starts_with("--") {
                let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
                flags.push((a.clone(), Some(v.clone())));
            } else {
                words.push(a.clone());
            }
        }
        Ok(Args { flags, words })
    }
    /// The value of the last `name` (a later flag overrides an earlier
    /// one, and the command line a config file's).
    fn take(&mut self, name: &str) -> Option<String> {
        let i = self.flags.iter().rposition(|f| f.0 == name)?;
        let v = self.flags.remove(i).1;
        self.flags.retain(|f| f.0 != name);
        // `key =` with nothing after it (as --print-config writes an unset
        // option) means unset.
        v.filter(|v| !v.is_empty())
    }
    /// A switch: present, or `name=true`; `name=false` turns it off.
    fn switch(&mut self, name: &str) -> bool {
        let i = self.flags.iter().rposition(|f| f.0 == name);
        let on = i.is_some_and(|i| !matches!(self.flags[i].1.as_deref(), Some("false" | "0" | "no")));
        self.flags.retain(|f| f.0 != name);
        on
    }
    fn num<T: std::str::FromStr>(&mut self, name: &str) -> Result<Option<T>, String> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| format!("{name}: {v:?} is not a valid number")),
        }
    }
    /// Fails on flags nobody took.
    fn done(&self) -> Result<(), String> {
        match self.flags.first() {
            Some((k, _)) => Err(format!("unknown flag {k}")),
            None => Ok(()),
        }
    }
    fn topic(&self) -> Result<&str, String> {
        match self.words.as_slice() {
            [t] => Ok(t),
            [] => Err("name a topic".into()),
            _ => Err(format!("one topic, please, not {:?}", self.words)),
        }
    }
}

/// Sets the limit named by a `--flag`, if it is one. Every limit's flag is
/// its field name with `-` for `_`.
fn set_limit(l: &mut Limits, args: &mut Args) -> Result<(), String> {
    macro_rules! limit {
        ($($field:ident),*) => {$(
            if let Some(v) = args.num(concat!("--", stringify!($field)).replace('_', "-").as_str())? {
                l.$field = v;
            }
        )*};
    }
    limit!(
        frame_bytes_max,
        message_bytes_max,
        batch_messages_max,
        topic_name_bytes_max,
        topics_max,
        topic_messages_max,
        topic_bytes_max,
        connections_max,
        output_bytes_max,
        fetch_bytes_max,
        fetch_wait_ms_max,
        read_bytes_per_turn_max,
        handshake_timeout_ms,
        idle_timeout_ms,
        frame_timeout_ms
    );
    Ok(())
}

/// Reads a config file of `key = value` lines (`#` starts a comment); the
/// keys are the `runnel serve` flags without their dashes. Returns them as
/// flags, to be parsed before the command line's (which override them).
fn config_file(path: &str) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--config {path}: {e}"))?;
    let mut args = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("{path}:{}: want `key = value`, got {line:?}", n + 1));
        };
        let (k, v) = (k.trim(), v.trim().trim_matches('"'));
        if k.is_empty() || k == "config" {
            return Err(format!("{path}:{}: bad key {k:?}", n + 1));
        }
        args.push(format!("--{k}={v}"));
    }
    Ok(args)
}

/// Everything `runnel serve` was asked for.
struct Serve {
    cfg: ServeConfig,
    pin_core: Option<usize>,
    print_config: bool,
    /// Read the log through, report what a start (and --repair) would do,
    /// change nothing, exit.
    dry_run: bool,
}

fn parse_serve(raw: &[String]) -> Result<Serve, String> {
    let mut all = Vec::new();
    if let Some(i) = raw.iter().position(|a| a == "--config" || a.starts_with("--config=")) {
        let path = match raw[i].split_once('=') {
            Some((_, p)) => p.to_string(),
            None => raw.get(i + 1).cloned().ok_or("--config needs a file")?,
        };
        all.extend(config_file(&path)?);
    }
    let mut it = raw.iter();
    while let Some(a) = it.next() {
        if a == "--config" {
            it.next();
        } else if !a.starts_with("--config=") {
            all.push(a.clone());
        }
    }
    let mut a = Args::parse(&all)?;
    let listen: SocketAddr = a
        .take("--listen")
        .unwrap_or_else(|| DEFAULT_ADDR.into())
        .parse()
        .map_err(|e| format!("--listen: {e} (want IP:PORT)"))?;
    let data_dir = PathBuf::from(a.take("--data").unwrap_or_else(|| DEFAULT_DATA.into()));
    let mut cfg = ServeConfig::new(listen, data_dir);
    let config = &mut cfg.broker;
    set_limit(&mut config.limits, &mut a)?;
    config.auto_create = !a.switch("--no-auto-create");
    if let Some(v) = a.num("--ack-timeout-ms")? {
        config.defaults.ack_timeout_ms = v;
    }
    if let Some(v) = a.num("--max-deliveries")? {
        config.defaults.max_deliveries = v;
    }
    config.auth_token = a
        .take("--auth-token")
        .or_else(|| std::env::var("RUNNEL_AUTH_TOKEN").ok())
        .filter(|t| !t.is_empty())
        .map(String::into_bytes);
    if let Some(v) = a.num("--segment-bytes-max")? {
        cfg.log.segment_bytes_max = v;
    }
    cfg.log.repair = a.switch("--repair");
    cfg.log.fsync = match a.take("--fsync").as_deref() {
        None | Some("turn") => FsyncMode::Turn,
        Some("never") => FsyncMode::Never,
        Some(other) => return Err(format!("--fsync {other:?}: want turn or never")),
    };
    cfg.metrics = match a.take("--metrics") {
        Some(m) => Some(m.parse().map_err(|e| format!("--metrics: {e} (want IP:PORT)"))?),
        None => None,
    };
    cfg.spin_us = a.num("--spin-us")?.unwrap_or(0);
    let pin_core = a.num("--pin-core")?;
    let print_config = a.switch("--print-config");
    let dry_run = a.switch("--dry-run");
    a.done()?;
    if !a.words.is_empty() {
        return Err(format!("unexpected {:?}", a.words));
    }
    Ok(Serve { cfg, pin_core, print_config, dry_run })
}

/// The effective configuration, in the config file's format.
fn config_text(s: &Serve) -> String {
    let c = &s.cfg;
    let l = &c.broker.limits;
    let mut lines = vec![
        format!("listen = {}", c.listen),
        format!("data = {}", c.data_dir.display()),
        format!("fsync = {}", if c.log.fsync == FsyncMode::Turn { "turn" } else { "never" }),
        format!("segment-bytes-max = {}", c.log.segment_bytes_max),
        format!("repair = {}", c.log.repair),
        format!("no-auto-create = {}", !c.broker.auto_create),
        format!("ack-timeout-ms = {}", c.broker.defaults.ack_timeout_ms),
        format!("max-deliveries = {}", c.broker.defaults.max_deliveries),
        format!("# auth-token is {} (never printed)", if c.broker.auth_token.is_some() { "set" } else { "not set" }),
        format!("metrics = {}", c.metrics.map(|m| m.to_string()).unwrap_or_default()),
        format!("spin-us = {}", c.spin_us),
        format!("pin-core = {}", s.pin_core.map(|p| p.to_string()).unwrap_or_default()),
    ];
    for (k, v) in [
        ("frame-bytes-max", u64::from(l.frame_bytes_max)),
        ("message-bytes-max", l.message_bytes_max.into()),
        ("batch-messages-max", l.batch_messages_max.into()),
        ("topic-name-bytes-max", l.topic_name_bytes_max.into()),
        ("topics-max", l.topics_max.into()),
        ("topic-messages-max", l.topic_messages_max),
        ("topic-bytes-max", l.topic_bytes_max),
        ("connections-max", l.connections_max.into()),
        ("output-bytes-max", l.output_bytes_max.into()),
        ("fetch-bytes-max", l.fetch_bytes_max.into()),
        ("fetch-wait-ms-max", l.fetch_wait_ms_max.into()),
        ("read-bytes-per-turn-max", l.read_bytes_per_turn_max.into()),
        ("handshake-timeout-ms", l.handshake_timeout_ms.into()),
        ("idle-timeout-ms", l.idle_timeout_ms.into()),
        ("frame-timeout-ms", l.frame_timeout_ms.into()),
    ] {
        lines.push(format!("{k} = {v}"));
    }
    lines.join("\n") + "\n"
}

/// Pins the calling thread (the loop) to one CPU.
fn pin_to_core(core: usize) -> Result<(), String> {
    if core >= libc::CPU_SETSIZE as usize {
        return Err(format!("--pin-core {core}: beyond the CPU set size"));
    }
    // SAFETY: cpu_set_t is plain data, zeroed is its empty set; CPU_SET
    // writes inside it (core is below CPU_SETSIZE); sched_setaffinity reads
    // exactly size_of::<cpu_set_t>() bytes from it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(format!("--pin-core {core}: {}", io::Error::last_os_error()));
    }
    Ok(())
}

/// Raises the open-file limit to its hard limit: every connection is a
/// file descriptor. Returns the limit in force.
fn raise_fd_limit() -> Option<u64> {
    // SAFETY: getrlimit and setrlimit read and write one rlimit struct that
    // lives on this stack frame.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
        Some(lim.rlim_cur as u64)
    }
}

/// SIGTERM and SIGINT: the first starts a graceful shutdown (the handler
/// writes a byte the loop sees), the second exits at once.
fn handle_signals(reactor: &mut Reactor) -> Result<(), String> {
    let (read, write) = std::os::unix::net::UnixStream::pair().map_err(|e| format!("signal pipe: {e}"))?;
    let seen = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let e = |e: io::Error| format!("signal handler: {e}");
        // Registered first, so it sees the flag as the previous signal left it.
        signal_hook::flag::register_conditional_shutdown(sig, 1, seen.clone()).map_err(e)?;
        signal_hook::flag::register(sig, seen.clone()).map_err(e)?;
        signal_hook::low_level::pipe::register(sig, write.try_clone().map_err(e)?).map_err(e)?;
    }
    reactor.watch_signals(read).map_err(|e| format!("signal pipe: {e}"))
}

fn serve(raw: &[String]) -> Result<(), String> {
    let s = parse_serve(raw)?;
    if s.print_config {
        print!("{}", config_text(&s));
        return Ok(());
    }
    if s.dry_run {
        return dry_run(&s.cfg.data_dir);
    }
    if let Some(core) = s.pin_core {
        pin_to_core(core)?;
        log::info!("pinned the event loop to CPU {core}");
    }
    if let Some(fds) = raise_fd_limit() {
        let need = u64::from(s.cfg.broker.limits.connections_max) + 64;
        if fds < need {
            log::warn!(
                "the open-file limit ({fds}) is below connections-max + 64 ({need}); accepts will fail before connections-max is reached"
            );
        }
    }
    let fsync = s.cfg.log.fsync;
    let data_dir = s.cfg.data_dir.clone();
    let mut reactor = Reactor::bind(s.cfg)?;
    handle_signals(&mut reactor)?;
    if let Some(m) = reactor.metrics_addr() {
        log::info!("metrics on http://{m}/metrics");
    }
    log::info!(
        "runnel serving on {} (data {}, fsync {})",
        reactor.local_addr(),
        data_dir.display(),
        match fsync {
            FsyncMode::Turn => "turn: a produce is acknowledged after the fdatasync that covers it",
            FsyncMode::Never => "never: page cache only; a machine crash can lose acknowledged messages",
        }
    );
    reactor.run().map_err(|e| format!("event loop: {e}"))?;
    log::info!("stopped cleanly");
    Ok(())
}

/// `runnel serve --repair --dry-run`: reads the log through and prints what a
/// start finds and what --repair would drop, changing nothing. Fails (exit
/// 1) when the log is damaged, so a script can tell.
fn dry_run(data_dir: &std::path::Path) -> Result<(), String> {
    let report = Log::inspect(data_dir).map_err(|e| e.to_string())?;
    print!("{report}");
    if report.damaged() {
        return Err("the commit log is damaged: see above; nothing was changed".into());
    }
    Ok(())
}

fn connect(a: &mut Args) -> Result<Client, String> {
    let addr = a.take("--addr").unwrap_or_else(|| DEFAULT_ADDR.into());
    let token = std::env::var("RUNNEL_AUTH_TOKEN").unwrap_or_default();
    Client::connect_with(addr.as_str(), token.as_bytes()).map_err(|e| format!("cannot talk to {addr}: {e}"))
}

fn produce(raw: &[String]) -> Result<(), String> {
    let mut a = Args::parse(raw)?;
    let mut client = connect(&mut a)?;
    let batch_max: usize = a.num("--batch")?.unwrap_or(256).max(1);
    a.done()?;
    let topic = a.topic()?.to_string();
    let bytes_max = (client.limits.frame_bytes_max as usize / 2).max(1024);
    let mut batch: Vec<Vec<u8>> = Vec::new();
    let mut batch_bytes = 0;
    let mut sent = 0u64;
    let stdin = io::stdin();
    let mut send = |batch: &mut Vec<Vec<u8>>, client: &mut Client| -> Result<(), String> {
        if batch.is_empty() {
            return Ok(());
        }
        client.produce_batch(&topic, batch).map_err(|e| format!("after {sent} acknowledged messages: {e}"))?;
        sent += batch.len() as u64;
        batch.clear();
        Ok(())
    };
    for line in stdin.lock().split(b'\n') {
        let mut line = line.map_err(|e| format!("reading stdin: {e}"))?;
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if batch.len() >= batch_max || batch_bytes + line.len() > bytes_max {
            send(&mut batch, &mut client)?;
            batch_bytes = 0;
        }
        batch_bytes += line.len() + 4;
        batch.push(line);
    }
    send(&mut batch, &mut client)
}

fn consume(raw: &[String]) -> Result<(), String> {
    let mut a = Args::parse(raw)?;
    let mut client = connect(&mut a)?;
    let count: Option<u64> = a.num("--count")?;
    let wait_ms: u32 = a.num("--wait-ms")?.unwrap_or(1000);
    a.done()?;
    let topic = a.topic()?.to_string();
    let mut got = 0u64;
    let stdout = io::stdout();
    loop {
        let left = count.map_or(256, |c| c.saturating_sub(got).min(256)) as u32;
        if left == 0 {
            return Ok(());
        }
        let f = Fetch { max_messages: left, wait_ms, ..Fetch::default() };
        let msgs = client.fetch(&topic, f).map_err(|e| e.to_string())?;
        if msgs.is_empty() {
            return Ok(());
        }
        let mut out = stdout.lock();
        for m in &msgs {
            out.write_all(&m.payload).and_then(|_| out.write_all(b"\n")).map_err(|e| format!("stdout: {e}"))?;
        }
        out.flush().map_err(|e| format!("stdout: {e}"))?;
        let ids: Vec<u64> = msgs.iter().map(|m| m.id).collect();
        client.ack(&topic, &ids).map_err(|e| e.to_string())?;
        got += msgs.len() as u64;
    }
}

/// The per-topic columns `runnel stats` prints.
const STAT_COLUMNS: &[&str] = &["ready", "inflight", "dead_lettered", "produced", "delivered", "redelivered", "acked"];

fn stats(raw: &[String]) -> Result<(), String> {
    let mut a = Args::parse(raw)?;
    let mut client = connect(&mut a)?;
    let json = a.switch("--json");
    a.done()?;
    let topic = a.words.first().cloned();
    let sections = client.stats(topic.as_deref()).map_err(|e| e.to_string())?;
    if json {
        let obj = |kv: &[(String, u64)]| {
            let fields: Vec<String> = kv.iter().map(|(k, v)| format!("\"{}\":{v}", json_escape(k))).collect();
            format!("{{{}}}", fields.join(","))
        };
        let broker = sections.iter().find(|s| s.0.is_empty()).map_or_else(|| "{}".into(), |s| obj(&s.1));
        let topics: Vec<String> = sections
            .iter()
            .filter(|s| !s.0.is_empty())
            .map(|s| format!("\"{}\":{}", json_escape(&s.0), obj(&s.1)))
            .collect();
        println!("{{\"broker\":{broker},\"topics\":{{{}}}}}", topics.join(","));
        return Ok(());
    }
    let width = sections.iter().map(|s| s.0.len()).max().unwrap_or(5).max(5);
    print!("{:<width$}", "topic");
    for c in STAT_COLUMNS {
        print!(" {c:>13}");
    }
    println!();
    for (name, kv) in sections.iter().filter(|s| !s.0.is_empty()) {
        print!("{name:<width$}");
        for c in STAT_COLUMNS {
            let v = kv.iter().find(|k| k.0 == *c).map_or(0, |k| k.1);
            print!(" {v:>13}");
        }
        println!();
    }
    Ok(())
}

fn json_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '"' => vec!['\\', '"'],
            '\\' => vec!['\\', '\\'],
            c if (c as u32) < 0x20 => format!("\\u{:04x}", c as u32).chars().collect(),
            c => vec![c],
        })
        .collect()
}

fn admin(cmd: &str, raw: &[String]) -> Result<(), String> {
    let mut a = Args::parse(raw)?;
    let mut client = connect(&mut a)?;
    let settings = TopicSettings {
        ack_timeout_ms: a.num("--ack-timeout-ms")?.unwrap_or(0),
        max_deliveries: a.num("--max-deliveries")?.unwrap_or(0),
    };
    let count: u32 = a.num("--count")?.unwrap_or(0);
    a.done()?;
    let e = |e: runnel::client::Error| e.to_string();
    match cmd {
        "topics" => {
            for (name, s) in client.list_topics().map_err(e)? {
                println!("{name} ack_timeout_ms={} max_deliveries={}", s.ack_timeout_ms, s.max_deliveries);
            }
        }
        "create" => {
            let created = client.create_topic(a.topic()?, settings).map_err(e)?;
            println!("{}", if created { "created" } else { "updated" });
        }
        "delete" => println!("deleted, {} messages removed", client.delete_topic(a.topic()?).map_err(e)?),
        "purge" => println!("purged {} messages", client.purge_topic(a.topic()?).map_err(e)?),
        "redrive" => println!("moved {} messages", client.redrive(a.topic()?, count).map_err(e)?),
        _ => unreachable!("dispatched by main"),
    }
    Ok(())
}
