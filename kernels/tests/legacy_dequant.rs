//! Bit-exact dequantization of real llama.cpp blocks.
//!
//! `data/legacy/<TYPE>.bin` holds raw blocks cut from the tiny GGUF fixtures (quantized
//! by llama.cpp's own `llama-quantize`) and `<TYPE>.f32` the values llama.cpp's reference
//! dequantizer gives for them (see `data/legacy/README.md` for provenance and
//! `tools/gen_dequant_vectors.py` for the command). Dequantization is one multiply (and
//! for Q4_1/Q5_1 one add) per value with no reassociation, so equality is exact: `==`
//! on the f32 bits, no tolerance.
use pinch_kernels::matvec::dequantize_row;
use pinch_kernels::GgmlType;

fn load(name: &str) -> (Vec<u8>, Vec<f32>) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/legacy/");
    let raw = std::fs::read(format!("{dir}{name}.bin")).expect("vector .bin");
    let f = std::fs::read(format!("{dir}{name}.f32")).expect("vector .f32");
    let vals = f
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (raw, vals)
}

fn check(ty: GgmlType) {
    let (raw, expect) = load(ty.name());
    assert!(!expect.is_empty());
    let mut out = vec![f32::NAN; expect.len()];
    dequantize_row(ty, &raw, &mut out).expect("shape");
    let mut bad = 0;
    for (i, (a, b)) in out.iter().zip(&expect).enumerate() {
        if a.to_bits() != b.to_bits() {
            if bad < 5 {
                eprintln!("{}: value {i}: got {a:e}, llama.cpp {b:e}", ty.name());
            }
            bad += 1;
        }
    }
    assert_eq!(
        bad,
        0,
        "{}: {bad} of {} values differ",
        ty.name(),
        expect.len()
    );
}

#[test]
fn f16_matches_llama_cpp_bit_for_bit() {
    check(GgmlType::F16);
}
#[test]
fn bf16_matches_llama_cpp_bit_for_bit() {
    check(GgmlType::BF16);
}
#[test]
fn q8_0_matches_llama_cpp_bit_for_bit() {
    check(GgmlType::Q8_0);
}
#[test]
fn q4_0_matches_llama_cpp_bit_for_bit() {
    check(GgmlType::Q4_0);
}
#[test]
fn q4_1_matches_llama_cpp_bit_for_bit() {
    check(GgmlType::Q4_1);
}
#[test]
fn q5_0_matches_llama_cpp_bit_for_bit() {
    check(GgmlType::Q5_0);
}
#[test]
fn q5_1_matches_llama_cpp_bit_for_bit() {
    check(GgmlType::Q5_1);
}
#[test]
fn iq4_nl_matches_llama_cpp_bit_for_bit() {
    check(GgmlType::IQ4_NL);
}
#[test]
fn q1_0_matches_llama_cpp_bit_for_bit() {
    check(GgmlType::Q1_0);
}
#[test]
fn q2_0_matches_llama_cpp_bit_for_bit() {
    check(GgmlType::Q2_0);
}
#[test]
fn tq1_0_matches_llama_cpp_bit_for_bit() {
    check(GgmlType::TQ1_0);
}
#[test]
fn tq2_0_matches_llama_cpp_bit_for_bit() {
    check(GgmlType::TQ2_0);
}
