//! Bit-exact agreement of the K-quant scalar dequantizers and the Q8_K quantizer with
//! llama.cpp's reference algorithms, on blocks taken from the tiny GGUF fixtures.
//!
//! The expected values in `data/kquant/` were produced outside this crate by
//! `tools/gen_dequant_vectors.py --kquant` (gguf-py's `gguf.quants.dequantize`, a numpy port
//! of llama.cpp's `dequantize_row_*`; for Q8_K, which gguf-py cannot quantize, a numpy port
//! of `quantize_row_q8_K_ref`). See `data/kquant/README.md` for provenance.
use pinch_kernels::matvec;
use pinch_kernels::quant::{iq4_xs, q2_k, q3_k, q4_k, q5_k, q6_k, q8_k};
use pinch_kernels::GgmlType;

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Dequantize `raw` with `f` and require every value to have the expected bits.
fn check_bit_exact(name: &str, raw: &[u8], expected: &[u8], f: fn(&[u8], &mut [f32])) {
    let want = f32s(expected);
    assert!(!want.is_empty(), "{name}: empty golden");
    let mut got = vec![f32::NAN; want.len()];
    f(raw, &mut got);
    let mut bad = 0;
    for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
        if g.to_bits() != w.to_bits() {
            if bad < 5 {
                eprintln!(
                    "{name}[{i}]: got {g:e} ({:#010x}) want {w:e} ({:#010x})",
                    g.to_bits(),
                    w.to_bits()
                );
            }
            bad += 1;
        }
    }
    assert_eq!(bad, 0, "{name}: {bad} of {} values differ", want.len());
}

macro_rules! dequant_test {
    ($test:ident, $name:literal, $module:ident, $ty:expr) => {
        #[test]
        fn $test() {
            let raw = include_bytes!(concat!("data/kquant/", $name, ".bin"));
            let want = include_bytes!(concat!("data/kquant/", $name, ".f32"));
            assert_eq!(raw.len() % $module::BLOCK_BYTES, 0);
            assert_eq!(
                want.len() / 4,
                raw.len() / $module::BLOCK_BYTES * $module::QK
            );
            check_bit_exact($name, raw, want, $module::dequantize_row);
            // The dispatcher must route the type to the same reference.
            let mut via = vec![0f32; want.len() / 4];
            matvec::dequantize_row($ty, raw, &mut via).unwrap();
            assert_eq!(
                via.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                f32s(want).iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    };
}

dequant_test!(
    q2_k_dequantizes_like_llama_cpp,
    "Q2_K",
    q2_k,
    GgmlType::Q2_K
);
dequant_test!(
    q3_k_dequantizes_like_llama_cpp,
    "Q3_K",
    q3_k,
    GgmlType::Q3_K
);
// IQ4_XS: blocks llama.cpp quantized and dequantized itself (see data/kquant/README.md).
dequant_test!(
    iq4_xs_dequantizes_like_llama_cpp,
    "IQ4_XS",
    iq4_xs,
    GgmlType::IQ4_XS
);
dequant_test!(
    q4_k_dequantizes_like_llama_cpp,
    "Q4_K",
    q4_k,
    GgmlType::Q4_K
);
dequant_test!(
    q5_k_dequantizes_like_llama_cpp,
    "Q5_K",
    q5_k,
    GgmlType::Q5_K
);
dequant_test!(
    q6_k_dequantizes_like_llama_cpp,
    "Q6_K",
    q6_k,
    GgmlType::Q6_K
);

#[test]
fn q8_k_quantizes_like_llama_cpp_ref() {
    let x = f32s(include_bytes!("data/kquant/Q8_K.input.f32"));
    let want: &[u8] = include_bytes!("data/kquant/Q8_K.bin");
    assert_eq!(want.len(), x.len() / q8_k::QK * q8_k::BLOCK_BYTES);
    let mut got = vec![0xAAu8; want.len()];
    q8_k::quantize_row(&x, &mut got);
    for (b, (g, w)) in got
        .chunks_exact(q8_k::BLOCK_BYTES)
        .zip(want.chunks_exact(q8_k::BLOCK_BYTES))
        .enumerate()
    {
        assert_eq!(g[..4], w[..4], "block {b}: d differs");
        assert_eq!(g[4..260], w[4..260], "block {b}: quants differ");
        assert_eq!(g[260..], w[260..], "block {b}: bsums differ");
    }
}

#[test]
fn q8_k_takes_the_sign_of_the_first_extreme() {
    // Block 4 of the golden input has -127 before +127: iscale = -127 / -127 = +1, so
    // the quants keep the input's sign (llama.cpp's repacked-x86 quantizer would flip it).
    let x = f32s(include_bytes!("data/kquant/Q8_K.input.f32"));
    let mut q = vec![0u8; x.len() / 256 * q8_k::BLOCK_BYTES];
    q8_k::quantize_row(&x, &mut q);
    let b = &q8_k::act_blocks(&q)[4];
    assert_eq!(b.scale(), 1.0);
    assert_eq!(b.q(10), -127);
    assert_eq!(b.q(200), 127);
    // (k - 128) / 2 for odd k is a tie: half to even.
    assert_eq!(b.q(129), 0); // 0.5 -> 0
    assert_eq!(b.q(131), 2); // 1.5 -> 2
    assert_eq!(b.q(133), 2); // 2.5 -> 2
}
