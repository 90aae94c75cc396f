//! Fault injection: whole `pinch` commands run in-process on an in-memory platform
//! ([`MemFs`]) wrapped in the engine's [`FaultInjector`], one fault per test. Each case
//! must end in a clear error naming the file and offset (or the request), or in a
//! documented degradation with the same tokens as the clean run; never a panic, a hang,
//! a wrong token or a corrupt file left behind. Every test also checks that its fault
//! really fired.
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use pinch_runtime_min::commands;
use pinch_runtime_min::fault::{FaultInjector, Faults, Fired, EIO, ENOSPC};
use pinch_runtime_min::gguf::Gguf;
use pinch_tests::memfs::MemFs;
use pinch_tests::{data_dir, scale_layers};

const MODEL: &str = "/m/tiny-llama-Q8_0.gguf";
const CACHE_DIR: &str = "/cache";
const CACHE: &str = "/cache/tiny-llama-Q8_0.pinch-repack";
const RUN: [&str; 11] = [
    "run",
    "-m",
    MODEL,
    "-p",
    "Once upon a time",
    "-n",
    "12",
    "--temp",
    "0",
    "-t",
    "1",
];

fn model_bytes() -> Vec<u8> {
    std::fs::read(data_dir().join("tiny/tiny-llama-Q8_0.gguf")).unwrap()
}

/// A platform holding the tiny Q8_0 llama at [`MODEL`], wrapped with `faults`.
fn platform(faults: &Faults) -> FaultInjector<'_, MemFs> {
    let fs = MemFs::new();
    fs.put(MODEL, model_bytes());
    FaultInjector::new(fs, faults)
}

/// What one command printed.
struct Ran {
    code: i32,
    out: String,
    err: String,
    secs: f64,
}

/// Run `args` (with `extra` appended) through `commands::main` on `p`.
fn run(p: &FaultInjector<'_, MemFs>, args: &[&str], extra: &[&str]) -> Ran {
    let mut region = vec![0u64; (96 << 20) / 8];
    let region = pinch_kernels::blocks::bytes_of_mut(&mut region[..]);
    let argv: Vec<&str> = args.iter().chain(extra).copied().collect();
    let t = Instant::now();
    let code = commands::main(p, &argv, region);
    let secs = t.elapsed().as_secs_f64();
    let (out, err) = p.inner.take_output();
    Ran {
        code,
        out,
        err,
        secs,
    }
}

/// The clean run's output, for comparison.
fn reference(extra: &[&str]) -> String {
    let f = Faults::new();
    let r = run(&platform(&f), &RUN, extra);
    assert_eq!(r.code, 0, "clean run failed: {}", r.err);
    assert!(r.out.starts_with("Once upon a time") && r.out.len() > 20);
    r.out
}

/// The number after `key` in `text`.
fn number_after(text: &str, key: &str) -> u64 {
    let rest = text
        .split(key)
        .nth(1)
        .unwrap_or_else(|| panic!("`{key}` not in {text:?}"));
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap()
}

/// Where the data of tensor `name` starts in the model file.
fn tensor_offset(bytes: &[u8], name: &str) -> u64 {
    let g = Gguf::parse(bytes, bytes.len() as u64).unwrap();
    g.tensor(name).unwrap().offset
}

#[test]
fn short_reads_give_the_same_tokens() {
    let want = reference(&[]);
    for n in [1, 333, 4093] {
        let f = Faults::new();
        f.short_reads(n);
        let p = platform(&f);
        let r = run(&p, &RUN, &[]);
        eprintln!(
            "short reads of {n} bytes: exit {}, {} reads cut",
            r.code,
            Fired::get(&p.fired.short_reads)
        );
        assert_eq!(r.code, 0, "{}", r.err);
        assert!(
            Fired::get(&p.fired.short_reads) > 10,
            "the fault never fired"
        );
        assert_eq!(r.out, want, "short reads of {n} bytes changed the output");
    }
}

