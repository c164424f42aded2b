//! The `runnel` command: `serve` runs the broker; the other subcommands are
//! small clients built on `runnel::client`.
//!
//! Every subcommand is described once, by a `Sub` (its words and its flags
//! with their defaults, in `main/subs.rs`): that description is both its
//! `--help` and the set of flags its parser accepts, so the two cannot
//! drift apart. `serve`'s
//! flags, its config file and `--print-config` are `runnel::config`, which
//! tests share.

#![deny(unsafe_code)]
// Functions fit on a screen: the threshold is in clippy.toml, and CI runs
// clippy with -D warnings, so a longer function fails the build.
#![warn(clippy::too_many_lines)]

use std::io::{self, BufRead, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use runnel::client::{Client, GroupLine, Inspection, ProduceMessage, State};
use runnel::codec::group::{GroupSettings, Start};
use runnel::codec::{DeadReason, TopicOptions, TopicSettings, props};
use runnel::config::{Args, ArgsError, DEFAULT_ADDR, Serve};
use runnel::log::{FsyncMode, Log};
use runnel::reactor::Reactor;
use runnel::sys;

#[path = "main/consume.rs"]
mod consume;
#[path = "main/subs.rs"]
mod subs;
use consume::{CONSUME_CREDIT_DEFAULT, CONSUME_WAIT_MS_DEFAULT};
use subs::{START_VALUES, Sub, sub, top_usage, top_usage_line, usage, usage_line, version_text};

/// Lines `runnel produce` sends in one PRODUCE frame by default.
const PRODUCE_BATCH_DEFAULT: usize = 256;

/// Exit status of a command line that is wrong (as `EX_USAGE` and most
/// Unix tools): a script can tell a typo from a broker that said no (1).
const EXIT_USAGE: u8 = 2;
/// Exit status when stdout's reader went away before everything was
/// written: what a shell reports for `cat` killed by SIGPIPE (128 + 13).
const EXIT_STDOUT_CLOSED: u8 = 141;

// ---------------------------------------------------------------------------
// Dispatch and exit statuses.
// ---------------------------------------------------------------------------

/// How a command ends, other than by doing its work. Each has its own exit
/// status, so a script can tell them apart.
#[derive(Debug)]
enum Exit {
    /// `-h` or `--help` was given: the subcommand's usage goes to stdout.
    Help,
    /// The command line or config file is wrong (status 2): the message
    /// names the argument, and the usage line follows it.
    Usage(String),
    /// The command could not do its work (status 1).
    Failed(String),
    /// Whoever read stdout stopped reading (`runnel stats | head -1`): the
    /// command ends quietly with status 141, as `cat` and `grep` do.
    StdoutClosed,
}

/// A command line or config file that was not taken.
impl From<ArgsError> for Exit {
    fn from(e: ArgsError) -> Exit {
        match e {
            ArgsError::Help => Exit::Help,
            ArgsError::Usage(e) => Exit::Usage(e),
        }
    }
}

/// An error while doing the work (not while reading the arguments).
impl From<String> for Exit {
    fn from(e: String) -> Exit {
        Exit::Failed(e)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let Some((cmd, rest)) = args.split_first() else {
        say(&top_usage());
        return ExitCode::from(EXIT_USAGE);
    };
    let outcome = match cmd.as_str() {
        "-h" | "--help" => emit(top_usage().as_bytes()),
        "-V" | "--version" => emit(version_text().as_bytes()),
        "help" => help(rest),
        _ => run(cmd, rest),
    };
    match outcome {
        Ok(()) | Err(Exit::Help) => ExitCode::SUCCESS,
        Err(Exit::Usage(e)) => {
            let (prefix, line) = match sub(cmd) {
                Some(s) => (format!("runnel {cmd}"), usage_line(&s)),
                None => ("runnel".to_string(), top_usage_line()),
            };
            say(&format!("{prefix}: {e}\n{line}"));
            ExitCode::from(EXIT_USAGE)
        }
        Err(Exit::Failed(e)) => {
            say(&format!("runnel {cmd}: {e}"));
            ExitCode::FAILURE
        }
        Err(Exit::StdoutClosed) => ExitCode::from(EXIT_STDOUT_CLOSED),
    }
}

/// `runnel help [COMMAND]`.
fn help(rest: &[String]) -> Result<(), Exit> {
    match rest {
        [] => emit(top_usage().as_bytes()),
        [cmd] => match sub(cmd) {
            Some(s) => emit(usage(&s).as_bytes()),
            None => Err(Exit::Usage(format!("no command {cmd:?} to help with"))),
        },
        _ => Err(Exit::Usage(format!("help takes one command, not {rest:?}"))),
    }
}

/// Runs subcommand `cmd`; its `--help` prints its usage.
fn run(cmd: &str, rest: &[String]) -> Result<(), Exit> {
    let Some(sub) = sub(cmd) else {
        return Err(Exit::Usage(format!("unknown command {cmd:?}")));
    };
    let outcome = match sub.name {
        "serve" => serve(rest),
        "produce" => produce(rest, &sub),
        "consume" => consume::consume(rest, &sub),
        "stats" => stats(rest, &sub),
        "groups" => groups(rest, &sub),
        "group" => group(rest, &sub),
        "cancel" => cancel(rest, &sub),
        "lookup" => lookup(rest, &sub),
        "peek" => peek(rest, &sub),
        _ => admin(rest, &sub),
    };
    match outcome {
        Err(Exit::Help) => emit(usage(&sub).as_bytes()),
        other => other,
    }
}

/// Writes `out` to stdout. A reader that went away is not an error worth
/// a message: the command ends quietly.
fn emit(out: &[u8]) -> Result<(), Exit> {
    let mut stdout = io::stdout().lock();
    match stdout.write_all(out).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Err(Exit::StdoutClosed),
        Err(e) => Err(Exit::Failed(format!("writing to stdout: {e}"))),
    }
}

/// Writes a line to stderr. If stderr is gone too there is no one left to
/// tell, so a failure is ignored rather than turned into a panic.
fn say(text: &str) {
    let _ = writeln!(io::stderr().lock(), "{}", text.trim_end());
}

// ---------------------------------------------------------------------------
// The subcommands.
// ---------------------------------------------------------------------------

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

/// `runnel serve --repair --dry-run`: reads the log through and prints what a
/// start finds and what --repair would drop, changing nothing. Fails (exit
/// 1) when the log is damaged, so a script can tell.
fn dry_run(data_dir: &std::path::Path) -> Result<(), Exit> {
    let report = Log::inspect(data_dir).map_err(|e| e.to_string())?;
    emit(report.to_string().as_bytes())?;
    if report.damaged() {
        return Err(Exit::Failed("the commit log is damaged: see above; nothing was changed".into()));
    }
    Ok(())
}

fn serve(raw: &[String]) -> Result<(), Exit> {
    let s = Serve::parse(raw)?;
    if s.print_config {
        return emit(s.config_text().as_bytes());
    }
    if s.dry_run {
        return dry_run(&s.cfg.data_dir);
    }
    if let Some(core) = s.pin_core {
        sys::pin_to_core(core).map_err(|e| format!("--pin-core {core}: {e}"))?;
        log::info!("pinned the event loop to CPU {core}");
    }
    if let Some(fds) = sys::raise_fd_limit() {
        let need = u64::from(s.cfg.broker.limits.connections_max) + 64;
        if fds < need {
            log::warn!(
                "the open-file limit ({fds}) is below connections-max + 64 ({need}); accepts will fail before connections-max is reached"
            );
        }
    }
    let memory_only = s.cfg.memory_only;
    let storage = storage_text(&s);
    let mut reactor = Reactor::bind(s.cfg)?;
    handle_signals(&mut reactor)?;
    if let Some(m) = reactor.metrics_addr() {
        log::info!("metrics on http://{m}/metrics");
    }
    if memory_only {
        log::warn!(
            "memory-only: no commit log, no data directory; every message, topic and consumer group is lost when this process stops, restarts or crashes"
        );
    }
    log::info!("runnel serving on {} ({storage})", reactor.local_addr());
    reactor.run().map_err(|e| format!("event loop: {e}"))?;
    log::info!("stopped cleanly");
    Ok(())
}

/// Where the broker keeps its messages, as its start says it.
fn storage_text(s: &Serve) -> String {
    if s.cfg.memory_only {
        return "memory-only: acknowledged messages live in this process only".into();
    }
    let fsync = match s.cfg.log.fsync {
        FsyncMode::Turn => "turn: a produce is acknowledged after the fdatasync that covers it",
        FsyncMode::Never => "never: page cache only; a machine crash can lose acknowledged messages",
    };
    format!("data {}, fsync {fsync}", s.cfg.data_dir.display())
}

/// Takes `--addr` (every client subcommand has it).
fn addr(a: &mut Args) -> String {
    a.take("--addr").unwrap_or_else(|| DEFAULT_ADDR.into())
}

/// Connects to the broker at `addr`, presenting RUNNEL_AUTH_TOKEN if set.
fn connect(addr: &str) -> Result<Client, Exit> {
    let token = std::env::var("RUNNEL_AUTH_TOKEN").unwrap_or_default();
    Client::connect_with(addr, token.as_bytes()).map_err(|e| Exit::Failed(format!("cannot talk to {addr}: {e}")))
}

/// The tags and headers `runnel produce` gives every message, from its
/// `--tag` and `--header KEY[=VALUE]` flags (a key alone: an empty value).
struct ProduceProps {
    tags: Vec<String>,
    /// (key, value).
    headers: Vec<(String, String)>,
    /// The delivery time: (property type, value), from `--delay-ms` or
    /// `--at`.
    time: Option<(u8, u64)>,
    /// The key, from `--key`.
    key: Option<String>,
    /// `--dedup ID`: line N of the input gets the dedup id `ID:N`.
    dedup: Option<String>,
}

impl ProduceProps {
    fn take(a: &mut Args) -> Result<ProduceProps, Exit> {
        let tags = a.take_all("--tag");
        let mut headers = Vec::new();
        for h in a.take_all("--header") {
            let (k, v) = h.split_once('=').unwrap_or((&h, ""));
            if k.is_empty() {
                return Err(Exit::Usage(format!("--header {h:?}: give KEY=VALUE, with a key")));
            }
            headers.push((k.to_string(), v.to_string()));
        }
        let delay: Option<u64> = a.num("--delay-ms")?;
        let at = a.take("--at").map(|v| deliver_at_ms(&v)).transpose()?;
        let time = match (delay, at) {
            (Some(_), Some(_)) => return Err(Exit::Usage("give --delay-ms or --at, not both".into())),
            (Some(ms), None) => Some((props::PROP_DELAY, ms)),
            (None, Some(ms)) => Some((props::PROP_DELIVER_AT, ms)),
            (None, None) => None,
        };
        let key = a.take("--key");
        if key.as_deref() == Some("") {
            return Err(Exit::Usage("--key: give a key of at least one byte".into()));
        }
        let dedup = a.take("--dedup");
        if dedup.as_deref() == Some("") {
            return Err(Exit::Usage("--dedup: give a non-empty ID".into()));
        }
        Ok(ProduceProps { tags, headers, time, key, dedup })
    }
    /// Whether the messages carry nothing but their payload.
    fn is_empty(&self) -> bool {
        self.tags.is_empty()
            && self.headers.is_empty()
            && self.time.is_none()
            && self.key.is_none()
            && self.dedup.is_none()
    }
    /// `payload`, line `line` of the input, as a message with these
    /// properties.
    fn message<'a>(&'a self, payload: &'a [u8], line: u64) -> ProduceMessage<'a> {
        let m = ProduceMessage::new(payload);
        let m = match &self.dedup {
            Some(id) => m.dedup_id(format!("{id}:{line}").as_bytes()),
            None => m,
        };
        let m = self.tags.iter().fold(m, |m, t| m.tag(t));
        let m = self.headers.iter().fold(m, |m, (k, v)| m.header(k, v.as_bytes()));
        let m = match &self.key {
            Some(k) => m.key(k.as_bytes()),
            None => m,
        };
        match self.time {
            Some((props::PROP_DELAY, ms)) => m.delay(ms),
            Some((_, ms)) => m.deliver_at(ms),
            None => m,
        }
    }
    /// Bytes they add to each message on the wire, about.
    fn bytes(&self) -> usize {
        let tags: usize = self.tags.iter().map(|t| 3 + t.len()).sum();
        let time = if self.time.is_some() { 3 + props::PROP_TIME_BYTES } else { 0 };
        let key = self.key.as_ref().map_or(0, |k| 3 + k.len());
        let dedup = self.dedup.as_ref().map_or(0, |id| 3 + id.len() + 21);
        tags + time + key + dedup + self.headers.iter().map(|(k, v)| 5 + k.len() + v.len()).sum::<usize>()
    }
}

fn produce(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let mut a = Args::parse(raw, &sub.flags)?;
    let addr = addr(&mut a);
    let batch_max: usize = a.num("--batch")?.unwrap_or(PRODUCE_BATCH_DEFAULT).max(1);
    let props = ProduceProps::take(&mut a)?;
    a.done()?;
    let topic = a.topic()?.to_string();
    let mut client = connect(&addr)?;
    let bytes_max = (client.limits.frame_bytes_max as usize / 2).max(1024);
    let mut batch: Vec<Vec<u8>> = Vec::new();
    let mut batch_bytes = 0;
    let mut sent = 0u64;
    let stdin = io::stdin();
    let mut send = |batch: &mut Vec<Vec<u8>>, client: &mut Client| -> Result<(), String> {
        if batch.is_empty() {
            return Ok(());
        }
        let done = if props.is_empty() {
            client.produce_batch(&topic, batch).map(|_| ())
        } else {
            let messages: Vec<ProduceMessage<'_>> =
                batch.iter().zip(sent..).map(|(p, line)| props.message(p, line)).collect();
            client.produce_messages_ids(&topic, &messages).map(|_| ())
        };
        done.map_err(|e| format!("after {sent} acknowledged messages: {e}"))?;
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
        batch_bytes += line.len() + 4 + props.bytes();
        batch.push(line);
    }
    Ok(send(&mut batch, &mut client)?)
}

/// A start position: `earliest`, `latest`, a message id, `@MS` (ms since
/// the Unix epoch) or a UTC time `YYYY-MM-DDTHH:MM:SS[.mmm]Z`.
fn parse_start(flag: &str, v: &str) -> Result<Start, Exit> {
    let bad = || Exit::Usage(format!("{flag} {v:?}: give {START_VALUES}"));
    Ok(match v {
        "earliest" => Start::Earliest,
        "latest" => Start::Latest,
        _ if v.starts_with('@') => Start::Time(v[1..].parse().map_err(|_| bad())?),
        _ if v.bytes().all(|b| b.is_ascii_digit()) => Start::Id(v.parse().map_err(|_| bad())?),
        _ => Start::Time(utc_ms(v).ok_or_else(bad)?),
    })
}

/// The time `--at` names: `MS` or `@MS` (ms since the Unix epoch) or a UTC time
/// `YYYY-MM-DDTHH:MM:SS[.mmm]Z`.
fn deliver_at_ms(v: &str) -> Result<u64, Exit> {
    let bad = || Exit::Usage(format!("--at {v:?}: give MS, @MS or YYYY-MM-DDTHH:MM:SS[.mmm]Z"));
    let ms = v.strip_prefix('@').unwrap_or(v);
    match ms.bytes().all(|b| b.is_ascii_digit()) {
        true => ms.parse().map_err(|_| bad()),
        false => utc_ms(v).ok_or_else(bad),
    }
}

/// `runnel cancel TOPIC ID`: prints the time the message was due.
fn cancel(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let mut a = Args::parse(raw, &sub.flags)?;
    let addr = addr(&mut a);
    a.done()?;
    let [topic, id] = a.words() else {
        return Err(Exit::Usage("give the topic and the id of the scheduled message".into()));
    };
    let id: u64 = id.parse().map_err(|_| Exit::Usage(format!("message id {id:?} is not a number")))?;
    let due = connect(&addr)?.cancel(topic, id).map_err(|e| Exit::Failed(e.to_string()))?;
    emit(format!("cancelled, it was due at {due}\n").as_bytes())
}

/// `runnel lookup TOPIC KEY`: each message, newest first, with its state
/// in every group.
fn lookup(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let mut a = Args::parse(raw, &sub.flags)?;
    let addr = addr(&mut a);
    a.done()?;
    let [topic, key] = a.words() else {
        return Err(Exit::Usage("give the topic and the key".into()));
    };
    let found = connect(&addr)?.lookup(topic, key.as_bytes()).map_err(|e| Exit::Failed(e.to_string()))?;
    if found.is_empty() {
        return emit(format!("no message of {topic} has key {key:?} (or the index forgot it)\n").as_bytes());
    }
    emit(found.iter().map(inspection_text).collect::<String>().as_bytes())
}

/// `runnel peek TOPIC ID`: the message, its state in every group, then its
/// payload.
fn peek(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let mut a = Args::parse(raw, &sub.flags)?;
    let addr = addr(&mut a);
    a.done()?;
    let [topic, id] = a.words() else {
        return Err(Exit::Usage("give the topic and the id of the message".into()));
    };
    let id: u64 = id.parse().map_err(|_| Exit::Usage(format!("message id {id:?} is not a number")))?;
    let found = connect(&addr)?.peek(topic, id).map_err(|e| Exit::Failed(e.to_string()))?;
    let payload = found.message.as_ref().and_then(|m| m.payload.as_deref()).unwrap_or_default();
    let text = format!("{}payload: {}\n", inspection_text(&found), String::from_utf8_lossy(payload));
    emit(text.as_bytes())
}

/// A message and its state in every group, one line each.
fn inspection_text(i: &Inspection) -> String {
    let mut out = format!("message {}", i.id);
    match &i.message {
        None => out.push_str(": no longer held (every group is done with it)"),
        Some(m) => {
            let key = m.key().map_or("none".into(), |k| format!("{:?}", String::from_utf8_lossy(k)));
            out.push_str(&format!(": born_ms {} key {key} payload {} bytes", m.born_ms, m.len));
            if let Some(d) = m.dead {
                let why = d.reason.name();
                out.push_str(&format!(
                    ", dead letter of {} ({why} after {} deliveries)",
                    d.origin_id, d.origin_deliveries
                ));
            }
        }
    }
    out.push('\n');
    for g in &i.groups {
        out.push_str(&group_line_text(g));
    }
    out
}

/// One group's line of `inspection_text`.
fn group_line_text(g: &GroupLine) -> String {
    let name = if g.group.is_empty() { "(default)" } else { &g.group };
    let mut line = format!("  {name:<16} {:<14}", g.state.name());
    match g.state {
        State::InFlight => line.push_str(&format!(" to consumer {} until {}", g.consumer, g.until_ms)),
        State::Waiting | State::RetryWaiting | State::Scheduled => line.push_str(&format!(" until {}", g.until_ms)),
        State::DeadLettered => {
            let why = DeadReason::from_u8(g.dead_reason).map_or("?", DeadReason::name);
            line.push_str(&format!(" {why}"));
            if !g.last_nack_reason.is_empty() {
                line.push_str(&format!(", last NACK: {:?}", g.last_nack_reason));
            }
        }
        _ => {}
    }
    if g.deliveries > 0 {
        line.push_str(&format!(" deliveries {}", g.deliveries));
    }
    if g.consumer != 0 && g.state != State::InFlight {
        line.push_str(&format!(" (member of consumer {})", g.consumer));
    }
    let mut line = line.trim_end().to_string();
    line.push('\n');
    line
}

/// Ms since the Unix epoch of `YYYY-MM-DDTHH:MM:SS[.mmm]Z`.
fn utc_ms(v: &str) -> Option<u64> {
    let v = v.strip_suffix('Z')?;
    let (date, time) = v.split_once('T')?;
    let num = |s: &str| s.parse::<i64>().ok();
    let d: Vec<i64> = date.split('-').map(num).collect::<Option<_>>()?;
    let (time, frac) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<i64> = time.split(':').map(num).collect::<Option<_>>()?;
    let ([y, m, day], [h, min, sec]) = (d.as_slice(), t.as_slice()) else { return None };
    let ms_frac = num(&format!("{frac:0<3}")[..3])?;
    let valid = (1..=12).contains(m) && (1..=31).contains(day) && *h < 24 && *min < 60 && *sec < 61;
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m) = if *m <= 2 { (y - 1, m + 9) } else { (*y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let ms = ((days * 24 + h) * 60 + min) * 60_000 + sec * 1000 + ms_frac;
    (valid && ms >= 0).then_some(ms as u64)
}

/// `runnel group`'s settings and start, from `--from`, `--tags`,
/// `--broadcast`, `--ordered`, `--ack-timeout-ms`, `--max-deliveries` and
/// `--retry`: None if none was given. (A consume takes its own few,
/// `consume::Wanted`, and never changes a group.)
fn group_flags<'a>(
    a: &mut Args,
    from_flag: &str,
    filter: &'a mut String,
) -> Result<Option<(GroupSettings<'a>, Start)>, Exit> {
    let from = a.take(from_flag);
    let tags = a.take("--tags");
    let broadcast = a.switch("--broadcast");
    let ordered = a.switch("--ordered");
    let ack_timeout_ms: Option<u32> = a.num("--ack-timeout-ms")?;
    let max_deliveries: Option<u16> = a.num("--max-deliveries")?;
    let retry = a.take("--retry").map(|v| runnel::queue::RetryPolicy::parse(&v)).transpose().map_err(Exit::Usage)?;
    if from.is_none()
        && tags.is_none()
        && !broadcast
        && !ordered
        && ack_timeout_ms.is_none()
        && max_deliveries.is_none()
        && retry.is_none()
    {
        return Ok(None);
    }
    let start = from.map_or(Ok(Start::Earliest), |v| parse_start(from_flag, &v))?;
    *filter = tags.unwrap_or_default();
    let settings = GroupSettings {
        broadcast,
        ack_timeout_ms: ack_timeout_ms.unwrap_or(0),
        max_deliveries: max_deliveries.unwrap_or(0),
        filter: filter.as_str(),
        ordered,
        retry,
    };
    Ok(Some((settings, start)))
}

/// The columns `runnel groups` prints, after the group's name.
const GROUP_COLUMNS: [&str; 8] =
    ["lag", "inflight", "retry", "delayed", "dead_lettered", "oldest_unacked_ms", "consumers", "filter"];

fn groups(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let mut a = Args::parse(raw, &sub.flags)?;
    let addr = addr(&mut a);
    a.done()?;
    let topic = a.topic()?.to_string();
    let list = connect(&addr)?.list_groups(&topic).map_err(|e| e.to_string())?;
    let shown = |name: &str| if name.is_empty() { "(default)".to_string() } else { name.to_string() };
    let width = list.iter().map(|g| shown(&g.name).len()).max().unwrap_or(5).max(5);
    let mut out = format!("{:<width$}", "group");
    for c in GROUP_COLUMNS {
        out += &format!(" {c:>13}");
    }
    out.push('\n');
    for g in &list {
        let s = &g.stats;
        out += &format!("{:<width$}", shown(&g.name));
        for v in [s.lag, s.inflight, s.retry, s.delayed, s.dead_lettered, s.oldest_unacked_age_ms, s.consumers.into()] {
            out += &format!(" {v:>13}");
        }
        let filter = if g.filter.is_empty() { "*" } else { &g.filter };
        let modes = [(g.broadcast, " broadcast"), (g.ordered, " ordered")];
        let mut modes: String = modes.iter().filter(|m| m.0).map(|m| m.1).collect();
        if let Some(p) = &g.retry {
            modes += &format!(" retry={p}");
        }
        out += &format!(" {filter:>13}{modes}\n");
    }
    emit(out.as_bytes())
}

/// `runnel group create|delete|reset TOPIC GROUP`.
fn group(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let mut a = Args::parse(raw, &sub.flags)?;
    let addr = addr(&mut a);
    let to = a.take("--to");
    let mut filter = String::new();
    let settings = group_flags(&mut a, "--from", &mut filter)?;
    a.done()?;
    let [verb, topic, name] = a.words() else {
        return Err(Exit::Usage("give create, delete or reset, then the topic and the group".into()));
    };
    let e = |e: runnel::client::Error| Exit::Failed(e.to_string());
    let out = match verb.as_str() {
        "create" => {
            let (settings, start) = settings.unwrap_or((GroupSettings::default(), Start::Earliest));
            let (created, cursor) = connect(&addr)?.create_group(topic, name, settings, start).map_err(e)?;
            format!("{} at {cursor}\n", if created { "created" } else { "updated" })
        }
        "delete" => format!("deleted, it held {}\n", messages(connect(&addr)?.delete_group(topic, name).map_err(e)?)),
        "reset" => {
            let to = to.ok_or_else(|| Exit::Usage("reset needs --to".into()))?;
            let start = parse_start("--to", &to)?;
            format!("moved to {}\n", connect(&addr)?.reset_group(topic, name, start).map_err(e)?)
        }
        other => return Err(Exit::Usage(format!("unknown group action {other:?}: create, delete or reset"))),
    };
    emit(out.as_bytes())
}

/// The per-topic columns `runnel stats` prints.
const STAT_COLUMNS: &[&str] = &["ready", "inflight", "dead_lettered", "produced", "delivered", "redelivered", "acked"];

fn stats(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let mut a = Args::parse(raw, &sub.flags)?;
    let addr = addr(&mut a);
    let json = a.switch("--json");
    a.done()?;
    let topic = a.optional_topic()?.map(str::to_string);
    let mut client = connect(&addr)?;
    let mut sections = client.stats(topic.as_deref()).map_err(|e| e.to_string())?;
    // The groups' sections (`<topic>/<group>`) are `runnel groups`'s.
    sections.retain(|s| !s.0.contains('/'));
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
        return emit(format!("{{\"broker\":{broker},\"topics\":{{{}}}}}\n", topics.join(",")).as_bytes());
    }
    let width = sections.iter().map(|s| s.0.len()).max().unwrap_or(5).max(5);
    let mut out = format!("{:<width$}", "topic");
    for c in STAT_COLUMNS {
        out += &format!(" {c:>13}");
    }
    out.push('\n');
    for (name, kv) in sections.iter().filter(|s| !s.0.is_empty()) {
        out += &format!("{name:<width$}");
        for c in STAT_COLUMNS {
            let v = kv.iter().find(|k| k.0 == *c).map_or(0, |k| k.1);
            out += &format!(" {v:>13}");
        }
        out.push('\n');
    }
    emit(out.as_bytes())
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

/// `n` messages, in words: "1 message", "2 messages".
fn messages(n: u64) -> String {
    if n == 1 { "1 message".into() } else { format!("{n} messages") }
}

/// `topics`, `create`, `delete`, `purge` and `redrive`: one request each.
fn admin(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let mut a = Args::parse(raw, &sub.flags)?;
    let addr = addr(&mut a);
    let settings = TopicSettings {
        ack_timeout_ms: a.num("--ack-timeout-ms")?.unwrap_or(0),
        max_deliveries: a.num("--max-deliveries")?.unwrap_or(0),
    };
    let options = TopicOptions {
        retention_ms: a.num("--retain-ms")?,
        retention_bytes: a.num("--retain-bytes")?,
        ..TopicOptions::default()
    };
    let count: u32 = a.num("--count")?.unwrap_or(0);
    let group = a.take("--group").unwrap_or_default();
    a.done()?;
    let topic = match sub.name {
        "topics" => a.no_words().map(|()| "")?,
        _ => a.topic()?,
    };
    let mut client = connect(&addr)?;
    let e = |e: runnel::client::Error| Exit::Failed(e.to_string());
    let out = match sub.name {
        "topics" => {
            let mut out = String::new();
            for (name, s) in client.list_topics().map_err(e)? {
                out += &format!("{name} ack_timeout_ms={} max_deliveries={}\n", s.ack_timeout_ms, s.max_deliveries);
            }
            out
        }
        "create" => {
            let created = if options.is_empty() {
                client.create_topic(topic, settings)
            } else {
                client.create_topic_with(topic, settings, options)
            };
            format!("{}\n", if created.map_err(e)? { "created" } else { "updated" })
        }
        "delete" => format!("deleted, {} removed\n", messages(client.delete_topic(topic).map_err(e)?)),
        "purge" => format!("purged {}\n", messages(client.purge_topic(topic).map_err(e)?)),
        "redrive" if group.is_empty() => format!("moved {}\n", messages(client.redrive(topic, count).map_err(e)?)),
        "redrive" => format!("moved {}\n", messages(client.redrive_group(topic, &group, count).map_err(e)?)),
        other => unreachable!("run dispatches {other} elsewhere"),
    };
    emit(out.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_positions_parse_ids_times_and_utc_dates() {
        assert_eq!(utc_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(utc_ms("2026-12-01T12:00:00.5Z"), Some(1_796_126_400_500));
        assert_eq!(utc_ms("2000-02-29T23:59:59Z"), Some(951_868_799_000));
        for bad in ["2026-13-01T00:00:00Z", "2026-12-01 12:00:00Z", "2026-12-01T12:00:00", "1969-12-31T23:59:59Z"] {
            assert_eq!(utc_ms(bad), None, "{bad}");
        }
        let start = |v| parse_start("--from", v).ok();
        assert_eq!(start("earliest"), Some(Start::Earliest));
        assert_eq!(start("latest"), Some(Start::Latest));
        assert_eq!(start("42"), Some(Start::Id(42)));
        assert_eq!(start("@1500"), Some(Start::Time(1500)));
        assert_eq!(start("1970-01-01T00:00:01Z"), Some(Start::Time(1000)));
        assert_eq!(start("soon"), None);
        assert_eq!(deliver_at_ms("@1500").ok(), Some(1500));
        assert_eq!(deliver_at_ms("1970-01-01T00:00:01Z").ok(), Some(1000));
        assert_eq!(deliver_at_ms("1500").ok(), Some(1500));
        assert!(deliver_at_ms("soon").is_err());
    }
}
