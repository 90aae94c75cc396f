//! `pinch moe-sim TRACE --pool N --policy lfu|lru [--expert-bytes SIZE] [--from N]`: replay a
//! routing trace through a pool of N expert slots per MoE layer and print the hit rate
//! per layer beside the best fixed pool of that size, and the bytes read per token.
use core::fmt::Write;

use crate::arena::Arena;
use crate::cli::Opts;
use crate::commands::head_select::read_file;
use crate::commands::out::Out;
use crate::commands::AppError;
use crate::pager::{sim::simulate_from, Trace};
use crate::platform::Platform;

pub fn moe_sim<P: Platform>(p: &P, o: &Opts, region: &mut [u8]) -> Result<(), AppError> {
    let path = o.file.ok_or(AppError::Usage(
        "moe-sim needs a trace file: pinch moe-sim TRACE --pool N",
    ))?;
    let mut arena = Arena::new(region);
    let bytes = read_file(p, &mut arena, path)?;
    let trace = Trace::parse(bytes).map_err(AppError::Trace)?;
    let report =
        simulate_from(&trace, o.moe_pool, o.moe_policy, o.moe_from).map_err(AppError::Pool)?;
    let mut out = Out::stdout(p);
    let _ = writeln!(
        out,
        "trace: {} tokens, {} MoE layers, {} experts, {} per token; pool {} slots per layer, policy {}",
        report.tokens,
        trace.layers,
        trace.experts,
        trace.picks,
        o.moe_pool.min(trace.experts),
        o.moe_policy.name()
    );
    let _ = writeln!(
        out,
        "| layer | hits | misses | hit rate | best fixed pool |"
    );
    let _ = writeln!(out, "| ---: | ---: | ---: | ---: | ---: |");
    let mut row = |layer: &dyn core::fmt::Display, s: &crate::pager::LayerStats| {
        let _ = writeln!(
            out,
            "| {layer} | {} | {} | {:.1} % | {:.1} % |",
            s.hits,
            s.misses,
            100.0 * s.hit_rate(),
            100.0 * s.best_fixed_rate()
        );
    };
    for (l, s) in report.layers.iter().enumerate() {
        row(&l, s);
    }
    let t = report.total();
    row(&"all", &t);
    let per_token = t.misses as f64 / report.tokens.max(1) as f64;
    let _ = write!(out, "expert reads per token: {per_token:.2}");
    if let Some(b) = o.expert_bytes {
        let mib = report.bytes_per_token(b) / (1 << 20) as f64;
        let _ = write!(out, " = {mib:.2} MiB per token");
    }
    let _ = writeln!(out);
    Ok(())
}
