//! IQ4_XS against Q8_K on AVX2, one row at a time.
//!
//! Per 32-weight sub-block: the 16 index bytes and their copy shifted right by four fill
//! one 256-bit register (low half: weights 0..16, high half: 16..32), masked to nibbles
//! and turned into table values by one `vpshufb` (IQ4_NL's 16 levels, broadcast to both
//! halves). `vpmaddubsw` needs one unsigned operand, so the sign moves to the weights:
//! `|a| * sign(a) w`. That is exact for every activation, -128 included (its magnitude is
//! 128 as an unsigned byte; a level is never -128, so negating one cannot wrap), and a
//! pair sum stays within 2 * 128 * 127 < 32767. `vpmaddwd` by the sub-block's signed
//! scale leaves eight exact int32 lanes per super-block: llama.cpp's x86 lanes, fed to
//! eight f32 accumulators by one `vfmadd` per block and reduced at the end of the row in
//! `hsum_float_8`'s order, as the scalar reference ([`crate::quant::iq4_xs::vec_dot`])
//! does, so the result is its bits (and llama.cpp's AVX2 kernel's).
//!
//! # Safety (for every `unsafe fn` here)
//! Callers must run on a CPU with AVX2; memory is read only through slices of the
//! blocks.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::x86_kquant::{hsum_f32, load32};
use crate::f16::read_f16;
use crate::quant::iq4_nl::KVALUES;
use crate::quant::iq4_xs::{BlockIq4Xs, SUB};
use crate::quant::q8_k::BlockQ8K;

/// AVX2 dot product of IQ4_XS blocks with Q8_K blocks.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_avx2(x: &[BlockIq4Xs], y: &[BlockQ8K]) -> f32 {
    let levels = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES.as_ptr() as *const __m128i));
    let m4 = _mm256_set1_epi8(0x0f);
    let mut accf = _mm256_setzero_ps();
    for (bx, by) in x.iter().zip(y) {
        let mut acc = _mm256_setzero_si256();
        for (ib, ls) in bx.scales().into_iter().enumerate() {
            let q = _mm_loadu_si128(bx.qs[16 * ib..16 * ib + 16].as_ptr() as *const __m128i);
            let idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(q), q), m4);
            let w = _mm256_shuffle_epi8(levels, idx);
            let a = load32(&by.qs[SUB * ib..]);
            let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(w, a));
            let p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(ls as i16));
            acc = _mm256_add_epi32(acc, p32);
        }
        let d = _mm256_set1_ps(read_f16(bx.d) * by.scale());
        accf = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(acc), accf);
    }
    hsum_f32(accf)
}
