//! Fuzz target for MoE routing traces (`pager::trace::Trace::parse`, the files
//! `pinch moe-trace` writes and `pinch moe-sim` replays).
//!
//! Input: byte 0 picks the pool size and policy for a replay; the rest is the file.
//! Checked: every pick of an accepted trace is below its expert count, writing the
//! picks back with `TraceWriter` gives the same bytes, and the pager simulation over
//! it runs (for short traces) with counts that add up.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinch_runtime_min::pager::pool::Policy;
use pinch_runtime_min::pager::sim::simulate;
use pinch_runtime_min::pager::trace::{Trace, TraceWriter, HEADER};

fuzz_target!(|data: &[u8]| {
    let [sel, file @ ..] = data else {
        return;
    };
    let Ok(t) = Trace::parse(file) else {
        return;
    };
    let (layers, experts) = (
        u32::from_le_bytes(file[8..12].try_into().unwrap()) as usize,
        u32::from_le_bytes(file[12..16].try_into().unwrap()) as usize,
    );
    let picks = u32::from_le_bytes(file[16..20].try_into().unwrap()) as usize;
    let mut buf = vec![0u8; file.len()];
    let mut w = TraceWriter::new(&mut buf, layers, experts, picks).unwrap();
    let mut ids = vec![0u16; picks];
    for tok in 0..t.tokens() {
        for l in 0..layers {
            t.picks_of(tok, l, &mut ids);
            assert!(ids.iter().all(|&e| (e as usize) < experts));
            w.push(&ids).unwrap();
        }
    }
    assert_eq!(w.bytes(), file, "rewritten trace differs");
    // Replays are linear in tokens x layers x picks: keep them short.
    if (file.len() - HEADER) <= 4096 {
        let policy = [Policy::Lru, Policy::LFU][(sel & 1) as usize];
        let slots = 1 + (*sel as usize >> 1) % experts;
        if let Ok(r) = simulate(&t, slots, policy) {
            assert_eq!(r.tokens, t.tokens());
            assert_eq!(r.layers.len(), layers);
            let total = r.total();
            assert!(total.best_fixed_hits <= total.accesses());
            assert!(total.accesses() <= (t.tokens() * layers * picks) as u64);
        }
    }
});
