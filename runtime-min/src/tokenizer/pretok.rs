//! Pre-tokenizers of BPE vocabs: how llama.cpp's `llm_tokenizer_bpe` cuts text into words
//! before merging, for every `tokenizer.ggml.pre` it knows (commit 0c1e570) but one.
//!
//! A pre-tokenizer is a list of passes; each pass splits every piece the previous one
//! produced (llama.cpp's `unicode_regex_split` over a list of regexes). A pass is either
//! one of llama.cpp's hand-written splitters (GPT-2, Llama 3 / Qwen 2 / Qwen 3.5, Kimi K2,
//! the AFMoE digit grouping, newline runs), reproduced here as scanners over code points,
//! or a regex llama.cpp hands to `std::regex`, kept as data for the small matcher in
//! [`super::rx`], whose notes say how it reproduces `std::regex` (including llama.cpp's
//! mapping of non-ASCII code points to one byte per category).
//!
//! SentencePiece-style BPE (`gemma4`, `granite-embed-multi-311m`, `sarvam-moe`; also
//! every vocab whose `tokenizer.ggml.model` is `gemma4`, which llama.cpp gives the
//! `gemma4` pre-tokenizer whatever `tokenizer.ggml.pre` says): no byte encoding. Spaces
//! become `▁` before the text is cut (only at newline runs, `[^\n]+|[\n]+`), words are
//! merged from their UTF-8 characters, a piece that is no token falls back to `<0xXX>`
//! byte tokens, and decoding turns `▁` back into spaces ([`PreInfo::escape_spaces`]).
//!
//! Not supported (named in the error): `whitespace` (an embedding model's tokenizer).
use super::rx::{
    self, bits, span, Alt, Item, Set, Text, AZ, DIGITS, INF, L, LM, N, NL, NOT_NL_L_N, NOT_S,
    NOT_S_L_N, P, PS, P_ASCII, S, SP, S_ASCII, WS, WS_AHEAD, WS_ANY, WS_NL,
};
use super::unicode::{is_han, ANY, LETTER, MARK, NUMBER, PUNCT, SPACE, SYMBOL};

/// Which pre-tokenizer: one variant per distinct list of regexes in llama.cpp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PreTokenizer {
    /// `default`: `[\p{P}\$\+<=>\^~\|]+`, the GPT-2 regex, `\p{N}+`, `[0-9][0-9][0-9]`.
    Default,
    /// `llama3`, `llama-bpe`, `dbrx`, `smaug-bpe`, `chatglm-bpe`, `glm4` ...: contractions
    /// (any case), `[^\r\n\p{L}\p{N}]?\p{L}+`, `\p{N}{1,3}`, ` ?[^\s\p{L}\p{N}]+[\r\n]*`,
    /// `\s*[\r\n]+`, `\s+(?!\S)`, `\s+`.
    Llama3,
    /// `jais-2`: Llama 3 with whitespace runs cut in powers of two.
    Jais2,
    /// `deepseek-llm`: newlines, Latin/Greek/Cyrillic... letters, ASCII and CJK
    /// punctuation, trailing spaces, CJK, numbers.
    DeepseekLlm,
    /// `deepseek-coder`: newlines, letters, punctuation, CJK, single digits.
    DeepseekCoder,
    /// `deepseek-v3`, `hunyuan-dense`, `joyai-llm`, `hy_v4`: 1-3 digits, CJK/kana, then
    /// words, punctuation and symbols, whitespace.
    Deepseek3,
    /// `spark2_5`: as DeepSeek V3 with single newlines and digits.
    Spark25,
    /// `youtu`: Korean/CJK punctuation runs, then case-aware words with contractions.
    Youtu,
    /// `falcon`: punctuation runs (with backtick), the GPT-2 regex, digit triples.
    Falcon,
    /// `starcoder`, `refact`, `command-r`, `smollm`, `codeshell`, `exaone`,
    /// `minerva-7b`, `mellum2`: single digits, then the GPT-2 regex.
    Starcoder,
    /// `gpt-2`, `mpt`, `olmo`, `jais`, `trillion`, `granite-docling`, `phi-2` ...:
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// `qwen2`, `stablelm2`, `hunyuan`, `solar-open`, `grok-2`, `megrez` ...: as Llama 3
    /// but one digit per word.
    Qwen2,
    /// `qwen35`: as Qwen 2 but combining marks (`\p{M}`) count as letters.
    Qwen35,
    /// `bloom`, `poro-chat`, `gpt3-finnish`: ` ?[^(\s|.,!?…。，、।۔،)]+`.
    Bloom,
    /// `viking`: Bloom's regex, then single digits.
    Viking,
    /// `tekken`: case-aware words (an upper-case run then lower case), single digits.
    Tekken,
    /// `chameleon`: sentinel and image tokens, tabs/newlines/double spaces, digits,
    /// punctuation, then the GPT-2 regex.
    Chameleon,
    /// `gpt-4o`, `llama4`, `minimax-m2`, `kanana2`, `talkie`: Tekken's words with
    /// contractions and 1-3 digits.
    Gpt4o,
    /// `granite-embed-multi-97m`: GPT-4o with combining marks inside words.
    GraniteEmbMulti,
    /// `tiny_aya`, `cohere2moe`: digits grouped in threes from the right, then GPT-4o-like
    /// words.
    TinyAya,
    /// `kimi-k2`: Han runs, then GPT-4o-like words that exclude Han.
    KimiK2,
    /// `superbpe`: number runs, cut in threes from the right.
    SuperBpe,
    /// `bailingmoe`, `bailingmoe2`, `llada-moe`: Qwen 2 with single newlines.
    BailingMoe,
    /// `seed-coder`: Qwen 2 without newlines after punctuation.
    SeedCoder,
    /// `ufakzeka`: Qwen 2 without the contractions.
    Ufakzeka,
    /// `afmoe`: digits grouped from the right, CJK and South-East Asian scripts, then
    /// DeepSeek V3's words.
    Afmoe,
    /// `laguna`: newline runs, then Qwen 2.
    Laguna,
    /// `exaone-moe`: words of letters and marks joined by single spaces.
    ExaoneMoe,
    /// `minicpm5`: 1-3 digits, then Llama 3 with whole number runs.
    Minicpm5,
    /// `gemma4`, `granite-embed-multi-311m`: newline runs and the rest, SentencePiece-style
    /// (see the module notes); a run of newlines that is a token is that token.
    Gemma4,
    /// `sarvam-moe`: as Gemma 4, without the newline-run rule.
    SarvamMoe,
}

