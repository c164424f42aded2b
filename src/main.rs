//! The `runnel` command: `serve` runs the broker; the other subcommands are
//! small clients built on `runnel::client`.

use std::io::{self, BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use runnel::broker::Config;
use runnel::client::{Client, Fetch};
use runnel::codec::TopicSettings;
use runnel::limits::Limits;
use runnel::log::{FsyncMode, LogOptions};
use runnel::reactor::{Reactor, ServeConfig};

/// Where `runnel serve` listens and clients connect by default.
const DEFAULT_ADDR: &str = "127.0.0.1:7700";
/// Where `runnel serve` keeps its commit log by default.
const DEFAULT_DATA: &str = "runnel-data";

const USAGE: &str = "\
runnel: a durable message broker on one thread

usage:
  runnel serve   [--listen ADDR] [--data DIR] [--fsync turn|never] [--no-auto-create]
                 [--segment-bytes-max N] [--repair] [--ack-timeout-ms N] [--max-deliveries N]
                 [--auth-token TOKEN] [--<limit> N ...]
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
const SWITCHES: &[&str] = &["--json", "--repair", "--no-auto-create"];

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
    fn take(&mut self, name: &str) -> Option<String> {
        let i = self.flags.iter().position(|f| f.0 == name)?;
        self.flags.remove(i).1
    }
    fn switch(&mut self, name: &str) -> bool {
        match self.flags.iter().position(|f| f.0 == name) {
            Some(i) => {
                self.flags.remove(i);
                true
            }
            None => false,
        }
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
        read_bytes_per_turn_max
    );
    Ok(())
}

fn serve(raw: &[String]) -> Result<(), String> {
    let mut a = Args::parse(raw)?;
    let listen: SocketAddr = a
        .take("--listen")
        .unwrap_or_else(|| DEFAULT_ADDR.into())
        .parse()
        .map_err(|e| format!("--listen: {e} (want IP:PORT)"))?;
    let data_dir = PathBuf::from(a.take("--data").unwrap_or_else(|| DEFAULT_DATA.into()));
    let mut config = Config::default();
    set_limit(&mut config.limits, &mut a)?;
    if a.switch("--no-auto-create") {
        config.auto_create = false;
    }
    if let Some(v) = a.num("--ack-timeout-ms")? {
        config.defaults.ack_timeout_ms = v;
    }
    if let Some(v) = a.num("--max-deliveries")? {
        config.defaults.max_deliveries = v;
    }
    config.auth_token =
        a.take("--auth-token").or_else(|| std::env::var("RUNNEL_AUTH_TOKEN").ok()).map(String::into_bytes);
    let mut log = LogOptions::default();
    if let Some(v) = a.num("--segment-bytes-max")? {
        log.segment_bytes_max = v;
    }
    log.repair = a.switch("--repair");
    log.fsync = match a.take("--fsync").as_deref() {
        None | Some("turn") => FsyncMode::Turn,
        Some("never") => FsyncMode::Never,
        Some(other) => return Err(format!("--fsync {other:?}: want turn or never")),
    };
    a.done()?;
    if !a.words.is_empty() {
        return Err(format!("unexpected {:?}", a.words));
    }
    let fsync = log.fsync;
    let mut reactor = Reactor::bind(ServeConfig { listen, data_dir: data_dir.clone(), broker: config, log })?;
    log::info!(
        "runnel serving on {} (data {}, fsync {})",
        reactor.local_addr(),
        data_dir.display(),
        match fsync {
            FsyncMode::Turn => "turn: a produce is acknowledged after the fdatasync that covers it",
            FsyncMode::Never => "never: page cache only; a machine crash can lose acknowledged messages",
        }
    );
    reactor.run().map_err(|e| format!("event loop: {e}"))
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
