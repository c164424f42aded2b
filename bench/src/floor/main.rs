//! runnel-floor: the physical limit of this machine for a server of
//! runnel's protocol. One thread on runnel's loop shape (mio, edge-triggered,
//! read until WouldBlock, one write per turn per connection) that answers
//! HELLO, PING, PRODUCE, FETCH and ACK with nothing behind them but an
//! in-memory FIFO of bytes per topic: no log, no sync, no ack tracking, no
//! timers but the long-poll wait. runnel-bench runs it like the brokers
//! (`--only floor`) and reports every broker's server CPU per message and
//! latency as a ratio to it. See bench/README.md, "The echo floor".

mod conn;
mod echo;
mod reactor;

use std::net::SocketAddr;
use std::process::ExitCode;

const USAGE: &str = "\
runnel-floor: an echo of runnel's protocol with no queue semantics and no log,
the floor runnel-bench measures the brokers against

usage:
  runnel-floor --listen ADDR [--queued-bytes-max N]

  --listen ADDR          where to listen, e.g. 127.0.0.1:7000
  --queued-bytes-max N   most bytes queued in all topics together (payloads
                         and their 4-byte lengths); a PRODUCE past it gets
                         QUEUE_FULL, so a producer without a consumer cannot
                         exhaust memory (default 1073741824, runnel's
                         topic-bytes-max)

Every other limit is runnel's default.";

/// Default of `--queued-bytes-max`: runnel's default topic_bytes_max, so a
/// W1 run (at most 512 MiB of payload) fits in it.
const QUEUED_BYTES_MAX_DEFAULT: u64 = 1 << 30;

/// Parsed command line.
struct Options {
    listen: SocketAddr,
    queued_bytes_max: u64,
}

/// Err(None) asks for the usage on stdout, Err(Some) is a usage error.
fn parse_args(args: &[String]) -> Result<Options, Option<String>> {
    let mut listen = None;
    let mut queued_bytes_max = QUEUED_BYTES_MAX_DEFAULT;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| Some(format!("{a} needs a value")));
        match a.as_str() {
            "--listen" => {
                let v = value()?;
                listen = Some(v.parse().map_err(|e| Some(format!("--listen {v:?}: {e}")))?);
            }
            "--queued-bytes-max" => {
                let v = value()?;
                queued_bytes_max = v.parse().map_err(|e| Some(format!("--queued-bytes-max {v:?}: {e}")))?;
            }
            "-h" | "--help" => return Err(None),
            other => return Err(Some(format!("unknown argument {other:?}"))),
        }
    }
    let listen = listen.ok_or_else(|| Some("--listen is required".to_string()))?;
    Ok(Options { listen, queued_bytes_max })
}

/// SIGINT and SIGTERM end the floor (it keeps nothing to save). A shell
/// starts a background job with SIGINT ignored, and that would outlive
/// `kill -INT` from bench/profile/callgrind.sh, so both are set to their
/// default action rather than inherited.
fn default_stop_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: setting a signal's disposition to SIG_DFL at start-up,
        // before any other thread exists; no handler runs our code.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

fn main() -> ExitCode {
    default_stop_signals();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--version") {
        println!("runnel-floor {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let opts = match parse_args(&args) {
        Ok(o) => o,
        Err(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(Some(e)) => {
            eprintln!("runnel-floor: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut floor = match reactor::Floor::bind(opts.listen, opts.queued_bytes_max) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("runnel-floor: cannot listen on {}: {e}", opts.listen);
            return ExitCode::FAILURE;
        }
    };
    match floor.local_addr() {
        Ok(a) => eprintln!("runnel-floor: listening on {a} (an echo: no log, messages kept in memory only)"),
        Err(e) => eprintln!("runnel-floor: listening ({e})"),
    }
    match floor.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("runnel-floor: poll failed: {e}");
            ExitCode::FAILURE
        }
    }
}
