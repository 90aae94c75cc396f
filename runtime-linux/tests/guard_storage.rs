//! The memory guard, peak RSS reports and `pinch bench --storage`, end to end with the
//! real binary. The guard's tests are deterministic: a floor far above any machine's
//! memory (`--guard 1000000G`) must stop every generation at once, and a floor of 1 MiB
//! or 0 (off) must never stop one.
mod server_util;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn pinch(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pinch"))
        .args(args)
        .output()
        .expect("run pinch")
}

fn tiny(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/tiny")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json_line(o: &Output) -> serde_json::Value {
    let s = String::from_utf8_lossy(&o.stdout);
    let line = s
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in {s:?}\nstderr: {}", stderr(o)));
    serde_json::from_str(line).unwrap()
}

fn run_json(guard: &str) -> Output {
    pinch(&[
        "run",
        "-m",
        &tiny("tiny-llama-Q4_K_M.gguf"),
        "-p",
        "abc",
        "-n",
        "6",
        "--temp",
        "0",
        "--ignore-eos",
        "--json",
        "-t",
        "1",
        "--guard",
        guard,
    ])
}

#[test]
fn a_floor_above_all_memory_stops_run_at_once_with_a_message_and_exit_1() {
    let o = run_json("1000000G");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("pinch: stopped: available memory ")
            && e.contains(" MiB is below the --guard floor 1024000000 MiB"),
        "{e}"
    );
    // First it tries to give back cache, then it stops.
    assert!(
        e.contains("no cache to give back") || e.contains("gave back"),
        "{e}"
    );
    let j = json_line(&o);
    assert_eq!(j["gen_tokens"], 0);
    assert!(j["stopped"]
        .as_str()
        .unwrap()
        .contains("below the --guard floor"));
    assert!(e.contains("peak RSS "), "{e}");
}

