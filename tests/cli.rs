//! The `runnel` command line, run as a user runs it: the binary in a child
//! process. Help and version go to stdout with status 0, a wrong argument is
//! named with the usage line and status 2, a broker that cannot be reached
//! is status 1, and a stdout whose reader went away ends any subcommand
//! quietly with status 141 (as `cat` ends when SIGPIPE kills it).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Server, TempDir};
use runnel::broker::Config;
use runnel::client::Fetch;
use runnel::codec;
use runnel::codec::group::{GroupSettings, Start};
use runnel::limits::Limits;
use runnel::log::{FsyncMode, LogOptions};

const COMMANDS: [&str; 14] = [
    "serve", "produce", "consume", "stats", "topics", "create", "delete", "purge", "redrive", "groups", "group",
    "cancel", "lookup", "peek",
];

/// Exit status when stdout's reader went away (128 + SIGPIPE).
const STDOUT_CLOSED: i32 = 141;

fn runnel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runnel")).args(args).stdin(Stdio::null()).output().expect("run runnel")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An address where nothing listens (a port bound and let go).
fn dead_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("127.0.0.1:{port}")
}

/// The flag lines of a usage text: (flag, its value's name if it takes one,
/// the line). The flag and its value's name are the line's first column,
/// which two spaces end.
fn flag_lines(usage: &str) -> Vec<(String, Option<String>, String)> {
    usage
        .lines()
        .filter_map(|l| l.strip_prefix("  --").map(|rest| (l, rest)))
        .map(|(l, rest)| {
            let column = rest.split("  ").next().unwrap();
            let (name, value) = match column.split_once(' ') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (column, None),
            };
            (format!("--{name}"), value, l.to_string())
        })
        .collect()
}

#[test]
fn every_subcommand_answers_help_with_its_flags_and_defaults() {
    for cmd in COMMANDS {
        let long = runnel(&[cmd, "--help"]);
        let usage = text(&long.stdout);
        assert!(long.status.success(), "runnel {cmd} --help exited {}:\n{}", long.status, text(&long.stderr));
        assert!(long.stderr.is_empty(), "runnel {cmd} --help wrote to stderr:\n{}", text(&long.stderr));
        assert!(usage.starts_with(&format!("usage: runnel {cmd} ")), "runnel {cmd} --help:\n{usage}");
        assert!(usage.contains("-h, --help"), "runnel {cmd} --help:\n{usage}");
        for (name, value, line) in flag_lines(&usage) {
            if value.is_some() {
                assert!(line.contains("(default "), "runnel {cmd} --help: {name} has no default:\n{line}");
            }
        }
        // After another flag too (serve's --data is a client's --addr).
        let before = if cmd == "serve" { "--data" } else { "--addr" };
        for other in [vec![cmd, "-h"], vec!["help", cmd], vec![cmd, before, "x", "-h"]] {
            let out = runnel(&other);
            assert!(out.status.success(), "runnel {other:?} exited {}", out.status);
            assert_eq!(text(&out.stdout), usage, "runnel {other:?} and runnel {cmd} --help differ");
        }
    }
}

#[test]
fn serve_help_lists_every_config_key() {
    let usage = text(&runnel(&["serve", "--help"]).stdout);
    let config = runnel(&["serve", "--print-config"]);
    assert!(config.status.success(), "{}", text(&config.stderr));
    let flags: Vec<String> = flag_lines(&usage).into_iter().map(|f| f.0).collect();
    for line in text(&config.stdout).lines().filter(|l| !l.starts_with('#')) {
        let key = line.split('=').next().unwrap().trim();
        assert!(flags.contains(&format!("--{key}")), "config key {key} is not in `runnel serve --help`:\n{usage}");
    }
}

/// Each flag a client subcommand's help lists is one it accepts: given a
/// broker that is not there, the command gets as far as connecting
/// (status 1), not an argument error (status 2).
#[test]
fn every_flag_a_client_help_lists_is_accepted() {
    let dead = dead_addr();
    for cmd in COMMANDS.into_iter().filter(|c| *c != "serve") {
        let usage = text(&runnel(&[cmd, "--help"]).stdout);
        for (name, value, _) in flag_lines(&usage) {
            let mut args = vec![cmd.to_string(), "--addr".into(), dead.clone(), name.clone()];
            match value.as_deref() {
                Some("ADDR") => args[3] = format!("--addr={dead}"),
                Some("K=V") => args.push("k=1".into()),
                Some("POLICY") => args.push("fixed:1s".into()),
                Some(_) => args.push("1".into()),
                None => {}
            }
            let first = usage.lines().next().unwrap();
            if first.ends_with(" TOPIC") {
                args.push("t".into());
            } else if first.ends_with(" TOPIC ID") || first.ends_with(" TOPIC KEY") {
                args.extend(["t".into(), "1".into()]);
            } else if first.ends_with(" TOPIC GROUP") {
                args.extend(["create".into(), "t".into(), "g".into()]);
            }
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = runnel(&argv);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "runnel {argv:?}: want status 1, got {}:\n{err}", out.status);
            assert!(err.contains("cannot talk to"), "runnel {argv:?}:\n{err}");
        }
    }
}

