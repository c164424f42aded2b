//! runnel: a durable message broker that runs as one thread on one core.
//!
//! The library holds everything; the `runnel` binary, the tests and the
//! bench share it. One file, one noun:
//! - `limits`: every bound, with its default and reason;
//! - `codec`: the wire frames (docs/protocol.md is the contract);
//! - `filter`: a consumer group's tag filter (`*`, `a || b`, `re:...`);
//! - `conn`: a connection's protocol state: input, bit bucket, output and
//!   the decode/serve step, without socket or clock;
//! - `wheel`: the hashed timing wheel for ack deadlines and delays;
//! - `queue`: a topic's messages (`seq`) and its consumer groups' state
//!   (`group`), tied by `topic`;
//! - `log`: the segmented commit log, and its recovery from damage;
//! - `record`: the commit log's records, typed, with their encoders and
//!   decoders;
//! - `broker`: applies requests to the queues and drives a turn (the
//!   topic table, parked fetches, the turn, dead letters, one function per
//!   request, stats: `broker/`);
//! - `replay`: recovery's second half, decoding each record read back and
//!   applying it to the topic table;
//! - `compactor`: cleans the log's oldest segments, reading the topic table
//!   and writing the log;
//! - `failure_log`: storage failures, logged at a bounded rate;
//! - `reactor`: the one mio loop, its connections and the clock;
//! - `http`: the metrics listener (HTTP/1.x `GET /metrics`, `/healthz`) the
//!   loop serves beside its clients;
//! - `metrics`: histograms and the Prometheus exposition;
//! - `client`: a blocking client that speaks only the wire protocol;
//! - `config`: `runnel serve`'s flags, config file and `--print-config`,
//!   and the flag parser every subcommand uses;
//! - `sys`: the operating-system calls std and mio do not wrap, the only
//!   `unsafe` code;
//! - `testkit`: seeded randomness and temporary directories shared by the
//!   tests (not the broker's).

#![deny(unsafe_code)]
// Functions fit on a screen: the threshold is in clippy.toml, and CI runs
// clippy with -D warnings, so a longer function fails the build.
#![warn(clippy::too_many_lines)]

pub mod broker;
pub mod client;
pub mod codec;
mod compactor;
pub mod config;
pub mod conn;
mod failure_log;
pub mod filter;
pub mod filter_table;
pub mod http;
pub mod limits;
pub mod log;
pub mod metrics;
pub mod producer;
pub mod queue;
pub mod reactor;
pub mod record;
mod record_deliver;
mod replay;
#[allow(unsafe_code)] // the one place for it: each block has its SAFETY note
pub mod sys;
#[doc(hidden)]
pub mod testkit;
pub mod wheel;
