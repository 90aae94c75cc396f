//! Unigram tokenization (UGM, `tokenizer.ggml.model = t5`: T5, mT5, XLM-R style
//! SentencePiece unigram models), as llama.cpp's `llm_tokenizer_ugm_session` does it
//! (`src/llama-vocab.cpp` at 0c1e570).
//!
//! Two steps per fragment of ordinary text:
//! 1. **Normalize.** At each position the longest user-defined token is kept as it is;
//!    else the longest prefix found in the precompiled charsmap
//!    (`tokenizer.ggml.precompiled_charsmap`, SentencePiece's NFKC-style table) is
//!    replaced by its replacement string; else one valid UTF-8 character is kept, and a
//!    byte that does not start one becomes U+FFFD. In the result every ASCII space
//!    becomes `▁`; `remove_extra_whitespaces` drops leading and trailing spaces and
//!    folds each run into one `▁` before the next word; `add_space_prefix` puts one
//!    `▁` before the first word.
//! 2. **Viterbi.** Over the normalized bytes, the best-scoring segmentation into
//!    vocabulary tokens (normal, user-defined and unused ones; user-defined tokens score
//!    0, the rest their log probability). A character no token starts with exactly
//!    becomes `<unk>` with the lowest normal score minus 10, and a run of `<unk>`s is
//!    emitted as one. There is no byte fallback: unigram vocabs have no `<0xXX>` tokens.
//!
//! The charsmap is a XOR-compressed compact double array (XCDA, Kanda 2018) followed by
//! NUL-terminated replacement strings; it is read in place from the GGUF header, never
//! copied. Token lookup probes the token hash table at every length up to the longest
//! token (48 bytes in XLM-R's vocab) instead of keeping a trie.
//!
//! llama.cpp only ships a UGM vocab file for an encoder (`ggml-vocab-nomic-bert-moe`,
//! XLM-R's 250k vocab); pinch runs no T5 or BERT architecture, so this tokenizer serves
//! generation models that declare `t5` and checks the vocab against llama.cpp.
use super::{attr, Out, Tokenizer, TokenizerError};

const KEY: &str = "tokenizer.ggml.precompiled_charsmap";
const ESCAPED_SPACE: &[u8] = "▁".as_bytes();
const REPLACEMENT_CHAR: &[u8] = "\u{FFFD}".as_bytes();
/// llama.cpp's `unknown_token_score_penalty`.
const UNK_PENALTY: f32 = 10.0;

/// The unigram tables beside the shared ones of [`Tokenizer`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ugm<'a> {
    /// XCDA entries: little-endian `u32`s (empty without a charsmap).
    xcda: &'a [u8],
    /// NUL-terminated replacement strings the XCDA leaves point into.
    repl: &'a [u8],
    /// Bytes of normalized text one input byte can become at most (before escaping).
    expand: usize,
    unk_score: f64,
    /// Longest matchable token, in bytes.
    max_token: usize,
    /// `remove_extra_whitespaces`.
    merge_spaces: bool,
    /// Whether any user-defined token exists (they pass normalization untouched).
    user_defined: bool,
}

