//! Tokenizers: text to token ids and back, as llama.cpp does it (`src/llama-vocab.cpp`,
//! `src/unicode.cpp` at commit 0c1e570).
//!
//! Three vocabulary families, chosen by `tokenizer.ggml.model`:
//! - `llama`: SentencePiece. Spaces become `▁`, an optional space is prepended
//!   (`add_space_prefix`), pairs are merged by token score ([`spm`]), and characters
//!   missing from the vocab fall back to `<0xXX>` byte tokens.
//! - `gpt2`: byte-level BPE. The text is split into words by a pre-tokenizer
//!   ([`pretok`], `tokenizer.ggml.pre`), every byte maps to a printable character, and
//!   pairs are merged by rank ([`bpe`]). Three pre-tokenizers (`gemma4`,
//!   `granite-embed-multi-311m`, `sarvam-moe`) make it SentencePiece-style BPE instead:
//!   spaces become `▁`, merges start from UTF-8 characters, and pieces missing from the
//!   vocab fall back to `<0xXX>` byte tokens. `tokenizer.ggml.model = gemma4` (Gemma 4)
//!   is this BPE with the `gemma4` pre-tokenizer.
//! - `t5`: SentencePiece unigram (UGM). The text is normalized by the vocab's
//!   precompiled charsmap, spaces become `▁`, and the best-scoring segmentation is found
//!   by Viterbi search ([`ugm`]); characters missing from the vocab become `<unk>`.
//!
//! Before either, special tokens are cut out of the text: user-defined tokens always,
//! control tokens only when `parse_special` is set; longer tokens win.
//!
//! Memory: every table is carved from the [`Arena`] once, at load, under the account
//! `"tokenizer"`; token texts are not copied but borrowed from the GGUF header. Encoding
//! needs a caller-provided scratch buffer of [`Tokenizer::scratch_bytes`] and writes ids
//! into a caller-provided slice; nothing is allocated per call.
//!
//! Decoding: [`Tokenizer::token_bytes`] gives the bytes a token stands for; feed them to a
//! [`Utf8Stream`] to print only whole characters.
mod bpe;
mod heap;
mod pretok;
mod rx;
mod spm;
mod stream;
mod table;
mod ugm;
mod unicode;
mod unicode_tables;

pub use pretok::{PreInfo, PreTokenizer, NAMES as PRE_TOKENIZER_NAMES};
pub use stream::Utf8Stream;

use crate::arena::{Arena, ArenaError};
use crate::gguf::{ArrayView, Gguf, ValueType};
use pinch_kernels::blocks::cast_mut;
use table::{IdTable, IdTableRef, MergeTable};

/// "No id" in the `u32` tables.
pub(crate) const NONE: u32 = u32::MAX;

/// Arena account of every tokenizer table.
pub const ACCOUNT: &str = "tokenizer";

/// Token attributes (llama.cpp's `llama_token_attr`, the bits we use).
pub mod attr {
    pub const NORMAL: u8 = 0x01;
    pub const UNKNOWN: u8 = 0x02;
    pub const CONTROL: u8 = 0x04;
    pub const USER_DEFINED: u8 = 0x08;
    pub const UNUSED: u8 = 0x10;
    pub const BYTE: u8 = 0x20;
    /// Strip whitespace left of this special token when it is cut out of text.
    pub const LSTRIP: u8 = 0x40;
    /// Strip whitespace right of this special token when it is cut out of text.
    pub const RSTRIP: u8 = 0x80;
}

