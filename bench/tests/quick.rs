//! Runs `runnel-bench --quick --only runnel,floor` end to end: it must
//! complete, runnel and the echo floor must deliver every message they
//! acknowledged (the bench checks each one and exits non-zero otherwise),
//! and runnel's rows must be given as ratios to the floor's. No speed is
//! asserted: the bench measures speed, tests check behaviour.
//!
//! It runs without `--out`, as a user's quick try does, so it also checks
//! that a quick run writes to a temporary directory and leaves the committed
//! full-run results in bench/results as they were.
//!
//! The runnel and runnel-floor binaries are the ones beside the bench's
//! (target/<profile>/), which `cargo test --workspace` builds.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn quick_run_delivers_every_runnel_message() {
    let published = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results").join("results.json");
    let published_before = std::fs::read(&published).ok();
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_runnel-bench"));
    let runnel = bench.with_file_name("runnel");
    assert!(
        runnel.is_file(),
        "no runnel binary at {}: build the workspace (cargo test --workspace builds it)",
        runnel.display()
    );
    let result = Command::new(&bench)
        .args(["--quick", "--only", "runnel,floor"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bench.display()));
    let stdout = String::from_utf8_lossy(&result.stdout);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "runnel-bench failed ({}):\n{stderr}\n{stdout}", result.status);
    let published_after = std::fs::read(&published).ok();
    assert!(published_after == published_before, "a quick run changed {}", published.display());
    let out = stdout
        .lines()
        .find_map(|l| l.strip_prefix("results, JSON and plots written to "))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("the bench did not say where its results went:\n{stdout}"));
    assert!(out.starts_with(std::env::temp_dir()), "a quick run wrote to {}", out.display());
    let json = std::fs::read_to_string(out.join("results.json"))
        .unwrap_or_else(|e| panic!("no results.json in {}: {e}", out.display()));
    assert!(json.contains("\"verify\":{\"ok\":true"), "no verified run in results.json:\n{json}");
    assert!(!json.contains("\"ok\":false"), "a run did not deliver every message:\n{stdout}");
    for w in ["W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9", "W10", "W11", "W3C", "W3S", "W3B", "R1"] {
        assert!(json.contains(&format!("\"workload\":\"{w}\"")), "{w} did not run:\n{stderr}");
    }
    // W8's consumers of an ordered group saw every key's messages in order.
    assert!(json.contains("every key's messages arrived in produce order"), "no W8 order check:\n{stdout}");
    assert!(!json.contains("out of produce order"), "an ordered group broke a key's order:\n{stdout}");
    assert!(json.contains("\"broker\":\"floor\""), "the floor did not run:\n{stderr}");
    // runnel ran in each durability, labelled as such.
    for d in ["durable", "log, no sync", "memory only"] {
        let row = format!("\"broker\":\"runnel\",\"durability\":\"{d}\"");
        assert!(json.contains(&row), "no runnel row {d}:\n{stderr}");
    }
    assert!(json.contains("\"vs_floor\":{"), "no row was given against the floor:\n{stdout}");
    // runnel's push subscribers ran beside its fetching consumers.
    for c in ["push", "fetch"] {
        assert!(json.contains(&format!("\"consumer\":\"{c}\"")), "no runnel {c} row:\n{stderr}");
    }
    assert!(out.join("results.md").is_file() && out.join("w3-10k.svg").is_file());
    let _ = std::fs::remove_dir_all(&out);
}
