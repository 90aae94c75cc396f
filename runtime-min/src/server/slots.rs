//! Generation slots for `pinch serve --parallel N`: several answers decoded together,
//! one weight pass per token for all of them (continuous batching).
//!
//! Each [`Stream`] owns one sequence of the session (`n_ctx / N` positions, see
//! `commands::session_options`), its sampler and its place in the answer. Its prompt is
//! evaluated on its own sequence ([`Stream::start`]); then [`step`] hands every live
//! stream's pending token on and decodes the next one of each in one
//! [`Session::decode_seqs`] pass. A stream ends as [`crate::generate::generate`] ends a
//! server generation (no drafts, the last token not fed): at an end-of-generation
//! token, at its token limit, when its sequence is full or when its receiver says stop.
//! Rows of one pass are computed as each alone (tests/tests/batch_decode.rs), so a
//! stream's tokens are those it gets alone (tests/tests/server_parallel.rs).
//!
//! Not wired into the HTTP loop yet: `serve` still runs one request at a time.
use crate::generate::End;
use crate::model::forward::MAX_SEQS;
use crate::model::{Logits, ModelError, Session};
use crate::platform::Platform;
use crate::sampler::Sampler;
use crate::tokenizer::Tokenizer;

/// One answer being generated on its own sequence.
pub struct Stream {
    /// The session's sequence this stream's cache lives in.
    pub seq: usize,
    pub sampler: Sampler,
    /// Tokens to generate at most.
    pub max_new: usize,
    /// Go on past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Tokens handed on so far.
    pub gen_tokens: usize,
    /// Why the stream ended (`None`: still generating).
    pub end: Option<End>,
    /// The sampled token not yet handed on.
    next: u32,
}

impl Stream {
    pub fn new(seq: usize, sampler: Sampler, max_new: usize, ignore_eos: bool) -> Stream {
        Stream {
            seq,
            sampler,
            max_new,
            ignore_eos,
            gen_tokens: 0,
            end: None,
            next: 0,
        }
    }

    /// Evaluate `prompt` on this stream's sequence after what it already holds (in
    /// passes of the session's `n_batch`) and sample the first token.
    ///
    /// # Errors
    /// The sequence does not exist, the prompt does not fit it, or a pass fails.
    pub fn start<P: Platform>(
        &mut self,
        p: &P,
        sess: &mut Session<'_, '_>,
        prompt: &[u32],
    ) -> Result<(), ModelError> {
        sess.select_seq(self.seq)?;
        for &t in prompt {
            self.sampler.accept(t);
        }
        let nb = sess.opts.n_batch.max(1);
        let (sampler, next) = (&mut self.sampler, &mut self.next);
        for (k, part) in prompt.chunks(nb).enumerate() {
            let last = (k + 1) * nb >= prompt.len();
            let which = if last { Logits::Last } else { Logits::None };
            sess.eval(p, part, which, &mut |_, l| *next = sampler.sample(l))?;
        }
        if prompt.is_empty() {
            self.end = Some(End::Length);
        }
        Ok(())
    }

    /// Hand the pending token on (`on_token(id, bytes)`, false: stop), or end the stream.
    /// True when it goes on to another pass.
    fn emit(&mut self, tok: &Tokenizer<'_>, on_token: &mut dyn FnMut(u32, &[u8]) -> bool) -> bool {
        let id = self.next;
        let end = if self.gen_tokens >= self.max_new {
            Some(End::Length)
        } else if tok.is_eog(id) && !self.ignore_eos {
            Some(End::Eos)
        } else {
            let go = on_token(id, tok.token_bytes(id));
            self.gen_tokens += 1;
            self.sampler.accept(id);
            if !go {
                Some(End::Sink)
            } else if self.gen_tokens == self.max_new {
                Some(End::Length)
            } else {
                None
            }
        };
        self.end = end;
        end.is_none()
    }
}

/// One step of every live stream: its pending token is handed on
/// (`on_token(stream index, id, bytes)`), then the streams that go on are decoded in one
/// pass and their next tokens sampled. Returns the streams still live.
///
/// # Errors
/// More than [`MAX_SEQS`] streams, two on one sequence, or a failed pass.
pub fn step<P: Platform>(
    p: &P,
    sess: &mut Session<'_, '_>,
    tok: &Tokenizer<'_>,
    streams: &mut [Stream],
    on_token: &mut dyn FnMut(usize, u32, &[u8]) -> bool,
) -> Result<usize, ModelError> {
    let n_ctx = sess.opts.n_ctx;
    let mut rows: heapless::Vec<(usize, u32), MAX_SEQS> = heapless::Vec::new();
    let mut owner: heapless::Vec<usize, MAX_SEQS> = heapless::Vec::new();
    for (k, s) in streams.iter_mut().enumerate() {
        if s.end.is_some() || !s.emit(tok, &mut |id, b| on_token(k, id, b)) {
            continue;
        }
        if sess.n_past_of(s.seq) >= n_ctx {
            s.end = Some(End::ContextFull);
            continue;
        }
        if rows.push((s.seq, s.next)).is_err() || owner.push(k).is_err() {
            return Err(ModelError::BadSeq {
                seq: s.seq,
                n_seq: MAX_SEQS,
            });
        }
    }
    sess.decode_seqs(p, &rows, &mut |r, l| {
        let s = &mut streams[owner[r]];
        s.next = s.sampler.sample(l);
    })?;
    Ok(rows.len())
}
