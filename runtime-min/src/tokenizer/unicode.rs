//! The Unicode facts the tokenizers need: category flags per code point, UTF-8 decoding
//! with llama.cpp's error rules, and GPT-2's byte <-> printable-character mapping.
use super::unicode_tables::{RANGE_FLAGS, RANGE_START};

/// Compact per-code-point flags used by the pre-tokenizers.
pub(crate) const LETTER: u8 = 0x01;
pub(crate) const NUMBER: u8 = 0x02;
pub(crate) const SPACE: u8 = 0x04;
pub(crate) const MARK: u8 = 0x08;
pub(crate) const PUNCT: u8 = 0x10;
pub(crate) const SYMBOL: u8 = 0x20;
/// Set for every code point inside the text, so "no flags" means "outside the piece".
pub(crate) const ANY: u8 = 0x80;

// Bits of the generated table (same as llama.cpp's unicode_cpt_flags).
const T_NUMBER: u8 = 0x02;
const T_LETTER: u8 = 0x04;
const T_MARK: u8 = 0x10;
const T_PUNCT: u8 = 0x20;
const T_SYMBOL: u8 = 0x40;

/// Han (CJK ideograph) code points, as llama.cpp's `unicode_cpt_is_han` lists them.
pub(crate) fn is_han(cp: u32) -> bool {
    matches!(cp, 0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B820..=0x2CEAF | 0x2CEB0..=0x2EBEF | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// llama.cpp's White_Space set (unicode_set_whitespace).
fn is_white_space(cp: u32) -> bool {
    matches!(cp, 0x09..=0x0D | 0x20 | 0x85 | 0xA0 | 0x1680 | 0x2000..=0x200A | 0x2028 | 0x2029 | 0x202F | 0x205F | 0x3000)
}

/// Flags of one code point (ANY always set).
pub(crate) fn flags(cp: u32) -> u8 {
    let t = if cp >= 0x11_0000 {
        0x01
    } else {
        let i = RANGE_START.partition_point(|&s| s <= cp);
        RANGE_FLAGS[i.saturating_sub(1)]
    };
    let mut f = ANY;
    if t & T_LETTER != 0 {
        f |= LETTER;
    }
    if t & T_NUMBER != 0 {
        f |= NUMBER;
    }
    if t & T_MARK != 0 {
        f |= MARK;
    }
    if t & T_PUNCT != 0 {
        f |= PUNCT;
    }
    if t & T_SYMBOL != 0 {
        f |= SYMBOL;
    }
    if is_white_space(cp) {
        f |= SPACE;
    }
    f
}

/// Decode one code point at `bytes[0..]` the way llama.cpp's `unicode_cpt_from_utf8`
/// does: the lead byte gives the length, continuation bytes must be `10xxxxxx`, and
/// overlong forms or surrogates are *not* rejected. Returns (code point, bytes used);
/// an invalid sequence yields (U+FFFD, 1).
pub(crate) fn decode(bytes: &[u8]) -> (u32, usize) {
    let b0 = bytes[0] as u32;
    let cont = |i: usize| bytes.get(i).is_some_and(|&c| c & 0xC0 == 0x80);
    let c = |i: usize| (bytes[i] & 0x3F) as u32;
    if b0 & 0x80 == 0 {
        (b0, 1)
    } else if b0 & 0x40 == 0 {
        (0xFFFD, 1)
    } else if b0 & 0x20 == 0 {
        if cont(1) {
            (((b0 & 0x1F) << 6) | c(1), 2)
        } else {
            (0xFFFD, 1)
        }
    } else if b0 & 0x10 == 0 {
        if cont(1) && cont(2) {
            (((b0 & 0x0F) << 12) | (c(1) << 6) | c(2), 3)
        } else {
            (0xFFFD, 1)
        }
    } else if b0 & 0x08 == 0 {
        if cont(1) && cont(2) && cont(3) {
            let cp = ((b0 & 0x07) << 18) | (c(1) << 12) | (c(2) << 6) | c(3);
            // llama.cpp would throw re-encoding a code point past U+10FFFF; we keep going.
            if cp > 0x10_FFFF {
                (0xFFFD, 4)
            } else {
                (cp, 4)
            }
        } else {
            (0xFFFD, 1)
        }
    } else {
        (0xFFFD, 1)
    }
}

/// UTF-8 encoding of `cp` (must be <= U+10FFFF) into `out`; returns the length.
pub(crate) fn encode(cp: u32, out: &mut [u8; 4]) -> usize {
    if cp < 0x80 {
        out[0] = cp as u8;
        1
    } else if cp < 0x800 {
        out[0] = 0xC0 | (cp >> 6) as u8;
        out[1] = 0x80 | (cp & 0x3F) as u8;
        2
    } else if cp < 0x1_0000 {
        out[0] = 0xE0 | (cp >> 12) as u8;
        out[1] = 0x80 | ((cp >> 6) & 0x3F) as u8;
        out[2] = 0x80 | (cp & 0x3F) as u8;
        3
    } else {
        out[0] = 0xF0 | ((cp >> 18) & 0x07) as u8;
        out[1] = 0x80 | ((cp >> 12) & 0x3F) as u8;
        out[2] = 0x80 | ((cp >> 6) & 0x3F) as u8;
        out[3] = 0x80 | (cp & 0x3F) as u8;
        4
    }
}

/// GPT-2's byte -> code point map: printable Latin-1 bytes map to themselves, the other
/// 68 bytes to U+0100.. in byte order.
pub(crate) fn byte_to_cp(b: u8) -> u32 {
    let printable = |x: u8| matches!(x, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return b as u32;
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    0x100 + n
}

/// Inverse of [`byte_to_cp`].
pub(crate) fn cp_to_byte(cp: u32) -> Option<u8> {
    match cp {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => Some(cp as u8),
        0x100..=0x143 => {
            let mut n = cp - 0x100;
            for b in 0u8..=255 {
                if !matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF) {
                    if n == 0 {
                        return Some(b);
                    }
                    n -= 1;
                }
            }
            None
        }
        _ => None,
    }
}

/// Table form of [`byte_to_cp`] as UTF-8 (each at most 2 bytes): (bytes, len).
pub(crate) fn byte_encoding_table() -> [([u8; 2], u8); 256] {
    let mut t = [([0u8; 2], 0u8); 256];
    for (b, e) in t.iter_mut().enumerate() {
        let mut buf = [0u8; 4];
        let n = encode(byte_to_cp(b as u8), &mut buf);
        e.0.copy_from_slice(&buf[..2]);
        e.1 = n as u8;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_round_trips_and_matches_gpt2() {
        assert_eq!(byte_to_cp(b' '), 0x120); // 'Ġ'
        assert_eq!(byte_to_cp(b'\n'), 0x10A); // 'Ċ'
        assert_eq!(byte_to_cp(b'a'), 'a' as u32);
        for b in 0u8..=255 {
            assert_eq!(cp_to_byte(byte_to_cp(b)), Some(b));
        }
    }

    #[test]
    fn flags_know_basic_categories() {
        assert_ne!(flags('a' as u32) & LETTER, 0);
        assert_ne!(flags('é' as u32) & LETTER, 0);
        assert_ne!(flags('7' as u32) & NUMBER, 0);
        assert_ne!(flags(' ' as u32) & SPACE, 0);
        assert_ne!(flags(0x3000) & SPACE, 0);
        assert_ne!(flags(0x301 /* combining acute */) & MARK, 0);
        assert_ne!(flags('!' as u32) & PUNCT, 0);
        assert_eq!(flags('$' as u32) & (LETTER | NUMBER | SPACE | PUNCT), 0);
    }

    #[test]
    fn decode_replaces_invalid_bytes_one_at_a_time() {
        assert_eq!(decode(&[0xC3, 0xA9]), (0xE9, 2));
        assert_eq!(decode(&[0x80]), (0xFFFD, 1));
        assert_eq!(decode(&[0xE2, 0x82]), (0xFFFD, 1));
        assert_eq!(decode(&[0xF0, 0x9F, 0x98, 0x80]), (0x1F600, 4));
        assert_eq!(decode(&[0xFF]), (0xFFFD, 1));
    }
}
