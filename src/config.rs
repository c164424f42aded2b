//! The configuration of `runnel serve`: its flags, the config file whose
//! keys are those flags, and `--print-config`, which writes the effective
//! configuration back as a config file.
//!
//! One table (`SERVE_FLAGS`) names every flag; the parser accepts exactly
//! those, the config file accepts them as keys, and the defaults `--help`
//! shows are read from what `--print-config` writes for a configuration
//! given nothing. So help, parser, file and printout cannot drift apart
//! (the tests below walk every flag). A library module, so that tests build
//! a `ServeConfig` from flags the way `runnel serve` does.
//!
//! The flag parser (`Args`) is the one every `runnel` subcommand uses: it
//! splits a command line by the flags a subcommand declares.

use std::fmt::Display;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::broker::Config;
use crate::limits::Limits;
use crate::log::{FsyncMode, LogOptions};

/// Where `runnel serve` listens and clients connect by default.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7700";
/// Where `runnel serve` keeps its commit log by default.
pub const DEFAULT_DATA: &str = "runnel-data";

/// Everything the reactor needs to serve.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Where clients connect (`--listen`).
    pub listen: SocketAddr,
    /// The commit log's directory (`--data`); unused with `memory_only`.
    pub data_dir: PathBuf,
    /// Keep no log at all (`--memory-only`): messages live in memory only
    /// and are lost with the process; no data directory is touched.
    pub memory_only: bool,
    /// Limits, topic defaults, auto-create and the auth token.
    pub broker: Config,
    /// Segment size, fsync mode, repair.
    pub log: LogOptions,
    /// Where to serve Prometheus metrics over HTTP (`--metrics`).
    pub metrics: Option<SocketAddr>,
    /// Poll without blocking for up to this long before sleeping in
    /// `epoll_wait` (`--spin-us`), µs: trades a busy core for wake-up
    /// latency.
    pub spin_us: u32,
}

impl ServeConfig {
    /// A configuration with every default, listening on `listen`.
    pub fn new(listen: SocketAddr, data_dir: PathBuf) -> ServeConfig {
        ServeConfig {
            listen,
            data_dir,
            memory_only: false,
            broker: Config::default(),
            log: LogOptions::default(),
            metrics: None,
            spin_us: 0,
        }
    }
}

/// Everything `runnel serve` was asked for: what the reactor serves with,
/// and what the command does before (or instead of) serving.
#[derive(Clone, Debug)]
pub struct Serve {
    /// What the reactor serves with.
    pub cfg: ServeConfig,
    /// The CPU to pin the loop to (`--pin-core`).
    pub pin_core: Option<usize>,
    /// Print the effective configuration and exit (`--print-config`).
    pub print_config: bool,
    /// Read the log through, report what a start (and --repair) would do,
    /// change nothing, exit (`--repair --dry-run`).
    pub dry_run: bool,
}

impl Default for Serve {
    /// The configuration `runnel serve` runs with when given no flags.
    fn default() -> Serve {
        let listen = DEFAULT_ADDR.parse().expect("DEFAULT_ADDR is an IP:PORT");
        Serve {
            cfg: ServeConfig::new(listen, PathBuf::from(DEFAULT_DATA)),
            pin_core: None,
            print_config: false,
            dry_run: false,
        }
    }
}

// ---------------------------------------------------------------------------
// Flags and the command-line parser.
// ---------------------------------------------------------------------------

/// One flag of a subcommand.
#[derive(Clone, Debug)]
pub struct Flag {
    /// The flag with its dashes, e.g. `--batch`.
    pub name: &'static str,
    /// What its value is called in the usage; empty for a switch, which is
    /// off unless given.
    pub value: &'static str,
    /// Its default, as a user reads it; empty for a switch.
    pub default: String,
    /// What it does, in a few words.
    pub what: &'static str,
}

/// A flag that takes a value.
pub fn flag(name: &'static str, value: &'static str, default: impl Display, what: &'static str) -> Flag {
    Flag { name, value, default: default.to_string(), what }
}

/// A flag that takes no value: off unless given.
pub fn switch(name: &'static str, what: &'static str) -> Flag {
    Flag { name, value: "", default: String::new(), what }
}

/// Why a command line (or config file) was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum ArgsError {
    /// `-h` or `--help` was given: the caller prints the usage.
    Help,
    /// The command line or config file is wrong; the message names the
    /// argument.
    Usage(String),
}

