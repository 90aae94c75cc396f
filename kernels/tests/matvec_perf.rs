//! Timing of `matvec_rows` / `matmul_rows` at Gemma 3 270M's shapes (the numbers behind
//! issue #4). Ignored by default: run with
//! `cargo test --release -p pinch-kernels --test matvec_perf -- --ignored --nocapture`.
//! Best of several runs, since the development VM is shared and noisy.
use pinch_kernels::matvec::{matmul_rows, quantize_activation, vec_dot};
use pinch_kernels::{CpuFeatures, GgmlType};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn f32(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn detect() -> CpuFeatures {
    CpuFeatures::detect()
}

/// Weight rows whose scale fields hold plausible f16 values and whose other bytes are
/// random (the kernels' speed does not depend on the values).
fn weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let (qk, bytes) = ty.block_geometry();
    let mut w: Vec<u8> = (0..rows * cols / qk * bytes)
        .map(|_| rng.next() as u8)
        .collect();
    for blk in w.chunks_mut(bytes) {
        let d = pinch_kernels::f16::f32_to_f16(0.01 + 0.01 * rng.f32().abs()).to_le_bytes();
        blk[..2].copy_from_slice(&d);
        if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q2_K) {
            blk[2..4].copy_from_slice(&d);
        }
        if ty == GgmlType::Q6_K {
            let n = blk.len();
            blk[n - 2..].copy_from_slice(&d);
        }
    }
    w
}

fn bench(feat: &CpuFeatures, ty: GgmlType, rows: usize, cols: usize, n_tok: usize) {
    let mut rng = Rng(0x1234_5678 ^ ty as u64);
    let w = weights(&mut rng, ty, rows, cols);
    let fmt = ty.act_format().unwrap();
    let arb = fmt.row_bytes(cols).unwrap();
    let mut acts = vec![0u8; arb * n_tok];
    let x: Vec<f32> = (0..cols).map(|_| rng.f32()).collect();
    for t in 0..n_tok {
        quantize_activation(fmt, &x, &mut acts[t * arb..(t + 1) * arb]).unwrap();
    }
    let mut out = vec![0f32; rows * n_tok];
    let rb = w.len() / rows;
    // About 0.3 s of work per measurement.
    let mut best = f64::INFINITY;
    let reps = (2_000_000_000 / (w.len() * n_tok.max(4) + 1)).clamp(1, 2000);
    for _ in 0..5 {
        let t0 = std::time::Instant::now();
        for _ in 0..reps {
            matmul_rows(
                ty,
                feat,
                std::hint::black_box(&w),
                rb,
                0..rows,
                &acts,
                arb,
                &mut out,
            )
            .unwrap();
        }
        best = best.min(t0.elapsed().as_secs_f64() / reps as f64);
    }
    std::hint::black_box(&out);
    // The one-row kernel called per (row, token), as `matmul_rows` did before tiling.
    let mut old = f64::INFINITY;
    for _ in 0..3 {
        let t0 = std::time::Instant::now();
        for _ in 0..reps {
            for r in 0..rows {
                for t in 0..n_tok {
                    out[r * n_tok + t] = vec_dot(
                        ty,
                        feat,
                        std::hint::black_box(&w[r * rb..(r + 1) * rb]),
                        &acts[t * arb..(t + 1) * arb],
                    )
                    .unwrap();
                }
            }
        }
        old = old.min(t0.elapsed().as_secs_f64() / reps as f64);
    }
    std::hint::black_box(&out);
    eprintln!(
        "  one-row kernel: {:9.3} ms  {:6.2} GB/s",
        old * 1e3,
        w.len() as f64 / old / 1e9
    );
    eprintln!(
        "{:5} {rows:6}x{cols:4} tok {n_tok:3} [{:12}]: {:9.3} ms  {:6.2} GB/s  {:8.1} tok/s-equiv",
        ty.name(),
        if feat.avx512vnni() {
            "avx512vnni"
        } else {
            feat.describe()
        },
        best * 1e3,
        w.len() as f64 / best / 1e9,
        n_tok as f64 / best,
    );
}

