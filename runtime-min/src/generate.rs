//! The generation driver that `pinch run`, `pinch chat` and `pinch serve` share: the
//! prompt evaluated in weight passes of `n_batch` tokens, then one token at a time
//! sampled, handed to a [`Sink`] and fed back, until an end-of-generation token, the
//! token limit, a full context, the memory guard or the sink ends it.
//!
//! The driver owns the order of things (what is checked before which pass), so the three
//! commands stop for the same reasons at the same token. What differs between them is the
//! sink: `run` prints, `chat` prints and keeps the cache, the server writes events or
//! buffers the answer and polls its sockets between passes ([`Sink::prompt_batch`],
//! [`Sink::token`]).
//!
//! With a [`Drafter`] (`--draft N`, speculative decoding), a pass feeds the newest token
//! and up to N tokens drafted from the text so far (`crate::draft`); the drafted tokens
//! the sampler agrees with are handed to the sink in order, each through the same checks
//! as a token of its own, and the cache is cut back after the last one kept (which is
//! where plain decoding would stand: the commands see the same tokens, stops and cache).
//! Greedy output is that of plain decoding; sampled output is distributed alike, as
//! each position is sampled once from its own logits by [`Sampler::sample_with_draft`]
//! with a draft fixed before the pass. The memory guard is checked once per pass.
//!
//! [`Adjust`] applies llama-server's `logit_bias` on a copy of the logits, before the
//! sampler (as llama.cpp's chain starts with it; the penalties, presence and frequency
//! included, are the sampler's next step); the sink sees the raw logits (log-probabilities are reported from the model's own
//! distribution, as llama-server and OpenAI do).
use crate::commands::{secs, AppError};
use crate::draft::{Drafter, PromptLookup, MAX_DRAFT};
use crate::grammar::{Matcher, SortedVocab};
use crate::guard::{GuardStop, MemoryGuard};
use crate::model::config::MixerKind;
use crate::model::{Config, Logits, Session};
use crate::platform::Platform;
use crate::sampler::Sampler;
use crate::tokenizer::Tokenizer;

/// Most `logit_bias` entries per request.
pub const MAX_BIAS: usize = 256;

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// An end-of-generation token was sampled (and not given to the sink).
    Eos,
    /// The token limit was reached.
    Length,
    /// The context is full.
    ContextFull,
    /// The memory guard stopped it (before the prompt when no prompt token ran).
    Stopped(GuardStop),
    /// The sink asked to stop (a stop string, a client that went away).
    Sink,
}

/// Statistics of one generation.
#[derive(Clone, Copy, Debug)]
pub struct GenStats {
    /// Tokens of the prompt evaluated by this call (0 when the guard stopped it first).
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub prompt_s: f64,
    pub gen_s: f64,
    pub end: End,
    /// The memory guard ended the generation early.
    pub stopped: Option<GuardStop>,
    /// What weight streaming read during the generation (after the prompt).
    pub stream: crate::model::stream::StreamStats,
    /// Bytes the OS fetched from storage for this process during the generation.
    pub os_read_bytes: Option<u64>,
    /// What the expert pager did during the generation (MoE models).
    pub experts: crate::pager::PagerStats,
    /// Weight passes of the generation (one per token without drafts).
    pub passes: usize,
    /// Passes that verified a draft, drafted tokens, and how many of them were
    /// accepted (kept in the cache: one the generation ended on is not counted).
    pub drafts: usize,
    pub drafted: usize,
    pub accepted: usize,
}

impl Default for GenStats {
    fn default() -> Self {
        GenStats {
            prompt_tokens: 0,
            gen_tokens: 0,
            prompt_s: 0.0,
            gen_s: 0.0,
            end: End::Length,
            stopped: None,
            stream: Default::default(),
            os_read_bytes: None,
            experts: Default::default(),
            passes: 0,
            drafts: 0,
            drafted: 0,
            accepted: 0,
        }
    }
}

