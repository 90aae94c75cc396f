//! `cargo xtask soak --minutes N [--model PATH] [--clients C]`: a long run of mixed
//! traffic against `pinch serve` on 127.0.0.1 (not in CI; the note quotes a run).
//!
//! C clients (default 20) each loop until the time is up, picking one scenario at a time
//! from a fixed-seed generator:
//! - good (about half): `/completion` and `/v1/completions` not streamed,
//!   `/v1/chat/completions` streamed, `/health`. A good request passes when it gets a
//!   well-formed 200 (a streamed one ends with `data: [DONE]`, a plain one carries its
//!   result), or a clean 503 with `Retry-After` (queue or connection table full);
//!   anything else (another status, a cut body, a reset, no answer in 60 s) is a
//!   failure, printed with what was sent.
//! - hostile: malformed JSON (expects 400), a body over the limit (413), a prompt longer
//!   than the context (400), a sender that stalls mid-head (408 after the server's 10 s),
//!   a sender that drips a valid request over 2 s, a client that disconnects after the
//!   first streamed event, and an idle connection that is opened and never written.
//!   Their answers are counted by status; a hostile request that gets a 5xx other than
//!   503, or no answer, is a failure too.
//!
//! Every minute it prints the counts by scenario and status, p50/p99 latency of good
//! requests, and the server's RSS (`/proc/PID/status`); at the end the peak RSS (VmHWM),
//! whether the server is alive and answers `/health`, and fails if any good request
//! failed. All traffic goes to 127.0.0.1, bounded by the clients and the minutes.
use crate::util::{cargo, root, run, target_dir, Result};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Context the server runs with (the "longer than the context" prompts exceed it).
const N_CTX: &str = "256";

