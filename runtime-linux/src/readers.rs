//! The expert reader pool behind `Platform::with_readers`: threads made once per run
//! (`--moe-readers N`, on the pager's first batch with a miss) that take a batch's
//! expert reads from the pager's queue while the compute thread works, and park between
//! batches.
//!
//! # Protocol
//! Everything goes through one mutex, `state`: a call publishes its job (the reads'
//! closure, lifetime erased) with a new `epoch` and `running` = every thread, and wakes
//! the threads (`start`); each thread runs its index and decrements `running`, and the
//! last one wakes the caller (`done`), which clears the job before returning, so no
//! thread uses the closure after the call. Readers and the compute thread meet on
//! `progress`: a reader changes a word (an expert's read state) and calls
//! [`ReaderPool::wake_all`], which takes the lock before notifying, and
//! [`ReaderPool::wait_while`] checks the word under the lock, so a wake-up is never
//! lost; it also returns once `running` is 0 (a reader that stopped without
//! publishing, e.g. a panic, cannot leave the compute thread asleep). No thread spins.
//!
//! # Panics
//! A panic in a read is caught on its thread; the call still waits for every thread
//! and for `work`, then resumes the panic on the caller.
use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// A job as stored in the state: its lifetime is erased (see [`ReaderPool::run`]).
type Task = dyn Fn(usize) + Sync + 'static;

struct State {
    epoch: u64,
    job: Option<&'static Task>,
    /// Indices of the job (`0..n`); thread `t` runs `t, t + threads, ...`.
    n: usize,
    /// Threads still on the current job.
    running: usize,
    shutdown: bool,
    panic: Option<Box<dyn Any + Send>>,
}

