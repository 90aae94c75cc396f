//! Fuzz target for constrained output: the GBNF parser (`grammar::parse`), the JSON
//! schema converter (`grammar::json_schema`) and the matcher run on what parses.
//!
//! Input: byte 0 picks GBNF (even) or a JSON schema (odd) and how many of the last
//! bytes are fed to the matcher; the rest is the text. Checked beyond "no panic": a
//! schema that converts gives GBNF that parses, and the matcher's `allows` agrees with
//! `accept` on every byte.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinch_runtime_min::grammar::{json_schema, parse, Matcher, MatcherBufs, Store};

fuzz_target!(|data: &[u8]| {
    let [sel, rest @ ..] = data else {
        return;
    };
    let feed = (*sel as usize >> 1).min(rest.len());
    let (text, bytes) = rest.split_at(rest.len() - feed);
    let Ok(text) = core::str::from_utf8(text) else {
        return;
    };
    let mut gbnf = String::new();
    let src = if sel & 1 == 1 {
        match json_schema::text_to_gbnf(text, &mut gbnf) {
            Ok(()) => gbnf.as_str(),
            Err(e) => {
                let _ = format!("{e}");
                return;
            }
        }
    } else {
        text
    };
    let (mut elems, mut sets, mut rules, mut work) =
        (vec![0u32; 4096], vec![0u32; 2048], vec![0u32; 256], vec![0u32; 1024]);
    let mut store = Store {
        elems: &mut elems,
        sets: &mut sets,
        rules: &mut rules,
        work: &mut work,
    };
    let parsed = match parse(src, &mut store) {
        Ok(p) => p,
        Err(e) => {
            let _ = format!("{e}");
            // A schema's grammar always parses (unless it is too large for this store).
            if sel & 1 == 1 {
                assert!(
                    matches!(e, pinch_runtime_min::grammar::GrammarError::TooLarge { .. }),
                    "{e}\n{src}"
                );
            }
            return;
        }
    };
    let (mut nodes, mut spare, mut fwd, mut tops) =
        (vec![0u32; 2048], vec![0u32; 2048], vec![0u32; 1024], vec![0u32; 512]);
    let Ok(mut m) = Matcher::new(
        parsed.view(&store),
        MatcherBufs {
            nodes: &mut nodes,
            spare: &mut spare,
            fwd: &mut fwd,
            tops: &mut tops,
        },
    ) else {
        return;
    };
    for b in bytes {
        let one = core::slice::from_ref(b);
        let allowed = m.allows(one);
        let overflowed = m.overflowed;
        let took = m.accept(one);
        if !overflowed && !m.overflowed {
            assert_eq!(allowed, took, "allows and accept disagree on {b:#x}");
        }
        if !took {
            break;
        }
    }
});