/// What went wrong loading a vocabulary or encoding text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A required metadata key is absent.
    MissingKey { key: &'static str },
    /// A metadata key has the wrong type (e.g. scores not f32/i32).
    WrongType { key: &'static str },
    /// An array is shorter than the token list.
    CountMismatch {
        key: &'static str,
        expected: u64,
        found: u64,
    },
    /// An array's bytes end before element `index` does.
    Malformed { key: &'static str, index: u64 },
    /// `tokenizer.ggml.model` is not `llama`, `gpt2`, `gemma4` or `t5`.
    UnsupportedModel { name: Name },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    UnsupportedPreTokenizer { name: Name },
    /// A size does not fit the `u32` tables.
    TooLarge { what: &'static str },
    /// The arena could not hold the tables.
    Arena(ArenaError),
    /// `add_special` asks for a BOS/EOS token the vocab does not have.
    MissingSpecialToken { which: &'static str },
    /// The output slice holds `given` ids but the text needs `needed`.
    OutputFull { needed: usize, given: usize },
    /// The scratch buffer is smaller than [`Tokenizer::scratch_bytes`].
    ScratchTooSmall { needed: usize, given: usize },
}

impl core::fmt::Display for TokenizerError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use TokenizerError as E;
        match self {
            E::MissingKey { key } => write!(f, "tokenizer: metadata key '{key}' is missing"),
            E::WrongType { key } => write!(f, "tokenizer: metadata key '{key}' has the wrong type"),
            E::CountMismatch {
                key,
                expected,
                found,
            } => write!(
                f,
                "tokenizer: '{key}' has {found} entries but the vocab has {expected} tokens"
            ),
            E::Malformed { key, index } => {
                write!(f, "tokenizer: '{key}' is malformed at element {index}")
            }
            E::UnsupportedModel { name } => write!(
                f,
                "tokenizer: tokenizer.ggml.model is '{name}', which pinch does not support \
                 (supported: llama = SentencePiece, gpt2 = byte-level BPE, \
                 gemma4 = SentencePiece-style BPE, t5 = unigram)"
            ),
            E::UnsupportedPreTokenizer { name } => {
                write!(
                    f,
                    "tokenizer: tokenizer.ggml.pre is '{name}', which pinch does not support \
                     (supported:"
                )?;
                for (n, _) in pretok::NAMES {
                    write!(f, " {n}")?;
                }
                write!(f, ")")
            }
            E::TooLarge { what } => write!(f, "tokenizer: {what} is too large"),
            E::Arena(e) => write!(f, "tokenizer: {e}"),
            E::MissingSpecialToken { which } => {
                write!(
                    f,
                    "tokenizer: the vocab has no {which} token but one must be added"
                )
            }
            E::OutputFull { needed, given } => {
                write!(
                    f,
                    "tokenizer: text needs {needed} tokens but the output holds {given}"
                )
            }
            E::ScratchTooSmall { needed, given } => {
                write!(f, "tokenizer: scratch needs {needed} bytes, got {given}")
            }
        }
    }
}

impl core::error::Error for TokenizerError {}

/// A metadata value quoted in an error: its first 48 bytes (an error holds no borrow).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Name {
    bytes: [u8; 48],
    len: u8,
}

impl Name {
    pub fn new(s: &str) -> Name {
        let mut bytes = [0u8; 48];
        let mut n = s.len().min(48);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        bytes[..n].copy_from_slice(&s.as_bytes()[..n]);
        Name {
            bytes,
            len: n as u8,
        }
    }
    pub fn as_str(&self) -> &str {
        // `new` cuts at a character boundary, so this never fails.
        core::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("")
    }
}

impl core::fmt::Debug for Name {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl core::fmt::Display for Name {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<ArenaError> for TokenizerError {
    fn from(e: ArenaError) -> Self {
        TokenizerError::Arena(e)
    }
}

/// Vocabulary family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// `llama`: SentencePiece.
    Spm,
    /// `gpt2` (and `gemma4`): BPE, byte-level unless the pre-tokenizer escapes spaces.
    Bpe,
    /// `t5`: SentencePiece unigram (UGM).
    Ugm,
}

/// The tokenizer metadata of a GGUF file, independent of the reader.
///
/// Arrays are GGUF-encoded ([`ArrayView`]); token strings are borrowed for `'a`.
#[derive(Clone, Copy, Debug)]
pub struct VocabSource<'a> {
    /// `tokenizer.ggml.model`
    pub model: &'a str,
    /// `tokenizer.ggml.pre`
    pub pre: Option<&'a str>,
    /// `general.name` (llama.cpp keys a few per-model token attributes on it)
    pub name: Option<&'a str>,
    /// `tokenizer.ggml.tokens` (strings)
    pub tokens: ArrayView<'a>,
    /// `tokenizer.ggml.scores` (f32 or i32)
    pub scores: Option<ArrayView<'a>>,
    /// `tokenizer.ggml.token_type` (i32)
    pub types: Option<ArrayView<'a>>,
    /// `tokenizer.ggml.merges` (strings, "left right")
    pub merges: Option<ArrayView<'a>>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    /// FIM token ids by role (see [`FIM_KEYS`]).
    pub fim: [Option<u32>; 6],
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.ggml.remove_extra_whitespaces` (UGM)
    pub remove_extra_whitespaces: Option<bool>,
    /// `tokenizer.ggml.precompiled_charsmap` (UGM; u8 or i8 array)
    pub charsmap: Option<ArrayView<'a>>,
}

/// A loaded tokenizer; all tables live in the arena.
#[derive(Clone)]
pub struct Tokenizer<'a> {
    kind: VocabKind,
    pub(crate) pre: PreTokenizer,
    n_vocab: u32,
    texts: &'a [u8],
    /// (start, len) of each token's text in `texts`.
    spans: &'a [u32],
    scores: &'a [f32],
    attrs: &'a [u8],
    piece_off: &'a [u32],
    pieces: &'a [u8],
    lookup: IdTableRef<'a>,
    special: IdTableRef<'a>,
    /// Distinct byte lengths of special tokens, longest first.
    special_lens: &'a [u32],
    /// First bytes of [user-defined-only, all] special tokens, as 256-bit sets.
    special_first: [[u64; 4]; 2],
    pub(crate) byte_tok: [u32; 256],
    pub(crate) byte_enc: [([u8; 2], u8); 256],
    pub(crate) merges: MergeTable<'a>,
    pub(crate) ignore_merges: bool,
    /// SentencePiece-style BPE ([`PreInfo::escape_spaces`]).
    pub(crate) escape_spaces: bool,
    /// llama.cpp's `clean_spaces`: detokenizing drops spaces before `?!.,` and some `'`.
    clean_spaces: bool,
    add_space_prefix: bool,
    add_bos: bool,
    add_eos: bool,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    eog: heapless::Vec<u32, 32>,
    /// Unigram tables (UGM vocabs only).
    ugm: Option<ugm::Ugm<'a>>,
    /// Pruned LM head: a bit per id; ids whose bit is clear are never produced (see
    /// [`Tokenizer::set_allowed`]).
    allowed: Option<&'a [u64]>,
}

/// Where encoded ids go; counts past the end so the error can say how many are needed.
pub(crate) struct Out<'o> {
    buf: &'o mut [u32],
    n: usize,
}

impl Out<'_> {
    #[inline]
    pub(crate) fn push(&mut self, id: u32) {
        if let Some(slot) = self.buf.get_mut(self.n) {
            *slot = id;
        }
        self.n += 1;
    }
}

// Marks of the special-token partition, one per text byte.
const RAW: u8 = 0;
const START: u8 = 1;
const CONT: u8 = 2;
const DROPPED: u8 = 3;

/// Text of a GGUF string array: (start, len) of each element in `view.bytes`.
fn string_spans(
    view: &ArrayView<'_>,
    key: &'static str,
    out: &mut [u32],
) -> Result<(), TokenizerError> {
    if view.elem != ValueType::Str {
        return Err(TokenizerError::WrongType { key });
    }
    let b = view.bytes;
    let mut pos = 0usize;
    for i in 0..out.len() / 2 {
        let bad = TokenizerError::Malformed {
            key,
            index: i as u64,
        };
        let hdr = b.get(pos..pos + 8).ok_or(bad)?;
        let mut l = [0u8; 8];
        l.copy_from_slice(hdr);
        let len = usize::try_from(u64::from_le_bytes(l)).map_err(|_| bad)?;
        let start = pos + 8;
        let end = start.checked_add(len).ok_or(bad)?;
        if end > b.len() || end > u32::MAX as usize {
            return Err(bad);
        }
        out[2 * i] = start as u32;
        out[2 * i + 1] = len as u32;
        pos = end;
    }
    Ok(())
}

/// The GGUF string at `*pos` in `b` (u64 length, bytes); advances `pos`.
fn next_string<'b>(b: &'b [u8], pos: &mut usize) -> Option<&'b [u8]> {
    let mut l = [0u8; 8];
    l.copy_from_slice(b.get(*pos..pos.checked_add(8)?)?);
    let len = usize::try_from(u64::from_le_bytes(l)).ok()?;
    let start = *pos + 8;
    let s = b.get(start..start.checked_add(len)?)?;
    *pos = start + len;
    Some(s)
}

