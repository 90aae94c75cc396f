//! `pinch ppl`: perplexity with llama-perplexity's protocol (so figures compare) and
//! bits per byte with every token scored once.
//!
//! Perplexity: the whole file is tokenized with the vocab's special tokens (BOS only
//! when `tokenizer.ggml.add_bos_token` says so); chunk i is tokens
//! `[n_ctx*i, n_ctx*(i+1))` with its first token replaced by BOS only when the vocab
//! adds BOS (Qwen's does not: the chunk keeps its own first token), decoded from an empty
//! cache; the logits at positions n_ctx/2 .. n_ctx-2 predict the next token; PPL =
//! exp(mean NLL). Bits per byte: T = tokens without BOS is cut into pieces of n_ctx-1;
//! each piece is decoded as [BOS] + piece in a fresh context and every token of T is
//! scored once; bpb = sum(-log2 p) / bytes of the file.
use core::fmt::Write;

use super::out::{Mib, Out};
use super::run::{encode_into, read_text};
use super::{secs, AppError, Ctx};
use crate::model::Logits;
use crate::platform::Platform;

/// -log p(target) under softmax(logits), in nats: the normalizer summed in f64 over
/// exponentials in f32 (llama-perplexity's way too), vectorized where `cpu` allows.
pub fn nll(cpu: &pinch_kernels::CpuFeatures, logits: &[f32], target: u32) -> f64 {
    let (max, lse) = pinch_kernels::ops::log_sum_exp_on(cpu, logits);
    lse - (logits[target as usize] - max) as f64
}

/// Chunk `c` of llama-perplexity's protocol into `window`: tokens
/// `[n_ctx*c, n_ctx*(c+1))` of `all`, the first replaced by `bos` when given (the
/// caller gives it only when the vocab adds BOS, as llama-perplexity does).
pub fn chunk_into(all: &[u32], c: usize, n_ctx: usize, bos: Option<u32>, window: &mut [u32]) {
    window[..n_ctx].copy_from_slice(&all[c * n_ctx..(c + 1) * n_ctx]);
    if let Some(b) = bos {
        window[0] = b;
    }
}

