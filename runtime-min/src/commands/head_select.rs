//! `pinch head-select` and the `--head` / `--head-rows` load-time options: count token
//! use over a corpus, choose a pruned LM head (`crate::head`) for the loader
//! (`Loader::load_with_head`), and restrict the tokenizer to it.
//!
//! The corpus is a comma-separated list of text files or directories; a directory must
//! hold `files.txt` naming its files, one per line (the platform cannot list
//! directories). Files are tokenized in pieces that end at a line break, so scratch
//! stays small; a piece boundary may split a token the whole text would have merged,
//! which changes counts by a hair and the choice not at all.
use core::fmt::Write;

use super::out::Out;
use super::{open_model, read_header, AppError};
use crate::arena::Arena;
use crate::cli::Opts;
use crate::head::{self, HeadError};
use crate::model::ModelError;
use crate::platform::Platform;
use crate::tokenizer::Tokenizer;

/// Bytes of text tokenized at a time.
const PIECE: usize = 64 << 10;

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
    let f = open_model(p, path)?;
    let n = p.file_size(&f) as usize;
    let buf = arena.bytes("corpus", n)?;
    let mut done = 0;
    while done < n {
        let got = p
            .read_at(&f, done as u64, &mut buf[done..], false)
            .map_err(|e| AppError::Model(ModelError::Platform(e)))?;
        if got == 0 {
            break;
        }
        done += got;
    }
    Ok(&buf[..done])
}

/// Call `f` with every file of the corpus list `spec`.
fn for_each_file<'a, P: Platform>(
    p: &P,
    arena: &mut Arena<'a>,
    spec: &str,
    f: &mut dyn FnMut(&[u8]) -> Result<(), AppError>,
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
                    f(text)?;
                    files += 1;
                }
            }
            Err(_) => {
                let text = read_file(p, arena, item)?;
                f(text)?;
                files += 1;
            }
        }
    }
    Ok(files)
}

/// Add every token of the corpus `spec` to `counts` (tokenized with `tok` as it is);
/// returns (files, bytes, tokens).
pub fn count_corpus<'a, P: Platform>(
    p: &P,
    tok: &Tokenizer<'_>,
    arena: &mut Arena<'a>,
    spec: &str,
    counts: &mut [u32],
) -> Result<(usize, usize, usize), AppError> {
    let scratch = arena.bytes("tokenizer scratch", tok.scratch_bytes(PIECE + 4))?;
    let ids = arena.slice::<u32>("tokens", PIECE + 8)?;
    let (mut bytes, mut tokens) = (0usize, 0usize);
    let files = for_each_file(p, arena, spec, &mut |text| {
        bytes += text.len();
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
            for &id in &ids[..n] {
                if let Some(c) = counts.get_mut(id as usize) {
                    *c = c.saturating_add(1);
                }
            }
            tokens += n;
            rest = &rest[end..];
        }
        Ok(())
    })?;
    Ok((files, bytes, tokens))
}

/// Choose a head of `rows` rows from the corpus `spec`; the ids live in the arena.
pub fn select_from_corpus<'a, P: Platform>(
    p: &P,
    tok: &Tokenizer<'_>,
    arena: &mut Arena<'a>,
    spec: &str,
    rows: usize,
) -> Result<&'a [u32], AppError> {
    let nv = tok.n_vocab() as usize;
    let counts = arena.slice::<u32>("head select", nv)?;
    let (files, bytes, tokens) = count_corpus(p, tok, arena, spec, counts)?;
    let order = arena.slice::<u32>("head select", nv)?;
    let out = arena.slice::<u32>("head", nv)?;
    let k = head::select(tok, counts, rows, order, out);
    let mut err = Out::stderr(p);
    let _ = writeln!(
        err,
        "head: {k} of {nv} rows from {tokens} tokens of {files} files ({bytes} bytes)"
    );
    Ok(&out[..k])
}

/// Read a `head.ids` file for a vocabulary of `n_vocab`.
pub fn read_ids<'a, P: Platform>(
    p: &P,
    arena: &mut Arena<'a>,
    path: &str,
    n_vocab: usize,
) -> Result<&'a [u32], AppError> {
    let text = read_file(p, arena, path)?;
    let text = core::str::from_utf8(text).map_err(|_| AppError::Usage("head file is not UTF-8"))?;
    let out = arena.slice::<u32>("head", n_vocab)?;
    let k = head::parse_ids(text, n_vocab, out)?;
    Ok(&out[..k])
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
        return select_from_corpus(p, tok, arena, o.corpus, o.head_rows).map(Some);
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
    let ids = select_from_corpus(p, &tok, &mut arena, o.corpus, o.head_rows)?;
    let nv = tok.n_vocab() as usize;
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