/// Parsed `--flag value` pairs, bare `--switch`es and positional words.
#[derive(Debug)]
pub struct Args {
    /// Each flag given, in order, with its value if it takes one.
    flags: Vec<(String, Option<String>)>,
    /// The positional words, in order.
    words: Vec<String>,
}

impl Args {
    /// Splits `args` by the flags `known`. An unknown flag, or one without
    /// its value, is refused by name; `-h`/`--help` asks for the usage; after
    /// `--` every argument is a word (a topic may start with `-`).
    pub fn parse(args: &[String], known: &[Flag]) -> Result<Args, ArgsError> {
        let mut flags = Vec::new();
        let mut words = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "-h" | "--help" => return Err(ArgsError::Help),
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
            let Some(f) = known.iter().find(|f| f.name == name) else {
                return Err(ArgsError::Usage(format!("unknown flag {name}")));
            };
            let value = match inline {
                Some(v) => Some(v),
                None if f.value.is_empty() => None,
                None => Some(
                    it.next()
                        .cloned()
                        .ok_or_else(|| ArgsError::Usage(format!("{name} needs a value ({})", f.value)))?,
                ),
            };
            flags.push((name.to_string(), value));
        }
        Ok(Args { flags, words })
    }

    /// The value of the last `name` (a later flag overrides an earlier
    /// one, and the command line a config file's).
    pub fn take(&mut self, name: &str) -> Option<String> {
        let i = self.flags.iter().rposition(|f| f.0 == name)?;
        let v = self.flags.remove(i).1;
        self.flags.retain(|f| f.0 != name);
        // `key =` with nothing after it (as --print-config writes an unset
        // option) means unset.
        v.filter(|v| !v.is_empty())
    }

    /// Every value of a flag that may be given more than once, in order.
    pub fn take_all(&mut self, name: &str) -> Vec<String> {
        let values = self.flags.iter().filter(|f| f.0 == name).filter_map(|f| f.1.clone()).collect();
        self.flags.retain(|f| f.0 != name);
        values
    }

    /// The positional words, in order.
    pub fn words(&self) -> &[String] {
        &self.words
    }

    /// A switch: present, or `name=true`; `name=false` turns it off.
    pub fn switch(&mut self, name: &str) -> bool {
        let i = self.flags.iter().rposition(|f| f.0 == name);
        let on = i.is_some_and(|i| !matches!(self.flags[i].1.as_deref(), Some("false" | "0" | "no")));
        self.flags.retain(|f| f.0 != name);
        on
    }

    /// The number given with `name`, if it was given.
    pub fn num<T: std::str::FromStr>(&mut self, name: &str) -> Result<Option<T>, ArgsError> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => {
                v.parse().map(Some).map_err(|_| ArgsError::Usage(format!("{name}: {v:?} is not a valid number")))
            }
        }
    }

    /// Fails on flags nobody took.
    pub fn done(&self) -> Result<(), ArgsError> {
        match self.flags.first() {
            Some((k, _)) => Err(ArgsError::Usage(format!("unknown flag {k}"))),
            None => Ok(()),
        }
    }

    /// The one topic the command names.
    pub fn topic(&self) -> Result<&str, ArgsError> {
        match self.words.as_slice() {
            [t] => Ok(t),
            [] => Err(ArgsError::Usage("name a topic".into())),
            _ => Err(ArgsError::Usage(format!("one topic, please, not {:?}", self.words))),
        }
    }

    /// The topic the command names, if it names one.
    pub fn optional_topic(&self) -> Result<Option<&str>, ArgsError> {
        match self.words.as_slice() {
            [] => Ok(None),
            _ => self.topic().map(Some),
        }
    }

    /// Fails on words for a command that takes none.
    pub fn no_words(&self) -> Result<(), ArgsError> {
        match self.words.first() {
            Some(w) => Err(ArgsError::Usage(format!("unexpected argument {w:?}"))),
            None => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------------
// `runnel serve`'s flags, the config file, and --print-config.
// ---------------------------------------------------------------------------

/// `runnel serve`'s flags: the flag, its value's name (empty for a switch)
/// and what it does. Their defaults are read from the default
/// configuration, as `--print-config` writes it.
const SERVE_FLAGS: &[(&str, &str, &str)] = &[
    ("--config", "FILE", "read flags from FILE; the command line overrides them"),
    ("--print-config", "", "print the effective configuration as a config file, and exit"),
    ("--listen", "ADDR", "where clients connect"),
    ("--data", "DIR", "the commit log's directory, locked against a second broker"),
    ("--memory-only", "", "keep no log: messages live in memory only, lost at a stop, restart or crash"),
    ("--fsync", "turn|never", "answer a PRODUCE after the fdatasync that covers it, or after the write"),
    ("--segment-bytes-max", "N", "size of one log segment file"),
    ("--repair", "", "start past log corruption, dropping only the damaged records"),
    ("--dry-run", "", "with --repair: report what a start (and repair) would drop, change nothing, exit"),
    ("--no-auto-create", "", "PRODUCE and FETCH on a missing topic get UNKNOWN_TOPIC"),
    ("--ack-timeout-ms", "MS", "a new topic's time to acknowledge a delivery"),
    ("--max-deliveries", "N", "a new topic's deliveries before a message moves to its .dlq"),
    ("--dedup-window-ms", "MS", "a new topic's dedup window; 0 for no deduplication"),
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
    ("--timers-max", "N", "most messages in flight or delayed, and parked FETCHes, over all topics"),
    ("--read-bytes-per-turn-max", "N", "most bytes read from one connection in one loop turn"),
    ("--work-items-per-turn-max", "N", "most messages, ids and listed entries one loop turn's requests handle"),
    ("--work-bytes-per-turn-max", "N", "most bytes of requests and replies one loop turn's requests handle"),
    ("--metrics-bytes-per-turn-max", "N", "most bytes of the /metrics exposition rendered per loop turn"),
    ("--handshake-timeout-ms", "MS", "time a new connection has to send HELLO"),
    ("--idle-timeout-ms", "MS", "time a connection may stay silent; 0 for no limit"),
    ("--frame-timeout-ms", "MS", "time a frame may stay incomplete"),
    ("--group-name-bytes-max", "N", "longest consumer-group name"),
    ("--groups-per-topic-max", "N", "most consumer groups of one topic, its default group included"),
    ("--tags-per-message-max", "N", "most tags on one message"),
    ("--tag-bytes-max", "N", "longest tag"),
    ("--tag-sets-per-topic-max", "N", "most distinct sets of tags among one topic's messages"),
    ("--props-bytes-max", "N", "most bytes of one message's properties (tags and headers)"),
    ("--filter-bytes-max", "N", "longest tag filter of a consumer group"),
    ("--filter-compiled-bytes-max", "N", "most memory one compiled regular-expression filter may take"),
    ("--compiled-filters-bytes-max", "N", "most memory all compiled tag filters may take together, broker-wide"),
    ("--subscription-credit-max", "N", "most credit one push subscription may have"),
    ("--subscriptions-per-connection-max", "N", "most push subscriptions one connection may have"),
    ("--schedule-ahead-ms-max", "N", "farthest ahead a message may be scheduled, ms"),
    ("--key-bytes-max", "N", "longest message key"),
    ("--lookup-results-max", "N", "most messages the key index keeps per key (and LOOKUP returns)"),
    ("--key-index-entries-per-topic-max", "N", "most keyed messages one topic's key index remembers"),
    ("--dedup-window-ms-max", "MS", "longest dedup window a topic may have"),
    ("--dedup-entries-max", "N", "most dedup ids remembered, over all topics"),
    ("--dedup-id-bytes-max", "N", "longest dedup id"),
    ("--retry-delay-ms-max", "MS", "longest wait a group's retry policy may set"),
    ("--nack-reason-bytes-max", "N", "longest reason a NACK may give"),
    ("--retention-ms-max", "MS", "longest retention by age a topic may have"),
    ("--retention-bytes-max", "N", "largest retention by size a topic may have"),
    ("--replay-read-bytes-per-turn", "N", "most bytes of the log files replays read per loop turn"),
    ("--replay-read-bytes-per-sec", "N", "most bytes of the log files replays read per second (0: unpaced)"),
    ("--replay-window-messages-max", "N", "most messages a replay puts back ahead of its group"),
    ("--produce-headroom-bytes", "N", "bytes of the disk produces leave free, for what frees it"),
    ("--unwritten-records-bytes-max", "N", "most bytes of records kept for the next commit while commits fail"),
];

/// `runnel serve`'s flags with their defaults.
pub fn serve_flags() -> Vec<Flag> {
    let defaults = Serve::default().config_text();
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

impl Serve {
    /// Parses `runnel serve`'s arguments as the command does: the config
    /// file `--config` names first, then the command line over it, over the
    /// defaults. `RUNNEL_AUTH_TOKEN` sets the token when no flag does.
    pub fn parse(raw: &[String]) -> Result<Serve, ArgsError> {
        let known = serve_flags();
        let mut a = Args::parse(raw, &known)?;
        if let Some(path) = a.take("--config") {
            let mut all = Args::parse(&config_file(&path, &known)?, &known)?;
            // The command line's flags come last, so they win.
            all.flags.append(&mut a.flags);
            a.flags = all.flags;
        }
        let mut s = Serve::default();
        s.cfg.memory_only = a.switch("--memory-only");
        if s.cfg.memory_only {
            refuse_log_flags(&a)?;
        }
        if let Some(listen) = a.take("--listen") {
            s.cfg.listen = address("--listen", &listen)?;
        }
        if let Some(data) = a.take("--data") {
            s.cfg.data_dir = PathBuf::from(data);
        }
        broker_flags(&mut s.cfg.broker, &mut a)?;
        log_flags(&mut s.cfg.log, &mut a)?;
        s.cfg.metrics = a.take("--metrics").map(|m| address("--metrics", &m)).transpose()?;
        s.cfg.spin_us = a.num("--spin-us")?.unwrap_or(0);
        s.pin_core = a.num("--pin-core")?;
        s.print_config = a.switch("--print-config");
        s.dry_run = a.switch("--dry-run");
        a.done()?;
        a.no_words()?;
        Ok(s)
    }

    /// The effective configuration, in the config file's format.
    pub fn config_text(&self) -> String {
        let c = &self.cfg;
        let mut lines = vec![format!("listen = {}", c.listen)];
        if c.memory_only {
            lines.push(MEMORY_ONLY_TEXT.to_string());
        } else {
            lines.extend([
                format!("data = {}", c.data_dir.display()),
                format!("fsync = {}", if c.log.fsync == FsyncMode::Turn { "turn" } else { "never" }),
                format!("segment-bytes-max = {}", c.log.segment_bytes_max),
                format!("repair = {}", c.log.repair),
            ]);
        }
        lines.extend([
            format!("no-auto-create = {}", !c.broker.auto_create),
            format!("ack-timeout-ms = {}", c.broker.defaults.ack_timeout_ms),
            format!("max-deliveries = {}", c.broker.defaults.max_deliveries),
            format!("dedup-window-ms = {}", c.broker.defaults.dedup_window_ms.unwrap_or(0)),
            format!(
                "# auth-token is {} (never printed)",
                if c.broker.auth_token.is_some() { "set" } else { "not set" }
            ),
            format!("metrics = {}", c.metrics.map(|m| m.to_string()).unwrap_or_default()),
            format!("spin-us = {}", c.spin_us),
            format!("pin-core = {}", self.pin_core.map(|p| p.to_string()).unwrap_or_default()),
        ]);
        for (k, v) in limit_values(&c.broker.limits) {
            lines.push(format!("{k} = {v}"));
        }
        lines.join("\n") + "\n"
    }
}

/// What `--print-config` writes for a memory-only broker in place of the
/// log's keys: the switch, and what it does not survive.
const MEMORY_ONLY_TEXT: &str = "\
memory-only = true
# memory-only: no commit log and no data directory. Every message, topic and
# consumer group lives in this process only: a stop, a restart or a crash of
# the process (or the machine) loses them all.";

/// The flags that configure the commit log, which a memory-only broker does
/// not have: given with `--memory-only`, they are refused rather than
/// ignored, so that nobody believes a directory holds their messages.
const LOG_FLAGS: [&str; 5] = ["--data", "--fsync", "--segment-bytes-max", "--repair", "--dry-run"];

/// Refuses the log's flags (`LOG_FLAGS`) when given with a value, or as a
/// switch that is on.
fn refuse_log_flags(a: &Args) -> Result<(), ArgsError> {
    let given = |name: &str| {
        let value = a.flags.iter().rev().find(|f| f.0 == name).map(|f| f.1.as_deref());
        value.is_some_and(|v| !matches!(v, Some("" | "false" | "0" | "no")))
    };
    match LOG_FLAGS.iter().find(|f| given(f)) {
        Some(f) => Err(ArgsError::Usage(format!("{f} configures the commit log, and --memory-only keeps none"))),
        None => Ok(()),
    }
}

/// An `IP:PORT` given with `flag`.
fn address(flag: &str, value: &str) -> Result<SocketAddr, ArgsError> {
    value.parse().map_err(|e| ArgsError::Usage(format!("{flag} {value:?}: {e} (want IP:PORT)")))
}

/// Takes the flags of the broker's `Config`: the limits, auto-create, the
/// topic defaults and the auth token.
fn broker_flags(config: &mut Config, a: &mut Args) -> Result<(), ArgsError> {
    set_limit(&mut config.limits, a)?;
    config.auto_create = !a.switch("--no-auto-create");
    if let Some(v) = a.num("--ack-timeout-ms")? {
        config.defaults.ack_timeout_ms = v;
    }
    if let Some(v) = a.num("--max-deliveries")? {
        config.defaults.max_deliveries = v;
    }
    if let Some(v) = a.num("--dedup-window-ms")? {
        config.defaults.dedup_window_ms = Some(v);
    }
    config.auth_token = a
        .take("--auth-token")
        .or_else(|| std::env::var("RUNNEL_AUTH_TOKEN").ok())
        .filter(|t| !t.is_empty())
        .map(String::into_bytes);
    Ok(())
}

/// Takes the flags of the log's options: segment size, repair, fsync mode.
fn log_flags(log: &mut LogOptions, a: &mut Args) -> Result<(), ArgsError> {
    if let Some(v) = a.num("--segment-bytes-max")? {
        log.segment_bytes_max = v;
    }
    log.repair = a.switch("--repair");
    log.fsync = match a.take("--fsync").as_deref() {
        None | Some("turn") => FsyncMode::Turn,
        Some("never") => FsyncMode::Never,
        Some(other) => return Err(ArgsError::Usage(format!("--fsync {other:?}: want turn or never"))),
    };
    Ok(())
}

/// Every limit's config key and value, as `--print-config` writes them.
/// A limit's key is its field name with `-` for `_` (`set_limit` reads the
/// same names as flags).
fn limit_values(l: &Limits) -> [(&'static str, u64); 47] {
    [
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
        ("timers-max", l.timers_max.into()),
        ("read-bytes-per-turn-max", l.read_bytes_per_turn_max.into()),
        ("work-items-per-turn-max", l.work_items_per_turn_max.into()),
        ("work-bytes-per-turn-max", l.work_bytes_per_turn_max.into()),
        ("metrics-bytes-per-turn-max", l.metrics_bytes_per_turn_max.into()),
        ("handshake-timeout-ms", l.handshake_timeout_ms.into()),
        ("idle-timeout-ms", l.idle_timeout_ms.into()),
        ("frame-timeout-ms", l.frame_timeout_ms.into()),
        ("group-name-bytes-max", l.group_name_bytes_max.into()),
        ("groups-per-topic-max", l.groups_per_topic_max.into()),
        ("tags-per-message-max", l.tags_per_message_max.into()),
        ("tag-bytes-max", l.tag_bytes_max.into()),
        ("tag-sets-per-topic-max", l.tag_sets_per_topic_max.into()),
        ("props-bytes-max", l.props_bytes_max.into()),
        ("filter-bytes-max", l.filter_bytes_max.into()),
        ("filter-compiled-bytes-max", l.filter_compiled_bytes_max.into()),
        ("compiled-filters-bytes-max", l.compiled_filters_bytes_max),
        ("subscription-credit-max", l.subscription_credit_max.into()),
        ("subscriptions-per-connection-max", l.subscriptions_per_connection_max.into()),
        ("schedule-ahead-ms-max", l.schedule_ahead_ms_max),
        ("key-bytes-max", l.key_bytes_max.into()),
        ("lookup-results-max", l.lookup_results_max.into()),
        ("key-index-entries-per-topic-max", l.key_index_entries_per_topic_max.into()),
        ("dedup-window-ms-max", l.dedup_window_ms_max.into()),
        ("dedup-entries-max", l.dedup_entries_max.into()),
        ("dedup-id-bytes-max", l.dedup_id_bytes_max.into()),
        ("retry-delay-ms-max", l.retry_delay_ms_max.into()),
        ("nack-reason-bytes-max", l.nack_reason_bytes_max.into()),
        ("retention-ms-max", l.retention_ms_max),
        ("retention-bytes-max", l.retention_bytes_max),
        ("replay-read-bytes-per-turn", l.replay_read_bytes_per_turn),
        ("replay-read-bytes-per-sec", l.replay_read_bytes_per_sec),
        ("replay-window-messages-max", l.replay_window_messages_max.into()),
        ("produce-headroom-bytes", l.produce_headroom_bytes),
        ("unwritten-records-bytes-max", l.unwritten_records_bytes_max),
    ]
}

/// Sets the limit named by a `--flag`, if it is one. Every limit's flag is
/// its field name with `-` for `_`.
fn set_limit(l: &mut Limits, args: &mut Args) -> Result<(), ArgsError> {
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
        timers_max,
        read_bytes_per_turn_max,
        work_items_per_turn_max,
        work_bytes_per_turn_max,
        metrics_bytes_per_turn_max,
        handshake_timeout_ms,
        idle_timeout_ms,
        frame_timeout_ms,
        group_name_bytes_max,
        groups_per_topic_max,
        tags_per_message_max,
        tag_bytes_max,
        tag_sets_per_topic_max,
        props_bytes_max,
        filter_bytes_max,
        filter_compiled_bytes_max,
        compiled_filters_bytes_max,
        subscription_credit_max,
        subscriptions_per_connection_max,
        schedule_ahead_ms_max,
        key_bytes_max,
        lookup_results_max,
        key_index_entries_per_topic_max,
        dedup_window_ms_max,
        dedup_entries_max,
        dedup_id_bytes_max,
        retry_delay_ms_max,
        nack_reason_bytes_max,
        retention_ms_max,
        retention_bytes_max,
        replay_read_bytes_per_turn,
        replay_read_bytes_per_sec,
        replay_window_messages_max,
        produce_headroom_bytes,
        unwritten_records_bytes_max
    );
    Ok(())
}

/// Reads a config file of `key = value` lines (`#` starts a comment); the
/// keys are the `runnel serve` flags without their dashes. Returns them as
/// flags, to be parsed before the command line's (which override them).
fn config_file(path: &str, known: &[Flag]) -> Result<Vec<String>, ArgsError> {
    let text = std::fs::read_to_string(path).map_err(|e| ArgsError::Usage(format!("--config {path}: {e}")))?;
    let mut args = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(ArgsError::Usage(format!("{path}:{}: want `key = value`, got {line:?}", n + 1)));
        };
        let (k, v) = (k.trim(), v.trim().trim_matches('"'));
        let flag = format!("--{k}");
        if k == "config" || !known.iter().any(|f| f.name == flag) {
            return Err(ArgsError::Usage(format!("{path}:{}: unknown key {k:?}", n + 1)));
        }
        args.push(format!("{flag}={v}"));
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key and value of each line `--print-config` writes for the
    /// default configuration (its comments left out).
    fn default_keys() -> Vec<(String, String)> {
        let text = Serve::default().config_text();
        let pairs = text.lines().filter(|l| !l.starts_with('#')).map(|l| l.split_once('=').expect("key = value"));
        pairs.map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect()
    }

    #[test]
    fn every_config_key_is_a_flag_serve_help_lists() {
        let flags = serve_flags();
        for (k, _) in default_keys() {
            let flag = format!("--{k}");
            assert!(flags.iter().any(|f| f.name == flag), "{flag} is a config key but not in `serve --help`");
        }
    }

    #[test]
    fn the_bound_on_records_kept_for_a_failing_disk_is_a_flag_and_a_key() {
        let default = default_keys();
        assert!(default.iter().any(|(k, v)| k == "unwritten-records-bytes-max" && v == "67108864"), "{default:?}");
        let s = Serve::parse(&["--unwritten-records-bytes-max".into(), "4096".into()]).expect("parse");
        assert_eq!(s.cfg.broker.limits.unwritten_records_bytes_max, 4096);
        assert!(s.config_text().lines().any(|l| l == "unwritten-records-bytes-max = 4096"));
        let bad = Serve::parse(&["--unwritten-records-bytes-max=lots".into()]);
        assert!(matches!(bad, Err(ArgsError::Usage(m)) if m.contains("unwritten-records-bytes-max")));
    }

    #[test]
    fn every_flag_serve_help_lists_is_accepted() {
        let keys = default_keys();
        for f in serve_flags().iter().filter(|f| f.name != "--config") {
            let key = f.name.trim_start_matches('-');
            let value = keys.iter().find(|(k, _)| k == key).map_or("x", |(_, v)| v.as_str());
            let arg = if f.value.is_empty() { f.name.to_string() } else { format!("{}={value}", f.name) };
            if let Err(e) = Serve::parse(std::slice::from_ref(&arg)) {
                panic!("`serve --help` lists {}, and `serve {arg}` fails: {e:?}", f.name);
            }
        }
    }
}