#[test]
fn eio_while_loading_names_the_file_and_offset() {
    let bytes = model_bytes();
    let at = tensor_offset(&bytes, "blk.1.ffn_down.weight") + 1000;
    let f = Faults::new();
    f.eio_at(Some(at));
    let p = platform(&f);
    let r = run(&p, &RUN, &[]);
    eprintln!("EIO at {at}: exit {}, stderr: {}", r.code, r.err.trim());
    assert_eq!(Fired::get(&p.fired.eio), 1);
    assert_eq!(r.code, 1);
    assert!(r.out.is_empty(), "no token may be printed: {:?}", r.out);
    assert!(
        r.err.contains(MODEL) && r.err.contains("(os error 5)"),
        "{}",
        r.err
    );
    let off = number_after(&r.err, "read failed at offset ");
    assert!(off <= at, "reported offset {off} is past the fault at {at}");
}

/// A model of 24 layers (copies of the tiny llama's) and the smallest budget that runs
/// it, which streams most layers from the file.
fn streamed_model() -> (Vec<u8>, String) {
    let big = scale_layers(&model_bytes(), 24);
    let f = Faults::new();
    let p = platform(&f);
    p.inner.put(MODEL, big.clone());
    let r = run(&p, &RUN, &["-c", "64", "--budget", "1M"]);
    assert_eq!(r.code, 1);
    let need = number_after(&r.err, "needs at least ");
    (big, format!("{}M", need + 2))
}

fn streamed_run(big: &[u8], budget: &str, faults: &Faults) -> (Ran, Fired) {
    let p = platform(faults);
    p.inner.put(MODEL, big.to_vec());
    let r = run(&p, &RUN, &["-c", "64", "--budget", budget]);
    (r, p.fired)
}

#[test]
fn streamed_weights_survive_short_reads_and_fail_cleanly_on_eio_and_a_shrunk_file() {
    let (big, budget) = streamed_model();
    let (clean, clean_fired) = streamed_run(&big, &budget, &Faults::new());
    // Arm the faults below three quarters of the way through the run's reads, so they
    // land while tokens are generated (every token streams the streamed layers again).
    let arm = Fired::get(&clean_fired.reads) * 3 / 4;
    assert_eq!(clean.code, 0, "{}", clean.err);
    assert!(
        clean.err.contains("streamed"),
        "nothing streamed: {}",
        clean.err
    );

    let f = Faults::new();
    f.short_reads(777);
    let (r, fired) = streamed_run(&big, &budget, &f);
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(Fired::get(&fired.short_reads) > 0);
    assert_eq!(r.out, clean.out, "short reads changed the streamed output");

    // Layer 20 is streamed: the fault lands while tokens are being generated.
    let at = tensor_offset(&big, "blk.20.ffn_up.weight") + 4096;
    let f = Faults::new();
    f.eio_at(Some(at)).arm_after_reads(arm);
    let (r, fired) = streamed_run(&big, &budget, &f);
    eprintln!(
        "streamed, EIO at {at}: exit {}, {} of {} output bytes printed, stderr tail: {}",
        r.code,
        r.out.len(),
        clean.out.len(),
        tail(&r.err)
    );
    assert!(Fired::get(&fired.eio) > 0, "the fault never fired");
    assert_eq!(r.code, 1);
    assert!(
        r.err.contains(MODEL) && r.err.contains("(os error 5)"),
        "{}",
        r.err
    );
    assert!(number_after(&r.err, "read failed at offset ") <= at);
    assert!(
        clean.out.starts_with(&r.out),
        "tokens before the error must be the clean ones"
    );
    assert!(
        r.out.len() > "Once upon a time".len(),
        "the fault did not land mid-generation"
    );

    // The file loses its last layers after it was opened (its size still says 24).
    let cut = tensor_offset(&big, "blk.18.attn_q.weight");
    let f = Faults::new();
    f.shrink_to(Some(cut)).arm_after_reads(arm);
    let (r, fired) = streamed_run(&big, &budget, &f);
    eprintln!(
        "streamed, file shrunk to {cut}: exit {}, {} of {} output bytes printed, stderr tail: {}",
        r.code,
        r.out.len(),
        clean.out.len(),
        tail(&r.err)
    );
    assert!(Fired::get(&fired.shrunk) > 0, "the fault never fired");
    assert_eq!(
        r.code, 1,
        "a shrunk file must be an error, not zeros: {}",
        r.out
    );
    assert!(
        r.err.contains(MODEL) && r.err.contains("file ends early"),
        "{}",
        r.err
    );
    assert!(number_after(&r.err, "short read at offset ") >= cut);
    assert!(clean.out.starts_with(&r.out));
    assert!(
        r.out.len() > "Once upon a time".len(),
        "the fault did not land mid-generation"
    );
}

