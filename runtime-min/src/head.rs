//! Pruned LM heads: which vocabulary rows to keep, the `head.ids` file, and the pruned
//! output matrix.
//!
//! The LM head is the largest matrix of a small model (Gemma 3 270M: 262,144 rows).
//! Most rows are tokens a user never sees, so keeping only the most used ones saves
//! memory and time per token. Three rules keep the result honest:
//! - every special/control token and every byte token (`<0xXX>` for SentencePiece, the
//!   256 single-byte tokens for byte-level BPE) is kept, so any text can still be
//!   encoded with kept tokens only ([`crate::tokenizer::Tokenizer::set_allowed`]);
//! - the row count is padded to a multiple of [`ROW_MULTIPLE`] with the next most used
//!   ids, so the head runs on the interleaved fast kernel;
//! - ids outside the head get logit -inf, so they are never sampled and never scored.
//!
//! `head.ids` format (text, UTF-8, LF): a header line
//! `pinch-head v1 n_vocab=<N> rows=<K>`, then K lines each holding one decimal id,
//! strictly increasing, each below N. Lines starting with `#` and blank lines are
//! ignored.
//!
//! Recut GGUF files (`pinch recut`) store the ids in metadata: [`KEY_IDS`] (array of
//! u32, strictly increasing; `output.weight` row j is id `ids[j]`) and [`KEY_N_VOCAB`]
//! (u32, the vocabulary size the ids index).
use core::fmt::Write;

use crate::arena::Arena;
use crate::gguf::{Gguf, ValueType};
use crate::model::{ModelError, Tensor};
use crate::tokenizer::{attr, Tokenizer, VocabKind};

/// GGUF key: the vocabulary id of each `output.weight` row (array of u32, increasing).
pub const KEY_IDS: &str = "pinch.head.ids";
/// GGUF key: the full vocabulary size the ids index (u32).
pub const KEY_N_VOCAB: &str = "pinch.head.n_vocab";
/// Rows of the interleaved fast kernels; the pruned head is padded to a multiple.
pub const ROW_MULTIPLE: usize = 16;

/// Why a head could not be read or built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadError {
    /// The first line is not `pinch-head v1 n_vocab=N rows=K`.
    BadHeader,
    /// The file was made for a vocabulary of `file` ids, the model has `model`.
    VocabMismatch { file: usize, model: usize },
    /// Line `line` is not a decimal id.
    BadId { line: usize },
    /// Id `id` (line `line`) is not below the vocabulary size or not above the previous.
    OutOfOrder { line: usize, id: u32 },
    /// The header promised `expected` ids, the file holds `found`.
    CountMismatch { expected: usize, found: usize },
    /// The output buffer holds fewer ids than the file.
    TooMany,
}

impl core::fmt::Display for HeadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            HeadError::BadHeader => write!(
                f,
                "head file: the first line must be 'pinch-head v1 n_vocab=N rows=K'"
            ),
            HeadError::VocabMismatch { file, model } => write!(
                f,
                "head file was made for a vocabulary of {file} tokens, the model has {model}"
            ),
            HeadError::BadId { line } => write!(f, "head file line {line}: not a token id"),
            HeadError::OutOfOrder { line, id } => write!(
                f,
                "head file line {line}: id {id} is out of range or not above the previous id"
            ),
            HeadError::CountMismatch { expected, found } => write!(
                f,
                "head file: header says {expected} rows but the file lists {found}"
            ),
            HeadError::TooMany => write!(f, "head file lists more ids than the vocabulary"),
        }
    }
}