#[test]
fn config_file_keys_are_the_flags_and_flags_override_them() {
    let dir = TempDir::new("config");
    let path = dir.path().join("runnel.conf");
    std::fs::write(
        &path,
        "# a comment\nfsync = never\nmax-deliveries = 5\nidle-timeout-ms = 1234\nno-auto-create = true\n",
    )
    .unwrap();
    let out = runnel(&["serve", "--config", path.to_str().unwrap(), "--max-deliveries", "7", "--print-config"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for line in ["fsync = never", "max-deliveries = 7", "idle-timeout-ms = 1234", "no-auto-create = true"] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    // What --print-config prints is itself a config file that says the same.
    let printed = dir.path().join("printed.conf");
    std::fs::write(&printed, &text).unwrap();
    let again = runnel(&["serve", "--config", printed.to_str().unwrap(), "--print-config"]);
    assert_eq!(String::from_utf8(again.stdout).unwrap(), text);
    // An unknown key is refused by name.
    std::fs::write(&path, "no-such-key = 1\n").unwrap();
    let bad = runnel(&["serve", "--config", path.to_str().unwrap(), "--print-config"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no-such-key"));
}

#[test]
fn top_level_help_lists_every_subcommand() {
    for args in [["--help"], ["-h"], ["help"]] {
        let out = runnel(&args);
        let usage = text(&out.stdout);
        assert!(out.status.success(), "runnel {args:?} exited {}", out.status);
        for cmd in COMMANDS {
            assert!(
                usage.lines().any(|l| l.starts_with(&format!("  {cmd} "))),
                "runnel {args:?} lacks {cmd}:\n{usage}"
            );
        }
    }
    // With no command at all, the same text is the answer to a mistake.
    let none = runnel(&[]);
    assert_eq!(none.status.code(), Some(2));
    assert_eq!(text(&none.stderr), text(&runnel(&["--help"]).stdout));
}

#[test]
fn version_names_the_build_and_the_protocol_versions() {
    let (min, max) = (codec::VERSION_MIN, codec::VERSION_MAX);
    let protocol =
        if min == max { format!("protocol version {min}") } else { format!("protocol versions {min} to {max}") };
    for flag in ["--version", "-V"] {
        let out = runnel(&[flag]);
        assert!(out.status.success(), "runnel {flag} exited {}", out.status);
        assert_eq!(text(&out.stdout), format!("runnel {}\n{protocol}\n", env!("CARGO_PKG_VERSION")));
    }
}

#[test]
fn argument_errors_name_the_argument_show_the_usage_line_and_exit_2() {
    let dead = dead_addr();
    let d = dead.as_str();
    let cases: &[(&[&str], &str)] = &[
        (&["serve", "--bogus"], "--bogus"),
        (&["serve", "--fsync", "sometimes"], "--fsync"),
        (&["serve", "--listen"], "--listen"),
        (&["serve", "--listen", "nowhere"], "--listen"),
        (&["serve", "--frame-bytes-max", "big"], "--frame-bytes-max"),
        (&["serve", "--config", "/nonexistent/runnel.conf"], "--config"),
        (&["serve", "stray"], "stray"),
        (&["produce", "--addr", d], "name a topic"),
        (&["produce", "--addr", d, "--bogus", "t"], "--bogus"),
        (&["produce", "--addr", d, "--batch", "many", "t"], "--batch"),
        (&["consume", "--addr", d, "-n", "5", "t"], "-n"),
        (&["consume", "--addr", d, "a", "b"], "one topic"),
        (&["stats", "--addr", d, "--json", "a", "b"], "one topic"),
        (&["topics", "--addr", d, "--count", "3"], "--count"),
        (&["topics", "--addr", d, "extra"], "extra"),
        (&["create", "--addr", d, "--max-deliveries", "-1", "t"], "--max-deliveries"),
        (&["redrive", "--addr", d, "--count"], "--count"),
        (&["nosuch"], "nosuch"),
        (&["help", "nosuch"], "nosuch"),
    ];
    for (args, named) in cases {
        let out = runnel(args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "runnel {args:?}: want status 2, got {}:\n{err}", out.status);
        assert!(err.contains(named), "runnel {args:?} must name {named}:\n{err}");
        assert!(err.contains("usage: runnel"), "runnel {args:?} must show the usage line:\n{err}");
        assert!(out.stdout.is_empty(), "runnel {args:?} wrote to stdout");
    }
}

#[test]
fn a_broker_that_cannot_be_reached_is_status_1() {
    let out = runnel(&["stats", "--addr", &dead_addr()]);
    assert_eq!(out.status.code(), Some(1), "{}", out.status);
    assert!(text(&out.stderr).starts_with("runnel stats: cannot talk to"), "{}", text(&out.stderr));
}

/// Runs `runnel args` with its stdout a pipe whose read end is already
/// closed, so its first write fails.
fn with_stdout_closed(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let child = Command::new(env!("CARGO_BIN_EXE_runnel"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runnel");
    child.wait_with_output().expect("wait")
}

#[test]
fn help_version_and_print_config_end_quietly_when_stdout_is_closed() {
    let mut runs: Vec<Vec<&str>> = vec![vec!["--help"], vec!["--version"], vec!["serve", "--print-config"]];
    runs.extend(COMMANDS.iter().map(|c| vec![*c, "--help"]));
    for args in runs {
        let out = with_stdout_closed(&args);
        assert_eq!(out.status.code(), Some(STDOUT_CLOSED), "runnel {args:?}: {}", out.status);
        assert!(out.stderr.is_empty(), "runnel {args:?} must end quietly:\n{}", text(&out.stderr));
    }
}

/// Reads the child's first line of output, then closes the pipe as
/// `head -1` does, and waits (60 s at most) for the child to end.
fn read_a_line_then_close(mut child: Child) -> (String, Output) {
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first).expect("read a line");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("runnel did not end within 60 s of its stdout closing");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (first, child.wait_with_output().expect("wait"))
}

fn spawn_piped(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_runnel"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runnel")
}

/// A broker for the tests that need one. They fill it and read it through
/// the `runnel` command alone: a blocking read of a client in this process
/// can fail with EINTR while the other tests' children exit.
fn page_cache_broker(limits: Limits) -> (Server, TempDir) {
    let dir = TempDir::new("cli");
    let log = LogOptions { fsync: FsyncMode::Never, ..LogOptions::default() };
    (Server::start_in(Config { limits, ..Config::default() }, log, dir.path()), dir)
}

/// Runs `runnel args` with `input` on its stdin; returns its stdout, which
/// must come with status 0.
fn runnel_ok(args: &[&str], input: &[u8]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_runnel"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runnel");
    child.stdin.take().expect("stdin").write_all(input).expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "runnel {args:?} exited {}:\n{}", out.status, text(&out.stderr));
    text(&out.stdout)
}

/// `runnel stats | head -1`, with more output than a pipe holds, so the
/// command is still writing when its reader goes away.
#[test]
fn stats_ends_quietly_when_its_reader_goes_away() {
    let (srv, _dir) = page_cache_broker(Limits { topic_name_bytes_max: 1000, ..Limits::default() });
    let addr = srv.addr.to_string();
    // 100 lines of about 1 KiB: more than a pipe's 64 KiB.
    let long = "t".repeat(990);
    for i in 0..100 {
        runnel_ok(&["create", "--addr", &addr, &format!("{long}-{i:03}")], b"");
    }
    let (first, out) = read_a_line_then_close(spawn_piped(&["stats", "--addr", &addr]));
    assert!(first.starts_with("topic "), "the first line is the header: {first:?}");
    assert_eq!(out.status.code(), Some(STDOUT_CLOSED), "{}:\n{}", out.status, text(&out.stderr));
    assert!(out.stderr.is_empty(), "must end quietly:\n{}", text(&out.stderr));
}

/// `runnel consume | head -1`: the consumer ends quietly, and
/// acknowledges only the message its reader took.
#[test]
fn consume_ends_quietly_when_its_reader_goes_away_and_acks_only_what_it_took() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    // 100 lines of 4 KiB: more than a pipe's 64 KiB.
    let line = [vec![b'm'; 4096], vec![b'\n']].concat();
    runnel_ok(&["produce", "--addr", &addr, "big"], &line.repeat(100));
    let child = spawn_piped(&["consume", "--addr", &addr, "--count", "100", "--wait-ms", "100", "big"]);
    let (first, out) = read_a_line_then_close(child);
    assert_eq!(first.as_bytes(), line, "the first line is the first payload");
    assert_eq!(out.status.code(), Some(STDOUT_CLOSED), "{}:\n{}", out.status, text(&out.stderr));
    assert!(out.stderr.is_empty(), "must end quietly:\n{}", text(&out.stderr));
    let stats = runnel_ok(&["stats", "--addr", &addr, "--json", "big"], b"");
    assert!(stats.contains("\"acked\":1,"), "only the message the reader took is acknowledged: {stats}");
}

/// `runnel produce --tag T --header K=V`: every line becomes a message with
/// these tags and headers, on a broker that negotiates version 2; a broker
/// that speaks only version 1 gets no message, and the command says why.
#[test]
fn produce_gives_every_line_its_tags_and_headers() {
    let dir = TempDir::new("cli-props");
    let log = LogOptions { fsync: FsyncMode::Never, ..LogOptions::default() };
    let config = Config { version_max: codec::CODEC_VERSION_MAX, ..Config::default() };
    let srv = Server::start_in(config, log, dir.path());
    let addr = srv.addr.to_string();
    let args = ["produce", "--addr", &addr, "--tag", "eu", "--header", "trace=7", "--tag", "red", "--header", "flag"];
    runnel_ok(&[&args[..], &["t"]].concat(), b"one\ntwo\n");
    let mut c = srv.client_v2();
    let got = c.fetch("t", runnel::client::Fetch { max_messages: 10, ..Default::default() }).unwrap();
    assert_eq!(got.len(), 2);
    for (m, payload) in got.iter().zip([&b"one"[..], b"two"]) {
        assert_eq!(m.payload, payload);
        assert_eq!(m.tags(), ["eu", "red"]);
        assert_eq!(m.headers(), [("trace", &b"7"[..]), ("flag", &b""[..])]);
    }

    let old_dir = TempDir::new("cli-props-v1");
    let v1 = Config { version_max: 1, ..Config::default() };
    let old = Server::start_in(v1, LogOptions { fsync: FsyncMode::Never, ..LogOptions::default() }, old_dir.path());
    let old_addr = old.addr.to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_runnel"))
        .args(["produce", "--addr", &old_addr, "--tag", "eu", "t"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runnel");
    child.stdin.take().expect("stdin").write_all(b"one\n").expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("protocol version 2"), "{}", text(&out.stderr));
    let bad = runnel(&["produce", "--addr", &old_addr, "--header", "=v", "t"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
    assert!(text(&bad.stderr).contains("--header"), "{}", text(&bad.stderr));
}

/// Consumer groups from the command line: each group gets every message,
/// `groups` shows them, and `group` creates, moves and deletes them.
#[test]
fn groups_from_the_command_line() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    let a = ["--addr", addr.as_str()];
    let run = |args: &[&str], input: &[u8]| runnel_ok(&[&args[..1], &a[..], &args[1..]].concat(), input);
    assert_eq!(run(&["group", "create", "--from", "latest", "jobs", "late"], b""), "created at 1\n");
    run(&["produce", "--tag", "red", "--header", "k=v", "jobs"], b"one\ntwo\n");
    let consume = |group: &str| run(&["consume", "--wait-ms", "0", "--group", group, "jobs"], b"");
    assert_eq!(consume("a"), "one\ntwo\n", "an implicit group starts at the earliest message");
    assert_eq!(consume("late"), "one\ntwo\n", "created before the produce");
    assert_eq!(consume("a"), "", "acked in a");
    assert_eq!(run(&["consume", "--wait-ms", "0", "--group", "b", "--from", "latest", "jobs"], b""), "");
    let listed = run(&["groups", "jobs"], b"");
    let names: Vec<&str> = listed.lines().skip(1).map(|l| l.split_whitespace().next().unwrap()).collect();
    assert_eq!(names, ["a", "b", "late"], "{listed}");
    assert!(listed.starts_with("group "), "{listed}");
    assert_eq!(run(&["group", "reset", "--to", "earliest", "jobs", "a"], b""), "moved to 3\n", "nothing is held");
    assert_eq!(consume("a"), "", "every group had acked them: they are gone");
    // Nothing is left to start at: the next message produced.
    assert_eq!(run(&["group", "reset", "--to", "2026-01-01T00:00:00Z", "jobs", "b"], b""), "moved to 3\n");
    assert_eq!(run(&["group", "create", "--tags", "red || blue", "jobs", "b"], b""), "updated at 3\n");
    assert!(run(&["groups", "jobs"], b"").contains("red || blue"));
    assert_eq!(run(&["group", "delete", "jobs", "late"], b""), "deleted, it held 0 messages\n");
    let bad = runnel(&["group", "reset", "--addr", &addr, "--to", "soon", "jobs", "a"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
    let gone = runnel(&["group", "delete", "--addr", &addr, "jobs", "late"]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(text(&gone.stderr).contains("UNKNOWN_GROUP"), "{}", text(&gone.stderr));
}

/// `runnel group create --retry POLICY` sets a group's retry policy,
/// which `runnel groups` shows; a policy that does not read is a usage
/// error, and one past `retry_delay_ms_max` the broker's BAD_ARGUMENT.
#[test]
fn a_retry_policy_from_the_command_line() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    let policy = "exp:100ms..30s,x2,jitter=20";
    let created = runnel_ok(&["group", "create", "--addr", &addr, "--retry", policy, "jobs", "g"], b"");
    assert_eq!(created, "created at 1\n");
    let listed = runnel_ok(&["groups", "--addr", &addr, "jobs"], b"");
    assert!(listed.contains(" retry=exp:100ms..30000ms,x2,jitter=20"), "{listed}");
    runnel_ok(&["group", "create", "--addr", &addr, "--retry", "fixed:2s", "jobs", "g"], b"");
    assert!(runnel_ok(&["groups", "--addr", &addr, "jobs"], b"").contains(" retry=fixed:2000ms"));
    let bad = runnel(&["group", "create", "--addr", &addr, "--retry", "sometimes", "jobs", "g"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
    assert!(text(&bad.stderr).contains("retry policy"), "{}", text(&bad.stderr));
    let long = runnel(&["group", "create", "--addr", &addr, "--retry", "fixed:25h", "jobs", "g"]);
    assert_eq!(long.status.code(), Some(1), "{}", text(&long.stderr));
    assert!(text(&long.stderr).contains("BAD_ARGUMENT"), "{}", text(&long.stderr));
}

/// `runnel consume --group G --tags EXPR` makes its group with that filter:
/// it gets only the messages with a matching tag.
#[test]
fn consume_with_tags_gets_only_matching_messages() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    runnel_ok(&["produce", "--addr", &addr, "--tag", "eu", "t"], b"one\n");
    runnel_ok(&["produce", "--addr", &addr, "--tag", "us", "t"], b"two\n");
    runnel_ok(&["produce", "--addr", &addr, "t"], b"three\n");
    // A second group first, so that what `g` filters out stays for it.
    runnel_ok(&["group", "create", "--addr", &addr, "t", "all"], b"");
    let args = ["consume", "--addr", &addr, "--wait-ms", "0", "--group", "g", "--tags", "eu || de", "t"];
    assert_eq!(runnel_ok(&args, b""), "one\n");
    assert_eq!(
        runnel_ok(&["consume", "--addr", &addr, "--wait-ms", "0", "--group", "all", "t"], b""),
        "one\ntwo\nthree\n"
    );
}

/// `runnel redrive --group G` moves only G's dead letters, back to G alone;
/// the counts are in words ("1 message").
#[test]
fn redrive_with_a_group_moves_its_dead_letters_back_to_it_alone() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    let mut c = srv.client_v2();
    for g in ["a", "b"] {
        c.create_group("t", g, GroupSettings::default(), Start::Earliest).expect("create group");
    }
    let id = c.produce("t", b"x").expect("produce");
    let f = Fetch { max_messages: 1, ..Fetch::default() };
    for g in ["a", "b"] {
        assert_eq!(c.fetch_group("t", g, f).expect("fetch").len(), 1);
        c.nack_group("t", g, &[id], 0, true).expect("dead-letter");
    }
    assert_eq!(runnel_ok(&["redrive", "--addr", &addr, "--group", "a", "t"], b""), "moved 1 message\n");
    let consume = |g: &str| runnel_ok(&["consume", "--addr", &addr, "--wait-ms", "0", "--group", g, "t"], b"");
    assert_eq!((consume("a"), consume("b")), ("x\n".to_string(), String::new()));
    assert_eq!(runnel_ok(&["redrive", "--addr", &addr, "t"], b""), "moved 1 message\n", "b's");
    assert_eq!(runnel_ok(&["purge", "--addr", &addr, "t"], b""), "purged 1 message\n");
}

/// `runnel consume --push`: a subscription prints what is pushed, acks
/// it, and stops after `--count` or a wait with nothing; `--credit`
/// implies `--push`.
#[test]
fn consume_push_prints_what_is_pushed() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    runnel_ok(&["produce", "--addr", &addr, "t"], b"one\ntwo\nthree\n");
    let args = ["consume", "--addr", &addr, "--credit", "1", "--count", "2", "t"];
    assert_eq!(runnel_ok(&args, b""), "one\ntwo\n");
    let rest = ["consume", "--addr", &addr, "--push", "--wait-ms", "200", "t"];
    assert_eq!(runnel_ok(&rest, b""), "three\n", "the first two were acked");
    assert_eq!(runnel_ok(&rest, b""), "");
}

/// `produce --delay-ms` and `--at` schedule every line; `cancel` removes a
/// scheduled message and says when it was due, and a second one fails.
#[test]
fn produce_schedules_lines_and_cancel_removes_one() {
    // Far enough ahead that the test never reaches it.
    let (srv, _dir) = page_cache_broker(Limits { schedule_ahead_ms_max: 1 << 50, ..Limits::default() });
    let addr = srv.addr.to_string();
    runnel_ok(&["produce", "--addr", &addr, "--delay-ms", "3600000", "t"], b"later\n");
    runnel_ok(&["produce", "--addr", &addr, "--at", "2100-01-01T00:00:00Z", "t"], b"much later\n");
    let stats = runnel_ok(&["stats", "--addr", &addr, "--json", "t"], b"");
    assert!(stats.contains("\"scheduled\":2"), "{stats}");
    let consumed = runnel_ok(&["consume", "--addr", &addr, "--wait-ms", "0", "t"], b"");
    assert_eq!(consumed, "", "nothing is due");
    let out = runnel_ok(&["cancel", "--addr", &addr, "t", "2"], b"");
    assert_eq!(out, "cancelled, it was due at 4102444800000\n");
    let again = runnel(&["cancel", "--addr", &addr, "t", "2"]);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again.stderr));
    assert!(text(&again.stderr).contains("NOT_SCHEDULED"), "{}", text(&again.stderr));
    let both = runnel(&["produce", "--addr", &addr, "--delay-ms", "1", "--at", "@1", "t"]);
    assert_eq!(both.status.code(), Some(2), "{}", text(&both.stderr));
}

/// `produce --dedup ID` gives line N the dedup id `ID:N`: running it again
/// on the same input, and more, stores only the new lines.
#[test]
fn produce_with_dedup_stores_a_rerun_once() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    runnel_ok(&["produce", "--addr", &addr, "--dedup", "run-7", "t"], b"a\nb\n");
    runnel_ok(&["produce", "--addr", &addr, "--dedup", "run-7", "t"], b"a\nb\nc\n");
    runnel_ok(&["produce", "--addr", &addr, "--dedup", "run-8", "t"], b"a\n");
    let consumed = runnel_ok(&["consume", "--addr", &addr, "--wait-ms", "0", "t"], b"");
    assert_eq!(consumed, "a\nb\nc\na\n");
}

/// `produce --key` keys every line; `lookup` lists them newest first with
/// each group's state, `peek` shows one with its payload.
#[test]
fn lookup_and_peek_print_every_groups_state() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    runnel_ok(&["produce", "--addr", &addr, "--key", "order-17", "t"], b"placed\npaid\n");
    runnel_ok(&["group", "create", "--addr", &addr, "t", "billing"], b"");
    let found = runnel_ok(&["lookup", "--addr", &addr, "t", "order-17"], b"");
    let lines: Vec<&str> = found.lines().collect();
    assert_eq!(lines.len(), 4, "{found}");
    assert!(
        lines[0].starts_with("message 2: born_ms ") && lines[0].contains("key \"order-17\" payload 4 bytes"),
        "{found}"
    );
    assert_eq!(lines[1], "  billing          ready", "{found}");
    let peeked = runnel_ok(&["peek", "--addr", &addr, "t", "1"], b"");
    assert!(peeked.ends_with("  billing          ready\npayload: placed\n"), "{peeked}");
    let none = runnel_ok(&["lookup", "--addr", &addr, "t", "nope"], b"");
    assert!(none.starts_with("no message of t has key"), "{none}");
    let missing = runnel(&["peek", "--addr", &addr, "t", "9"]);
    assert_eq!(missing.status.code(), Some(1), "{}", text(&missing.stderr));
    assert!(text(&missing.stderr).contains("NOT_FOUND"), "{}", text(&missing.stderr));
}