impl<'a> Ugm<'a> {
    /// Read the charsmap (raw bytes of the GGUF `u8`/`i8` array) and the score range.
    pub(crate) fn new(
        charsmap: Option<&'a [u8]>,
        scores: &[f32],
        attrs: &[u8],
        texts: impl Fn(u32) -> usize,
        merge_spaces: bool,
    ) -> Result<Ugm<'a>, TokenizerError> {
        let (mut xcda, mut repl): (&[u8], &[u8]) = (&[], &[]);
        if let Some(cm) = charsmap.filter(|c| !c.is_empty()) {
            let head = cm
                .get(..4)
                .ok_or(TokenizerError::Malformed { key: KEY, index: 0 })?;
            let blob = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
            // llama.cpp's check: the replacement strings must not be empty.
            if blob.saturating_add(4) >= cm.len() {
                return Err(TokenizerError::Malformed { key: KEY, index: 0 });
            }
            xcda = &cm[4..4 + blob / 4 * 4];
            repl = &cm[4 + blob..];
        }
        let expand = repl
            .split(|&b| b == 0)
            .map(<[u8]>::len)
            .max()
            .unwrap_or(0)
            .max(REPLACEMENT_CHAR.len());
        let mut min_score = f32::MAX;
        let (mut max_token, mut user_defined) = (0, false);
        for (id, &a) in attrs.iter().enumerate() {
            if is_normal(a) {
                min_score = min_score.min(scores[id]);
            }
            if matchable(a) {
                max_token = max_token.max(texts(id as u32));
            }
            user_defined |= is_user_defined(a);
        }
        Ok(Ugm {
            xcda,
            repl,
            expand,
            unk_score: f64::from(min_score - UNK_PENALTY),
            max_token,
            merge_spaces,
            user_defined,
        })
    }

    /// Scratch bytes one fragment of `m` bytes needs: the normalized text (each byte
    /// becomes at most `expand` bytes, each of which escapes to at most three, plus one
    /// space prefix) and four words per normalized byte for the Viterbi table.
    pub(crate) fn scratch_bytes(&self, m: usize) -> usize {
        let n = self.normalized_cap(m);
        n + 16 * (n + 1) + 8
    }

    fn normalized_cap(&self, m: usize) -> usize {
        3 * self.expand * m + ESCAPED_SPACE.len()
    }

    fn entry(&self, i: usize) -> Result<u32, TokenizerError> {
        let b = self
            .xcda
            .get(4 * i..4 * i + 4)
            .ok_or(TokenizerError::Malformed {
                key: KEY,
                index: i as u64,
            })?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// BASE of XCDA node `i` (bits 10-30, shifted by 8 more when bit 9 is set).
    fn base(&self, i: usize) -> Result<usize, TokenizerError> {
        let e = self.entry(i)?;
        Ok(((e >> 10) << ((e & (1 << 9)) >> 6)) as usize)
    }

    /// The longest charsmap key that prefixes `s`: (its length, its replacement).
    fn charsmap_match(&self, s: &[u8]) -> Result<Option<(usize, &'a [u8])>, TokenizerError> {
        if self.xcda.is_empty() {
            return Ok(None);
        }
        let mut best = None;
        let mut node = self.base(0)?;
        for (k, &c) in s.iter().enumerate() {
            if c == 0 {
                break;
            }
            node ^= c as usize;
            let e = self.entry(node)?;
            // LCHECK (bits 0-7 and 31) names the byte that leads to this node.
            if e & ((1 << 31) | 0xff) != c as u32 {
                break;
            }
            let leaf = (e >> 8) & 1 == 1;
            node ^= self.base(node)?;
            if leaf {
                let at = (self.entry(node)? & ((1 << 31) - 1)) as usize;
                best = Some((k + 1, at));
            }
        }
        let Some((len, at)) = best else {
            return Ok(None);
        };
        let bad = TokenizerError::Malformed {
            key: KEY,
            index: at as u64,
        };
        let tail = self.repl.get(at..).filter(|t| !t.is_empty()).ok_or(bad)?;
        let end = tail.iter().position(|&b| b == 0).ok_or(bad)?;
        Ok(Some((len, &tail[..end])))
    }
}

fn is_normal(a: u8) -> bool {
    a & attr::CONTROL == 0 && a & attr::NORMAL != 0
}

fn is_user_defined(a: u8) -> bool {
    a & attr::CONTROL == 0 && a & attr::USER_DEFINED != 0
}

/// Tokens the Viterbi search may use: normal, user-defined and unused ones.
fn matchable(a: u8) -> bool {
    a & attr::CONTROL == 0 && a & (attr::NORMAL | attr::USER_DEFINED | attr::UNUSED) != 0
}

/// Length of the valid UTF-8 character at the start of `s` (llama.cpp's
/// `unicode_cpt_from_utf8`: lead byte and continuation bytes checked, overlong forms and
/// surrogates accepted), or `None`.
fn utf8_char_len(s: &[u8]) -> Option<usize> {
    let n = match s[0] {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => return None,
    };
    let cont = s.get(1..n)?;
    cont.iter().all(|&b| b & 0xc0 == 0x80).then_some(n)
}

/// llama.cpp's `unicode_len_utf8`: the character length the lead byte announces.
fn lead_len(b: u8) -> usize {
    match b >> 4 {
        0xc | 0xd => 2,
        0xe => 3,
        0xf => 4,
        _ => 1,
    }
}

