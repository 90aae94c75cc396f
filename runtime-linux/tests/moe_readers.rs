//! The expert pager's reads on the Linux platform's persistent reader pool
//! (`--moe-readers`), with storage that fails: `pinch run` in-process on a
//! [`LinuxPlatform`] wrapped in the engine's [`FaultInjector`], an `EIO` on the rows of
//! one expert. The run must stop with an error naming that expert, its layer and its
//! tensors, never hang or panic; a clean run gives the text the all-resident run does.
use std::sync::Mutex;

use pinch_kernels::CpuFeatures;
use pinch_linux::LinuxPlatform;
use pinch_runtime_min::commands;
use pinch_runtime_min::fault::{FaultInjector, Faults};
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::platform::{Platform, PlatformError};

const MODEL: &str = "tiny-qwen3moe-Q8_0.gguf";

fn model_path() -> String {
    format!("{}/../tests/data/tiny/{MODEL}", env!("CARGO_MANIFEST_DIR"))
}

/// [`LinuxPlatform`] with its standard output and error kept.
struct Capture {
    inner: LinuxPlatform,
    out: Mutex<Vec<u8>>,
    err: Mutex<Vec<u8>>,
}

impl Platform for Capture {
    type File = <LinuxPlatform as Platform>::File;
    fn open(&self, path: &str) -> Result<Self::File, PlatformError> {
        self.inner.open(path)
    }
    fn file_size(&self, f: &Self::File) -> u64 {
        self.inner.file_size(f)
    }
    fn read_at(
        &self,
        f: &Self::File,
        offset: u64,
        buf: &mut [u8],
        direct: bool,
    ) -> Result<usize, PlatformError> {
        self.inner.read_at(f, offset, buf, direct)
    }
    fn map<'f>(&self, f: &'f Self::File, offset: u64, len: usize) -> Option<&'f [u8]> {
        self.inner.map(f, offset, len)
    }
    fn region(&self, bytes: usize) -> Result<&'static mut [u8], PlatformError> {
        self.inner.region(bytes)
    }
    fn available_memory(&self) -> Option<u64> {
        self.inner.available_memory()
    }
    fn rss(&self) -> Option<u64> {
        self.inner.rss()
    }
    fn peak_rss(&self) -> Option<u64> {
        self.inner.peak_rss()
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
    fn wait_while(&self, word: &std::sync::atomic::AtomicU32, value: u32) {
        self.inner.wait_while(word, value)
    }
    fn wake_all(&self) {
        self.inner.wake_all()
    }
    fn now_ns(&self) -> u64 {
        self.inner.now_ns()
    }
    fn sleep_ms(&self, ms: u32) {
        self.inner.sleep_ms(ms)
    }
    fn stdout(&self, b: &[u8]) {
        self.out.lock().unwrap().extend_from_slice(b);
    }
    fn stderr(&self, b: &[u8]) {
        self.err.lock().unwrap().extend_from_slice(b);
    }
}

/// `pinch run` on `MODEL` with `extra`, storage failing as `faults` says: exit code,
/// standard output and standard error.
fn run(faults: &Faults, extra: &[&str]) -> (i32, String, String) {
    let p = FaultInjector::new(
        Capture {
            inner: LinuxPlatform::with_workers(1).unwrap(),
            out: Mutex::new(Vec::new()),
            err: Mutex::new(Vec::new()),
        },
        faults,
    );
    let mut region = vec![0u64; (96 << 20) / 8];
    let region = pinch_kernels::blocks::bytes_of_mut(&mut region[..]);
    let path = model_path();
    let mut argv = vec![
        "run", "-m", &path, "-p", "abc def", "-n", "4", "--temp", "0", "-t", "1",
    ];
    argv.extend_from_slice(extra);
    let code = commands::main(&p, &argv, region);
    let text = |m: &Mutex<Vec<u8>>| String::from_utf8_lossy(&m.lock().unwrap()).into_owned();
    (code, text(&p.inner.out), text(&p.inner.err))
}

/// A `--budget` whose plan pages every MoE layer: a little over the least it needs.
fn paging_budget() -> String {
    let (code, _, err) = run(&Faults::new(), &["--budget", "1M"]);
    assert_eq!(code, 1, "{err}");
    let need: f64 = err
        .split("needs at least ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no least budget in {err}"));
    format!("{}K", ((need + 0.2) * 1024.0) as u64)
}

#[test]
fn a_failing_read_on_the_reader_pool_names_the_expert_and_the_pool_text_is_resident() {
    let bytes = std::fs::read(model_path()).unwrap();
    let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
    let budget = paging_budget();
    let (code, resident, err) = run(&Faults::new(), &[]);
    assert_eq!(code, 0, "{err}");
    let (code, paged, err) = run(&Faults::new(), &["--budget", &budget, "--moe-readers", "4"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(paged, resident, "paged on the reader pool: another text");
    // The gate rows of each expert of layer 1 in turn; the experts the prompt routes to
    // are read (the pool holds at most a slot or two), so some runs must fail.
    let gate = g.tensor("blk.1.ffn_gate_exps.weight").unwrap();
    let n_expert = 4u64;
    let per = gate.bytes / n_expert;
    let mut failed = 0;
    for e in 0..n_expert {
        let f = Faults::new();
        f.path_filter(MODEL)
            .eio_at(Some(gate.offset + e * per + per / 2));
        let (code, _, err) = run(&f, &["--budget", &budget, "--moe-readers", "4"]);
        if code == 0 {
            continue;
        }
        failed += 1;
        assert_eq!(code, 1, "{err}");
        let want = format!("reading expert {e} of layer 1 (blk.1.ffn_*_exps.weight) failed");
        assert!(err.contains(&want), "expert {e}: {err}");
    }
    assert!(failed > 0, "no failing read was reached");
}
