//! Speculative decoding with drafts every model can make: prompt lookup.
//!
//! When weights stream from flash, a weight pass costs about the same for one token as
//! for several, so checking a few guessed tokens in one batched pass is nearly free.
//! The guess: the longest recent n-gram of the text so far (prompt and answer) that
//! occurred before, continued by what followed it there — summaries, quotes and code
//! edits repeat their context. [`verify`] feeds `[last, draft...]` in one pass, keeps
//! the drafted tokens the sampler agrees with ([`Sampler::sample_with_draft`]: greedy
//! output is identical to plain greedy decoding, sampled output is distributed exactly
//! as plain sampling) and returns the session to the last position it keeps.
use crate::model::{ModelError, Session};
use crate::platform::Platform;
use crate::sampler::Sampler;

/// Most tokens one draft proposes.
pub const MAX_DRAFT: usize = 16;

/// Prompt-lookup drafting settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// Longest n-gram matched (tried first), and shortest.
    pub max_ngram: usize,
    pub min_ngram: usize,
    /// Most tokens drafted (`--draft N`).
    pub max_draft: usize,
}

impl Default for PromptLookup {
    fn default() -> Self {
        PromptLookup {
            max_ngram: 4,
            min_ngram: 2,
            max_draft: 8,
        }
    }
}

impl PromptLookup {
    /// Draft up to `max_draft` tokens continuing `history`: for n from `max_ngram` down
    /// to `min_ngram`, the most recent earlier occurrence of the last n tokens, and the
    /// tokens that followed it. Returns how many were written to `out` (0: no match).
    pub fn draft(&self, history: &[u32], out: &mut [u32]) -> usize {
        let want = self.max_draft.min(out.len()).min(MAX_DRAFT);
        let len = history.len();
        if want == 0 {
            return 0;
        }
        for n in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            if n >= len {
                continue;
            }
            let tail = &history[len - n..];
            // Most recent earlier start of `tail` (the occurrence that is the suffix
            // itself is excluded: it has nothing after it).
            for start in (0..len - n).rev() {
                if &history[start..start + n] == tail {
                    let from = start + n;
                    let k = want.min(len - from);
                    out[..k].copy_from_slice(&history[from..from + k]);
                    return k;
                }
            }
        }
        0
    }
}

/// The draft source of one command: the lookup settings and the history it searches
/// (the prompt of the current call and the tokens generated since), in a buffer lent
/// from the arena. [`crate::generate::generate`] fills it and drafts from it.
pub struct Drafter<'b> {
    pub lookup: PromptLookup,
    /// Draft with the model's MTP block instead (`Session::mtp_draft`), stopping at a
    /// guess less likely than this; `None`: prompt lookup.
    pub mtp_p_min: Option<f32>,
    /// MTP drafts: tokens the next draft may have ([`Self::after_pass`] adapts it).
    mtp_len: usize,
    /// Passes since the last MTP draft while `mtp_len` is 0.
    mtp_idle: usize,
    hist: &'b mut [u32],
    len: usize,
}

/// While MTP drafts keep being rejected, one token is drafted every this many passes
/// (to notice when the block starts guessing right again).
pub const MTP_PROBE_EVERY: usize = 8;

impl<'b> Drafter<'b> {
    /// A drafter whose history holds up to `hist.len()` tokens (older ones are dropped,
    /// half the buffer at a time, when it fills).
    pub fn new(lookup: PromptLookup, hist: &'b mut [u32]) -> Self {
        Drafter {
            lookup,
            mtp_p_min: None,
            mtp_len: lookup.max_draft,
            mtp_idle: 0,
            hist,
            len: 0,
        }
    }

    /// Start a new history with `prompt` (its last `hist.len()` tokens).
    pub fn start(&mut self, prompt: &[u32]) {
        self.len = 0;
        let from = prompt.len().saturating_sub(self.hist.len());
        for &t in &prompt[from..] {
            self.push(t);
        }
    }

    /// Append a token that is now part of the text.
    pub fn push(&mut self, t: u32) {
        if self.hist.is_empty() {
            return;
        }
        if self.len == self.hist.len() {
            let half = self.len / 2;
            self.hist.copy_within(half.., 0);
            self.len -= half;
        }
        self.hist[self.len] = t;
        self.len += 1;
    }

