//! Every example session of README.md, run as a user runs it and compared
//! with what the README shows under each command, so that the examples
//! stay true (as tests/protocol_doc.rs holds the protocol doc's hex dumps
//! to the codec).
//!
//! An example session is a ```sh block whose first line starts with `$ `.
//! The sessions run in README order, one after another, on one broker:
//! each `$ ` line is a command, and the lines under it, up to the next `$ `
//! line, are what it prints on stdout, exactly, except the numbers after
//! the words of `VARYING`, which stand for any number: times, which move
//! with the clock. Every command must exit with status 0. Two commands are
//! not run as written: `cargo build ... && alias runnel=...`, since the
//! test runs this build's binary, and `runnel serve ... &`, which starts
//! the broker with the README's flags and, after them, a free port and a
//! data directory of the test's own. Every other command runs in `sh -c`,
//! where `runnel` is this build's binary told that broker's address (with
//! `--addr` after the subcommand's name).

mod common;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::TempDir;

/// Words followed by a number that may differ from run to run: the
/// README's number and the command's are both read as `N`. `born_ms`, the
/// time a message was produced; `until`, when a message in flight, delayed
/// or waiting is due; `due at`, when a scheduled message was due.
const VARYING: [&str; 3] = ["born_ms ", "until ", "due at "];

/// How long one command may take before the test gives up on it.
const COMMAND_PATIENCE: Duration = Duration::from_secs(60);

/// A command of an example session and what the README shows it printing.
#[derive(Debug)]
struct Step {
    /// Its line in README.md (from 1).
    line: usize,
    /// The command, after `$ `.
    command: String,
    /// The lines under it.
    expected: Vec<String>,
}

/// The commands of every example session, in README order.
fn sessions(readme: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    // None outside a block; in one, whether it is a session (known from
    // its first line; never in a block that is not `sh`).
    let mut block: Option<Option<bool>> = None;
    for (i, line) in readme.lines().enumerate() {
        if let Some(lang) = line.strip_prefix("```") {
            block = match block {
                Some(_) => None,
                None if lang == "sh" => Some(None),
                None => Some(Some(false)),
            };
            continue;
        }
        let Some(session) = block.as_mut() else { continue };
        if !*session.get_or_insert_with(|| line.starts_with("$ ")) {
            continue;
        }
        match line.strip_prefix("$ ") {
            Some(command) => steps.push(Step { line: i + 1, command: command.to_string(), expected: Vec::new() }),
            None => steps.last_mut().expect("a session starts with a command").expected.push(line.to_string()),
        }
    }
    steps
}

/// `line` with the number after each word of `VARYING` read as `N`.
fn masked(line: &str) -> String {
    let mut out = line.to_string();
    for word in VARYING {
        let mut from = 0;
        while let Some(at) = out[from..].find(word).map(|i| i + from + word.len()) {
            let digits = out[at..].bytes().take_while(u8::is_ascii_digit).count();
            if digits > 0 {
                out.replace_range(at..at + digits, "N");
            }
            from = at;
        }
    }
    out
}

/// The broker the sessions run against: `runnel serve` in a child process,
/// killed when the test ends however it ends.
struct Broker {
    child: Child,
    /// Where it listens.
    addr: String,
}