#[test]
fn a_file_that_shrinks_before_loading_names_the_offset() {
    let bytes = model_bytes();
    let cut = tensor_offset(&bytes, "blk.0.attn_v.weight") + 10;
    let f = Faults::new();
    f.shrink_to(Some(cut));
    let p = platform(&f);
    let r = run(&p, &RUN, &[]);
    eprintln!(
        "file shrunk to {cut}: exit {}, stderr: {}",
        r.code,
        r.err.trim()
    );
    assert!(Fired::get(&p.fired.shrunk) > 0);
    assert_eq!(r.code, 1);
    assert!(
        r.err.contains(MODEL) && r.err.contains("file ends early"),
        "{}",
        r.err
    );
    assert_eq!(number_after(&r.err, "short read at offset "), cut);
}

fn tail(s: &str) -> &str {
    s.trim().lines().last().unwrap_or("")
}

/// Run with the repack cache; the cache file afterwards.
fn cached_run(p: &FaultInjector<'_, MemFs>) -> (Ran, Option<Vec<u8>>) {
    let r = run(p, &RUN, &["--repack-cache", CACHE_DIR]);
    (r, p.inner.get(CACHE).map(|b| b.to_vec()))
}

#[test]
fn a_cache_that_cannot_be_written_is_reported_and_skipped() {
    let want = reference(&[]);
    for (code, name) in [(ENOSPC, "ENOSPC"), (EIO, "EIO")] {
        let f = Faults::new();
        f.write_error(code);
        let p = platform(&f);
        let (r, cache) = cached_run(&p);
        eprintln!(
            "cache write {name}: exit {}, stderr: {}",
            r.code,
            r.err.lines().next().unwrap_or("")
        );
        assert_eq!(Fired::get(&p.fired.write_errors), 1, "no write was tried");
        assert_eq!(r.code, 0, "{}", r.err);
        assert_eq!(r.out, want);
        let msg =
            format!("repack cache: cannot write {CACHE}: cannot write file (os error {code})");
        assert!(r.err.contains(&msg), "{}", r.err);
        assert!(cache.is_none(), "a failed write left a file behind");
        // The next run without the fault writes the cache, the one after reads it.
        f.write_error(0);
        let (r, cache) = cached_run(&p);
        assert!(r.err.contains("repack cache: wrote"), "{}", r.err);
        assert!(cache.is_some());
        let (r, _) = cached_run(&p);
        assert_eq!(r.out, want);
        assert!(
            !r.err.contains("wrote") && !r.err.contains("stale"),
            "{}",
            r.err
        );
    }
}

