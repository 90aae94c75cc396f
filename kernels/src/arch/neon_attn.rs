//! NEON attention loops (same bits as `crate::attn`'s scalar reference: identical lane
//! structure, and `vfmaq_f32` is exactly rounded). f16 caches are widened in software.
#![allow(unsafe_code)]
use core::arch::aarch64::*;

use crate::attn::{KvRow, KvRows};
use crate::cpu::Neon;
use crate::f16::f16_to_f32;
use crate::quant::float::hsum16;

/// Dot product; `None` if lengths differ.
pub fn dot(_: Neon, k: KvRow, q: &[f32]) -> Option<f32> {
    if k.len() != q.len() {
        return None;
    }
    // SAFETY: the `Neon` token proves Advanced SIMD; loads stay inside the slices (lengths checked).
    Some(unsafe { dot_neon(k, q) })
}

/// `acc += v * w` fused; `false` if lengths differ.
pub fn fma_row(_: Neon, v: KvRow, w: f32, acc: &mut [f32]) -> bool {
    if v.len() < acc.len() {
        return false;
    }
    // SAFETY: as in `dot`; `acc.len() <= v.len()` keeps every access in bounds.
    unsafe { fma_row_neon(v, w, acc) };
    true
}

#[inline]
unsafe fn load4(k: &KvRow, i: usize) -> float32x4_t {
    match k {
        KvRow::F32(s) => vld1q_f32(s[i..i + 4].as_ptr()),
        KvRow::F16(s) => widen4(vld1_u16(s[i..i + 4].as_ptr())),
    }
}

/// Four f16 values widened to f32 with `fcvtl` (base AArch64 SIMD; exact, as
/// `f16_to_f32`, for every value but signalling NaNs, which it quiets, as F16C does).
/// Inline assembly because the intrinsic needs Rust's unstable `f16` types.
#[inline(always)]
unsafe fn widen4(h: uint16x4_t) -> float32x4_t {
    let r: float32x4_t;
    core::arch::asm!(
        "fcvtl {r:v}.4s, {h:v}.4h",
        r = out(vreg) r,
        h = in(vreg) h,
        options(pure, nomem, nostack, preserves_flags)
    );
    r
}

#[inline]
fn at(k: &KvRow, i: usize) -> f32 {
    match k {
        KvRow::F32(s) => s[i],
        KvRow::F16(s) => f16_to_f32(s[i]),
    }
}

#[inline]
unsafe fn fmaf(a: f32, b: f32, c: f32) -> f32 {
    vgetq_lane_f32::<0>(vfmaq_f32(vdupq_n_f32(c), vdupq_n_f32(a), vdupq_n_f32(b)))
}

unsafe fn dot_neon(k: KvRow, q: &[f32]) -> f32 {
    let n = q.len();
    let np = n / 64 * 64;
    // acc[4j + m]: lanes 4m..4m+4 of the reference's accumulator j.
    let mut acc = [vdupq_n_f32(0.0); 16];
    let mut base = 0;
    while base < np {
        for (r, a) in acc.iter_mut().enumerate() {
            let i = base + 4 * r;
            *a = vfmaq_f32(*a, load4(&k, i), vld1q_f32(q[i..i + 4].as_ptr()));
        }
        base += 64;
    }
    let mut lanes = [0.0f32; 16];
    for m in 0..4 {
        let v = vaddq_f32(
            vaddq_f32(acc[m], acc[8 + m]),
            vaddq_f32(acc[4 + m], acc[12 + m]),
        );
        vst1q_f32(lanes[4 * m..4 * m + 4].as_mut_ptr(), v);
    }
    let mut s = hsum16(lanes);
    for (i, qi) in q.iter().enumerate().skip(np) {
        s = fmaf(at(&k, i), *qi, s);
    }
    s
}

unsafe fn fma_row_neon(v: KvRow, w: f32, acc: &mut [f32]) {
    let n = acc.len();
    let n4 = n / 4 * 4;
    let wv = vdupq_n_f32(w);
    let mut i = 0;
    while i < n4 {
        let a = vld1q_f32(acc[i..i + 4].as_ptr());
        vst1q_f32(acc[i..i + 4].as_mut_ptr(), vfmaq_f32(a, load4(&v, i), wv));
        i += 4;
    }
    for (j, a) in acc.iter_mut().enumerate().skip(n4) {
        *a = fmaf(at(&v, j), w, *a);
    }
}

/// A stored key/value element: f32 or f16 bits.
trait Elem: Copy {
    /// Four values from `p` widened to f32.
    unsafe fn load4(p: *const Self) -> float32x4_t;
    /// One value widened to f32.
    unsafe fn load1(p: *const Self) -> f32;
}

