//! The `Platform` trait: the engine's only door to the outside.
//!
//! An OS crate (`pinch-linux`, `pinch-ios`) implements it with system calls; tests and
//! bare-metal embedders use [`MemPlatform`] (model bytes in memory, one worker).
use pinch_kernels::CpuFeatures;

/// What went wrong at the platform boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlatformError {
    /// The file could not be opened (OS error code if any).
    Open { code: i32 },
    /// A read failed (OS error code if any).
    Read { offset: u64, code: i32 },
    /// Memory for the arena region could not be obtained.
    OutOfMemory { requested: usize },
    /// Operation not supported on this platform.
    Unsupported(&'static str),
    /// A socket operation failed (OS error code if any).
    Net { code: i32 },
    /// Writing a file failed (OS error code if any).
    Write { code: i32 },
}

impl core::fmt::Display for PlatformError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PlatformError::Open { code } => write!(f, "cannot open file (os error {code})"),
            PlatformError::Read { offset, code } => {
                write!(f, "read failed at offset {offset} (os error {code})")
            }
            PlatformError::OutOfMemory { requested } => {
                write!(f, "cannot obtain {requested} bytes of memory")
            }
            PlatformError::Unsupported(what) => write!(f, "not supported here: {what}"),
            PlatformError::Net { code } => write!(f, "socket error (os error {code})"),
            PlatformError::Write { code } => write!(f, "cannot write file (os error {code})"),
        }
    }
}

impl core::error::Error for PlatformError {}

/// A TCP listener or connection the platform keeps; the engine holds only this handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Socket(pub u32);

/// What a non-blocking receive found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recv {
    /// This many bytes were read.
    Data(usize),
    /// Nothing to read yet.
    Pending,
    /// The peer closed its side (or reset the connection).
    Closed,
}

/// Files, memory, workers, clock and output.
pub trait Platform: Sync {
    /// An open file.
    type File: Sync;

