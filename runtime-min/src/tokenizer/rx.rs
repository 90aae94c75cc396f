//! The part of `std::regex` (ECMAScript) that llama.cpp's pre-tokenizer regexes use,
//! as data plus a small backtracking matcher.
//!
//! llama.cpp runs the regexes it has no hand-written splitter for through `std::regex`
//! (`unicode_regex_split_stl`). Code points are first mapped to one "effective
//! character" each: ASCII stays itself, non-ASCII whitespace becomes U+000B, and, when the
//! regex names a Unicode category (`\p{L}` ...), every other non-ASCII code point
//! becomes a byte standing for its category (the "collapsed" text); otherwise it stays
//! itself and classes compare code points. A [`Set`] answers membership for either
//! form: an ASCII bitmap, the categories a non-ASCII code point may have, and non-ASCII
//! ranges.
//!
//! A regex is a list of alternatives ([`Alt`]), each a sequence of [`Item`]s; the first
//! alternative that matches at a position wins, and within one, greedy repetitions back
//! off one code point at a time, as ECMAScript does. Recursion is one level per item
//! (at most a handful), never per code point.
use super::unicode::{LETTER, MARK, NUMBER, PUNCT, SPACE, SYMBOL};

/// Unbounded repetition.
pub(crate) const INF: u16 = u16::MAX;

/// A character class over effective characters (see the module doc).
#[derive(Clone, Copy)]
pub(crate) struct Set {
    /// ASCII members, one bit per code point.
    pub(crate) ascii: u128,
    /// Category flags ([`LETTER`] ...) whose non-ASCII code points are members.
    pub(crate) cats: u8,
    /// Non-ASCII members as inclusive ranges.
    pub(crate) ranges: &'static [(u32, u32)],
    /// `[^...]`
    pub(crate) neg: bool,
}

/// Bits of the ASCII bytes in `s`.
pub(crate) const fn bits(s: &[u8]) -> u128 {
    let mut b = 0u128;
    let mut i = 0;
    while i < s.len() {
        b |= 1 << s[i];
        i += 1;
    }
    b
}

/// Bits of the ASCII range `a..=b`.
pub(crate) const fn span(a: u8, b: u8) -> u128 {
    let mut m = 0u128;
    let mut c = a;
    while c <= b {
        m |= 1 << c;
        c += 1;
    }
    m
}

impl Set {
    pub(crate) const fn ascii(ascii: u128) -> Set {
        Set {
            ascii,
            cats: 0,
            ranges: &[],
            neg: false,
        }
    }
    pub(crate) const fn cat(ascii: u128, cats: u8) -> Set {
        Set {
            ascii,
            cats,
            ranges: &[],
            neg: false,
        }
    }
    pub(crate) const fn ranges(ascii: u128, ranges: &'static [(u32, u32)]) -> Set {
        Set {
            ascii,
            cats: 0,
            ranges,
            neg: false,
        }
    }
    pub(crate) const fn not(self) -> Set {
        Set {
            neg: !self.neg,
            ..self
        }
    }

    /// Whether code point `cp` with flags `f` is a member.
    #[inline]
    pub(crate) fn has(&self, cp: u32, f: u8) -> bool {
        let c = if cp >= 0x80 && f & SPACE != 0 {
            0x0B
        } else {
            cp
        };
        let inside = if c < 0x80 {
            self.ascii >> c & 1 != 0
        } else {
            f & self.cats != 0 || self.ranges.iter().any(|&(a, b)| a <= c && c <= b)
        };
        inside != self.neg
    }
}

/// One element of an alternative.
#[derive(Clone, Copy)]
pub(crate) enum Item {
    /// `set{min,max}`, greedy ([`INF`]: no upper bound).
    Rep(Set, u16, u16),
    /// An ASCII literal.
    Lit(&'static [u8]),
    /// `(?!set)`: the next code point is not in `set`, or the piece ends.
    NotAhead(Set),
    /// An English contraction, `'s|'t|'re|'ve|'m|'ll|'d`; `any_case` lets the letters be
    /// upper case too, `opt` makes it `(?:...)?`.
    Contraction { any_case: bool, opt: bool },
    /// `(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+` (EXAONE-MoE); only as an alternative's last item.
    LetterWords,
    /// `(?=(\d{3})+(?!\d))`: zero width, before a run of ASCII digits whose length is a
    /// positive multiple of 3.
    DigitTriplesAhead,
}

/// A sequence of items.
pub(crate) type Alt = &'static [Item];

/// The code points of one piece and their flags.
pub(crate) struct Text<'c> {
    pub(crate) c: &'c [u32],
    pub(crate) f: &'c [u8],
}

