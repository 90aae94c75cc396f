//! AVX2 one-token step of the gated delta rule ([`crate::recurrent::delta_head_step`]),
//! same bits as the scalar reference.
//!
//! The reference runs each state row as 8-lane blocks (one accumulator of 8 lanes, plain
//! multiplies and adds, the lanes folded in order at the end). Here eight rows run
//! together: each block of `k` and `q` is loaded once for the eight rows, their eight
//! accumulators are independent chains, and the in-order fold is done for all eight at
//! once after an 8x8 transpose (lane `l` of every row in one register, added in lane
//! order). No fused multiply-add, so every value is rounded as in the reference.
#![allow(unsafe_code)]
use core::arch::x86_64::*;

use crate::cpu::Avx2;
use crate::recurrent::HeadToken;

/// Rows per group (one ymm of per-row values).
const ROWS: usize = 8;

/// [`crate::recurrent::delta_head_step`] for a head dimension `d = v.len()` that is a
/// multiple of 8, with `scale = 1 / sqrt(d)`; `false` (nothing computed) when `d` is not
/// a multiple of 8 or a slice is shorter than `d` (`state`: `d * d`).
pub fn head_step(
    _: Avx2,
    state: &mut [f32],
    x: HeadToken<'_>,
    scale: f32,
    out: &mut [f32],
) -> bool {
    let d = x.v.len();
    if d == 0
        || !d.is_multiple_of(ROWS)
        || x.q.len() < d
        || x.k.len() < d
        || out.len() < d
        || state.len() < d * d
    {
        return false;
    }
    // SAFETY: the `Avx2` token proves AVX2 (only detection hands it out); the kernel reads
    // `d` values of `q`, `k`, `v`, writes `d` of `out` and `d * d` of `state`, all
    // checked above.
    unsafe { head_step_avx2(state, x, scale, out) };
    true
}

/// Lane `l` of row `j` for every `j` → register `l`, lane `j` (8x8 transpose).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xee>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xee>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xee>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xee>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// Eight rows' accumulators folded as the reference does (`0 + lane 0 + lane 1 + ...`),
/// row `j`'s sum in lane `j`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn fold8(acc: [__m256; 8]) -> __m256 {
    let t = transpose8(acc);
    let mut s = _mm256_setzero_ps();
    for tl in t {
        s = _mm256_add_ps(s, tl);
    }
    s
}

#[target_feature(enable = "avx2")]
unsafe fn head_step_avx2(state: &mut [f32], x: HeadToken<'_>, scale: f32, out: &mut [f32]) {
    let HeadToken {
        q,
        k,
        v,
        decay,
        beta,
    } = x;
    let d = v.len();
    let (sp, qp, kp, vp, op) = (
        state.as_mut_ptr(),
        q.as_ptr(),
        k.as_ptr(),
        v.as_ptr(),
        out.as_mut_ptr(),
    );
    let (dec, bet, sc) = (
        _mm256_set1_ps(decay),
        _mm256_set1_ps(beta),
        _mm256_set1_ps(scale),
    );
    let mut j0 = 0;
    while j0 < d {
        let rows = sp.add(j0 * d);
        // Pass 1: Sᵀk for the eight rows.
        let mut acc = [_mm256_setzero_ps(); ROWS];
        let mut c = 0;
        while c < d {
            let kc = _mm256_loadu_ps(kp.add(c));
            for (r, a) in acc.iter_mut().enumerate() {
                let x = _mm256_loadu_ps(rows.add(r * d + c));
                *a = _mm256_add_ps(*a, _mm256_mul_ps(x, kc));
            }
            c += ROWS;
        }
        // δ = (v - (Sᵀk)·e)·β, row j in lane j.
        let dot = fold8(acc);
        let delta = _mm256_mul_ps(
            _mm256_sub_ps(_mm256_loadu_ps(vp.add(j0)), _mm256_mul_ps(dot, dec)),
            bet,
        );
        let mut dl = [0.0f32; ROWS];
        _mm256_storeu_ps(dl.as_mut_ptr(), delta);
        let dv: [__m256; ROWS] = core::array::from_fn(|r| _mm256_set1_ps(dl[r]));
        // Pass 2: row = row·e + k·δ, then Sᵀq over the updated rows.
        let mut acc = [_mm256_setzero_ps(); ROWS];
        let mut c = 0;
        while c < d {
            let kc = _mm256_loadu_ps(kp.add(c));
            let qc = _mm256_loadu_ps(qp.add(c));
            for (r, a) in acc.iter_mut().enumerate() {
                let p = rows.add(r * d + c);
                let x = _mm256_add_ps(
                    _mm256_mul_ps(_mm256_loadu_ps(p), dec),
                    _mm256_mul_ps(kc, dv[r]),
                );
                _mm256_storeu_ps(p, x);
                *a = _mm256_add_ps(*a, _mm256_mul_ps(x, qc));
            }
            c += ROWS;
        }
        _mm256_storeu_ps(op.add(j0), _mm256_mul_ps(fold8(acc), sc));
        j0 += ROWS;
    }
}