/// `create --retain-ms` keeps acked lines in the log, and a group created
/// at the earliest reads them back from there.
#[test]
fn a_retaining_topic_replays_acked_lines_to_a_new_group() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    assert_eq!(runnel_ok(&["create", "--addr", &addr, "--retain-ms", "3600000", "t"], b""), "created\n");
    runnel_ok(&["produce", "--addr", &addr, "t"], b"a\nb\nc\n");
    assert_eq!(runnel_ok(&["consume", "--addr", &addr, "--wait-ms", "0", "t"], b""), "a\nb\nc\n");
    runnel_ok(&["group", "create", "--addr", &addr, "--from", "earliest", "t", "late"], b"");
    let late = ["consume", "--addr", &addr, "--group", "late", "--count", "3", "--wait-ms", "10000", "t"];
    let replayed = runnel_ok(&late, b"");
    assert_eq!(replayed, "a\nb\nc\n");
}

/// `runnel consume` that the broker stops gracefully while it waits for a
/// message ends with status 0: a long poll is answered with nothing, and
/// `--push` sees its connection closed between frames. Both to a pipe,
/// where the consume also watches its reader while it waits.
#[test]
fn consume_ends_with_status_0_when_the_broker_stops_gracefully() {
    for flags in [&["--push"][..], &[]] {
        let (srv, _dir) = page_cache_broker(Limits::default());
        let addr = srv.addr.to_string();
        runnel_ok(&["produce", "--addr", &addr, "t"], b"one\n");
        let args = [&["consume", "--addr", &addr, "--wait-ms", "60000"][..], flags, &["t"]].concat();
        let mut child = spawn_piped(&args);
        let mut first = String::new();
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        stdout.read_line(&mut first).expect("read a line");
        assert_eq!(first, "one\n");
        // Once it has acknowledged what it printed, it only waits.
        let mut c = srv.client_v2();
        common::wire::wait_until("the consume acks", || common::wire::stat(&mut c, "t", "acked") == 1);
        drop(c);
        srv.stop();
        let out = child.wait_with_output().expect("wait");
        assert_eq!(out.status.code(), Some(0), "{flags:?}: {}:\n{}", out.status, text(&out.stderr));
        assert!(out.stderr.is_empty(), "{flags:?}: {}", text(&out.stderr));
    }
}