impl GenStats {
    pub fn prompt_tps(&self) -> f64 {
        per_second(self.prompt_tokens, self.prompt_s)
    }
    pub fn gen_tps(&self) -> f64 {
        per_second(self.gen_tokens, self.gen_s)
    }
    /// Share of the drafted tokens the sampler kept (0 without drafts).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// `n / s`, 0 when no time passed.
pub fn per_second(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// Where generated tokens go.
pub trait Sink {
    /// After each weight pass of the prompt: `done` of the `total` tokens of this call
    /// are evaluated. False stops the generation before any token.
    fn prompt_batch(&mut self, _done: usize, _total: usize) -> bool {
        true
    }
    /// The next token `id` was sampled by `sampler` from `used` (the raw `logits`
    /// after the request's adjustments and the grammar's mask).
    fn sampled(&mut self, _logits: &[f32], _used: &[f32], _sampler: &mut Sampler, _id: u32) {}
    /// A generated token and its text bytes. False stops after it (it is not fed back).
    fn token(&mut self, id: u32, bytes: &[u8]) -> bool;
}

/// A sink made of a closure that takes every token.
pub struct Emit<F: FnMut(u32, &[u8])>(pub F);

impl<F: FnMut(u32, &[u8])> Sink for Emit<F> {
    fn token(&mut self, id: u32, bytes: &[u8]) -> bool {
        (self.0)(id, bytes);
        true
    }
}

/// `logit_bias`, applied to a copy of the logits in `scratch` (`n_vocab` long, lent by
/// the caller) before sampling.
pub struct Adjust<'b> {
    /// (token, bias); `f32::NEG_INFINITY` bans the token.
    pub bias: heapless::Vec<(u32, f32), MAX_BIAS>,
    pub scratch: &'b mut [f32],
}

impl<'b> Adjust<'b> {
    pub fn new(scratch: &'b mut [f32]) -> Self {
        Adjust {
            bias: heapless::Vec::new(),
            scratch,
        }
    }

    /// Whether anything would change the logits.
    pub fn is_active(&self) -> bool {
        !self.bias.is_empty()
    }

    /// The adjusted logits (`logits` itself when nothing changes them or the scratch is
    /// shorter than the vocabulary).
    pub fn apply<'l>(&'l mut self, logits: &'l [f32]) -> &'l [f32] {
        if !self.is_active() || self.scratch.len() < logits.len() {
            return logits;
        }
        let out = &mut self.scratch[..logits.len()];
        out.copy_from_slice(logits);
        for &(id, b) in self.bias.iter() {
            if let Some(l) = out.get_mut(id as usize) {
                *l += b;
            }
        }
        out
    }
}

/// A grammar the generated text must follow (`grammar`, `json_schema`,
/// `--grammar-file`): the sampled token is checked against it, and only when the
/// grammar refuses it are all the tokens it refuses masked (into `scratch`) and the
/// token sampled again from what is left. That is the masked distribution exactly
/// (a token the grammar allows is drawn with probability p/A either way) at the cost of
/// one token check in the common case.
pub struct Constrain<'c> {
    pub matcher: &'c mut Matcher<'c, 'c>,
    pub vocab: &'c SortedVocab<'c>,
    /// One vocabulary's worth of logits.
    pub scratch: &'c mut [f32],
    /// Steps that needed the full mask (for the statistics).
    pub masked: usize,
}

impl<'c> Constrain<'c> {
    pub fn new(
        matcher: &'c mut Matcher<'c, 'c>,
        vocab: &'c SortedVocab<'c>,
        scratch: &'c mut [f32],
    ) -> Self {
        Constrain {
            matcher,
            vocab,
            scratch,
            masked: 0,
        }
    }
}

/// How one generation is sampled and bounded.
pub struct Settings<'s, 'b, 'd, 'c> {
    pub sampler: &'s mut Sampler,
    pub guard: &'s mut MemoryGuard,
    pub adjust: Option<&'s mut Adjust<'b>>,
    /// Tokens to generate at most.
    pub max_new: usize,
    /// Go on past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Evaluate the last generated token too, so the cache holds the whole answer (chat
    /// goes on from it; `run` keeps its timings as they were). The server skips that
    /// pass.
    pub feed_last: bool,
    /// Speculative decoding with prompt-lookup drafts (`--draft N`); `None`: off
    /// (and off under a grammar).
    pub draft: Option<&'s mut Drafter<'d>>,
    /// The grammar the output follows; `None`: free text.
    pub grammar: Option<&'s mut Constrain<'c>>,
}

