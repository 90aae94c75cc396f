//! `LinuxPlatform`: the engine's `Platform` on Linux and Android, with std only.
//!
//! - Files: positioned reads (`pread`) through a buffered handle, and uncached reads
//!   through a second handle opened with `O_DIRECT`, so streamed weights do not fill the
//!   page cache that the budget does not account for. `O_DIRECT` needs the offset, length
//!   and buffer address aligned to the block size; unaligned requests go through an
//!   aligned bounce buffer, and a file system that refuses `O_DIRECT` (tmpfs, some FUSE)
//!   silently gets buffered reads.
//! - Memory: the arena region is zeroed memory from the allocator (calloc: untouched pages
//!   cost no RSS), page aligned. Available memory and RSS come from `/proc`.
//! - Workers: a persistent [`Pool`]; expert reads: a persistent [`ReaderPool`], made
//!   on the expert pager's first read (of `--moe-readers` threads) and kept for the run.
//! - CPU features: detected at run time; `PINCH_CPU=scalar|neon|neon-nodot|avx2|avx512vnni` can only
//!   lower them (to test or compare the slower paths on a fast machine).
//! - `PINCH_READ_DELAY_US=N` (for benchmarks only): every direct read first sleeps N
//!   microseconds, as a flash device's per-request latency would delay it, so the
//!   expert pager's reads can be measured on a machine whose storage is a host's page
//!   cache; reads in flight at once each wait their own delay (a device with a queue).
use crate::pool::Pool;
use crate::readers::LazyReaders;
use pinch_kernels::CpuFeatures;
use pinch_runtime_min::platform::{Platform, PlatformError, Recv, Socket};
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// `O_DIRECT` from the kernel's uapi headers; it differs per architecture.
#[cfg(any(target_arch = "aarch64", target_arch = "arm"))]
const O_DIRECT: Option<i32> = Some(0o200000);
#[cfg(any(target_arch = "x86_64", target_arch = "x86", target_arch = "riscv64"))]
const O_DIRECT: Option<i32> = Some(0o40000);
#[cfg(not(any(
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "riscv64"
)))]
const O_DIRECT: Option<i32> = None;

/// Alignment for direct I/O: the largest logical block size we expect (eMMC, NVMe, ext4).
const DIRECT_ALIGN: usize = 4096;
/// Largest single direct read; bigger requests are split so the bounce buffer stays small.
const BOUNCE_MAX: usize = 1 << 20;
const EINVAL: i32 = 22;

/// An open file: a buffered handle, and an uncached one when the file system allows it.
pub struct LinuxFile {
    buffered: File,
    direct: Option<File>,
    /// Cleared when a direct read fails with EINVAL, so later reads skip straight to the
    /// buffered path.
    direct_ok: AtomicBool,
    size: u64,
    /// Aligned bounce buffer for direct reads (allocated on first use, reused after).
    bounce: Mutex<Vec<u8>>,
}

/// The Linux/Android platform.
pub struct LinuxPlatform {
    pool: Pool,
    base: Instant,
    cpu: CpuFeatures,
    /// `PINCH_READ_DELAY_US`: emulated latency per direct read.
    read_delay: Option<std::time::Duration>,
    /// The expert readers, made on first use (`None`: they could not be started).
    readers: LazyReaders,
}

impl LinuxPlatform {
    /// A platform with one worker per available CPU.
    ///
    /// # Errors
    /// The OS error if the worker threads cannot be created.
    pub fn new() -> std::io::Result<LinuxPlatform> {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        LinuxPlatform::with_workers(n)
    }

