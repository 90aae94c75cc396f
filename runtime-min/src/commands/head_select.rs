//! `pinch head-select` and the `--head` / `--head-rows` load-time options: count token
//! use over a corpus, choose a pruned LM head (`crate::head`) for the loader
//! (`Loader::load_with_head`), and restrict the tokenizer to it.
//!
//! The corpus is a comma-separated list of text files or directories; a directory must
//! hold `files.txt` naming its files, one per line (the platform cannot list
//! directories). Files are tokenized in pieces that end at a line break, so scratch
//! stays small; a piece boundary may split a token the whole text would have merged,
//! which changes counts by a hair and the choice not at all.
//!
//! Ranking. A corpus of a few hundred kilobytes cannot rank 65,000 tokens by counting
//! alone: most rows then go by vocabulary order, and Gemma's vocabulary order says little
//! about English. What each signal was measured to do (share of the full tokenization
//! of held-out English outside a 65,536-row Gemma 3 head, wiki / literary excerpt of
//! `tests/data/eval`, neither in any corpus):
//! - corpus counts, ties by id (before): 7.36 / 7.19 %;
//! - SentencePiece scores as the tie-break: Gemma's scores are minus the id (merge
//!   order), so nothing changes; kept as the tie-break for vocabularies whose scores
//!   are log-probabilities ([`head::select`]);
//! - Gemma's 6,242 `<unusedN>` placeholders out of the forced set
//!   ([`head::is_unused`]) and tokens of the corpus's characters first among equal
//!   counts: 4.63 / 5.45 % (bits per byte on 9 KB of these texts, `pinch ppl -c 512`:
//!   +16.3 % -> +10.9 %); plus single characters of the corpus's 128-code-point blocks
//!   ranked as covered ([`head::char_prior`], the rule now): 5.63 / 6.36 % with the
//!   whole corpus, 3.73 / 4.11 % with `--head-lang en,code`, and held-out Chinese with
//!   `--head-lang zh` 32.1 -> 6.5 %, Japanese 17.1 -> 8.4 % (later parts of the same
//!   books, /work/shared/corpus);
//! - the model's own predictions over the corpus (`--soft`, below) with
//!   `--head-lang en`: 3.12 / 0.48 % (llama.cpp's probabilities over the 20 KB English
//!   file, same ranking rule);
//! - embedding-row norms and the logit against the mean embedding: no signal (Gemma's
//!   rows all have norm 1.031; both rank worse than vocabulary order);
//! - the model's own text (`--generate N`, below), Gemma 3 270M, 65,536 rows, English
//!   corpus file of the shared corpus (Candide, 343 KB), bits per byte on the whole
//!   held-out wiki + literary excerpts (73 KB; full head 1.329512): corpus alone
//!   +5.80 %; 50,000 tokens from BOS alone +6.01 %; 50,000 tokens each begun with 16
//!   tokens of a corpus line +4.54 %; both (100,000) +4.31 %, with `--soft` too +3.87 %
//!   (`--generate-weight` 4, `-n 256 --temp 1 --top-k 0 --top-p 1 --min-p 0.05`; on
//!   the 9 KB held-out text weights 1 / 4 / 20 / 100 gave +6.7 / +5.3 / +6.3 / +5.7 %
//!   from BOS). At 32,768 rows it gains nothing (+13.73 -> +13.56 %), see the README
//!   for the rest. The misses left are rare words (`dearth`, `fortnight`, names) whose
//!   expected counts rank 60,000-130,000th after 100,000 positions.
//! - the predictions counted flatter: at temperature 1.5 ([`SOFT_TEMPERATURE`]), in
//!   `--soft` windows of 32 tokens ([`SOFT_WINDOW`]), and a capitalized word given 3 %
//!   of its lowercase twin's count ([`head_rank::TITLE_CASE_SHARE`]): `--soft` alone
//!   +3.15 % on the same 73 KB (886 s at `-t 1`; 2,048-token windows +4.64 %, 128
//!   +3.42 %), better than all of the above together; the 100,000 generated tokens
//!   (counted at temperature 1) on top of `--soft` with 2,048-token windows +3.87 %,
//!   no gain. Tuned with llama.cpp's predictions over 24,576 positions of the corpus
//!   loaded as `--load-soft`: temperature 1 / 1.5 / 2 / 3 +4.96 / +3.27 / +3.72 / +4.99 %
//!   (weighed as the corpus's tokens; 2 / 8 / 16 times +3.33 / +3.71 / +3.70 %); counting
//!   predictions below 1/256 of a position (not 1/16) +3.80 %, only above 1/4 +4.56 %.
//!
//! `head-select --generate N` lets the model write `N` tokens (documents of `-n`
//! tokens; each starts with BOS and 16 tokens of a line of a corpus file of nonzero
//! weight, so `--head-lang` steers its language, or of `--generate-from FILE`, topic
//! lines; sampled with the sampling flags) and adds its predicted probabilities at
//! every step, scaled to weigh `--generate-weight` times the corpus's tokens (default
//! 4, 1 with `--soft`: [`GENERATE_WEIGHT_WITH_SOFT`]; with `--soft`, 50,000 tokens
//! begun with `tests/data/topics/en.txt` took 65,536 rows from +3.15 to +2.30 % on the
//! held-out English and from +4.52 to +2.74 % on a second held-out text not read
//! before). It costs a full-head forward pass and softmax per token (Gemma 3 270M: 55
//! tokens/s on one Zen 5 core; 100,000 tokens, 30 core-minutes).
//!
//! `head-select --soft` runs the model over the corpus and adds, for every position,
//! the model's predicted probability of every token (expected counts): a text about
//! poetry then also ranks `▁poems` and `▁poetic` though they never occur in it. It
//! costs a full-head forward pass per corpus token.
//!
//! `--save-soft F` keeps what `--soft` or `--generate` computed, and `--load-soft
//! F[,F..]` ranks from such files again (another `--rows`) without the model's time:
//! `--soft`'s only for the corpus and `--head-lang` they were computed over (checked
//! by its token count), the own-text files adding up.
//!
//! Languages. `--head-lang en=3,code=1` (or `en,code`) weighs each corpus file by the
//! language its file name names (`en.txt`: `en`); files of other languages weigh 0.
use core::fmt::Write;