fn add_eog(eog: &mut heapless::Vec<u32, 32>, id: u32) {
    if !eog.contains(&id) {
        let _ = eog.push(id);
    }
}

fn numeric_at(view: &ArrayView<'_>, i: usize) -> Option<f32> {
    let b = view.bytes.get(4 * i..4 * i + 4)?;
    let mut w = [0u8; 4];
    w.copy_from_slice(b);
    match view.elem {
        ValueType::F32 => Some(f32::from_le_bytes(w)),
        ValueType::I32 => Some(i32::from_le_bytes(w) as f32),
        _ => None,
    }
}

fn i32_at(view: &ArrayView<'_>, i: usize) -> Option<i32> {
    let b = view.bytes.get(4 * i..4 * i + 4)?;
    let mut w = [0u8; 4];
    w.copy_from_slice(b);
    Some(i32::from_le_bytes(w))
}

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

fn bit_set(set: &[u64; 4], b: u8) -> bool {
    set[(b >> 6) as usize] & (1u64 << (b & 63)) != 0
}

/// Texts llama.cpp recognises as end-of-generation tokens (and forces to control type).
const EOG_TEXTS: [&str; 22] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
/// Texts of the end-of-turn token when `tokenizer.ggml.eot_token_id` is absent.
const EOT_TEXTS: [&str; 11] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
/// Fill-in-the-middle tokens by role (prefix, suffix, middle, pad, repo, file separator):
/// when the GGUF names no id for a role, the first of these texts in the vocab is that
/// token, forced to control type; pad, repo and separator end generation.
const FIM_TEXTS: [&[&str]; 6] = [
    &[
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ],
    &[
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ],
    &[
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ],
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];
/// The GGUF keys of the FIM roles (llama.cpp also reads the deprecated
/// `prefix/suffix/middle_token_id` for the first three).
const FIM_KEYS: [(&str, Option<&str>); 6] = [
    (
        "tokenizer.ggml.fim_pre_token_id",
        Some("tokenizer.ggml.prefix_token_id"),
    ),
    (
        "tokenizer.ggml.fim_suf_token_id",
        Some("tokenizer.ggml.suffix_token_id"),
    ),
    (
        "tokenizer.ggml.fim_mid_token_id",
        Some("tokenizer.ggml.middle_token_id"),
    ),
    ("tokenizer.ggml.fim_pad_token_id", None),
    ("tokenizer.ggml.fim_rep_token_id", None),
    ("tokenizer.ggml.fim_sep_token_id", None),
];
/// gpt-oss tokens llama.cpp always renders (their type becomes user-defined).
const ALWAYS_RENDERED: [&str; 4] = ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

impl<'a> VocabSource<'a> {
    /// The tokenizer keys of a parsed GGUF header.
    pub fn from_gguf(g: &Gguf<'a>) -> Result<VocabSource<'a>, TokenizerError> {
        let arr = |key: &'static str| -> Result<Option<ArrayView<'a>>, TokenizerError> {
            match g.get(key) {
                None => Ok(None),
                Some(v) => v
                    .as_array()
                    .map(Some)
                    .ok_or(TokenizerError::WrongType { key }),
            }
        };
        let id = |key: &'static str| g.get_u32(key);
        let model = "tokenizer.ggml.model";
        let tokens = "tokenizer.ggml.tokens";
        Ok(VocabSource {
            model: g
                .get_str(model)
                .ok_or(TokenizerError::MissingKey { key: model })?,
            pre: g.get_str("tokenizer.ggml.pre"),
            name: g.get_str("general.name"),
            tokens: arr(tokens)?.ok_or(TokenizerError::MissingKey { key: tokens })?,
            scores: arr("tokenizer.ggml.scores")?,
            types: arr("tokenizer.ggml.token_type")?,
            merges: arr("tokenizer.ggml.merges")?,
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            eot: id("tokenizer.ggml.eot_token_id"),
            eom: id("tokenizer.ggml.eom_token_id"),
            unk: id("tokenizer.ggml.unknown_token_id"),
            fim: FIM_KEYS.map(|(key, old)| old.and_then(id).or_else(|| id(key))),
            add_bos: g.get_bool("tokenizer.ggml.add_bos_token"),
            add_eos: g.get_bool("tokenizer.ggml.add_eos_token"),
            add_space_prefix: g.get_bool("tokenizer.ggml.add_space_prefix"),
            remove_extra_whitespaces: g.get_bool("tokenizer.ggml.remove_extra_whitespaces"),
            charsmap: arr("tokenizer.ggml.precompiled_charsmap")?,
        })
    }
}

impl<'a> Tokenizer<'a> {
    /// Build from the `tokenizer.ggml.*` keys of a GGUF header; tables go to `arena`
    /// (account [`ACCOUNT`]), token texts stay borrowed from the header.
    pub fn from_gguf(g: &Gguf<'a>, arena: &mut Arena<'a>) -> Result<Tokenizer<'a>, TokenizerError> {
        Tokenizer::from_source(&VocabSource::from_gguf(g)?, arena)
    }

    /// Build from GGUF metadata read by any reader (see [`VocabSource`]).
    pub fn from_source(
        src: &VocabSource<'a>,
        arena: &mut Arena<'a>,
    ) -> Result<Tokenizer<'a>, TokenizerError> {
        let kind = match src.model {
            "llama" => VocabKind::Spm,
            "gpt2" | "gemma4" => VocabKind::Bpe,
            "t5" => VocabKind::Ugm,
            m => return Err(TokenizerError::UnsupportedModel { name: Name::new(m) }),
        };
        // llama.cpp sets the pre-tokenizer of a `gemma4` model itself (Gemma 4's files
        // have no `tokenizer.ggml.pre`), and gives it no default special ids.
        let gemma4_model = src.model == "gemma4";
        let info = match (kind, src.pre) {
            _ if gemma4_model => PreTokenizer::from_name("gemma4"),
            (VocabKind::Spm | VocabKind::Ugm, _) | (VocabKind::Bpe, None) => {
                PreTokenizer::from_name("default")
            }
            (VocabKind::Bpe, Some(p)) => PreTokenizer::from_name(p),
        }
        .ok_or(TokenizerError::UnsupportedPreTokenizer {
            name: Name::new(src.pre.unwrap_or("")),
        })?;
        let pre = info.pre;
        let n = usize::try_from(src.tokens.len)
            .ok()
            .filter(|&n| n < (u32::MAX / 2) as usize)
            .ok_or(TokenizerError::TooLarge { what: "token list" })?;

