//! The scalar `vec_dot` of every legacy type agrees with the dot product of the
//! dequantized rows. Dequantization is checked bit for bit against llama.cpp in
//! `legacy_dequant.rs`, so this ties each `vec_dot`'s pairing of weights with
//! activations (sign bits with Q8_0 sub-blocks, TQ1_0's base-3 digit order, ...) to
//! llama.cpp's element order.
//!
//! Tolerance: the reference computes exact integer block sums and rounds only when
//! scaling and accumulating blocks in f32, so it differs from an f64 dot of the
//! dequantized values by at most a few f32 roundings per block: we allow
//! `1e-5 * sum |w_i * a_i|`. Q4_1/Q5_1 also use Q8_1's `s`, an f16 of `d * sum(q)` with
//! the unrounded `d`, which differs from the dequantized activations' sum by up to
//! about `|s| * 2^-11` (plus `d`'s own f16 rounding); `|m| * |s| * 2^-11 * 1.01` per
//! block is added to their tolerance.
use pinch_kernels::matvec::{dequantize_row, quantize_activation, vec_dot_scalar};
use pinch_kernels::{ActFormat, GgmlType};

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

fn f16b(v: f32) -> [u8; 2] {
    pinch_kernels::f16::f32_to_f16(v).to_le_bytes()
}

fn random_weights(rng: &mut Rng, ty: GgmlType, nb: usize) -> Vec<u8> {
    let (_, bytes) = ty.block_geometry();
    let mut w: Vec<u8> = (0..nb * bytes).map(|_| rng.next() as u8).collect();
    for blk in w.chunks_mut(bytes) {
        let d = f16b(0.01 + 0.05 * rng.f32().abs());
        match ty {
            GgmlType::TQ1_0 | GgmlType::TQ2_0 => blk[bytes - 2..].copy_from_slice(&d),
            GgmlType::Q4_1 | GgmlType::Q5_1 => {
                blk[..2].copy_from_slice(&d);
                blk[2..4].copy_from_slice(&f16b(0.3 * rng.f32()));
            }
            _ => blk[..2].copy_from_slice(&d),
        }
        if ty == GgmlType::TQ1_0 {
            // Valid TQ1_0 bytes encode 5 (or 4) base-3 digits: at most 242 after
            // llama.cpp's scaling (ceil(v * 256 / 243) with v < 243).
            for b in &mut blk[..52] {
                let v = (*b as u16 % 243) * 256;
                *b = v.div_ceil(243) as u8;
            }
        }
    }
    w
}

fn check(ty: GgmlType, n_blocks: &[usize]) {
    let fmt = ty.act_format().unwrap();
    let (qk, bytes) = ty.block_geometry();
    let mut rng = Rng(0x1234_5678 ^ ty as u64);
    for &nb in n_blocks {
        for rep in 0..8 {
            let n = nb * qk;
            let w = random_weights(&mut rng, ty, nb);
            let x: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
            let mut act = vec![0u8; fmt.row_bytes(n).unwrap()];
            quantize_activation(fmt, &x, &mut act).unwrap();
            let mut wf = vec![0.0f32; n];
            dequantize_row(ty, &w, &mut wf).unwrap();
            let af = dequant_act(fmt, &act, n);
            let exact: f64 = wf.iter().zip(&af).map(|(a, b)| *a as f64 * *b as f64).sum();
            let abs: f64 = wf
                .iter()
                .zip(&af)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let mut tol = 1e-5 * abs + 1e-12;
            if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                for (blk, a) in w.chunks(bytes).zip(af.chunks(32)) {
                    let m = pinch_kernels::f16::read_f16([blk[2], blk[3]]) as f64;
                    let s: f64 = a.iter().map(|v| *v as f64).sum();
                    tol += (m * s).abs() / 2048.0 * 1.01;
                }
            }
            let got = vec_dot_scalar(ty, &w, &act).unwrap() as f64;
            assert!(
                (got - exact).abs() <= tol,
                "{}: {nb} blocks, rep {rep}: vec_dot {got} vs dequantized dot {exact} (tol {tol})",
                ty.name()
            );
        }
    }
}

fn dequant_act(fmt: ActFormat, act: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    match fmt {
        ActFormat::Q8_0 => dequantize_row(GgmlType::Q8_0, act, &mut out).unwrap(),
        ActFormat::Q8_1 => dequantize_row(GgmlType::Q8_1, act, &mut out).unwrap(),
        ActFormat::Q8_K => {
            // d (f32) * qs, read straight from the documented layout.
            for (blk, o) in act.chunks(292).zip(out.chunks_mut(256)) {
                let d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
                for (j, v) in o.iter_mut().enumerate() {
                    *v = d * blk[4 + j] as i8 as f32;
                }
            }
        }
        _ => unreachable!(),
    }
    out
}