/// Counts and latencies shared by the clients.
#[derive(Default)]
struct Stats {
    /// (scenario, status or outcome) -> count.
    counts: BTreeMap<(&'static str, String), u64>,
    /// Latency in ms of good requests answered 200.
    latency_ms: Vec<f64>,
    good_failed: u64,
    hostile_failed: u64,
    /// The first failures, for the report.
    failures: Vec<String>,
}

impl Stats {
    fn count(&mut self, scenario: &'static str, outcome: String) {
        *self.counts.entry((scenario, outcome)).or_default() += 1;
    }
    fn fail(&mut self, good: bool, what: String) {
        if good {
            self.good_failed += 1;
        } else {
            self.hostile_failed += 1;
        }
        if self.failures.len() < 20 {
            self.failures.push(what);
        }
    }
}

/// What a scenario saw.
enum Seen {
    /// A complete response (status, head, body).
    Answer(u16, String, Vec<u8>),
    /// The client hung up on purpose (disconnect mid-stream, idle connection closed by us).
    LeftOnPurpose,
    /// The connection broke or timed out before a complete answer.
    Broken(String),
}

struct Opts {
    minutes: f64,
    model: String,
    clients: usize,
}

fn parse(args: &[String]) -> Result<Opts> {
    let usage = "usage: cargo xtask soak --minutes N [--model PATH] [--clients C]";
    let mut o = Opts {
        minutes: 0.0,
        model: root()
            .join("tests/data/tiny/tiny-qwen3-Q8_0.gguf")
            .to_string_lossy()
            .into_owned(),
        clients: 20,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or(usage)?;
        match a.as_str() {
            "--minutes" => o.minutes = v.parse().map_err(|_| usage)?,
            "--model" => o.model = v.clone(),
            "--clients" => o.clients = v.parse().map_err(|_| usage)?,
            _ => return Err(format!("unknown argument `{a}`\n{usage}")),
        }
    }
    if o.minutes.is_nan() || o.minutes <= 0.0 || o.clients == 0 || o.clients > 200 {
        return Err(usage.into());
    }
    Ok(o)
}

pub fn main(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    run(&mut cargo([
        "build",
        "--release",
        "-p",
        "pinch-linux",
        "--bin",
        "pinch",
    ]))?;
    let bin = target_dir().join("release/pinch");
    let (mut child, port) = start_server(&bin, &o.model)?;
    let pid = child.id();
    eprintln!(
        "soak: pinch serve (pid {pid}) on 127.0.0.1:{port}, {} clients, {} min, model {}",
        o.clients, o.minutes, o.model
    );
    let stats = Arc::new(Mutex::new(Stats::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let end = Instant::now() + Duration::from_secs_f64(o.minutes * 60.0);
    let clients: Vec<_> = (0..o.clients)
        .map(|c| {
            let (stats, stop) = (stats.clone(), stop.clone());
            std::thread::spawn(move || client(c as u64, port, end, &stats, &stop))
        })
        .collect();
    let start = Instant::now();
    let mut rss_log = Vec::new();
    let mut minute = 0u64;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(500));
        if child.try_wait().map_or(true, |s| s.is_some()) {
            eprintln!("soak: the server exited");
            break;
        }
        if start.elapsed() >= Duration::from_secs(60 * (minute + 1)) {
            minute += 1;
            let rss = proc_kib(pid, "VmRSS:").unwrap_or(0);
            rss_log.push(rss);
            report(&format!("minute {minute}"), &stats.lock().unwrap(), rss);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.join();
    }
    let alive = child.try_wait().is_ok_and(|s| s.is_none());
    let health = alive
        && matches!(
            request(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 10),
            Seen::Answer(200, ..)
        );
    let rss = proc_kib(pid, "VmRSS:").unwrap_or(0);
    let peak = proc_kib(pid, "VmHWM:").unwrap_or(0);
    let st = stats.lock().unwrap();
    report("end", &st, rss);
    println!(
        "RSS per minute (MiB): {}",
        rss_log
            .iter()
            .map(|k| format!("{:.1}", *k as f64 / 1024.0))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "peak RSS {:.1} MiB; server alive at the end: {alive}; /health: {}",
        peak as f64 / 1024.0,
        if health { 200 } else { 0 }
    );
    for f in &st.failures {
        println!("failure: {f}");
    }
    let _ = child.kill();
    let _ = child.wait();
    if !alive || !health {
        return Err("the server did not survive the soak".into());
    }
    if st.good_failed > 0 || st.hostile_failed > 0 {
        return Err(format!(
            "{} good and {} hostile requests failed (see above)",
            st.good_failed, st.hostile_failed
        ));
    }
    Ok(())
}

fn start_server(bin: &std::path::Path, model: &str) -> Result<(Child, u16)> {
    let mut child = Command::new(bin)
        .args(["serve", "-m", model, "--host", "127.0.0.1", "--port", "0"])
        .args(["-t", "1", "-c", N_CTX, "--budget", "96M", "--queue", "4"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let mut err = child.stderr.take().ok_or("no stderr")?;
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    let port = loop {
        if err.read(&mut byte).unwrap_or(0) == 0 {
            let _ = child.kill();
            return Err(format!(
                "pinch serve did not start: {}",
                String::from_utf8_lossy(&seen)
            ));
        }
        seen.push(byte[0]);
        let text = String::from_utf8_lossy(&seen);
        if let Some(rest) = text.split("http://127.0.0.1:").nth(1) {
            if let Some(p) = rest.split('/').next().filter(|_| rest.contains('/')) {
                break p.parse::<u16>().map_err(|e| format!("port `{p}`: {e}"))?;
            }
        }
    };
    // Keep draining the server's stderr so it never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = err.read_to_end(&mut sink);
    });
    Ok((child, port))
}

/// A kB figure from `/proc/PID/status`.
fn proc_kib(pid: u32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn report(when: &str, st: &Stats, rss_kib: u64) {
    let mut lat = st.latency_ms.clone();
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() - 1) as f64 * p).round() as usize]
        }
    };
    let total: u64 = st.counts.values().sum();
    println!(
        "[{when}] {total} requests; good answered 200: {}, p50 {:.0} ms, p99 {:.0} ms; failed good {} hostile {}; RSS {:.1} MiB",
        lat.len(),
        pct(0.5),
        pct(0.99),
        st.good_failed,
        st.hostile_failed,
        rss_kib as f64 / 1024.0
    );
    let mut line = String::new();
    for ((scenario, outcome), n) in &st.counts {
        line.push_str(&format!(" {scenario}:{outcome}={n}"));
    }
    println!("  by status:{line}");
}