/// Parse a `head.ids` text for a vocabulary of `n_vocab`; ids go to `out`, their count
/// is returned.
pub fn parse_ids(text: &str, n_vocab: usize, out: &mut [u32]) -> Result<usize, HeadError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
    let (_, header) = lines.next().ok_or(HeadError::BadHeader)?;
    let mut words = header.split_ascii_whitespace();
    if words.next() != Some("pinch-head") || words.next() != Some("v1") {
        return Err(HeadError::BadHeader);
    }
    let mut field = |name: &str| -> Result<usize, HeadError> {
        words
            .next()
            .and_then(|w| w.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .ok_or(HeadError::BadHeader)
    };
    let file_vocab = field("n_vocab=")?;
    let rows = field("rows=")?;
    if file_vocab != n_vocab {
        return Err(HeadError::VocabMismatch {
            file: file_vocab,
            model: n_vocab,
        });
    }
    let mut n = 0usize;
    let mut prev: Option<u32> = None;
    for (line, l) in lines {
        let id: u32 = l.parse().map_err(|_| HeadError::BadId { line })?;
        if id as usize >= n_vocab || prev.is_some_and(|p| id <= p) {
            return Err(HeadError::OutOfOrder { line, id });
        }
        *out.get_mut(n).ok_or(HeadError::TooMany)? = id;
        prev = Some(id);
        n += 1;
    }
    if n != rows {
        return Err(HeadError::CountMismatch {
            expected: rows,
            found: n,
        });
    }
    Ok(n)
}

/// Write `ids` (increasing) as a `head.ids` text.
pub fn write_ids(out: &mut dyn Write, n_vocab: usize, ids: &[u32]) -> core::fmt::Result {
    writeln!(out, "pinch-head v1 n_vocab={n_vocab} rows={}", ids.len())?;
    for id in ids {
        writeln!(out, "{id}")?;
    }
    Ok(())
}

/// Whether `id` must stay in any head: without it some text could not be encoded, or
/// a control token (BOS, end of turn ...) could not be predicted.
pub fn must_keep(tok: &Tokenizer<'_>, id: u32) -> bool {
    let a = tok.token_attr(id);
    if is_unused(tok, id) {
        return false;
    }
    if a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN | attr::BYTE) != 0 {
        return true;
    }
    if tok.is_eog(id) || Some(id) == tok.bos() || Some(id) == tok.eos() {
        return true;
    }
    // Byte-level BPE has no BYTE attribute: its byte tokens are the single GPT-2
    // characters that stand for one byte (SentencePiece-style BPE has `<0xXX>` ones).
    tok.kind() == VocabKind::Bpe
        && !tok.escapes_spaces()
        && tok.token_bytes(id).len() == 1
        && a & attr::UNUSED == 0
}

/// Whether `id` is a placeholder no model is trained to emit: the UNUSED attribute, or
/// a control token named `<unusedN>` (Gemma's 6,242, stored as CONTROL). It is not
/// forced into a head and ranks after every other id of the same count.
pub fn is_unused(tok: &Tokenizer<'_>, id: u32) -> bool {
    if tok.token_attr(id) & attr::UNUSED != 0 {
        return true;
    }
    let t = tok.token_text(id);
    tok.token_attr(id) & attr::CONTROL != 0
        && t.len() >= 9
        && t.starts_with(b"<unused")
        && t.ends_with(b">")
        && t[7..t.len() - 1].iter().all(u8::is_ascii_digit)
}

/// The rows a head of about `rows` rows gets over a vocabulary of `n_vocab`: at least
/// every [`must_keep`] id, padded up to a multiple of [`ROW_MULTIPLE`] (or the
/// vocabulary).
pub fn row_count(tok: &Tokenizer<'_>, rows: usize, n_vocab: usize) -> usize {
    let forced = (0..n_vocab as u32).filter(|&i| must_keep(tok, i)).count();
    (rows.max(forced).div_ceil(ROW_MULTIPLE) * ROW_MULTIPLE).min(n_vocab)
}

/// Code points a [`CharSet`] tracks (the Basic Multilingual Plane and the CJK
/// extension planes); characters above count as unseen.
pub const CHARSET_CODEPOINTS: usize = 0x30000;
/// `u64` words of a [`CharSet`] (24 KiB).
pub const CHARSET_WORDS: usize = CHARSET_CODEPOINTS / 64;

/// Code points per block of [`CharSet::in_block`] (a Unicode block is 128 or more).
pub const CHARSET_BLOCK: u32 = 128;