    /// A platform with `workers` workers (the calling thread counts as one).
    ///
    /// # Errors
    /// The OS error if the worker threads cannot be created.
    pub fn with_workers(workers: usize) -> std::io::Result<LinuxPlatform> {
        let detected = detect_cpu();
        let cpu = match std::env::var("PINCH_CPU") {
            Ok(v) => cpu_override(detected, &v).unwrap_or_else(|| {
                eprintln!("pinch: ignoring PINCH_CPU={v} (expected scalar, neon, neon-nodot, avx2 or avx512vnni)");
                detected
            }),
            Err(_) => detected,
        };
        let read_delay = std::env::var("PINCH_READ_DELAY_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|&us: &u64| us > 0)
            .map(std::time::Duration::from_micros);
        Ok(LinuxPlatform {
            pool: Pool::new(workers)?,
            base: Instant::now(),
            cpu,
            read_delay,
            readers: LazyReaders::default(),
        })
    }
}

/// What this CPU can run, detected at run time (HWCAP on Linux/Android, cpuid on x86,
/// through the standard library; see [`CpuFeatures::detect`]).
pub fn detect_cpu() -> CpuFeatures {
    CpuFeatures::detect()
}

/// Apply a `PINCH_CPU` value to the detected features. It only ever removes features
/// (`CpuFeatures` cannot gain one), so it cannot enable an instruction the CPU lacks.
/// `None` for an unknown value.
pub fn cpu_override(detected: CpuFeatures, value: &str) -> Option<CpuFeatures> {
    use pinch_kernels::cpu::Feature::*;
    Some(match value.trim() {
        "" | "auto" | "native" => detected,
        "scalar" => CpuFeatures::SCALAR,
        "neon" => detected.only(&[Neon, Dotprod, Fp16, I8mm]),
        "neon-nodot" => detected.only(&[Neon]),
        "avx2" => detected.only(&[Avx2]),
        "avx512vnni" => detected.only(&[Avx2, Avx512Vnni]),
        _ => return None,
    })
}

fn os_code(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// Fill `buf` from `offset` until it is full or the file ends; returns the count.
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

/// The aligned window `[start, start + len)` of a bounce buffer with room for `len` bytes.
fn aligned_window(bounce: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if bounce.len() < len + DIRECT_ALIGN {
        *bounce = vec![0u8; len + DIRECT_ALIGN];
    }
    let skip = bounce.as_ptr().align_offset(DIRECT_ALIGN);
    &mut bounce[skip..skip + len]
}

impl LinuxFile {
    /// Uncached read of `buf.len()` bytes at `offset` through the aligned bounce buffer.
    fn read_direct(&self, direct: &File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let align = DIRECT_ALIGN as u64;
        if offset.is_multiple_of(align)
            && (buf.len() as u64).is_multiple_of(align)
            && buf.as_ptr().align_offset(DIRECT_ALIGN) == 0
        {
            // Aligned on every count (the streamer's zones): straight into `buf`. A read
            // that stops short of a block boundary has reached the end of the file.
            let mut done = 0;
            while done < buf.len() {
                match direct.read_at(&mut buf[done..], offset + done as u64) {
                    Ok(0) => break,
                    Ok(n) => {
                        done += n;
                        if !n.is_multiple_of(DIRECT_ALIGN) {
                            break;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            return Ok(done);
        }
        let mut bounce = self.bounce.lock().unwrap_or_else(|e| e.into_inner());
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let start = pos - pos % DIRECT_ALIGN as u64;
            let lead = (pos - start) as usize;
            let want = (buf.len() - done).min(BOUNCE_MAX - lead);
            let span = (lead + want).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
            let window = aligned_window(&mut bounce, span);
            let got = read_full(direct, start, window)?;
            if got <= lead {
                break; // end of file
            }
            let n = (got - lead).min(want);
            buf[done..done + n].copy_from_slice(&window[lead..lead + n]);
            done += n;
            if got < span {
                break; // a short direct read only happens at end of file
            }
        }
        Ok(done)
    }
}

impl Platform for LinuxPlatform {
    type File = LinuxFile;

    fn open(&self, path: &str) -> Result<LinuxFile, PlatformError> {
        let buffered = File::open(path).map_err(|e| PlatformError::Open { code: os_code(&e) })?;
        let size = buffered
            .metadata()
            .map_err(|e| PlatformError::Open { code: os_code(&e) })?
            .len();
        // EINVAL here means the file system has no O_DIRECT: use buffered reads only.
        let direct = O_DIRECT.and_then(|flag| {
            OpenOptions::new()
                .read(true)
                .custom_flags(flag)
                .open(path)
                .ok()
        });
        Ok(LinuxFile {
            direct_ok: AtomicBool::new(direct.is_some()),
            buffered,
            direct,
            size,
            bounce: Mutex::new(Vec::new()),
        })
    }

    fn file_size(&self, file: &LinuxFile) -> u64 {
        file.size
    }

    fn read_at(
        &self,
        file: &LinuxFile,
        offset: u64,
        buf: &mut [u8],
        direct: bool,
    ) -> Result<usize, PlatformError> {
        if direct && file.direct_ok.load(Ordering::Relaxed) {
            if let Some(t) = self.read_delay {
                std::thread::sleep(t);
            }
            if let Some(d) = &file.direct {
                match file.read_direct(d, offset, buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if os_code(&e) == EINVAL => {
                        file.direct_ok.store(false, Ordering::Relaxed);
                    }
                    Err(e) => {
                        return Err(PlatformError::Read {
                            offset,
                            code: os_code(&e),
                        })
                    }
                }
            }
        }
        read_full(&file.buffered, offset, buf).map_err(|e| PlatformError::Read {
            offset,
            code: os_code(&e),
        })
    }

    fn file_stamp(&self, file: &LinuxFile) -> Option<u64> {
        let m = file.buffered.metadata().ok()?.modified().ok()?;
        let d = m.duration_since(std::time::UNIX_EPOCH).ok()?;
        Some(d.as_nanos() as u64)
    }

    fn write_file(&self, path: &str, parts: &[&[u8]]) -> Result<(), PlatformError> {
        let err = |e: std::io::Error| PlatformError::Write { code: os_code(&e) };
        let tmp = format!("{path}.tmp{}", std::process::id());
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            for p in parts {
                f.write_all(p)?;
            }
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(e)
        })
    }

    fn map<'f>(&self, _file: &'f LinuxFile, _offset: u64, _len: usize) -> Option<&'f [u8]> {
        // mmap needs libc; the engine reads into its arena instead until it is worth it.
        None
    }

    fn region(&self, bytes: usize) -> Result<&'static mut [u8], PlatformError> {
        let total = bytes
            .checked_add(DIRECT_ALIGN)
            .ok_or(PlatformError::OutOfMemory { requested: bytes })?;
        // Zeroed memory of alignment 1 comes from calloc, which hands out fresh pages
        // untouched: only what the arena writes counts towards RSS (an aligned zeroed
        // allocation would be memset, touching every page). Over-allocating by one page
        // lets the region start on a page boundary, which direct reads into it need.
        let layout = std::alloc::Layout::from_size_align(total, 1)
            .map_err(|_| PlatformError::OutOfMemory { requested: bytes })?;
        // SAFETY: the layout's size is non-zero (at least DIRECT_ALIGN).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(PlatformError::OutOfMemory { requested: bytes });
        }
        // SAFETY: `ptr` is a fresh, zero-initialised allocation of `total` bytes that
        // nothing else refers to; it is never freed, so the slice may be 'static (the
        // region lives as long as the engine, which lives as long as the process).
        let all: &'static mut [u8] = unsafe { std::slice::from_raw_parts_mut(ptr, total) };
        let skip = all.as_ptr().align_offset(DIRECT_ALIGN);
        Ok(&mut all[skip..skip + bytes])
    }

    fn available_memory(&self) -> Option<u64> {
        proc_kb("/proc/meminfo", "MemAvailable:")
    }

    fn rss(&self) -> Option<u64> {
        proc_kb("/proc/self/status", "VmRSS:")
    }

    fn discard(&self, mem: &mut [u8]) -> u64 {
        const PAGE: usize = 4096;
        const MADV_DONTNEED: i32 = 4;
        extern "C" {
            fn madvise(addr: *mut core::ffi::c_void, len: usize, advice: i32) -> i32;
        }
        let skip = mem.as_ptr().align_offset(PAGE);
        if skip >= mem.len() {
            return 0;
        }
        let len = (mem.len() - skip) / PAGE * PAGE;
        if len == 0 {
            return 0;
        }
        let pages = &mut mem[skip..skip + len];
        // SAFETY: `pages` is a page-aligned, whole-page range of memory this call holds
        // exclusively (`&mut`), inside the arena region's private anonymous mapping;
        // MADV_DONTNEED there only makes the pages read back as zeros, a valid value
        // for the `u8`s the slice covers.
        let rc = unsafe { madvise(pages.as_mut_ptr().cast(), len, MADV_DONTNEED) };
        if rc == 0 {
            len as u64
        } else {
            0
        }
    }

    fn storage_read_bytes(&self) -> Option<u64> {
        let text = std::fs::read_to_string("/proc/self/io").ok()?;
        let line = text.lines().find(|l| l.starts_with("read_bytes:"))?;
        line["read_bytes:".len()..].trim().parse().ok()
    }

    fn peak_rss(&self) -> Option<u64> {
        proc_kb("/proc/self/status", "VmHWM:")
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
        // One scoped thread per weight pass: its cost (tens of microseconds) is nothing
        // next to a pass that reads from flash, and the compute pool stays untouched.
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

    fn unix_time_s(&self) -> Option<u64> {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs())
    }

    fn stdout(&self, bytes: &[u8]) {
        // Generated text is streamed a token at a time, so flush; a closed pipe is not
        // the engine's problem.
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(bytes);
        let _ = out.flush();
    }

    fn stderr(&self, bytes: &[u8]) {
        let _ = std::io::stderr().lock().write_all(bytes);
    }

    fn read_line(&self, buf: &mut [u8]) -> Option<usize> {
        use std::io::BufRead;
        let mut line = Vec::new();
        let n = std::io::stdin().lock().read_until(b'\n', &mut line).ok()?;
        if n == 0 {
            return None;
        }
        while matches!(line.last(), Some(b'\n' | b'\r')) {
            line.pop();
        }
        // Longer lines are cut at the buffer (and at a character boundary by the caller).
        let k = line.len().min(buf.len());
        buf[..k].copy_from_slice(&line[..k]);
        Some(k)
    }

    // Sockets for `pinch serve`: see `crate::net`.
    fn tcp_listen(&self, host: &str, port: u16) -> Result<(Socket, u16), PlatformError> {
        crate::net::listen(host, port)
    }

    fn tcp_accept(&self, listener: Socket) -> Result<Option<Socket>, PlatformError> {
        crate::net::accept(listener)
    }

    fn tcp_recv(&self, conn: Socket, buf: &mut [u8]) -> Result<Recv, PlatformError> {
        crate::net::recv(conn, buf)
    }

    fn tcp_send(&self, conn: Socket, bytes: &[u8]) -> Result<(), PlatformError> {
        crate::net::send(conn, bytes)
    }

    fn tcp_close(&self, sock: Socket) {
        crate::net::close(sock)
    }

    fn sleep_ms(&self, ms: u32) {
        std::thread::sleep(std::time::Duration::from_millis(u64::from(ms)));
    }
}

