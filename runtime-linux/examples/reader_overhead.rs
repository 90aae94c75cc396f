//! The cost of handing one batch's expert reads to reader threads, with no read: the
//! persistent [`ReaderPool`] (threads made once, woken per batch, the compute thread
//! asleep until each expert is in) against what the pager did before, a thread per
//! reader spawned for each batch (nested scoped threads) with the compute thread
//! yielding in a loop until each expert is in. Alternating rounds in one process;
//! prints the median per batch.
//!
//! `cargo run --release -p pinch-linux --example reader_overhead [READERS] [EXPERTS]`
use pinch_linux::readers::ReaderPool;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Instant;

fn spread(n: usize, read: &(dyn Fn(usize) + Sync)) {
    if n <= 1 {
        read(0);
        return;
    }
    std::thread::scope(|s| {
        let h = s.spawn(|| spread(n - 1, read));
        read(n - 1);
        h.join().unwrap();
    });
}

fn main() {
    let mut args = std::env::args().skip(1);
    let readers: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(4);
    let experts: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(4);
    let pool = ReaderPool::new(readers).unwrap();
    let rounds = 2000;
    let (mut old, mut new) = (Vec::new(), Vec::new());
    for round in 0..2 * rounds {
        let states: Vec<AtomicU32> = (0..experts).map(|_| AtomicU32::new(0)).collect();
        let taken = AtomicUsize::new(0);
        let pooled = round % 2 == 0;
        // Each reader takes the next expert's job, "reads" it, publishes it.
        let read = |_: usize| loop {
            let i = taken.fetch_add(1, Ordering::Relaxed);
            let Some(s) = states.get(i) else { break };
            s.store(1, Ordering::Release);
            if pooled {
                pool.wake_all();
            }
        };
        let t0 = Instant::now();
        if pooled {
            pool.run(readers, &read, &mut || {
                for s in &states {
                    pool.wait_while(s, 0);
                }
            });
            new.push(t0.elapsed().as_nanos() as u64);
        } else {
            std::thread::scope(|s| {
                let h = s.spawn(|| spread(readers, &read));
                for st in &states {
                    while st.load(Ordering::Acquire) == 0 {
                        std::thread::yield_now();
                    }
                }
                h.join().unwrap();
            });
            old.push(t0.elapsed().as_nanos() as u64);
        }
    }
    old.sort_unstable();
    new.sort_unstable();
    println!(
        "{readers} readers, {experts} experts per batch, {rounds} batches each: median per batch: threads per batch {:.1} us, persistent pool {:.1} us",
        old[rounds / 2] as f64 / 1e3,
        new[rounds / 2] as f64 / 1e3
    );
}
