//! Memory figures for the guard on iOS, from the OS's own calls, iOS 12 and later.
//!
//! - Footprint (`rss`): `task_info(mach_task_self(), TASK_VM_INFO)`'s `phys_footprint`,
//!   the figure jetsam kills by (it counts compressed and dirty pages, not clean file
//!   pages); `resident_size` when the kernel fills only the rev0 layout.
//! - Peak (`peak_rss`): the rev3 `ledger_phys_footprint_peak`, else `resident_size_peak`.
//! - Available (`available_memory`): `os_proc_available_memory()`, the bytes left to this
//!   app's jetsam limit, where the OS has it (iOS 13+; looked up with `dlsym` at run
//!   time, so the library still loads on the iPad Air's iOS 12). Otherwise the host's
//!   free and inactive pages (`host_statistics64(HOST_VM_INFO64)` times
//!   `host_page_size`): what the OS could hand out, an upper estimate, since jetsam's
//!   per-app limit is lower; set `--guard` with that margin on iOS 12.
//!
//! The parsing of the kernel's word arrays is plain code ([`task_vm`], [`host_free`],
//! [`pick_available`]), tested on any host; the calls themselves ([`sys`]) exist only
//! on Apple targets and answer `None` elsewhere.

/// `TASK_VM_INFO` flavor of `task_info`.
pub const TASK_VM_INFO: u32 = 22;
/// 32-bit words of `task_vm_info` we ask for (rev3: through `ledger_phys_footprint_peak`).
pub const TASK_VM_WORDS: usize = 44;
/// `HOST_VM_INFO64` flavor of `host_statistics64`.
pub const HOST_VM_INFO64: i32 = 4;
/// 32-bit words of `vm_statistics64` (`HOST_VM_INFO64_COUNT`).
pub const HOST_VM_WORDS: usize = 38;

// Word offsets in `task_vm_info` (`<mach/task_info.h>`, packed to 4 bytes).
const RESIDENT_SIZE: usize = 4;
const RESIDENT_SIZE_PEAK: usize = 6;
const PHYS_FOOTPRINT: usize = 36;
/// Words through `phys_footprint` (`TASK_VM_INFO_REV1_COUNT`).
const REV1_WORDS: usize = 38;
const LEDGER_PHYS_FOOTPRINT_PEAK: usize = 42;
/// Words through `ledger_phys_footprint_peak`.
const REV3_WORDS: usize = 44;

// Word offsets in `vm_statistics64` (`<mach/vm_statistics.h>`).
const FREE_COUNT: usize = 0;
const INACTIVE_COUNT: usize = 2;

/// This process's memory as `task_info(TASK_VM_INFO)` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskVm {
    /// Bytes jetsam counts against the app (`phys_footprint`; rev0: `resident_size`).
    pub footprint: u64,
    /// The highest footprint so far (rev3), else the resident peak.
    pub peak: u64,
}

fn u64_at(words: &[u32], i: usize) -> u64 {
    // Two native (little-endian on every Apple CPU) 32-bit words.
    u64::from(words[i]) | u64::from(words[i + 1]) << 32
}

/// Parse the first `count` words `task_info` filled; `None` when even the rev0 fields
/// are missing.
pub fn task_vm(words: &[u32], count: usize) -> Option<TaskVm> {
    let count = count.min(words.len());
    if count < RESIDENT_SIZE_PEAK + 2 {
        return None;
    }
    let resident = u64_at(words, RESIDENT_SIZE);
    let footprint = if count >= REV1_WORDS {
        u64_at(words, PHYS_FOOTPRINT)
    } else {
        resident
    };
    let peak = if count >= REV3_WORDS {
        u64_at(words, LEDGER_PHYS_FOOTPRINT_PEAK)
    } else {
        u64_at(words, RESIDENT_SIZE_PEAK)
    };
    Some(TaskVm {
        footprint,
        // A peak is never below the present (the rev0 resident peak can be).
        peak: peak.max(footprint),
    })
}