struct Shared {
    state: Mutex<State>,
    start: Condvar,
    done: Condvar,
    progress: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a panic between two consistent states (the
        // panics of jobs are caught outside the lock).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

thread_local! {
    /// Set on reader threads: a `run` from one runs inline instead of deadlocking.
    static ON_READER: Cell<bool> = const { Cell::new(false) };
}

/// A fixed set of reader threads.
pub struct ReaderPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Serialises `run` calls from different threads: there is one job.
    call_lock: Mutex<()>,
}

impl ReaderPool {
    /// A pool of `threads` (at least 1) reader threads.
    ///
    /// # Errors
    /// The OS error if a thread cannot be spawned (those spawned so far are stopped).
    pub fn new(threads: usize) -> std::io::Result<ReaderPool> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                epoch: 0,
                job: None,
                n: 0,
                running: 0,
                shutdown: false,
                panic: None,
            }),
            start: Condvar::new(),
            done: Condvar::new(),
            progress: Condvar::new(),
        });
        let mut pool = ReaderPool {
            shared,
            threads: Vec::with_capacity(threads.max(1)),
            call_lock: Mutex::new(()),
        };
        let total = threads.max(1);
        for t in 0..total {
            let shared = Arc::clone(&pool.shared);
            let h = std::thread::Builder::new()
                .name(format!("pinch-reader-{t}"))
                .spawn(move || reader_loop(&shared, t, total))?;
            pool.threads.push(h);
        }
        Ok(pool)
    }

    /// Reader threads.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Run `read(i)` for every `i` in `0..n` on the reader threads while this thread
    /// runs `work`; return when all have finished.
    pub fn run(&self, n: usize, read: &(dyn Fn(usize) + Sync), work: &mut dyn FnMut()) {
        if n == 0 || ON_READER.with(Cell::get) {
            (0..n).for_each(read);
            work();
            return;
        }
        let _serial = self.call_lock.lock().unwrap_or_else(|e| e.into_inner());
        let sh = &*self.shared;
        // SAFETY: lifetime erasure only. The 'static reference is used by the reader
        // threads until they decrement `running`; this function does not return (nor
        // unwind: `work`'s panic is caught below) before `running` is 0, and it clears
        // the job first, so no use outlives the caller's borrow of `read`.
        let job: &'static Task =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Task>(read) };
        {
            let mut st = sh.lock();
            st.job = Some(job);
            st.n = n;
            st.running = self.threads.len();
            st.epoch += 1;
            sh.start.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(work));
        let theirs = {
            let mut st = sh.lock();
            while st.running > 0 {
                st = sh.done.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.job = None;
            st.panic.take()
        };
        if let Some(p) = mine.err().or(theirs) {
            resume_unwind(p);
        }
    }

    /// Block while `word` holds `value`, until [`Self::wake_all`] after a change, or
    /// until no reader is on a job any more.
    pub fn wait_while(&self, word: &AtomicU32, value: u32) {
        let sh = &*self.shared;
        let mut st = sh.lock();
        while word.load(Ordering::Acquire) == value && st.running > 0 {
            st = sh.progress.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Wake the threads in [`Self::wait_while`].
    pub fn wake_all(&self) {
        let sh = &*self.shared;
        let _st = sh.lock();
        sh.progress.notify_all();
    }
}

fn reader_loop(sh: &Shared, t: usize, threads: usize) {
    ON_READER.with(|c| c.set(true));
    let mut seen = 0u64;
    loop {
        let (job, n) = {
            let mut st = sh.lock();
            while st.epoch == seen && !st.shutdown {
                st = sh.start.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.shutdown {
                return;
            }
            seen = st.epoch;
            (st.job, st.n)
        };
        let r = catch_unwind(AssertUnwindSafe(|| {
            if let Some(f) = job {
                let mut i = t;
                while i < n {
                    f(i);
                    i += threads;
                }
            }
        }));
        let mut st = sh.lock();
        if let Err(p) = r {
            st.panic.get_or_insert(p);
        }
        st.running -= 1;
        if st.running == 0 {
            sh.done.notify_all();
            sh.progress.notify_all();
        }
    }
}

impl Drop for ReaderPool {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.shutdown = true;
            self.shared.start.notify_all();
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

/// The reader pool as a platform holds it: made on the first
/// [`LazyReaders::with_readers`] call, of that call's thread count, and kept for the
/// run. Linux and iOS both delegate `Platform::with_readers`, `wait_while` and
/// `wake_all` here, so the expert pager overlaps its reads the same way on both.
#[derive(Default)]
pub struct LazyReaders {
    /// `None` once it could not be started: reads then run on the compute thread.
    pool: std::sync::OnceLock<Option<ReaderPool>>,
}

impl LazyReaders {
    /// Run `read(r)` for `r` in `0..n` on the reader threads while this thread runs
    /// `work` (see [`ReaderPool::run`]); without a pool, the reads first, then `work`.
    pub fn with_readers(&self, n: usize, read: &(dyn Fn(usize) + Sync), work: &mut dyn FnMut()) {
        let pool = self.pool.get_or_init(|| match ReaderPool::new(n.max(1)) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("pinch: cannot start {n} expert reader threads ({e}); reading on the compute thread");
                None
            }
        });
        match pool {
            Some(p) => p.run(n, read, work),
            None => {
                (0..n).for_each(read);
                work();
            }
        }
    }

    /// Block while `word` holds `value` (see [`ReaderPool::wait_while`]); before the
    /// pool exists nobody can change the word but this thread's own reads, so yield.
    pub fn wait_while(&self, word: &AtomicU32, value: u32) {
        match self.pool.get() {
            Some(Some(p)) => p.wait_while(word, value),
            _ => {
                while word.load(Ordering::Acquire) == value {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Wake the threads in [`LazyReaders::wait_while`].
    pub fn wake_all(&self) {
        if let Some(Some(p)) = self.pool.get() {
            p.wake_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::AtomicUsize;
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::{Duration, Instant};

    #[test]
    fn every_index_runs_once_on_the_same_threads_call_after_call() {
        let pool = ReaderPool::new(3).unwrap();
        let names = Mutex::new(HashSet::new());
        for n in [1, 3, 5, 8] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(
                n,
                &|i| {
                    hits[i].fetch_add(1, SeqCst);
                    let me = std::thread::current().name().unwrap_or("").to_string();
                    names.lock().unwrap().insert(me);
                },
                &mut || {},
            );
            let counts: Vec<usize> = hits.iter().map(|h| h.load(SeqCst)).collect();
            assert_eq!(counts, vec![1; n], "n = {n}");
        }
        // Made once: the reads ran only on the pool's three threads.
        let names = names.into_inner().unwrap();
        assert!(names.len() <= 3, "{names:?}");
        assert!(
            names.iter().all(|n| n.starts_with("pinch-reader-")),
            "{names:?}"
        );
    }

    /// The compute thread sleeps in `wait_while` until a reader publishes; the reads
    /// run while it works, and a wake-up that comes before it waits is not lost.
    #[test]
    fn work_waits_for_each_word_a_reader_publishes() {
        let pool = ReaderPool::new(2).unwrap();
        for round in 0..200 {
            let words: Vec<AtomicU32> = (0..4).map(|_| AtomicU32::new(0)).collect();
            let mut seen = Vec::new();
            pool.run(
                4,
                &|i| {
                    if round % 2 == 0 {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    words[i].store(1, Ordering::Release);
                    pool.wake_all();
                },
                &mut || {
                    for w in &words {
                        pool.wait_while(w, 0);
                        seen.push(w.load(Ordering::Acquire));
                    }
                },
            );
            assert_eq!(seen, [1, 1, 1, 1], "round {round}");
        }
    }

    /// A read that stops without publishing (a panic) cannot leave the compute thread
    /// asleep: `wait_while` returns once the readers are done; the panic reaches the
    /// caller and the pool runs the next job.
    #[test]
    fn a_reader_panic_wakes_the_waiter_and_reaches_the_caller() {
        let pool = ReaderPool::new(2).unwrap();
        let word = AtomicU32::new(0);
        let t0 = Instant::now();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(
                2,
                &|i| {
                    if i == 1 {
                        panic!("boom");
                    }
                },
                &mut || pool.wait_while(&word, 0),
            )
        }));
        assert!(r.is_err());
        assert!(t0.elapsed() < Duration::from_secs(5));
        let count = AtomicUsize::new(0);
        pool.run(
            2,
            &|_| {
                count.fetch_add(1, SeqCst);
            },
            &mut || {},
        );
        assert_eq!(count.load(SeqCst), 2);
    }

    /// Dropping the pool stops and joins its threads, parked or not.
    #[test]
    fn drop_joins_every_thread() {
        for _ in 0..20 {
            let pool = ReaderPool::new(4).unwrap();
            pool.run(4, &|_| {}, &mut || {});
            drop(pool);
        }
        let pool = ReaderPool::new(2).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        drop(pool);
    }

    #[test]
    fn a_run_from_a_reader_thread_runs_inline() {
        let pool = ReaderPool::new(2).unwrap();
        let count = AtomicUsize::new(0);
        pool.run(
            2,
            &|_| {
                pool.run(
                    3,
                    &|_| {
                        count.fetch_add(1, SeqCst);
                    },
                    &mut || {},
                );
            },
            &mut || {},
        );
        assert_eq!(count.load(SeqCst), 6);
    }
}