/// How llama.cpp configures the vocab for a pre-tokenizer name, beyond the regexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreInfo {
    pub pre: PreTokenizer,
    /// A word that is a token as a whole is not merged (`ignore_merges`).
    pub ignore_merges: bool,
    /// Default of `tokenizer.ggml.add_bos_token`.
    pub add_bos: bool,
    /// Detokenizing removes spaces before punctuation (`clean_spaces`).
    pub clean_spaces: bool,
    /// The vocab has no default BOS id (ChatGLM).
    pub no_default_bos: bool,
    /// SentencePiece-style BPE (llama.cpp's `escape_whitespaces` without `byte_encode`):
    /// spaces are `▁`, merges start from UTF-8 characters, unknown pieces become
    /// `<0xXX>` byte tokens.
    pub escape_spaces: bool,
    /// BOS is added even when `tokenizer.ggml.add_bos_token` is false (llama.cpp's
    /// override for Gemma 4, whose files said false while the model needs it).
    pub always_bos: bool,
}

const fn info(pre: PreTokenizer, clean_spaces: bool) -> PreInfo {
    PreInfo {
        pre,
        ignore_merges: false,
        add_bos: false,
        clean_spaces,
        no_default_bos: false,
        escape_spaces: false,
        always_bos: false,
    }
}
const fn merges_off(i: PreInfo) -> PreInfo {
    PreInfo {
        ignore_merges: true,
        ..i
    }
}
const fn bos(i: PreInfo) -> PreInfo {
    PreInfo { add_bos: true, ..i }
}
const fn no_bos(i: PreInfo) -> PreInfo {
    PreInfo {
        no_default_bos: true,
        ..i
    }
}
const fn spm_style(i: PreInfo) -> PreInfo {
    PreInfo {
        escape_spaces: true,
        ..i
    }
}
const fn always_bos(i: PreInfo) -> PreInfo {
    PreInfo {
        always_bos: true,
        ..i
    }
}

use PreTokenizer as T;