/// The characters a selection corpus uses, plus printable ASCII, tab, line feed and
/// General Punctuation's marks (digits and punctuation every language's text has), and the 128-code-point blocks
/// they fall in (the corpus's scripts). See [`char_prior`] for how a token ranks by it.
pub struct CharSet<'a> {
    bits: &'a mut [u64],
    blocks: [u64; CHARSET_CODEPOINTS / CHARSET_BLOCK as usize / 64],
}

impl<'a> CharSet<'a> {
    /// A set over `bits` ([`CHARSET_WORDS`] words, or fewer to track fewer code points)
    /// holding printable ASCII, tab, line feed and U+2010-2027, U+2030-205E.
    pub fn new(bits: &'a mut [u64]) -> CharSet<'a> {
        bits.fill(0);
        let mut s = CharSet {
            bits,
            blocks: [0; CHARSET_CODEPOINTS / CHARSET_BLOCK as usize / 64],
        };
        s.add_text(b"\t\n");
        for c in 0x20u8..0x7F {
            s.add(c as u32);
        }
        // General Punctuation's printable marks (dashes, curly quotes, bullets, the
        // ellipsis, per-mille, prime): every script's text uses them, yet a corpus may not
        // (the 2.5 MB shared corpus's English text has no en dash, so 65K English heads
        // dropped Gemma's `–`, id 1271, and every dash became bytes).
        for c in (0x2010..=0x2027).chain(0x2030..=0x205E) {
            s.add(c);
        }
        s
    }
    fn add(&mut self, c: u32) {
        if let Some(w) = self.bits.get_mut(c as usize / 64) {
            *w |= 1 << (c % 64);
            let b = c / CHARSET_BLOCK;
            self.blocks[b as usize / 64] |= 1 << (b % 64);
        }
    }
    fn has(&self, c: u32) -> bool {
        self.bits
            .get(c as usize / 64)
            .is_some_and(|w| w & (1 << (c % 64)) != 0)
    }
    /// Whether the 128-code-point block of `c` holds a character of the set.
    pub fn in_block(&self, c: char) -> bool {
        let b = c as u32 / CHARSET_BLOCK;
        self.blocks
            .get(b as usize / 64)
            .is_some_and(|w| w & (1 << (b % 64)) != 0)
    }
    /// Add every character of `text` (invalid UTF-8 is skipped).
    pub fn add_text(&mut self, text: &[u8]) {
        for chunk in text.utf8_chunks() {
            for c in chunk.valid().chars() {
                self.add(c as u32);
            }
        }
    }
    /// Whether `bytes` (a token's) is valid UTF-8 made only of characters of the set; a
    /// byte-level BPE token holding part of a character is not covered.
    pub fn covers(&self, bytes: &[u8]) -> bool {
        core::str::from_utf8(bytes).is_ok_and(|t| t.chars().all(|c| self.has(c as u32)))
    }
}

/// The character prior of token `id`, 0..=3, for ranking among tokens of equal count:
/// 2 when the token is made of the corpus's characters ([`CharSet::covers`]) or is one
/// character (after a leading space) of a block the corpus uses, plus 1 when it is one
/// character. So among the uncounted rows a multilingual vocabulary fills the head
/// with the corpus's scripts (their single characters first: every character of the
/// script stays one token, not bytes) instead of every script's words in id order.
///
/// Only for SentencePiece vocabularies: on the byte-level BPE ones measured (Qwen2,
/// SmolLM2), whose ids are merge ranks and already order by frequency, the coverage
/// part was mixed (tokens of held-out wiki text outside the head up at every size from
/// 24K rows, of literary text down), so they keep count-then-id order.
pub fn char_prior(tok: &Tokenizer<'_>, chars: &CharSet<'_>, id: u32) -> u32 {
    if tok.kind() != VocabKind::Spm {
        return 0;
    }
    let bytes = tok.token_bytes(id);
    let body = bytes.strip_prefix(b" ").unwrap_or(bytes);
    let mut it = core::str::from_utf8(body).ok().map(|t| t.chars());
    let single = match it.as_mut().map(|c| (c.next(), c.next())) {
        Some((Some(c), None)) => Some(c),
        _ => None,
    };
    let covered = chars.covers(bytes) || single.is_some_and(|c| chars.in_block(c));
    covered as u32 * 2 + single.is_some() as u32
}

/// Fold the character prior ([`char_prior`]) into selection counts: `counts[i] * 4 +
/// prior` (saturating), so [`select`] ranks by count, then prior, then score and id.
pub fn add_char_prior(tok: &Tokenizer<'_>, chars: &CharSet<'_>, counts: &mut [u32]) {
    for (i, c) in counts.iter_mut().enumerate() {
        *c = c
            .saturating_mul(4)
            .saturating_add(char_prior(tok, chars, i as u32));
    }
}

/// Choose the head: every [`must_keep`] id, then the most used ids of `counts` (ties:
/// the higher [`Tokenizer::score`] first, SentencePiece's log-probability or merge
/// order, then the lower id: a byte-level BPE vocabulary's ids are its merge ranks)
/// until [`row_count`] rows (at most `out.len()`). `order` is scratch of
/// `counts.len()` ids. The kept ids are written to `out` (increasing) and their count
/// returned.
pub fn select(
    tok: &Tokenizer<'_>,
    counts: &[u32],
    rows: usize,
    order: &mut [u32],
    out: &mut [u32],
) -> usize {
    let nv = counts.len().min(order.len());
    let order = &mut order[..nv];
    for (i, o) in order.iter_mut().enumerate() {
        *o = i as u32;
    }
    // Forced ids first (so they never fall off), unused placeholders last, then by use.
    order.sort_unstable_by(|&a, &b| {
        let (fa, fb) = (must_keep(tok, a), must_keep(tok, b));
        fb.cmp(&fa)
            .then(is_unused(tok, a).cmp(&is_unused(tok, b)))
            .then(counts[b as usize].cmp(&counts[a as usize]))
            .then(tok.score(b).total_cmp(&tok.score(a)))
            .then(a.cmp(&b))
    });
    let k = row_count(tok, rows, nv).min(out.len());
    let out = &mut out[..k];
    out.copy_from_slice(&order[..k]);
    out.sort_unstable();
    k
}

/// A bit mask over the vocabulary with the bits of `ids` set (for
/// [`Tokenizer::set_allowed`]).
pub fn mask<'a>(
    ids: &[u32],
    n_vocab: usize,
    arena: &mut Arena<'a>,
) -> Result<&'a [u64], ModelError> {
    let m: &'a mut [u64] = arena.slice("head", n_vocab.div_ceil(64))?;
    for &id in ids {
        if let Some(w) = m.get_mut(id as usize / 64) {
            *w |= 1 << (id % 64);
        }
    }
    Ok(m)
}