/// Reads a request frame's header from `s`, and its body with `body`;
/// returns its op and request id.
fn read_request(s: &mut std::net::TcpStream, body: bool) -> (u8, u32) {
    let mut header = [0u8; 12];
    s.read_exact(&mut header).expect("a request header");
    if body {
        let len = u32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
        s.read_exact(&mut vec![0; len - 8]).expect("a request body");
    }
    (header[4], u32::from_le_bytes(header[8..].try_into().unwrap()))
}

/// A broker of a test's own making for `runnel consume --push` with
/// `flags`, whose stdout is `stdout`: it answers HELLO (version 3) and
/// SUBSCRIBE (subscription 1; with `subscribe_body` false it leaves the
/// SUBSCRIBE's body unread, so that its close is a reset), sends `then`
/// in the same write as that reply, runs `script` on the connection, and
/// closes it. Returns how the consume ended.
fn fake_push_broker(
    flags: &[&str],
    stdout: Stdio,
    (subscribe_body, then): (bool, &[u8]),
    script: impl FnOnce(&mut std::net::TcpStream),
) -> Output {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let child = Command::new(env!("CARGO_BIN_EXE_runnel"))
        .args([&["consume", "--addr", &addr, "--push"][..], flags, &["t"]].concat())
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runnel");
    let (mut s, _) = listener.accept().expect("accept");
    let mut out = Vec::new();
    let limits = codec::DecodeLimits { frame_bytes_max: 1 << 20, ..codec::DecodeLimits::CLIENT };
    codec::encode_hello_reply(&mut out, read_request(&mut s, true).1, codec::SINCE_PUSH, &limits, 0);
    s.write_all(&out).expect("write");
    out.clear();
    codec::encode_subscribed_reply(&mut out, read_request(&mut s, subscribe_body).1, 1);
    out.extend_from_slice(then);
    s.write_all(&out).expect("write");
    script(&mut s);
    drop(s);
    child.wait_with_output().expect("wait")
}