    /// The history so far.
    pub fn history(&self) -> &[u32] {
        &self.hist[..self.len]
    }

    /// Draft up to `out.len()` tokens continuing the history ([`PromptLookup::draft`]).
    pub fn draft(&self, out: &mut [u32]) -> usize {
        self.lookup.draft(self.history(), out)
    }

    /// Draft up to `out.len()` (and `--draft N`) tokens after `last`, the newest token,
    /// which `sess` has not evaluated yet: from the model's MTP block when this drafter
    /// uses it, else from the history.
    ///
    /// # Errors
    /// The session's, from the MTP block's pass.
    pub fn draft_after<P: Platform>(
        &self,
        sess: &mut Session<'_, '_>,
        p: &P,
        last: u32,
        out: &mut [u32],
    ) -> Result<usize, ModelError> {
        let want = out.len().min(self.lookup.max_draft).min(MAX_DRAFT);
        match self.mtp_p_min {
            Some(p_min) => {
                let n = self.mtp_next_len().min(want);
                sess.mtp_draft(p, last, p_min, &mut out[..n])
            }
            None => Ok(self.draft(out)),
        }
    }

    /// Most tokens the next MTP draft may have: each guess costs a pass of the block and
    /// the LM head, so fewer while they are rejected ([`Self::after_pass`]), and at 0 a
    /// probe of one every [`MTP_PROBE_EVERY`] passes.
    pub fn mtp_next_len(&self) -> usize {
        match self.mtp_len {
            0 if self.mtp_idle + 1 >= MTP_PROBE_EVERY => 1,
            n => n,
        }
    }

    /// What the pass that verified the latest draft kept: `accepted` of `drafted`
    /// tokens. MTP drafts grow by one after a fully accepted draft, halve after a
    /// rejected first guess, and stay off (but for a probe every [`MTP_PROBE_EVERY`]
    /// passes) at 0. Which tokens are drafted never changes what is sampled (greedy
    /// output stays plain decoding's, sampling keeps its distribution): only the cost.
    pub fn after_pass(&mut self, drafted: usize, accepted: usize) {
        if self.mtp_p_min.is_none() {
            return;
        }
        if drafted == 0 {
            self.mtp_idle += 1;
            return;
        }
        self.mtp_idle = 0;
        let max = self.lookup.max_draft.min(MAX_DRAFT);
        if accepted == drafted {
            self.mtp_len = (self.mtp_len.max(accepted) + 1).min(max);
        } else if accepted == 0 {
            self.mtp_len /= 2;
        }
    }
}

/// What one speculative step produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// Tokens produced (accepted draft tokens, then the sampler's own next token).
    pub produced: usize,
    /// Of those, how many were drafted.
    pub accepted: usize,
}

