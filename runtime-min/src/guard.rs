//! The memory guard: stop a generation before the OS has to kill us.
//!
//! While a generation runs, the guard compares the memory the OS could still give
//! (`Platform::available_memory`, Linux: `MemAvailable`) with a floor (`--guard`,
//! default [`DEFAULT_FLOOR`], `--guard 0` turns it off). It is checked once per
//! generated token (and once before the prompt), from the generating thread: no
//! thread, no process spawning, one read of `/proc/meminfo` per token on Linux.
//!
//! The first time available memory is under the floor the guard answers
//! [`GuardAction::GiveBack`]: the engine gives back what it can spare
//! (`Platform::release_cache` and its own caches) and looks again. If it is still under
//! the floor, [`GuardAction::Stop`]: the generation ends with a clear message (the
//! server stays up for the next request). Once memory is back above the floor, a later
//! dip gets a give-back again.
use crate::platform::Platform;

/// `--guard` when not given: 180 MiB.
pub const DEFAULT_FLOOR: u64 = 180 << 20;

/// What the caller does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardAction {
    /// Enough memory (or the guard is off, or the platform cannot tell).
    Continue,
    /// Under the floor for the first time: give back spare cache, then check again.
    GiveBack { available: u64 },
    /// Still under the floor after giving back: stop the generation.
    Stop(GuardStop),
}

/// Why the guard stopped a generation (its `Display` is the user's message).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardStop {
    pub available: u64,
    pub floor: u64,
}

impl core::fmt::Display for GuardStop {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "stopped: available memory {} MiB is below the --guard floor {} MiB",
            self.available >> 20,
            self.floor >> 20
        )
    }
}

/// The guard's state: the floor and whether cache was already given back in this dip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryGuard {
    floor: u64,
    gave_back: bool,
    /// Times the guard asked to give back / stopped (for reports and metrics).
    pub give_backs: u32,
    pub stops: u32,
}

impl MemoryGuard {
    /// A guard with `floor` bytes (0: off).
    pub const fn new(floor: u64) -> MemoryGuard {
        MemoryGuard {
            floor,
            gave_back: false,
            give_backs: 0,
            stops: 0,
        }
    }

    /// The guard for the `--guard` option (`None`: [`DEFAULT_FLOOR`]).
    pub const fn from_opt(guard: Option<u64>) -> MemoryGuard {
        match guard {
            Some(f) => MemoryGuard::new(f),
            None => MemoryGuard::new(DEFAULT_FLOOR),
        }
    }

    /// The floor in bytes (0: off).
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Judge one reading of available memory (`None`: unknown, which never stops).
    pub fn check(&mut self, available: Option<u64>) -> GuardAction {
        let Some(a) = available else {
            return GuardAction::Continue;
        };
        if self.floor == 0 || a >= self.floor {
            self.gave_back = false;
            return GuardAction::Continue;
        }
        if !self.gave_back {
            self.gave_back = true;
            self.give_backs += 1;
            return GuardAction::GiveBack { available: a };
        }
        self.stops += 1;
        GuardAction::Stop(GuardStop {
            available: a,
            floor: self.floor,
        })
    }