pub fn ppl<P: Platform>(ctx: &mut Ctx<'_, '_, '_, P>) -> Result<(), AppError> {
    let o = ctx.o;
    let p = ctx.p;
    let path = o
        .file
        .ok_or(AppError::Usage("give the text file with -f FILE"))?;
    let text = read_text(ctx, path)?;
    let n_ctx = ctx.sess.opts.n_ctx;
    let cap = text.len() + 8;
    let scratch = ctx
        .arena
        .bytes("tokenizer scratch", ctx.tok.scratch_bytes(text.len()))?;
    let all = ctx.arena.slice::<u32>("tokens", cap)?;
    let n = encode_into(ctx.tok, text, true, false, scratch, all, cap)?;
    let all = &all[..n];
    let bos = ctx.tok.bos();
    let chunk_bos = if ctx.tok.adds_bos() { bos } else { None };
    let window = ctx.arena.slice::<u32>("tokens", n_ctx)?;
    let mut err = Out::stderr(p);
    let cpu = ctx.sess.opts.cpu;
    let t0 = p.now_ns();

    // llama-perplexity.
    let n_chunks = n / n_ctx;
    if n_chunks == 0 {
        return Err(AppError::Usage(
            "the text is shorter than one context window: lower -c",
        ));
    }
    let first = n_ctx / 2;
    let (mut nll_sum, mut count) = (0.0f64, 0usize);
    let _ = writeln!(err, "perplexity: {n} tokens, {n_chunks} chunks of {n_ctx}");
    for c in 0..n_chunks {
        chunk_into(all, c, n_ctx, chunk_bos, window);
        ctx.sess.reset();
        let w = &window[..n_ctx];
        ctx.sess.eval(p, w, Logits::From(first), &mut |j, l| {
            if j >= first && j + 1 < n_ctx {
                nll_sum += nll(&cpu, l, w[j + 1]);
                count += 1;
            }
        })?;
        let _ = write!(err, "[{}]{:.4},", c + 1, libm::exp(nll_sum / count as f64));
        err.flush();
    }
    let ppl = libm::exp(nll_sum / count as f64);
    let t1 = p.now_ns();
    let _ = writeln!(
        err,
        "\nPPL = {ppl:.4} over {count} scored tokens ({:.1} s)",
        secs(t0, t1)
    );

    // Bits per byte: every token after BOS scored once.
    let (body, has_bos) = match (bos, all.first()) {
        (Some(b), Some(&f)) if f == b => (&all[1..], true),
        _ => (all, false),
    };
    let piece = if has_bos { n_ctx - 1 } else { n_ctx };
    let stride = match o.ppl_stride {
        0 => piece,
        s => s.min(piece),
    };
    let (mut bits, mut scored, mut nll_all) = (0.0f64, 0usize, 0.0f64);
    let mut windows = 0;
    let mut done = 0; // body tokens scored so far
    while done < body.len() {
        let (start, end) = stride_window(done, piece, stride, body.len());
        let mut len = 0;
        if has_bos {
            window[0] = bos.unwrap_or(0);
            len = 1;
        }
        window[len..len + end - start].copy_from_slice(&body[start..end]);
        // Window position of the first target: body[done] (body[0] has no predictor
        // without BOS).
        let first = (len + done - start).max(1);
        len += end - start;
        ctx.sess.reset();
        let w = &window[..len];
        ctx.sess.eval(p, w, Logits::From(first - 1), &mut |j, l| {
            if j + 1 >= first && j + 1 < len {
                let x = nll(&cpu, l, w[j + 1]);
                nll_all += x;
                bits += x / core::f64::consts::LN_2;
                scored += 1;
            }
        })?;
        windows += 1;
        done = end;
        let _ = write!(
            err,
            "\rbits per byte: window {windows}, {scored} tokens scored"
        );
        err.flush();
    }
    let bpb = bits / text.len() as f64;
    let t2 = p.now_ns();
    let _ = write!(err, "\nbits per byte = {bpb:.6} ({bits:.1} bits / {} bytes; {scored} tokens in {windows} windows of {n_ctx}", text.len());
    if stride < piece {
        let _ = write!(err, " moving by {stride}");
    }
    let _ = writeln!(err, "; {:.1} s)", secs(t1, t2));
    if let Some(r) = p.peak_rss() {
        let _ = writeln!(err, "peak RSS {}", Mib(r));
    }
    drop(err);
    let mut out = Out::stdout(p);
    if o.json {
        let _ = writeln!(
            out,
            "{{\"command\":\"ppl\",\"ppl\":{ppl:.6},\"ppl_tokens\":{count},\"n_chunks\":{n_chunks},\"n_ctx\":{n_ctx},\"bpb\":{bpb:.6},\"bits\":{bits:.3},\"bytes\":{},\"scored\":{scored},\"nll_nats\":{nll_all:.6},\"tokens\":{n},\"attn_skip\":{},\"seconds\":{:.3},\"peak_rss\":{}}}",
            text.len(),
            ctx.sess.opts.attn_skip,
            secs(t0, t2),
            p.peak_rss().unwrap_or(0)
        );
    } else {
        let _ = writeln!(out, "PPL {ppl:.4}  bits/byte {bpb:.6}");
    }
    Ok(())
}

/// The body tokens `[start, end)` of the bits-per-byte window that scores from `done`:
/// the first window holds `piece` tokens; each later one scores the next `stride` and
/// keeps the `piece - stride` before them as context (side by side when equal, as
/// before the flag).
fn stride_window(done: usize, piece: usize, stride: usize, n: usize) -> (usize, usize) {
    if done == 0 {
        return (0, piece.min(n));
    }
    (done - (piece - stride).min(done), (done + stride).min(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stride_windows_score_every_token_once_after_enough_context() {
        // side by side: stride = piece
        assert_eq!(stride_window(0, 4, 4, 10), (0, 4));
        assert_eq!(stride_window(4, 4, 4, 10), (4, 8));
        assert_eq!(stride_window(8, 4, 4, 10), (8, 10));
        // stride 2: each later window keeps 2 tokens of context before its scored 2
        let (mut done, mut seen) = (0, [0u32; 11]);
        while done < 11 {
            let (s, e) = stride_window(done, 4, 2, 11);
            assert!(e - s <= 4);
            assert!(done == 0 || done - s == 2, "context {done} - {s}");
            for t in &mut seen[done..e] {
                *t += 1;
            }
            done = e;
        }
        assert_eq!(seen, [1; 11]);
    }

    #[test]
    fn chunk_starts_with_bos_only_when_given() {
        let all: [u32; 8] = [1, 10, 11, 12, 13, 14, 15, 16];
        let mut w = [0u32; 4];
        chunk_into(&all, 1, 4, Some(1), &mut w);
        assert_eq!(w, [1, 14, 15, 16]);
        // a vocab without add_bos keeps the chunk's own first token
        chunk_into(&all, 1, 4, None, &mut w);
        assert_eq!(w, [13, 14, 15, 16]);
        chunk_into(&all, 0, 4, None, &mut w);
        assert_eq!(w, [1, 10, 11, 12]);
    }
}