use super::out::Out;
use super::{open_model, read_header, AppError, Ctx};
use crate::arena::Arena;
use crate::cli::Opts;
use crate::head::{self, CharSet, HeadError, CHARSET_WORDS};
use crate::head_rank::{self, CharModel, Signals, CHAR_MODEL_WORDS};
use crate::model::{Logits, Session};
use crate::platform::Platform;
use crate::sampler::Sampler;
use crate::tokenizer::Tokenizer;

/// Bytes of text tokenized at a time (the tokenizer's scratch is about 100 bytes per
/// byte of text, so this keeps the selection's scratch near 1.6 MiB).
const PIECE: usize = 16 << 10;

impl From<HeadError> for AppError {
    fn from(e: HeadError) -> Self {
        AppError::Head(e)
    }
}

/// The whole file `path`, read into the arena.
pub(crate) fn read_file<'a, P: Platform>(
    p: &P,
    arena: &mut Arena<'a>,
    path: &str,
) -> Result<&'a [u8], AppError> {
    let f = p
        .open(path)
        .map_err(|e| AppError::Input(file_name(path), e))?;
    let n = p.file_size(&f) as usize;
    let buf = arena.bytes("corpus", n)?;
    let mut done = 0;
    while done < n {
        let got = p
            .read_at(&f, done as u64, &mut buf[done..], false)
            .map_err(|e| AppError::Input(file_name(path), e))?;
        if got == 0 {
            break;
        }
        done += got;
    }
    Ok(&buf[..done])
}

/// A callback given each corpus file's path and bytes.
type FileFn<'f, 'a> = dyn FnMut(&str, &'a [u8]) -> Result<(), AppError> + 'f;

/// Call `f` with every file of the corpus list `spec`.
fn for_each_file<'a, P: Platform>(
    p: &P,
    arena: &mut Arena<'a>,
    spec: &str,
    f: &mut FileFn<'_, 'a>,
) -> Result<usize, AppError> {
    let mut files = 0;
    let mut path = heapless::String::<1024>::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        path.clear();
        let _ = write!(path, "{}/files.txt", item.trim_end_matches('/'));
        match p.open(&path) {
            Ok(_) => {
                let list = read_file(p, arena, &path)?;
                let list = core::str::from_utf8(list)
                    .map_err(|_| AppError::Usage("corpus files.txt is not UTF-8"))?;
                for name in list.lines().map(str::trim) {
                    if name.is_empty() || name.starts_with('#') {
                        continue;
                    }
                    path.clear();
                    let _ = write!(path, "{}/{}", item.trim_end_matches('/'), name);
                    let text = read_file(p, arena, &path)?;
                    f(&path, text)?;
                    files += 1;
                }
            }
            Err(_) => {
                let text = read_file(p, arena, item)?;
                f(item, text)?;
                files += 1;
            }
        }
    }
    Ok(files)
}

/// Why a `--head-lang` list was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LangError {
    /// An item is empty or its weight is not a whole number.
    BadItem,
}

/// The language of a corpus file: its file name without directory and extension
/// (`tests/data/corpus/en.txt` -> `en`).
pub fn file_lang(path: &str) -> &str {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.split('.').next().unwrap_or(name)
}

/// The weight `--head-lang` gives to language `lang`: 1 for every language without a
/// list; with one, the listed weight (`en=3`, or 1 for a bare `en`), 0 for the others.
pub fn lang_weight(spec: Option<&str>, lang: &str) -> Result<u32, LangError> {
    let Some(spec) = spec else { return Ok(1) };
    let mut found = 0;
    for item in spec.split(',').map(str::trim) {
        let (name, w) = match item.split_once('=') {
            Some((n, w)) => (n.trim(), w.trim().parse().map_err(|_| LangError::BadItem)?),
            None => (item, 1),
        };
        if name.is_empty() {
            return Err(LangError::BadItem);
        }
        if name == lang {
            found = w;
        }
    }
    Ok(found)
}

fn weight_of(spec: Option<&str>, path: &str) -> Result<u32, AppError> {
    lang_weight(spec, file_lang(path))
        .map_err(|_| AppError::Usage("--head-lang: give languages as en,code or en=3,code=1"))
}

/// Corpus files of nonzero weight and their weights (the first 64), as read into the
/// arena: the seeds of `--generate`.
pub type WeightedTexts<'a> = heapless::Vec<(&'a [u8], u32), 64>;