/// A small deterministic generator (xorshift), one per client.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn client(c: u64, port: u16, end: Instant, stats: &Mutex<Stats>, stop: &AtomicBool) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (c + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut n = 0u64;
    while Instant::now() < end && !stop.load(Ordering::Relaxed) {
        n += 1;
        let pick = rng.next() % 100;
        let t = Instant::now();
        let (scenario, good, seen) = match pick {
            0..=19 => {
                let body = format!(
                    r#"{{"prompt":"client {c} request {n}: once upon a time","n_predict":12,"seed":{n}}}"#
                );
                (
                    "completion",
                    true,
                    request(port, &post("/completion", &body), 60),
                )
            }
            20..=29 => {
                let body = format!(
                    r#"{{"prompt":"The {n}th story","max_tokens":8,"temperature":0.8,"stop":["\n\n"]}}"#
                );
                (
                    "v1-completions",
                    true,
                    request(port, &post("/v1/completions", &body), 60),
                )
            }
            30..=44 => {
                let body = format!(
                    r#"{{"messages":[{{"role":"system","content":"Be brief."}},{{"role":"user","content":"Say {n}"}}],"max_tokens":10,"stream":true}}"#
                );
                (
                    "chat-stream",
                    true,
                    request(port, &post("/v1/chat/completions", &body), 60),
                )
            }
            45..=49 => (
                "health",
                true,
                request(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 60),
            ),
            50..=57 => {
                let body = r#"{"prompt": "unterminated, "n_predict": [1,"#;
                (
                    "bad-json",
                    false,
                    request(port, &post("/completion", body), 60),
                )
            }
            58..=63 => ("huge-body", false, huge_body(port)),
            64..=71 => {
                let long = "many words here ".repeat(200);
                let body = format!(r#"{{"prompt":"{long}","n_predict":4}}"#);
                (
                    "over-context",
                    false,
                    request(port, &post("/completion", &body), 60),
                )
            }
            72..=77 => ("stall-mid-head", false, stall(port)),
            78..=85 => {
                let body = format!(r#"{{"prompt":"slow {n}","n_predict":4}}"#);
                (
                    "slow-sender",
                    true,
                    drip(port, &post("/completion", &body), Duration::from_secs(2)),
                )
            }
            86..=93 => (
                "disconnect-mid-stream",
                false,
                disconnect_mid_stream(port, n),
            ),
            _ => ("idle-connection", false, idle(port, Duration::from_secs(5))),
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let busy = matches!(seen, Seen::Answer(503, ..));
        judge(stats, scenario, good, seen, ms);
        if busy {
            // Retry-After asks for 1 s; wait a random 100-400 ms (as a real client
            // would, shortened so that the queue stays full).
            std::thread::sleep(Duration::from_millis(100 + rng.next() % 300));
        }
    }
}

/// Count what a scenario saw, and decide whether it failed.
fn judge(stats: &Mutex<Stats>, scenario: &'static str, good: bool, seen: Seen, ms: f64) {
    let mut st = stats.lock().unwrap();
    match seen {
        Seen::LeftOnPurpose => st.count(scenario, "left".into()),
        Seen::Broken(why) => {
            st.count(scenario, "broken".into());
            st.fail(good, format!("{scenario}: {why}"));
        }
        Seen::Answer(status, head, body) => {
            st.count(scenario, status.to_string());
            let text = String::from_utf8_lossy(&body);
            let well_formed = match (scenario, status) {
                (_, 503) => head.to_ascii_lowercase().contains("retry-after: 1"),
                ("chat-stream", 200) => text.trim_end().ends_with("data: [DONE]"),
                ("completion" | "slow-sender", 200) => text.contains("\"tokens_predicted\""),
                ("v1-completions", 200) => text.contains("\"choices\""),
                ("health", 200) => true,
                ("bad-json" | "over-context", 400) => text.contains("\"error\""),
                ("huge-body", 413) => true,
                ("stall-mid-head" | "idle-connection", 408) => true,
                (_, 200) => true,
                _ => false,
            };
            if !well_formed {
                let cut: String = text.chars().take(200).collect();
                st.fail(good, format!("{scenario}: status {status}, body {cut:?}"));
            } else if good && status == 200 {
                st.latency_ms.push(ms);
            }
        }
    }
}

fn connect(port: u16, timeout_s: u64) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(10),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(timeout_s)))?;
    s.set_write_timeout(Some(Duration::from_secs(timeout_s)))?;
    Ok(s)
}

/// Read until the server closes; a complete response or why not.
fn read_all(s: &mut TcpStream) -> Seen {
    let mut all = Vec::new();
    match s.read_to_end(&mut all) {
        Ok(_) => answer(all),
        // A reset after a complete error answer (the server closed with our unsent
        // bytes unread) still counts as that answer.
        Err(e) if !all.is_empty() => match answer(all) {
            Seen::Broken(why) => Seen::Broken(format!("{why}; {e}")),
            seen => seen,
        },
        Err(e) => Seen::Broken(format!("read: {e}")),
    }
}