    /// Open `path` read-only.
    fn open(&self, path: &str) -> Result<Self::File, PlatformError>;
    /// Size of the file in bytes.
    fn file_size(&self, file: &Self::File) -> u64;
    /// Read up to `buf.len()` bytes at `offset`; returns the count (short only at EOF).
    /// `direct` asks for an uncached read (O_DIRECT / F_NOCACHE) where the OS allows it;
    /// the platform falls back to a buffered read when it does not.
    fn read_at(
        &self,
        file: &Self::File,
        offset: u64,
        buf: &mut [u8],
        direct: bool,
    ) -> Result<usize, PlatformError>;
    /// Read-only view of `len` bytes at `offset`, if the platform can map or already
    /// holds the file in memory.
    fn map<'f>(&self, file: &'f Self::File, offset: u64, len: usize) -> Option<&'f [u8]>;

    /// A stamp that changes when the file's contents may have changed (Linux: the
    /// modification time in nanoseconds), if the platform knows one.
    fn file_stamp(&self, file: &Self::File) -> Option<u64> {
        let _ = file;
        None
    }
    /// Write `parts`, one after another, as the whole new contents of `path`. Atomic: the
    /// bytes go to a temporary file beside `path` that is renamed over it at the end, so
    /// a reader never sees a half-written file.
    fn write_file(&self, path: &str, parts: &[&[u8]]) -> Result<(), PlatformError> {
        let _ = (path, parts);
        Err(PlatformError::Unsupported("writing files"))
    }

    /// The one memory region the arena is carved from. Called once per engine.
    fn region(&self, bytes: usize) -> Result<&'static mut [u8], PlatformError>;
    /// Memory the OS could still give us (Linux: MemAvailable), if known.
    fn available_memory(&self) -> Option<u64>;
    /// Give memory the platform holds for speed only (caches, spare buffers) back to the
    /// OS, when the memory guard finds available memory under its floor; returns the
    /// bytes given back, if known. The default gives back nothing. On Linux that is the
    /// honest answer with std alone: the model file's clean page cache already counts
    /// in `MemAvailable` (dropping it would not raise the figure the guard reads), and
    /// the arena's pages are the engine's to release, not the platform's.
    fn release_cache(&self) -> u64 {
        0
    }
    /// Return the whole pages inside `mem` to the OS (their contents become zeros, and
    /// they cost no memory until written again); returns the bytes returned. Default:
    /// nothing is returned.
    fn discard(&self, mem: &mut [u8]) -> u64 {
        let _ = mem;
        0
    }
    /// Current resident set size, if known.
    fn rss(&self) -> Option<u64>;
    /// Peak resident set size (VmHWM), if known.
    fn peak_rss(&self) -> Option<u64>;
    /// Bytes this process has caused to be fetched from storage so far, as the OS counts
    /// them (Linux: `read_bytes` of /proc/self/io), if known.
    fn storage_read_bytes(&self) -> Option<u64> {
        None
    }

    /// Number of workers `parallel` runs on.
    fn workers(&self) -> usize;
    /// Run `f(i)` for every worker index `i` in `0..n` (n <= workers()) and wait for all.
    fn parallel(&self, n: usize, f: &(dyn Fn(usize) + Sync));
    /// CPU features the kernels may use.
    fn cpu(&self) -> CpuFeatures;

    /// Whether [`Platform::overlap`] runs its `io` closure on a thread of its own. When
    /// it does not, the engine reads streamed weights itself, just before use.
    fn io_thread(&self) -> bool {
        false
    }
    /// Run `io` on a background I/O thread while the calling thread runs `work`; return
    /// when both have finished. Only called when [`Platform::io_thread`] is true; the
    /// two closures coordinate through shared state, so neither may wait for the other
    /// to *start*.
    fn overlap(&self, io: &mut (dyn FnMut() + Send), work: &mut dyn FnMut()) {
        work();
        io();
    }
    /// Let another thread run (a compute thread waiting for streamed bytes).
    fn yield_now(&self) {}

    /// Whether [`Platform::with_readers`] runs its reads on reader threads of their own
    /// (a pool the platform keeps for the run, so a batch's expert reads start no
    /// thread).
    fn reader_pool(&self) -> bool {
        false
    }
    /// Run `read(r)` for every `r` in `0..n` on the platform's reader threads (the
    /// pool is made on the first call, of `n` threads, and kept for the run; a later
    /// call's indices are spread over those threads) while the calling thread runs
    /// `work`; return when all have finished. The
    /// closures coordinate through [`Platform::wait_while`] / [`Platform::wake_all`].
    /// Default, no reader threads: the reads first, then `work`.
    fn with_readers(&self, n: usize, read: &(dyn Fn(usize) + Sync), work: &mut dyn FnMut()) {
        for r in 0..n {
            read(r);
        }
        work();
    }
    /// Block the calling thread while `word` holds `value`, until a reader's
    /// [`Platform::wake_all`] changed it, or until every reader of the current
    /// [`Platform::with_readers`] call has returned (the caller then finds `word`
    /// unchanged and knows the read never finished). Default: yield until it changes.
    fn wait_while(&self, word: &core::sync::atomic::AtomicU32, value: u32) {
        while word.load(core::sync::atomic::Ordering::Acquire) == value {
            self.yield_now();
        }
    }
    /// Wake every thread in [`Platform::wait_while`] (call after changing a word).
    fn wake_all(&self) {}

    /// Monotonic time in nanoseconds.
    fn now_ns(&self) -> u64;
    /// Wall-clock time in seconds since 1970 (`None`: the platform has no clock; the
    /// server's `Process-Start-Time-Unix` header is then left out).
    fn unix_time_s(&self) -> Option<u64> {
        None
    }
    /// Write to standard output / standard error.
    fn stdout(&self, bytes: &[u8]);
    fn stderr(&self, bytes: &[u8]);
    /// Read one line of standard input (without the newline) into `buf`; `None` at end
    /// of input or where there is no input (the default).
    fn read_line(&self, buf: &mut [u8]) -> Option<usize> {
        let _ = buf;
        None
    }

    // TCP for `pinch serve`. Every call is non-blocking except `tcp_send`, so the engine
    // can run its single-threaded server loop between tokens. Platforms without sockets
    // keep these defaults.

    /// Listen on `host:port` (port 0: any free port); returns the listener and its port.
    fn tcp_listen(&self, host: &str, port: u16) -> Result<(Socket, u16), PlatformError> {
        let _ = (host, port);
        Err(PlatformError::Unsupported("tcp sockets"))
    }
    /// A pending connection on `listener`, if any (never waits).
    fn tcp_accept(&self, listener: Socket) -> Result<Option<Socket>, PlatformError> {
        let _ = listener;
        Err(PlatformError::Unsupported("tcp sockets"))
    }
    /// Read what has arrived on `conn` into `buf` (never waits).
    fn tcp_recv(&self, conn: Socket, buf: &mut [u8]) -> Result<Recv, PlatformError> {
        let _ = (conn, buf);
        Err(PlatformError::Unsupported("tcp sockets"))
    }
    /// Send all of `bytes`, waiting at most a few seconds for a slow reader; an error
    /// when the peer has gone or does not read.
    fn tcp_send(&self, conn: Socket, bytes: &[u8]) -> Result<(), PlatformError> {
        let _ = (conn, bytes);
        Err(PlatformError::Unsupported("tcp sockets"))
    }
    /// Close `sock` (after sent data is delivered where the OS allows).
    fn tcp_close(&self, sock: Socket) {
        let _ = sock;
    }
    /// Pause the calling thread (the server loop when idle).
    fn sleep_ms(&self, ms: u32) {
        let _ = ms;
    }
}

/// A platform whose single "file" is a byte slice in memory; one worker; scalar CPU
/// unless told otherwise. For tests and bare-metal embedding.
pub struct MemPlatform<'b> {
    pub bytes: &'b [u8],
    pub cpu: CpuFeatures,
}

impl<'b> Platform for MemPlatform<'b> {
    type File = ();
    fn open(&self, _path: &str) -> Result<(), PlatformError> {
        Ok(())
    }
    fn file_size(&self, _file: &()) -> u64 {
        self.bytes.len() as u64
    }
    fn read_at(
        &self,
        _f: &(),
        offset: u64,
        buf: &mut [u8],
        _direct: bool,
    ) -> Result<usize, PlatformError> {
        let len = self.bytes.len() as u64;
        if offset >= len {
            return Ok(0);
        }
        let start = offset as usize;
        let n = buf.len().min(self.bytes.len() - start);
        buf[..n].copy_from_slice(&self.bytes[start..start + n]);
        Ok(n)
    }
    fn map<'f>(&self, _file: &'f (), _offset: u64, _len: usize) -> Option<&'f [u8]> {
        None
    }
    fn region(&self, _bytes: usize) -> Result<&'static mut [u8], PlatformError> {
        Err(PlatformError::Unsupported(
            "MemPlatform has no region; lend one to Arena::new",
        ))
    }
    fn available_memory(&self) -> Option<u64> {
        None
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
        for i in 0..n {
            f(i);
        }
    }
    fn cpu(&self) -> CpuFeatures {
        self.cpu
    }
    fn now_ns(&self) -> u64 {
        0
    }
    fn stdout(&self, _bytes: &[u8]) {}
    fn stderr(&self, _bytes: &[u8]) {}
}
