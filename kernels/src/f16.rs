//! IEEE 754 half precision and bfloat16 conversions, in software.
//!
//! Bit-exact with ggml's `GGML_FP16_TO_FP32` / `GGML_FP32_TO_FP16` (round to nearest
//! even, NaN kept as a quiet NaN) and `GGML_FP32_TO_BF16` (round to nearest even).

/// Half-precision bits to f32 (exact: every f16 is representable).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x03ff) as u32;
    let bits = if exp == 0 {
        if mant == 0 {
            sign
        } else {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut m = mant;
            while m & 0x0400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x03ff) << 13)
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (mant << 13)
    } else {
        sign | ((exp + 127 - 15) << 23) | (mant << 13)
    };
    f32::from_bits(bits)
}

/// f32 to half-precision bits, round to nearest even (as the F16C instruction does).
#[inline]
pub fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let mant = x & 0x007f_ffff;
    if exp == 0xff {
        // Inf or NaN.
        return sign
            | 0x7c00
            | if mant != 0 {
                0x0200 | (mant >> 13) as u16
            } else {
                0
            };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        // Subnormal half: shift the implicit-one mantissa, round to nearest even.
        let m = mant | 0x0080_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut r = m >> shift;
        if rest > half || (rest == half && (r & 1) == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (r & 1) == 1) {
        r += 1; // may carry into the exponent, which is the correct rounding
    }
    sign | r as u16
}

/// bfloat16 bits to f32 (exact).
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 to bfloat16 bits, round to nearest even; NaN stays NaN.
#[inline]
pub fn f32_to_bf16(f: f32) -> u16 {
    let x = f.to_bits();
    if (x & 0x7fff_ffff) > 0x7f80_0000 {
        return ((x >> 16) | 64) as u16;
    }
    ((x + (0x7fff + ((x >> 16) & 1))) >> 16) as u16
}

/// Read a little-endian f16 from two bytes and widen it.
#[inline]
pub fn read_f16(b: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(b))
}

/// `dst[i] = f16_to_f32(src[i])` over `min(src.len(), dst.len())` values, eight at a
/// time with F16C where `feat` has it (same bits).
pub fn widen_slice(feat: &crate::CpuFeatures, src: &[u16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    let done = crate::arch::x86_f16::widen(feat, src, dst);
    #[cfg(not(target_arch = "x86_64"))]
    let done = {
        let _ = feat;
        0
    };
    for (d, s) in dst.iter_mut().zip(src).skip(done) {
        *d = f16_to_f32(*s);
    }
}

/// `dst[i] = f32_to_f16(src[i])` over `min(src.len(), dst.len())` values, eight at a
/// time with F16C where `feat` has it (same bits).
pub fn narrow_slice(feat: &crate::CpuFeatures, src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    let done = crate::arch::x86_f16::narrow(feat, src, dst);
    #[cfg(not(target_arch = "x86_64"))]
    let done = {
        let _ = feat;
        0
    };
    for (d, s) in dst.iter_mut().zip(src).skip(done) {
        *d = f32_to_f16(*s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_conversions_match_the_scalar_ones_bit_for_bit() {
        extern crate std;
        use std::vec::Vec;
        let feats = [crate::CpuFeatures::SCALAR, crate::CpuFeatures::detect()];
        // The fast path really runs where the CPU has it.
        #[cfg(target_arch = "x86_64")]
        if feats[1].avx2() {
            let mut w = [0f32; 9];
            assert_eq!(
                crate::arch::x86_f16::widen(&feats[1], &[0x3c00; 9], &mut w),
                8
            );
            assert_eq!((&w[..8], w[8]), (&[1.0f32; 8][..], 0.0));
        }
        // Every f16 (odd length: a tail past the last block of 8), then f32 values
        // around every rounding case: halfway points, subnormals, overflow, NaN.
        let halves: Vec<u16> = (0..=u16::MAX).collect();
        let mut floats: Vec<f32> = Vec::new();
        for h in (0..=u16::MAX).step_by(7) {
            let f = f16_to_f32(h);
            floats.extend([f, f * (1.0 + 1.0 / 2048.0), f * 1.000_3, -f * 0.999_7]);
        }
        floats.extend([65520.0, 65519.0, 1e-8, -6e-8, f32::NAN, f32::INFINITY, 1e30]);
        floats.push(0.5);
        for feat in feats {
            let mut wide = std::vec![0f32; halves.len() - 3];
            widen_slice(&feat, &halves[..wide.len()], &mut wide);
            for (h, w) in halves.iter().zip(&wide) {
                let want = f16_to_f32(*h);
                assert!(w.to_bits() == want.to_bits() || (w.is_nan() && want.is_nan()));
            }
            let mut narrow = std::vec![0u16; floats.len()];
            narrow_slice(&feat, &floats, &mut narrow);
            for (f, n) in floats.iter().zip(&narrow) {
                let want = f32_to_f16(*f);
                let nan = |b: u16| b & 0x7c00 == 0x7c00 && b & 0x3ff != 0;
                assert!(
                    *n == want || (nan(*n) && nan(want)),
                    "{f}: {n:#06x} vs {want:#06x}"
                );
            }
        }
    }

    #[test]
    fn every_f16_round_trips_through_f32() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f16_to_f32(f32_to_f16(f)).is_nan());
            } else {
                assert_eq!(f32_to_f16(f), h, "h={h:#06x} f={f}");
            }
        }
    }

    #[test]
    fn f32_to_f16_rounds_to_nearest_even() {
        // 1 + 2^-11 is exactly half-way between 1.0 and the next half (1 + 2^-10): ties to even.
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3c02);
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // rounds to inf
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001); // smallest subnormal
    }

    #[test]
    fn bf16_round_trip() {
        assert_eq!(bf16_to_f32(f32_to_bf16(1.5)), 1.5);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    }
}
