//! Fuzz target `stream`: any bytes as a configuration, cut points and a
//! request stream (fuzz/sim.rs `FuzzInput`), fed to a broker through the
//! reactor's connection logic whole, split and one piece per turn, checked
//! against every property of `sim::check_stream`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../sim.rs"]
mod sim;

fuzz_target!(|data: &[u8]| {
    sim::FuzzInput::parse(data).check("fuzz input");
});