/// Free plus inactive bytes from the first `count` words of `vm_statistics64`.
pub fn host_free(words: &[u32], count: usize, page_size: u64) -> Option<u64> {
    if count.min(words.len()) <= INACTIVE_COUNT || page_size == 0 {
        return None;
    }
    let pages = u64::from(words[FREE_COUNT]) + u64::from(words[INACTIVE_COUNT]);
    pages.checked_mul(page_size)
}

/// The figure the guard reads: the app's own headroom when the OS tells it (a zero
/// means "no limit known" and is not used), else the host's free memory.
pub fn pick_available(os_proc: Option<u64>, host: Option<u64>) -> Option<u64> {
    match os_proc {
        Some(n) if n > 0 => Some(n),
        _ => host,
    }
}

/// The OS calls (Apple targets only).
#[cfg(target_vendor = "apple")]
pub mod sys {
    use super::{HOST_VM_INFO64, HOST_VM_WORDS, TASK_VM_INFO, TASK_VM_WORDS};
    use std::sync::OnceLock;

    type AvailableFn = unsafe extern "C" fn() -> usize;

    extern "C" {
        static mach_task_self_: u32;
        fn mach_host_self() -> u32;
        fn task_info(task: u32, flavor: u32, info: *mut u32, count: *mut u32) -> i32;
        fn host_statistics64(host: u32, flavor: i32, info: *mut u32, count: *mut u32) -> i32;
        fn host_page_size(host: u32, size: *mut usize) -> i32;
        fn dlsym(
            handle: *mut core::ffi::c_void,
            name: *const core::ffi::c_char,
        ) -> *mut core::ffi::c_void;
    }
    /// `RTLD_DEFAULT` on Darwin.
    const RTLD_DEFAULT: *mut core::ffi::c_void = -2isize as *mut core::ffi::c_void;

    /// `task_info(TASK_VM_INFO)` of this task.
    pub fn task_vm() -> Option<super::TaskVm> {
        let mut words = [0u32; TASK_VM_WORDS];
        let mut count = TASK_VM_WORDS as u32;
        // SAFETY: `words` holds `count` 32-bit words, the most the kernel writes for
        // this flavor and count; `mach_task_self_` is the task's own port, set by
        // libSystem before any Rust code runs.
        let kr = unsafe {
            task_info(
                mach_task_self_,
                TASK_VM_INFO,
                words.as_mut_ptr(),
                &mut count,
            )
        };
        (kr == 0)
            .then(|| super::task_vm(&words, count as usize))
            .flatten()
    }

    /// Free and inactive host memory in bytes.
    pub fn host_free() -> Option<u64> {
        let mut words = [0u32; HOST_VM_WORDS];
        let mut count = HOST_VM_WORDS as u32;
        let mut page = 0usize;
        // SAFETY: `mach_host_self` returns a send right to the host port; `words` holds
        // `count` words (HOST_VM_INFO64_COUNT) and `page` one vm_size_t, all ours.
        let ok = unsafe {
            let host = mach_host_self();
            host_statistics64(host, HOST_VM_INFO64, words.as_mut_ptr(), &mut count) == 0
                && host_page_size(host, &mut page) == 0
        };
        if !ok {
            return None;
        }
        super::host_free(&words, count as usize, page as u64)
    }

    /// `os_proc_available_memory()` where the OS has it (iOS 13+), looked up once.
    pub fn os_proc_available() -> Option<u64> {
        static FN: OnceLock<Option<AvailableFn>> = OnceLock::new();
        let f = FN.get_or_init(|| {
            // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks a
            // symbol up; a non-null result is the address of the libSystem function
            // `size_t os_proc_available_memory(void)`, whose type `AvailableFn` is.
            unsafe {
                let p = dlsym(RTLD_DEFAULT, c"os_proc_available_memory".as_ptr());
                (!p.is_null())
                    .then(|| core::mem::transmute::<*mut core::ffi::c_void, AvailableFn>(p))
            }
        });
        // SAFETY: the function takes nothing and only reads the kernel's ledger.
        f.map(|f| unsafe { f() } as u64)
    }
}