/// Copy the rows `ids` of `full` (in its own quant type) into the arena.
pub fn prune<'a>(
    full: &Tensor<'_>,
    ids: &[u32],
    arena: &mut Arena<'a>,
) -> Result<Tensor<'a>, ModelError> {
    let rb = full.row_bytes();
    let data: &'a mut [u8] = arena.bytes("head", rb * ids.len())?;
    for (j, &id) in ids.iter().enumerate() {
        if id as usize >= full.rows {
            return Err(ModelError::BadToken {
                id,
                n_vocab: full.rows,
            });
        }
        data[j * rb..(j + 1) * rb].copy_from_slice(full.row(id as usize));
    }
    Ok(Tensor {
        ty: full.ty,
        cols: full.cols,
        rows: ids.len(),
        data,
        layout: pinch_kernels::repack::Layout::Plain,
        file: crate::residency::Span::default(),
    })
}

/// The head ids stored in a recut file ([`KEY_IDS`]), copied into the arena; `None` for
/// an ordinary file.
pub fn ids_from_gguf<'a>(
    g: &Gguf<'_>,
    n_vocab: usize,
    arena: &mut Arena<'a>,
) -> Result<Option<&'a [u32]>, ModelError> {
    let Some(arr) = g.get_array(KEY_IDS) else {
        return Ok(None);
    };
    let bad = ModelError::BadShape("pinch.head.ids must be increasing u32 ids below n_vocab");
    if arr.elem != ValueType::U32 || arr.is_empty() {
        return Err(bad);
    }
    if g.get_u32(KEY_N_VOCAB)
        .is_some_and(|n| n as usize != n_vocab)
    {
        return Err(ModelError::BadShape(
            "pinch.head.n_vocab differs from the model's vocabulary",
        ));
    }
    let ids: &'a mut [u32] = arena.slice("head", arr.len())?;
    let mut prev: Option<u32> = None;
    for (i, slot) in ids.iter_mut().enumerate() {
        let id = arr.u32_at(i).ok_or(bad.clone())?;
        if id as usize >= n_vocab || prev.is_some_and(|p| id <= p) {
            return Err(bad);
        }
        *slot = id;
        prev = Some(id);
    }
    Ok(Some(ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Buf {
        b: [u8; 256],
        n: usize,
    }
    impl Write for Buf {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            let end = self.n + s.len();
            self.b.get_mut(self.n..end).ok_or(core::fmt::Error)?;
            self.b[self.n..end].copy_from_slice(s.as_bytes());
            self.n = end;
            Ok(())
        }
    }

    #[test]
    fn charset_covers_only_seen_characters_and_whole_utf8() {
        let mut bits = [0u64; CHARSET_WORDS];
        let mut c = CharSet::new(&mut bits);
        assert!(c.covers(b"plain ASCII, digits 0-9 & @-@\n"));
        assert!(!c.covers("café".as_bytes()) && !c.covers("日本".as_bytes()));
        c.add_text("Le café, 日本語\u{E0041}".as_bytes());
        assert!(c.covers("é".as_bytes()) && c.covers("日本".as_bytes()));
        assert!(!c.covers("中".as_bytes()));
        // Past the tracked planes (U+E0041) nothing is covered; nor is part of a character.
        assert!(!c.covers("\u{E0041}".as_bytes()));
        assert!(!c.covers(&"é".as_bytes()[..1]));
        // A set over fewer words tracks fewer code points without panicking.
        let mut small = [0u64; 2];
        let mut s = CharSet::new(&mut small);
        s.add_text("é".as_bytes());
        assert!(s.covers(b"a") && !s.covers("é".as_bytes()));
    }

    #[test]
    fn ids_file_round_trips() {
        let mut b = Buf { b: [0; 256], n: 0 };
        write_ids(&mut b, 100, &[0, 3, 99]).unwrap();
        let text = core::str::from_utf8(&b.b[..b.n]).unwrap();
        assert!(text.starts_with("pinch-head v1 n_vocab=100 rows=3\n"));
        let mut out = [0u32; 8];
        assert_eq!(parse_ids(text, 100, &mut out), Ok(3));
        assert_eq!(&out[..3], &[0, 3, 99]);
    }

    #[test]
    fn ids_file_errors_name_the_problem() {
        let mut out = [0u32; 8];
        assert_eq!(
            parse_ids("pinch-head v1 n_vocab=10 rows=1\n3\n", 12, &mut out),
            Err(HeadError::VocabMismatch {
                file: 10,
                model: 12
            })
        );
        assert_eq!(
            parse_ids("pinch-head v1 n_vocab=10 rows=2\n3\n3\n", 10, &mut out),
            Err(HeadError::OutOfOrder { line: 3, id: 3 })
        );
        assert_eq!(
            parse_ids("pinch-head v1 n_vocab=10 rows=2\n3\nx\n", 10, &mut out),
            Err(HeadError::BadId { line: 3 })
        );
        assert_eq!(
            parse_ids("pinch-head v1 n_vocab=10 rows=2\n3\n", 10, &mut out),
            Err(HeadError::CountMismatch {
                expected: 2,
                found: 1
            })
        );
        assert_eq!(
            parse_ids("hello\n", 10, &mut out),
            Err(HeadError::BadHeader)
        );
    }
}