/// Every `tokenizer.ggml.pre` llama.cpp 0c1e570 accepts for BPE vocabs but `whitespace`, with
/// the settings it gives them (`llama_vocab::impl::load`).
pub const NAMES: &[(&str, PreInfo)] = &[
    ("default", info(T::Default, true)),
    ("minicpm5", merges_off(info(T::Minicpm5, true))),
    ("llama3", bos(merges_off(info(T::Llama3, true)))),
    ("llama-v3", bos(merges_off(info(T::Llama3, true)))),
    ("llama-bpe", bos(merges_off(info(T::Llama3, true)))),
    ("falcon3", bos(merges_off(info(T::Llama3, true)))),
    ("falcon-h1", bos(merges_off(info(T::Llama3, true)))),
    ("pixtral", bos(merges_off(info(T::Llama3, true)))),
    ("midm-2.0", bos(merges_off(info(T::Llama3, true)))),
    ("lfm2", bos(merges_off(info(T::Llama3, true)))),
    ("jina-v5-nano", bos(merges_off(info(T::Llama3, true)))),
    ("deepseek-llm", info(T::DeepseekLlm, false)),
    ("deepseek-coder", info(T::DeepseekCoder, false)),
    ("deepseek-v3", info(T::Deepseek3, false)),
    ("spark2_5", info(T::Spark25, false)),
    ("youtu", merges_off(info(T::Youtu, false))),
    ("falcon", info(T::Falcon, true)),
    ("mpt", info(T::Gpt2, true)),
    ("starcoder", info(T::Starcoder, true)),
    ("gpt-2", info(T::Gpt2, true)),
    ("phi-2", info(T::Gpt2, true)),
    ("jina-es", info(T::Gpt2, true)),
    ("jina-de", info(T::Gpt2, true)),
    ("gigachat", info(T::Gpt2, true)),
    ("jina-v2-es", info(T::Gpt2, true)),
    ("jina-v2-de", info(T::Gpt2, true)),
    ("a.x-4.0", info(T::Gpt2, true)),
    ("mellum", info(T::Gpt2, true)),
    ("modern-bert", info(T::Gpt2, true)),
    ("jais-2", info(T::Jais2, true)),
    ("jina-v1-en", info(T::Gpt2, true)),
    ("jina-v2-code", info(T::Gpt2, true)),
    ("roberta-bpe", info(T::Gpt2, true)),
    ("refact", info(T::Starcoder, true)),
    ("command-r", info(T::Starcoder, false)),
    ("qwen2", info(T::Qwen2, false)),
    ("deepseek-r1-qwen", info(T::Qwen2, false)),
    ("kormo", info(T::Qwen2, false)),
    ("f2llmv2", info(T::Qwen2, false)),
    ("qwen35", info(T::Qwen35, false)),
    ("stablelm2", info(T::Qwen2, true)),
    ("olmo", info(T::Gpt2, true)),
    ("dbrx", info(T::Llama3, true)),
    ("smaug-bpe", info(T::Llama3, true)),
    ("poro-chat", info(T::Bloom, false)),
    ("chatglm-bpe", no_bos(info(T::Llama3, true))),
    ("glm4", no_bos(merges_off(info(T::Llama3, true)))),
    ("glm5", no_bos(merges_off(info(T::Llama3, true)))),
    ("viking", info(T::Viking, false)),
    ("jais", info(T::Gpt2, true)),
    ("tekken", bos(merges_off(info(T::Tekken, false)))),
    ("smollm", info(T::Starcoder, false)),
    ("codeshell", info(T::Starcoder, true)),
    ("bloom", info(T::Bloom, true)),
    ("gpt3-finnish", info(T::Bloom, true)),
    ("exaone", info(T::Starcoder, true)),
    ("exaone4", info(T::Gpt2, true)),
    ("exaone-moe", info(T::ExaoneMoe, true)),
    ("chameleon", bos(info(T::Chameleon, false))),
    ("minerva-7b", info(T::Starcoder, true)),
    ("megrez", info(T::Qwen2, true)),
    ("gpt-4o", info(T::Gpt4o, false)),
    ("llama4", info(T::Gpt4o, false)),
    ("kanana2", info(T::Gpt4o, false)),
    ("talkie", info(T::Gpt4o, false)),
    (
        "granite-embed-multi-97m",
        merges_off(info(T::GraniteEmbMulti, false)),
    ),
    ("tiny_aya", info(T::TinyAya, false)),
    ("cohere2moe", info(T::TinyAya, false)),
    ("superbpe", info(T::SuperBpe, false)),
    ("trillion", info(T::Gpt2, false)),
    ("granite-docling", info(T::Gpt2, false)),
    ("bailingmoe", info(T::BailingMoe, false)),
    ("bailingmoe2", info(T::BailingMoe, false)),
    ("llada-moe", info(T::BailingMoe, false)),
    ("seed-coder", info(T::SeedCoder, false)),
    ("hunyuan", info(T::Qwen2, false)),
    ("hunyuan-dense", info(T::Deepseek3, false)),
    ("hy_v4", info(T::Deepseek3, false)),
    ("joyai-llm", info(T::Deepseek3, false)),
    ("kimi-k2", info(T::KimiK2, false)),
    ("ufakzeka", info(T::Ufakzeka, false)),
    ("grok-2", info(T::Qwen2, false)),
    ("afmoe", info(T::Afmoe, false)),
    ("laguna", info(T::Laguna, false)),
    ("minimax-m2", info(T::Gpt4o, false)),
    ("solar-open", info(T::Qwen2, false)),
    ("mellum2", info(T::Starcoder, true)),
    ("gemma4", always_bos(spm_style(info(T::Gemma4, true)))),
    (
        "granite-embed-multi-311m",
        always_bos(spm_style(info(T::Gemma4, true))),
    ),
    ("sarvam-moe", spm_style(info(T::SarvamMoe, false))),
];

impl PreTokenizer {
    /// The settings llama.cpp gives `tokenizer.ggml.pre = name`, if supported.
    pub fn from_name(name: &str) -> Option<PreInfo> {
        NAMES.iter().find(|(n, _)| *n == name).map(|&(_, i)| i)
    }