/// The OS calls (Apple targets only).
#[cfg(not(target_vendor = "apple"))]
pub mod sys {
    /// Off Apple systems: unknown.
    pub fn task_vm() -> Option<super::TaskVm> {
        None
    }
    /// Off Apple systems: unknown.
    pub fn host_free() -> Option<u64> {
        None
    }
    /// Off Apple systems: unknown.
    pub fn os_proc_available() -> Option<u64> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `task_vm_info` word array with the given fields set (byte figures).
    fn task_words(
        resident: u64,
        resident_peak: u64,
        footprint: u64,
        ledger_peak: u64,
    ) -> [u32; 44] {
        let mut w = [0u32; 44];
        let mut put = |i: usize, v: u64| {
            w[i] = v as u32;
            w[i + 1] = (v >> 32) as u32;
        };
        put(0, 400 << 30); // virtual_size: huge, never what we report
        put(RESIDENT_SIZE, resident);
        put(RESIDENT_SIZE_PEAK, resident_peak);
        put(PHYS_FOOTPRINT, footprint);
        put(40, 0xffff_ffff_0000); // max_address
        put(LEDGER_PHYS_FOOTPRINT_PEAK, ledger_peak);
        w
    }

    #[test]
    fn footprint_and_its_peak_come_from_rev3_fields() {
        let w = task_words(300 << 20, 310 << 20, (5 << 30) + 123, (6 << 30) + 7);
        assert_eq!(
            task_vm(&w, 44),
            Some(TaskVm {
                footprint: (5 << 30) + 123,
                peak: (6 << 30) + 7
            })
        );
    }

    #[test]
    fn older_kernels_fall_back_field_by_field() {
        let w = task_words(300 << 20, 310 << 20, 200 << 20, 999 << 20);
        // rev1/rev2: footprint, but the peak from resident_size_peak.
        for count in [38, 42] {
            assert_eq!(
                task_vm(&w, count),
                Some(TaskVm {
                    footprint: 200 << 20,
                    peak: 310 << 20
                })
            );
        }
        // rev0: resident figures only.
        assert_eq!(
            task_vm(&w, 36),
            Some(TaskVm {
                footprint: 300 << 20,
                peak: 310 << 20
            })
        );
        // A peak below the present is raised to it.
        let w = task_words(300 << 20, 100 << 20, 200 << 20, 0);
        assert_eq!(task_vm(&w, 38).unwrap().peak, 200 << 20);
        assert_eq!(task_vm(&w, 7), None);
        assert_eq!(task_vm(&w[..5], 44), None);
    }

    #[test]
    fn host_free_counts_free_and_inactive_pages() {
        let mut w = [0u32; HOST_VM_WORDS];
        w[FREE_COUNT] = 10_000;
        w[1] = 99_999; // active: not available
        w[INACTIVE_COUNT] = 2_500;
        w[3] = 77_777; // wired
        assert_eq!(host_free(&w, HOST_VM_WORDS, 16384), Some(12_500 * 16384));
        assert_eq!(host_free(&w, HOST_VM_WORDS, 4096), Some(12_500 * 4096));
        assert_eq!(host_free(&w, 2, 4096), None);
        assert_eq!(host_free(&w, HOST_VM_WORDS, 0), None);
        w[FREE_COUNT] = u32::MAX;
        w[INACTIVE_COUNT] = u32::MAX;
        assert_eq!(
            host_free(&w, HOST_VM_WORDS, 1 << 14),
            Some((2 * u32::MAX as u64) << 14)
        );
    }

    #[test]
    fn the_apps_own_headroom_wins_over_the_hosts() {
        assert_eq!(
            pick_available(Some(300 << 20), Some(900 << 20)),
            Some(300 << 20)
        );
        assert_eq!(pick_available(Some(0), Some(900 << 20)), Some(900 << 20));
        assert_eq!(pick_available(None, Some(900 << 20)), Some(900 << 20));
        assert_eq!(pick_available(None, None), None);
    }

    #[test]
    fn the_calls_answer_none_off_apple_systems() {
        if cfg!(not(target_vendor = "apple")) {
            assert_eq!(sys::task_vm(), None);
            assert_eq!(sys::host_free(), None);
            assert_eq!(sys::os_proc_available(), None);
        }
    }
}