impl Broker {
    /// Runs `runnel serve` with `args` (the README's), then a free port and
    /// `data`; waits for the line of its log that says where it listens.
    fn start(args: &[&str], data: &Path) -> Broker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_runnel"))
            .arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn runnel serve");
        let log = BufReader::new(child.stderr.take().expect("stderr"));
        let (tx, rx) = mpsc::channel();
        // Reads the log to its end, so that the broker never blocks on it.
        std::thread::spawn(move || {
            for line in log.lines().map_while(Result::ok) {
                if let Some(rest) = line.split("runnel serving on ").nth(1) {
                    let _ = tx.send(rest.split(' ').next().unwrap_or_default().to_string());
                }
            }
        });
        let addr = rx.recv_timeout(COMMAND_PATIENCE).expect("runnel serve says where it listens");
        Broker { child, addr }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `dir/runnel`, a script that runs this build's binary with
/// `--addr addr` after the subcommand's name (not for `serve`, `help` or a
/// flag).
fn runnel_script(dir: &Path, addr: &str) {
    let bin = env!("CARGO_BIN_EXE_runnel");
    let script = format!(
        "#!/bin/sh\ncase \"$1\" in\n  serve|help|-*) exec '{bin}' \"$@\" ;;\nesac\n\
         cmd=\"$1\"\nshift\nexec '{bin}' \"$cmd\" --addr '{addr}' \"$@\"\n"
    );
    let path = dir.join("runnel");
    std::fs::write(&path, script).expect("write the runnel script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod the runnel script");
}

/// Runs `command` in `sh -c` with `bin` first on PATH; returns its status
/// and stdout, or a description of what went wrong.
fn run(command: &str, bin: &Path) -> Result<String, String> {
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut child = Command::new("sh")
        .args(["-c", command])
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("sh: {e}"))?;
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut out = String::new();
            let _ = r.read_to_string(&mut out);
            out
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + COMMAND_PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("wait: {e}"))? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(format!("still running after {COMMAND_PATIENCE:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    if !status.success() {
        return Err(format!("exited {status}; stderr:\n{stderr}"));
    }
    Ok(stdout)
}

/// Runs every step of the sessions; returns a description of each one
/// whose output is not what the README shows.
fn run_sessions(steps: &[Step], scratch: &Path) -> Vec<String> {
    let mut broker = None;
    let mut wrong = Vec::new();
    for step in steps {
        let command = step.command.split(" #").next().unwrap_or_default().trim();
        if command.starts_with("cargo build") {
            continue;
        }
        if let Some(serve) = command.strip_prefix("runnel serve").and_then(|c| c.trim().strip_suffix('&')) {
            let args: Vec<&str> = serve.split_whitespace().collect();
            let b = Broker::start(&args, &scratch.join("data"));
            runnel_script(scratch, &b.addr);
            broker = Some(b);
            continue;
        }
        assert!(broker.is_some(), "README.md:{}: a command before `runnel serve &`", step.line);
        let got = run(&step.command, scratch).map(|out| out.lines().map(masked).collect::<Vec<_>>());
        let want: Vec<String> = step.expected.iter().map(|l| masked(l)).collect();
        match got {
            Ok(got) if got == want => {}
            Ok(got) => wrong.push(format!(
                "README.md:{}: $ {}\nthe README shows:\n{}\nit printed:\n{}",
                step.line,
                step.command,
                want.join("\n"),
                got.join("\n")
            )),
            Err(e) => wrong.push(format!("README.md:{}: $ {}\n{e}", step.line, step.command)),
        }
    }
    wrong
}

#[test]
fn every_readme_example_prints_what_the_readme_shows() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).expect("README.md");
    let steps = sessions(&readme);
    assert!(
        steps.iter().any(|s| s.command.starts_with("runnel serve")),
        "README.md has no session that starts a broker"
    );
    let scratch = TempDir::new("readme");
    let wrong = run_sessions(&steps, scratch.path());
    assert!(wrong.is_empty(), "{} README examples differ from what they print:\n\n{}", wrong.len(), wrong.join("\n\n"));
}

/// The reading of the README the test relies on: sessions are the blocks
/// that start with `$ `, and a number after a word of `VARYING` is any
/// number, while every other difference counts.
#[test]
fn sessions_and_varying_numbers_are_read_as_documented() {
    let readme =
        "text\n```sh\ncargo run   # not a session\n```\n```sh\n$ runnel a\none\n$ runnel b\n```\n```\n$ x\n```\n";
    let steps = sessions(readme);
    let read: Vec<(usize, &str, Vec<String>)> =
        steps.iter().map(|s| (s.line, s.command.as_str(), s.expected.clone())).collect();
    assert_eq!(read, [(6, "runnel a", vec!["one".to_string()]), (8, "runnel b", vec![])]);
    assert_eq!(masked("message 4: born_ms 1796140800123 key"), "message 4: born_ms N key");
    assert_eq!(masked("until 17 and until 18, due at 5"), "until N and until N, due at N");
    assert_ne!(masked("message 4: born_ms 1"), masked("message 5: born_ms 1"));
    assert_eq!(masked("born_ms x"), "born_ms x");
}
