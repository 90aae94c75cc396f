//! [`FaultInjector`]: a [`Platform`] wrapper that makes storage, memory and sockets
//! misbehave on purpose, after smoltcp's `phy::FaultInjector`.
//!
//! It wraps any platform (Linux, iOS, an in-memory test platform) and passes every call
//! through, except where a fault in its [`Faults`] is switched on:
//! - storage: reads cut short ([`Faults::short_reads`]), `EIO` for a read that covers a
//!   chosen offset, a file that ends early while its size still says otherwise (it
//!   shrank while open), a latency per read; the `EIO` and the early end can be held
//!   back until a number of reads went by, to land mid-generation;
//! - the repack cache: `write_file` failing with a chosen OS error (`ENOSPC`, `EIO`);
//! - memory: `available_memory` dropping to a chosen figure after a number of
//!   readings (the guard reads it once per token, so this lands mid-generation);
//! - sockets: a connection reset (`ECONNRESET`) once a chosen number of bytes was sent
//!   on it, after which receiving reports it closed.
//!
//! Read faults apply only to files whose path contains [`Faults::path_filter`] (all
//! files when it is empty), so a test can break the model and spare the cache, or the
//! other way round. While any read fault is on, [`Platform::map`] answers `None`, so no
//! read escapes through a mapping. Each fault counts how often it fired
//! ([`Fired`]): a test can prove the fault really happened.
//!
//! Why here and not in a test crate: like smoltcp's, the wrapper is part of the
//! library, `no_std` with no allocation or `unsafe` (the knobs are atomics, so a test
//! can turn a fault on while the engine runs on another thread), and so it can wrap
//! every platform the engine runs on, including the Linux one in `pinch-linux`'s tests.
use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};

use pinch_kernels::CpuFeatures;

use crate::platform::{Platform, PlatformError, Recv, Socket};

/// `EIO` on Linux and Darwin.
pub const EIO: i32 = 5;
/// `ENOSPC` on Linux and Darwin.
pub const ENOSPC: i32 = 28;
/// `ECONNRESET` on Linux (Darwin: 54).
pub const ECONNRESET: i32 = 104;

const OFF: u64 = u64::MAX;
/// Most connections whose sent bytes are counted (by socket number modulo this).
const CONNS: usize = 64;

/// The faults to inject; every field off by default. All knobs are atomics, set with
/// the methods below at any time, from any thread.
pub struct Faults {
    path_filter: spin::Mutex<heapless::String<128>>,
    short_reads: AtomicUsize,
    eio_at: AtomicU64,
    end_at: AtomicU64,
    read_latency_ms: AtomicU32,
    arm_after: AtomicU64,
    write_error: AtomicI32,
    memory_after: AtomicU64,
    memory_low: AtomicU64,
    reset_after: AtomicU64,
}

/// How often each fault fired.
#[derive(Default)]
pub struct Fired {
    /// Reads returned short.
    pub short_reads: AtomicU64,
    /// Reads failed with `EIO`.
    pub eio: AtomicU64,
    /// Reads cut by the early end of a shrunk file.
    pub shrunk: AtomicU64,
    /// Reads delayed.
    pub delayed: AtomicU64,
    /// Writes refused.
    pub write_errors: AtomicU64,
    /// `available_memory` readings replaced by the low figure.
    pub low_memory: AtomicU64,
    /// Sends answered with a reset.
    pub resets: AtomicU64,
    /// Reads seen on files the filter selects (faulty or not).
    pub reads: AtomicU64,
    /// `available_memory` readings seen.
    pub memory_readings: AtomicU64,
}

impl Fired {
    /// The count of one counter.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Relaxed)
    }
}

impl Default for Faults {
    fn default() -> Faults {
        Faults::new()
    }
}

