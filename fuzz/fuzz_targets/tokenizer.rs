//! Fuzz target for the tokenizers: arbitrary bytes encoded with every supported vocab
//! kind, then decoded again.
//!
//! Input: byte 0 picks the vocab ([`pinch_fuzz::VOCABS`]) and the flags
//! (`add_special`, `parse_special`, a short output buffer); byte 1 is the short
//! buffer's length; the rest is the text. Checked beyond "no panic":
//! - every id is below `n_vocab`, and a full output buffer reports exactly the count a
//!   large enough one takes, after writing the same prefix;
//! - decoding the ids through `Utf8Stream` gives valid UTF-8 (with U+FFFD for invalid
//!   bytes); for byte-level BPE on valid UTF-8 without special tokens it gives the text
//!   back exactly;
//! - the rest of the input read as ids (mod `n_vocab`) decodes without panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinch_runtime_min::tokenizer::{TokenizerError, Utf8Stream, VocabKind};

fn decode(tok: &pinch_runtime_min::tokenizer::Tokenizer, ids: &[u32], special: bool) -> String {
    let mut text = String::new();
    let mut stream = Utf8Stream::new();
    let mut sink = |s: &str| -> Result<(), ()> {
        text.push_str(s);
        Ok(())
    };
    for &id in ids {
        let _ = stream.push(tok.token_to_piece(id, special), &mut sink);
        assert!(stream.pending() <= 3);
    }
    let _ = stream.finish(&mut sink);
    text
}

fuzz_target!(init: { pinch_fuzz::tokenizers(); }, |data: &[u8]| {
    let [sel, short, text @ ..] = data else {
        return;
    };
    let toks = pinch_fuzz::tokenizers();
    let tok = &toks[(sel & 7) as usize % toks.len()];
    let add_special = sel & 8 != 0;
    let parse_special = sel & 16 != 0;
    let n_vocab = tok.n_vocab();

    let mut scratch = vec![0u8; tok.scratch_bytes(text.len())];
    // A first guess of one id a byte; a full buffer must say how many it needs, and
    // that many must then be enough.
    let mut ids = vec![0u32; text.len() + 2];
    let n = match tok.encode_bytes(text, add_special, parse_special, &mut scratch, &mut ids) {
        Ok(n) => n,
        Err(TokenizerError::OutputFull { needed, given }) => {
            assert!(given == ids.len() && needed > given);
            ids = vec![0u32; needed];
            tok.encode_bytes(text, add_special, parse_special, &mut scratch, &mut ids)
                .unwrap_or_else(|e| panic!("with the {needed} ids asked for: {e}"))
        }
        // A vocab that asks for BOS/EOS but has none (no vocab here does).
        Err(TokenizerError::MissingSpecialToken { .. }) if add_special => return,
        Err(e) => panic!("encoding failed: {e}"),
    };
    ids.truncate(n);
    assert!(ids.iter().all(|&id| id < n_vocab), "id out of range");

    if sel & 32 != 0 {
        let given = (*short as usize).min(n);
        let mut few = vec![0u32; given];
        match tok.encode_bytes(text, add_special, parse_special, &mut scratch, &mut few) {
            Ok(m) => assert!(m == n && given == n),
            Err(TokenizerError::OutputFull { needed, given: g }) => {
                assert!(needed == n && g == given && given < n);
                assert_eq!(few[..], ids[..given]);
            }
            Err(e) => panic!("short output gave {e}"),
        }
    }
    // Scratch one byte short is refused, never overrun.
    let need = scratch.len();
    assert!(matches!(
        tok.encode_bytes(
            text,
            false,
            false,
            &mut scratch[..need - 1],
            &mut ids.clone()
        ),
        Err(TokenizerError::ScratchTooSmall { .. })
    ));

    let back = decode(tok, &ids, parse_special);
    if tok.kind() == VocabKind::Bpe && !add_special && !parse_special {
        if let Ok(s) = core::str::from_utf8(text) {
            assert_eq!(back, s, "byte-level BPE must give the text back");
        }
    }
    // The text read as ids: every id decodes, in range or not.
    let raw: Vec<u32> = text
        .chunks(4)
        .map(|c| c.iter().fold(0u32, |a, &b| a << 8 | b as u32))
        .collect();
    let _ = decode(tok, &raw, true);
    let wrapped: Vec<u32> = raw.iter().map(|&id| id % n_vocab).collect();
    let _ = decode(tok, &wrapped, sel & 64 != 0);
});