        let spans = arena.slice::<u32>(ACCOUNT, 2 * n)?;
        string_spans(&src.tokens, "tokenizer.ggml.tokens", spans)?;
        let spans: &'a [u32] = spans;
        let texts = src.tokens.bytes;

        let scores = arena.slice::<f32>(ACCOUNT, n)?;
        if let Some(s) = &src.scores {
            const KEY: &str = "tokenizer.ggml.scores";
            if s.len < n as u64 {
                return Err(TokenizerError::CountMismatch {
                    key: KEY,
                    expected: n as u64,
                    found: s.len,
                });
            }
            for (i, out) in scores.iter_mut().enumerate() {
                *out = numeric_at(s, i).ok_or(TokenizerError::WrongType { key: KEY })?;
            }
        }

        let attrs = arena.slice::<u8>(ACCOUNT, n)?;
        for a in attrs.iter_mut() {
            *a = attr::NORMAL;
        }
        if let Some(t) = &src.types {
            const KEY: &str = "tokenizer.ggml.token_type";
            if t.elem != ValueType::I32 {
                return Err(TokenizerError::WrongType { key: KEY });
            }
            if t.len < n as u64 {
                return Err(TokenizerError::CountMismatch {
                    key: KEY,
                    expected: n as u64,
                    found: t.len,
                });
            }
            for (i, a) in attrs.iter_mut().enumerate() {
                let ty = i32_at(t, i).ok_or(TokenizerError::Malformed {
                    key: KEY,
                    index: i as u64,
                })?;
                *a = match ty {
                    1 => attr::NORMAL,
                    2 => attr::UNKNOWN,
                    3 => attr::CONTROL,
                    4 => attr::USER_DEFINED,
                    5 => attr::UNUSED,
                    6 => attr::BYTE,
                    _ => 0,
                };
            }
        }

