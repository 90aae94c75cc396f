//! `pinch` for Linux and Android: parse nothing, size the arena, hand over to the engine.
//!
//! The engine (`pinch_runtime_min::commands`) owns the command line; this file only
//! turns OS arguments into `&str`s, creates the worker pool with as many workers as any
//! `-t` value asks for, and lends one memory region sized from `--budget`.
use pinch_linux::platform::LinuxPlatform;
use pinch_runtime_min::cli::Opts;
use pinch_runtime_min::commands;
use pinch_runtime_min::engine::PROCESS_OVERHEAD;
use pinch_runtime_min::platform::Platform;
use pinch_runtime_min::tune::profile::Profile;

fn main() {
    let mut args = Vec::new();
    for (i, a) in std::env::args_os().skip(1).enumerate() {
        match a.into_string() {
            Ok(s) => args.push(s),
            Err(bad) => {
                eprintln!(
                    "pinch: argument {} is not valid UTF-8: {}",
                    i + 1,
                    bad.to_string_lossy()
                );
                std::process::exit(2);
            }
        }
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // A `--tune FILE` profile's threads and budget size the pool and the region too
    // (commands::main reports a bad profile).
    let tuned = Opts::parse(&argv).ok().and_then(|o| {
        let text = std::fs::read(o.tune?).ok()?;
        let prof = Profile::parse(&text).ok()?;
        Opts::parse_with(&argv, &|x| prof.apply(x)).ok()
    });
    let (workers, budget, model) = match tuned.map_or_else(|| Opts::parse(&argv), Ok) {
        Ok(o) => {
            let t = o.bench_t.iter().copied().max().unwrap_or(o.threads);
            (
                if t == 0 { cores } else { t },
                o.budget,
                o.model.map(str::to_string),
            )
        }
        // commands::main reports the error.
        Err(_) => (1, None, None),
    };
    let plat = match LinuxPlatform::with_workers(workers.max(1)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("pinch: cannot start {workers} worker threads: {e}");
            std::process::exit(1);
        }
    };
    // The region is reserved, not touched: pages count toward RSS only when the arena
    // hands them out, so sizing it generously without a budget costs nothing.
    let model_len = model
        .and_then(|m| std::fs::metadata(m).ok())
        .map_or(0, |m| m.len());
    let bytes = match budget {
        Some(b) => b.saturating_sub(PROCESS_OVERHEAD),
        None => model_len + (1 << 30),
    };
    // A 32-bit build cannot lend more than its address space: say so for a budget that
    // asks for more, and let the allocator's own error speak for the unbudgeted default.
    let bytes = match (usize::try_from(bytes), budget) {
        (Ok(b), _) => b,
        (Err(_), None) => usize::MAX,
        (Err(_), Some(b)) => {
            eprintln!(
                "pinch: --budget {b} bytes does not fit this {}-bit build's address space",
                usize::BITS
            );
            std::process::exit(2);
        }
    };
    let region = match plat.region(bytes) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pinch: {e}");
            std::process::exit(1);
        }
    };
    std::process::exit(commands::main(&plat, &argv, region));
}
