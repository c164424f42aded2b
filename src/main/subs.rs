//! The subcommands and their flags, as `--help` shows them: each is
//! described once, by a `Sub`, which is both its usage and the set of
//! flags its parser accepts.

use runnel::codec;
use runnel::config::{DEFAULT_ADDR, Flag, flag, serve_flags, switch};

use super::{CONSUME_CREDIT_DEFAULT, CONSUME_WAIT_MS_DEFAULT, PRODUCE_BATCH_DEFAULT};

/// A subcommand: what its usage says and which flags it accepts.
pub(crate) struct Sub {
    /// Its name after `runnel`.
    pub(crate) name: &'static str,
    /// Its positional words, as the usage line shows them.
    words: &'static str,
    /// What it does, in one line.
    about: &'static str,
    /// What else a user should know: environment variables, the config file.
    notes: &'static str,
    /// Every flag it takes.
    pub(crate) flags: Vec<Flag>,
}

/// The subcommands, in the order `runnel --help` lists them.
const COMMANDS: [&str; 14] = [
    "serve", "produce", "consume", "stats", "topics", "create", "delete", "purge", "redrive", "groups", "group",
    "cancel", "lookup", "peek",
];

/// The start positions `--from` and `--to` take.
pub(crate) const START_VALUES: &str = "earliest|latest|ID|@MS|TIME";

/// What the client subcommands say about the token.
const CLIENT_NOTES: &str = "RUNNEL_AUTH_TOKEN, if set, is the token presented in HELLO.";

/// The flags `runnel group` takes, after `addr`.
fn group_command_flags(addr: Flag) -> Vec<Flag> {
    vec![
        addr,
        flag("--from", START_VALUES, "earliest", "create: where the group starts"),
        flag("--to", START_VALUES, "none", "reset: where the group moves"),
        flag("--tags", "EXPR", "*", "create: the tag filter: * | a || b | re:PATTERN"),
        switch("--broadcast", "create: every consumer gets every message"),
        switch("--ordered", "create: messages with the same key one at a time, in order (protocol version 4)"),
        flag("--ack-timeout-ms", "MS", "the topic's", "create: time to acknowledge a delivery"),
        flag("--max-deliveries", "N", "the topic's", "create: deliveries before a dead letter"),
        flag(
            "--retry",
            "POLICY",
            "none",
            "create: wait after a NACK without a delay or an ack timeout: fixed:500ms | exp:100ms..30s,x2,jitter=20 \
             (protocol version 4)",
        ),
    ]
}

/// The description of subcommand `name`, or None if there is none.
pub(crate) fn sub(name: &str) -> Option<Sub> {
    let name = *COMMANDS.iter().find(|c| **c == name)?;
    let addr = || flag("--addr", "ADDR", DEFAULT_ADDR, "the broker to talk to");
    let (words, about, flags) = match name {
        "serve" => ("", "run the broker", serve_flags()),
        "produce" => (
            "TOPIC",
            "send each line of stdin to TOPIC as one message, until all are acknowledged",
            produce_flags(addr()),
        ),
        "consume" => (
            "TOPIC",
            "print TOPIC's messages one a line, acknowledging each once its reader has it, until a wait finds none",
            consume_flags(addr()),
        ),
        "groups" => ("TOPIC", "list TOPIC's consumer groups and their state", vec![addr()]),
        "group" => (
            "create|delete|reset TOPIC GROUP",
            "create a consumer group (or change its settings), delete one, or move one",
            group_command_flags(addr()),
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
                flag("--retain-ms", "MS", "as it is (0)", "keep done messages for replay this long (version 4)"),
                flag(
                    "--retain-bytes",
                    "N",
                    "as it is (0)",
                    "keep this many log bytes of done messages for replay (version 4)",
                ),
            ],
        ),
        "delete" => ("TOPIC", "delete TOPIC and its messages", vec![addr()]),
        "purge" => ("TOPIC", "remove every message of TOPIC, keeping the topic", vec![addr()]),
        "redrive" => (
            "TOPIC",
            "move the messages of TOPIC.dlq back to TOPIC",
            vec![
                addr(),
                flag("--count", "N", "all", "most messages to move"),
                flag("--group", "G", "every group's", "move only G's dead letters, back to G alone (version 2)"),
            ],
        ),
        "cancel" | "lookup" | "peek" => one_message_command(name, addr()),
        _ => return None,
    };
    let notes = match name {
        "serve" => SERVE_NOTES,
        "consume" => CONSUME_NOTES,
        _ => CLIENT_NOTES,
    };
    Some(Sub { name, words, about, notes, flags })
}