/// `runnel consume --push` against a broker that sends `tail` after the
/// SUBSCRIBE reply and closes the connection (a reset with `reset`).
/// Returns the consume's exit status and stderr.
fn push_consume_cut_by(tail: &[u8], reset: bool) -> (Option<i32>, String) {
    let flags = ["--wait-ms", "60000"];
    let out = fake_push_broker(&flags, Stdio::piped(), (!reset, tail), |_| {});
    (out.status.code(), text(&out.stderr))
}

/// A pushed frame of subscription 1 with one message, `id` and `payload`,
/// in the layout of version 2 and later, without properties.
fn pushed_frame(id: u64, payload: &[u8]) -> Vec<u8> {
    let mut body = vec![1, 0, b't', 1, 0, 0, 0];
    body.extend_from_slice(&id.to_le_bytes());
    body.extend_from_slice(&[0; 8]); // born_ms
    body.extend_from_slice(&[1, 0, 0]); // delivery_count 1, flags 0
    body.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    body.extend_from_slice(payload);
    let mut frame = ((body.len() + 8) as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&[0xEF, 0, 0, 0, 1, 0, 0, 0]);
    frame.extend_from_slice(&body);
    frame
}

/// `runnel consume --push --wait-ms 0` waits for the reply to its ACK as
/// long as the broker takes: `--wait-ms` bounds only the waits for a
/// message (it once bounded the ACK's too, so a broker slower than 1 ms
/// to answer made the consume fail).
#[test]
fn consume_push_waits_for_the_reply_to_its_ack_whatever_wait_ms_says() {
    let dir = TempDir::new("cli-slow-ack");
    let file = std::fs::File::create(dir.path().join("out.txt")).expect("create out.txt");
    let out = fake_push_broker(&["--wait-ms", "0"], Stdio::from(file), (true, &pushed_frame(7, b"one")), |s| {
        let (op, rid) = read_request(s, true);
        assert_eq!(op, codec::op::ACK);
        std::thread::sleep(Duration::from_millis(100));
        let mut reply = Vec::new();
        codec::encode_ids_reply(&mut reply, op, rid, 1, &[]);
        s.write_all(&reply).expect("write");
        // The consume ends once a wait passes with no message.
        let _ = s.read(&mut [0; 64]);
    });
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(dir.path().join("out.txt")).expect("read out.txt"), "one\n");
}