/// Normalize `text` into `out` (see the module doc); returns the length.
fn normalize(
    tok: &Tokenizer<'_>,
    u: &Ugm<'_>,
    text: &[u8],
    out: &mut [u8],
) -> Result<usize, TokenizerError> {
    let mut n = 0usize;
    let mut put = |s: &[u8]| -> Result<(), TokenizerError> {
        let dst = out
            .get_mut(n..n + s.len())
            .ok_or(TokenizerError::ScratchTooSmall {
                needed: n + s.len(),
                given: 0,
            })?;
        dst.copy_from_slice(s);
        n += s.len();
        Ok(())
    };
    let (mut prepended, mut in_word) = (false, false);
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let (piece, used): (&[u8], usize) = if let Some(l) = user_defined_prefix(tok, u, rest) {
            (&rest[..l], l)
        } else if let Some((l, r)) = u.charsmap_match(rest)? {
            (r, l)
        } else if let Some(l) = utf8_char_len(rest) {
            (&rest[..l], l)
        } else {
            (REPLACEMENT_CHAR, 1)
        };
        for &c in piece {
            if c != b' ' {
                if !in_word {
                    in_word = true;
                    if (tok.add_space_prefix && !prepended) || u.merge_spaces {
                        put(ESCAPED_SPACE)?;
                        prepended = true;
                    }
                }
                put(&[c])?;
            } else {
                in_word = false;
                if !u.merge_spaces {
                    put(ESCAPED_SPACE)?;
                }
            }
        }
        i += used;
    }
    Ok(n)
}

/// Length of the longest user-defined token that starts `s`.
fn user_defined_prefix(tok: &Tokenizer<'_>, u: &Ugm<'_>, s: &[u8]) -> Option<usize> {
    if !u.user_defined {
        return None;
    }
    let key_of = |id: u32| tok.token_text(id);
    tok.special_lens
        .iter()
        .map(|&l| l as usize)
        .filter(|&l| l <= s.len())
        .find(|&l| {
            tok.special
                .find(&s[..l], &[], key_of, |id| {
                    is_user_defined(tok.token_attr(id))
                })
                .is_some()
        })
}

/// Tokenize one fragment of ordinary text into `out`; `work` holds
/// [`Ugm::scratch_bytes`]`(text.len())` bytes.
pub(crate) fn tokenize(
    tok: &Tokenizer<'_>,
    u: &Ugm<'_>,
    text: &[u8],
    work: &mut [u8],
    out: &mut Out<'_>,
) -> Result<(), TokenizerError> {
    let cap = u.normalized_cap(text.len()).min(work.len());
    let (norm, rest) = work.split_at_mut(cap);
    let n = normalize(tok, u, text, norm)?;
    if n == 0 {
        return Ok(());
    }
    let norm = &norm[..n];
    // Per byte position: [token, start of that token, score bits lo, hi].
    let best = super::take_u32(&mut &mut rest[..], 4 * (n + 1))?;
    const UNK: u32 = u32::MAX;
    let score = |b: &[u32], p: usize| {
        f64::from_bits(u64::from(b[4 * p + 2]) | u64::from(b[4 * p + 3]) << 32)
    };
    let set = |b: &mut [u32], p: usize, id: u32, from: usize, s: f64| {
        let bits = s.to_bits();
        b[4 * p..4 * p + 4].copy_from_slice(&[id, from as u32, bits as u32, (bits >> 32) as u32]);
    };
    for p in 0..=n {
        set(best, p, UNK, 0, if p == 0 { 0.0 } else { f64::MIN });
    }
    let key_of = |id: u32| tok.token_text(id);
    let mut p = 0;
    while p < n {
        let here = score(best, p);
        let char_len = lead_len(norm[p]).min(n - p);
        let mut whole_char = false;
        for len in 1..=u.max_token.min(n - p) {
            let found = tok.lookup.find(&norm[p..p + len], &[], key_of, |id| {
                matchable(tok.token_attr(id)) && tok.is_allowed(id)
            });
            let Some(id) = found else { continue };
            whole_char |= len == char_len;
            let s = if is_user_defined(tok.token_attr(id)) {
                0.0
            } else {
                f64::from(tok.score(id))
            };
            if here + s > score(best, p + len) {
                set(best, p + len, id, p, here + s);
            }
        }
        if !whole_char && here + u.unk_score > score(best, p + char_len) {
            set(best, p + char_len, UNK, p, here + u.unk_score);
        }
        p += char_len;
    }
    // Reverse the back links (start field) into forward links, then emit.
    const END: u32 = u32::MAX;
    let (mut prev, mut cur) = (END, n);
    loop {
        let back = best[4 * cur + 1];
        best[4 * cur + 1] = prev;
        prev = cur as u32;
        if back == 0 {
            break;
        }
        cur = back as usize;
    }
    let mut prev_unk = false;
    while prev != END {
        let id = best[4 * prev as usize];
        let is_unk = id == UNK;
        if !(prev_unk && is_unk) {
            out.push(match is_unk {
                true => tok
                    .unk
                    .ok_or(TokenizerError::MissingSpecialToken { which: "UNK" })?,
                false => id,
            });
        }
        prev_unk = is_unk;
        prev = best[4 * prev as usize + 1];
    }
    Ok(())
}