/// Add every token of the corpus `spec` to `counts` (tokenized with `tok` as it is),
/// each file weighted by `--head-lang` (`langs`), and the characters of every file of
/// nonzero weight to `chars` (and, weighted, to `model`), those files to `keep`;
/// returns (files, bytes, tokens).
#[allow(clippy::too_many_arguments)]
pub fn count_corpus<'a, P: Platform>(
    p: &P,
    tok: &Tokenizer<'_>,
    arena: &mut Arena<'a>,
    spec: &str,
    langs: Option<&str>,
    counts: &mut [u32],
    chars: &mut CharSet<'_>,
    mut model: Option<&mut CharModel<'_>>,
    mut keep: Option<&mut WeightedTexts<'a>>,
) -> Result<(usize, usize, usize), AppError> {
    let scratch = arena.bytes("tokenizer scratch", tok.scratch_bytes(PIECE + 4))?;
    let ids = arena.slice::<u32>("tokens", PIECE + 8)?;
    let (mut bytes, mut tokens) = (0usize, 0usize);
    let files = for_each_file(p, arena, spec, &mut |path, text| {
        let w = weight_of(langs, path)?;
        if w == 0 {
            return Ok(());
        }
        bytes += text.len();
        chars.add_text(text);
        if let Some(m) = model.as_deref_mut() {
            m.add_text(text, w);
        }
        if let Some(k) = keep.as_deref_mut() {
            if !text.is_empty() {
                let _ = k.push((text, w));
            }
        }
        for_each_piece(tok, text, scratch, ids, &mut |ids| {
            for &id in ids {
                if let Some(c) = counts.get_mut(id as usize) {
                    *c = c.saturating_add(w);
                }
            }
            tokens += ids.len();
            Ok(())
        })
    })?;
    Ok((files, bytes, tokens))
}

/// Tokenize `text` in pieces of at most [`PIECE`] bytes that end at a line break (or a
/// UTF-8 boundary when a piece has none), calling `f` with each piece's tokens.
fn for_each_piece(
    tok: &Tokenizer<'_>,
    text: &[u8],
    scratch: &mut [u8],
    ids: &mut [u32],
    f: &mut dyn FnMut(&[u32]) -> Result<(), AppError>,
) -> Result<(), AppError> {
    {
        let mut rest = text;
        while !rest.is_empty() {
            let mut end = rest.len().min(PIECE);
            if end < rest.len() {
                // Cut after a line break (or at a UTF-8 boundary if the piece has none).
                match rest[..end].iter().rposition(|&b| b == b'\n') {
                    Some(i) => end = i + 1,
                    None => {
                        while end > 1 && rest[end] & 0xC0 == 0x80 {
                            end -= 1;
                        }
                    }
                }
            }
            let n = tok.encode_bytes(&rest[..end], false, false, scratch, ids)?;
            f(&ids[..n])?;
            rest = &rest[end..];
        }
        Ok(())
    }
}

/// `pinch head-select -m M --corpus LIST --rows N [--soft] [--generate N | --load-soft F]
/// [--head-lang L] [-o FILE]`: rank by corpus counts plus the model's expected counts
/// over the corpus (`--soft`) and over its own text (`--generate`), see the module doc.
pub fn head_select_soft<P: Platform>(ctx: &mut Ctx<'_, '_, '_, P>) -> Result<(), AppError> {
    let Ctx {
        p,
        o,
        tok,
        sess,
        arena,
        ..
    } = ctx;
    let (p, o, tok) = (*p, *o, *tok);
    if o.head_rows == 0 {
        return Err(AppError::Usage(
            "give the number of rows to keep with --rows N",
        ));
    }
    if o.generate_weight
        .is_some_and(|w| !(w.is_finite() && w > 0.0))
    {
        return Err(AppError::Usage("--generate-weight: give a positive number"));
    }
    if o.save_soft.is_some() && (o.soft == (o.generate > 0) || o.load_soft.is_some()) {
        return Err(AppError::Usage(
            "--save-soft keeps what one of --soft or --generate N computes (without --load-soft)",
        ));
    }
    let nv = tok.n_vocab() as usize;
    let counts = arena.slice::<u32>("head select", nv)?;
    counts.fill(0);
    let mut chars = CharSet::new(arena.slice("head select", CHARSET_WORDS)?);
    let mut model = CharModel::new(arena.slice("head select", CHAR_MODEL_WORDS)?);
    let mut texts = WeightedTexts::new();
    let (files, bytes, tokens) = count_corpus(
        p,
        tok,
        arena,
        o.corpus,
        o.head_lang,
        counts,
        &mut chars,
        Some(&mut model),
        Some(&mut texts),
    )?;
    let soft = arena.slice::<f32>("head select", nv)?;
    soft.fill(0.0);
    let exps = arena.slice::<f32>("head select", nv)?;
    let mut err = Out::stderr(p);
    // The model's own text: its expected counts, scaled to weigh `--generate-weight`
    // times the corpus's (weighted) tokens; per position without a corpus.
    let own = arena.slice::<f32>("head select", nv)?;
    own.fill(0.0);
    let mut written = 0;
    let mut soft_done = false;
    for path in o
        .load_soft
        .unwrap_or("")
        .split(',')
        .filter(|f| !f.is_empty())
    {
        // `exps` is free until the model runs: the file's counts land there first.
        match load_soft(p, arena, path, exps)? {
            SoftOver::OwnText(positions) => {
                written += positions;
                for (g, e) in own.iter_mut().zip(exps.iter()) {
                    *g += e;
                }
            }
            SoftOver::Corpus(saved) => {
                if o.soft || soft_done {
                    return Err(AppError::Usage(
                        "--load-soft: give --soft's predictions once, without --soft",
                    ));
                }
                if saved != tokens {
                    return Err(AppError::Usage(
                        "--load-soft: the file's predictions are over another corpus \
                         (its token count differs; same --corpus and --head-lang?)",
                    ));
                }
                soft.copy_from_slice(exps);
                soft_done = true;
            }
        }
    }
    if o.soft {
        soft_over_corpus(p, o, tok, sess, arena, tokens, exps, soft, &mut err)?;
        soft_done = true;
        if let Some(path) = o.save_soft {
            save_soft(p, arena, path, soft, SoftOver::Corpus(tokens))?;
        }
    }
    // A loaded own-text file stands for `--generate` (a corpus file does not).
    if written == 0 && o.generate > 0 {
        let from_file: [(&[u8], u32); 1];
        let seeds = match o.generate_from {
            _ if o.generate_seed == 0 => &[][..],
            Some(path) => {
                from_file = [(read_file(p, arena, path)?, 1)];
                &from_file[..]
            }
            None => &texts[..],
        };
        written = soft_over_own_text(p, o, tok, sess, arena, seeds, exps, own, &mut err)?;
        if let Some(path) = o.save_soft {
            save_soft(p, arena, path, own, SoftOver::OwnText(written))?;
        }
    }
    if written > 0 {
        let scale = if tokens > 0 {
            let weight = match o.generate_weight {
                Some(w) => w,
                None if soft_done => GENERATE_WEIGHT_WITH_SOFT,
                None => GENERATE_WEIGHT,
            };
            weight * tokens as f32 / written as f32
        } else {
            1.0
        };
        for (s, g) in soft.iter_mut().zip(own.iter()) {
            *s += g * scale;
        }
    }
    // Count plus expected count, with a share of each lowercase word's for its
    // capitalized twin, in sixteenths: a token the model gives at least 1/16 of a
    // position over the corpus counts as the corpus's ([`head_rank::choose`]).
    for (s, c) in soft.iter_mut().zip(counts.iter()) {
        *s += *c as f32;
    }
    head_rank::share_with_title_case(tok, soft, head_rank::TITLE_CASE_SHARE);
    for (c, s) in counts.iter_mut().zip(soft.iter()) {
        *c = (*s * 16.0).min(u32::MAX as f32) as u32;
    }
    let out = arena.slice::<u32>("head", nv)?;
    let sig = Signals {
        chars: &chars,
        model: Some(&model),
    };
    let k = head_rank::choose(tok, counts, &sig, o.head_rows, arena, out)?;
    let _ = writeln!(
        err,
        "head: {k} of {nv} rows from {tokens} tokens of {files} files ({bytes} bytes){}{}",
        if soft_done {
            ", counts plus the model's predictions"
        } else {
            ""
        },
        if written > 0 {
            ", plus its predictions over its own text"
        } else {
            ""
        },
    );
    drop(err);
    write_head(p, o, arena, nv, &out[..k])
}