        // Token text -> id.
        let key_of = |id: u32| -> &'a [u8] {
            let (s, l) = (
                spans[2 * id as usize] as usize,
                spans[2 * id as usize + 1] as usize,
            );
            &texts[s..s + l]
        };
        let mut lookup = IdTable::new(arena, ACCOUNT, n)?;
        for id in 0..n as u32 {
            lookup.insert(id, key_of(id), key_of);
        }
        let lookup = lookup.freeze();
        let find = |s: &str| lookup.find(s.as_bytes(), &[], key_of, |_| true);

        // Special ids: model defaults, then metadata (out-of-range values ignored).
        let in_range = |id: u32| (id < n as u32).then_some(id);
        let (mut bos, mut eos, mut unk) = match kind {
            VocabKind::Spm => (in_range(1), in_range(2), in_range(0)),
            VocabKind::Bpe if gemma4_model => (None, None, None),
            VocabKind::Bpe if info.no_default_bos => (None, in_range(11), None),
            VocabKind::Bpe => (in_range(11), in_range(11), None),
            VocabKind::Ugm => (None, in_range(1), in_range(2)),
        };
        let pick = |cur: Option<u32>, meta: Option<u32>| meta.and_then(in_range).or(cur);
        bos = pick(bos, src.bos);
        eos = pick(eos, src.eos);
        unk = pick(unk, src.unk);
        let mut eot = src.eot.and_then(in_range);
        let mut eom = src.eom.and_then(in_range);
        let (mut add_bos, add_eos, add_space_prefix) = match kind {
            VocabKind::Spm => (true, false, true),
            VocabKind::Bpe => (info.add_bos, false, false),
            VocabKind::Ugm => (false, true, false),
        };
        let add_space_prefix = src.add_space_prefix.unwrap_or(add_space_prefix);
        add_bos = src.add_bos.unwrap_or(add_bos) || (kind == VocabKind::Bpe && info.always_bos);
        let add_eos = src.add_eos.unwrap_or(add_eos);

        // Tokens llama.cpp recognises by their text (and forces to control type).
        let force_control = |attrs: &mut [u8], id: u32| attrs[id as usize] |= attr::CONTROL;
        if eot.is_none() {
            if let Some(id) = EOT_TEXTS.iter().find_map(|t| find(t)) {
                eot = Some(id);
                force_control(attrs, id);
            }
        }
        if eom.is_none() {
            if let Some(id) = find("<|eom_id|>") {
                eom = Some(id);
                force_control(attrs, id);
            }
        }
        let mut eog: heapless::Vec<u32, 32> = heapless::Vec::new();
        for (role, texts) in FIM_TEXTS.iter().enumerate() {
            let id = match src.fim[role].and_then(in_range) {
                Some(id) => Some(id),
                None => texts
                    .iter()
                    .find_map(|t| find(t))
                    .inspect(|&id| force_control(attrs, id)),
            };
            if let (Some(id), true) = (id, role >= 3) {
                add_eog(&mut eog, id);
            }
        }
        for t in EOG_TEXTS {
            if let Some(id) = find(t) {
                force_control(attrs, id);
                add_eog(&mut eog, id);
            }
        }
        for t in ALWAYS_RENDERED {
            if let Some(id) = find(t) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        for id in [eos, eot, eom].into_iter().flatten() {
            add_eog(&mut eog, id);
        }
        // Gemma 4 and PLaMo have a `</s>` that is ordinary text: when an end token of
        // theirs is there, llama.cpp drops `</s>` from the end tokens and makes it normal.
        let eog_has = |eog: &[u32], t: &[u8]| eog.iter().position(|&id| key_of(id) == t);
        if eog_has(&eog, b"<|tool_response>").is_some() || eog_has(&eog, b"<|plamo:eos|>").is_some()
        {
            if let Some(i) = eog_has(&eog, b"</s>") {
                attrs[eog.remove(i) as usize] = attr::NORMAL;
            }
        }

        // Phi-3: special tokens swallow the whitespace after them.
        let name_is_phi3 = src.name.is_some_and(|nm| {
            let b = nm.as_bytes();
            b.windows(5).any(|w| w.eq_ignore_ascii_case(b"phi-3"))
                || b.windows(4).any(|w| w.eq_ignore_ascii_case(b"phi3"))
        });
        let is_special = |a: u8| a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0;
        if name_is_phi3 {
            for a in attrs.iter_mut() {
                if is_special(*a) {
                    *a |= attr::RSTRIP;
                }
            }
            if let Some(id) = find("</s>") {
                attrs[id as usize] |= attr::RSTRIP;
            }
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(id) = find(t) {
                    attrs[id as usize] &= !attr::RSTRIP;
                }
            }
        }

        // Special-token index: table, distinct lengths, first-byte sets.
        let n_special = attrs.iter().filter(|&&a| is_special(a)).count();
        let mut special = IdTable::new(arena, ACCOUNT, n_special)?;
        let mut special_first = [[0u64; 4]; 2];
        let mut len_seen = [0u64; 4]; // lengths < 256 as a bit set
        let mut n_long = 0usize;
        for id in 0..n as u32 {
            let a = attrs[id as usize];
            let t = key_of(id);
            if !is_special(a) || t.is_empty() {
                continue;
            }
            special.insert(id, t, key_of);
            let b = t[0];
            special_first[1][(b >> 6) as usize] |= 1 << (b & 63);
            if a & (attr::CONTROL | attr::UNKNOWN) == 0 {
                special_first[0][(b >> 6) as usize] |= 1 << (b & 63);
            }
            if t.len() < 256 {
                len_seen[t.len() >> 6] |= 1 << (t.len() & 63);
            } else {
                n_long += 1;
            }
        }
        let special = special.freeze();
        let n_lens = len_seen
            .iter()
            .map(|w| w.count_ones() as usize)
            .sum::<usize>()
            + n_long;
        let special_lens = arena.slice::<u32>(ACCOUNT, n_lens)?;
        let mut k = 0;
        for id in 0..n as u32 {
            let t = key_of(id);
            if is_special(attrs[id as usize]) && t.len() >= 256 {
                special_lens[k] = t.len() as u32;
                k += 1;
            }
        }
        for l in (1..256usize).rev() {
            if len_seen[l >> 6] & (1 << (l & 63)) != 0 {
                special_lens[k] = l as u32;
                k += 1;
            }
        }
        special_lens[..k].sort_unstable_by(|a, b| b.cmp(a));
        let special_lens: &'a [u32] = special_lens;

        // Byte -> token.
        let escape_spaces = kind == VocabKind::Bpe && info.escape_spaces;
        let byte_enc = unicode::byte_encoding_table();
        let mut byte_tok = [NONE; 256];
        for (b, slot) in byte_tok.iter_mut().enumerate() {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            let name = [b'<', b'0', b'x', HEX[b >> 4], HEX[b & 15], b'>'];
            *slot = match kind {
                VocabKind::Spm | VocabKind::Ugm => lookup
                    .find(&name, &[], key_of, |_| true)
                    .or_else(|| lookup.find(&[b as u8], &[], key_of, |_| true))
                    .unwrap_or(NONE),
                // SentencePiece-style BPE tries only `<0xXX>`, not the byte itself.
                VocabKind::Bpe if escape_spaces => {
                    lookup.find(&name, &[], key_of, |_| true).unwrap_or(NONE)
                }
                VocabKind::Bpe => {
                    let (e, l) = byte_enc[b];
                    lookup
                        .find(&e[..l as usize], &[], key_of, |_| true)
                        .unwrap_or(NONE)
                }
            };
        }

        // Merges (BPE): rank -> (left id, right id, merged id).
        let merges = match (kind, &src.merges) {
            (VocabKind::Bpe, Some(m)) => {
                const KEY: &str = "tokenizer.ggml.merges";
                let nm = usize::try_from(m.len)
                    .ok()
                    .filter(|&x| x < (u32::MAX / 4) as usize)
                    .ok_or(TokenizerError::TooLarge { what: "merge list" })?;
                let left = arena.slice::<u32>(ACCOUNT, nm)?;
                let right = arena.slice::<u32>(ACCOUNT, nm)?;
                let result = arena.slice::<u32>(ACCOUNT, nm)?;
                if m.elem != ValueType::Str {
                    return Err(TokenizerError::WrongType { key: KEY });
                }
                let mut pos = 0usize;
                for i in 0..nm {
                    let w = next_string(m.bytes, &mut pos).ok_or(TokenizerError::Malformed {
                        key: KEY,
                        index: i as u64,
                    })?;
                    // Split at the first space after the first byte, as llama.cpp does.
                    let sp = w.iter().skip(1).position(|&c| c == b' ').map(|p| p + 1);
                    let (a, b) = match sp {
                        Some(p) => (&w[..p], &w[p + 1..]),
                        None => (&w[..0], &w[..0]),
                    };
                    let any = |_| true;
                    left[i] = lookup.find(a, &[], key_of, any).unwrap_or(NONE);
                    right[i] = lookup.find(b, &[], key_of, any).unwrap_or(NONE);
                    result[i] = lookup.find(a, b, key_of, any).unwrap_or(NONE);
                }
                let slots = arena.slice::<u32>(ACCOUNT, table::capacity_for(nm)?)?;
                for i in 0..nm {
                    if left[i] != NONE && right[i] != NONE {
                        table::merge_insert(slots, left, right, i as u32);
                    }
                }
                MergeTable {
                    slots,
                    left,
                    right,
                    result,
                }
            }
            (VocabKind::Bpe, None) => {
                return Err(TokenizerError::MissingKey {
                    key: "tokenizer.ggml.merges",
                })
            }
            (VocabKind::Spm | VocabKind::Ugm, _) => MergeTable::empty(),
        };

        // Decoded bytes of every token (llama.cpp's token_to_piece with special = true).
        let piece_off = arena.slice::<u32>(ACCOUNT, n + 1)?;
        let mut total = 0usize;
        for id in 0..n as u32 {
            piece_off[id as usize] = total as u32;
            let a = attrs[id as usize];
            total += decode_piece(kind, escape_spaces, a, key_of(id), &mut []); // count only
            if total > u32::MAX as usize {
                return Err(TokenizerError::TooLarge {
                    what: "token pieces",
                });
            }
        }
        piece_off[n] = total as u32;
        let pieces = arena.bytes(ACCOUNT, total)?;
        for id in 0..n {
            let (s, e) = (piece_off[id] as usize, piece_off[id + 1] as usize);
            decode_piece(
                kind,
                escape_spaces,
                attrs[id],
                key_of(id as u32),
                &mut pieces[s..e],
            );
        }

        let ugm = match kind {
            VocabKind::Ugm => {
                let charsmap = match &src.charsmap {
                    Some(c) if matches!(c.elem, ValueType::U8 | ValueType::I8) => Some(c.bytes),
                    Some(_) => {
                        return Err(TokenizerError::WrongType {
                            key: "tokenizer.ggml.precompiled_charsmap",
                        })
                    }
                    None => None,
                };
                let merge = src.remove_extra_whitespaces.unwrap_or(false);
                let len_of = |id: u32| spans[2 * id as usize + 1] as usize;
                Some(ugm::Ugm::new(charsmap, scores, attrs, len_of, merge)?)
            }
            _ => None,
        };

        Ok(Tokenizer {
            kind,
            ugm,
            pre,
            n_vocab: n as u32,
            texts,
            spans,
            scores,
            attrs,
            piece_off,
            pieces,
            lookup,
            special,
            special_lens,
            special_first,
            byte_tok,
            byte_enc,
            merges,
            ignore_merges: kind == VocabKind::Bpe && info.ignore_merges,
            escape_spaces,
            clean_spaces: kind == VocabKind::Bpe && info.clean_spaces,
            add_space_prefix,
            add_bos,
            add_eos,
            bos,
            eos,
            eot,
            eom,
            unk,
            eog,
            allowed: None,
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> u32 {
        self.n_vocab
    }
    /// SentencePiece, byte-level BPE or unigram.
    pub fn kind(&self) -> VocabKind {
        self.kind
    }
    /// The BPE pre-tokenizer (meaningless for SentencePiece).
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }
    /// Whether this BPE vocab is SentencePiece-style (spaces as `▁`, `<0xXX>` byte tokens)
    /// rather than byte-level.
    pub fn escapes_spaces(&self) -> bool {
        self.escape_spaces
    }
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    /// End-of-turn token (`<end_of_turn>`, `<|eot_id|>`, `<|im_end|>` ...).
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }
    /// End-of-message token (`<|eom_id|>`).
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }
    /// Whether `add_special` prepends BOS.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }
    /// Whether `add_special` appends EOS.
    pub fn adds_eos(&self) -> bool {
        self.add_eos
    }
    /// Whether SentencePiece text gets a leading space.
    pub fn adds_space_prefix(&self) -> bool {
        self.add_space_prefix
    }
    /// Whether `id` ends generation (EOS, EOT, EOM and llama.cpp's end-like tokens).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }
    /// All end-of-generation ids.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }
    /// Attribute bits ([`attr`]) of `id`; 0 if out of range.
    pub fn token_attr(&self, id: u32) -> u8 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }
    /// The token's text as stored in the vocab (with `▁` or GPT-2 byte characters).
    pub fn token_text(&self, id: u32) -> &'a [u8] {
        match self.spans.get(2 * id as usize..2 * id as usize + 2) {
            Some(s) => &self.texts[s[0] as usize..(s[0] + s[1]) as usize],
            None => &[],
        }
    }
    /// Score of `id` (0 if out of range).
    pub fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }
    /// The bytes `id` stands for: `▁` -> space, `<0xXX>` -> the byte, GPT-2 characters ->
    /// their bytes; control and user-defined tokens give their text. Empty if out of range.
    pub fn token_bytes(&self, id: u32) -> &'a [u8] {
        let i = id as usize;
        if i >= self.n_vocab as usize {
            return &[];
        }
        &self.pieces[self.piece_off[i] as usize..self.piece_off[i + 1] as usize]
    }
    /// llama.cpp's `token_to_piece`: like [`Self::token_bytes`], but control and unknown
    /// tokens are empty unless `special`.
    pub fn token_to_piece(&self, id: u32, special: bool) -> &'a [u8] {
        if !special && self.token_attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0 {
            return &[];
        }
        self.token_bytes(id)
    }
    /// llama.cpp's `llama_detokenize`: the pieces of `ids` ([`Self::token_to_piece`] with
    /// `special = unparse_special`) joined, without the BOS/EOS the vocab adds when
    /// `remove_special`, without the first piece's leading space when the vocab prepends
    /// one, and with llama.cpp's `clean_spaces` clean-up for the vocabs that ask for it.
    ///
    /// Returns the length of the text; it is written to `out` only when `out` holds it
    /// (call with an empty slice to size the buffer).
    pub fn detokenize(
        &self,
        ids: &[u32],
        remove_special: bool,
        unparse_special: bool,
        out: &mut [u8],
    ) -> usize {
        let mut ids = ids;
        let mut strip = self.add_space_prefix;
        if remove_special && self.add_bos && self.bos.is_some_and(|b| ids.first() == Some(&b)) {
            strip = false;
            ids = &ids[1..];
        }
        if remove_special && self.add_eos && self.eos.is_some_and(|e| ids.last() == Some(&e)) {
            ids = &ids[..ids.len() - 1];
        }
        let mut total = 0;
        for &id in ids {
            let mut piece = self.token_to_piece(id, unparse_special);
            if core::mem::take(&mut strip) {
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
            }
            if let Some(dst) = out.get_mut(total..total + piece.len()) {
                dst.copy_from_slice(piece);
            }
            total += piece.len();
        }
        if total > out.len() || !self.clean_spaces {
            return total;
        }
        clean_spaces(&mut out[..total])
    }

    /// Id of the token whose text is exactly `text`.
    pub fn token_id(&self, text: &[u8]) -> Option<u32> {
        let key_of = |id: u32| self.token_text(id);
        self.lookup.find(text, &[], key_of, |_| true)
    }

    #[inline]
    pub(crate) fn find(&self, a: &[u8], b: &[u8]) -> Option<u32> {
        let key_of = |id: u32| self.token_text(id);
        self.lookup.find(a, b, key_of, |id| self.is_allowed(id))
    }

    /// Restrict encoding to the ids whose bit is set in `mask` (bit `id % 64` of word
    /// `id / 64`), as a pruned LM head needs: a token the head cannot predict must never
    /// be produced, so merges stop before it and the text falls back to smaller pieces
    /// (byte tokens in the end, which the head must keep). `None` lifts the restriction.
    /// A special token outside the mask (a head drops unused placeholders) is encoded as
    /// its text.
    pub fn set_allowed(&mut self, mask: Option<&'a [u64]>) {
        self.allowed = mask;
    }

    /// Whether `id` may be produced under [`Self::set_allowed`].
    #[inline]
    pub fn is_allowed(&self, id: u32) -> bool {
        match self.allowed {
            None => true,
            Some(m) => m
                .get(id as usize / 64)
                .is_some_and(|w| w >> (id % 64) & 1 == 1),
        }
    }

    #[inline]
    pub(crate) fn byte_token(&self, b: u8) -> Option<u32> {
        let t = self.byte_tok[b as usize];
        (t != NONE).then_some(t)
    }

    /// Scratch bytes [`Self::encode`] needs for a text of `text_len` bytes.
    pub fn scratch_bytes(&self, text_len: usize) -> usize {
        let m = text_len;
        let work = match self.kind {
            // escaped text (3 bytes a char) + 4 words a symbol + heap of 3 entries a symbol
            VocabKind::Spm => 3 * (m + 1) + (16 + 48) * spm_symbols(m),
            // escaped text (SentencePiece-style only, 3 bytes a byte) + code points (one a
            // byte at most, escaped or not: a `▁` is one and no lead byte can take its
            // bytes, `\xE2` being no continuation byte) + flags + word (3 bytes a code point
            // at most) + byte-encoded word + symbols (one a word byte) and heap for the
            // longest possible word
            VocabKind::Bpe => 3 * m + 4 * m + m + 3 * m + 6 * m + 16 * 3 * m + 48 * 3 * m,
            VocabKind::Ugm => self.ugm.map_or(0, |u| u.scratch_bytes(m)),
        };
        m + work + 64
    }

    /// Encode UTF-8 text into `out`; returns the number of ids written.
    ///
    /// `add_special` adds BOS/EOS as the vocab asks; `parse_special` turns control-token
    /// text such as `<start_of_turn>` into that token. `scratch` must hold
    /// [`Self::scratch_bytes`]`(text.len())` bytes. If `out` is too short, the error
    /// says how many ids the text needs.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        scratch: &mut [u8],
        out: &mut [u32],
    ) -> Result<usize, TokenizerError> {
        self.encode_bytes(text.as_bytes(), add_special, parse_special, scratch, out)
    }

    /// [`Self::encode`] for bytes that may not be valid UTF-8 (invalid sequences are
    /// handled as llama.cpp does: byte tokens for SentencePiece, U+FFFD for BPE).
    pub fn encode_bytes(
        &self,
        text: &[u8],
        add_special: bool,
        parse_special: bool,
        scratch: &mut [u8],
        out: &mut [u32],
    ) -> Result<usize, TokenizerError> {
        let needed = self.scratch_bytes(text.len());
        if scratch.len() < needed {
            return Err(TokenizerError::ScratchTooSmall {
                needed,
                given: scratch.len(),
            });
        }
        let given = out.len();
        let mut out = Out { buf: out, n: 0 };
        if add_special && self.add_bos {
            out.push(
                self.bos
                    .ok_or(TokenizerError::MissingSpecialToken { which: "BOS" })?,
            );
        }
        let (marks, work) = scratch.split_at_mut(text.len());
        self.partition(text, marks, parse_special);

        let mut prev_special = true;
        let mut i = 0;
        while i < text.len() {
            match marks[i] {
                RAW => {
                    let mut j = i + 1;
                    while j < text.len() && marks[j] == RAW {
                        j += 1;
                    }
                    self.fragment(&text[i..j], prev_special, &mut *work, &mut out)?;
                    prev_special = false;
                    i = j;
                }
                START => {
                    let mut j = i + 1;
                    while j < text.len() && marks[j] == CONT {
                        j += 1;
                    }
                    let key_of = |id: u32| self.token_text(id);
                    let id = self.special.find(&text[i..j], &[], key_of, |id| {
                        self.special_ok(id, parse_special)
                    });
                    // The partition only marks spans it found, so this always succeeds.
                    if let Some(id) = id {
                        out.push(id);
                    }
                    prev_special = true;
                    i = j;
                }
                _ => i += 1,
            }
        }
        if add_special && self.add_eos {
            out.push(
                self.eos
                    .ok_or(TokenizerError::MissingSpecialToken { which: "EOS" })?,
            );
        }
        if out.n > given {
            return Err(TokenizerError::OutputFull {
                needed: out.n,
                given,
            });
        }
        Ok(out.n)
    }

    fn special_ok(&self, id: u32, parse_special: bool) -> bool {
        let a = self.token_attr(id);
        // A special token outside a pruned head is encoded as its text.
        (parse_special || a & (attr::CONTROL | attr::UNKNOWN) == 0) && self.is_allowed(id)
    }

    /// Mark special-token spans in `text`: longest tokens first, each taken at every
    /// leftmost non-overlapping place it occurs in text not yet taken (llama.cpp's
    /// `tokenizer_st_partition`).
    fn partition(&self, text: &[u8], marks: &mut [u8], parse_special: bool) {
        marks.fill(RAW);
        let first = &self.special_first[usize::from(parse_special)];
        if first.iter().all(|&w| w == 0) {
            return;
        }
        let key_of = |id: u32| self.token_text(id);
        let n = text.len();
        for &l in self.special_lens {
            let l = l as usize;
            if l > n {
                continue;
            }
            let mut p = 0;
            while p + l <= n {
                if marks[p] != RAW || marks[p + l - 1] != RAW || !bit_set(first, text[p]) {
                    p += 1;
                    continue;
                }
                let span = &text[p..p + l];
                let found = self
                    .special
                    .find(span, &[], key_of, |id| self.special_ok(id, parse_special));
                let Some(id) = found else {
                    p += 1;
                    continue;
                };
                if marks[p..p + l].iter().any(|&m| m != RAW) {
                    p += 1;
                    continue;
                }
                marks[p] = START;
                marks[p + 1..p + l].fill(CONT);
                let a = self.token_attr(id);
                if a & attr::LSTRIP != 0 {
                    let mut k = p;
                    while k > 0 && marks[k - 1] == RAW && is_c_space(text[k - 1]) {
                        marks[k - 1] = DROPPED;
                        k -= 1;
                    }
                }
                if a & attr::RSTRIP != 0 {
                    let mut k = p + l;
                    while k < n && marks[k] == RAW && is_c_space(text[k]) {
                        marks[k] = DROPPED;
                        k += 1;
                    }
                }
                p += l;
            }
        }
    }

    /// Tokenize one stretch of ordinary text.
    fn fragment(
        &self,
        frag: &[u8],
        prev_special: bool,
        work: &mut [u8],
        out: &mut Out<'_>,
    ) -> Result<(), TokenizerError> {
        let mut rest: &mut [u8] = work;
        match self.kind {
            VocabKind::Spm => {
                let esc = take(&mut rest, 3 * (frag.len() + 1))?;
                let k = escape(frag, self.add_space_prefix && prev_special, esc);
                let sym = take_u32(&mut rest, 4 * spm_symbols(frag.len()))?;
                let heap = take_u32(&mut rest, 12 * spm_symbols(frag.len()))?;
                spm::tokenize(self, &esc[..k], sym, heap, out)
            }
            VocabKind::Bpe => {
                let m = frag.len();
                let frag = if self.escape_spaces {
                    // llama.cpp escapes the raw bytes, then decodes them.
                    let esc = take(&mut rest, 3 * m)?;
                    let k = escape(frag, false, esc);
                    &esc[..k]
                } else {
                    frag
                };
                let mut w = bpe::Work {
                    cps: take_u32(&mut rest, m)?,
                    flags: take(&mut rest, m)?,
                    word: take(&mut rest, 3 * m)?,
                    enc: take(&mut rest, 6 * m)?,
                    sym: take_u32(&mut rest, 12 * m)?,
                    heap: take_u32(&mut rest, 36 * m)?,
                };
                bpe::tokenize(self, frag, &mut w, out)
            }
            VocabKind::Ugm => match &self.ugm {
                Some(u) => ugm::tokenize(self, u, frag, rest, out),
                None => Ok(()),
            },
        }
    }
}