impl Faults {
    /// No fault on.
    pub const fn new() -> Faults {
        Faults {
            path_filter: spin::Mutex::new(heapless::String::new()),
            short_reads: AtomicUsize::new(0),
            eio_at: AtomicU64::new(OFF),
            end_at: AtomicU64::new(OFF),
            read_latency_ms: AtomicU32::new(0),
            arm_after: AtomicU64::new(0),
            write_error: AtomicI32::new(0),
            memory_after: AtomicU64::new(OFF),
            memory_low: AtomicU64::new(0),
            reset_after: AtomicU64::new(OFF),
        }
    }
    /// Read faults only for files opened with a path containing `s` (empty: all).
    /// A filter longer than 128 bytes is cut.
    pub fn path_filter(&self, s: &str) -> &Self {
        let mut f = self.path_filter.lock();
        f.clear();
        for c in s.chars() {
            if f.push(c).is_err() {
                break;
            }
        }
        self
    }
    /// Return at most `n` bytes per read (0: off). The platform contract says reads
    /// are short only at the end of the file; callers that loop must not care.
    pub fn short_reads(&self, n: usize) -> &Self {
        self.short_reads.store(n, Relaxed);
        self
    }
    /// Fail a read that covers byte `offset` with `EIO` (`None`: off).
    pub fn eio_at(&self, offset: Option<u64>) -> &Self {
        self.eio_at.store(offset.unwrap_or(OFF), Relaxed);
        self
    }
    /// The file now ends at `len` bytes, while `file_size` still reports the size it
    /// had when opened (`None`: off).
    pub fn shrink_to(&self, len: Option<u64>) -> &Self {
        self.end_at.store(len.unwrap_or(OFF), Relaxed);
        self
    }
    /// Hold back [`Self::eio_at`] and [`Self::shrink_to`] until `reads` reads of the
    /// selected files have been seen (0: from the first read), so a fault can land
    /// mid-generation rather than while loading.
    pub fn arm_after_reads(&self, reads: u64) -> &Self {
        self.arm_after.store(reads, Relaxed);
        self
    }
    /// Wait `ms` before every read (0: off).
    pub fn read_latency_ms(&self, ms: u32) -> &Self {
        self.read_latency_ms.store(ms, Relaxed);
        self
    }
    /// Make `write_file` fail with OS error `code` (0: off), before anything is
    /// written.
    pub fn write_error(&self, code: i32) -> &Self {
        self.write_error.store(code, Relaxed);
        self
    }
    /// After `readings` calls of `available_memory`, report `bytes` (`None`: off).
    pub fn memory_drop(&self, after: Option<(u64, u64)>) -> &Self {
        let (readings, bytes) = after.unwrap_or((OFF, 0));
        self.memory_low.store(bytes, Relaxed);
        self.memory_after.store(readings, Relaxed);
        self
    }
    /// Reset a connection once `bytes` were sent on it (`None`: off).
    pub fn reset_after(&self, bytes: Option<u64>) -> &Self {
        self.reset_after.store(bytes.unwrap_or(OFF), Relaxed);
        self
    }
    fn read_faults_on(&self) -> bool {
        self.short_reads.load(Relaxed) != 0
            || self.eio_at.load(Relaxed) != OFF
            || self.end_at.load(Relaxed) != OFF
            || self.read_latency_ms.load(Relaxed) != 0
    }
}

/// A file opened through the injector: the inner platform's file and whether the read
/// faults apply to it.
pub struct FaultFile<F> {
    pub inner: F,
    pub faulty: bool,
}

/// The wrapper. See the module doc.
pub struct FaultInjector<'f, P: Platform> {
    pub inner: P,
    pub faults: &'f Faults,
    pub fired: Fired,
    /// Bytes sent per connection (by socket number modulo [`CONNS`]).
    sent: [AtomicU64; CONNS],
    /// Connections reset (bit per slot of `sent`).
    reset: AtomicU64,
}

impl<'f, P: Platform> FaultInjector<'f, P> {
    pub fn new(inner: P, faults: &'f Faults) -> FaultInjector<'f, P> {
        FaultInjector {
            inner,
            faults,
            fired: Fired::default(),
            sent: [const { AtomicU64::new(0) }; CONNS],
            reset: AtomicU64::new(0),
        }
    }

    fn conn(s: Socket) -> usize {
        s.0 as usize % CONNS
    }
}

impl<P: Platform> Platform for FaultInjector<'_, P> {
    type File = FaultFile<P::File>;