/// `--generate-weight` when not given and the corpus counts stand alone: the model's
/// own text weighs 4 times the corpus's tokens (Gemma 3 270M, 65,536 rows, 9 KB of
/// held-out English: weights 1 / 4 / 20 / 100 +6.7 / +5.3 / +6.3 / +5.7 % bits per byte).
const GENERATE_WEIGHT: f32 = 4.0;

/// `--generate-weight` when not given and the model's predictions over the corpus
/// (`--soft`) count too: they already spread the counts, so its own text weighs as the
/// corpus's tokens. Gemma 3 270M, 65,536 rows, `--soft` plus 50,000 tokens begun with
/// `tests/data/topics/en.txt`, bits per byte on the two held-out English texts
/// (wiki-excerpt + literary-excerpt / wiki-excerpt-2): weight 0.25 +2.66 / +3.28 %,
/// 0.5 +2.48 / +2.97 %, 1 +2.30 / +2.74 %, 2 +2.35 / +2.60 %; `--soft` alone +3.15 /
/// +4.52 %; 50,000 tokens begun with the corpus's own lines at 1: +3.11 / +4.78 %.
const GENERATE_WEIGHT_WITH_SOFT: f32 = 1.0;

/// Tokens of a `--soft` window when `-c` is not given. Short windows keep the model
/// unsure, so its predictions spread over more of a topic's words (as the temperature
/// does): Gemma 3 270M, shared English corpus, 65,536 rows, held-out English (73 KB,
/// full head 1.329512 bits per byte): windows of 2,048 tokens 1.391245, 128 1.375010,
/// 32 1.371405, 16 1.370611 (kept at 32: twice the windows, each a fresh start, for a
/// 0.06 % gain).
const SOFT_WINDOW: usize = 32;