/// Sample the next token from `logits` (after the request's adjustments); where a
/// draft proposed a token, through [`Sampler::sample_with_draft`], which keeps the
/// distribution of plain sampling (and greedy picks are the same).
pub fn pick(
    s: &mut Settings<'_, '_, '_, '_>,
    tok: &Tokenizer<'_>,
    sink: &mut dyn Sink,
    logits: &[f32],
    draft: Option<u32>,
) -> u32 {
    let sampler = &mut *s.sampler;
    let mut sample = |l: &[f32]| match draft {
        Some(d) => sampler.sample_with_draft(l, d),
        None => sampler.sample(l),
    };
    let adjusted = match s.adjust.as_deref_mut() {
        Some(a) => a.apply(logits),
        None => logits,
    };
    let mut id = sample(adjusted);
    let mut used = adjusted;
    if let Some(c) = s.grammar.as_deref_mut() {
        if !c.matcher.allows_token(tok, id) && c.scratch.len() >= adjusted.len() {
            let masked = &mut c.scratch[..adjusted.len()];
            masked.copy_from_slice(adjusted);
            c.masked += 1;
            id = match c.matcher.mask(tok, c.vocab, masked) {
                // Nothing can follow (the buffers ran out on every token): end here.
                0 => tok.eog_ids().first().copied().unwrap_or(id),
                _ => sample(masked),
            };
            used = masked;
        }
    }
    sink.sampled(logits, used, sampler, id);
    id
}

/// Hand `id` (just sampled) to the sink and make it part of the text, or say why the
/// generation ends instead: an end-of-generation token (not handed on), the sink's
/// wish, or the token limit without `feed_last`.
pub fn emit(
    s: &mut Settings<'_, '_, '_, '_>,
    tok: &Tokenizer<'_>,
    sink: &mut dyn Sink,
    st: &mut GenStats,
    id: u32,
) -> Option<End> {
    if st.gen_tokens >= s.max_new {
        return Some(End::Length);
    }
    if tok.is_eog(id) && !s.ignore_eos {
        return Some(End::Eos);
    }
    // Under a grammar: a token it refuses (only when nothing else was left) ends the
    // text, and so does a text the grammar allows nothing after.
    let mut complete = false;
    if let Some(c) = s.grammar.as_deref_mut() {
        if !c.matcher.accept(tok.token_bytes(id)) {
            return Some(End::Eos);
        }
        complete = c.matcher.only_end();
    }
    let go = sink.token(id, tok.token_bytes(id));
    st.gen_tokens += 1;
    s.sampler.accept(id);
    if let Some(d) = s.draft.as_deref_mut() {
        d.push(id);
    }
    if !go {
        return Some(End::Sink);
    }
    if complete {
        return Some(End::Eos);
    }
    if st.gen_tokens == s.max_new && !s.feed_last {
        return Some(End::Length);
    }
    None
}

/// Tokens a prompt-lookup draft proposes when `--draft` is not given and the plan
/// streams weights.
pub const DEFAULT_DRAFT: usize = 8;

/// Tokens `run`, `chat` and `serve` draft (0: no speculative decoding; other commands
/// never draft): `--draft N`, by default [`DEFAULT_DRAFT`] when the plan streams weights
/// (`streams`: a pass then costs about the same for several tokens as for one) and off
/// when all are resident (rejected drafts would cost compute). Models with recurrent
/// layers take their state back to the last kept token from a copy and a log of the
/// pass (`Session::eval_draft`); that copy takes budget from resident weights (a
/// Qwen3.5-0.8B shape at `--budget 250M`: 7 instead of 11 layers resident, 404.9
/// instead of 357.6 MiB streamed per pass), so for them drafts are on only with
/// `--draft N`. With `--state-f16`, whose matrices round once per pass, drafts are off,
/// with a message.
pub fn draft_len<P: Platform>(p: &P, o: &crate::cli::Opts, cfg: &Config, streams: bool) -> usize {
    use crate::cli::Command;
    if !matches!(o.command, Command::Run | Command::Chat | Command::Serve) {
        return 0;
    }
    let recurrent = (0..cfg.n_layer).any(|il| cfg.layer(il).mixer != MixerKind::Attention);
    let n = o
        .draft
        .unwrap_or(if streams && !recurrent {
            DEFAULT_DRAFT
        } else {
            0
        })
        .min(MAX_DRAFT);
    if n > 0 && recurrent && o.state_f16 {
        if o.draft.is_some() || o.verbose {
            let mut err = crate::commands::out::Out::stderr(p);
            let _ = core::fmt::Write::write_str(
                &mut err,
                "pinch: --draft: with --state-f16 the recurrent state is rounded once per \
                 pass, so a verified draft would not give plain decoding's state; \
                 speculative decoding is off\n",
            );
        }
        return 0;
    }
    n
}