/// Feed `last` (the newest token, not yet evaluated) and `draft` in one pass, keep the
/// drafted tokens the sampler agrees with, in order, and the sampler's token at the
/// first disagreement (or after the whole draft). The produced tokens go to `out`
/// (at least `draft.len() + 1` long) and are `accept`ed by the sampler; the session ends
/// at the position after the last kept drafted token, so the last produced token is
/// the next `last`.
///
/// # Errors
/// The session's errors; `ModelError::TruncateRecurrent` for a model with recurrent
/// layers whose session keeps no draft point (`Session::keep_draft_point`).
pub fn verify<P: Platform>(
    sess: &mut Session<'_, '_>,
    p: &P,
    sampler: &mut Sampler,
    last: u32,
    draft: &[u32],
    out: &mut [u32],
) -> Result<Step, ModelError> {
    let k = draft.len().min(MAX_DRAFT).min(out.len().saturating_sub(1));
    let mut feed = [0u32; MAX_DRAFT + 1];
    feed[0] = last;
    feed[1..=k].copy_from_slice(&draft[..k]);
    let start = sess.n_past();
    let mut produced = 0;
    let mut accepted = 0;
    let mut open = true;
    sess.eval_draft(p, &feed[..=k], &mut |i, logits| {
        if !open {
            return;
        }
        let t = match draft.get(i) {
            Some(&d) if i < k => sampler.sample_with_draft(logits, d),
            _ => sampler.sample(logits),
        };
        sampler.accept(t);
        out[produced] = t;
        produced += 1;
        if i < k && t == draft[i] {
            accepted += 1;
        } else {
            open = false;
        }
    })?;
    // Keep `last` and the accepted drafts; the rows of the rejected ones are overwritten
    // (recurrent states are taken back).
    sess.rewind_draft(start + 1 + accepted)?;
    Ok(Step { produced, accepted })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_what_followed_the_longest_recent_match() {
        let d = PromptLookup {
            max_ngram: 3,
            min_ngram: 1,
            max_draft: 4,
        };
        let mut out = [0u32; 8];
        // "1 2 3 4 5 ... 1 2 3" -> "4 5 6 7"
        let h = [1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3];
        assert_eq!(d.draft(&h, &mut out), 4);
        assert_eq!(&out[..4], &[4, 5, 6, 7]);
        // The most recent occurrence wins, and a draft stops at the end of the history.
        let h = [5, 1, 8, 5, 1, 9, 5, 1];
        assert_eq!(d.draft(&h, &mut out), 3);
        assert_eq!(&out[..3], &[9, 5, 1]);
        // Longer n-grams first: "7 1" matches at the end, beating the "1" seen later.
        let h = [7, 1, 4, 4, 1, 6, 7, 1];
        assert_eq!(d.draft(&h, &mut out), 4);
        assert_eq!(&out[..4], &[4, 4, 1, 6]);
    }

    #[test]
    fn drafter_history_keeps_the_newest_tokens() {
        let mut buf = [0u32; 4];
        let mut d = Drafter::new(PromptLookup::default(), &mut buf);
        d.start(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(d.history(), &[3, 4, 5, 6]);
        d.push(7);
        assert_eq!(d.history(), &[5, 6, 7]);
        d.start(&[9]);
        assert_eq!(d.history(), &[9]);
        let mut empty: [u32; 0] = [];
        let mut d = Drafter::new(PromptLookup::default(), &mut empty);
        d.start(&[1, 2, 1, 2]);
        d.push(1);
        assert_eq!(d.draft(&mut [0; 4]), 0);
    }

    #[test]
    fn mtp_draft_length_follows_acceptance() {
        let mut buf = [0u32; 4];
        let lookup = PromptLookup {
            max_draft: 6,
            ..PromptLookup::default()
        };
        let mut d = Drafter::new(lookup, &mut buf);
        d.after_pass(3, 0); // lookup drafts: nothing adapts
        assert_eq!(d.mtp_next_len(), 6);
        d.mtp_p_min = Some(0.0);
        d.after_pass(6, 2); // some kept: unchanged
        assert_eq!(d.mtp_next_len(), 6);
        for want in [3, 1, 0] {
            d.after_pass(d.mtp_next_len(), 0);
            assert_eq!(d.mtp_next_len(), want);
        }
        // Off: a one-token probe every MTP_PROBE_EVERY passes.
        let mut probes = 0;
        for _ in 0..3 * MTP_PROBE_EVERY {
            let n = d.mtp_next_len();
            probes += n;
            d.after_pass(n, 0);
        }
        assert_eq!(probes, 3);
        // A kept probe brings drafts back, one more token per fully kept draft.
        while d.mtp_next_len() == 0 {
            d.after_pass(0, 0);
        }
        d.after_pass(1, 1);
        assert_eq!(d.mtp_next_len(), 2);
        d.after_pass(2, 2);
        d.after_pass(3, 3);
        assert_eq!(d.mtp_next_len(), 4);
        for _ in 0..5 {
            let n = d.mtp_next_len();
            d.after_pass(n, n);
        }
        assert_eq!(d.mtp_next_len(), 6);
    }

    #[test]
    fn no_match_no_draft() {
        let d = PromptLookup::default();
        let mut out = [0u32; 8];
        assert_eq!(d.draft(&[1, 2, 3, 4, 5], &mut out), 0);
        assert_eq!(d.draft(&[], &mut out), 0);
        assert_eq!(d.draft(&[3, 3], &mut out), 0); // min_ngram 2: "3 3" has no earlier start
        let one = PromptLookup { min_ngram: 1, ..d };
        assert_eq!(one.draft(&[3, 3], &mut out), 1);
        assert_eq!(out[0], 3);
    }
}