#[test]
fn a_torn_cache_at_every_4k_boundary_is_rebuilt_with_the_same_tokens() {
    let want = reference(&[]);
    let f = Faults::new();
    let p = platform(&f);
    let (r, cache) = cached_run(&p);
    assert_eq!(r.code, 0, "{}", r.err);
    let whole = cache.expect("the first run writes the cache");
    assert!(whole.len() > 100_000, "cache of {} bytes", whole.len());
    let mut cuts = 0;
    let t = Instant::now();
    for cut in (0..whole.len()).step_by(4096) {
        p.inner.put(CACHE, whole[..cut].to_vec());
        let (r, after) = cached_run(&p);
        assert_eq!(r.code, 0, "cut at {cut}: {}", r.err);
        assert_eq!(r.out, want, "cut at {cut}: other tokens");
        let stale = format!("repack cache {CACHE} is stale: truncated; rebuilding it");
        assert!(r.err.contains(&stale), "cut at {cut}: {}", r.err);
        assert!(
            after.as_deref() == Some(&whole[..]),
            "cut at {cut}: the rebuilt cache differs"
        );
        cuts += 1;
    }
    eprintln!(
        "torn cache: {cuts} cuts of a {}-byte cache, each reported stale and rebuilt ({:.1} s)",
        whole.len(),
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn slow_storage_gives_the_same_tokens_later() {
    let want = reference(&[]);
    let f = Faults::new();
    f.read_latency_ms(3);
    let p = platform(&f);
    let r = run(&p, &RUN, &[]);
    let delayed = Fired::get(&p.fired.delayed);
    eprintln!("3 ms a read: {delayed} reads delayed, {:.2} s", r.secs);
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(r.out, want);
    assert!(delayed > 0 && delayed == p.fired.reads.load(Relaxed));
    assert!(r.secs >= delayed as f64 * 0.003);
}

#[test]
fn memory_dropping_under_the_guard_floor_stops_the_generation_cleanly() {
    let want = reference(&["--guard", "100M"]);
    let f = Faults::new();
    // The guard reads once before the prompt and once per token: drop after 5 readings.
    f.memory_drop(Some((5, 50 << 20)));
    let p = platform(&f);
    let r = run(&p, &RUN, &["--guard", "100M"]);
    eprintln!(
        "memory drop: exit {}, {} of {} output bytes printed, stderr: {}",
        r.code,
        r.out.len(),
        want.len(),
        r.err.trim().replace('\n', " | ")
    );
    assert!(
        Fired::get(&p.fired.low_memory) >= 2,
        "the guard did not look twice"
    );
    assert_eq!(r.code, 1);
    assert!(
        r.err
            .contains("stopped: available memory 50 MiB is below the --guard floor 100 MiB"),
        "{}",
        r.err
    );
    assert!(
        r.out.len() > "Once upon a time".len(),
        "tokens before the drop are printed"
    );
    assert!(
        r.out.len() < want.len() && want.starts_with(&r.out),
        "{:?} vs {want:?}",
        r.out
    );
}

#[test]
fn a_socket_reset_mid_stream_stops_that_answer_and_the_server_goes_on() {
    let f: &'static Faults = Box::leak(Box::new(Faults::new()));
    let p: &'static FaultInjector<'static, MemFs> = Box::leak(Box::new(platform(f)));
    std::thread::spawn(move || {
        let mut region = vec![0u64; (96 << 20) / 8];
        let region = pinch_kernels::blocks::bytes_of_mut(&mut region[..]);
        // Runs until the test process ends.
        commands::main(p, &["serve", "-m", MODEL, "-c", "256", "-t", "1"], region)
    });
    let post = |body: &str| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let long = r#"{"messages":[{"role":"user","content":"Tell a story"}],"max_tokens":60,"stream":true,"ignore_eos":true}"#;
    // The reset comes after the head and a few events.
    f.reset_after(Some(700));
    let a = p.inner.connect(post(long).as_bytes());
    let got = p.inner.wait_response(a, 60);
    let text = String::from_utf8_lossy(&got).into_owned();
    eprintln!(
        "reset after 700 bytes: {} bytes delivered, {} resets",
        got.len(),
        Fired::get(&p.fired.resets)
    );
    assert_eq!(Fired::get(&p.fired.resets), 1);
    assert!(
        text.starts_with("HTTP/1.1 200") && text.contains("data: "),
        "{text}"
    );
    assert!(got.len() <= 700 && !text.contains("[DONE]"));
    f.reset_after(None);

    // The server noticed, and answers the next clients in full.
    let m = p.inner.connect(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let metrics = String::from_utf8(p.inner.wait_response(m, 30)).unwrap();
    assert!(metrics.contains("pinch_disconnects_total 1"), "{metrics}");
    let b = p.inner.connect(post(long).as_bytes());
    let full = String::from_utf8(p.inner.wait_response(b, 60)).unwrap();
    assert!(
        full.starts_with("HTTP/1.1 200") && full.trim_end().ends_with("data: [DONE]"),
        "{full}"
    );
    let start = Instant::now();
    let h = p.inner.connect(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(String::from_utf8(p.inner.wait_response(h, 10))
        .unwrap()
        .starts_with("HTTP/1.1 200"));
    assert!(start.elapsed() < Duration::from_secs(10));
}