/// A connection cut in the middle of a frame, or reset, is a failure
/// (status 1), not the end of a graceful stop.
#[test]
fn consume_push_fails_when_the_connection_is_cut_mid_frame_or_reset() {
    // The first 8 bytes of a pushed frame that says 40 follow.
    let half_a_frame = [40, 0, 0, 0, 0xEF, 0, 0, 0];
    let (status, err) = push_consume_cut_by(&half_a_frame, false);
    assert_eq!(status, Some(1), "{err}");
    assert!(err.contains("in the middle of a frame"), "{err}");
    let (status, err) = push_consume_cut_by(&half_a_frame, true);
    assert_eq!(status, Some(1), "{err}");
    assert!(err.contains("runnel consume: connection:"), "{err}");
    let (status, err) = push_consume_cut_by(&[], true);
    assert_eq!(status, Some(1), "{err}");
}

/// `runnel consume --group G --tags X` never changes an existing group:
/// where G's settings differ from what the consume asks for it is refused
/// (status 1), naming `runnel group create` as the way to change them, and
/// G keeps every setting, its retry policy too; where they agree it
/// consumes.
#[test]
fn consume_never_changes_an_existing_groups_settings() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    let create = ["group", "create", "--addr", &addr, "--tags", "eu", "--retry", "fixed:2s", "t", "g"];
    assert_eq!(runnel_ok(&create, b""), "created at 1\n");
    runnel_ok(&["produce", "--addr", &addr, "--tag", "eu", "t"], b"one\n");
    let settings = || {
        let listed = runnel_ok(&["groups", "--addr", &addr, "t"], b"");
        listed.lines().find(|l| l.starts_with("g ")).map(|l| l.split_whitespace().skip(8).collect::<Vec<_>>().join(" "))
    };
    assert_eq!(settings().as_deref(), Some("eu retry=fixed:2000ms"));
    let consume = |flags: &[&str]| {
        let args = [&["consume", "--addr", &addr, "--wait-ms", "0", "--group", "g"][..], flags, &["t"]].concat();
        runnel(&args)
    };
    for other in [&["--tags", "us"][..], &["--broadcast"], &["--ordered"], &["--tags", "*"]] {
        let out = consume(other);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "consume {other:?}: {}:\n{err}", out.status);
        assert!(err.contains("runnel group create"), "consume {other:?} must name the way to change it:\n{err}");
        assert!(out.stdout.is_empty(), "consume {other:?} consumed:\n{}", text(&out.stdout));
        assert_eq!(settings().as_deref(), Some("eu retry=fixed:2000ms"), "consume {other:?} changed the group");
    }
    let same = consume(&["--tags", "eu"]);
    assert!(same.status.success(), "{}", text(&same.stderr));
    assert_eq!(text(&same.stdout), "one\n");
    assert_eq!(settings().as_deref(), Some("eu retry=fixed:2000ms"), "a consume that agrees changes nothing either");
    // A group that does not exist yet is made with what the consume asks.
    let new = ["consume", "--addr", &addr, "--wait-ms", "0", "--group", "h", "--tags", "us", "t"];
    assert_eq!(runnel_ok(&new, b""), "");
    assert!(
        runnel_ok(&["groups", "--addr", &addr, "t"], b"").lines().any(|l| l.starts_with("h ") && l.ends_with(" us"))
    );
}

