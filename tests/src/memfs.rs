//! [`MemFs`]: an in-memory platform with several files, atomic `write_file`, captured
//! output, a settable available memory and scripted loopback connections, so that
//! whole commands (`pinch_runtime_min::commands::main`) run in-process under a
//! [`pinch_runtime_min::fault::FaultInjector`].
//!
//! Files are snapshots: `open` hands out the contents at that moment and `write_file`
//! replaces them as a whole, as a rename over the old file does, so a reader never sees
//! a half-written file. Connections are scripted: [`MemFs::connect`] queues a client
//! that sends its bytes at once and then waits, and [`MemFs::response`] returns what the
//! server sent once it closed the connection.
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pinch_kernels::CpuFeatures;
use pinch_runtime_min::platform::{Platform, PlatformError, Recv, Socket};

/// An open file: its path and the bytes it had when opened.
pub struct MemFile {
    pub path: String,
    pub bytes: Arc<Vec<u8>>,
}

#[derive(Default)]
struct Conn {
    input: Vec<u8>,
    read: usize,
    output: Vec<u8>,
    closed: bool,
}

#[derive(Default)]
struct Net {
    pending: VecDeque<u32>,
    conns: Vec<Conn>,
}

/// See the module doc.
pub struct MemFs {
    files: Mutex<HashMap<String, Arc<Vec<u8>>>>,
    pub out: Mutex<Vec<u8>>,
    pub err: Mutex<Vec<u8>>,
    /// What `available_memory` reports.
    pub available: Mutex<Option<u64>>,
    pub cpu: CpuFeatures,
    start: Instant,
    net: Mutex<Net>,
}

/// `ENOENT`.
const ENOENT: i32 = 2;
/// Socket number of the listener.
const LISTENER: u32 = u32::MAX;

impl MemFs {
    /// No files, 4 GiB available, the host's CPU features.
    pub fn new() -> MemFs {
        MemFs {
            files: Mutex::new(HashMap::new()),
            out: Mutex::new(Vec::new()),
            err: Mutex::new(Vec::new()),
            available: Mutex::new(Some(4 << 30)),
            cpu: crate::host_cpu(),
            start: Instant::now(),
            net: Mutex::new(Net::default()),
        }
    }
    /// Create or replace `path`.
    pub fn put(&self, path: &str, bytes: Vec<u8>) {
        self.files
            .lock()
            .unwrap()
            .insert(path.to_string(), Arc::new(bytes));
    }
    /// The contents of `path`, if it exists.
    pub fn get(&self, path: &str) -> Option<Arc<Vec<u8>>> {
        self.files.lock().unwrap().get(path).cloned()
    }
    /// Delete `path`.
    pub fn remove(&self, path: &str) {
        self.files.lock().unwrap().remove(path);
    }
    /// Paths of all files.
    pub fn paths(&self) -> Vec<String> {
        self.files.lock().unwrap().keys().cloned().collect()
    }
    /// Standard output and error so far, and clear them.
    pub fn take_output(&self) -> (String, String) {
        let o = std::mem::take(&mut *self.out.lock().unwrap());
        let e = std::mem::take(&mut *self.err.lock().unwrap());
        (
            String::from_utf8_lossy(&o).into_owned(),
            String::from_utf8_lossy(&e).into_owned(),
        )
    }
    /// Queue a client that sends `request`; its connection number.
    pub fn connect(&self, request: &[u8]) -> usize {
        let mut n = self.net.lock().unwrap();
        n.conns.push(Conn {
            input: request.to_vec(),
            ..Conn::default()
        });
        let i = n.conns.len() - 1;
        n.pending.push_back(i as u32);
        i
    }
    /// What the server sent on connection `i`, once it closed it.
    pub fn response(&self, i: usize) -> Option<Vec<u8>> {
        let n = self.net.lock().unwrap();
        let c = &n.conns[i];
        c.closed.then(|| c.output.clone())
    }
    /// Wait up to `secs` for [`Self::response`].
    pub fn wait_response(&self, i: usize, secs: u64) -> Vec<u8> {
        let t = Instant::now();
        loop {
            if let Some(r) = self.response(i) {
                return r;
            }
            assert!(
                t.elapsed() < Duration::from_secs(secs),
                "connection {i}: no complete response in {secs} s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Default for MemFs {
    fn default() -> Self {
        MemFs::new()
    }
}

impl Platform for MemFs {
    type File = MemFile;

    fn open(&self, path: &str) -> Result<MemFile, PlatformError> {
        let bytes = self.get(path).ok_or(PlatformError::Open { code: ENOENT })?;
        Ok(MemFile {
            path: path.to_string(),
            bytes,
        })
    }
    fn file_size(&self, f: &MemFile) -> u64 {
        f.bytes.len() as u64
    }
    fn read_at(
        &self,
        f: &MemFile,
        offset: u64,
        buf: &mut [u8],
        _direct: bool,
    ) -> Result<usize, PlatformError> {
        let b = &f.bytes;
        let start = (offset.min(b.len() as u64)) as usize;
        let n = buf.len().min(b.len() - start);
        buf[..n].copy_from_slice(&b[start..start + n]);
        Ok(n)
    }
    fn map<'f>(&self, _f: &'f MemFile, _offset: u64, _len: usize) -> Option<&'f [u8]> {
        None
    }
    fn write_file(&self, path: &str, parts: &[&[u8]]) -> Result<(), PlatformError> {
        self.put(path, parts.concat());
        Ok(())
    }
    fn region(&self, bytes: usize) -> Result<&'static mut [u8], PlatformError> {
        Err(PlatformError::OutOfMemory { requested: bytes })
    }
    fn available_memory(&self) -> Option<u64> {
        *self.available.lock().unwrap()
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
        self.start.elapsed().as_nanos() as u64
    }
    fn stdout(&self, bytes: &[u8]) {
        self.out.lock().unwrap().extend_from_slice(bytes);
    }
    fn stderr(&self, bytes: &[u8]) {
        self.err.lock().unwrap().extend_from_slice(bytes);
    }
    fn tcp_listen(&self, _host: &str, _port: u16) -> Result<(Socket, u16), PlatformError> {
        Ok((Socket(LISTENER), 8080))
    }
    fn tcp_accept(&self, _listener: Socket) -> Result<Option<Socket>, PlatformError> {
        Ok(self.net.lock().unwrap().pending.pop_front().map(Socket))
    }
    fn tcp_recv(&self, conn: Socket, buf: &mut [u8]) -> Result<Recv, PlatformError> {
        let mut n = self.net.lock().unwrap();
        let c = &mut n.conns[conn.0 as usize];
        if c.closed {
            return Ok(Recv::Closed);
        }
        let k = buf.len().min(c.input.len() - c.read);
        if k == 0 {
            return Ok(Recv::Pending);
        }
        buf[..k].copy_from_slice(&c.input[c.read..c.read + k]);
        c.read += k;
        Ok(Recv::Data(k))
    }
    fn tcp_send(&self, conn: Socket, bytes: &[u8]) -> Result<(), PlatformError> {
        let mut n = self.net.lock().unwrap();
        n.conns[conn.0 as usize].output.extend_from_slice(bytes);
        Ok(())
    }
    fn tcp_close(&self, sock: Socket) {
        if sock.0 != LISTENER {
            self.net.lock().unwrap().conns[sock.0 as usize].closed = true;
        }
    }
    fn sleep_ms(&self, ms: u32) {
        std::thread::sleep(Duration::from_millis(ms as u64));
    }
}