impl Elem for f32 {
    #[inline(always)]
    unsafe fn load4(p: *const f32) -> float32x4_t {
        vld1q_f32(p)
    }
    #[inline(always)]
    unsafe fn load1(p: *const f32) -> f32 {
        *p
    }
}

impl Elem for u16 {
    #[inline(always)]
    unsafe fn load4(p: *const u16) -> float32x4_t {
        widen4(vld1_u16(p))
    }
    #[inline(always)]
    unsafe fn load1(p: *const u16) -> f32 {
        f16_to_f32(*p)
    }
}

fn ptrs(ins: &[&[f32]], outs: &mut [&mut [f32]]) -> ([*const f32; 4], [*mut f32; 4]) {
    let i = core::array::from_fn(|g| ins.get(g).map_or(core::ptr::null(), |s| s.as_ptr()));
    let mut o = [core::ptr::null_mut(); 4];
    for (p, s) in o.iter_mut().zip(outs.iter_mut()) {
        *p = s.as_mut_ptr();
    }
    (i, o)
}

/// `crate::attn::dots` for 1 to 4 queries; `false` if the shapes do not fit.
pub fn dots(_: Neon, k: &KvRows, qs: &[&[f32]], outs: &mut [&mut [f32]]) -> bool {
    let g = qs.len();
    if !(1..=4).contains(&g)
        || outs.len() != g
        || qs.iter().any(|q| q.len() != k.row_len())
        || outs.iter().any(|o| o.len() < k.rows())
    {
        return false;
    }
    let (qp, op) = ptrs(qs, outs);
    let (s, len, n) = (k.stride(), k.row_len(), k.rows());
    // SAFETY: the `Neon` token proves Advanced SIMD. `KvRows::new` checked that `n` rows of `len`
    // values at stride `s` lie inside the data; each of the first `g` query pointers has
    // `len` values and each output at least `n` (checked above); the kernels touch only
    // the first `g` pointers.
    unsafe {
        match k.data() {
            KvRow::F32(d) => dots_g(d.as_ptr(), s, len, n, g, qp, op),
            KvRow::F16(d) => dots_g(d.as_ptr(), s, len, n, g, qp, op),
        }
    }
    true
}

unsafe fn dots_g<E: Elem>(
    k: *const E,
    s: usize,
    len: usize,
    n: usize,
    g: usize,
    qp: [*const f32; 4],
    op: [*mut f32; 4],
) {
    match g {
        1 => dots_neon::<E, 1, 16>(k, s, len, n, qp, op),
        2 => dots_neon::<E, 2, 8>(k, s, len, n, qp, op),
        3 => dots_neon::<E, 3, 4>(k, s, len, n, qp, op),
        _ => dots_neon::<E, 4, 4>(k, s, len, n, qp, op),
    }
}

/// `dot_neon` of every row with `G` queries: each 4-value slice of a row is loaded
/// (and widened) once for all queries. The reference's sixteen accumulators (`acc[r]`:
/// values `64 b + 4 r ..` of every block `b`) are independent chains, run `R` at a time
/// and combined exactly as `dot_neon` does.
#[inline(always)]
unsafe fn dots_neon<E: Elem, const G: usize, const R: usize>(
    k: *const E,
    s: usize,
    len: usize,
    n: usize,
    qp: [*const f32; 4],
    op: [*mut f32; 4],
) {
    let np = len / 64 * 64;
    for j in 0..n {
        let kp = k.add(j * s);
        let mut part = [[vdupq_n_f32(0.0); 16]; G];
        let mut r0 = 0;
        while r0 < 16 {
            let mut acc = [[vdupq_n_f32(0.0); R]; G];
            let mut base = 0;
            while base < np {
                for rr in 0..R {
                    let i = base + 4 * (r0 + rr);
                    let kv = E::load4(kp.add(i));
                    for (a, q) in acc.iter_mut().zip(qp) {
                        a[rr] = vfmaq_f32(a[rr], kv, vld1q_f32(q.add(i)));
                    }
                }
                base += 64;
            }
            for (p, a) in part.iter_mut().zip(&acc) {
                p[r0..r0 + R].copy_from_slice(a);
            }
            r0 += R;
        }
        for ((p, q), o) in part.iter().zip(qp).zip(op) {
            let v: [float32x4_t; 4] = core::array::from_fn(|m| {
                vaddq_f32(vaddq_f32(p[m], p[8 + m]), vaddq_f32(p[4 + m], p[12 + m]))
            });
            // hsum16 of lanes v[0] (0-3) .. v[3] (12-15) with the same additions.
            let t4 = vaddq_f32(vaddq_f32(v[0], v[2]), vaddq_f32(v[1], v[3]));
            let x = vaddq_f32(t4, vextq_f32::<2>(t4, t4));
            let mut sum = vgetq_lane_f32::<0>(x) + vgetq_lane_f32::<1>(x);
            for i in np..len {
                sum = fmaf(E::load1(kp.add(i)), *q.add(i), sum);
            }
            *o.add(j) = sum;
        }
    }
}