/// Runs `script` with `sh -c`, `$RUNNEL` naming this build's `runnel`;
/// returns what it printed, which must come with status 0.
fn sh(script: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", script])
        .env("RUNNEL", env!("CARGO_BIN_EXE_runnel"))
        .stdin(Stdio::null())
        .output()
        .expect("run sh");
    assert!(out.status.success(), "sh -c {script:?} exited {}:\n{}", out.status, text(&out.stderr));
    text(&out.stdout)
}

/// Messages `m1` to `mN`, one a line.
fn numbered(n: usize) -> Vec<u8> {
    (1..=n).map(|i| format!("m{i}\n")).collect::<String>().into_bytes()
}

/// STATS counters of `topic`, over the wire.
fn counters(srv: &Server, topic: &str) -> impl Fn(&str) -> u64 {
    let c = std::cell::RefCell::new(srv.client_v2());
    let topic = topic.to_string();
    move |key: &str| common::wire::stat(&mut c.borrow_mut(), &topic, key)
}

/// `runnel consume | head -1`, fetching and pushed, in a real shell: the
/// one line head printed is the one message acknowledged, and every other
/// message is still there, not acknowledged, not dead-lettered, delivered
/// once more at most (the one taken as head left, if any: the documented
/// bound).
#[test]
fn consume_piped_to_head_acknowledges_only_what_head_took() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    for (topic, flags) in [("fetched", ""), ("pushed", "--push")] {
        // More than one batch of 256.
        runnel_ok(&["produce", "--addr", &addr, topic], &numbered(300));
        let printed = sh(&format!("\"$RUNNEL\" consume --addr {addr} {flags} {topic} | head -1"));
        assert_eq!(printed, "m1\n", "{topic}");
        let stat = counters(&srv, topic);
        assert_eq!(stat("acked"), 1, "{topic}: only the line head took is acknowledged");
        common::wire::wait_until("the rest is ready", || stat("ready") == 299);
        assert_eq!(stat("dead_lettered"), 0, "{topic}");
        let mut c = srv.client_v2();
        let rest = c.fetch(topic, Fetch { max_messages: 1000, ..Fetch::default() }).expect("fetch");
        let mut ids: Vec<u64> = rest.iter().map(|m| m.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, (2..=300).collect::<Vec<u64>>(), "{topic}: every other message is there");
        let again = rest.iter().filter(|m| m.delivery_count > 1).count();
        assert!(again <= 1, "{topic}: {again} messages were delivered to the consume and not printed");
    }
}

/// On a topic whose messages have one delivery each (`--max-deliveries
/// 1`), `runnel consume | head -1` dead-letters none of what the consume
/// fetched ahead, fetching and pushed: at most the one message taken as
/// its reader left (the documented bound), also when the reader keeps the
/// pipe open after head (the consume then wrote a message nobody took,
/// and does not acknowledge it).
#[test]
fn consume_piped_to_head_dead_letters_at_most_the_message_taken_as_head_left() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    let readers = ["head -1", "{ head -1; sleep 1; }"];
    for (topic, flags) in [("fetched", ""), ("pushed", "--push")] {
        runnel_ok(&["create", "--addr", &addr, "--max-deliveries", "1", topic], b"");
        runnel_ok(&["produce", "--addr", &addr, topic], &numbered(300));
        let stat = counters(&srv, topic);
        for (run, reader) in readers.iter().enumerate() {
            let printed = sh(&format!("\"$RUNNEL\" consume --addr {addr} {flags} {topic} | {reader}"));
            assert_eq!(printed.lines().count(), 1, "{topic} | {reader}: {printed:?}");
            let acked = run as u64 + 1;
            assert_eq!(stat("acked"), acked, "{topic} | {reader}: only the lines head took are acknowledged");
            let settled = || stat("ready") + stat("dead_lettered") == 300 - acked;
            common::wire::wait_until("what the consume held is back", settled);
            assert!(stat("dead_lettered") <= acked, "{topic} | {reader}: {} dead letters", stat("dead_lettered"));
        }
    }
}

