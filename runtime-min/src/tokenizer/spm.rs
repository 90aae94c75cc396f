//! SentencePiece (BPE-style) tokenization of one text fragment, as llama.cpp's
//! `llm_tokenizer_spm_session` does it.
//!
//! The text (spaces already escaped to `▁`) starts as one symbol per UTF-8 character.
//! Every adjacent pair whose concatenation is a vocabulary token is a candidate, scored
//! by that token's score; the best candidate (highest score, then leftmost) is merged and
//! its new neighbours become candidates, until none is left. Symbols that are not tokens
//! fall back to one `<0xXX>` byte token per byte. Candidates live in a heap, so the whole
//! fragment costs O(n log n).
use super::heap::{score_key, Heap};
use super::{Out, Tokenizer, TokenizerError, NONE};

/// Tokenize `text` into `out`. `sym` needs 4 words per character, `heap` 12 per character.
pub(crate) fn tokenize(
    tok: &Tokenizer<'_>,
    text: &[u8],
    sym: &mut [u32],
    heap: &mut [u32],
    out: &mut Out<'_>,
) -> Result<(), TokenizerError> {
    // Symbols: [start, len, prev, next], NONE for no neighbour.
    let mut n = 0usize;
    let mut offs = 0usize;
    while offs < text.len() {
        let len = utf8_len(text[offs]).min(text.len() - offs);
        let s = sym
            .get_mut(4 * n..4 * n + 4)
            .ok_or(TokenizerError::ScratchTooSmall {
                needed: 0,
                given: 0,
            })?;
        s[0] = offs as u32;
        s[1] = len as u32;
        s[2] = if n == 0 { NONE } else { (n - 1) as u32 };
        offs += len;
        s[3] = if offs == text.len() {
            NONE
        } else {
            (n + 1) as u32
        };
        n += 1;
    }
    if n == 0 {
        return Ok(());
    }
    let mut heap = Heap::new(heap);
    for i in 1..n {
        try_add(tok, text, sym, &mut heap, (i - 1) as u32, i as u32)?;
    }
    while let Some([_, left, right, size]) = heap.pop() {
        let (l, r) = (left as usize, right as usize);
        let (ln, rn) = (sym[4 * l + 1], sym[4 * r + 1]);
        if ln == 0 || rn == 0 || ln + rn != size {
            continue; // one side was merged since this candidate was made
        }
        sym[4 * l + 1] = ln + rn;
        sym[4 * r + 1] = 0;
        let next = sym[4 * r + 3];
        sym[4 * l + 3] = next;
        if next != NONE {
            sym[4 * next as usize + 2] = left;
        }
        let prev = sym[4 * l + 2];
        try_add(tok, text, sym, &mut heap, prev, left)?;
        try_add(tok, text, sym, &mut heap, left, next)?;
    }
    let mut i = 0u32;
    while i != NONE {
        let s = 4 * i as usize;
        let (start, len) = (sym[s] as usize, sym[s + 1] as usize);
        let piece = &text[start..start + len];
        match tok.find(piece, &[]) {
            Some(id) => out.push(id),
            None => {
                for &b in piece {
                    match tok.byte_token(b) {
                        Some(id) => out.push(id),
                        None => {
                            // llama.cpp aborts here (the vocab has no byte token); emit
                            // <unk> if there is one rather than dropping text silently.
                            if let Some(u) = tok.unk() {
                                out.push(u)
                            }
                        }
                    }
                }
            }
        }
        i = sym[s + 3];
    }
    Ok(())
}

fn try_add(
    tok: &Tokenizer<'_>,
    text: &[u8],
    sym: &[u32],
    heap: &mut Heap<'_>,
    left: u32,
    right: u32,
) -> Result<(), TokenizerError> {
    if left == NONE || right == NONE {
        return Ok(());
    }
    let (l, r) = (4 * left as usize, 4 * right as usize);
    let start = sym[l] as usize;
    let size = (sym[l + 1] + sym[r + 1]) as usize;
    let Some(id) = tok.find(&text[start..start + size], &[]) else {
        return Ok(());
    };
    heap.push([score_key(tok.score(id)), left, right, size as u32])
}

/// Length of a UTF-8 sequence from its lead byte (llama.cpp's `unicode_len_utf8`).
pub(crate) fn utf8_len(b: u8) -> usize {
    const L: [u8; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    L[(b >> 4) as usize] as usize
}
