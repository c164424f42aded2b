//! Fuzz target `decode`: `codec::decode_request` and `codec::decode_reply`
//! on any bytes, checked against properties (fuzz/decode_props.rs), not
//! only for panics. The first byte picks the decoder's limits.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../decode_props.rs"]
mod decode_props;

fuzz_target!(|data: &[u8]| {
    decode_props::check_decode(data, "fuzz input");
});
