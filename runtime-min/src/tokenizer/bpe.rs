//! BPE tokenization of one text fragment, as llama.cpp's `llm_tokenizer_bpe_session`
//! does it.
//!
//! The fragment is decoded to code points (invalid bytes become U+FFFD), split into
//! words by the pre-tokenizer, and each word is merged on its own: it starts as one
//! symbol per byte (byte-level vocabs: the token of that byte's GPT-2 character) or per
//! UTF-8 character (SentencePiece-style vocabs, [`super::PreInfo::escape_spaces`]: the
//! character's token, if any; the caller has turned spaces into `▁`), and the adjacent
//! pair with the lowest merge rank (then leftmost) is merged until no pair is a merge.
//! Merges are looked up by token-id pair, which is equivalent to llama.cpp's string pairs
//! because every merge of a GGUF vocab joins two tokens into a token (checked when
//! loading: a merge whose parts are not tokens can never apply and is dropped; a
//! character that is no token can then take part in no merge, as in llama.cpp, where no
//! merge string names it). A symbol that is no token falls back to the byte tokens of its
//! bytes (GPT-2 characters or `<0xXX>`), skipping bytes that have none.
use super::heap::Heap;
use super::pretok::{fill_flags, split, PreTokenizer};
use super::unicode::{decode, encode};
use super::{Out, Tokenizer, TokenizerError, NONE};

/// Per-fragment working memory (see [`Tokenizer::scratch_bytes`] for the sizes).
pub(crate) struct Work<'s> {
    pub(crate) cps: &'s mut [u32],
    pub(crate) flags: &'s mut [u8],
    pub(crate) word: &'s mut [u8],
    pub(crate) enc: &'s mut [u8],
    pub(crate) sym: &'s mut [u32],
    pub(crate) heap: &'s mut [u32],
}

pub(crate) fn tokenize(
    tok: &Tokenizer<'_>,
    frag: &[u8],
    w: &mut Work<'_>,
    out: &mut Out<'_>,
) -> Result<(), TokenizerError> {
    let too_small = TokenizerError::ScratchTooSmall {
        needed: 0,
        given: 0,
    };
    let mut n = 0;
    let mut i = 0;
    while i < frag.len() {
        let (cp, used) = decode(&frag[i..]);
        *w.cps.get_mut(n).ok_or(too_small)? = cp;
        n += 1;
        i += used;
    }
    let (cps, flags) = (&w.cps[..n], &mut w.flags[..n]);
    fill_flags(cps, flags);
    let flags = &*flags;
    let (word, enc, sym, heap) = (&mut *w.word, &mut *w.enc, &mut *w.sym, &mut *w.heap);
    split(tok.pre, cps, flags, &mut |s, e| {
        let mut wlen = 0;
        for &cp in &cps[s..e] {
            let mut b = [0u8; 4];
            let k = encode(cp, &mut b);
            word.get_mut(wlen..wlen + k)
                .ok_or(too_small)?
                .copy_from_slice(&b[..k]);
            wlen += k;
        }
        word_tokens(tok, &word[..wlen], enc, sym, heap, out)
    })
}

fn word_tokens(
    tok: &Tokenizer<'_>,
    word: &[u8],
    enc: &mut [u8],
    sym: &mut [u32],
    heap: &mut [u32],
    out: &mut Out<'_>,
) -> Result<(), TokenizerError> {
    let too_small = TokenizerError::ScratchTooSmall {
        needed: 0,
        given: 0,
    };
    // Gemma 4: a run of newlines that is a token is that token (llama.cpp PR 21343; the
    // pre-tokenizer makes every newline run a word of its own).
    let newline_run = tok.pre == PreTokenizer::Gemma4 && word.iter().all(|&b| b == b'\n');
    if tok.ignore_merges || newline_run {
        // A word that is a token as a whole is taken as is (Llama 3's `ignore_merges`),
        // looked up as the vocab spells it.
        let key = if tok.escape_spaces {
            word
        } else {
            let mut k = 0;
            for &b in word {
                let (e, l) = tok.byte_enc[b as usize];
                let l = l as usize;
                enc.get_mut(k..k + l)
                    .ok_or(too_small)?
                    .copy_from_slice(&e[..l]);
                k += l;
            }
            &enc[..k]
        };
        if let Some(id) = tok.find(key, &[]) {
            out.push(id);
            return Ok(());
        }
    }
    let n = word.len();
    if sym.len() < 4 * n {
        return Err(too_small);
    }
    // Symbols: [token id or NONE, byte length, prev, next]; a symbol is indexed by the byte
    // it starts at (slots of bytes inside a character stay unused).
    let mut heap = Heap::new(heap);
    let mut prev = NONE;
    let mut i = 0;
    while i < n {
        let (id, len) = if tok.escape_spaces {
            // The word was re-encoded from code points, so it is valid UTF-8; the clamp
            // only guards the slice.
            let len = utf8_len(word[i]).min(n - i);
            (tok.find(&word[i..i + len], &[]).unwrap_or(NONE), len)
        } else {
            (tok.byte_tok[word[i] as usize], 1)
        };
        let next = if i + len == n { NONE } else { (i + len) as u32 };
        sym[4 * i..4 * i + 4].copy_from_slice(&[id, len as u32, prev, next]);
        add(tok, sym, &mut heap, prev, i as u32)?;
        prev = i as u32;
        i += len;
    }
    while let Some([_, left, result, size]) = heap.pop() {
        let l = 4 * left as usize;
        let right = sym[l + 3];
        if right == NONE {
            continue;
        }
        let r = 4 * right as usize;
        let (ln, rn) = (sym[l + 1], sym[r + 1]);
        if ln == 0 || rn == 0 || ln + rn != size {
            continue; // stale: a side was merged since this candidate was made
        }
        sym[l] = result;
        sym[l + 1] = ln + rn;
        sym[r + 1] = 0;
        let next = sym[r + 3];
        sym[l + 3] = next;
        if next != NONE {
            sym[4 * next as usize + 2] = left;
        }
        let prev = sym[l + 2];
        add(tok, sym, &mut heap, prev, left)?;
        add(tok, sym, &mut heap, left, next)?;
    }
    let mut i = if n == 0 { NONE } else { 0u32 };
    while i != NONE {
        let s = 4 * i as usize;
        if sym[s] != NONE {
            out.push(sym[s]);
        } else {
            let start = i as usize;
            for &b in &word[start..start + sym[s + 1] as usize] {
                let id = tok.byte_tok[b as usize];
                if id != NONE {
                    out.push(id);
                }
            }
        }
        i = sym[s + 3];
    }
    Ok(())
}

/// Length of the UTF-8 sequence a lead byte starts (llama.cpp's `unicode_len_utf8`).
fn utf8_len(b: u8) -> usize {
    match b >> 4 {
        0xF => 4,
        0xE => 3,
        0xC | 0xD => 2,
        _ => 1,
    }
}

fn add(
    tok: &Tokenizer<'_>,
    sym: &[u32],
    heap: &mut Heap<'_>,
    left: u32,
    right: u32,
) -> Result<(), TokenizerError> {
    if left == NONE || right == NONE {
        return Ok(());
    }
    let (l, r) = (4 * left as usize, 4 * right as usize);
    let (a, b) = (sym[l], sym[r]);
    if a == NONE || b == NONE {
        return Ok(());
    }
    if let Some((rank, result)) = tok.merges.get(a, b).filter(|m| tok.is_allowed(m.1)) {
        heap.push([rank, left, result, sym[l + 1] + sym[r + 1]])?;
    }
    Ok(())
}