/// Copy `text` into `esc` with every space as `▁` (and one `▁` first if `prefix`);
/// returns the length. `esc` holds 3 bytes a text byte (+ 3 for the prefix).
fn escape(text: &[u8], prefix: bool, esc: &mut [u8]) -> usize {
    let mut k = 0;
    if prefix {
        esc[..3].copy_from_slice("▁".as_bytes());
        k = 3;
    }
    for &b in text {
        if b == b' ' {
            esc[k..k + 3].copy_from_slice("▁".as_bytes());
            k += 3;
        } else {
            esc[k] = b;
            k += 1;
        }
    }
    k
}

/// Write the decoded bytes of one token into `out` (if it is long enough) and return
/// their count; `escape_spaces`: a SentencePiece-style BPE vocab.
fn decode_piece(kind: VocabKind, escape_spaces: bool, a: u8, text: &[u8], out: &mut [u8]) -> usize {
    let mut n = 0;
    let mut put = |b: u8| {
        if let Some(o) = out.get_mut(n) {
            *o = b;
        }
        n += 1;
    };
    let special = attr::CONTROL | attr::UNKNOWN | attr::USER_DEFINED;
    if a & special != 0 {
        text.iter().for_each(|&b| put(b));
    } else if a & attr::NORMAL != 0 {
        if kind != VocabKind::Bpe || escape_spaces {
            // SentencePiece and SentencePiece-style BPE: `▁` is a space.
            let mut i = 0;
            while i < text.len() {
                if text[i..].starts_with("▁".as_bytes()) {
                    put(b' ');
                    i += 3;
                } else {
                    put(text[i]);
                    i += 1;
                }
            }
        } else {
            let mut i = 0;
            while i < text.len() {
                let (cp, used) = unicode::decode(&text[i..]);
                match unicode::cp_to_byte(cp) {
                    Some(b) => put(b),
                    // Not a GPT-2 byte character: keep the original bytes.
                    None => text[i..i + used].iter().for_each(|&b| put(b)),
                }
                i += used;
            }
        }
    } else if a & attr::BYTE != 0 {
        match parse_byte_token(text) {
            Some(b) => put(b),
            None => text.iter().for_each(|&b| put(b)),
        }
    }
    n
}

