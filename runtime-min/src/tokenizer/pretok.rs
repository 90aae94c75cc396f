//! Pre-tokenizers of byte-level BPE vocabs: the regexes of llama.cpp's
//! `llm_tokenizer_bpe`, written out by hand as scanners over code points.
//!
//! Each scanner takes the code points of one text fragment and their flags
//! ([`super::unicode::flags`]) and reports word boundaries in order. Semantics follow
//! llama.cpp: the GPT-2 and Llama-3 regexes use its hand-written splitters
//! (`unicode_regex_split_custom_*`), the others its `std::regex` fallback, whose
//! leftmost-first alternation the scanners below reproduce.
use super::unicode::{ANY, LETTER, MARK, NUMBER, PUNCT, SPACE};

/// Which pre-tokenizer (`tokenizer.ggml.pre`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `gpt-2`: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// `llama-bpe` (Llama 3): contractions (any case), `[^\r\n\p{L}\p{N}]?\p{L}+`,
    /// `\p{N}{1,3}`, ` ?[^\s\p{L}\p{N}]+[\r\n]*`, `\s*[\r\n]+`, `\s+(?!\S)`, `\s+`.
    Llama3,
    /// `qwen2`: as Llama 3 but one digit per word.
    Qwen2,
    /// `qwen35`: as Qwen 2 but combining marks (`\p{M}`) count as letters.
    Qwen35,
    /// `default`: four passes, `[\p{P}\$\+<=>\^~\|]+`, the GPT-2 regex, `\p{N}+`,
    /// `[0-9][0-9][0-9]`.
    Default,
}

impl PreTokenizer {
    /// The pre-tokenizer named by `tokenizer.ggml.pre`, if supported.
    pub fn from_name(name: &str) -> Option<PreTokenizer> {
        Some(match name {
            "default" => PreTokenizer::Default,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "lfm2" => {
                PreTokenizer::Llama3
            }
            "gpt-2" | "phi-2" | "mellum" | "a.x-4.0" | "gigachat" => PreTokenizer::Gpt2,
            "qwen2" | "deepseek-r1-qwen" => PreTokenizer::Qwen2,
            "qwen35" => PreTokenizer::Qwen35,
            _ => return None,
        })
    }
}

const OUT: u32 = u32::MAX;

struct Piece<'c> {
    c: &'c [u32],
    f: &'c [u8],
}

impl Piece<'_> {
    #[inline]
    fn cp(&self, i: usize) -> u32 {
        self.c.get(i).copied().unwrap_or(OUT)
    }
    #[inline]
    fn fl(&self, i: usize) -> u8 {
        self.f.get(i).copied().unwrap_or(0)
    }
    fn len(&self) -> usize {
        self.c.len()
    }
}

fn lower(c: u32) -> u32 {
    if (b'A' as u32..=b'Z' as u32).contains(&c) {
        c + 32
    } else {
        c
    }
}

/// Length of a contraction (`'s`, `'T`, `'re` ...) at `pos`, if any.
fn contraction(p: &Piece, pos: usize, any_case: bool) -> Option<usize> {
    if p.cp(pos) != '\'' as u32 || pos + 1 >= p.len() {
        return None;
    }
    let l = |c: u32| if any_case { lower(c) } else { c };
    let n1 = l(p.cp(pos + 1));
    if [b's', b't', b'm', b'd'].iter().any(|&x| n1 == x as u32) {
        return Some(2);
    }
    if pos + 2 < p.len() {
        let n2 = l(p.cp(pos + 2));
        let pair = |a: u8, b: u8| n1 == a as u32 && n2 == b as u32;
        if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
            return Some(3);
        }
    }
    None
}

/// End of the whitespace alternatives (`\s+(?!\S)|\s+`) starting at `pos`.
fn spaces_end(p: &Piece, pos: usize, stop_after_newline: bool) -> usize {
    let mut n = 0;
    let mut last_nl = 0;
    while p.fl(pos + n) & SPACE != 0 {
        let c = p.cp(pos + n);
        if c == '\r' as u32 || c == '\n' as u32 {
            last_nl = pos + n + 1;
        }
        n += 1;
    }
    if stop_after_newline && last_nl > 0 {
        return last_nl; // \s*[\r\n]+
    }
    if n > 1 && p.cp(pos + n) != OUT {
        return pos + n - 1; // \s+(?!\S): leave one space for the next word
    }
    if n > 0 {
        return pos + n;
    }
    pos + 1
}

