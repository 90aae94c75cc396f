//! Shared by the `pinch serve` tests: start the server on a free loopback port with a
//! tiny fixture model, and a small HTTP/1.1 client (one request per connection, as the
//! server closes after each response).
#![allow(dead_code)]
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const MODEL: &str = "tiny-qwen3-Q8_0";

/// Run the `pinch` binary with `args` and its output, asserting it succeeded.
pub fn pinch_ok(args: &[&str]) -> std::process::Output {
    let o = Command::new(env!("CARGO_BIN_EXE_pinch"))
        .args(args)
        .output()
        .expect("run pinch");
    assert!(
        o.status.success(),
        "pinch {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

pub fn model_path(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/tiny")
        .join(format!("{name}.gguf"))
        .to_string_lossy()
        .into_owned()
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A running `pinch serve`; killed on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Server {
    /// Start `pinch serve -m MODEL --port 0 <extra>` and wait for its address.
    pub fn start(extra: &[&str]) -> Server {
        Server::start_model(MODEL, extra)
    }

    pub fn start_model(model: &str, extra: &[&str]) -> Server {
        let path = model_path(model);
        let mut args = vec![
            "serve",
            "-m",
            &path,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "-t",
            "1",
        ];
        args.extend_from_slice(extra);
        let mut child = Command::new(env!("CARGO_BIN_EXE_pinch"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start pinch serve");
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut port = 0u16;
        let mut line = String::new();
        while err.read_line(&mut line).unwrap_or(0) > 0 {
            log.lock().unwrap().push_str(&line);
            if let Some(rest) = line.split("http://127.0.0.1:").nth(1) {
                port = rest.split('/').next().unwrap().parse().unwrap();
                break;
            }
            line.clear();
        }
        assert_ne!(port, 0, "server did not start: {}", log.lock().unwrap());
        let l2 = log.clone();
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = err.read_to_string(&mut rest);
            l2.lock().unwrap().push_str(&rest);
        });
        Server { child, port, log }
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// The server's peak RSS (VmHWM) in bytes.
    pub fn peak_rss(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    }

    pub fn get(&self, path: &str) -> Resp {
        request(
            self.port,
            &format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"),
        )
    }

    pub fn post(&self, path: &str, body: &str) -> Resp {
        request(self.port, &post_text(path, body))
    }

    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        let r = self.post(path, &body.to_string());
        let v = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&r.body)));
        (r.status, v)
    }

    /// The value of metric `name` on `/metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        let r = self.get("/metrics");
        let text = String::from_utf8(r.body).unwrap();
        let line = text
            .lines()
            .find(|l| l.split(' ').next() == Some(name))
            .unwrap_or_else(|| panic!("{name} not in {text}"));
        line.split(' ').nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn post_text(path: &str, body: &str) -> String {
    format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
}

/// A parsed response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
    /// The `data:` payloads of a server-sent event stream.
    pub fn events(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.body)
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: ").map(str::to_string))
            .collect()
    }
    /// The JSON events of an OpenAI stream, checking that it ends with `[DONE]`.
    pub fn chunks(&self) -> Vec<serde_json::Value> {
        let ev = self.events();
        assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
        ev[..ev.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect()
    }
}

pub fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s
}

/// Send raw request bytes and read the whole response (until the server closes).
pub fn request(port: u16, raw: &str) -> Resp {
    request_bytes(port, raw.as_bytes())
}

pub fn request_bytes(port: u16, raw: &[u8]) -> Resp {
    let mut s = connect(port);
    s.write_all(raw).expect("send request");
    read_response(&mut s)
}

pub fn read_response(s: &mut TcpStream) -> Resp {
    let mut all = Vec::new();
    s.read_to_end(&mut all).expect("read response");
    parse_response(&all)
}

pub fn parse_response(all: &[u8]) -> Resp {
    let split = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(all)));
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    Resp {
        status,
        head,
        body: all[split + 4..].to_vec(),
    }
}

/// Wait until `f` holds (or panic after `secs`).
pub fn wait_for(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
