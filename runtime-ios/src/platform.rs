//! `IosPlatform`: the engine's `Platform` on iOS (skeleton).
//!
//! Done: files with positioned reads, uncached reads through a second handle marked
//! `F_NOCACHE`, the arena region (calloc: untouched pages cost nothing), the worker pool,
//! CPU features, clock and output, the expert pager's reader threads, and the memory guard's figures ([`crate::memory`]:
//! `available_memory` from `os_proc_available_memory` where iOS has it, else the host's
//! free pages; `rss`/`peak_rss` from `task_info(TASK_VM_INFO)`'s footprint).
//! Not yet: `map`.
use crate::memory;
use pinch_kernels::CpuFeatures;
use pinch_linux::pool::Pool;
use pinch_linux::readers::LazyReaders;
use pinch_runtime_min::platform::{Platform, PlatformError};
use std::fs::File;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::time::Instant;

/// An open file: the normal handle and, on Apple systems, one that bypasses the cache.
pub struct IosFile {
    buffered: File,
    uncached: Option<File>,
    size: u64,
}

/// The iOS platform.
pub struct IosPlatform {
    pool: Pool,
    /// The expert pager's reader threads, made on its first read (shared with Linux).
    readers: LazyReaders,
    base: Instant,
    cpu: CpuFeatures,
}

impl IosPlatform {
    /// A platform with one worker per available CPU.
    ///
    /// # Errors
    /// The OS error if the worker threads cannot be created.
    pub fn new() -> std::io::Result<IosPlatform> {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(IosPlatform {
            pool: Pool::new(n)?,
            readers: LazyReaders::default(),
            base: Instant::now(),
            cpu: detect_cpu(),
        })
    }
}

/// What this CPU can run. The A7 (iPad Air 2013) has NEON but no dotprod or fp16
/// (detected through the standard library, sysctl on Apple; see
/// [`CpuFeatures::detect`]).
pub fn detect_cpu() -> CpuFeatures {
    CpuFeatures::detect()
}

#[cfg(target_vendor = "apple")]
mod nocache {
    use std::fs::File;
    use std::os::unix::io::AsRawFd;

    /// `F_NOCACHE` from `<sys/fcntl.h>` (Darwin).
    const F_NOCACHE: i32 = 48;

    extern "C" {
        fn fcntl(fd: i32, cmd: i32, ...) -> i32;
    }

    /// Turn off the unified buffer cache for reads through `file`.
    pub fn set(file: &File) -> bool {
        // SAFETY: `fcntl(F_NOCACHE, 1)` only changes a flag of a descriptor we own and
        // keep open for the duration of the call; it touches no memory of ours.
        unsafe { fcntl(file.as_raw_fd(), F_NOCACHE, 1i32) != -1 }
    }
}

#[cfg(not(target_vendor = "apple"))]
mod nocache {
    /// No `F_NOCACHE` off Apple systems: reads stay buffered (this build is for checks).
    pub fn set(_file: &std::fs::File) -> bool {
        false
    }
}

