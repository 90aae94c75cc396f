//! `pinch loops`: does the model loop in long answers?
//!
//! Perplexity does not see degeneration: a model can score well and still repeat itself
//! after a few hundred tokens. This command generates one long answer per fixed prompt
//! (`tests/data/loops/prompts.txt`, one prompt a line, or `-f FILE`), through the model's
//! chat template unless `--plain` (base models), with the sampling flags given, and
//! scores each answer with [`score`]: the share of repeated token 4-grams and the longest
//! span of tokens that occurs twice. It prints a table and the share of degenerate
//! answers (`--json`: one JSON object).
//!
//! The generation loop here is a small copy of `pinch run`'s (Session::eval + Sampler);
//! it stops at an end-of-generation token, after `-n` tokens (default 600) or when the
//! context is full.
use core::fmt::Write;

use super::out::{json_str, Out};
use super::run::{encode_into, read_text, SliceWriter};
use super::{AppError, Ctx};
use crate::chat::{ChatMessage, ChatTemplate};
use crate::model::Logits;
use crate::platform::Platform;
use crate::sampler::Sampler;

/// The prompts used without `-f`.
pub const DEFAULT_PROMPTS: &str = "tests/data/loops/prompts.txt";
/// Length of the n-grams whose repetition is counted.
pub const NGRAM: usize = 4;
/// An answer whose share of repeated 4-grams reaches this is degenerate.
pub const MAX_REPEAT_SHARE: f64 = 0.35;
/// An answer holding a span of this many tokens twice is degenerate (a loop that
/// starts late, or one long copied passage).
pub const MAX_REPEAT_SPAN: usize = 48;

/// How repetitive one answer is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoopScore {
    /// Tokens in the answer.
    pub tokens: usize,
    /// Share of the answer's 4-grams that already occurred earlier in it (0 for an
    /// answer shorter than one 4-gram).
    pub repeat_share: f64,
    /// The longest run of tokens that occurs at two positions (the runs may overlap:
    /// `a b a b a b` holds `a b a b` twice).
    pub longest_span: usize,
    /// `repeat_share >= MAX_REPEAT_SHARE || longest_span >= MAX_REPEAT_SPAN`.
    pub degenerate: bool,
}

/// Score `toks` for degeneration. `row` is scratch of at least `toks.len() + 1`
/// entries (a row of the longest-common-suffix table).
///
/// Both measures compare every pair of positions: O(n^2) time for an n-token answer
/// (600 tokens: 360,000 steps), O(n) memory.
pub fn score(toks: &[u32], row: &mut [u16]) -> LoopScore {
    let n = toks.len();
    // Repeated n-grams: position i counts when the n-gram starting at i began earlier.
    let grams = n.saturating_sub(NGRAM - 1);
    let mut repeated = 0usize;
    for i in 1..grams {
        let g = &toks[i..i + NGRAM];
        if (0..i).any(|j| &toks[j..j + NGRAM] == g) {
            repeated += 1;
        }
    }
    // Longest repeated span: row[j] = length of the common run ending at i-1 and j-1
    // (j < i), updated right to left so row[j-1] still holds the previous row.
    let row = &mut row[..n + 1];
    row.fill(0);
    let mut longest = 0usize;
    for i in 1..=n {
        for j in (1..i).rev() {
            row[j] = if toks[i - 1] == toks[j - 1] {
                row[j - 1].saturating_add(1)
            } else {
                0
            };
            longest = longest.max(row[j] as usize);
        }
    }
    let repeat_share = if grams == 0 {
        0.0
    } else {
        repeated as f64 / grams as f64
    };
    LoopScore {
        tokens: n,
        repeat_share,
        longest_span: longest,
        degenerate: repeat_share >= MAX_REPEAT_SHARE || longest >= MAX_REPEAT_SPAN,
    }
}