/// The drafter for `n` drafted tokens (`None` for 0), its history (the context's length
/// in tokens) lent by `arena`.
///
/// # Errors
/// The arena is too small for the history.
pub fn drafter<'a>(
    n: usize,
    n_ctx: usize,
    arena: &mut crate::arena::Arena<'a>,
) -> Result<Option<Drafter<'a>>, AppError> {
    if n == 0 {
        return Ok(None);
    }
    let hist = arena.slice::<u32>("draft history", n_ctx)?;
    let lookup = PromptLookup {
        max_draft: n,
        ..PromptLookup::default()
    };
    Ok(Some(Drafter::new(lookup, hist)))
}

/// The prompt part of a generation: `prompt`'s tokens go into the sampler's and the
/// adjustments' history, the guard is checked, the prompt is evaluated at the selected
/// sequence's position in passes of `n_batch` tokens, and the first token is sampled
/// from the last logits. `None` when the guard or the sink stopped it (`st.end` says
/// which); `st.prompt_s` is set either way.
///
/// # Errors
/// The model's error when a pass fails.
pub fn begin<P: Platform>(
    p: &P,
    tok: &Tokenizer<'_>,
    sess: &mut Session<'_, '_>,
    s: &mut Settings<'_, '_, '_, '_>,
    prompt: &[u32],
    sink: &mut dyn Sink,
    st: &mut GenStats,
) -> Result<Option<u32>, AppError> {
    for &t in prompt {
        s.sampler.accept(t);
    }
    let nb = sess.opts.n_batch.max(1);
    let mut next = 0u32;
    let t0 = p.now_ns();
    if let Err(g) = s.guard.watch(p, &mut || sess.give_back(p)) {
        st.prompt_tokens = 0;
        st.stopped = Some(g);
        st.end = End::Stopped(g);
        return Ok(None);
    }
    let mut start = 0;
    while start < prompt.len() {
        let end = (start + nb).min(prompt.len());
        let which = if end == prompt.len() {
            Logits::Last
        } else {
            Logits::None
        };
        sess.eval(p, &prompt[start..end], which, &mut |_, l| {
            next = pick(s, tok, sink, l, None)
        })?;
        start = end;
        if !sink.prompt_batch(end, prompt.len()) {
            st.prompt_s = secs(t0, p.now_ns());
            st.end = End::Sink;
            return Ok(None);
        }
    }
    st.prompt_s = secs(t0, p.now_ns());
    Ok(Some(next))
}