/// `crate::attn::weighted_sum` for 1 to 4 queries; `false` if the shapes do not fit or
/// an output is not finite (the caller then takes the scalar path). As on x86 (see
/// `x86_attn::weighted_sum`), a row is read for every query once any query weighs it,
/// which matches the reference exactly whenever the outputs are finite.
pub fn weighted_sum(_: Neon, v: &KvRows, ws: &[&[f32]], outs: &mut [&mut [f32]]) -> bool {
    let g = ws.len();
    let (len, n) = (v.row_len(), v.rows());
    if !(1..=4).contains(&g)
        || outs.len() != g
        || ws.iter().any(|w| w.len() < n)
        || outs.iter().any(|o| o.len() != len)
    {
        return false;
    }
    let (wp, op) = ptrs(ws, outs);
    let s = v.stride();
    // SAFETY: as in `dots`: the rows lie inside the data (`KvRows::new`), the first `g`
    // weight pointers have at least `n` values and the outputs `len` (checked above).
    let done = unsafe {
        match v.data() {
            KvRow::F32(d) => wsum_g(d.as_ptr(), s, len, n, g, wp, op),
            KvRow::F16(d) => wsum_g(d.as_ptr(), s, len, n, g, wp, op),
        }
    };
    crate::attn::weighted_sum_cols(v, ws, outs, done);
    outs.iter().all(|o| o.iter().all(|x| x.is_finite()))
}

unsafe fn wsum_g<E: Elem>(
    v: *const E,
    s: usize,
    len: usize,
    n: usize,
    g: usize,
    wp: [*const f32; 4],
    op: [*mut f32; 4],
) -> usize {
    match g {
        1 => wsum_neon::<E, 1, 8>(v, s, len, n, wp, op),
        2 => wsum_neon::<E, 2, 8>(v, s, len, n, wp, op),
        3 => wsum_neon::<E, 3, 4>(v, s, len, n, wp, op),
        _ => wsum_neon::<E, 4, 4>(v, s, len, n, wp, op),
    }
}

/// Columns in blocks of `4 NB`: for each lane `l`, the rows `l, l + 16, ...` are
/// accumulated in registers for all `G` queries, then the 16 lanes are reduced with
/// `hsum16`'s tree, column-wise. Returns the number of columns done.
#[allow(clippy::needless_range_loop)] // `b` picks the column block of `r[i][b]`
#[inline(always)]
unsafe fn wsum_neon<E: Elem, const G: usize, const NB: usize>(
    v: *const E,
    s: usize,
    len: usize,
    n: usize,
    wp: [*const f32; 4],
    op: [*mut f32; 4],
) -> usize {
    let bw = 4 * NB;
    let nb = len / bw * bw;
    let mut d0 = 0;
    while d0 < nb {
        let mut red = [[[vdupq_n_f32(0.0); NB]; 16]; G];
        for l in 0..16 {
            let mut acc = [[vdupq_n_f32(0.0); NB]; G];
            let mut j = l;
            while j < n {
                let w: [f32; G] = core::array::from_fn(|g| *wp[g].add(j));
                if w.iter().any(|x| *x != 0.0) {
                    let p = v.add(j * s + d0);
                    let x: [float32x4_t; NB] = core::array::from_fn(|b| E::load4(p.add(4 * b)));
                    for (a, wg) in acc.iter_mut().zip(w) {
                        let wb = vdupq_n_f32(wg);
                        for (ab, xb) in a.iter_mut().zip(&x) {
                            *ab = vfmaq_f32(*ab, *xb, wb);
                        }
                    }
                }
                j += 16;
            }
            for (r, a) in red.iter_mut().zip(&acc) {
                r[l] = *a;
            }
        }
        for (r, o) in red.iter().zip(op) {
            for b in 0..NB {
                let t8: [float32x4_t; 8] =
                    core::array::from_fn(|i| vaddq_f32(r[i][b], r[i + 8][b]));
                let t4: [float32x4_t; 4] = core::array::from_fn(|i| vaddq_f32(t8[i], t8[i + 4]));
                let sum = vaddq_f32(vaddq_f32(t4[0], t4[2]), vaddq_f32(t4[1], t4[3]));
                vst1q_f32(o.add(d0 + 4 * b), sum);
            }
        }
        d0 += bw;
    }
    nb
}
