//! The `runnel` command: `serve` runs the broker; the other subcommands are
//! small clients built on `runnel::client`.
//!
//! Every subcommand is described once, by a `Sub` (its words and its flags
//! with their defaults): that description is both its `--help` and the set
//! of flags its parser accepts, so the two cannot drift apart.

#![deny(unsafe_code)]

use std::fmt::Display;
use std::io::{self, BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use runnel::client::{Client, Fetch};
use runnel::codec::{self, TopicSettings};
use runnel::limits::Limits;
use runnel::log::{FsyncMode, Log};
use runnel::reactor::{Reactor, ServeConfig};
use runnel::sys;

/// Where `runnel serve` listens and clients connect by default.
const DEFAULT_ADDR: &str = "127.0.0.1:7700";
/// Where `runnel serve` keeps its commit log by default.
const DEFAULT_DATA: &str = "runnel-data";
/// Lines `runnel produce` sends in one PRODUCE frame by default.
const PRODUCE_BATCH_DEFAULT: usize = 256;
/// How long each FETCH of `runnel consume` waits for a message by default.
const CONSUME_WAIT_MS_DEFAULT: u32 = 1000;

/// Exit status of a command line that is wrong (as `EX_USAGE` and most
/// Unix tools): a script can tell a typo from a broker that said no (1).
const EXIT_USAGE: u8 = 2;
/// Exit status when stdout's reader went away before everything was
/// written: what a shell reports for `cat` killed by SIGPIPE (128 + 13).
const EXIT_STDOUT_CLOSED: u8 = 141;

// ---------------------------------------------------------------------------
// The subcommands and their flags, as `--help` shows them.
// ---------------------------------------------------------------------------

/// One flag of a subcommand.
struct Flag {
    /// The flag with its dashes, e.g. `--batch`.
    name: &'static str,
    /// What its value is called in the usage; empty for a switch, which is
    /// off unless given.
    value: &'static str,
    /// Its default, as a user reads it; empty for a switch.
    default: String,
    /// What it does, in a few words.
    what: &'static str,
}

fn flag(name: &'static str, value: &'static str, default: impl Display, what: &'static str) -> Flag {
    Flag { name, value, default: default.to_string(), what }
}

fn switch(name: &'static str, what: &'static str) -> Flag {
    Flag { name, value: "", default: String::new(), what }
}

/// A subcommand: what its usage says and which flags it accepts.
struct Sub {
    /// Its name after `runnel`.
    name: &'static str,
    /// Its positional words, as the usage line shows them.
    words: &'static str,
    /// What it does, in one line.
    about: &'static str,
    /// What else a user should know: environment variables, the config file.
    notes: &'static str,
    /// Every flag it takes.
    flags: Vec<Flag>,
}

/// The subcommands, in the order `runnel --help` lists them.
const COMMANDS: [&str; 9] = ["serve", "produce", "consume", "stats", "topics", "create", "delete", "purge", "redrive"];

/// What the client subcommands say about the token.
const CLIENT_NOTES: &str = "RUNNEL_AUTH_TOKEN, if set, is the token presented in HELLO.";

/// The description of subcommand `name`, or None if there is none.
fn sub(name: &str) -> Option<Sub> {
    let name = *COMMANDS.iter().find(|c| **c == name)?;
    let addr = || flag("--addr", "ADDR", DEFAULT_ADDR, "the broker to talk to");
    let (words, about, flags) = match name {
        "serve" => ("", "run the broker", serve_flags()),
        "produce" => (
            "TOPIC",
            "send each line of stdin to TOPIC as one message, until all are acknowledged",
            vec![addr(), flag("--batch", "N", PRODUCE_BATCH_DEFAULT, "most lines in one PRODUCE frame")],
        ),
        "consume" => (
            "TOPIC",
            "print TOPIC's messages one a line, acknowledging each once printed, until a wait finds none",
            vec![
                addr(),
                flag("--count", "N", "no limit", "stop after N messages"),
                flag("--wait-ms", "MS", CONSUME_WAIT_MS_DEFAULT, "how long each FETCH waits for a message"),
            ],
        ),
        "stats" => (
            "[TOPIC]",
            "print the counters of every topic (or of TOPIC)",
            vec![addr(), switch("--json", "print the broker's and the topics' counters as one JSON object")],
        ),
        "topics" => ("", "list the topics and their settings", vec![addr()]),
        "create" => (
            "TOPIC",
            "create TOPIC, or change its settings",
            vec![
                addr(),
                flag("--ack-timeout-ms", "MS", "the broker's", "time a consumer has to acknowledge a delivery"),
                flag("--max-deliveries", "N", "the broker's", "deliveries before a message moves to TOPIC.dlq"),
            ],
        ),
        "delete" => ("TOPIC", "delete TOPIC and its messages", vec![addr()]),
        "purge" => ("TOPIC", "remove every message of TOPIC, keeping the topic", vec![addr()]),
        "redrive" => (
            "TOPIC",
            "move the messages of TOPIC.dlq back to TOPIC",
            vec![addr(), flag("--count", "N", "all", "most messages to move")],
        ),
        _ => return None,
    };
    let notes = if name == "serve" { SERVE_NOTES } else { CLIENT_NOTES };
    Some(Sub { name, words, about, notes, flags })
}

/// What `runnel serve --help` says besides its flags.
const SERVE_NOTES: &str = "\
Every flag but --config is also a key of the config file: `key = value`, the
flag without its dashes. RUNNEL_AUTH_TOKEN sets --auth-token; RUST_LOG sets
the log level (default info). SIGTERM or SIGINT stops the broker gracefully.";

/// `runnel serve`'s flags: the flag, its value's name (empty for a switch)
/// and what it does. Their defaults are read from the default
/// configuration, as `--print-config` writes it.
const SERVE_FLAGS: &[(&str, &str, &str)] = &[
    ("--config", "FILE", "read flags from FILE; the command line overrides them"),
    ("--print-config", "", "print the effective configuration as a config file, and exit"),
    ("--listen", "ADDR", "where clients connect"),
    ("--data", "DIR", "the commit log's directory, locked against a second broker"),
    ("--fsync", "turn|never", "answer a PRODUCE after the fdatasync that covers it, or after the write"),
    ("--segment-bytes-max", "N", "size of one log segment file"),
    ("--repair", "", "start past log corruption, dropping only the damaged records"),
    ("--dry-run", "", "with --repair: report what a start (and repair) would drop, change nothing, exit"),
    ("--no-auto-create", "", "PRODUCE and FETCH on a missing topic get UNKNOWN_TOPIC"),
    ("--ack-timeout-ms", "MS", "a new topic's time to acknowledge a delivery"),
    ("--max-deliveries", "N", "a new topic's deliveries before a message moves to its .dlq"),
    ("--auth-token", "TOKEN", "the secret every HELLO must carry"),
    ("--metrics", "ADDR", "serve GET /metrics and /healthz over HTTP here"),
    ("--pin-core", "N", "pin the event loop to CPU N"),
    ("--spin-us", "US", "poll without blocking for up to US µs before sleeping"),
    ("--frame-bytes-max", "N", "largest frame a client may send"),
    ("--message-bytes-max", "N", "largest payload of one message"),
    ("--batch-messages-max", "N", "most messages in a PRODUCE, most ids in an ACK, NACK or TOUCH"),
    ("--topic-name-bytes-max", "N", "longest topic name"),
    ("--topics-max", "N", "most topics (dead-letter topics not counted)"),
    ("--topic-messages-max", "N", "most unacknowledged messages in one topic"),
    ("--topic-bytes-max", "N", "most unacknowledged payload bytes in one topic"),
    ("--connections-max", "N", "most client connections at once"),
    ("--output-bytes-max", "N", "most reply bytes waiting for one client"),
    ("--buffered-bytes-max", "N", "most bytes all client connections' buffers may take together"),
    ("--fetch-bytes-max", "N", "most message bytes in one FETCH reply"),
    ("--fetch-wait-ms-max", "MS", "longest wait a FETCH may ask for"),
    ("--read-bytes-per-turn-max", "N", "most bytes read from one connection in one loop turn"),
    ("--handshake-timeout-ms", "MS", "time a new connection has to send HELLO"),
    ("--idle-timeout-ms", "MS", "time a connection may stay silent; 0 for no limit"),
    ("--frame-timeout-ms", "MS", "time a frame may stay incomplete"),
];

/// The configuration `runnel serve` runs with when given no flags.
fn default_serve() -> Serve {
    let listen = DEFAULT_ADDR.parse().expect("DEFAULT_ADDR is an IP:PORT");
    Serve {
        cfg: ServeConfig::new(listen, PathBuf::from(DEFAULT_DATA)),
        pin_core: None,
        print_config: false,
        dry_run: false,
    }
}

/// `runnel serve`'s flags with their defaults.
fn serve_flags() -> Vec<Flag> {
    let defaults = config_text(&default_serve());
    let default_of = |name: &str| {
        let key = name.trim_start_matches('-');
        let v = defaults.lines().find_map(|l| l.strip_prefix(key)?.trim_start().strip_prefix('=').map(str::trim));
        v.filter(|v| !v.is_empty()).unwrap_or("none").to_string()
    };
    SERVE_FLAGS
        .iter()
        .map(|&(name, value, what)| match value {
            "" => switch(name, what),
            _ => Flag { name, value, default: default_of(name), what },
        })
        .collect()
}

/// The one line a wrong command line is answered with.
fn usage_line(sub: &Sub) -> String {
    let words = if sub.words.is_empty() { String::new() } else { format!(" {}", sub.words) };
    format!("usage: runnel {} [FLAGS]{words}   (runnel {} --help lists the flags)", sub.name, sub.name)
}

/// A subcommand's `--help`: its usage line, what it does, and every flag
/// with its default, one line each.
fn usage(sub: &Sub) -> String {
    let words = if sub.words.is_empty() { String::new() } else { format!(" {}", sub.words) };
    let mut out = format!("usage: runnel {} [FLAGS]{words}\n\n{}.\n\nflags:\n", sub.name, capitalized(sub.about));
    let shown = |f: &Flag| if f.value.is_empty() { f.name.to_string() } else { format!("{} {}", f.name, f.value) };
    let width = sub.flags.iter().map(|f| shown(f).len()).max().unwrap_or(0).max("-h, --help".len());
    for f in &sub.flags {
        let default = if f.default.is_empty() { String::new() } else { format!(" (default {})", f.default) };
        out += &format!("  {:<width$}  {}{default}\n", shown(f), f.what);
    }
    out += &format!("  {:<width$}  print this, and exit\n\n{}\n", "-h, --help", sub.notes);
    out
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next().map_or_else(String::new, |first| first.to_uppercase().chain(c).collect())
}

/// `runnel --help`: every subcommand, one line each.
fn top_usage() -> String {
    let mut out = String::from("runnel: a durable message broker on one thread\n\n");
    out += "usage: runnel COMMAND [FLAGS] [ARGS]\n\ncommands:\n";
    for sub in COMMANDS.iter().filter_map(|c| sub(c)) {
        out += &format!("  {:<16}  {}\n", format!("{} {}", sub.name, sub.words), sub.about);
    }
    out += &format!("  {:<16}  {}\n", "help [COMMAND]", "print this, or a command's flags and their defaults");
    out += "\nrunnel COMMAND --help lists the command's flags and their defaults;\n\
            runnel --version prints the version and the protocol versions it speaks.\n\
            Exit status: 0 done, 1 failed, 2 wrong arguments, 141 stdout closed early.\n";
    out
}

fn top_usage_line() -> String {
    "usage: runnel COMMAND [FLAGS] [ARGS]   (runnel --help lists the commands)".to_string()
}

/// `runnel --version`: this build and the protocol versions it speaks.
fn version_text() -> String {
    let (min, max) = (codec::VERSION_MIN, codec::VERSION_MAX);
    let protocol =
        if min == max { format!("protocol version {min}") } else { format!("protocol versions {min} to {max}") };
    format!("runnel {}\n{protocol}\n", env!("CARGO_PKG_VERSION"))
}

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
        "serve" => serve(rest, &sub),
        "produce" => produce(rest, &sub),
        "consume" => consume(rest, &sub),
        "stats" => stats(rest, &sub),
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
// Arguments.
// ---------------------------------------------------------------------------

/// Parsed `--flag value` pairs, bare `--switch`es and positional words.
struct Args {
    flags: Vec<(String, Option<String>)>,
    words: Vec<String>,
}

impl Args {
    /// Splits `args` by `sub`'s flags. An unknown flag, or one without
    /// its value, is refused by name; `-h`/`--help` asks for the usage; after
    /// `--` every argument is a word (a topic may start with `-`).
    fn parse(args: &[String], sub: &Sub) -> Result<Args, Exit> {
        let mut flags = Vec::new();
        let mut words = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "-h" | "--help" => return Err(Exit::Help),
                "--" => {
                    words.extend(it.by_ref().cloned());
                    break;
                }
                w if !w.starts_with('-') || w == "-" => {
                    words.push(a.clone());
                    continue;
                }
                _ => {}
            }
            let (name, inline) = match a.split_once('=') {
                Some((k, v)) if k.starts_with("--") => (k, Some(v.to_string())),
                _ => (a.as_str(), None),
            };
            let Some(f) = sub.flags.iter().find(|f| f.name == name) else {
                return Err(Exit::Usage(format!("unknown flag {name}")));
            };
            let value = match inline {
                Some(v) => Some(v),
                None if f.value.is_empty() => None,
                None => {
                    Some(it.next().cloned().ok_or_else(|| Exit::Usage(format!("{name} needs a value ({})", f.value)))?)
                }
            };
            flags.push((name.to_string(), value));
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
    fn num<T: std::str::FromStr>(&mut self, name: &str) -> Result<Option<T>, Exit> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| Exit::Usage(format!("{name}: {v:?} is not a valid number"))),
        }
    }
    /// Fails on flags nobody took.
    fn done(&self) -> Result<(), Exit> {
        match self.flags.first() {
            Some((k, _)) => Err(Exit::Usage(format!("unknown flag {k}"))),
            None => Ok(()),
        }
    }
    /// The one topic the command names.
    fn topic(&self) -> Result<&str, Exit> {
        match self.words.as_slice() {
            [t] => Ok(t),
            [] => Err(Exit::Usage("name a topic".into())),
            _ => Err(Exit::Usage(format!("one topic, please, not {:?}", self.words))),
        }
    }
    /// The topic the command names, if it names one.
    fn optional_topic(&self) -> Result<Option<&str>, Exit> {
        match self.words.as_slice() {
            [] => Ok(None),
            _ => self.topic().map(Some),
        }
    }
    /// Fails on words for a command that takes none.
    fn no_words(&self) -> Result<(), Exit> {
        match self.words.first() {
            Some(w) => Err(Exit::Usage(format!("unexpected argument {w:?}"))),
            None => Ok(()),
        }
    }
}

