//! `cargo xtask bench --busy-core [--arch qwen35|moe] [--vs-llama-cpp]`: generation while
//! another process takes a core (issue 19's guided scheduling). A thread of this command
//! spins for the whole of every loaded run; tg64 at `-t 1` and `-t 2` runs idle and loaded
//! alternately, `REPS` times each, and the table gives the medians and the loss beside
//! the target (at most 25 % at `-t 2`). With `--vs-llama-cpp` llama.cpp runs the same
//! pairs, for its own loss.
use crate::bench::{llama_bench, median, pinch_bench};
use crate::util::Result;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const REPS: usize = 5;
const TG: usize = 64;

/// Runs `f` while a thread of this process spins (the "other process" holding a core:
/// it is not one of pinch's threads, which is what matters to pinch's pool).
fn with_busy_core<T>(f: impl FnOnce() -> T) -> T {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let spinner = std::thread::spawn(move || {
        let mut x = 0u64;
        while !flag.load(Ordering::Relaxed) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        x
    });
    // Let the spinner get its core before the run starts.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let out = f();
    stop.store(true, Ordering::Relaxed);
    let _ = spinner.join();
    out
}

pub fn table(pinch: &Path, model: &Path, title: &str, llama: Option<&Path>) -> Result<()> {
    println!(
        "\n## Generation with a busy core: {title}, tg{TG}, idle and with a spinning thread, medians of {REPS} alternating runs\n"
    );
    println!("| engine | threads | idle t/s | busy core t/s | loss | target | met |");
    println!("| --- | ---: | ---: | ---: | ---: | --- | --- |");
    for t in [1usize, 2] {
        let (mut idle, mut busy) = (Vec::new(), Vec::new());
        let (mut l_idle, mut l_busy) = (Vec::new(), Vec::new());
        for _ in 0..REPS {
            idle.push(pinch_bench(pinch, model, t, 0, TG, 0)?);
            busy.push(with_busy_core(|| pinch_bench(pinch, model, t, 0, TG, 0))?);
            if let Some(site) = llama {
                l_idle.push(llama_bench(site, model, t, 0, TG)?.0);
                l_busy.push(with_busy_core(|| llama_bench(site, model, t, 0, TG))?.0);
            }
        }
        let row = |engine: &str, idle: &mut [f64], busy: &mut [f64], target: bool| {
            let (i, b) = (median(idle), median(busy));
            let loss = 1.0 - b / i;
            let (target, met) = match (target && t == 2, loss <= 0.25) {
                (true, true) => ("<= 25 % at -t 2", "met"),
                (true, false) => ("<= 25 % at -t 2", "not met"),
                _ => ("", ""),
            };
            println!(
                "| {engine} | {t} | {i:.1} | {b:.1} | {:.1} % | {target} | {met} |",
                100.0 * loss
            );
        };
        row("pinch", &mut idle, &mut busy, true);
        if llama.is_some() {
            row("llama.cpp", &mut l_idle, &mut l_busy, false);
        }
    }
    Ok(())
}
