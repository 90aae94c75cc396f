//! A persistent worker pool for `Platform::parallel`.
//!
//! The engine calls `parallel` hundreds of times per token (one per matvec), so threads are
//! created once and wait between jobs: they spin briefly (the next job usually follows
//! within microseconds) and then park on a condvar so an idle model costs no CPU. The
//! calling thread runs worker index 0 itself; there is no per-call thread creation and no
//! per-call allocation.
//!
//! # Protocol
//! The caller writes the job into `slot`, then bumps `epoch`; a worker that sees a new
//! epoch claims its indices (`claims[k]`: from the previous epoch to this one), reads the
//! slot, runs them and decrements `pending`; the caller returns once `pending` is zero.
//! Once its own indices are done the caller claims every worker's that is still
//! unclaimed and runs them itself (decrementing `pending` for each): a worker that has not
//! started yet (descheduled: another process holds its core) then costs nothing instead
//! of holding up every call until the scheduler runs it. A worker whose claim fails skips
//! the job without touching the slot. Each worker's indices are claimed exactly once per
//! job, by whichever side gets there first, so every index still runs exactly once.
//! Each side publishes "I am about to sleep" in a counter *before* re-checking the
//! condition it sleeps on, and the other side checks that counter *after* changing the
//! condition (all `SeqCst`), so a wake-up is never lost.
//!
//! # Panics
//! A panic inside `f` on any thread is caught, the call still waits for every worker (the
//! borrowed closure must outlive all uses) and then the panic is resumed on the caller.
use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// How many times a waiting thread polls before it parks. Matvecs of a small model take
/// tens of microseconds, so the gap between two jobs is usually shorter than this wait.
const SPIN: u32 = 4_000;
/// Polls that busy-wait before the rest yield the core: if there are more runnable
/// threads than cores (other processes, or more workers than cores), the thread we wait
/// for may need ours to make progress.
const BUSY: u32 = 100;