fn gpt2_next(p: &Piece, pos: usize) -> usize {
    if let Some(n) = contraction(p, pos, false) {
        return pos + n;
    }
    let cpt = p.cp(pos);
    let sp = usize::from(cpt == ' ' as u32);
    let f2 = if sp == 1 { p.fl(pos + 1) } else { p.fl(pos) };
    for class in [LETTER, NUMBER] {
        if f2 & class != 0 {
            let mut q = pos + sp;
            while p.fl(q) & class != 0 {
                q += 1;
            }
            return q;
        }
    }
    if f2 & (SPACE | LETTER | NUMBER) == 0 && f2 != 0 {
        let mut q = pos + sp;
        while p.fl(q) & (SPACE | LETTER | NUMBER) == 0 && p.fl(q) != 0 {
            q += 1;
        }
        return q;
    }
    spaces_end(p, pos, false)
}

fn llama3_next(p: &Piece, pos: usize, max_digits: usize, letter: u8) -> usize {
    if let Some(n) = contraction(p, pos, true) {
        return pos + n;
    }
    let cpt = p.cp(pos);
    let f = p.fl(pos);
    let is_nl = |c: u32| c == '\r' as u32 || c == '\n' as u32;
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if !(is_nl(cpt) || f & NUMBER != 0) && (f & letter != 0 || p.fl(pos + 1) & letter != 0) {
        let mut q = pos + 1;
        while p.fl(q) & letter != 0 {
            q += 1;
        }
        return q;
    }
    // \p{N}{1,max}
    if f & NUMBER != 0 {
        let mut q = pos + 1;
        while q - pos < max_digits && p.fl(q) & NUMBER != 0 {
            q += 1;
        }
        return q;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    let sp = usize::from(cpt == ' ' as u32);
    let f2 = if sp == 1 { p.fl(pos + 1) } else { f };
    if f2 & (SPACE | letter | NUMBER) == 0 && f != 0 {
        let mut q = pos + sp;
        while p.fl(q) & (SPACE | letter | NUMBER) == 0 && p.fl(q) != 0 {
            q += 1;
        }
        while is_nl(p.cp(q)) {
            q += 1;
        }
        return q;
    }
    spaces_end(p, pos, true)
}

/// Split runs: maximal runs of code points in `class` and the gaps between them.
fn runs<E>(
    p: &Piece,
    base: usize,
    class: impl Fn(u32, u8) -> bool,
    emit: &mut impl FnMut(usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    let mut i = 0;
    while i < p.len() {
        let inside = class(p.cp(i), p.fl(i));
        let mut j = i + 1;
        while j < p.len() && class(p.cp(j), p.fl(j)) == inside {
            j += 1;
        }
        emit(base + i, base + j)?;
        i = j;
    }
    Ok(())
}

fn default_p1(cp: u32, f: u8) -> bool {
    if cp < 0x80 {
        b"!\"#%&'()*,-./:;?@[\\]_{}$+<=>^~|".contains(&(cp as u8))
    } else {
        f & PUNCT != 0 && f & SPACE == 0
    }
}

fn default_p3(cp: u32, f: u8) -> bool {
    if cp < 0x80 {
        (b'0' as u32..=b'9' as u32).contains(&cp)
    } else {
        f & NUMBER != 0 && f & SPACE == 0
    }
}

fn sub<'c>(c: &'c [u32], f: &'c [u8], s: usize, e: usize) -> Piece<'c> {
    Piece {
        c: &c[s..e],
        f: &f[s..e],
    }
}

/// Report the words of `cps` (with flags `fl`, same length) as `emit(start, end)`, in order.
pub(crate) fn split<E>(
    pre: PreTokenizer,
    cps: &[u32],
    fl: &[u8],
    emit: &mut impl FnMut(usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    let whole = Piece { c: cps, f: fl };
    let step = |p: &Piece, pos: usize| -> usize {
        match pre {
            PreTokenizer::Gpt2 | PreTokenizer::Default => gpt2_next(p, pos),
            PreTokenizer::Llama3 => llama3_next(p, pos, 3, LETTER),
            PreTokenizer::Qwen2 => llama3_next(p, pos, 1, LETTER),
            PreTokenizer::Qwen35 => llama3_next(p, pos, 1, LETTER | MARK),
        }
    };
    let scan = |p: &Piece, base: usize, emit: &mut dyn FnMut(usize, usize) -> Result<(), E>| {
        let mut pos = 0;
        while pos < p.len() {
            let end = step(p, pos).clamp(pos + 1, p.len());
            emit(base + pos, base + end)?;
            pos = end;
        }
        Ok(())
    };
    if pre != PreTokenizer::Default {
        return scan(&whole, 0, emit);
    }
    // Four passes, each splitting the pieces of the previous one.
    runs(&whole, 0, default_p1, &mut |s1, e1| {
        scan(&sub(cps, fl, s1, e1), s1, &mut |s2, e2| {
            runs(&sub(cps, fl, s2, e2), s2, default_p3, &mut |s3, e3| {
                let p = sub(cps, fl, s3, e3);
                let digit = |i: usize| (b'0' as u32..=b'9' as u32).contains(&p.cp(i));
                let (mut i, mut gap) = (0, 0);
                while i < p.len() {
                    if digit(i) && digit(i + 1) && digit(i + 2) {
                        if gap < i {
                            emit(s3 + gap, s3 + i)?;
                        }
                        emit(s3 + i, s3 + i + 3)?;
                        i += 3;
                        gap = i;
                    } else {
                        i += 1;
                    }
                }
                if gap < p.len() {
                    emit(s3 + gap, s3 + p.len())?;
                }
                Ok(())
            })
        })
    })
}

/// Flags for pre-tokenizing (always includes [`ANY`]).
pub(crate) fn fill_flags(cps: &[u32], out: &mut [u8]) {
    for (o, &c) in out.iter_mut().zip(cps) {
        *o = if c < 0x80 {
            ascii_flags(c as u8)
        } else {
            super::unicode::flags(c)
        };
    }
}

fn ascii_flags(b: u8) -> u8 {
    ANY | match b {
        b'a'..=b'z' | b'A'..=b'Z' => LETTER,
        b'0'..=b'9' => NUMBER,
        0x09..=0x0D | b' ' => SPACE,
        b'!'..=b'#'
        | b'%'..=b'*'
        | b','..=b'/'
        | b':'
        | b';'
        | b'?'
        | b'@'
        | b'['..=b']'
        | b'_'
        | b'{'
        | b'}' => PUNCT,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: PreTokenizer, s: &str) -> heapless::Vec<heapless::String<32>, 32> {
        let cps: heapless::Vec<u32, 128> = s.chars().map(|c| c as u32).collect();
        let mut fl = [0u8; 128];
        fill_flags(&cps, &mut fl[..cps.len()]);
        let mut out = heapless::Vec::new();
        split::<()>(pre, &cps, &fl[..cps.len()], &mut |a, b| {
            let w: heapless::String<32> = cps[a..b]
                .iter()
                .map(|&c| char::from_u32(c).unwrap())
                .collect();
            out.push(w).map_err(|_| ())
        })
        .unwrap();
        out
    }

    #[test]
    fn ascii_flags_match_table() {
        for b in 0u8..0x80 {
            assert_eq!(
                ascii_flags(b),
                super::super::unicode::flags(b as u32),
                "byte {b:#x}"
            );
        }
    }

    #[test]
    fn llama3_splits_digits_in_threes_and_keeps_space_before_words() {
        let w = words(PreTokenizer::Llama3, "I'M 12345 ok!!\n\n  x");
        let w: heapless::Vec<&str, 32> = w.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            &w[..],
            &["I", "'M", " ", "123", "45", " ok", "!!\n\n", " ", " x"]
        );
    }

    #[test]
    fn default_runs_four_passes() {
        let w = words(PreTokenizer::Default, "Hello, world! 12345 $x");
        let w: heapless::Vec<&str, 32> = w.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            &w[..],
            &["Hello", ",", " world", "!", " ", "123", "45", " ", "$", "x"]
        );
    }

    #[test]
    fn qwen35_keeps_combining_marks_with_letters() {
        let w = words(PreTokenizer::Qwen35, "e\u{301}te 7\u{301}");
        let w: heapless::Vec<&str, 32> = w.iter().map(|s| s.as_str()).collect();
        assert_eq!(&w[..], &["e\u{301}te", " ", "7", "\u{301}"]);
        let w = words(PreTokenizer::Qwen2, "e\u{301}te");
        let w: heapless::Vec<&str, 32> = w.iter().map(|s| s.as_str()).collect();
        assert_eq!(&w[..], &["e", "\u{301}te"]);
    }

    #[test]
    fn gpt2_leaves_last_space_to_next_word() {
        let w = words(PreTokenizer::Gpt2, "a   b 42");
        let w: heapless::Vec<&str, 32> = w.iter().map(|s| s.as_str()).collect();
        assert_eq!(&w[..], &["a", "  ", " b", " 42"]);
    }
}
