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
//!   rows all have norm 1.031; both rank worse than vocabulary order).
//!
//! `head-select --soft` runs the model over the corpus and adds, for every position,
//! the model's predicted probability of every token (expected counts): a text about
//! poetry then also ranks `▁poems` and `▁poetic` though they never occur in it. It
//! costs a full-head forward pass per corpus token.
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
use crate::model::Logits;
use crate::platform::Platform;
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
type FileFn<'f> = dyn FnMut(&str, &[u8]) -> Result<(), AppError> + 'f;

/// Call `f` with every file of the corpus list `spec`.
fn for_each_file<'a, P: Platform>(
    p: &P,
    arena: &mut Arena<'a>,
    spec: &str,
    f: &mut FileFn<'_>,
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

/// Add every token of the corpus `spec` to `counts` (tokenized with `tok` as it is),
/// each file weighted by `--head-lang` (`langs`), and the characters of every file of
/// nonzero weight to `chars` (and, weighted, to `model`); returns (files, bytes,
/// tokens).
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

/// `pinch head-select --soft -m M --corpus LIST --rows N [--head-lang L] [-o FILE]`:
/// rank by corpus counts plus the model's expected counts over the corpus (see the
/// module doc). Each window of `-c` tokens starts with BOS (when the vocab has one)
/// from an empty cache; every position's softmax, times its file's weight, is added.
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
    let nv = tok.n_vocab() as usize;
    let counts = arena.slice::<u32>("head select", nv)?;
    counts.fill(0);
    let mut chars = CharSet::new(arena.slice("head select", CHARSET_WORDS)?);
    let mut model = CharModel::new(arena.slice("head select", CHAR_MODEL_WORDS)?);
    let (files, bytes, tokens) = count_corpus(
        p,
        tok,
        arena,
        o.corpus,
        o.head_lang,
        counts,
        &mut chars,
        Some(&mut model),
    )?;
    let soft = arena.slice::<f32>("head select", nv)?;
    soft.fill(0.0);
    let exps = arena.slice::<f32>("head select", nv)?;
    let scratch = arena.bytes("tokenizer scratch", tok.scratch_bytes(PIECE + 4))?;
    let ids = arena.slice::<u32>("tokens", PIECE + 8)?;
    let n_ctx = sess.opts.n_ctx;
    let window = arena.slice::<u32>("tokens", n_ctx)?;
    let bos = tok.bos();
    let body = n_ctx - bos.is_some() as usize;
    let mut err = Out::stderr(p);
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
    // Count plus expected count, in sixteenths: a token the model gives at least 1/16
    // of a position over the corpus counts as the corpus's ([`head_rank::choose`]).
    for (c, s) in counts.iter_mut().zip(soft.iter()) {
        *c = ((*c as f32 + *s) * 16.0).min(u32::MAX as f32) as u32;
    }
    let out = arena.slice::<u32>("head", nv)?;
    let sig = Signals {
        chars: &chars,
        model: Some(&model),
    };
    let k = head_rank::choose(tok, counts, &sig, o.head_rows, arena, out)?;
    let _ = writeln!(
        err,
        "head: {k} of {nv} rows from {tokens} tokens of {files} files ({bytes} bytes), counts plus the model's predictions"
    );
    drop(err);
    write_head(p, o, arena, nv, &out[..k])
}

/// `acc += weight * softmax(logits)` (softmax in f32 with the max subtracted), one
/// `expf` per entry kept in `exps` (scratch as long as `logits`); entries more than 88
/// below the max (below f32's smallest normal after `expf`) add nothing and cost none.
pub fn add_softmax(logits: &[f32], weight: f32, exps: &mut [f32], acc: &mut [f32]) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for (e, &l) in exps.iter_mut().zip(logits) {
        let d = l - max;
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
        let stats = count_corpus(p, tok, s, spec, langs, counts, &mut chars, Some(&mut model))?;
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
    }
}