fn pause(i: u32) {
    if i < BUSY {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// A job as stored in the slot: its lifetime is erased (see `Pool::run`).
type Task = dyn Fn(usize) + Sync + 'static;

/// The job currently published to the workers.
#[derive(Clone, Copy)]
struct Job {
    f: Option<&'static Task>,
    n: usize,
}

struct Shared {
    /// Written only by the caller holding `call_lock` while no worker is using it (between
    /// `pending` reaching zero and the next `epoch` bump); read by workers only after they
    /// observe the bump. See the SAFETY notes at both ends.
    slot: UnsafeCell<Job>,
    epoch: AtomicUsize,
    /// Per worker (index 0, the caller's, unused): the last epoch whose indices of that
    /// worker were claimed, by the worker or by the caller.
    claims: Vec<AtomicUsize>,
    pending: AtomicUsize,
    shutdown: AtomicBool,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    wake_lock: Mutex<()>,
    wake: Condvar,
    /// The caller is parked (or about to park) on `done`.
    caller_sleeping: AtomicBool,
    done_lock: Mutex<()>,
    done: Condvar,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: every field but `slot` is Sync. `slot` is accessed under the protocol in the
// module docs: one writer (the caller, serialised by `Pool::call_lock`) that writes only
// while no reader is active, readers that read only after an acquire of the new epoch.
unsafe impl Sync for Shared {}

thread_local! {
    /// Set while this thread runs a pool job, so a nested `parallel` runs inline instead
    /// of deadlocking on `call_lock`.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

/// A fixed set of worker threads; index 0 is always the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Serialises `run` calls from different threads: there is one job slot.
    call_lock: Mutex<()>,
    workers: usize,
}

impl Pool {
    /// A pool of `workers` (at least 1) indices; spawns `workers - 1` threads.
    ///
    /// # Errors
    /// The OS error if a thread cannot be spawned (threads spawned so far are stopped).
    pub fn new(workers: usize) -> std::io::Result<Pool> {
        let workers = workers.max(1);
        let shared = Arc::new(Shared {
            slot: UnsafeCell::new(Job { f: None, n: 0 }),
            epoch: AtomicUsize::new(0),
            claims: (0..workers).map(|_| AtomicUsize::new(0)).collect(),
            pending: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            wake_lock: Mutex::new(()),
            wake: Condvar::new(),
            caller_sleeping: AtomicBool::new(false),
            done_lock: Mutex::new(()),
            done: Condvar::new(),
            panic: Mutex::new(None),
        });
        let mut pool = Pool {
            shared,
            threads: Vec::with_capacity(workers - 1),
            call_lock: Mutex::new(()),
            workers,
        };
        for index in 1..workers {
            let shared = Arc::clone(&pool.shared);
            let handle = std::thread::Builder::new()
                .name(format!("pinch-worker-{index}"))
                .spawn(move || worker_loop(&shared, index, workers))?;
            pool.threads.push(handle);
        }
        Ok(pool)
    }

    /// Number of worker indices, the caller included.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Run `f(i)` for every `i` in `0..n` and return when all calls have finished.
    /// Worker `k` runs indices `k, k + workers, ...`, so `n > workers()` is allowed.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        if n == 1 || self.workers == 1 || IN_JOB.with(Cell::get) {
            for i in 0..n {
                f(i);
            }
            return;
        }
        // A poisoned lock only means an earlier caller panicked after the job finished;
        // the pool's state is consistent again by then, so carry on.
        let _serial = self.call_lock.lock().unwrap_or_else(|e| e.into_inner());
        let sh = &*self.shared;
        // SAFETY: lifetime erasure only. The 'static reference is stored in the slot and
        // used by workers until they decrement `pending`; this function does not return
        // (or unwind) before `pending` is zero, and the slot is cleared below before
        // returning, so no use outlives the caller's borrow of `f`.
        let f_static: &'static Task =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Task>(f) };
        // Every helper acknowledges every job, even one with no index for it: a helper
        // that has seen the epoch may be reading the slot, so the caller must not rewrite
        // the slot before all of them are done.
        sh.pending.store(self.workers - 1, SeqCst);
        // SAFETY: we hold `call_lock` and the previous job's `pending` reached zero before
        // its `run` returned, so no worker is reading the slot now; workers read it only
        // after seeing the epoch bump that follows this write.
        unsafe {
            *sh.slot.get() = Job {
                f: Some(f_static),
                n,
            }
        };
        let epoch = sh.epoch.fetch_add(1, SeqCst).wrapping_add(1);
        if sh.sleepers.load(SeqCst) > 0 {
            let _g = sh.wake_lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.wake.notify_all();
        }

        let mut mine = run_indices(f, 0, n, self.workers);
        for k in 1..self.workers {
            if claim(sh, k, epoch) {
                let theirs = run_indices(f, k, n, self.workers);
                if mine.is_ok() {
                    mine = theirs;
                }
                sh.pending.fetch_sub(1, SeqCst);
            }
        }
        wait_done(sh);
        // SAFETY: `pending` is zero, so every worker has finished with the slot.
        unsafe { *sh.slot.get() = Job { f: None, n: 0 } };

        let theirs = sh.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(payload) = mine.err().or(theirs) {
            resume_unwind(payload);
        }
    }
}

/// Claim worker `k`'s indices of the job of `epoch` (true: this thread runs them). Each
/// job moves every worker's claim from `epoch - 1` to `epoch` exactly once: the caller
/// claims all that are left before it waits, so every job starts with all claims at its
/// previous epoch.
fn claim(sh: &Shared, k: usize, epoch: usize) -> bool {
    sh.claims[k]
        .compare_exchange(epoch.wrapping_sub(1), epoch, SeqCst, SeqCst)
        .is_ok()
}

/// Run this thread's share of the indices, catching a panic so the pool keeps its
/// protocol (the caller must still wait for the others).
fn run_indices(
    f: &(dyn Fn(usize) + Sync),
    first: usize,
    n: usize,
    step: usize,
) -> Result<(), Box<dyn Any + Send>> {
    IN_JOB.with(|c| c.set(true));
    let result = catch_unwind(AssertUnwindSafe(|| {
        let mut i = first;
        while i < n {
            f(i);
            i += step;
        }
    }));
    IN_JOB.with(|c| c.set(false));
    result
}

fn wait_done(sh: &Shared) {
    for i in 0..SPIN {
        if sh.pending.load(SeqCst) == 0 {
            return;
        }
        pause(i);
    }
    let mut guard = sh.done_lock.lock().unwrap_or_else(|e| e.into_inner());
    sh.caller_sleeping.store(true, SeqCst);
    while sh.pending.load(SeqCst) != 0 {
        guard = sh.done.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
    sh.caller_sleeping.store(false, SeqCst);
}

fn worker_loop(sh: &Shared, index: usize, workers: usize) {
    let mut seen = 0usize;
    loop {
        seen = wait_epoch(sh, seen);
        if sh.shutdown.load(SeqCst) {
            return;
        }
        // The caller runs this worker's indices itself if it got there first (or has
        // moved on to a later job, whose epoch the next wait returns at once).
        if !claim(sh, index, seen) {
            continue;
        }
        // SAFETY: we observed the epoch bump that followed the caller's write of the slot
        // (SeqCst store/load pair) and claimed our indices of that job, and the caller
        // will not write the slot again until `pending` is zero, which needs our
        // decrement below.
        let job = unsafe { *sh.slot.get() };
        if let (Some(f), true) = (job.f, index < job.n) {
            if let Err(payload) = run_indices(f, index, job.n, workers) {
                let mut slot = sh.panic.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(payload);
            }
        }
        if sh.pending.fetch_sub(1, SeqCst) == 1 && sh.caller_sleeping.load(SeqCst) {
            let _g = sh.done_lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.done.notify_all();
        }
    }
}

/// Wait until `epoch` differs from `seen`; spin first, then park. Returns the new epoch.
fn wait_epoch(sh: &Shared, seen: usize) -> usize {
    for i in 0..SPIN {
        let now = sh.epoch.load(SeqCst);
        if now != seen {
            return now;
        }
        pause(i);
    }
    let mut guard = sh.wake_lock.lock().unwrap_or_else(|e| e.into_inner());
    sh.sleepers.fetch_add(1, SeqCst);
    let mut now = sh.epoch.load(SeqCst);
    while now == seen {
        guard = sh.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        now = sh.epoch.load(SeqCst);
    }
    sh.sleepers.fetch_sub(1, SeqCst);
    now
}

impl Drop for Pool {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, SeqCst);
        sh.epoch.fetch_add(1, SeqCst);
        {
            let _g = sh.wake_lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.wake.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_index_runs_exactly_once() {
        let pool = Pool::new(4).unwrap();
        for n in [1, 2, 3, 4, 5, 9, 17] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, SeqCst);
            });
            let counts: Vec<usize> = hits.iter().map(|h| h.load(SeqCst)).collect();
            assert_eq!(counts, vec![1; n], "n = {n}");
        }
    }

    #[test]
    fn parallel_sum_matches_serial_sum() {
        let pool = Pool::new(3).unwrap();
        let data: Vec<u64> = (0..100_000u64).map(|x| x * x % 7919).collect();
        let total = AtomicU64::new(0);
        let n = pool.workers();
        let chunk = data.len().div_ceil(n);
        pool.run(n, &|i| {
            let part: u64 = data.iter().skip(i * chunk).take(chunk).sum();
            total.fetch_add(part, SeqCst);
        });
        assert_eq!(total.load(SeqCst), data.iter().sum::<u64>());
    }

    #[test]
    fn ten_thousand_rapid_calls_all_complete() {
        let pool = Pool::new(4).unwrap();
        let count = AtomicUsize::new(0);
        for _ in 0..10_000 {
            pool.run(4, &|_| {
                count.fetch_add(1, SeqCst);
            });
        }
        assert_eq!(count.load(SeqCst), 40_000);
    }

    #[test]
    fn calls_after_workers_parked_still_complete() {
        let pool = Pool::new(3).unwrap();
        let count = AtomicUsize::new(0);
        for _ in 0..3 {
            // Long enough for every worker to give up spinning and park.
            std::thread::sleep(std::time::Duration::from_millis(30));
            pool.run(3, &|_| {
                count.fetch_add(1, SeqCst);
            });
        }
        assert_eq!(count.load(SeqCst), 9);
    }

    #[test]
    fn a_parked_worker_leaves_its_indices_to_the_caller_and_each_runs_once() {
        // A parked worker needs a wake-up (tens of microseconds) before it can claim its
        // index; the caller, done with its own (empty) index at once, claims it first
        // almost always. Five tries, so a wake-up that wins the race once cannot fail
        // this; each index must still run exactly once, and the worker must skip the
        // job it lost and take the next one.
        let pool = Pool::new(2).unwrap();
        let me = std::thread::current().id();
        let mut on_caller = 0;
        for _ in 0..5 {
            std::thread::sleep(std::time::Duration::from_millis(30));
            let runs = AtomicUsize::new(0);
            let here = AtomicBool::new(false);
            pool.run(2, &|i| {
                if i == 1 {
                    runs.fetch_add(1, SeqCst);
                    here.store(std::thread::current().id() == me, SeqCst);
                }
            });
            assert_eq!(runs.load(SeqCst), 1);
            on_caller += usize::from(here.load(SeqCst));
            let count = AtomicUsize::new(0);
            for _ in 0..100 {
                pool.run(2, &|_| {
                    count.fetch_add(1, SeqCst);
                });
            }
            assert_eq!(count.load(SeqCst), 200);
        }
        assert!(on_caller > 0, "the caller never ran a late worker's index");
    }

    #[test]
    fn a_single_worker_pool_runs_inline() {
        let pool = Pool::new(1).unwrap();
        let me = std::thread::current().id();
        let ran_here = AtomicUsize::new(0);
        pool.run(3, &|_| {
            if std::thread::current().id() == me {
                ran_here.fetch_add(1, SeqCst);
            }
        });
        assert_eq!(ran_here.load(SeqCst), 3);
    }

    #[test]
    fn index_zero_runs_on_the_calling_thread() {
        let pool = Pool::new(2).unwrap();
        let me = std::thread::current().id();
        let zero_here = AtomicBool::new(false);
        pool.run(2, &|i| {
            if i == 0 {
                zero_here.store(std::thread::current().id() == me, SeqCst);
            }
        });
        assert!(zero_here.load(SeqCst));
    }

    #[test]
    fn zero_work_returns_immediately() {
        let pool = Pool::new(2).unwrap();
        pool.run(0, &|_| panic!("must not run"));
    }

    #[test]
    fn nested_calls_run_inline_instead_of_deadlocking() {
        let pool = Pool::new(2).unwrap();
        let count = AtomicUsize::new(0);
        pool.run(2, &|_| {
            pool.run(3, &|_| {
                count.fetch_add(1, SeqCst);
            });
        });
        assert_eq!(count.load(SeqCst), 6);
    }

    #[test]
    fn a_worker_panic_reaches_the_caller_and_the_pool_survives() {
        let pool = Pool::new(2).unwrap();
        let caught = catch_unwind(AssertUnwindSafe(|| {
            pool.run(2, &|i| {
                if i == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(caught.is_err());
        let count = AtomicUsize::new(0);
        pool.run(2, &|_| {
            count.fetch_add(1, SeqCst);
        });
        assert_eq!(count.load(SeqCst), 2);
    }

    #[test]
    fn pools_can_be_created_and_dropped_repeatedly() {
        for _ in 0..20 {
            let pool = Pool::new(3).unwrap();
            pool.run(3, &|_| {});
        }
    }
}