/// `--soft`: add, for every position of the corpus, the model's predicted probability of
/// every token times the file's weight to `soft`. Each window of `-c` tokens
/// ([`SOFT_WINDOW`] if not given) starts with BOS (when the vocab has one) from an empty
/// cache.
#[allow(clippy::too_many_arguments)]
fn soft_over_corpus<'a, P: Platform>(
    p: &P,
    o: &Opts,
    tok: &Tokenizer<'_>,
    sess: &mut Session<'_, 'a>,
    arena: &mut Arena<'a>,
    tokens: usize,
    exps: &mut [f32],
    soft: &mut [f32],
    err: &mut Out<'_, P>,
) -> Result<(), AppError> {
    let scratch = arena.bytes("tokenizer scratch", tok.scratch_bytes(PIECE + 4))?;
    let ids = arena.slice::<u32>("tokens", PIECE + 8)?;
    let n_ctx = match o.n_ctx {
        0 => SOFT_WINDOW,
        n => n,
    }
    .clamp(2, sess.opts.n_ctx.max(2));
    let window = arena.slice::<u32>("tokens", n_ctx)?;
    let bos = tok.bos();
    let body = n_ctx - bos.is_some() as usize;
    let mut done = 0usize;
    let t0 = p.now_ns();
    for_each_file(p, arena, o.corpus, &mut |path, text| {
        let w = weight_of(o.head_lang, path)? as f32;
        if w == 0.0 {
            return Ok(());
        }
        for_each_piece(tok, text, scratch, ids, &mut |piece| {
            for part in piece.chunks(body.max(1)) {
                let mut len = 0;
                if let Some(b) = bos {
                    window[0] = b;
                    len = 1;
                }
                window[len..len + part.len()].copy_from_slice(part);
                len += part.len();
                sess.reset();
                sess.eval(p, &window[..len], Logits::All, &mut |_, l| {
                    add_softmax(l, w, exps, soft)
                })?;
                done += part.len();
                let _ = write!(
                    err,
                    "\rhead: model over the corpus: {done} of {tokens} tokens ({:.0} s)",
                    super::secs(t0, p.now_ns())
                );
                err.flush();
            }
            Ok(())
        })
    })?;
    let _ = writeln!(err);
    Ok(())
}

/// `--generate N`: let the model write `N` tokens of free text, documents of at most
/// `-n` tokens (or the context) from BOS (or, without one, from its end-of-text
/// token) and the first `--generate-seed` tokens of a line of one of `texts` (none:
/// BOS alone), sampled with the sampling flags, and add its predicted probabilities at
/// every step to `soft`; returns the tokens written.
///
/// Why: a base model's free text is a sample of what it was trained on, so its
/// predictions over it give counts to tokens of its languages and topics that a corpus
/// small enough to ship never shows (the gain, 1.2-1.5 points of bits per byte at
/// 49K-100K rows on Gemma 3, is measured in the module doc). It costs one token's
/// forward pass, full head, per token.
#[allow(clippy::too_many_arguments)]
fn soft_over_own_text<'a, P: Platform>(
    p: &P,
    o: &Opts,
    tok: &Tokenizer<'_>,
    sess: &mut Session<'_, 'a>,
    arena: &mut Arena<'a>,
    texts: &[(&[u8], u32)],
    exps: &mut [f32],
    soft: &mut [f32],
    err: &mut Out<'_, P>,
) -> Result<usize, AppError> {
    let Some(start) = tok.bos().or(tok.eos()) else {
        return Err(AppError::Usage(
            "--generate needs a model with a BOS or end-of-text token to start from",
        ));
    };
    // Seeds are drawn from `texts` (the corpus files of nonzero weight) in proportion
    // to their weights.
    let total_w: u64 = texts.iter().map(|t| t.1 as u64).sum();
    let scratch = arena.bytes("tokenizer scratch", tok.scratch_bytes(SEED_BYTES + 4))?;
    let seed_ids = arena.slice::<u32>("tokens", SEED_BYTES + 8)?;
    let doc = o
        .n_predict
        .clamp(1, sess.opts.n_ctx.saturating_sub(1).max(1));
    let params = o.sampler.resolve_seed(p.now_ns());
    let mut pick = (params.seed ^ 0x9e37_79b9_7f4a_7c15) | 1; // xorshift never leaves 0
    let mut sampler = Sampler::new(params);
    let (mut written, mut docs) = (0usize, 0usize);
    let t0 = p.now_ns();
    while written < o.generate {
        sess.reset();
        sampler.reset();
        docs += 1;
        // BOS, then (with seeds) the first tokens of a line at a random place of a file.
        let mut prompt = heapless::Vec::<u32, 72>::new();
        let _ = prompt.push(start);
        if total_w > 0 {
            let mut r = next_rand(&mut pick) % total_w;
            let text = texts
                .iter()
                .find(|t| {
                    let hit = r < t.1 as u64;
                    r = r.saturating_sub(t.1 as u64);
                    hit
                })
                .map_or(texts[0].0, |t| t.0);
            let seed = seed_text(text, next_rand(&mut pick));
            let n = tok.encode_bytes(seed, false, false, scratch, seed_ids)?;
            let room = (sess.opts.n_ctx / 2).min(prompt.capacity() - 1);
            for &id in seed_ids[..n].iter().take(o.generate_seed.min(room)) {
                let _ = prompt.push(id);
            }
        }
        for &t in &prompt[1..] {
            sampler.accept(t);
        }
        // Every prediction made is added: the one after the prompt, then after each
        // sampled token, until an end of generation, `-n` tokens or a full context.
        let mut next = 0;
        sess.eval(p, &prompt, Logits::Last, &mut |_, l| {
            add_softmax(l, 1.0, exps, soft);
            next = sampler.sample(l);
        })?;
        written += 1;
        let mut len = 1;
        while len < doc
            && written < o.generate
            && !tok.is_eog(next)
            && sess.n_past() < sess.opts.n_ctx
        {
            sampler.accept(next);
            sess.eval(p, &[next], Logits::Last, &mut |_, l| {
                add_softmax(l, 1.0, exps, soft);
                next = sampler.sample(l);
            })?;
            written += 1;
            len += 1;
        }
        let _ = write!(
            err,
            "\rhead: the model's own text: {written} of {} tokens, {docs} documents ({:.0} s)",
            o.generate,
            super::secs(t0, p.now_ns())
        );
        err.flush();
    }
    let _ = writeln!(err);
    Ok(written)
}