/// Times each of `cases` (type, rows, cols, tokens) that `PINCH_BENCH` selects (all
/// when unset), on this CPU's features (`PINCH_NO_VNNI`: without AVX-512 VNNI).
fn run_cases(cases: &[(GgmlType, usize, usize, usize)]) {
    let mut feat = detect();
    if std::env::var("PINCH_NO_VNNI").is_ok() {
        feat = feat.without(pinch_kernels::cpu::Feature::Avx512Vnni);
    }
    let filter = std::env::var("PINCH_BENCH").unwrap_or_default();
    for &(ty, rows, cols, n_tok) in cases {
        let name = format!("{}x{}", ty.name(), n_tok);
        if filter.is_empty() || filter.split(',').any(|f| name.contains(f)) {
            bench(&feat, ty, rows, cols, n_tok);
        }
    }
}

#[test]
#[ignore = "timing only: cargo test --release --test matvec_perf -- --ignored --nocapture"]
fn gemma3_270m_shapes() {
    run_cases(&[
        (GgmlType::Q8_0, 262144, 640, 1),
        (GgmlType::Q8_0, 256, 640, 1),
        (GgmlType::Q5_0, 2048, 640, 1),
        (GgmlType::Q5_0, 1024, 640, 1),
        (GgmlType::Q4_K, 640, 2048, 1),
        (GgmlType::Q6_K, 640, 2048, 1),
        (GgmlType::Q8_0, 256, 640, 64),
        (GgmlType::Q5_0, 2048, 640, 64),
        (GgmlType::Q4_K, 640, 2048, 64),
        (GgmlType::Q6_K, 640, 2048, 64),
    ]);
}

/// Qwen3.5-0.8B's matrices (`cargo xtask bench --arch qwen35`): the tied Q6_K head, the
/// DeltaNet qkv, the FFN (Q4_K gate/up, Q6_K down); `PINCH_BENCH` filters as above.
#[test]
#[ignore = "timing only: cargo test --release --test matvec_perf -- --ignored --nocapture"]
fn qwen35_shapes() {
    run_cases(&[
        (GgmlType::Q6_K, 248320, 1024, 1),
        (GgmlType::Q6_K, 6144, 1024, 1),
        (GgmlType::Q4_K, 3584, 1024, 1),
        (GgmlType::Q6_K, 1024, 3584, 1),
        (GgmlType::Q6_K, 6144, 1024, 64),
        (GgmlType::Q4_K, 3584, 1024, 64),
        (GgmlType::Q6_K, 1024, 3584, 64),
    ]);
}

/// For instruction counts under qemu (`-plugin libinsn.so`): runs each selected shape
/// `PINCH_REPS` times with nothing else but the setup, so two runs with different
/// counts give the instructions of one call by difference.
#[test]
#[ignore = "for qemu instruction counting: PINCH_REPS=n PINCH_BENCH=... -- --ignored"]
fn gemma3_270m_reps() {
    let feat = detect();
    let filter = std::env::var("PINCH_BENCH").unwrap_or_default();
    let reps: usize = std::env::var("PINCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let cases: &[(GgmlType, usize, usize, usize)] = &[
        (GgmlType::Q8_0, 262144, 640, 1),
        (GgmlType::Q5_0, 2048, 640, 1),
        (GgmlType::Q4_K, 640, 2048, 1),
        (GgmlType::Q6_K, 640, 2048, 1),
    ];
    for &(ty, rows, cols, n_tok) in cases {
        let name = format!("{}x{}", ty.name(), n_tok);
        if !filter.split(',').any(|f| name.contains(f)) {
            continue;
        }
        let mut rng = Rng(0x1234_5678 ^ ty as u64);
        let w = weights(&mut rng, ty, rows, cols);
        let fmt = ty.act_format().unwrap();
        let arb = fmt.row_bytes(cols).unwrap();
        let mut acts = vec![0u8; arb * n_tok];
        let x: Vec<f32> = (0..cols).map(|_| rng.f32()).collect();
        for t in 0..n_tok {
            quantize_activation(fmt, &x, &mut acts[t * arb..(t + 1) * arb]).unwrap();
        }
        let mut out = vec![0f32; rows * n_tok];
        let rb = w.len() / rows;
        for _ in 0..reps {
            matmul_rows(ty, &feat, &w, rb, 0..rows, &acts, arb, &mut out).unwrap();
        }
        std::hint::black_box(&out);
    }
}