/// `pinch loops -m M [-f PROMPTS] [-n 600] [--plain] [sampling flags] [--json]`.
pub fn loops<P: Platform>(ctx: &mut Ctx<'_, '_, '_, P>) -> Result<(), AppError> {
    let o = ctx.o;
    let p = ctx.p;
    let prompts = read_text(ctx, o.file.unwrap_or(DEFAULT_PROMPTS))?;
    let template = if o.plain {
        None
    } else {
        Some(ChatTemplate::from_gguf(ctx.g).map_err(AppError::Chat)?)
    };
    let n_ctx = ctx.sess.opts.n_ctx;
    let n_gen = o.n_predict.max(1);
    let rendered = ctx.arena.bytes("chat template", 8192)?;
    let scratch = ctx
        .arena
        .bytes("tokenizer scratch", ctx.tok.scratch_bytes(8192))?;
    let prompt_toks = ctx.arena.slice::<u32>("tokens", n_ctx)?;
    let answer = ctx.arena.slice::<u32>("tokens", n_gen)?;
    let row = ctx.arena.slice::<u16>("loop score", n_gen + 1)?;
    let mut out = Out::stdout(p);
    if o.json {
        let _ = write!(
            out,
            "{{\"command\":\"loops\",\"n_predict\":{n_gen},\"answers\":["
        );
    } else {
        let _ = writeln!(
            out,
            "| # | prompt | tokens | repeated 4-grams | longest repeat | verdict |\n|---|---|---|---|---|---|"
        );
    }
    let (mut total, mut bad) = (0usize, 0usize);
    for (i, prompt) in prompts
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .enumerate()
    {
        let mut w = SliceWriter {
            buf: &mut *rendered,
            len: 0,
        };
        match template {
            Some(t) => t
                .render(&[ChatMessage::new("user", prompt)], true, &mut w)
                .map_err(AppError::Chat)?,
            None => w
                .write_str(prompt)
                .map_err(|_| AppError::Usage("a loops prompt is longer than 8 KiB"))?,
        }
        let len = w.len;
        let text = core::str::from_utf8(&rendered[..len]).unwrap_or("");
        let np = encode_into(
            ctx.tok,
            text,
            true,
            template.is_some(),
            scratch,
            prompt_toks,
            n_ctx,
        )?;
        let n = generate(ctx, &prompt_toks[..np], answer)?;
        let s = score(&answer[..n], row);
        total += 1;
        bad += s.degenerate as usize;
        if o.verbose {
            let mut err = Out::stderr(p);
            let _ = writeln!(err, "--- answer {} ---", i + 1);
            for &t in &answer[..n] {
                err.bytes(ctx.tok.token_bytes(t));
            }
            let _ = writeln!(err);
        }
        let verdict = if s.degenerate { "degenerate" } else { "ok" };
        if o.json {
            let _ = write!(out, "{}{{\"prompt\":", if total > 1 { "," } else { "" });
            let _ = json_str(&mut out, prompt);
            let _ = write!(
                out,
                ",\"tokens\":{},\"repeat_share\":{:.4},\"longest_span\":{},\"degenerate\":{}}}",
                s.tokens, s.repeat_share, s.longest_span, s.degenerate
            );
        } else {
            let short: &str = match prompt.char_indices().nth(40) {
                Some((k, _)) => &prompt[..k],
                None => prompt,
            };
            let _ = writeln!(
                out,
                "| {} | {short} | {} | {:.1} % | {} | {verdict} |",
                i + 1,
                s.tokens,
                100.0 * s.repeat_share,
                s.longest_span
            );
        }
        out.flush();
    }
    if total == 0 {
        return Err(AppError::Usage("the prompts file holds no prompt"));
    }
    let share = bad as f64 / total as f64;
    if o.json {
        let _ = writeln!(
            out,
            "],\"degenerate\":{bad},\"total\":{total},\"degenerate_share\":{share:.4}}}"
        );
    } else {
        let _ = writeln!(
            out,
            "\ndegenerate: {bad} of {total} answers ({:.0} %; repeated 4-grams >= {:.0} % or a repeated span >= {} tokens)",
            100.0 * share,
            100.0 * MAX_REPEAT_SHARE,
            MAX_REPEAT_SPAN
        );
    }
    Ok(())
}