/// A `Key:   123 kB` field of a `/proc` file, in bytes.
fn proc_kb(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    parse_kb(&text, key)
}

fn parse_kb(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let mut words = line[key.len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => n.checked_mul(1024),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::atomic::AtomicU64;

    fn platform() -> LinuxPlatform {
        LinuxPlatform::with_workers(3).unwrap()
    }

    /// A scratch file with pseudo-random contents, next to the test binary (a real disk
    /// on most machines, where O_DIRECT works; /tmp may be tmpfs, which refuses it).
    fn scratch(name: &str, len: usize) -> (PathBuf, Vec<u8>) {
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().unwrap();
        let path = dir.join(format!("{name}-{}", std::process::id()));
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::fs::write(&path, &data).unwrap();
        (path, data)
    }

    #[test]
    fn buffered_and_direct_reads_return_the_file_bytes_at_odd_offsets() {
        let (path, data) = scratch("pinch-read", 3 * 4096 * 64 + 1234);
        let p = platform();
        let f = p.open(path.to_str().unwrap()).unwrap();
        assert_eq!(p.file_size(&f), data.len() as u64);
        for &(off, len) in &[
            (0usize, 1usize),
            (1, 3),
            (4095, 2),
            (4096, 4096),
            (17, 255),
            (5000, 70_000),
            (100, 1_500_000),
        ] {
            for direct in [false, true] {
                let mut buf = vec![0u8; len];
                let n = p.read_at(&f, off as u64, &mut buf, direct).unwrap();
                let end = (off + len).min(data.len());
                assert_eq!(n, end - off, "off {off} len {len} direct {direct}");
                assert_eq!(
                    &buf[..n],
                    &data[off..end],
                    "off {off} len {len} direct {direct}"
                );
            }
        }
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn o_direct_flag_is_accepted_for_a_regular_file() {
        // A wrong constant for this architecture shows up as ENOTDIR (0o40000 is
        // O_DIRECTORY on arm) or as a silent fallback; EINVAL is the only allowed refusal.
        let (path, _) = scratch("pinch-odirect", 4096);
        if let Some(flag) = O_DIRECT {
            let r = OpenOptions::new().read(true).custom_flags(flag).open(&path);
            if let Err(e) = r {
                assert_eq!(os_code(&e), EINVAL, "O_DIRECT open failed: {e}");
            }
        }
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn reads_past_the_end_are_short_or_empty() {
        let (path, data) = scratch("pinch-eof", 10_000);
        let p = platform();
        let f = p.open(path.to_str().unwrap()).unwrap();
        for direct in [false, true] {
            let mut buf = vec![0u8; 4096];
            assert_eq!(p.read_at(&f, 9_000, &mut buf, direct).unwrap(), 1_000);
            assert_eq!(&buf[..1_000], &data[9_000..]);
            assert_eq!(p.read_at(&f, 10_000, &mut buf, direct).unwrap(), 0);
            assert_eq!(p.read_at(&f, 50_000, &mut buf, direct).unwrap(), 0);
        }
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn opening_a_missing_file_names_the_os_error() {
        let p = platform();
        match p.open("/nonexistent/pinch/model.gguf") {
            Err(PlatformError::Open { code }) => assert_eq!(code, 2), // ENOENT
            Err(e) => panic!("wrong error {e}"),
            Ok(_) => panic!("opened a missing file"),
        }
    }

    #[test]
    fn region_is_page_aligned_zeroed_and_writable() {
        let p = platform();
        let r = p.region(1 << 20).unwrap();
        assert_eq!(r.len(), 1 << 20);
        assert_eq!(r.as_ptr() as usize % DIRECT_ALIGN, 0);
        assert!(r.iter().all(|&b| b == 0));
        r[12345] = 7;
        assert_eq!(r[12345], 7);
    }

    #[test]
    fn an_impossible_region_is_an_error_not_an_abort() {
        let p = platform();
        assert_eq!(
            p.region(usize::MAX - 10),
            Err(PlatformError::OutOfMemory {
                requested: usize::MAX - 10
            })
        );
    }

    /// RSS is the whole process's: the tests that measure it take turns (run in parallel,
    /// one's freeing showed up in the other's figures).
    static RSS_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn untouched_region_pages_do_not_count_in_rss() {
        let _turn = RSS_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let p = platform();
        let before = p.rss().unwrap();
        let r = p.region(256 << 20).unwrap();
        let after = p.rss().unwrap();
        assert!(
            after < before + (64 << 20),
            "rss grew {} bytes",
            after - before
        );
        // Touch 32 MB and watch RSS follow.
        for i in (0..32 << 20).step_by(4096) {
            r[i] = 1;
        }
        assert!(p.rss().unwrap() >= after + (24 << 20));
        assert!(p.peak_rss().unwrap() >= p.rss().unwrap() - (1 << 20));
    }

    #[test]
    fn memory_figures_come_from_proc() {
        let p = platform();
        assert!(p.available_memory().unwrap() > 0);
        assert!(p.rss().unwrap() > 0);
    }

    #[test]
    fn parses_proc_fields() {
        let text = "Name:\tx\nVmHWM:\t    2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(parse_kb(text, "VmRSS:"), Some(1024 * 1024));
        assert_eq!(parse_kb(text, "VmHWM:"), Some(2048 * 1024));
        assert_eq!(parse_kb(text, "VmSwap:"), None);
        assert_eq!(parse_kb("VmRSS: lots kB", "VmRSS:"), None);
    }

    #[test]
    fn parallel_covers_every_index_through_the_platform() {
        let p = platform();
        let sum = AtomicU64::new(0);
        p.parallel(p.workers(), &|i| {
            sum.fetch_add(i as u64 + 1, Ordering::SeqCst);
        });
        let w = p.workers() as u64;
        assert_eq!(sum.load(Ordering::SeqCst), w * (w + 1) / 2);
    }

    #[test]
    fn cpu_override_only_lowers() {
        let all = detect_cpu();
        assert_eq!(cpu_override(all, "scalar"), Some(CpuFeatures::SCALAR));
        assert_eq!(cpu_override(all, "auto"), Some(all));
        let nodot = cpu_override(all, "neon-nodot").unwrap();
        assert!(!nodot.dotprod() && !nodot.i8mm() && !nodot.avx2());
        assert_eq!(nodot.neon(), all.neon());
        let neon = cpu_override(all, "neon").unwrap();
        assert!(!neon.avx2() && neon.dotprod() == all.dotprod());
        assert_eq!(
            cpu_override(CpuFeatures::SCALAR, "neon"),
            Some(CpuFeatures::SCALAR)
        );
        let avx2 = cpu_override(all, "avx2").unwrap();
        assert!(!avx2.avx512vnni() && !avx2.neon() && avx2.avx2() == all.avx2());
        let vnni = cpu_override(all, "avx512vnni").unwrap();
        assert!(!vnni.avx512vbmi() && vnni.avx512vnni() == all.avx512vnni());
        assert_eq!(cpu_override(all, "turbo"), None);
    }

    #[test]
    fn detected_features_match_the_architecture() {
        let f = detect_cpu();
        // 32-bit ARM: NEON as the auxv says (Cortex-A9 cores may lack it).
        if !cfg!(target_arch = "arm") {
            assert_eq!(f.neon(), cfg!(target_arch = "aarch64"));
        }
        if !cfg!(target_arch = "x86_64") {
            assert!(!f.avx2());
        }
    }

    #[test]
    fn detection_follows_the_emulated_core_under_qemu() {
        // `cargo xtask test` runs the aarch64 tests with QEMU_CPU set; qemu-user reports
        // the emulated core's HWCAPs, so detection must follow it.
        let f = detect_cpu();
        if cfg!(target_arch = "arm") {
            // The armv7 step runs qemu's cortex-a7, which has NEON. (qemu has no
            // armv7-A core without it; the scalar path is tested as a feature set.)
            if std::env::var("QEMU_CPU").as_deref() == Ok("cortex-a7") {
                assert!(f.neon() && !f.dotprod(), "{f:?}");
            }
            return;
        }
        if !cfg!(target_arch = "aarch64") {
            return;
        }
        match std::env::var("QEMU_CPU").as_deref() {
            Ok("cortex-a53") => assert!(!f.dotprod() && !f.fp16() && !f.i8mm(), "{f:?}"),
            Ok("max") => assert!(f.dotprod() && f.fp16() && f.i8mm(), "{f:?}"),
            _ => {}
        }
    }

    #[test]
    fn write_file_replaces_the_whole_file_and_changes_the_stamp() {
        let p = platform();
        let (path, _) = scratch("write-file", 10);
        let ps = path.to_str().unwrap();
        let f = p.open(ps).unwrap();
        let before = p.file_stamp(&f).expect("stamp on linux");
        std::thread::sleep(std::time::Duration::from_millis(20));
        p.write_file(ps, &[b"abc", b"", b"defg"]).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"abcdefg");
        let g = p.open(ps).unwrap();
        assert_ne!(p.file_stamp(&g), Some(before));
        let bad = p.write_file("/nonexistent-dir/x", &[b"a"]);
        assert!(matches!(bad, Err(PlatformError::Write { .. })), "{bad:?}");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn discarded_pages_read_back_as_zeros_and_leave_rss() {
        let _turn = RSS_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let p = platform();
        let region = p.region(64 << 20).unwrap();
        let before = p.rss().unwrap();
        region.fill(7);
        let touched = p.rss().unwrap();
        assert!(touched >= before + (60 << 20), "{before} -> {touched}");
        let freed = p.discard(&mut region[100..]);
        assert!(freed >= (64 << 20) - 8192, "{freed}");
        let after = p.rss().unwrap();
        assert!(after + (60 << 20) <= touched, "{touched} -> {after}");
        assert_eq!(region[99], 7);
        assert!(region[8192..].iter().all(|&b| b == 0));
    }

    #[test]
    fn clock_is_monotonic() {
        let p = platform();
        let a = p.now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(p.now_ns() >= a + 1_000_000);
    }
}
