//! Instruction counts of single kernels under qemu-aarch64 (with the counter plugin of
//! `tools/qemu-insn`): runs one row-range product `reps` times so that the difference of
//! two runs gives instructions per call. Not part of the tests; a measuring aid for the
//! aarch64 targets of issue #4.
//!
//! `insn_count TYPE ROWS COLS TOKENS REPS [repack|lut8]`, e.g. `insn_count q8_0 4096 640 1 10 repack`;
//! `insn_count TYPE ROWS COLS 0 REPS repacks` times the in-place repack itself (what the
//! expert pager does to each matrix it reads into a slot), `REPS` times, no product.
use pinch_kernels::{matvec, repack, CpuFeatures, GgmlType};

/// The detected features, or the scalar path with `INSN_CPU=scalar`.
fn features() -> CpuFeatures {
    match std::env::var("INSN_CPU").as_deref() {
        Ok("scalar") => CpuFeatures::SCALAR,
        _ => CpuFeatures::detect(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ty = GgmlType::ALL
        .into_iter()
        .find(|t| t.name().eq_ignore_ascii_case(&args[1]))
        .unwrap_or_else(|| panic!("type {}", args[1]));
    let rows: usize = args[2].parse().unwrap();
    let cols: usize = args[3].parse().unwrap();
    let n_tok: usize = args[4].parse().unwrap();
    let reps: usize = args[5].parse().unwrap();
    // `lut8`: the inexact 8-bit table layout where the CPU has it (`--lut8`).
    let lut8 = args.get(6).is_some_and(|a| a == "lut8");
    let packed = lut8 || args.get(6).is_some_and(|a| a == "repack");
    let repacks_only = args.get(6).is_some_and(|a| a == "repacks");
    let feat = features();
    let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut w: Vec<u8> = (0..rows * row_bytes).map(|_| next() as u8).collect();
    // Small, finite f16 scales where block formats keep them first.
    let (_, bb) = ty.block_geometry();
    if matches!(
        ty,
        GgmlType::Q8_0
            | GgmlType::Q5_0
            | GgmlType::Q4_0
            | GgmlType::Q1_0
            | GgmlType::Q2_0
            | GgmlType::IQ2_XXS
            | GgmlType::IQ4_NL
            | GgmlType::IQ4_XS
    ) {
        for b in w.chunks_mut(bb) {
            b[..2].copy_from_slice(&[0x00, 0x20]);
        }
    }
    if repacks_only {
        let l = repack::Layout::preferred(ty, &feat).unwrap();
        let mut scratch = vec![0u8; l.scratch_bytes(row_bytes)];
        for _ in 0..reps {
            repack::repack_in_place(l, ty, &mut w, row_bytes, &mut scratch).unwrap();
        }
        let checksum: u64 = w.iter().map(|&b| u64::from(b)).sum();
        println!("{} {l:?}: {reps} repacks, checksum {checksum}", ty.name());
        return;
    }
    let fmt = ty.act_format().unwrap();
    let arb = fmt.row_bytes(cols).unwrap();
    let mut acts = vec![0u8; arb * n_tok];
    for t in 0..n_tok {
        let x: Vec<f32> = (0..cols)
            .map(|_| (next() % 2000) as f32 / 1000.0 - 1.0)
            .collect();
        matvec::quantize_activation(fmt, &x, &mut acts[t * arb..(t + 1) * arb]).unwrap();
    }
    let layout = if packed {
        let l = repack::Layout::preferred_with(ty, &feat, lut8).unwrap();
        let mut scratch = vec![0u8; l.scratch_bytes(row_bytes)];
        repack::repack_in_place(l, ty, &mut w, row_bytes, &mut scratch).unwrap();
        l
    } else {
        repack::Layout::Plain
    };
    let mut out = vec![0f32; rows * n_tok];
    let mut sum = 0f32;
    for _ in 0..reps {
        repack::matmul_rows(
            layout,
            ty,
            &feat,
            &w,
            row_bytes,
            0..rows,
            &acts,
            arb,
            &mut out,
        )
        .unwrap();
        sum += out[0];
    }
    println!("{} {}", feat.describe(), sum);
}