/// The words, description and flags of the commands about one message
/// (by id) or one key of a topic.
fn one_message_command(name: &str, addr: Flag) -> (&'static str, &'static str, Vec<Flag>) {
    match name {
        "cancel" => {
            ("TOPIC ID", "cancel scheduled message ID of TOPIC: it is never delivered (protocol version 3)", vec![addr])
        }
        "lookup" => (
            "TOPIC KEY",
            "print TOPIC's most recent messages with key KEY, newest first, and their state in every group (version 4)",
            vec![addr],
        ),
        _ => (
            "TOPIC ID",
            "print message ID of TOPIC and its state in every group, without delivering it (version 4)",
            vec![addr],
        ),
    }
}

/// `runnel consume`'s flags, after `addr`.
fn consume_flags(addr: Flag) -> Vec<Flag> {
    vec![
        addr,
        flag("--count", "N", "no limit", "stop after N messages"),
        flag("--wait-ms", "MS", CONSUME_WAIT_MS_DEFAULT, "how long each FETCH waits for a message"),
        flag("--group", "G", "the default group", "the consumer group to read for"),
        flag("--from", START_VALUES, "earliest", "where a group made now starts"),
        flag("--tags", "EXPR", "*", "a group made now: its tag filter, * | a || b | re:PATTERN (see below)"),
        switch("--broadcast", "a group made now: broadcast, every consumer gets every message"),
        switch("--ordered", "a group made now: ordered by key, one message of a key at a time"),
        switch("--push", "subscribe: the broker pushes messages (protocol version 3)"),
        flag(
            "--credit",
            "N",
            CONSUME_CREDIT_DEFAULT,
            "most messages held unacknowledged, 1 to a pipe (implies --push)",
        ),
    ]
}

/// `runnel produce`'s flags, after `addr`.
fn produce_flags(addr: Flag) -> Vec<Flag> {
    vec![
        addr,
        flag("--batch", "N", PRODUCE_BATCH_DEFAULT, "most lines in one PRODUCE frame"),
        flag("--tag", "TAG", "none", "tag every message with TAG (repeatable; protocol version 2)"),
        flag("--header", "KEY[=VALUE]", "none", "give every message this header (repeatable; version 2)"),
        flag("--delay-ms", "MS", "none", "deliver every message MS after the broker receives it (version 3)"),
        flag("--at", "MS|TIME", "none", "deliver every message at this time, ms or UTC (version 3)"),
        flag("--key", "K", "none", "give every message key K: lookup finds it by K (version 4)"),
        flag("--dedup", "ID", "none", "give line N the dedup id ID:N, so a rerun stores each line once (version 4)"),
    ]
}

/// What `runnel consume --help` says besides its flags.
const CONSUME_NOTES: &str = "\
To a terminal or a file, messages come in batches, each acknowledged once
printed. To a pipe or a socket, one at a time, each acknowledged once the
reader has taken it from the pipe; the next is taken only while the reader
is there. When the reader goes away, the message the consume may hold then
(at most one) is not acknowledged: it is ready again at once, with that
delivery counted (on its last allowed delivery, dead-lettered).
A consume never changes a group: --tags, --broadcast and --ordered make a
group that does not exist yet; on one that exists with other settings the
consume fails (status 1) without consuming. `runnel group create` changes
a group's settings, for all of its consumers.
RUNNEL_AUTH_TOKEN, if set, is the token presented in HELLO.";

/// What `runnel serve --help` says besides its flags.
const SERVE_NOTES: &str = "\
Every flag but --config is also a key of the config file: `key = value`, the
flag without its dashes. RUNNEL_AUTH_TOKEN sets --auth-token; RUST_LOG sets
the log level (default info). SIGTERM or SIGINT stops the broker gracefully.";

/// The one line a wrong command line is answered with.
pub(crate) fn usage_line(sub: &Sub) -> String {
    let words = if sub.words.is_empty() { String::new() } else { format!(" {}", sub.words) };
    format!("usage: runnel {} [FLAGS]{words}   (runnel {} --help lists the flags)", sub.name, sub.name)
}

/// A subcommand's `--help`: its usage line, what it does, and every flag
/// with its default, one line each.
pub(crate) fn usage(sub: &Sub) -> String {
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
pub(crate) fn top_usage() -> String {
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

pub(crate) fn top_usage_line() -> String {
    "usage: runnel COMMAND [FLAGS] [ARGS]   (runnel --help lists the commands)".to_string()
}

/// `runnel --version`: this build and the protocol versions it speaks.
pub(crate) fn version_text() -> String {
    let (min, max) = (codec::VERSION_MIN, codec::VERSION_MAX);
    let protocol =
        if min == max { format!("protocol version {min}") } else { format!("protocol versions {min} to {max}") };
    format!("runnel {}\n{protocol}\n", env!("CARGO_PKG_VERSION"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