    /// One check against the platform: read available memory; under the floor, call
    /// `give_back` (which returns the bytes it freed, if known) and
    /// `Platform::release_cache`, say so on stderr, and read again. `Err` when the
    /// generation must stop. Costs nothing when the guard is off.
    pub fn watch<P: Platform>(
        &mut self,
        p: &P,
        give_back: &mut dyn FnMut() -> u64,
    ) -> Result<(), GuardStop> {
        if self.floor == 0 {
            return Ok(());
        }
        // Two rounds at most: a first dip gives back and looks again.
        for _ in 0..2 {
            match self.check(p.available_memory()) {
                GuardAction::Continue => return Ok(()),
                GuardAction::Stop(s) => return Err(s),
                GuardAction::GiveBack { available } => {
                    let freed = give_back().saturating_add(p.release_cache());
                    let mut m = heapless::String::<192>::new();
                    let _ = core::fmt::Write::write_fmt(
                        &mut m,
                        format_args!(
                            "pinch: available memory {} MiB is below the --guard floor {} MiB: ",
                            available >> 20,
                            self.floor >> 20,
                        ),
                    );
                    let _ = if freed > 0 {
                        core::fmt::Write::write_fmt(
                            &mut m,
                            format_args!(
                                "gave back {:.1} MiB of cache\n",
                                freed as f64 / (1u64 << 20) as f64
                            ),
                        )
                    } else {
                        core::fmt::Write::write_str(&mut m, "no cache to give back\n")
                    };
                    p.stderr(m.as_bytes());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    /// Feed `readings` to a guard of `floor`; the actions, in order.
    fn run(floor: u64, readings: &[Option<u64>]) -> heapless::Vec<GuardAction, 16> {
        let mut g = MemoryGuard::new(floor);
        readings.iter().map(|&r| g.check(r)).collect()
    }

    #[test]
    fn plenty_of_memory_continues() {
        let a = run(180 * M, &[Some(2000 * M), Some(181 * M), Some(180 * M)]);
        assert!(a.iter().all(|x| *x == GuardAction::Continue), "{a:?}");
    }

    #[test]
    fn first_dip_gives_back_then_stops_if_still_low() {
        let a = run(180 * M, &[Some(500 * M), Some(100 * M), Some(90 * M)]);
        assert_eq!(a[0], GuardAction::Continue);
        assert_eq!(a[1], GuardAction::GiveBack { available: 100 * M });
        assert_eq!(
            a[2],
            GuardAction::Stop(GuardStop {
                available: 90 * M,
                floor: 180 * M
            })
        );
    }

    #[test]
    fn recovery_after_giving_back_continues_and_rearms() {
        let a = run(
            180 * M,
            &[Some(100 * M), Some(300 * M), Some(100 * M), Some(100 * M)],
        );
        assert!(matches!(a[0], GuardAction::GiveBack { .. }));
        assert_eq!(a[1], GuardAction::Continue);
        // A new dip: give back once more before stopping.
        assert!(matches!(a[2], GuardAction::GiveBack { .. }));
        assert!(matches!(a[3], GuardAction::Stop(_)));
    }

    #[test]
    fn off_or_unknown_never_stops() {
        let a = run(0, &[Some(0), Some(0), Some(0)]);
        assert!(a.iter().all(|x| *x == GuardAction::Continue));
        let a = run(180 * M, &[None, None, None]);
        assert!(a.iter().all(|x| *x == GuardAction::Continue));
    }

    #[test]
    fn default_floor_and_message() {
        assert_eq!(MemoryGuard::from_opt(None).floor(), 180 * M);
        assert_eq!(MemoryGuard::from_opt(Some(0)).floor(), 0);
        let s = GuardStop {
            available: 95 * M + 5,
            floor: 180 * M,
        };
        let mut t = heapless::String::<128>::new();
        core::fmt::Write::write_fmt(&mut t, format_args!("{s}")).unwrap();
        assert_eq!(
            t.as_str(),
            "stopped: available memory 95 MiB is below the --guard floor 180 MiB"
        );
    }

    use crate::platform::{MemPlatform, PlatformError};
    use core::cell::Cell;
    use pinch_kernels::CpuFeatures;

    /// A platform whose available memory follows a script, one reading per call, and
    /// whose `release_cache` frees a given amount.
    struct Script<'s> {
        readings: &'s [Option<u64>],
        next: spin::Mutex<usize>,
        released: spin::Mutex<u32>,
        inner: MemPlatform<'static>,
    }

    impl Platform for Script<'_> {
        type File = ();
        fn open(&self, p: &str) -> Result<(), PlatformError> {
            self.inner.open(p)
        }
        fn file_size(&self, f: &()) -> u64 {
            self.inner.file_size(f)
        }
        fn read_at(&self, f: &(), o: u64, b: &mut [u8], d: bool) -> Result<usize, PlatformError> {
            self.inner.read_at(f, o, b, d)
        }
        fn map<'f>(&self, _: &'f (), _: u64, _: usize) -> Option<&'f [u8]> {
            None
        }
        fn region(&self, n: usize) -> Result<&'static mut [u8], PlatformError> {
            self.inner.region(n)
        }
        fn available_memory(&self) -> Option<u64> {
            let mut i = self.next.lock();
            let r = self.readings.get(*i).copied().flatten();
            *i += 1;
            r
        }
        fn release_cache(&self) -> u64 {
            *self.released.lock() += 1;
            3 * M
        }
        fn rss(&self) -> Option<u64> {
            None
        }
        fn peak_rss(&self) -> Option<u64> {
            None
        }
        fn workers(&self) -> usize {
            1
        }
        fn parallel(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
            (0..n).for_each(f)
        }
        fn cpu(&self) -> CpuFeatures {
            CpuFeatures::SCALAR
        }
        fn now_ns(&self) -> u64 {
            0
        }
        fn stdout(&self, _: &[u8]) {}
        fn stderr(&self, _: &[u8]) {}
    }

    fn script(readings: &[Option<u64>]) -> Script<'_> {
        Script {
            readings,
            next: spin::Mutex::new(0),
            released: spin::Mutex::new(0),
            inner: MemPlatform {
                bytes: &[],
                cpu: CpuFeatures::SCALAR,
            },
        }
    }

    #[test]
    fn watch_gives_back_and_looks_again_before_stopping() {
        let r = [Some(500 * M), Some(100 * M), Some(200 * M), Some(50 * M)];
        let p = script(&r);
        let mut g = MemoryGuard::new(180 * M);
        let engine_calls = Cell::new(0);
        let mut gb = || {
            engine_calls.set(engine_calls.get() + 1);
            0
        };
        // Reading 1: fine.
        assert_eq!(g.watch(&p, &mut gb), Ok(()));
        // Reading 2 under the floor: give back, reading 3 is above again: go on.
        assert_eq!(g.watch(&p, &mut gb), Ok(()));
        assert_eq!(engine_calls.get(), 1);
        assert_eq!(*p.released.lock(), 1);
        // Reading 4 under the floor: a new dip gives back again; reading 5 is unknown
        // (the script ran out), which never stops.
        assert_eq!(g.watch(&p, &mut gb), Ok(()));
        assert_eq!(engine_calls.get(), 2);

        let r = [Some(100 * M), Some(90 * M)];
        let p = script(&r);
        let mut g = MemoryGuard::new(180 * M);
        assert_eq!(
            g.watch(&p, &mut || 0),
            Err(GuardStop {
                available: 90 * M,
                floor: 180 * M
            })
        );
        assert_eq!((g.give_backs, g.stops), (1, 1));
        // Off: the platform is not even asked.
        let mut off = MemoryGuard::new(0);
        assert_eq!(off.watch(&p, &mut || 0), Ok(()));
        assert_eq!(*p.next.lock(), 2);
    }
}