    fn passes(self) -> &'static [Pass] {
        use Pass::*;
        match self {
            T::Default => &[Rx(PUNCT_RUN), Gpt2, Rx(NUMBER_RUN), Rx(DIGITS3)],
            T::Llama3 => &[Llama3(3, LETTER)],
            T::Jais2 => &[Rx(JAIS2)],
            T::DeepseekLlm => &[
                Rx(ONE_NEWLINE),
                Rx(DSLLM_LETTERS),
                Rx(DSLLM_PUNCT),
                TrailingSpace,
                Rx(CJK_A),
                Rx(NUMBER_RUN),
            ],
            T::DeepseekCoder => &[
                Rx(ONE_NEWLINE),
                Rx(SPACE_LETTERS),
                Rx(SPACE_PUNCT),
                Rx(CJK_A),
                Rx(ONE_NUMBER),
            ],
            T::Deepseek3 => &[Rx(NUMBER_1_3), Rx(CJK_KANA), Rx(DS3_WORDS)],
            T::Spark25 => &[
                Rx(NUMBER_1_3),
                Rx(CJK_KANA),
                Rx(SPARK_WORDS),
                Rx(ONE_NUMBER),
            ],
            T::Youtu => &[Rx(YOUTU_CJK), Rx(YOUTU_WORDS)],
            T::Falcon => &[Rx(PUNCT_RUN_BT), Gpt2, Rx(DIGITS3)],
            T::Starcoder => &[Rx(ONE_NUMBER), Gpt2],
            T::Gpt2 => &[Gpt2],
            T::Qwen2 => &[Llama3(1, LETTER)],
            T::Qwen35 => &[Llama3(1, LETTER | MARK)],
            T::Bloom => &[Rx(BLOOM)],
            T::Viking => &[Rx(BLOOM), Rx(ONE_NUMBER)],
            T::Tekken => &[Rx(TEKKEN)],
            T::Chameleon => &[
                Rx(CHAM_SENTINEL),
                Rx(CHAM_IMAGE),
                Rx(CHAM_SPACES),
                Rx(ONE_NUMBER),
                Rx(CHAM_PUNCT),
                Gpt2,
            ],
            T::Gpt4o => &[Rx(GPT4O)],
            T::GraniteEmbMulti => &[Rx(GRANITE)],
            T::TinyAya => &[DigitGroups, Rx(TINY_AYA)],
            T::KimiK2 => &[Kimi],
            T::SuperBpe => &[Rx(NUMBER_RUN), Rx(DIGIT_TRIPLES)],
            T::BailingMoe => &[Rx(BAILING)],
            T::SeedCoder => &[Rx(SEED_CODER)],
            T::Ufakzeka => &[Rx(UFAKZEKA)],
            T::Afmoe => &[DigitGroups, Rx(AFMOE_CJK), Rx(DS3_WORDS)],
            T::Laguna => &[Newlines, Llama3(1, LETTER)],
            T::ExaoneMoe => &[Rx(EXAONE_MOE)],
            T::Minicpm5 => &[Rx(NUMBER_1_3), Rx(MINICPM5)],
            T::Gemma4 | T::SarvamMoe => &[Newlines],
        }
    }
}

