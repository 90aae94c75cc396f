//! Fuzz target for the server's HTTP request-head parser (`server::http::parse_head`).
//!
//! Input: byte 0 scales the body limit; the rest is what a client sent. Checked: a
//! complete head ends inside the input and within `MAX_HEAD`, its body fits the limit,
//! its path is a prefix of the request target, and the head alone (without what follows
//! it) parses to the same result; every error maps to a 4xx/5xx status.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinch_runtime_min::server::http::{parse_head, reason, MAX_HEAD};

fuzz_target!(|data: &[u8]| {
    let [scale, buf @ ..] = data else {
        return;
    };
    let max_body = (*scale as usize) << 10;
    match parse_head(buf, max_body) {
        Ok(Some(h)) => {
            assert!(h.head_len <= buf.len() && h.head_len <= MAX_HEAD);
            assert!(h.body_len <= max_body);
            assert!(!h.path.contains('?') && !h.path.contains('#'));
            assert_eq!(parse_head(&buf[..h.head_len], max_body), Ok(Some(h)));
        }
        Ok(None) => assert!(buf.len() < MAX_HEAD),
        Err(e) => {
            let s = e.status();
            assert!((400..600).contains(&s) && !reason(s).is_empty());
            let _ = format!("{e}");
        }
    }
});
