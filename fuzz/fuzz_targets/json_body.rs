//! Fuzz target for the JSON bodies the server accepts (`server::json::parse` for the
//! chat, completions and llama-server APIs) and the unescaping of every string in them.
//!
//! Input: byte 0 picks the API and the size of the unescape buffer; the rest is the
//! body. Checked beyond "no panic": an accepted body's numbers are in range, each
//! string unescapes into the bounded buffer or reports `Range`, and an unescaped string
//! compares equal to its escaped form with `escaped_eq`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinch_runtime_min::server::json::{self, Api, BodyError, MAX_STOP, MAX_STOP_LEN, MAX_TOP};
use serde_json_core::str::EscapedStr;

fn check_str(s: &EscapedStr<'_>, buf: &mut [u8]) {
    let cap = buf.len();
    let mut rest: &mut [u8] = buf;
    match json::unescape(s, &mut rest) {
        Ok(t) => {
            assert!(t.len() <= cap);
            let t = t.to_owned();
            assert!(
                json::escaped_eq(s, &t),
                "escaped_eq disagrees with unescape"
            );
            let mut wrong = t.clone();
            wrong.push('x');
            assert!(!json::escaped_eq(s, &wrong));
        }
        Err(BodyError::Range(_) | BodyError::BadEscape) => {}
        Err(e) => panic!("unescape gave {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let [sel, body @ ..] = data else {
        return;
    };
    let api = [Api::Chat, Api::Completions, Api::Llama][(sel % 3) as usize];
    let mut buf = vec![0u8; (*sel as usize >> 2) * 8];
    match json::parse(api, body) {
        Ok(p) => {
            assert!(p.p.top <= MAX_TOP);
            assert!(p.p.temperature.is_none_or(|t| t.is_finite() && t >= 0.0));
            assert!(p.p.top_p.is_none_or(|t| t > 0.0 && t <= 1.0));
            assert!(p.stop.len() <= MAX_STOP);
            assert!(p
                .stop
                .iter()
                .all(|s| !s.0.is_empty() && s.0.len() <= MAX_STOP_LEN));
            match api {
                Api::Chat => assert!(!p.messages.is_empty()),
                _ => assert!(p.prompt.is_some()),
            }
            // The prompt is kept raw (a string, ids or a list); a string one is checked.
            let prompt = p.prompt.and_then(|v| v.str());
            for s in p.model.iter().chain(prompt.iter()).chain(p.stop.iter()) {
                check_str(s, &mut buf);
            }
            for m in p.messages.iter() {
                check_str(&m.role, &mut buf);
                if let json::Content::Text(c) = &m.content {
                    check_str(c, &mut buf);
                }
            }
        }
        Err(e) => {
            let _ = format!("{e}");
        }
    }
});