/// One splitting pass.
#[derive(Clone, Copy)]
enum Pass {
    /// llama.cpp's `unicode_regex_split_custom_gpt2`.
    Gpt2,
    /// `..._custom_llama3` / `_qwen2` / `_qwen35`: digits per number word, letter class.
    Llama3(usize, u8),
    /// `..._custom_kimi_k2`.
    Kimi,
    /// `..._custom_afmoe`: each number run cut into a 1-2 digit head and triples; the text
    /// before a run goes with its first group.
    DigitGroups,
    /// `..._custom_newlines`: `[^\n]+|[\n]+`.
    Newlines,
    /// `\s+$` (as a scan: a regex search would be quadratic in a run of spaces).
    TrailingSpace,
    /// A regex run by `std::regex` in llama.cpp.
    Rx(&'static [Alt]),
}

// ---- Regexes llama.cpp runs through std::regex ------------------------------------------

use Item::{Contraction, Rep};

const CONTR: Item = Contraction {
    any_case: true,
    opt: false,
};
const CONTR_OPT: Item = Contraction {
    any_case: true,
    opt: true,
};
/// `[^\r\n\p{L}\p{N}]?`
const PFX: Item = Rep(NOT_NL_L_N, 0, 1);
/// ` ?`
const SP_OPT: Item = Rep(SP, 0, 1);
/// `\s?`
const S_OPT: Item = Rep(S, 0, 1);
const NL_SLASH: Set = Set::ascii(bits(b"\r\n/"));

/// `[\p{P}\$\+<=>\^~\|]+`
const PUNCT_RUN: &[Alt] = &[&[Rep(Set::cat(P_ASCII | bits(b"$+<=>^~|"), PUNCT), 1, INF)]];
/// Falcon's, with a backtick.
const PUNCT_RUN_BT: &[Alt] = &[&[Rep(Set::cat(P_ASCII | bits(b"$+<=>^~|`"), PUNCT), 1, INF)]];
/// `\p{N}+`, `\p{N}`, `\p{N}{1,3}`
const NUMBER_RUN: &[Alt] = &[&[Rep(N, 1, INF)]];
const ONE_NUMBER: &[Alt] = &[&[Rep(N, 1, 1)]];
const NUMBER_1_3: &[Alt] = &[&[Rep(N, 1, 3)]];
/// `[0-9][0-9][0-9]`
const DIGITS3: &[Alt] = &[&[Rep(Set::ascii(DIGITS), 3, 3)]];
/// `[\r\n]`
const ONE_NEWLINE: &[Alt] = &[&[Rep(NL, 1, 1)]];
/// `(?=(\d{3})+(?!\d))`
const DIGIT_TRIPLES: &[Alt] = &[&[Item::DigitTriplesAhead]];

/// `\s?[A-Za-zµÀ-ÖØ-öø-ƺ...]+` (DeepSeek LLM's letters, as listed in llama.cpp)
const DSLLM_LETTERS: &[Alt] = &[&[S_OPT, Rep(Set::ranges(AZ, DSLLM_LETTER_RANGES), 1, INF)]];
const DSLLM_LETTER_RANGES: &[(u32, u32)] = &[
    (0xB5, 0xB5),
    (0xC0, 0xD6),
    (0xD8, 0xF6),
    (0xF8, 0x1BA),
    (0x1BC, 0x1BF),
    (0x1C4, 0x293),
    (0x295, 0x2AF),
    (0x370, 0x373),
    (0x376, 0x377),
    (0x37B, 0x37D),
    (0x37F, 0x37F),
    (0x386, 0x386),
    (0x388, 0x38A),
    (0x38C, 0x38C),
    (0x38E, 0x3A1),
    (0x3A3, 0x3F5),
    (0x3F7, 0x481),
    (0x48A, 0x52F),
    (0x531, 0x556),
    (0x10A0, 0x10C5),
    (0x13A0, 0x13F5),
    (0x13F8, 0x13FD),
    (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B),
    (0x1D6B, 0x1D77),
    (0x1D79, 0x1D9A),
    (0x1E00, 0x1F15),
    (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45),
    (0x1F48, 0x1F4D),
    (0x1F50, 0x1F57),
    (0x1F59, 0x1F59),
    (0x1F5B, 0x1F5B),
    (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D),
    (0x1F80, 0x1FB4),
    (0x1FB6, 0x1FBC),
    (0x1FBE, 0x1FBE),
    (0x1FC2, 0x1FC4),
    (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3),
    (0x1FD6, 0x1FDB),
    (0x1FE0, 0x1FEC),
    (0x1FF2, 0x1FF4),
    (0x1FF6, 0x1FFC),
    (0x2102, 0x2102),
    (0x2107, 0x2107),
    (0x210A, 0x2113),
    (0x2115, 0x2115),
    (0x2119, 0x211D),
    (0x2124, 0x2124),
    (0x2126, 0x2126),
    (0x2128, 0x2128),
    (0x212A, 0x212D),
    (0x212F, 0x2134),
    (0x2139, 0x2139),
    (0x213C, 0x213F),
    (0x2145, 0x2149),
    (0x214E, 0x214E),
    (0x2183, 0x2184),
    (0x2C00, 0x2C7B),
    (0x2C7E, 0x2CE4),
    (0x2CEB, 0x2CEE),
    (0x2CF2, 0x2CF3),
    (0xA640, 0xA66D),
    (0xA680, 0xA69B),
    (0xA722, 0xA76F),
    (0xA771, 0xA787),
    (0xA78B, 0xA78E),
    (0xAB70, 0xABBF),
    (0xFB00, 0xFB06),
    (0xFB13, 0xFB17),
    (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A),
    (0x10400, 0x1044F),
    (0x104B0, 0x104D3),
    (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2),
    (0x10CC0, 0x10CF2),
    (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
];
/// `\s?[!-/:-~！-／：-～‘-‟　-。]+`
const DSLLM_PUNCT: &[Alt] = &[&[
    S_OPT,
    Rep(
        Set::ranges(
            span(b'!', b'/') | span(b':', b'~'),
            &[
                (0x2018, 0x201F),
                (0x3000, 0x3002),
                (0xFF01, 0xFF0F),
                (0xFF1A, 0xFF5E),
            ],
        ),
        1,
        INF,
    ),
]];
/// `[一-龥ࠀ-一가-퟿]+`
const CJK_A: &[Alt] = &[&[Rep(
    Set::ranges(0, &[(0x800, 0x4E00), (0x4E00, 0x9FA5), (0xAC00, 0xD7FF)]),
    1,
    INF,
)]];
/// `[一-龥぀-ゟ゠-ヿ]+`
const CJK_KANA_SET: Set = Set::ranges(0, &[(0x3040, 0x309F), (0x30A0, 0x30FF), (0x4E00, 0x9FA5)]);
const CJK_KANA: &[Alt] = &[&[Rep(CJK_KANA_SET, 1, INF)]];
/// `\s?\p{L}+`, `\s?\p{P}+`
const SPACE_LETTERS: &[Alt] = &[&[S_OPT, Rep(L, 1, INF)]];
const SPACE_PUNCT: &[Alt] = &[&[S_OPT, Rep(P, 1, INF)]];

/// `[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+`
const ASCII_PUNCT_WORD: Alt = &[
    Rep(Set::ascii(P_ASCII | S_ASCII), 1, 1),
    Rep(Set::ascii(AZ), 1, INF),
];
/// `[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+`
const DS3_WORD: Alt = &[
    Rep(
        Set::cat(
            bits(b"\r\n") | AZ | P_ASCII | S_ASCII,
            LETTER | PUNCT | SYMBOL,
        )
        .not(),
        0,
        1,
    ),
    Rep(LM, 1, INF),
];
/// DeepSeek V3 (and AFMoE's last pass).
const DS3_WORDS: &[Alt] = &[
    ASCII_PUNCT_WORD,
    DS3_WORD,
    &[SP_OPT, Rep(PS, 1, INF), Rep(NL, 0, INF)],
    WS_NL,
    WS_AHEAD,
    WS_ANY,
];
const SPARK_WORDS: &[Alt] = &[
    ASCII_PUNCT_WORD,
    DS3_WORD,
    &[SP_OPT, Rep(PS, 1, INF)],
    &[Rep(NL, 1, 1)],
    WS_AHEAD,
    WS_ANY,
];

/// Youtu's first pass: Hangul, CJK punctuation, Bopomofo, CJK/kana runs.
const YOUTU_CJK: &[Alt] = &[
    &[Rep(
        Set::ranges(0, &[(0x3131, 0x318E), (0xAC00, 0xD7A3)]),
        1,
        INF,
    )],
    &[Rep(
        Set::ranges(
            0,
            &[
                (0x2014, 0x2014),
                (0x2018, 0x2019),
                (0x201C, 0x201D),
                (0x2026, 0x2026),
                (0x3001, 0x303F),
                (0xFE30, 0xFE4F),
                (0xFF01, 0xFF01),
                (0xFF0C, 0xFF0C),
                (0xFF1A, 0xFF1B),
            ],
        ),
        1,
        INF,
    )],
    &[Rep(Set::ranges(0, &[(0x3105, 0x312F)]), 1, INF)],
    &[Rep(CJK_KANA_SET, 1, INF)],
];
/// ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
const PUNCT_SLASH: Alt = &[SP_OPT, Rep(NOT_S_L_N, 1, INF), Rep(NL_SLASH, 0, INF)];
/// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
const PUNCT_NL: Alt = &[SP_OPT, Rep(NOT_S_L_N, 1, INF), Rep(NL, 0, INF)];
/// The case-aware word regexes (Tekken, GPT-4o and kin):
/// `P?U*W+C?|P?U+W*C?|\p{N}{1,d}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
/// with `P` = `[^\r\n\p{L}\p{N}]`, an upper-case class `U`, a lower-case class `W`, the
/// digit count `d` and an optional contraction `C`.
macro_rules! cased_words {
    ($upper:expr, $lower:expr, $digits:expr $(, $contr:expr)?) => {
        &[
            &[PFX, Rep($upper, 0, INF), Rep($lower, 1, INF) $(, $contr)?],
            &[PFX, Rep($upper, 1, INF), Rep($lower, 0, INF) $(, $contr)?],
            &[Rep(N, 1, $digits)],
            PUNCT_SLASH,
            WS_NL,
            WS_AHEAD,
            WS_ANY,
        ]
    };
}

/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]` and `[\p{Ll}\p{Lm}\p{Lo}\p{M}]` are both `[\p{L}\p{M}]`
/// once collapsed (llama.cpp maps every letter category to one byte).
const YOUTU_WORDS: &[Alt] = cased_words!(LM, LM, 1, CONTR_OPT);
const TINY_AYA: &[Alt] = cased_words!(LM, LM, 3, CONTR_OPT);

/// `(?=[\p{L}])([^a-z])` and `(?=[\p{L}])([^A-Z])`: a letter that is not ASCII lower
/// (upper) case; non-ASCII letters are both.
const UPPER: Set = Set::cat(span(b'A', b'Z'), LETTER);
const LOWER: Set = Set::cat(span(b'a', b'z'), LETTER);
const TEKKEN: &[Alt] = cased_words!(UPPER, LOWER, 1);
const GPT4O: &[Alt] = cased_words!(UPPER, LOWER, 3, CONTR_OPT);
const UPPER_M: Set = Set::cat(span(b'A', b'Z'), LETTER | MARK);
const LOWER_M: Set = Set::cat(span(b'a', b'z'), LETTER | MARK);
const GRANITE: &[Alt] = cased_words!(UPPER_M, LOWER_M, 3, CONTR_OPT);

/// ` ?[^(\s|.,!?…。，、।۔،)]+`
const BLOOM: &[Alt] = &[&[
    SP_OPT,
    Rep(
        Set::ranges(
            WS | bits(b"(|.,!?)"),
            &[
                (0x60C, 0x60C),
                (0x6D4, 0x6D4),
                (0x964, 0x964),
                (0x2026, 0x2026),
                (0x3001, 0x3002),
                (0xFF0C, 0xFF0C),
            ],
        )
        .not(),
        1,
        INF,
    ),
]];

/// `<sentinel:[0-9]+>`, `(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z`, `([\t\n]|    |  )`,
/// `[\p{P}!-/:-@\[-`{-~]`
const CHAM_SENTINEL: &[Alt] = &[&[
    Item::Lit(b"<sentinel:"),
    Rep(Set::ascii(DIGITS), 1, INF),
    Item::Lit(b">"),
]];
const CHAM_IMAGE: &[Alt] = &[&[
    Item::Lit(b"IMGIMG"),
    Rep(Set::ascii(span(b'A', b'I')), 1, 4),
    Item::Lit(b"Z"),
]];
const CHAM_SPACES: &[Alt] = &[
    &[Rep(Set::ascii(bits(b"\t\n")), 1, 1)],
    &[Item::Lit(b"    ")],
    &[Item::Lit(b"  ")],
];
const CHAM_PUNCT: &[Alt] = &[&[Rep(
    Set::cat(
        P_ASCII | span(b'!', b'/') | span(b':', b'@') | span(b'[', b'`') | span(b'{', b'~'),
        PUNCT,
    ),
    1,
    1,
)]];

/// `[^\r\n\p{L}\p{N}]?\p{L}+`
const LETTER_WORD: Alt = &[PFX, Rep(L, 1, INF)];

const BAILING: &[Alt] = &[
    &[CONTR],
    LETTER_WORD,
    &[Rep(N, 1, 1)],
    PUNCT_NL,
    &[Rep(S, 0, INF), Rep(NL, 1, 1)],
    WS_AHEAD,
    WS_ANY,
];
const SEED_CODER: &[Alt] = &[
    &[CONTR],
    LETTER_WORD,
    &[Rep(N, 1, 1)],
    &[SP_OPT, Rep(NOT_S_L_N, 1, INF)],
    WS_NL,
    WS_AHEAD,
    WS_ANY,
];
const UFAKZEKA: &[Alt] = &[
    LETTER_WORD,
    &[Rep(N, 1, 1)],
    PUNCT_NL,
    WS_NL,
    WS_AHEAD,
    WS_ANY,
];
const MINICPM5: &[Alt] = &[
    &[CONTR],
    LETTER_WORD,
    &[Rep(N, 1, INF)],
    PUNCT_NL,
    WS_NL,
    WS_AHEAD,
    WS_ANY,
];
/// Llama 3 with `\s{512}(?!\S)|\s{256}(?!\S)|...|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}`.
const JAIS2: &[Alt] = &[
    &[CONTR],
    LETTER_WORD,
    &[Rep(N, 1, 3)],
    PUNCT_NL,
    WS_NL,
    &[Rep(S, 512, 512), Item::NotAhead(NOT_S)],
    &[Rep(S, 256, 256), Item::NotAhead(NOT_S)],
    &[Rep(S, 128, 128), Item::NotAhead(NOT_S)],
    &[Rep(S, 64, 64), Item::NotAhead(NOT_S)],
    &[Rep(S, 32, 32), Item::NotAhead(NOT_S)],
    &[Rep(S, 16, 16), Item::NotAhead(NOT_S)],
    &[Rep(S, 8, 8), Item::NotAhead(NOT_S)],
    &[Rep(S, 4, 4), Item::NotAhead(NOT_S)],
    &[Rep(S, 1, 2), Item::NotAhead(NOT_S)],
    &[Rep(S, 1, 1)],
];
const EXAONE_MOE: &[Alt] = &[
    &[CONTR],
    &[PFX, Item::LetterWords],
    &[Rep(N, 1, 1)],
    &[SP_OPT, Rep(NOT_S_L_N, 1, INF), Rep(NL_SLASH, 0, 1)],
    &[Rep(S, 0, INF), Rep(NL, 1, 1)],
    WS_AHEAD,
    WS_ANY,
];
/// AFMoE's second pass: CJK, kana, Thai, Lao, Khmer, Myanmar, Hangul ... runs.
const AFMOE_CJK: &[Alt] = &[&[Rep(
    Set::ranges(
        0,
        &[
            (0xE40, 0xE7F),
            (0xE80, 0xEFF),
            (0x1000, 0x109F),
            (0x1100, 0x11FF),
            (0x1780, 0x17FF),
            (0x2F00, 0x2FDF),
            (0x3040, 0x309F),
            (0x30A0, 0x30FF),
            (0x3400, 0x4DBF),
            (0x4E00, 0x9FFF),
            (0x8C48, 0xFAFF),
            (0xA9E0, 0xA9FF),
            (0xAA60, 0xAA7F),
            (0xAC00, 0xD7AF),
            (0xFF65, 0xFF9F),
        ],
    ),
    1,
    INF,
)]];

// ---- llama.cpp's hand-written splitters ------------------------------------------------

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
    if let Some(n) = rx::contraction(p.c, pos, false) {
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
    if let Some(n) = rx::contraction(p.c, pos, true) {
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
    punct_or_spaces(p, pos, letter)
}

/// The alternatives after the numbers in Llama 3 and Kimi K2:
/// ` ?[^\s\p{L}\p{N}]+[\r\n]*`, `\s*[\r\n]+`, `\s+(?!\S)`, `\s+`.
fn punct_or_spaces(p: &Piece, pos: usize, letter: u8) -> usize {
    let cpt = p.cp(pos);
    let f = p.fl(pos);
    let is_nl = |c: u32| c == '\r' as u32 || c == '\n' as u32;
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

/// Kimi K2 (`unicode_regex_split_custom_kimi_k2`): `[\p{Han}]+`, then words of non-Han
/// letters with an optional leading character and contraction, `\p{N}{1,3}`, and Llama 3's
/// punctuation and whitespace alternatives.
fn kimi_next(p: &Piece, pos: usize) -> usize {
    let cpt = p.cp(pos);
    let f = p.fl(pos);
    if is_han(cpt) {
        let mut q = pos + 1;
        while is_han(p.cp(q)) {
            q += 1;
        }
        return q;
    }
    let letter = |i: usize| p.fl(i) & LETTER != 0 && !is_han(p.cp(i));
    let lead = !(cpt == '\r' as u32 || cpt == '\n' as u32 || f & (LETTER | NUMBER) != 0);
    if letter(pos) || (lead && letter(pos + 1)) {
        let mut q = pos + usize::from(lead);
        while letter(q) {
            q += 1;
        }
        return q + rx::contraction(p.c, q, true).unwrap_or(0);
    }
    if f & NUMBER != 0 {
        let mut q = pos + 1;
        while q - pos < 3 && p.fl(q) & NUMBER != 0 {
            q += 1;
        }
        return q;
    }
    punct_or_spaces(p, pos, LETTER)
}

/// Run a scanner that reports one word end per call.
fn scan<E>(
    p: &Piece,
    base: usize,
    step: impl Fn(&Piece, usize) -> usize,
    emit: &mut dyn FnMut(usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    let mut pos = 0;
    while pos < p.len() {
        let end = step(p, pos).clamp(pos + 1, p.len());
        emit(base + pos, base + end)?;
        pos = end;
    }
    Ok(())
}

/// AFMoE's digit grouping (see [`Pass::DigitGroups`]).
fn digit_groups<E>(
    p: &Piece,
    base: usize,
    emit: &mut dyn FnMut(usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    let (mut prev, mut pos) = (0, 0);
    while pos < p.len() {
        if p.fl(pos) & NUMBER == 0 {
            pos += 1;
            continue;
        }
        let start = pos;
        while p.fl(pos) & NUMBER != 0 {
            pos += 1;
        }
        let mut cut = start + (pos - start) % 3;
        if cut == start {
            cut += 3;
        }
        while cut <= pos {
            emit(base + prev, base + cut)?;
            prev = cut;
            cut += 3;
        }
    }
    if prev < p.len() {
        emit(base + prev, base + p.len())?;
    }
    Ok(())
}

/// Runs of `\n` and runs of everything else.
fn newlines<E>(
    p: &Piece,
    base: usize,
    emit: &mut dyn FnMut(usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    let nl = |i: usize| p.cp(i) == '\n' as u32;
    scan(
        p,
        base,
        |p, pos| {
            let mut q = pos + 1;
            while q < p.len() && nl(q) == nl(pos) {
                q += 1;
            }
            q
        },
        emit,
    )
}

/// `\s+$`: the trailing whitespace run is a piece of its own.
fn trailing_space<E>(
    p: &Piece,
    base: usize,
    emit: &mut dyn FnMut(usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    let mut start = p.len();
    while start > 0 && S.has(p.cp(start - 1), p.fl(start - 1)) {
        start -= 1;
    }
    for (a, b) in [(0, start), (start, p.len())] {
        if a < b {
            emit(base + a, base + b)?;
        }
    }
    Ok(())
}

fn run_pass<E>(
    pass: Pass,
    p: &Piece,
    base: usize,
    emit: &mut dyn FnMut(usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    match pass {
        Pass::Gpt2 => scan(p, base, gpt2_next, emit),
        Pass::Llama3(digits, letter) => {
            scan(p, base, |p, pos| llama3_next(p, pos, digits, letter), emit)
        }
        Pass::Kimi => scan(p, base, kimi_next, emit),
        Pass::DigitGroups => digit_groups(p, base, emit),
        Pass::Newlines => newlines(p, base, emit),
        Pass::TrailingSpace => trailing_space(p, base, emit),
        Pass::Rx(alts) => rx::split(alts, &Text { c: p.c, f: p.f }, base, emit),
    }
}

/// Apply `passes` to `cps[s..e]`, each splitting the pieces of the one before.
fn apply<E>(
    passes: &[Pass],
    cps: &[u32],
    fl: &[u8],
    s: usize,
    e: usize,
    emit: &mut dyn FnMut(usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    let Some((&first, rest)) = passes.split_first() else {
        return emit(s, e);
    };
    let piece = Piece {
        c: &cps[s..e],
        f: &fl[s..e],
    };
    run_pass(first, &piece, s, &mut |a, b| {
        apply(rest, cps, fl, a, b, emit)
    })
}

/// Report the words of `cps` (with flags `fl`, same length) as `emit(start, end)`, in order.
/// Words are never empty.
pub(crate) fn split<E>(
    pre: PreTokenizer,
    cps: &[u32],
    fl: &[u8],
    emit: &mut impl FnMut(usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    apply(pre.passes(), cps, fl, 0, cps.len(), emit)
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
        b'$' | b'+' | b'<'..=b'>' | b'^' | b'`' | b'|' | b'~' => SYMBOL,
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