    fn open(&self, path: &str) -> Result<Self::File, PlatformError> {
        let inner = self.inner.open(path)?;
        let filter = self.faults.path_filter.lock();
        Ok(FaultFile {
            inner,
            faulty: path.contains(filter.as_str()),
        })
    }
    fn file_size(&self, file: &Self::File) -> u64 {
        self.inner.file_size(&file.inner)
    }
    fn read_at(
        &self,
        file: &Self::File,
        offset: u64,
        buf: &mut [u8],
        direct: bool,
    ) -> Result<usize, PlatformError> {
        if !file.faulty {
            return self.inner.read_at(&file.inner, offset, buf, direct);
        }
        let f = self.faults;
        let armed = self.fired.reads.fetch_add(1, Relaxed) >= f.arm_after.load(Relaxed);
        let ms = f.read_latency_ms.load(Relaxed);
        if ms > 0 {
            self.fired.delayed.fetch_add(1, Relaxed);
            self.inner.sleep_ms(ms);
        }
        let mut len = buf.len();
        let short = f.short_reads.load(Relaxed);
        if short != 0 && len > short {
            len = short;
            self.fired.short_reads.fetch_add(1, Relaxed);
        }
        let end = f.end_at.load(Relaxed);
        if end != OFF && armed {
            let room = end.saturating_sub(offset);
            if (len as u64) > room {
                len = room as usize;
                self.fired.shrunk.fetch_add(1, Relaxed);
            }
        }
        let eio = f.eio_at.load(Relaxed);
        if eio != OFF && armed && offset <= eio && eio < offset + len as u64 {
            self.fired.eio.fetch_add(1, Relaxed);
            return Err(PlatformError::Read { offset, code: EIO });
        }
        if len == 0 {
            return Ok(0);
        }
        self.inner
            .read_at(&file.inner, offset, &mut buf[..len], direct)
    }
    fn map<'f>(&self, file: &'f Self::File, offset: u64, len: usize) -> Option<&'f [u8]> {
        if file.faulty && self.faults.read_faults_on() {
            return None;
        }
        self.inner.map(&file.inner, offset, len)
    }
    fn file_stamp(&self, file: &Self::File) -> Option<u64> {
        self.inner.file_stamp(&file.inner)
    }
    fn write_file(&self, path: &str, parts: &[&[u8]]) -> Result<(), PlatformError> {
        let code = self.faults.write_error.load(Relaxed);
        if code != 0 {
            self.fired.write_errors.fetch_add(1, Relaxed);
            return Err(PlatformError::Write { code });
        }
        self.inner.write_file(path, parts)
    }
    fn region(&self, bytes: usize) -> Result<&'static mut [u8], PlatformError> {
        self.inner.region(bytes)
    }
    fn available_memory(&self) -> Option<u64> {
        let n = self.fired.memory_readings.fetch_add(1, Relaxed);
        let after = self.faults.memory_after.load(Relaxed);
        if after != OFF && n >= after {
            self.fired.low_memory.fetch_add(1, Relaxed);
            return Some(self.faults.memory_low.load(Relaxed));
        }
        self.inner.available_memory()
    }
    fn release_cache(&self) -> u64 {
        self.inner.release_cache()
    }
    fn discard(&self, mem: &mut [u8]) -> u64 {
        self.inner.discard(mem)
    }
    fn rss(&self) -> Option<u64> {
        self.inner.rss()
    }
    fn peak_rss(&self) -> Option<u64> {
        self.inner.peak_rss()
    }
    fn storage_read_bytes(&self) -> Option<u64> {
        self.inner.storage_read_bytes()
    }
    fn workers(&self) -> usize {
        self.inner.workers()
    }
    fn parallel(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        self.inner.parallel(n, f)
    }
    fn cpu(&self) -> CpuFeatures {
        self.inner.cpu()
    }
    fn io_thread(&self) -> bool {
        self.inner.io_thread()
    }
    fn overlap(&self, io: &mut (dyn FnMut() + Send), work: &mut dyn FnMut()) {
        self.inner.overlap(io, work)
    }
    fn yield_now(&self) {
        self.inner.yield_now()
    }
    fn reader_pool(&self) -> bool {
        self.inner.reader_pool()
    }
    fn with_readers(&self, n: usize, read: &(dyn Fn(usize) + Sync), work: &mut dyn FnMut()) {
        self.inner.with_readers(n, read, work)
    }
    fn wait_while(&self, word: &core::sync::atomic::AtomicU32, value: u32) {
        self.inner.wait_while(word, value)
    }
    fn wake_all(&self) {
        self.inner.wake_all()
    }
    fn now_ns(&self) -> u64 {
        self.inner.now_ns()
    }
    fn stdout(&self, bytes: &[u8]) {
        self.inner.stdout(bytes)
    }
    fn stderr(&self, bytes: &[u8]) {
        self.inner.stderr(bytes)
    }
    fn read_line(&self, buf: &mut [u8]) -> Option<usize> {
        self.inner.read_line(buf)
    }
    fn tcp_listen(&self, host: &str, port: u16) -> Result<(Socket, u16), PlatformError> {
        self.inner.tcp_listen(host, port)
    }
    fn tcp_accept(&self, listener: Socket) -> Result<Option<Socket>, PlatformError> {
        let s = self.inner.tcp_accept(listener)?;
        if let Some(s) = s {
            // A new connection in this slot starts with a clean count.
            let c = Self::conn(s);
            self.sent[c].store(0, Relaxed);
            self.reset.fetch_and(!(1 << c), Relaxed);
        }
        Ok(s)
    }
    fn tcp_recv(&self, conn: Socket, buf: &mut [u8]) -> Result<Recv, PlatformError> {
        if self.reset.load(Relaxed) & (1 << Self::conn(conn)) != 0 {
            return Ok(Recv::Closed);
        }
        self.inner.tcp_recv(conn, buf)
    }
    fn tcp_send(&self, conn: Socket, bytes: &[u8]) -> Result<(), PlatformError> {
        let c = Self::conn(conn);
        let limit = self.faults.reset_after.load(Relaxed);
        if self.reset.load(Relaxed) & (1 << c) != 0 {
            return Err(PlatformError::Net { code: ECONNRESET });
        }
        if limit != OFF {
            let before = self.sent[c].fetch_add(bytes.len() as u64, Relaxed);
            if before + bytes.len() as u64 > limit {
                // Deliver what fits, then the peer is gone.
                let fits = limit.saturating_sub(before) as usize;
                if fits > 0 {
                    let _ = self.inner.tcp_send(conn, &bytes[..fits]);
                }
                self.reset.fetch_or(1 << c, Relaxed);
                self.fired.resets.fetch_add(1, Relaxed);
                return Err(PlatformError::Net { code: ECONNRESET });
            }
        }
        self.inner.tcp_send(conn, bytes)
    }
    fn tcp_close(&self, sock: Socket) {
        self.inner.tcp_close(sock)
    }
    fn sleep_ms(&self, ms: u32) {
        self.inner.sleep_ms(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::MemPlatform;

    const BYTES: [u8; 100] = {
        let mut b = [0u8; 100];
        let mut i = 0;
        while i < 100 {
            b[i] = i as u8;
            i += 1;
        }
        b
    };

    fn injector(f: &Faults) -> FaultInjector<'_, MemPlatform<'static>> {
        let mem = MemPlatform {
            bytes: &BYTES,
            cpu: CpuFeatures::default(),
        };
        FaultInjector::new(mem, f)
    }

    #[test]
    fn short_reads_cut_every_read_and_are_counted() {
        let f = Faults::new();
        f.short_reads(7);
        let p = injector(&f);
        let file = p.open("m.gguf").unwrap();
        let mut buf = [0u8; 20];
        assert_eq!(p.read_at(&file, 10, &mut buf, false), Ok(7));
        assert_eq!(buf[..7], BYTES[10..17]);
        assert_eq!(Fired::get(&p.fired.short_reads), 1);
        assert!(p.map(&file, 0, 10).is_none());
    }

    #[test]
    fn eio_hits_only_the_read_covering_the_offset() {
        let f = Faults::new();
        f.eio_at(Some(50));
        let p = injector(&f);
        let file = p.open("m.gguf").unwrap();
        let mut buf = [0u8; 10];
        assert_eq!(p.read_at(&file, 40, &mut buf, false), Ok(10));
        assert_eq!(
            p.read_at(&file, 45, &mut buf, false),
            Err(PlatformError::Read {
                offset: 45,
                code: EIO
            })
        );
        assert_eq!(p.read_at(&file, 51, &mut buf, false), Ok(10));
        assert_eq!(Fired::get(&p.fired.eio), 1);
        // Armed only from the 5th read on (3 were seen).
        f.arm_after_reads(4);
        assert_eq!(p.read_at(&file, 45, &mut buf, false), Ok(10));
        assert!(p.read_at(&file, 45, &mut buf, false).is_err());
    }

    #[test]
    fn a_shrunk_file_ends_early_but_keeps_its_size() {
        let f = Faults::new();
        f.shrink_to(Some(30));
        let p = injector(&f);
        let file = p.open("m.gguf").unwrap();
        assert_eq!(p.file_size(&file), 100);
        let mut buf = [0u8; 10];
        assert_eq!(p.read_at(&file, 25, &mut buf, false), Ok(5));
        assert_eq!(p.read_at(&file, 30, &mut buf, false), Ok(0));
        assert_eq!(Fired::get(&p.fired.shrunk), 2);
    }

    #[test]
    fn the_path_filter_spares_other_files() {
        let f = Faults::new();
        f.path_filter("cache").eio_at(Some(0));
        let p = injector(&f);
        let model = p.open("m.gguf").unwrap();
        let cache = p.open("dir/m.pinch-repack-cache").unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(p.read_at(&model, 0, &mut buf, false), Ok(4));
        assert!(p.read_at(&cache, 0, &mut buf, false).is_err());
    }

    #[test]
    fn writes_fail_with_the_chosen_code() {
        let f = Faults::new();
        f.write_error(ENOSPC);
        let p = injector(&f);
        assert_eq!(
            p.write_file("x", &[b"abc"]),
            Err(PlatformError::Write { code: ENOSPC })
        );
        f.write_error(0);
        // MemPlatform itself cannot write: the default answer comes through.
        assert_eq!(
            p.write_file("x", &[b"abc"]),
            Err(PlatformError::Unsupported("writing files"))
        );
    }

    #[test]
    fn memory_drops_after_the_chosen_readings() {
        let f = Faults::new();
        f.memory_drop(Some((2, 1 << 20)));
        let p = injector(&f);
        assert_eq!(p.available_memory(), None);
        assert_eq!(p.available_memory(), None);
        assert_eq!(p.available_memory(), Some(1 << 20));
        assert_eq!(Fired::get(&p.fired.low_memory), 1);
    }
}
