//! `pinch moe-sim` end to end: a trace written with the pager's own writer, replayed at
//! two pool sizes and both policies; a corrupt trace is refused with its offset.
use pinch_runtime_min::pager::TraceWriter;
use std::process::{Command, Output};

fn pinch(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pinch"))
        .args(args)
        .output()
        .expect("run pinch")
}

/// 2 MoE layers of 16 experts, 2 picks per token, 500 tokens: layer 0 always picks
/// experts 0 and 1; layer 1 cycles through all 16.
fn trace_file(dir: &std::path::Path) -> std::path::PathBuf {
    let mut buf = vec![0u8; 20 + 500 * 2 * 2 * 2];
    let mut w = TraceWriter::new(&mut buf, 2, 16, 2).unwrap();
    for t in 0..500u16 {
        w.push(&[0, 1]).unwrap();
        w.push(&[(2 * t) % 16, (2 * t + 1) % 16]).unwrap();
    }
    let p = dir.join("trace.pmoe");
    std::fs::write(&p, w.bytes()).unwrap();
    p
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("pinch-moe-sim-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn moe_sim_prints_hit_rates_per_layer_and_bytes_per_token() {
    let dir = tmp("ok");
    let trace = trace_file(&dir);
    let t = trace.to_str().unwrap();
    for policy in ["lfu", "lru"] {
        let o = pinch(&[
            "moe-sim",
            t,
            "--pool",
            "4",
            "--policy",
            policy,
            "--expert-bytes",
            "1M",
        ]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            out.contains("500 tokens, 2 MoE layers, 16 experts, 2 per token"),
            "{out}"
        );
        // Layer 0 misses only its two first uses; layer 1 (a cycle longer than the
        // pool) misses every time under either policy; the best fixed 4 of 16 hit 252 times
        // (500 tokens are 62.5 cycles: experts 0-7 are used 63 times, 8-15 62 times).
        assert!(out.contains("| 0 | 998 | 2 | 99.8 % | 100.0 % |"), "{out}");
        assert!(out.contains("| 1 | 0 | 1000 | 0.0 % | 25.2 % |"), "{out}");
        assert!(
            out.contains("expert reads per token: 2.00 = 2.00 MiB per token"),
            "{out}"
        );
    }
    let o = pinch(&["moe-sim", t, "--pool", "16"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("| 1 | 984 | 16 | 98.4 % | 100.0 % |"), "{out}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn moe_sim_refuses_a_corrupt_trace_naming_the_offset() {
    let dir = tmp("bad");
    let trace = trace_file(&dir);
    let mut b = std::fs::read(&trace).unwrap();
    b[20 + 6] = 99;
    std::fs::write(&trace, &b).unwrap();
    let o = pinch(&["moe-sim", trace.to_str().unwrap(), "--pool", "4"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("expert id 99 at byte 26 is outside the layer"),
        "{err}"
    );
    let o = pinch(&["moe-sim", "--pool", "4", "--policy", "fifo"]);
    assert_eq!(o.status.code(), Some(2));
    std::fs::remove_dir_all(dir).ok();
}