/// Bytes of corpus text a seed is cut from.
const SEED_BYTES: usize = 256;

/// A 64-bit xorshift step (seed choice only; the sampler has its own generator).
fn next_rand(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Up to [`SEED_BYTES`] of `text` from the start of the line after byte `r % len`
/// (whole UTF-8 characters).
fn seed_text(text: &[u8], r: u64) -> &[u8] {
    let at = (r % text.len() as u64) as usize;
    let start = text[at..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(0, |i| at + i + 1);
    let start = if start >= text.len() { 0 } else { start };
    let mut end = (start + SEED_BYTES).min(text.len());
    while end < text.len() && end > start && text[end] & 0xC0 == 0x80 {
        end -= 1;
    }
    &text[start..end]
}

/// First line of a `--save-soft` file; the counts follow as little-endian f32.
const SOFT_MAGIC: &str = "pinch-soft v1";

/// What a `--save-soft` file holds: the model's expected counts over `positions` tokens
/// of its own text (`--generate`; scaled at load to weigh `--generate-weight`), or over
/// a corpus of that many tokens (`--soft`; added as they are, and only to the same
/// corpus: the header's `over=corpus` and the token count say so).
#[derive(Clone, Copy, Debug, PartialEq)]
enum SoftOver {
    OwnText(usize),
    Corpus(usize),
}

/// Write the model's expected counts `soft`.
fn save_soft<P: Platform>(
    p: &P,
    arena: &mut Arena<'_>,
    path: &str,
    soft: &[f32],
    over: SoftOver,
) -> Result<(), AppError> {
    arena.scratch(|s| {
        let mut head = heapless::String::<96>::new();
        let (n, over) = match over {
            SoftOver::OwnText(n) => (n, ""),
            SoftOver::Corpus(n) => (n, " over=corpus"),
        };
        let _ = writeln!(
            head,
            "{SOFT_MAGIC} n_vocab={} positions={n}{over}",
            soft.len()
        );
        let body = s.bytes("soft counts", soft.len() * 4)?;
        for (b, v) in body.chunks_exact_mut(4).zip(soft) {
            b.copy_from_slice(&v.to_le_bytes());
        }
        p.write_file(path, &[head.as_bytes(), body])
            .map_err(|e| AppError::Output(file_name(path), e))
    })
}

/// Read a `--save-soft` file for a vocabulary of `soft.len()` into `soft`.
fn load_soft<P: Platform>(
    p: &P,
    arena: &mut Arena<'_>,
    path: &str,
    soft: &mut [f32],
) -> Result<SoftOver, AppError> {
    arena.scratch(|s| {
        let bytes = read_file(p, s, path)?;
        let bad = || AppError::Usage("--load-soft: not a pinch-soft v1 file of this vocabulary");
        let nl = bytes.iter().position(|&b| b == b'\n').ok_or_else(bad)?;
        let head = core::str::from_utf8(&bytes[..nl]).map_err(|_| bad())?;
        let rest = head.strip_prefix(SOFT_MAGIC).ok_or_else(bad)?;
        let mut words = rest.split(' ').filter(|w| !w.is_empty());
        let field =
            |w: Option<&str>, key: &str| -> Option<usize> { w?.strip_prefix(key)?.parse().ok() };
        let nv = field(words.next(), "n_vocab=").ok_or_else(bad)?;
        let positions = field(words.next(), "positions=").ok_or_else(bad)?;
        let over = match words.next() {
            None => SoftOver::OwnText(positions),
            Some("over=corpus") => SoftOver::Corpus(positions),
            Some(_) => return Err(bad()),
        };
        let body = &bytes[nl + 1..];
        if nv != soft.len() || body.len() != nv * 4 || positions == 0 || words.next().is_some() {
            return Err(bad());
        }
        for (v, b) in soft.iter_mut().zip(body.chunks_exact(4)) {
            let x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            *v = if x.is_finite() && x >= 0.0 {
                x
            } else {
                return Err(bad());
            };
        }
        Ok(over)
    })
}

/// Temperature of the model's predictions counted by `--soft` and `--generate` (not of
/// the sampling). Flatter than the model's own (1.0) gives rare words of a topic more of
/// the count than the few words the context makes near-certain: Gemma 3 270M, top
/// 65,536 tokens by the predictions over 24,576 positions of the shared English corpus,
/// share of the held-out English outside: 1.58 % at 1.0, 1.44 % at 1.5, 1.59 % at 2,
/// 1.90 % at 3; through `head-select` (closure, counts) 1.387672 -> 1.381687 bits per
/// byte. Measured for predictions over a corpus; `--generate`'s take the same
/// temperature untested (its gain was measured at 1.0, module doc).
pub const SOFT_TEMPERATURE: f32 = 1.5;

/// `acc += weight * softmax(logits / SOFT_TEMPERATURE)` (softmax in f32 with the max
/// subtracted), one `expf` per entry kept in `exps` (scratch as long as `logits`);
/// entries more than 88 below the max (below f32's smallest normal after `expf`) add
/// nothing and cost none.
pub fn add_softmax(logits: &[f32], weight: f32, exps: &mut [f32], acc: &mut [f32]) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for (e, &l) in exps.iter_mut().zip(logits) {
        let d = (l - max) * (1.0 / SOFT_TEMPERATURE);
        *e = if d > -88.0 { libm::expf(d) } else { 0.0 };
        sum += *e;
    }
    let scale = weight / sum;
    for (a, &e) in acc.iter_mut().zip(exps.iter()) {
        *a += e * scale;
    }
}

/// Choose a head of `rows` rows from the corpus `spec`; the ids live in the arena, the
/// counting (corpus text, counts, order: about 12 bytes per vocabulary id plus the
/// corpus) in a scratch scope freed before the return ([`Arena::scratch`]).
pub fn select_from_corpus<'a, P: Platform>(
    p: &P,
    tok: &Tokenizer<'_>,
    arena: &mut Arena<'a>,
    spec: &str,
    langs: Option<&str>,
    rows: usize,
) -> Result<&'a [u32], AppError> {
    let nv = tok.n_vocab() as usize;
    let out = arena.slice::<u32>("head", head::row_count(tok, rows, nv))?;
    let (k, (files, bytes, tokens)) = arena.scratch(|s| -> Result<_, AppError> {
        let counts = s.slice::<u32>("head select", nv)?;
        counts.fill(0);
        let mut chars = CharSet::new(s.slice("head select", CHARSET_WORDS)?);
        let mut model = CharModel::new(s.slice("head select", CHAR_MODEL_WORDS)?);
        let stats = count_corpus(
            p,
            tok,
            s,
            spec,
            langs,
            counts,
            &mut chars,
            Some(&mut model),
            None,
        )?;
        let sig = Signals {
            chars: &chars,
            model: Some(&model),
        };
        Ok((head_rank::choose(tok, counts, &sig, rows, s, out)?, stats))
    })?;
    let mut err = Out::stderr(p);
    let _ = writeln!(
        err,
        "head: {k} of {nv} rows from {tokens} tokens of {files} files ({bytes} bytes)"
    );
    Ok(&out[..k])
}