#[test]
fn a_sane_floor_or_none_lets_run_finish() {
    for guard in ["1M", "0"] {
        let o = run_json(guard);
        assert!(o.status.success(), "--guard {guard}: {}", stderr(&o));
        let j = json_line(&o);
        assert_eq!(j["gen_tokens"], 6, "--guard {guard}");
        assert!(j["stopped"].is_null());
        assert!(!stderr(&o).contains("--guard floor"), "{}", stderr(&o));
    }
    let o = pinch(&["run", "--guard", "much"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("bad value 'much' for '--guard'"));
}

#[test]
fn chat_stops_the_answer_keeps_going_and_reports_peak_rss() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pinch"))
        .args([
            "chat",
            "-m",
            &tiny("tiny-qwen3-Q8_0.gguf"),
            "-n",
            "3",
            "-t",
            "1",
            "--guard",
            "1000000G",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello\nagain\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    // Both turns were stopped (the chat went on after the first), then it ended normally.
    assert_eq!(
        e.matches("pinch: stopped: available memory").count(),
        2,
        "{e}"
    );
    assert!(
        e.trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("peak RSS "),
        "{e}"
    );
}

#[test]
fn bench_on_a_model_ends_with_peak_rss_and_keeps_json_valid() {
    let o = pinch(&[
        "bench",
        "-m",
        &tiny("tiny-llama-Q8_0.gguf"),
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
        "-t",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(json_line(&o)["peak_rss"].as_u64().unwrap() > 0);
    let e = stderr(&o);
    let line = e.lines().find(|l| l.starts_with("peak RSS ")).expect(&e);
    assert!(line.ends_with(" MiB"), "{line}");
}

fn scratch(name: &str, len: usize) -> PathBuf {
    // Next to the test binary (a real disk, where direct reads work) rather than /tmp,
    // which may be tmpfs.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let p = dir.join(format!("{name}-{}", std::process::id()));
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let bytes: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn bench_storage_reads_a_file_without_a_model_and_prints_the_rate_to_reuse() {
    // Not a multiple of the 4 MiB chunk nor of the 4 KiB block.
    let len = (9 << 20) + 12345;
    let f = scratch("storage", len);
    let path = f.to_str().unwrap();
    let o = pinch(&["bench", "--storage", path, "-r", "2", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j = json_line(&o);
    assert_eq!(j["command"], "bench-storage");
    assert_eq!(j["bytes"].as_u64(), Some(len as u64));
    assert_eq!(j["reps"], 2);
    for k in ["direct_mbps", "buffered_first_mbps", "buffered_again_mbps"] {
        assert!(j[k].as_f64().unwrap() > 0.0, "{k}: {j}");
    }
    let bw = j["read_bw"].as_u64().unwrap();
    let direct = j["direct_mbps"].as_f64().unwrap();
    assert!(
        (bw as f64 / 1e6 - direct).abs() < 0.01 * direct + 0.01,
        "{j}"
    );

    let o = pinch(&["bench", "--storage", path, "-r", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.contains("| direct (uncached) | "), "{out}");
    assert!(out.contains("| buffered, first pass | "), "{out}");
    // The printed --read-bw value is accepted by the option it names.
    let rate = out
        .split("--read-bw ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect(&out)
        .to_string();
    let check = pinch(&["run", "--read-bw", &rate, "-m", "/nonexistent.gguf"]);
    assert_eq!(check.status.code(), Some(1), "{}", stderr(&check));
    assert!(!stderr(&check).contains("bad value"), "{}", stderr(&check));
    assert!(stderr(&o).contains("peak RSS "));
    let _ = std::fs::remove_file(&f);
}

#[test]
fn bench_storage_errors_name_the_file() {
    let o = pinch(&["bench", "--storage", "/nonexistent/disk.bin"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("/nonexistent/disk.bin"),
        "{}",
        stderr(&o)
    );
    let f = scratch("storage-empty", 0);
    let o = pinch(&["bench", "--storage", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("empty"), "{}", stderr(&o));
    let _ = std::fs::remove_file(&f);
}

#[test]
fn server_refuses_generations_under_the_floor_and_stays_up() {
    let s = server_util::Server::start(&["--guard", "1000000G"]);
    for stream in [false, true] {
        let body = serde_json::json!({"prompt": "hello", "n_predict": 4, "stream": stream});
        let r = s.post("/completion", &body.to_string());
        let text = String::from_utf8_lossy(&r.body).into_owned();
        if stream {
            // A stream has sent its headers (and a prompt-progress event) before the
            // guard's check: the refusal is an error event, as llama-server sends one.
            assert_eq!(r.status, 200, "{text}");
            assert!(text.contains("\"code\":503"), "{text}");
            assert!(
                text.contains("below the --guard floor 1024000000 MiB"),
                "{text}"
            );
            continue;
        }
        assert_eq!(r.status, 503, "{text}");
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(
            msg.contains("below the --guard floor 1024000000 MiB"),
            "{msg}"
        );
        assert_eq!(r.header("Retry-After").as_deref(), Some("1"));
    }
    assert_eq!(s.get("/health").status, 200);
    assert_eq!(s.metric("pinch_guard_stops_total"), 2.0);
    // The log is collected when the server's stderr closes.
    let mut s = s;
    assert!(s.alive());
    let _ = s.child.kill();
    let _ = s.child.wait();
    server_util::wait_for(10, "the guard's log line", || {
        s.log
            .lock()
            .unwrap()
            .contains("pinch: generation 2: stopped: available memory")
    });
}

#[test]
fn server_with_a_sane_floor_generates() {
    let s = server_util::Server::start(&["--guard", "1M"]);
    let body = serde_json::json!({"prompt": "hello", "n_predict": 4, "ignore_eos": true});
    let (status, v) = s.post_json("/completion", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["tokens_predicted"], 4);
    assert_eq!(s.metric("pinch_guard_stops_total"), 0.0);
}