/// One answer to `prompt` from an empty cache into `answer`; returns its length.
fn generate<P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    prompt: &[u32],
    answer: &mut [u32],
) -> Result<usize, AppError> {
    let p = ctx.p;
    let n_ctx = ctx.sess.opts.n_ctx;
    if prompt.len() >= n_ctx {
        return Err(AppError::PromptTooLong {
            tokens: prompt.len(),
            n_ctx,
        });
    }
    ctx.sess.reset();
    let mut sampler = Sampler::new(ctx.o.sampler.resolve_seed(ctx.p.now_ns()));
    for &t in prompt {
        sampler.accept(t);
    }
    let mut next = 0u32;
    ctx.sess.eval(p, prompt, Logits::Last, &mut |_, l| {
        next = sampler.sample(l)
    })?;
    let mut n = 0;
    while n < answer.len() && !ctx.tok.is_eog(next) {
        answer[n] = next;
        n += 1;
        sampler.accept(next);
        if ctx.sess.n_past() >= n_ctx || n == answer.len() {
            break;
        }
        let cur = next;
        ctx.sess.eval(p, &[cur], Logits::Last, &mut |_, l| {
            next = sampler.sample(l)
        })?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(toks: &[u32]) -> LoopScore {
        let mut row = [0u16; 2048];
        score(toks, &mut row)
    }

    /// A token stream that never repeats a 4-gram (a counter mixed into a small
    /// alphabet so tokens themselves recur).
    fn fresh(n: usize, base: u32) -> impl Iterator<Item = u32> {
        (0..n as u32).map(move |i| base + (i * 7919) % 1000)
    }

    #[test]
    fn a_text_without_repeats_is_ok() {
        let t: heapless::Vec<u32, 600> = fresh(600, 0).collect();
        let s = run(&t);
        assert_eq!(s.tokens, 600);
        assert_eq!(s.repeat_share, 0.0);
        assert_eq!(s.longest_span, 0);
        assert!(!s.degenerate);
    }

    #[test]
    fn a_loop_is_degenerate() {
        // 20 fresh tokens, then a 12-token cycle until 600.
        let mut t: heapless::Vec<u32, 600> = fresh(20, 5000).collect();
        while t.len() < 600 {
            let k = t.len() % 12;
            let _ = t.push(100 + k as u32);
        }
        let s = run(&t);
        assert!(s.repeat_share > 0.9, "{s:?}");
        assert_eq!(s.longest_span, 580 - 12);
        assert!(s.degenerate);
    }

    #[test]
    fn a_loop_that_starts_late_is_caught_by_its_span() {
        // 500 fresh tokens, then a 25-token sentence said four times.
        let mut t: heapless::Vec<u32, 600> = fresh(500, 0).collect();
        for _ in 0..4 {
            for k in 0..25 {
                let _ = t.push(2000 + k);
            }
        }
        let s = run(&t);
        assert!(s.repeat_share < MAX_REPEAT_SHARE, "{s:?}");
        assert_eq!(s.longest_span, 75);
        assert!(s.degenerate);
    }

    #[test]
    fn one_repeated_phrase_is_not_a_loop() {
        // A 10-token phrase said twice in otherwise fresh text.
        let mut t: heapless::Vec<u32, 600> = fresh(300, 0).collect();
        t.extend((0..10).map(|k| 3000 + k));
        t.extend(fresh(200, 4000));
        t.extend((0..10).map(|k| 3000 + k));
        let s = run(&t);
        assert_eq!(s.longest_span, 10);
        assert!(s.repeat_share < 0.02);
        assert!(!s.degenerate);
    }

    #[test]
    fn short_answers_score_without_panicking() {
        for t in [&[][..], &[1], &[1, 1], &[1, 1, 1], &[1, 1, 1, 1]] {
            let s = run(t);
            assert_eq!(s.tokens, t.len());
            assert!(!s.degenerate);
        }
        // five equal tokens: two 4-grams, the second repeats the first
        let s = run(&[9, 9, 9, 9, 9]);
        assert_eq!(s.repeat_share, 0.5);
        assert_eq!(s.longest_span, 4);
        // a whole answer of one token repeated is a loop
        let s = run(&[9; 100]);
        assert_eq!(s.longest_span, 99);
        assert!(s.degenerate);
    }
}
