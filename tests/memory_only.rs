//! `runnel serve --memory-only`: a broker that keeps no log. It serves as
//! any broker does (produce, fetch, ack, redelivery, limits), touches no
//! data directory, and a restart finds nothing.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use common::wire::{code, now, stat, wait_for};
use common::{Server, TempDir};
use runnel::broker::Config;
use runnel::client::{Fetch, IdsResult};
use runnel::codec::ErrorCode;
use runnel::config::ServeConfig;
use runnel::limits::Limits;

/// A memory-only broker whose (unused) data directory is `dir`.
fn memory_only(dir: &Path) -> Server {
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().expect("addr"), dir.to_path_buf());
    cfg.memory_only = true;
    cfg.broker = Config { limits: Limits { topic_messages_max: 4, ..Limits::default() }, ..Config::default() };
    Server::start_with(cfg)
}

/// Every name in `dir`, or None if it does not exist.
fn listing(dir: &Path) -> Option<Vec<String>> {
    let entries = fs::read_dir(dir).ok()?;
    Some(entries.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).collect())
}

#[test]
fn a_memory_only_broker_serves_writes_no_file_and_forgets_at_a_restart() {
    let tmp = TempDir::new("memory-only");
    let data = tmp.path().join("data");
    let srv = memory_only(&data);
    let mut c = srv.client();
    let (first, n) = c.produce_batch("jobs", &[b"a", b"b", b"c"]).expect("produce");
    assert_eq!(n, 3);
    // Limits hold as with a log: the topic takes four messages.
    c.produce("jobs", b"d").expect("produce the fourth");
    assert_eq!(code(c.produce("jobs", b"e")), ErrorCode::QueueFull);
    // A delivery acked is gone; one nacked, and one whose ack timeout
    // passes, are delivered again.
    let short = Fetch { max_messages: 3, max_bytes: 0, wait_ms: 0, ack_timeout_ms: 200 };
    let got = c.fetch("jobs", short).expect("fetch");
    let ids: Vec<u64> = got.iter().map(|m| m.id).collect();
    assert_eq!(ids, [first, first + 1, first + 2]);
    assert_eq!(c.ack("jobs", &[first]).expect("ack"), IdsResult { done: 1, failed: vec![] });
    assert_eq!(c.nack("jobs", &[first + 1], 0, false).expect("nack"), IdsResult { done: 1, failed: vec![] });
    let again = c.fetch("jobs", wait_for(1)).expect("fetch the nacked");
    assert_eq!((again[0].id, again[0].delivery_count), (first + 1, 2));
    let d = c.fetch("jobs", wait_for(1)).expect("fetch the fourth");
    assert_eq!(d[0].id, first + 3);
    let late = c.fetch("jobs", wait_for(1)).expect("fetch after the ack timeout");
    assert_eq!((late[0].id, late[0].delivery_count, late[0].payload.as_slice()), (first + 2, 2, &b"c"[..]));
    assert_eq!(stat(&mut c, "jobs", "redelivered"), 2);
    // Nothing was synced, and no directory was made or written.
    assert_eq!(stat(&mut c, "", "fsyncs"), 0);
    assert_eq!((stat(&mut c, "", "memory_only"), stat(&mut c, "", "fsync_turn")), (1, 0));
    assert_eq!(listing(&data), None, "the data directory was created");
    drop(c);
    srv.stop();
    assert_eq!(listing(&data), None, "a stop wrote the data directory");
    assert_eq!(listing(tmp.path()), Some(vec![]), "a file was written beside it");

    // A restart finds nothing: no topic, no message.
    let srv = memory_only(&data);
    let mut c = srv.client();
    assert_eq!(c.list_topics().expect("topics"), vec![]);
    assert!(c.fetch("jobs", now(10)).expect("fetch after the restart").is_empty());
    assert_eq!(listing(&data), None);
}

/// The command line: `--memory-only` refuses the flags of the log it does
/// not keep, `--print-config` says what it does not survive, and a broker
/// started in an empty directory leaves it empty (the default `--data` is
/// relative to it).
#[test]
fn serve_memory_only_refuses_the_log_flags_and_writes_nothing_where_it_runs() {
    let runnel = env!("CARGO_BIN_EXE_runnel");
    for flags in [&["--data", "d"][..], &["--fsync", "never"], &["--repair"], &["--segment-bytes-max", "9999"]] {
        let out = Command::new(runnel).args(["serve", "--memory-only"]).args(flags).output().expect("run runnel");
        assert_eq!(out.status.code(), Some(2), "{flags:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flags[0]) && err.contains("--memory-only"), "{flags:?}: {err}");
    }
    let out = Command::new(runnel).args(["serve", "--memory-only", "--print-config"]).output().expect("run runnel");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("memory-only = true\n") && text.contains("loses them all"), "{text}");
    assert!(!text.contains("data =") && !text.contains("fsync ="), "{text}");

    let cwd = TempDir::new("memory-only-cwd");
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = Command::new(runnel)
        .args(["serve", "--memory-only", "--listen", &listen])
        .current_dir(cwd.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runnel serve");
    let mut c = None;
    common::wire::wait_until("the broker to listen", || {
        c = runnel::client::Client::connect(listen.as_str()).ok();
        c.is_some()
    });
    let mut c = c.expect("connected");
    c.produce("t", b"x").expect("produce");
    assert_eq!(c.fetch("t", now(1)).expect("fetch").len(), 1);
    drop(c);
    child.kill().expect("kill");
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("WARN") && err.contains("memory-only"), "no warning at the start: {err}");
    assert_eq!(listing(cwd.path()), Some(vec![]), "files written where the broker ran");
}