/// Read a `head.ids` file for a vocabulary of `n_vocab`: the ids stay in the arena, the
/// file's text only in scratch scopes (read twice: once to count, once to fill).
pub fn read_ids<'a, P: Platform>(
    p: &P,
    arena: &mut Arena<'a>,
    path: &str,
    n_vocab: usize,
) -> Result<&'a [u32], AppError> {
    let parse = |s: &mut Arena<'_>, out: Option<&mut [u32]>| -> Result<usize, AppError> {
        let text = read_file(p, s, path)?;
        let text =
            core::str::from_utf8(text).map_err(|_| AppError::Usage("head file is not UTF-8"))?;
        let out = match out {
            Some(o) => o,
            None => s.slice::<u32>("head", n_vocab)?,
        };
        Ok(head::parse_ids(text, n_vocab, out)?)
    };
    let k = arena.scratch(|s| parse(s, None))?;
    let out = arena.slice::<u32>("head", k)?;
    arena.scratch(|s| parse(s, Some(&mut *out)))?;
    Ok(out)
}

/// The head the options ask for (`--head FILE` or `--head-rows N`), if any.
pub fn requested_ids<'a, P: Platform>(
    p: &P,
    o: &Opts,
    tok: &Tokenizer<'_>,
    arena: &mut Arena<'a>,
) -> Result<Option<&'a [u32]>, AppError> {
    let nv = tok.n_vocab() as usize;
    if let Some(path) = o.head {
        return read_ids(p, arena, path, nv).map(Some);
    }
    if o.head_rows > 0 {
        if o.command == crate::cli::Command::HeadSelect {
            return Ok(None); // `head-select --soft` loads the model to choose, not to prune
        }
        return select_from_corpus(p, tok, arena, o.corpus, o.head_lang, o.head_rows).map(Some);
    }
    Ok(None)
}

/// Restrict `tok` to the ids of a head.
pub fn set_mask<'a>(
    ids: &[u32],
    n_vocab: usize,
    tok: &mut Tokenizer<'a>,
    arena: &mut Arena<'a>,
) -> Result<(), AppError> {
    let m = head::mask(ids, n_vocab, arena)?;
    tok.set_allowed(Some(m));
    Ok(())
}

/// `pinch head-select -m M --corpus LIST --rows N [-o FILE]`: write a `head.ids` file
/// (atomically) or print it to stdout (no `-o`, or `-o -`).
pub fn head_select<P: Platform>(p: &P, o: &Opts, region: &mut [u8]) -> Result<(), AppError> {
    let path = o.model.ok_or(AppError::NoModel)?;
    if o.head_rows == 0 {
        return Err(AppError::Usage(
            "give the number of rows to keep with --rows N",
        ));
    }
    let file = open_model(p, path)?;
    let mut arena = Arena::new(region);
    let g = read_header(p, &file, &mut arena)?;
    let tok = Tokenizer::from_gguf(&g, &mut arena)?;
    let ids = select_from_corpus(p, &tok, &mut arena, o.corpus, o.head_lang, o.head_rows)?;
    write_head(p, o, &mut arena, tok.n_vocab() as usize, ids)
}

/// Write `ids` to `-o FILE` (atomically) or stdout.
fn write_head<P: Platform>(
    p: &P,
    o: &Opts,
    arena: &mut Arena<'_>,
    nv: usize,
    ids: &[u32],
) -> Result<(), AppError> {
    match o.output {
        Some(file) if file != "-" => {
            let mut count = TextBuf { buf: &mut [], n: 0 };
            let _ = head::write_ids(&mut count, nv, ids);
            let buf = arena.bytes("head file", count.n)?;
            let mut text = TextBuf { buf, n: 0 };
            let _ = head::write_ids(&mut text, nv, ids);
            p.write_file(file, &[&text.buf[..text.n]])
                .map_err(|e| AppError::Output(file_name(file), e))
        }
        _ => {
            let mut out = Out::stdout(p);
            let _ = head::write_ids(&mut out, nv, ids);
            out.flush();
            Ok(())
        }
    }
}