/// Sets the limit named by a `--flag`, if it is one. Every limit's flag is
/// its field name with `-` for `_`.
fn set_limit(l: &mut Limits, args: &mut Args) -> Result<(), Exit> {
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
        buffered_bytes_max,
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
fn config_file(path: &str, sub: &Sub) -> Result<Vec<String>, Exit> {
    let text = std::fs::read_to_string(path).map_err(|e| Exit::Usage(format!("--config {path}: {e}")))?;
    let mut args = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(Exit::Usage(format!("{path}:{}: want `key = value`, got {line:?}", n + 1)));
        };
        let (k, v) = (k.trim(), v.trim().trim_matches('"'));
        let flag = format!("--{k}");
        if k == "config" || !sub.flags.iter().any(|f| f.name == flag) {
            return Err(Exit::Usage(format!("{path}:{}: unknown key {k:?}", n + 1)));
        }
        args.push(format!("{flag}={v}"));
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

fn parse_serve(raw: &[String], sub: &Sub) -> Result<Serve, Exit> {
    let mut a = Args::parse(raw, sub)?;
    if let Some(path) = a.take("--config") {
        let mut all = Args::parse(&config_file(&path, sub)?, sub)?;
        // The command line's flags come last, so they win.
        all.flags.append(&mut a.flags);
        a.flags = all.flags;
    }
    let mut s = default_serve();
    if let Some(listen) = a.take("--listen") {
        s.cfg.listen = listen.parse().map_err(|e| Exit::Usage(format!("--listen {listen:?}: {e} (want IP:PORT)")))?;
    }
    if let Some(data) = a.take("--data") {
        s.cfg.data_dir = PathBuf::from(data);
    }
    let config = &mut s.cfg.broker;
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
    let cfg = &mut s.cfg;
    if let Some(v) = a.num("--segment-bytes-max")? {
        cfg.log.segment_bytes_max = v;
    }
    cfg.log.repair = a.switch("--repair");
    cfg.log.fsync = match a.take("--fsync").as_deref() {
        None | Some("turn") => FsyncMode::Turn,
        Some("never") => FsyncMode::Never,
        Some(other) => return Err(Exit::Usage(format!("--fsync {other:?}: want turn or never"))),
    };
    cfg.metrics = match a.take("--metrics") {
        Some(m) => Some(m.parse().map_err(|e| Exit::Usage(format!("--metrics {m:?}: {e} (want IP:PORT)")))?),
        None => None,
    };
    cfg.spin_us = a.num("--spin-us")?.unwrap_or(0);
    s.pin_core = a.num("--pin-core")?;
    s.print_config = a.switch("--print-config");
    s.dry_run = a.switch("--dry-run");
    a.done()?;
    a.no_words()?;
    Ok(s)
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
        ("buffered-bytes-max", l.buffered_bytes_max),
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

fn serve(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let s = parse_serve(raw, sub)?;
    if s.print_config {
        return emit(config_text(&s).as_bytes());
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

/// Takes `--addr` (every client subcommand has it).
fn addr(a: &mut Args) -> String {
    a.take("--addr").unwrap_or_else(|| DEFAULT_ADDR.into())
}

/// Connects to the broker at `addr`, presenting RUNNEL_AUTH_TOKEN if set.
fn connect(addr: &str) -> Result<Client, Exit> {
    let token = std::env::var("RUNNEL_AUTH_TOKEN").unwrap_or_default();
    Client::connect_with(addr, token.as_bytes()).map_err(|e| Exit::Failed(format!("cannot talk to {addr}: {e}")))
}

fn produce(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let mut a = Args::parse(raw, sub)?;
    let addr = addr(&mut a);
    let batch_max: usize = a.num("--batch")?.unwrap_or(PRODUCE_BATCH_DEFAULT).max(1);
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
    Ok(send(&mut batch, &mut client)?)
}

fn consume(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let mut a = Args::parse(raw, sub)?;
    let addr = addr(&mut a);
    let count: Option<u64> = a.num("--count")?;
    let wait_ms: u32 = a.num("--wait-ms")?.unwrap_or(CONSUME_WAIT_MS_DEFAULT);
    a.done()?;
    let topic = a.topic()?.to_string();
    let mut client = connect(&addr)?;
    let mut got = 0u64;
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
        // Printed before they are acknowledged: a consume cut short (its
        // stdout closed) acknowledges nothing it did not print.
        let mut out = Vec::new();
        for m in &msgs {
            out.extend_from_slice(&m.payload);
            out.push(b'\n');
        }
        emit(&out)?;
        let ids: Vec<u64> = msgs.iter().map(|m| m.id).collect();
        client.ack(&topic, &ids).map_err(|e| e.to_string())?;
        got += msgs.len() as u64;
    }
}

/// The per-topic columns `runnel stats` prints.
const STAT_COLUMNS: &[&str] = &["ready", "inflight", "dead_lettered", "produced", "delivered", "redelivered", "acked"];

fn stats(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let mut a = Args::parse(raw, sub)?;
    let addr = addr(&mut a);
    let json = a.switch("--json");
    a.done()?;
    let topic = a.optional_topic()?.map(str::to_string);
    let mut client = connect(&addr)?;
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

/// `topics`, `create`, `delete`, `purge` and `redrive`: one request each.
fn admin(raw: &[String], sub: &Sub) -> Result<(), Exit> {
    let mut a = Args::parse(raw, sub)?;
    let addr = addr(&mut a);
    let settings = TopicSettings {
        ack_timeout_ms: a.num("--ack-timeout-ms")?.unwrap_or(0),
        max_deliveries: a.num("--max-deliveries")?.unwrap_or(0),
    };
    let count: u32 = a.num("--count")?.unwrap_or(0);
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
            format!("{}\n", if client.create_topic(topic, settings).map_err(e)? { "created" } else { "updated" })
        }
        "delete" => format!("deleted, {} messages removed\n", client.delete_topic(topic).map_err(e)?),
        "purge" => format!("purged {} messages\n", client.purge_topic(topic).map_err(e)?),
        "redrive" => format!("moved {} messages\n", client.redrive(topic, count).map_err(e)?),
        other => unreachable!("run dispatches {other} elsewhere"),
    };
    emit(out.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key and value of each line `--print-config` writes for the
    /// default configuration (its comments left out).
    fn default_keys() -> Vec<(String, String)> {
        let text = config_text(&default_serve());
        let pairs = text.lines().filter(|l| !l.starts_with('#')).map(|l| l.split_once('=').expect("key = value"));
        pairs.map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect()
    }

    #[test]
    fn every_config_key_is_a_flag_serve_help_lists() {
        let sub = sub("serve").expect("serve");
        for (k, _) in default_keys() {
            let flag = format!("--{k}");
            assert!(sub.flags.iter().any(|f| f.name == flag), "{flag} is a config key but not in `serve --help`");
        }
    }

    #[test]
    fn every_flag_serve_help_lists_is_accepted() {
        let sub = sub("serve").expect("serve");
        let keys = default_keys();
        for f in sub.flags.iter().filter(|f| f.name != "--config") {
            let key = f.name.trim_start_matches('-');
            let value = keys.iter().find(|(k, _)| k == key).map_or("x", |(_, v)| v.as_str());
            let arg = if f.value.is_empty() { f.name.to_string() } else { format!("{}={value}", f.name) };
            if let Err(e) = parse_serve(std::slice::from_ref(&arg), &sub) {
                panic!("`serve --help` lists {}, and `serve {arg}` fails: {e:?}", f.name);
            }
        }
    }

    #[test]
    fn every_value_flag_shows_its_default() {
        for sub in COMMANDS.iter().filter_map(|c| sub(c)) {
            for f in &sub.flags {
                assert_eq!(
                    f.value.is_empty(),
                    f.default.is_empty(),
                    "{} {}: a value flag has a default",
                    sub.name,
                    f.name
                );
            }
        }
    }
}
