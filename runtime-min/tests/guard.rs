//! The memory guard inside `pinch run` and `pinch serve`, on a fake platform whose
//! available memory follows a script (one reading per guard check), so the token at
//! which memory "runs out" is known exactly.
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use pinch_kernels::CpuFeatures;
use pinch_runtime_min::commands;
use pinch_runtime_min::platform::{Platform, PlatformError, Recv, Socket};

const M: u64 = 1 << 20;

/// The model "file" is in memory; stdout/stderr are recorded; sockets are scripted
/// (every connection is waiting at the first accept, with its whole request).
struct Fake {
    model: Vec<u8>,
    avail: Vec<u64>,
    reads: AtomicUsize,
    out: Mutex<Vec<u8>>,
    err: Mutex<Vec<u8>>,
    pending: Mutex<VecDeque<u32>>,
    input: Mutex<Vec<Vec<u8>>>,
    sent: Mutex<Vec<Vec<u8>>>,
    closed: Mutex<Vec<bool>>,
    idle: AtomicUsize,
}

/// Unwinds out of the server loop (which never returns) once every connection closed.
struct ServerDone;

impl Fake {
    fn new(model: &str, avail: &[u64], conns: &[&str]) -> Fake {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/tiny")
            .join(model);
        let mut input = vec![Vec::new()];
        input.extend(conns.iter().map(|c| c.as_bytes().to_vec()));
        Fake {
            model: std::fs::read(path).unwrap(),
            avail: avail.to_vec(),
            reads: AtomicUsize::new(0),
            out: Mutex::new(Vec::new()),
            err: Mutex::new(Vec::new()),
            pending: Mutex::new((1..=conns.len() as u32).collect()),
            sent: Mutex::new(vec![Vec::new(); conns.len() + 1]),
            closed: Mutex::new(vec![false; conns.len() + 1]),
            input: Mutex::new(input),
            idle: AtomicUsize::new(0),
        }
    }
    fn err(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().unwrap()).into_owned()
    }
    fn sent(&self, c: usize) -> String {
        String::from_utf8_lossy(&self.sent.lock().unwrap()[c]).into_owned()
    }
}

impl Platform for Fake {
    type File = ();
    fn open(&self, _: &str) -> Result<(), PlatformError> {
        Ok(())
    }
    fn file_size(&self, _: &()) -> u64 {
        self.model.len() as u64
    }
    fn read_at(&self, _: &(), off: u64, buf: &mut [u8], _: bool) -> Result<usize, PlatformError> {
        let off = (off as usize).min(self.model.len());
        let n = buf.len().min(self.model.len() - off);
        buf[..n].copy_from_slice(&self.model[off..off + n]);
        Ok(n)
    }
    fn map<'f>(&self, _: &'f (), _: u64, _: usize) -> Option<&'f [u8]> {
        None
    }
    fn region(&self, _: usize) -> Result<&'static mut [u8], PlatformError> {
        Err(PlatformError::Unsupported("fake"))
    }
    /// The script's next reading; its last value once it runs out.
    fn available_memory(&self) -> Option<u64> {
        let i = self.reads.fetch_add(1, Ordering::SeqCst);
        self.avail.get(i).or(self.avail.last()).copied()
    }
    fn rss(&self) -> Option<u64> {
        None
    }
    fn peak_rss(&self) -> Option<u64> {
        Some(5 * M)
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
    fn stdout(&self, b: &[u8]) {
        self.out.lock().unwrap().extend_from_slice(b)
    }
    fn stderr(&self, b: &[u8]) {
        self.err.lock().unwrap().extend_from_slice(b)
    }
    fn tcp_listen(&self, _: &str, _: u16) -> Result<(Socket, u16), PlatformError> {
        Ok((Socket(0), 4321))
    }
    fn tcp_accept(&self, _: Socket) -> Result<Option<Socket>, PlatformError> {
        Ok(self.pending.lock().unwrap().pop_front().map(Socket))
    }
    fn tcp_recv(&self, c: Socket, buf: &mut [u8]) -> Result<Recv, PlatformError> {
        let mut input = self.input.lock().unwrap();
        let inp = &mut input[c.0 as usize];
        if inp.is_empty() {
            return Ok(Recv::Pending);
        }
        let n = inp.len().min(buf.len());
        buf[..n].copy_from_slice(&inp[..n]);
        inp.drain(..n);
        Ok(Recv::Data(n))
    }
    fn tcp_send(&self, c: Socket, bytes: &[u8]) -> Result<(), PlatformError> {
        self.sent.lock().unwrap()[c.0 as usize].extend_from_slice(bytes);
        Ok(())
    }
    fn tcp_close(&self, c: Socket) {
        self.closed.lock().unwrap()[c.0 as usize] = true;
    }
    fn sleep_ms(&self, _: u32) {
        let all_closed = self.closed.lock().unwrap()[1..].iter().all(|&c| c);
        if all_closed || self.idle.fetch_add(1, Ordering::SeqCst) > 10_000 {
            std::panic::resume_unwind(Box::new(ServerDone));
        }
    }
}