/// `core::fmt::Write` into a buffer; with an empty buffer it only counts (`n`).
pub(crate) struct TextBuf<'b> {
    pub(crate) buf: &'b mut [u8],
    pub(crate) n: usize,
}

impl core::fmt::Write for TextBuf<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.n + s.len();
        if let Some(dst) = self.buf.get_mut(self.n..end) {
            dst.copy_from_slice(s.as_bytes());
        } else if !self.buf.is_empty() {
            return Err(core::fmt::Error);
        }
        self.n = end;
        Ok(())
    }
}

/// A file name for an error message: the path, or its last 76 bytes after "..."
/// when it is longer (the end names the file).
pub(crate) fn file_name(path: &str) -> heapless::String<80> {
    let mut s = heapless::String::new();
    let mut start = path.len().saturating_sub(76);
    while !path.is_char_boundary(start) {
        start += 1;
    }
    if start > 0 {
        let _ = s.push_str("...");
    }
    let _ = s.push_str(&path[start..]);
    s
}

/// For `ppl` with a pruned head: print how many tokens of the text's full tokenization
/// (`tok` not yet restricted) the head lacks; those spans are scored as smaller pieces.
pub fn report_outside<P: Platform>(
    p: &P,
    o: &Opts,
    tok: &Tokenizer<'_>,
    ids: &[u32],
    arena: &mut Arena<'_>,
) -> Result<(), AppError> {
    let Some(path) = o.file else {
        return Ok(());
    };
    let text = read_file(p, arena, path)?;
    let scratch = arena.bytes("tokenizer scratch", tok.scratch_bytes(text.len()))?;
    let out = arena.slice::<u32>("tokens", text.len() + 8)?;
    let n = tok.encode_bytes(text, false, false, scratch, out)?;
    let outside = out[..n]
        .iter()
        .filter(|id| ids.binary_search(id).is_err())
        .count();
    let mut err = Out::stderr(p);
    let _ = writeln!(
        err,
        "head: {outside} of {n} tokens of the full tokenization are outside the head ({:.2}%)",
        100.0 * outside as f64 / n.max(1) as f64
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_starts_at_a_line_and_ends_on_a_character() {
        let text = "first line\nsecond line\n".as_bytes();
        assert_eq!(seed_text(text, 3), b"second line\n");
        // From the last line break on: the start of the text.
        assert_eq!(seed_text(text, 22), text);
        // Positions wrap around the text.
        assert_eq!(seed_text(text, 23 + 3), b"second line\n");
        // A long line is cut at SEED_BYTES, never inside a character.
        let mut long = b"x\n".to_vec();
        long.push(b'a');
        while long.len() < SEED_BYTES + 8 {
            long.extend_from_slice("\u{e9}".as_bytes());
        }
        let s = seed_text(&long, 0);
        assert!(s.len() <= SEED_BYTES && s.len() >= SEED_BYTES - 1);
        assert!(core::str::from_utf8(s).is_ok());
    }

    #[test]
    fn language_is_the_file_stem() {
        assert_eq!(file_lang("tests/data/corpus/en.txt"), "en");
        assert_eq!(file_lang("code.txt"), "code");
        assert_eq!(file_lang("dir/ja"), "ja");
    }

    #[test]
    fn language_weights_follow_the_list() {
        assert_eq!(lang_weight(None, "fr"), Ok(1));
        assert_eq!(lang_weight(Some("en,code"), "en"), Ok(1));
        assert_eq!(lang_weight(Some("en,code"), "fr"), Ok(0));
        assert_eq!(lang_weight(Some("en=3,code=1"), "en"), Ok(3));
        assert_eq!(lang_weight(Some("en=3, code = 2"), "code"), Ok(2));
        assert_eq!(lang_weight(Some("en=x"), "en"), Err(LangError::BadItem));
        assert_eq!(lang_weight(Some("en,,code"), "en"), Err(LangError::BadItem));
        assert_eq!(lang_weight(Some("=2"), "en"), Err(LangError::BadItem));
    }

    #[test]
    fn softmax_adds_weighted_probabilities() {
        let (mut acc, mut exps) = ([0.0f32; 3], [0.0f32; 3]);
        add_softmax(&[0.0, 0.0, f32::NEG_INFINITY], 2.0, &mut exps, &mut acc);
        assert!((acc[0] - 1.0).abs() < 1e-6 && (acc[1] - 1.0).abs() < 1e-6);
        assert_eq!(acc[2], 0.0);
        add_softmax(&[1000.0, 0.0, 0.0], 1.0, &mut exps, &mut acc);
        assert!((acc[0] - 2.0).abs() < 1e-5, "{acc:?}");
        // At the temperature: a logit gap of ln 4 * T is a ratio of 4.
        let (mut acc, gap) = ([0.0f32; 3], 4f32.ln() * SOFT_TEMPERATURE);
        add_softmax(&[gap, 0.0, f32::NEG_INFINITY], 5.0, &mut exps, &mut acc);
        assert!(
            (acc[0] - 4.0).abs() < 1e-5 && (acc[1] - 1.0).abs() < 1e-5,
            "{acc:?}"
        );
    }
}