/// llama.cpp's three `clean_spaces` passes over detokenized text, in place (same
/// in-place reads and writes, so the same result): drop the space before `?!.,`, the
/// spaces around a lone `'`, and the space before `'s`, `'m`, `'re`, `'ve`. Returns the
/// new length.
fn clean_spaces(t: &mut [u8]) -> usize {
    let n1 = t.len();
    let mut total = usize::from(n1 > 0);
    for i in 1..n1 {
        let x = t[i];
        if t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        t[total] = x;
        total += 1;
    }
    let n2 = total;
    total = usize::from(n2 > 0);
    let mut i = 1;
    while i < n2 {
        let x = t[i];
        if x == b'\'' && i + 1 < n2 && t[i - 1] == b' ' && t[i + 1] == b' ' {
            total -= 1;
            i += 1;
            t[i] = 0;
        }
        t[total] = x;
        total += 1;
        i += 1;
    }
    let n3 = total;
    total = usize::from(n3 > 0);
    for i in 1..n3 {
        let x = t[i];
        if t[i - 1] == b' ' && x == b'\'' && i + 1 < n3 {
            let x1 = t[i + 1];
            if matches!(x1, b's' | b'm') {
                total -= 1;
            } else if !matches!(x1, b't' | b'd') && i + 2 < n3 {
                let x2 = t[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        t[total] = x;
        total += 1;
    }
    total
}

/// The byte of a `<0xXX>` token.
fn parse_byte_token(t: &[u8]) -> Option<u8> {
    if t.len() != 6 || !t.starts_with(b"<0x") || t[5] != b'>' {
        return None;
    }
    let h = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    Some(h(t[3])? << 4 | h(t[4])?)
}

/// The most SentencePiece symbols (UTF-8 characters of the escaped text) `m` input
/// bytes make: one a byte, plus one for the space prefix, except that a two-byte lead
/// before a space swallows the first byte of the space's `▁` and leaves its other two
/// bytes as symbols of their own: 3 symbols for those 2 bytes (fuzz/tokenizer
/// crash-44d4d335).
fn spm_symbols(m: usize) -> usize {
    m + m / 2 + 1
}

fn take<'s>(buf: &mut &'s mut [u8], n: usize) -> Result<&'s mut [u8], TokenizerError> {
    if buf.len() < n {
        return Err(TokenizerError::ScratchTooSmall {
            needed: n,
            given: buf.len(),
        });
    }
    let b = core::mem::take(buf);
    let (h, t) = b.split_at_mut(n);
    *buf = t;
    Ok(h)
}

fn take_u32<'s>(buf: &mut &'s mut [u8], n: usize) -> Result<&'s mut [u32], TokenizerError> {
    let pad = (4 - buf.as_ptr() as usize % 4) % 4;
    take(buf, pad)?;
    let b = take(buf, 4 * n)?;
    cast_mut::<u32>(b).ok_or(TokenizerError::ScratchTooSmall {
        needed: 4 * n,
        given: 0,
    })
}