fn os_code(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn read_full(file: &File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

impl Platform for IosPlatform {
    type File = IosFile;

    fn open(&self, path: &str) -> Result<IosFile, PlatformError> {
        let buffered = File::open(path).map_err(|e| PlatformError::Open { code: os_code(&e) })?;
        let size = buffered
            .metadata()
            .map_err(|e| PlatformError::Open { code: os_code(&e) })?
            .len();
        // F_NOCACHE has no alignment rules, unlike O_DIRECT: any read works.
        let uncached = File::open(path).ok().filter(nocache::set);
        Ok(IosFile {
            buffered,
            uncached,
            size,
        })
    }

    fn file_size(&self, file: &IosFile) -> u64 {
        file.size
    }

    fn read_at(
        &self,
        file: &IosFile,
        offset: u64,
        buf: &mut [u8],
        direct: bool,
    ) -> Result<usize, PlatformError> {
        let handle = match (&file.uncached, direct) {
            (Some(u), true) => u,
            _ => &file.buffered,
        };
        read_full(handle, offset, buf).map_err(|e| PlatformError::Read {
            offset,
            code: os_code(&e),
        })
    }

    fn map<'f>(&self, _file: &'f IosFile, _offset: u64, _len: usize) -> Option<&'f [u8]> {
        None
    }

    fn region(&self, bytes: usize) -> Result<&'static mut [u8], PlatformError> {
        const PAGE: usize = 16384; // iOS arm64 pages are 16 KB
        let oom = PlatformError::OutOfMemory { requested: bytes };
        let total = bytes.checked_add(PAGE).ok_or(oom)?;
        // Alignment 1 keeps this on calloc, whose fresh pages stay untouched (and so do
        // not count against the jetsam limit) until the arena writes them.
        let layout = std::alloc::Layout::from_size_align(total, 1).map_err(|_| oom)?;
        // SAFETY: the layout's size is non-zero (at least PAGE).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(oom);
        }
        // SAFETY: a fresh zeroed allocation of `total` bytes, referenced nowhere else and
        // never freed, so a 'static exclusive slice over it is sound.
        let all: &'static mut [u8] = unsafe { std::slice::from_raw_parts_mut(ptr, total) };
        let skip = all.as_ptr().align_offset(PAGE);
        Ok(&mut all[skip..skip + bytes])
    }

    fn available_memory(&self) -> Option<u64> {
        memory::pick_available(memory::sys::os_proc_available(), memory::sys::host_free())
    }

    fn rss(&self) -> Option<u64> {
        memory::sys::task_vm().map(|t| t.footprint)
    }

    fn peak_rss(&self) -> Option<u64> {
        memory::sys::task_vm().map(|t| t.peak)
    }

    fn workers(&self) -> usize {
        self.pool.workers()
    }

    fn parallel(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        self.pool.run(n, f);
    }

    fn io_thread(&self) -> bool {
        true
    }

    fn overlap(&self, io: &mut (dyn FnMut() + Send), work: &mut dyn FnMut()) {
        // One scoped reader thread per weight pass (see the Linux platform).
        std::thread::scope(|s| {
            let reader = s.spawn(io);
            work();
            let _ = reader.join();
        });
    }

    fn yield_now(&self) {
        std::thread::yield_now();
    }

    fn reader_pool(&self) -> bool {
        true
    }

    fn with_readers(&self, n: usize, read: &(dyn Fn(usize) + Sync), work: &mut dyn FnMut()) {
        self.readers.with_readers(n, read, work);
    }

    fn wait_while(&self, word: &std::sync::atomic::AtomicU32, value: u32) {
        self.readers.wait_while(word, value);
    }

    fn wake_all(&self) {
        self.readers.wake_all();
    }

    fn cpu(&self) -> CpuFeatures {
        self.cpu
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn stdout(&self, bytes: &[u8]) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(bytes);
        let _ = out.flush();
    }

    fn stderr(&self, bytes: &[u8]) {
        let _ = std::io::stderr().lock().write_all(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_file_both_ways() {
        let exe = std::env::current_exe().unwrap();
        let path = exe.with_file_name(format!("pinch-ios-read-{}", std::process::id()));
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let p = IosPlatform::new().unwrap();
        let f = p.open(path.to_str().unwrap()).unwrap();
        assert_eq!(p.file_size(&f), 70_000);
        for direct in [false, true] {
            let mut buf = vec![0u8; 1000];
            assert_eq!(p.read_at(&f, 69_500, &mut buf, direct).unwrap(), 500);
            assert_eq!(&buf[..500], &data[69_500..]);
            assert_eq!(p.read_at(&f, 13, &mut buf, direct).unwrap(), 1000);
            assert_eq!(&buf[..], &data[13..1013]);
        }
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn region_is_page_aligned_and_zeroed() {
        let p = IosPlatform::new().unwrap();
        let r = p.region(100_000).unwrap();
        assert_eq!(r.len(), 100_000);
        assert_eq!(r.as_ptr() as usize % 16384, 0);
        assert!(r.iter().all(|&b| b == 0));
    }
    /// The expert reads run on reader threads while the caller works: the read waits
    /// for a word that `work` publishes, which it only sees if both run at once (the
    /// trait's default, reads first, times out and the test fails).
    #[test]
    fn expert_reads_overlap_the_callers_work() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let p = IosPlatform::new().unwrap();
        assert!(p.reader_pool());
        let started = AtomicU32::new(0);
        let saw_work = AtomicU32::new(0);
        let caller = std::thread::current().id();
        let off_thread = AtomicU32::new(0);
        p.with_readers(
            2,
            &|r| {
                if std::thread::current().id() != caller {
                    off_thread.fetch_add(1, Ordering::Relaxed);
                }
                if r == 0 {
                    // wait (bounded) for the caller's work to start
                    let t0 = std::time::Instant::now();
                    while started.load(Ordering::Acquire) == 0
                        && t0.elapsed() < std::time::Duration::from_secs(10)
                    {
                        std::thread::yield_now();
                    }
                    saw_work.store(started.load(Ordering::Acquire) + 1, Ordering::Release);
                    p.wake_all();
                }
            },
            &mut || {
                started.store(1, Ordering::Release);
                // bounded, so a platform without reader threads fails instead of hanging
                let t0 = std::time::Instant::now();
                while saw_work.load(Ordering::Acquire) == 0
                    && t0.elapsed() < std::time::Duration::from_secs(10)
                {
                    std::thread::yield_now();
                }
            },
        );
        assert_eq!(
            saw_work.load(Ordering::Acquire),
            2,
            "the read never saw the work start"
        );
        assert_eq!(
            off_thread.load(Ordering::Relaxed),
            2,
            "reads ran on the caller"
        );
    }
}