fn region() -> Vec<u8> {
    vec![0u8; 64 << 20]
}

#[test]
fn run_stops_at_the_token_where_memory_falls_under_the_floor() {
    // Readings: before the prompt, then before each token's pass. The fifth (after
    // token 4) is under the floor: cache is given back, the sixth is still under: stop.
    let p = Fake::new(
        "tiny-llama-Q8_0.gguf",
        &[900 * M, 900 * M, 900 * M, 900 * M, 50 * M, 40 * M],
        &[],
    );
    let args = [
        "run",
        "-m",
        "tiny.gguf",
        "-p",
        "abc",
        "-n",
        "12",
        "--temp",
        "0",
        "--ignore-eos",
        "--json",
        "--guard",
        "100M",
    ];
    let code = commands::main(&p, &args, &mut region());
    assert_eq!(code, 1, "{}", p.err());
    assert_eq!(p.reads.load(Ordering::SeqCst), 6);
    let err = p.err();
    assert!(
        err.contains(
            "pinch: available memory 50 MiB is below the --guard floor 100 MiB: no cache to give back"
        ),
        "{err}"
    );
    assert!(
        err.ends_with(
            "pinch: stopped: available memory 40 MiB is below the --guard floor 100 MiB\n"
        ),
        "{err}"
    );
    let out = String::from_utf8(p.out.lock().unwrap().clone()).unwrap();
    let json = out.lines().rev().find(|l| l.starts_with('{')).unwrap();
    assert!(json.contains("\"gen_tokens\":4,"), "{json}");

    // The same run with memory that recovers after the give-back goes to the end.
    let p = Fake::new(
        "tiny-llama-Q8_0.gguf",
        &[900 * M, 900 * M, 50 * M, 900 * M],
        &[],
    );
    assert_eq!(commands::main(&p, &args, &mut region()), 0, "{}", p.err());
    let out = String::from_utf8(p.out.lock().unwrap().clone()).unwrap();
    assert!(out.contains("\"gen_tokens\":12,"), "{out}");
    assert!(out.contains("\"stopped\":null"), "{out}");
}

fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn server_stops_a_stream_with_an_error_event_then_serves_the_next_request() {
    let stream = post(
        "/completion",
        r#"{"prompt":"abc","n_predict":10,"ignore_eos":true,"stream":true}"#,
    );
    let plain = post(
        "/v1/completions",
        r#"{"prompt":"abc","max_tokens":3,"ignore_eos":true}"#,
    );
    // Request 1: fine before the prompt and for 3 tokens, then under the floor twice.
    // Request 2: memory is back.
    let p = Fake::new(
        "tiny-qwen3-Q8_0.gguf",
        &[900 * M, 900 * M, 900 * M, 900 * M, 50 * M, 40 * M, 900 * M],
        &[&stream, &plain],
    );
    let args = [
        "serve",
        "-m",
        "tiny.gguf",
        "--port",
        "0",
        "--guard",
        "100M",
        "-t",
        "1",
    ];
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        commands::main(&p, &args, &mut region())
    }));
    assert!(
        r.err().is_some_and(|e| e.is::<ServerDone>()),
        "the server loop should only end through the fake: {}",
        p.err()
    );
    let s1 = p.sent(1);
    assert!(s1.starts_with("HTTP/1.1 200"), "{s1}");
    let events: Vec<&str> = s1
        .split("\n\n")
        .filter_map(|e| e.split("data: ").nth(1))
        .collect();
    let tokens = events.iter().filter(|e| e.contains("\"tokens\":[")).count();
    assert_eq!(tokens, 4, "{s1}");
    let last = events.last().unwrap();
    assert!(
        last.starts_with("{\"error\":{\"code\":503,\"message\":\"stopped: available memory 40 MiB is below the --guard floor 100 MiB (after 4 generated tokens)\""),
        "{last}"
    );
    assert!(
        !s1.contains("\"stop\":true"),
        "no normal end after the error: {s1}"
    );
    let s2 = p.sent(2);
    assert!(s2.starts_with("HTTP/1.1 200"), "{s2}");
    assert!(s2.contains("\"finish_reason\":\"length\""), "{s2}");
    assert!(p
        .err()
        .contains("pinch: generation 1: stopped: available memory 40 MiB"));
}