#[test]
fn q8_0_vec_dot_is_dot_of_dequantized() {
    check(GgmlType::Q8_0, &[1, 3, 17]);
}
#[test]
fn q4_0_vec_dot_is_dot_of_dequantized() {
    check(GgmlType::Q4_0, &[1, 3, 17]);
}
#[test]
fn q4_1_vec_dot_is_dot_of_dequantized() {
    check(GgmlType::Q4_1, &[1, 3, 17]);
}
#[test]
fn q5_0_vec_dot_is_dot_of_dequantized() {
    check(GgmlType::Q5_0, &[1, 3, 17]);
}
#[test]
fn q5_1_vec_dot_is_dot_of_dequantized() {
    check(GgmlType::Q5_1, &[1, 3, 17]);
}
#[test]
fn iq4_nl_vec_dot_is_dot_of_dequantized() {
    check(GgmlType::IQ4_NL, &[1, 3, 17]);
}
#[test]
fn q1_0_vec_dot_is_dot_of_dequantized() {
    check(GgmlType::Q1_0, &[1, 2, 5]);
}
#[test]
fn q2_0_vec_dot_is_dot_of_dequantized() {
    check(GgmlType::Q2_0, &[1, 3, 7]);
}
#[test]
fn tq1_0_vec_dot_is_dot_of_dequantized() {
    check(GgmlType::TQ1_0, &[1, 2, 3]);
}
#[test]
fn tq2_0_vec_dot_is_dot_of_dequantized() {
    check(GgmlType::TQ2_0, &[1, 2, 3]);
}
#[test]
fn iq2_xxs_vec_dot_is_dot_of_dequantized() {
    check(GgmlType::IQ2_XXS, &[1, 2, 3]);
}
#[test]
fn iq4_xs_vec_dot_is_dot_of_dequantized() {
    check(GgmlType::IQ4_XS, &[1, 2, 3]);
}

#[test]
fn float_rows_vec_dot_is_dot_of_values() {
    let mut rng = Rng(99);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        let n = 77;
        let x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
        let y: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
        let mut w = Vec::new();
        for v in &x {
            match ty {
                GgmlType::F32 => w.extend_from_slice(&v.to_le_bytes()),
                GgmlType::F16 => w.extend_from_slice(&f16b(*v)),
                _ => w.extend_from_slice(&pinch_kernels::f16::f32_to_bf16(*v).to_le_bytes()),
            }
        }
        let mut act = vec![0u8; 4 * n];
        quantize_activation(ty.act_format().unwrap(), &y, &mut act).unwrap();
        let mut wf = vec![0.0f32; n];
        dequantize_row(ty, &w, &mut wf).unwrap();
        let af: Vec<f32> = act
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let exact: f64 = wf.iter().zip(&af).map(|(a, b)| (a * b) as f64).sum();
        let got = vec_dot_scalar(ty, &w, &act).unwrap();
        if ty == GgmlType::F16 {
            // Sixteen f32 lanes (llama.cpp's tinyBLAS order): each lane's f32 sum of at
            // most n / 16 + 1 terms and the 4-level tree each add <= 2^-24 relative.
            let abs: f64 = wf.iter().zip(&af).map(|(a, b)| (a * b).abs() as f64).sum();
            let tol = (n / 16 + 6) as f64 * (1.0 / (1u64 << 24) as f64) * abs;
            assert!(
                (got as f64 - exact).abs() <= tol,
                "F16: {got} vs {exact} (tol {tol})"
            );
        } else {
            assert_eq!(got, exact as f32, "{}", ty.name());
        }
    }
}

/// A row built so that the order of the F16 sum shows: lanes 0 and 8 hold 2^24 and 1,
/// lanes 1 and 9 hold 1 and 1. llama.cpp's tinyBLAS (16 f32 lanes, `_mm512_reduce_add_ps`
/// halving tree) gives (2^24 + 1 -> 2^24) + (1 + 1) = 2^24 + 2; an f64 sum would give
/// 2^24 + 3 -> 2^24 + 4, a running f32 sum 2^24.
#[test]
fn f16_dot_sums_in_sixteen_lanes_with_a_halving_tree() {
    let mut x = [0.0f32; 16];
    let mut y = [0.0f32; 16];
    (x[0], y[0]) = (2048.0, 8192.0);
    (x[8], y[8]) = (1.0, 1.0);
    (x[1], y[1]) = (1.0, 1.0);
    (x[9], y[9]) = (1.0, 1.0);
    let w: Vec<u8> = x.iter().flat_map(|v| f16b(*v)).collect();
    let mut act = vec![0u8; 64];
    quantize_activation(ActFormat::F16, &y, &mut act).unwrap();
    assert_eq!(
        vec_dot_scalar(GgmlType::F16, &w, &act).unwrap(),
        16_777_218.0
    );
}

/// Two Q8_0 blocks whose products land in lane 0: the second scale product
/// `(1 + 2^-10)^2` times 16129 needs 34 bits, so only a fused multiply-add (llama.cpp's
/// `_mm256_fmadd_ps`) gives the correctly rounded `16129 * (1 + 2^-10)^2 - 16129`; the
/// f64 expression below is that single rounding.
#[test]
fn q8_0_dot_fuses_scale_and_lane_sum_per_block() {
    let blk = |d: f32, q0: i8| {
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&f16b(d));
        b[2] = q0 as u8;
        b
    };
    let s = 1.0 + 1.0 / 1024.0;
    let w = [blk(1.0, 127), blk(s, 127)].concat();
    let a = [blk(1.0, -127), blk(s, 127)].concat();
    let fused = ((s as f64 * s as f64) * 16129.0 - 16129.0) as f32;
    let unfused = (s * s * 16129.0) - 16129.0;
    assert_ne!(fused, unfused, "the case must tell fused from unfused");
    assert_eq!(vec_dot_scalar(GgmlType::Q8_0, &w, &a).unwrap(), fused);
}