fn answer(all: Vec<u8>) -> Seen {
    let Some(split) = all.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Seen::Broken(format!(
            "no response head in {:?}",
            String::from_utf8_lossy(&all[..all.len().min(100)])
        ));
    };
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    let Some(status) = head.split(' ').nth(1).and_then(|s| s.parse().ok()) else {
        return Seen::Broken(format!("bad status line {head:?}"));
    };
    Seen::Answer(status, head, all[split + 4..].to_vec())
}

fn request(port: u16, raw: &[u8], timeout_s: u64) -> Seen {
    let mut s = match connect(port, timeout_s) {
        Ok(s) => s,
        Err(e) => return Seen::Broken(format!("connect: {e}")),
    };
    if let Err(e) = s.write_all(raw) {
        // The server may answer (503, 413) before reading everything we send.
        let seen = read_all(&mut s);
        return match seen {
            Seen::Answer(..) => seen,
            _ => Seen::Broken(format!("send: {e}")),
        };
    }
    read_all(&mut s)
}

/// A head announcing a 1 MiB body, then as much of it as the server takes.
fn huge_body(port: u16) -> Seen {
    let head = "POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n";
    let mut raw = head.as_bytes().to_vec();
    raw.extend(std::iter::repeat_n(b' ', 1 << 20));
    request(port, &raw, 30)
}

/// Half a request head, then nothing: the server must answer 408 after its timeout.
fn stall(port: u16) -> Seen {
    let mut s = match connect(port, 30) {
        Ok(s) => s,
        Err(e) => return Seen::Broken(format!("connect: {e}")),
    };
    if let Err(e) = s.write_all(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Le") {
        return Seen::Broken(format!("send: {e}"));
    }
    read_all(&mut s)
}

/// A valid request sent a few bytes at a time over `over`.
fn drip(port: u16, raw: &[u8], over: Duration) -> Seen {
    let mut s = match connect(port, 60) {
        Ok(s) => s,
        Err(e) => return Seen::Broken(format!("connect: {e}")),
    };
    let pieces = 20;
    let step = raw.len().div_ceil(pieces);
    for chunk in raw.chunks(step) {
        if let Err(e) = s.write_all(chunk) {
            let seen = read_all(&mut s);
            return match seen {
                Seen::Answer(503, ..) => seen,
                _ => Seen::Broken(format!("send: {e}")),
            };
        }
        std::thread::sleep(over / pieces as u32);
    }
    read_all(&mut s)
}

/// A streamed chat request dropped after its first event (or its 503).
fn disconnect_mid_stream(port: u16, n: u64) -> Seen {
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"Tell me a long story {n}"}}],"max_tokens":200,"stream":true}}"#
    );
    let mut s = match connect(port, 60) {
        Ok(s) => s,
        Err(e) => return Seen::Broken(format!("connect: {e}")),
    };
    if let Err(e) = s.write_all(&post("/v1/chat/completions", &body)) {
        return Seen::Broken(format!("send: {e}"));
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(6).any(|w| w == b"data: ") {
        match s.read(&mut buf) {
            Ok(0) => return answer(got),
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e) => return Seen::Broken(format!("read: {e}")),
        }
        if got.len() >= 12 && !got.starts_with(b"HTTP/1.1 200") {
            // Refused (503): read the whole answer.
            let _ = s.read_to_end(&mut got);
            return answer(got);
        }
    }
    drop(s);
    Seen::LeftOnPurpose
}

/// A connection opened and never written, held for `hold`.
fn idle(port: u16, hold: Duration) -> Seen {
    let mut s = match connect(port, hold.as_secs().max(1)) {
        Ok(s) => s,
        Err(e) => return Seen::Broken(format!("connect: {e}")),
    };
    let mut buf = [0u8; 512];
    match s.read(&mut buf) {
        // The server closed it or answered (503 when the table is full, 408 later).
        Ok(0) => Seen::LeftOnPurpose,
        Ok(k) => {
            let mut all = buf[..k].to_vec();
            let _ = s.read_to_end(&mut all);
            answer(all)
        }
        // Our own hold ran out first: hang up.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Seen::LeftOnPurpose
        }
        Err(e) => Seen::Broken(format!("read: {e}")),
    }
}
