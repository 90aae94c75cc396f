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

#[cfg(test)]
mod tests {
    use super::*;

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