/// A reader slower than the ack timeout (`| { sleep 1; head -1; }` with a
/// timeout of 300 ms and one delivery per message): the consume keeps the
/// message it wrote in flight (TOUCH) until the reader takes it, then
/// acknowledges it; it never expires.
#[test]
fn consume_keeps_the_message_its_slow_reader_has_not_taken_in_flight() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    runnel_ok(&["create", "--addr", &addr, "--ack-timeout-ms", "300", "--max-deliveries", "1", "slow"], b"");
    runnel_ok(&["produce", "--addr", &addr, "slow"], &numbered(2));
    let printed = sh(&format!("\"$RUNNEL\" consume --addr {addr} --count 1 slow | {{ sleep 1; head -1; }}"));
    assert_eq!(printed, "m1\n");
    let stat = counters(&srv, "slow");
    assert_eq!((stat("acked"), stat("expired"), stat("dead_lettered")), (1, 0, 0));
    assert_eq!(stat("ready"), 1);
}

/// To a file, a consume takes batches, and no more than `--count` leaves:
/// pushed, it lowers its credit before the acknowledgment that would let
/// the broker push past the count, so nothing is delivered that it does
/// not print.
#[test]
fn consume_to_a_file_is_delivered_no_more_than_it_prints() {
    let (srv, dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    let file = dir.path().join("out.txt");
    let file = file.display();
    for (topic, flags) in [("fetched", "--count 25"), ("pushed", "--push --credit 10 --count 25")] {
        runnel_ok(&["produce", "--addr", &addr, topic], &numbered(100));
        sh(&format!("\"$RUNNEL\" consume --addr {addr} --wait-ms 100 {flags} {topic} > {file}"));
        let printed = std::fs::read_to_string(dir.path().join("out.txt")).expect("read out.txt");
        assert_eq!(printed.as_bytes(), numbered(25), "{topic}");
        let stat = counters(&srv, topic);
        common::wire::wait_until("what the consume held is back", || stat("inflight") == 0);
        assert_eq!((stat("delivered"), stat("acked"), stat("ready")), (25, 25, 75), "{topic}");
    }
}

/// Stdout a socket (one end of a Unix socket pair whose other end the test
/// reads): the consume acknowledges the message its reader took, and no
/// other, when the reader closes its end after one line.
#[test]
fn consume_to_a_socket_acknowledges_only_what_its_reader_took() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    runnel_ok(&["produce", "--addr", &addr, "t"], &numbered(300));
    let (reader, writer) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    let child = Command::new(env!("CARGO_BIN_EXE_runnel"))
        .args(["consume", "--addr", &addr, "t"])
        .stdin(Stdio::null())
        .stdout(std::os::fd::OwnedFd::from(writer))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runnel");
    let mut first = String::new();
    BufReader::new(&reader).read_line(&mut first).expect("read a line");
    assert_eq!(first, "m1\n");
    drop(reader);
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(STDOUT_CLOSED), "{}", text(&out.stderr));
    let stat = counters(&srv, "t");
    assert_eq!(stat("acked"), 1, "only the line the reader took is acknowledged");
    common::wire::wait_until("the rest is ready", || stat("ready") == 299);
}

/// A reader that goes away while the consume waits for a message ends the
/// consume at once (status 141), fetching and pushed: its wait goes with
/// its connection, having taken nothing, so the message that comes next is
/// still there, never delivered.
#[test]
fn consume_ends_when_its_reader_goes_away_during_a_wait_and_takes_nothing() {
    let (srv, _dir) = page_cache_broker(Limits::default());
    let addr = srv.addr.to_string();
    for (topic, flags, waiting) in [("fetched", &[][..], "waiters"), ("pushed", &["--push"], "consumers")] {
        let args = [&["consume", "--addr", &addr, "--wait-ms", "120000"][..], flags, &[topic]].concat();
        let mut child = spawn_piped(&args);
        // The topic's parked FETCHes, or its default group's consumers.
        let section = if waiting == "waiters" { topic.to_string() } else { format!("{topic}/") };
        let mut c = srv.client_v2();
        common::wire::wait_until("the consume waits", || {
            let sections = c.stats(Some(topic)).unwrap_or_default();
            let counter = sections.iter().find(|s| s.0 == section).and_then(|s| s.1.iter().find(|kv| kv.0 == waiting));
            counter.is_some_and(|kv| kv.1 == 1)
        });
        drop(child.stdout.take());
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().expect("try_wait").is_none() {
            assert!(Instant::now() < deadline, "{topic}: the consume did not end when its reader went away");
            std::thread::sleep(Duration::from_millis(10));
        }
        let out = child.wait_with_output().expect("wait");
        assert_eq!(out.status.code(), Some(STDOUT_CLOSED), "{topic}: {}", text(&out.stderr));
        runnel_ok(&["produce", "--addr", &addr, topic], b"later\n");
        let stat = counters(&srv, topic);
        assert_eq!((stat("ready"), stat("delivered")), (1, 0), "{topic}");
    }
}
