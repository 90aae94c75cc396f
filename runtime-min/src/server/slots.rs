//! Generation slots for `pinch serve --parallel N`: several answers decoded together,
//! one weight pass per token for all of them (continuous batching).
//!
//! Each [`Stream`] owns one sequence of the session (`n_ctx / N` positions, see
//! `commands::session_options`), its sampler and its place in the answer. Its prompt is
//! evaluated on its own sequence ([`Stream::start`]); then [`step`] hands every live
//! stream's pending token on and decodes the next one of each in one
//! [`Session::decode_seqs`] pass. Prompt, sampling (adjustments, grammar) and the
//! end of a stream are [`crate::generate`]'s own (`begin`, `pick`, `emit`), so a
//! stream ends as a server generation does (no drafts, the last token not fed): at an
//! end-of-generation token, its token limit, a full sequence, the guard, or its sink's
//! wish.
//! Rows of one pass are computed as each alone (tests/tests/batch_decode.rs), so a
//! stream's tokens are those it gets alone (tests/tests/server_parallel.rs).
//!
//! The HTTP loop of `serve --parallel N` ([`super::batch`]) runs on these.
use crate::commands::AppError;
use crate::generate::{begin, emit, pick, End, GenStats, Settings, Sink};
use crate::model::forward::MAX_SEQS;
use crate::model::{Logits, ModelError, Session};
use crate::platform::Platform;
use crate::tokenizer::Tokenizer;

/// One answer being generated on its own sequence.
pub struct Stream {
    /// The session's sequence this stream's cache lives in.
    pub seq: usize,
    /// What the generation did so far (`st.end` is final once `done`).
    pub st: GenStats,
    /// The stream has ended (`st.end` says why).
    pub done: bool,
    /// The sampled token not yet handed on.
    next: u32,
}

/// A stream with what it is sampled by and where its tokens go, for one step.
pub struct Turn<'x, 's, 'b, 'd, 'c> {
    pub stream: &'x mut Stream,
    /// The stream's sampling settings (drafts are not used: a pass holds one token of
    /// each stream; `feed_last` is not either, as in the server).
    pub settings: Settings<'s, 'b, 'd, 'c>,
    pub sink: &'x mut dyn Sink,
}

impl Stream {
    /// Select sequence `seq` and evaluate `prompt` after what it holds, as
    /// [`crate::generate::generate`] does (the guard checked first, passes of
    /// `n_batch`), sampling the first token through `s` and `sink`.
    ///
    /// # Errors
    /// The sequence does not exist, the prompt does not fit it, or a pass fails.
    pub fn start<P: Platform>(
        p: &P,
        sess: &mut Session<'_, '_>,
        tok: &Tokenizer<'_>,
        seq: usize,
        s: &mut Settings<'_, '_, '_, '_>,
        prompt: &[u32],
        sink: &mut dyn Sink,
    ) -> Result<Stream, AppError> {
        sess.select_seq(seq)?;
        let mut st = GenStats {
            prompt_tokens: prompt.len(),
            ..Default::default()
        };
        let next = begin(p, tok, sess, s, prompt, sink, &mut st)?;
        if next.is_some() {
            st.end = End::Length;
        }
        Ok(Stream {
            seq,
            st,
            done: next.is_none(),
            next: next.unwrap_or(0),
        })
    }
}

/// One step of every live stream: its pending token is handed on (or ends it, as in
/// [`crate::generate::generate`]), then the streams that go on are decoded in one pass
/// and their next tokens sampled. Returns the streams still live.
///
/// # Errors
/// More than [`MAX_SEQS`] streams, two on one sequence, or a failed pass.
pub fn step<P: Platform>(
    p: &P,
    sess: &mut Session<'_, '_>,
    tok: &Tokenizer<'_>,
    turns: &mut [Turn<'_, '_, '_, '_, '_>],
) -> Result<usize, AppError> {
    let n_ctx = sess.opts.n_ctx;
    let mut rows: heapless::Vec<(usize, u32), MAX_SEQS> = heapless::Vec::new();
    let mut owner: heapless::Vec<usize, MAX_SEQS> = heapless::Vec::new();
    for (k, t) in turns.iter_mut().enumerate() {
        let s = &mut *t.stream;
        if s.done {
            continue;
        }
        if let Some(end) = emit(&mut t.settings, tok, t.sink, &mut s.st, s.next) {
            s.st.end = end;
            s.done = true;
            continue;
        }
        if sess.n_past_of(s.seq) >= n_ctx {
            s.st.end = End::ContextFull;
            s.done = true;
            continue;
        }
        if let Err(g) = t.settings.guard.watch(p, &mut || sess.give_back(p)) {
            s.st.stopped = Some(g);
            s.st.end = End::Stopped(g);
            s.done = true;
            continue;
        }
        if rows.push((s.seq, s.next)).is_err() || owner.push(k).is_err() {
            return Err(ModelError::BadSeq {
                seq: s.seq,
                n_seq: MAX_SEQS,
            }
            .into());
        }
    }
    let t0 = p.now_ns();
    let mut on_logits = |r: usize, l: &[f32]| {
        let t = &mut turns[owner[r]];
        t.stream.next = pick(&mut t.settings, tok, t.sink, l, None);
    };
    match rows[..] {
        // One stream: the single-sequence decode, whose kernels are made for one row
        // (the logits are the same, tests/tests/batch_decode.rs).
        [(seq, id)] => {
            sess.select_seq(seq)?;
            sess.eval(p, &[id], Logits::Last, &mut |_, l| on_logits(0, l))?;
        }
        _ => sess.decode_seqs(p, &rows, &mut on_logits)?,
    }
    let dt = crate::commands::secs(t0, p.now_ns());
    for &k in &owner {
        let st = &mut turns[k].stream.st;
        st.passes += 1;
        st.gen_s += dt;
    }
    Ok(rows.len())
}