impl Text<'_> {
    #[inline]
    fn at(&self, i: usize) -> Option<(u32, u8)> {
        Some((*self.c.get(i)?, self.f[i]))
    }
    #[inline]
    fn run(&self, s: &Set, pos: usize, max: u16) -> usize {
        let mut n = 0;
        while n < max as usize {
            match self.at(pos + n) {
                Some((c, f)) if s.has(c, f) => n += 1,
                _ => break,
            }
        }
        n
    }
}

/// Length of a contraction at `pos`.
pub(crate) fn contraction(c: &[u32], pos: usize, any_case: bool) -> Option<usize> {
    if c.get(pos) != Some(&('\'' as u32)) {
        return None;
    }
    let l = |i: usize| {
        let x = c.get(pos + i).copied().unwrap_or(0);
        if any_case && (b'A' as u32..=b'Z' as u32).contains(&x) {
            x + 32
        } else {
            x
        }
    };
    let (a, b) = (l(1), l(2));
    if [b's', b't', b'm', b'd'].iter().any(|&x| a == x as u32) {
        return Some(2);
    }
    let pair = |x: u8, y: u8| a == x as u32 && b == y as u32;
    (pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l')).then_some(3)
}

fn seq(items: &[Item], t: &Text, pos: usize) -> Option<usize> {
    let Some((first, rest)) = items.split_first() else {
        return Some(pos);
    };
    match *first {
        Item::Rep(ref s, min, max) => {
            let n = t.run(s, pos, max);
            if n < min as usize {
                return None;
            }
            if rest.is_empty() {
                return Some(pos + n);
            }
            (min as usize..=n).rev().find_map(|k| seq(rest, t, pos + k))
        }
        Item::Lit(l) => {
            let ok = l
                .iter()
                .enumerate()
                .all(|(i, &b)| t.c.get(pos + i) == Some(&(b as u32)));
            if ok {
                seq(rest, t, pos + l.len())
            } else {
                None
            }
        }
        Item::NotAhead(ref s) => match t.at(pos) {
            Some((c, f)) if s.has(c, f) => None,
            _ => seq(rest, t, pos),
        },
        Item::Contraction { any_case, opt } => {
            if let Some(e) = contraction(t.c, pos, any_case).and_then(|k| seq(rest, t, pos + k)) {
                return Some(e);
            }
            if opt {
                seq(rest, t, pos)
            } else {
                None
            }
        }
        Item::LetterWords => {
            let letter = |i: usize| t.at(i).is_some_and(|(c, f)| L.has(c, f));
            let mark = |i: usize| {
                t.at(i)
                    .is_some_and(|(_, f)| f & SPACE == 0 && f & MARK != 0)
            };
            if !letter(pos) {
                return None;
            }
            let mut q = pos;
            loop {
                if letter(q) {
                    q += 1;
                } else if t.c.get(q) == Some(&(' ' as u32)) && letter(q + 1) {
                    q += 2;
                } else {
                    break;
                }
                while mark(q) {
                    q += 1;
                }
            }
            Some(q)
        }
        Item::DigitTriplesAhead => {
            let n = t.run(&Set::ascii(span(b'0', b'9')), pos, INF);
            (n >= 3 && n.is_multiple_of(3))
                .then(|| seq(rest, t, pos))
                .flatten()
        }
    }
}

/// End of the match of `alts` at `pos`, if any (leftmost alternative first).
fn match_at(alts: &[Alt], t: &Text, pos: usize) -> Option<usize> {
    alts.iter().find_map(|a| seq(a, t, pos))
}

/// Split `t` as `unicode_regex_split_stl` does: every match and every gap between matches
/// is a piece (empty pieces are not reported); positions are offset by `base`.
pub(crate) fn split<E>(
    alts: &[Alt],
    t: &Text,
    base: usize,
    emit: &mut dyn FnMut(usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    let n = t.c.len();
    let (mut start, mut pos) = (0, 0);
    while pos <= n {
        match match_at(alts, t, pos) {
            Some(end) => {
                if pos > start {
                    emit(base + start, base + pos)?;
                }
                if end > pos {
                    emit(base + pos, base + end)?;
                }
                start = end;
                // After an empty match the next one must start further on.
                pos = if end == pos { pos + 1 } else { end };
            }
            None => pos += 1,
        }
    }
    if start < n {
        emit(base + start, base + n)?;
    }
    Ok(())
}

// ---- The classes the regexes use -------------------------------------------------------

/// `\s` (non-ASCII whitespace arrives as U+000B).
pub(crate) const WS: u128 = bits(b"\t\n\x0B\x0C\r ");
pub(crate) const AZ: u128 = span(b'A', b'Z') | span(b'a', b'z');
pub(crate) const DIGITS: u128 = span(b'0', b'9');
/// ASCII code points of category P (what llama.cpp's collapsed `\p{P}` keeps).
pub(crate) const P_ASCII: u128 = bits(b"!\"#%&'()*,-./:;?@[\\]_{}");
/// ASCII code points of category S.
pub(crate) const S_ASCII: u128 = bits(b"$+<=>^`|~");
pub(crate) const NL: Set = Set::ascii(bits(b"\r\n"));
pub(crate) const SP: Set = Set::ascii(bits(b" "));
pub(crate) const S: Set = Set::ascii(WS);
pub(crate) const L: Set = Set::cat(AZ, LETTER);
pub(crate) const N: Set = Set::cat(DIGITS, NUMBER);
pub(crate) const P: Set = Set::cat(P_ASCII, PUNCT);
/// `[\p{L}\p{M}]`
pub(crate) const LM: Set = Set::cat(AZ, LETTER | MARK);
/// `[\p{P}\p{S}]`
pub(crate) const PS: Set = Set::cat(P_ASCII | S_ASCII, PUNCT | SYMBOL);
/// `[^\r\n\p{L}\p{N}]`
pub(crate) const NOT_NL_L_N: Set = Set::cat(bits(b"\r\n") | AZ | DIGITS, LETTER | NUMBER).not();
/// `[^\s\p{L}\p{N}]`
pub(crate) const NOT_S_L_N: Set = Set::cat(WS | AZ | DIGITS, LETTER | NUMBER).not();
/// `\S`
pub(crate) const NOT_S: Set = S.not();

/// `\s+(?!\S)` and `\s+`, the whitespace tail of most regexes.
pub(crate) const WS_AHEAD: Alt = &[Item::Rep(S, 1, INF), Item::NotAhead(NOT_S)];
pub(crate) const WS_ANY: Alt = &[Item::Rep(S, 1, INF)];
/// `\s*[\r\n]+`
pub(crate) const WS_NL: Alt = &[Item::Rep(S, 0, INF), Item::Rep(NL, 1, INF)];

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::tokenizer::pretok::fill_flags;

    fn pieces(alts: &[Alt], s: &str) -> std::vec::Vec<std::string::String> {
        let c: std::vec::Vec<u32> = s.chars().map(|c| c as u32).collect();
        let mut f = std::vec![0u8; c.len()];
        fill_flags(&c, &mut f);
        let mut out = std::vec::Vec::new();
        split::<()>(alts, &Text { c: &c, f: &f }, 0, &mut |a, b| {
            out.push(
                c[a..b]
                    .iter()
                    .map(|&x| char::from_u32(x).unwrap())
                    .collect(),
            );
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn whitespace_lookahead_leaves_one_space() {
        let alts: &[Alt] = &[WS_AHEAD, WS_ANY];
        assert_eq!(pieces(alts, "a   b"), ["a", "  ", " ", "b"]);
    }

    #[test]
    fn greedy_repetition_backs_off_for_the_next_item() {
        // [A-Z]*[A-Za-z]+ on "ABC" must leave one letter for the second item.
        const UP: Set = Set::ascii(span(b'A', b'Z'));
        const ALTS: &[Alt] = &[&[Item::Rep(UP, 0, INF), Item::Rep(Set::ascii(AZ), 1, INF)]];
        let alts = ALTS;
        assert_eq!(pieces(alts, "ABC de"), ["ABC", " ", "de"]);
    }

    #[test]
    fn zero_width_digit_triples_split_from_the_right() {
        let alts: &[Alt] = &[&[Item::DigitTriplesAhead]];
        assert_eq!(pieces(alts, "1234567"), ["1", "234", "567"]);
    }

    #[test]
    fn non_ascii_whitespace_is_vertical_tab() {
        assert!(S.has(0x3000, SPACE | crate::tokenizer::unicode::ANY));
        assert!(!L.has(0x3000, SPACE | LETTER));
    }
}
