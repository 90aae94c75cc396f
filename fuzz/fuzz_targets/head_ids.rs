//! Fuzz target for `head.ids` files (`head::parse_ids`), read as `pinch` reads them:
//! refused unless UTF-8, then parsed for a vocabulary size.
//!
//! Input: bytes 0-1 are the vocabulary size (little-endian u16, so the fuzzer can hit
//! the header's `n_vocab=`); the rest is the file. The output buffer holds `n_vocab`
//! ids, as in `head_select::read_ids`. Checked: accepted ids are strictly increasing
//! and below `n_vocab`, and writing them back with `write_ids` parses to the same ids.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinch_runtime_min::head::{parse_ids, write_ids, HeadError};

fuzz_target!(|data: &[u8]| {
    let [a, b, file @ ..] = data else {
        return;
    };
    let n_vocab = u16::from_le_bytes([*a, *b]) as usize;
    let Ok(text) = core::str::from_utf8(file) else {
        return;
    };
    let mut out = vec![0u32; n_vocab];
    match parse_ids(text, n_vocab, &mut out) {
        Ok(k) => {
            let ids = &out[..k];
            assert!(ids.windows(2).all(|w| w[0] < w[1]));
            assert!(ids.iter().all(|&id| (id as usize) < n_vocab));
            let mut again = String::new();
            write_ids(&mut again, n_vocab, ids).unwrap();
            let mut back = vec![0u32; n_vocab];
            assert_eq!(parse_ids(&again, n_vocab, &mut back), Ok(k));
            assert_eq!(&back[..k], ids);
        }
        Err(HeadError::TooMany) => panic!("n_vocab slots always hold increasing ids below n_vocab"),
        Err(e) => {
            let _ = format!("{e}");
        }
    }
});