/// Evaluate `prompt` at the session's current position (in passes of the session's
/// `n_batch` tokens) and generate up to `s.max_new` tokens into `sink`. The guard is
/// checked before the prompt and before each token's pass.
///
/// # Errors
/// The model's error when a pass fails (a token id out of range, a full context for
/// the prompt, a streaming read error).
pub fn generate<P: Platform>(
    p: &P,
    tok: &Tokenizer<'_>,
    sess: &mut Session<'_, '_>,
    mut s: Settings<'_, '_, '_, '_>,
    prompt: &[u32],
    sink: &mut dyn Sink,
) -> Result<GenStats, AppError> {
    let mut st = GenStats {
        prompt_tokens: prompt.len(),
        ..Default::default()
    };
    if s.grammar.is_some() || !sess.can_verify_drafts() {
        // Drafted tokens would have to be checked against the grammar too; a recurrent
        // model without a draft point could not take its state back.
        s.draft = None;
    }
    let n_ctx = sess.opts.n_ctx;
    let nb = sess.opts.n_batch.max(1);
    let Some(mut next) = begin(p, tok, sess, &mut s, prompt, sink, &mut st)? else {
        return Ok(st);
    };
    let t1 = p.now_ns();
    let s0 = sess.stream;
    let io0 = p.storage_read_bytes();
    let x0 = sess.experts().map(|x| x.total()).unwrap_or_default();
    st.end = End::Length;
    if let Some(d) = s.draft.as_deref_mut() {
        d.start(prompt);
    }
    let mut draft = [0u32; MAX_DRAFT];
    loop {
        if let Some(end) = emit(&mut s, tok, sink, &mut st, next) {
            st.end = end;
            break;
        }
        // Reached only with `feed_last`: the last token is fed, then the loop ends.
        let last = st.gen_tokens >= s.max_new;
        if sess.n_past() >= n_ctx {
            if !last {
                st.end = End::ContextFull;
            }
            break;
        }
        if let Err(g) = s.guard.watch(p, &mut || sess.give_back(p)) {
            st.stopped = Some(g);
            st.end = End::Stopped(g);
            break;
        }
        // Drafted tokens: never more than fit the context and the batch, and fewer than
        // the tokens still to generate, so that the pass always ends on a token of the
        // sampler's own (the next `next`) and the limit is handled above.
        let room = (n_ctx - sess.n_past() - 1)
            .min(nb - 1)
            .min((s.max_new - st.gen_tokens).saturating_sub(1));
        let k = match s.draft.as_deref() {
            Some(d) if !last => d.draft_after(sess, p, next, &mut draft[..room.min(MAX_DRAFT)])?,
            _ => 0,
        };
        let mut feed = [0u32; MAX_DRAFT + 1];
        feed[0] = next;
        feed[1..=k].copy_from_slice(&draft[..k]);
        let start = sess.n_past();
        let accepted0 = st.accepted;
        // Position (index into `feed`) of the first token the cache does not keep.
        let mut keep = k + 1;
        let mut ended = None;
        let mut on_logits = |i: usize, l: &[f32]| {
            if keep <= k {
                return;
            }
            let t = pick(&mut s, tok, sink, l, draft[..k].get(i).copied());
            if i < k && t == draft[i] {
                // The drafted token is already at position `i + 1` of this pass.
                match emit(&mut s, tok, sink, &mut st, t) {
                    None => st.accepted += 1,
                    Some(end) => {
                        ended = Some(end);
                        keep = i + 1;
                    }
                }
            } else {
                next = t;
                keep = i + 1;
            }
        };
        sess.eval_draft(p, &feed[..=k], &mut on_logits)?;
        st.passes += 1;
        if let Some(d) = s.draft.as_deref_mut() {
            d.after_pass(k, (st.accepted - accepted0).min(k));
        }
        if k > 0 {
            st.drafts += 1;
            st.drafted += k;
            // Forget the rejected drafts (their KV rows are overwritten later; recurrent
            // states are taken back to the last kept token).
            sess.rewind_draft(start + keep)?;
        }
        if let Some(end) = ended {
            st.end = end;
            break;
        }
        if last {
            break;
        }
    }
    st.gen_s = secs(t1, p.now_ns());
    st.stream = sess.stream.since(&s0);
    st.experts = sess
        .experts()
        .map(|x| x.total().since(&x0))
        .unwrap_or_default();
    st.os_read_bytes = io0
        .zip(p.storage_read_bytes())
        .map(|(a, b)| b.saturating_sub(a));
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_adds_and_bans() {
        let mut scratch = [0.0f32; 4];
        let mut a = Adjust::new(&mut scratch);
        let logits = [1.0f32, 2.0, 3.0, 4.0];
        assert!(!a.is_active());
        assert_eq!(a.apply(&logits), &logits);
        a.bias.push((3, f32::NEG_INFINITY)).unwrap();
        a.bias.push((0, 0.5)).unwrap();
        let out = a.apply(&logits);
        assert_eq!(out, [1.5, 2.0, 3.0, f32::NEG_INFINITY]);
    }
}
