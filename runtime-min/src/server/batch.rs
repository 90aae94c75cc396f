//! `pinch serve --parallel N`: the server loop that answers up to N generation requests
//! together (continuous batching). Each running request holds a generation slot: a
//! [`Lane`] of buffers, one session sequence with its cached tokens ([`SeqCache`],
//! `n_ctx / N` positions, see `commands::session_options`), and the state of its
//! current answer. Between steps the loop polls the connections, starts queued
//! requests in free slots (their prompt evaluated on their own sequence, the server
//! polled between its passes) and finishes answers; each step then decodes the next
//! token of every running answer in one weight pass ([`slots::step`]).
//!
//! A request is prepared, answered and sent by the same functions as with one slot
//! (`answer::open`, `start_answer`, `end_answer`, `close`), and sampled
//! through the same driver steps ([`crate::generate`]), so an answer is token for token
//! the one it gets alone (`runtime-linux/tests/server_parallel.rs`). What differs:
//! no drafts (a pass holds one token of each answer).
//!
//! Constrained answers (`grammar`, `response_format`, `json_schema`, forced tool calls)
//! are batched like the others: each lane has its own parsed grammar, matcher buffers
//! and mask ([`super::constrain::SlotGrammar`], carved at start and counted in the
//! memory plan), and each answer keeps where its matcher stands between steps
//! ([`Answer::grammar`]); a step lends each lane's buffers out, resumes the matcher,
//! samples through it and saves it again. Only the sorted vocabulary (read-only) and
//! the parser's scratch (used while a request is prepared) are shared.
use super::answer::{self as gen, Answer, Job, ServeSink};
use super::constrain::SlotGrammar;
use super::gen::{Bufs, Lane, SeqCache, Setup};
use super::slots::{self, Stream, Turn};
use super::{GenSlot, Io};
use crate::commands::Ctx;
use crate::generate::{Constrain, End, Settings};
use crate::grammar::{Matcher, SortedVocab};
use crate::guard::MemoryGuard;
use crate::model::forward::MAX_SEQS;
use crate::platform::Platform;

/// A request that holds a generation slot.
struct Running<'a, 's, 'p, P: Platform> {
    job: Job<'s, 'p, P>,
    lane: Lane<'a>,
    seq: SeqCache<'a>,
    /// Always there while the request runs (taken to end it).
    ans: Option<Answer<'a>>,
    stream: Stream,
    guard: MemoryGuard,
    /// The last pass failed: the answer ends with the model's error.
    failed: bool,
}

/// What starting the next answer of a request led to (moved once per answer: its
/// size does not matter).
#[allow(clippy::large_enum_variant)]
enum Next<'a> {
    Run(Answer<'a>, Stream, MemoryGuard),
    /// All answers are done: the response can be sent.
    Done,
    /// The connection was answered with an error or went away.
    Freed,
}

/// Start the next answer of `job`: prompt evaluated, first token sampled (`vocab`: the
/// server's sorted vocabulary, for a grammar's mask).
fn next_answer<'a, 's, 'p, P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    io: &mut Io<'_, 's, 'p, P>,
    job: &mut Job<'s, 'p, P>,
    lane: &mut Lane<'a>,
    seq: &mut SeqCache<'a>,
    vocab: &SortedVocab<'_>,
) -> Next<'a> {
    let Some(mut ans) = gen::start_answer(ctx, job, lane, seq) else {
        return Next::Done;
    };
    let mut guard = MemoryGuard::from_opt(ctx.o.guard);
    match gen::start_stream(ctx, io, job, lane, seq, &mut ans, &mut guard, vocab) {
        Ok(s) => Next::Run(ans, s, guard),
        Err(e) => {
            let _ = e;
            gen::end_answer(ctx, io, job, lane, seq, ans, None);
            Next::Freed
        }
    }
}

/// The index in `seqs` of the free sequence whose cache holds the longest prefix of
/// `prompt` (the first on a tie: the one freed longest ago, as they are pushed back at
/// the end).
fn best_seq(seqs: &[SeqCache<'_>], prompt: &[u32]) -> usize {
    let mut best = (0, 0);
    for (k, s) in seqs.iter().enumerate() {
        let n = s.common_prefix(prompt);
        if n > best.1 {
            best = (k, n);
        }
    }
    best.0
}

/// Serve forever with `lanes.len()` generation slots (`seqs`: one sequence each).
pub fn serve<'a, 's, 'p, P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    setup: Setup<'_>,
    io: &mut Io<'_, 's, 'p, P>,
    bufs: &mut Bufs<'_>,
    mut lanes: heapless::Vec<Lane<'a>, MAX_SEQS>,
    mut seqs: heapless::Vec<SeqCache<'a>, MAX_SEQS>,
) -> ! {
    let p = ctx.p;
    let mut running: heapless::Vec<Running<'a, 's, 'p, P>, MAX_SEQS> = heapless::Vec::new();
    // Idle: sleep 1 ms after activity, backing off to 10 ms (as with one slot).
    let mut idle = 0u32;
    loop {
        let mut busy = io.poll();
        for r in running.iter_mut() {
            if !r.stream.done && io.client_gone(r.job.i) {
                if let Some(a) = r.ans.as_mut() {
                    a.sink.gone = true;
                }
                r.stream.done = true;
                r.stream.st.end = End::Sink;
            }
        }
        // Queued requests into free slots.
        while !lanes.is_empty() {
            let Some(i) = io.start_next() else { break };
            busy = true;
            let Some(mut lane) = lanes.pop() else { break };
            let Some(mut job) = gen::open(ctx, setup, io, bufs, &mut lane, i) else {
                let _ = lanes.push(lane);
                continue;
            };
            let (a, b) = job.first_prompt();
            let mut seq = seqs.swap_remove(best_seq(&seqs, &lane.tokens[a..b]));
            job.set_slot(seq.seq);
            io.gen_slots[seq.seq] = GenSlot {
                task: Some(job.task()),
                n_past: ctx.sess.n_past_of(seq.seq),
                ..Default::default()
            };
            let next = next_answer(ctx, io, &mut job, &mut lane, &mut seq, &bufs.grammar.vocab);
            match next {
                Next::Run(ans, stream, guard) => {
                    let _ = running.push(Running {
                        job,
                        lane,
                        seq,
                        ans: Some(ans),
                        stream,
                        guard,
                        failed: false,
                    });
                    continue;
                }
                Next::Done => gen::close(ctx, setup, io, bufs, &mut lane, job),
                Next::Freed => {}
            }
            io.gen_slots[seq.seq] = GenSlot::default();
            let _ = lanes.push(lane);
            let _ = seqs.push(seq);
        }
        // Answers that ended: the next answer of the request, or its response.
        let mut k = 0;
        while k < running.len() {
            if !running[k].stream.done {
                k += 1;
                continue;
            }
            busy = true;
            let r = &mut running[k];
            let st = (!r.failed).then_some(r.stream.st);
            let go = match r.ans.take() {
                Some(ans) => gen::end_answer(ctx, io, &mut r.job, &mut r.lane, &mut r.seq, ans, st),
                None => false,
            };
            if go {
                let vocab = &bufs.grammar.vocab;
                match next_answer(ctx, io, &mut r.job, &mut r.lane, &mut r.seq, vocab) {
                    Next::Run(ans, stream, guard) => {
                        (r.ans, r.stream, r.guard) = (Some(ans), stream, guard);
                        continue;
                    }
                    Next::Done => {
                        let r = running.swap_remove(k);
                        let (job, mut lane, seq) = (r.job, r.lane, r.seq);
                        gen::close(ctx, setup, io, bufs, &mut lane, job);
                        release(io, &mut lanes, &mut seqs, lane, seq);
                        continue;
                    }
                    Next::Freed => {}
                }
            }
            let r = running.swap_remove(k);
            release(io, &mut lanes, &mut seqs, r.lane, r.seq);
        }
        if running.is_empty() {
            if busy {
                idle = 0;
            } else {
                idle = (idle + 1).min(10);
                p.sleep_ms(idle);
            }
            continue;
        }
        idle = 0;
        step(ctx, io, &mut running, &bufs.grammar.vocab);
    }
}

/// One token of every running answer in one weight pass, each sampled through its own
/// grammar matcher when it has one (`vocab`: the server's sorted vocabulary).
fn step<'a, P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    io: &mut Io<'_, '_, '_, P>,
    running: &mut [Running<'a, '_, '_, P>],
    vocab: &SortedVocab<'_>,
) {
    let tok = ctx.tok;
    // The sinks borrow the lanes: the grammars' buffers are lent out of them for the
    // step (given back below), each matcher resumed where the answer's last step left it.
    let mut grams: heapless::Vec<SlotGrammar<'a>, MAX_SEQS> = running
        .iter_mut()
        .map(|r| core::mem::take(&mut r.lane.grammar))
        .collect();
    // An array (no drop glue): the constraints borrow its matchers for as long as the
    // matchers borrow the grammars.
    let mut lent = running.iter().zip(grams.iter_mut());
    let mut matchers: [Option<(Matcher<'_, '_>, &mut [f32])>; MAX_SEQS] =
        core::array::from_fn(|_| {
            let (r, g) = lent.next()?;
            let at = r.ans.as_ref().and_then(|a| a.grammar)?;
            gen::matcher(&r.job, g, Some(at))
        });
    let mut cons: heapless::Vec<Option<Constrain<'_>>, MAX_SEQS> = matchers
        .iter_mut()
        .map(|m| m.as_mut().map(|m| gen::constrain(m, vocab)))
        .collect();
    let mut sinks: heapless::Vec<ServeSink<'_, '_, '_, '_, '_, '_, P>, MAX_SEQS> =
        heapless::Vec::new();
    let mut parts: heapless::Vec<(&mut Stream, Settings<'_, '_, '_, '_>), MAX_SEQS> =
        heapless::Vec::new();
    for (r, c) in running.iter_mut().zip(cons.iter_mut()) {
        let Running {
            job,
            lane,
            seq,
            ans,
            stream,
            guard,
            ..
        } = r;
        let Some(ans) = ans.as_mut() else { continue };
        let (settings, st) = ans.parts(job.ignore_eos(), guard, c.as_mut());
        let _ = sinks.push(gen::sink(None, job, tok, lane, seq, st));
        let _ = parts.push((stream, settings));
    }
    let mut turns: heapless::Vec<Turn<'_, '_, '_, '_, '_>, MAX_SEQS> = parts
        .into_iter()
        .zip(sinks.iter_mut())
        .map(|((stream, settings), sink)| Turn {
            stream,
            settings,
            sink,
        })
        .collect();
    let got = slots::step(ctx.p, &mut ctx.sess, tok, &mut turns);
    drop(turns);
    drop(sinks);
    for (r, c) in running.iter_mut().zip(cons) {
        if let (Some(a), Some(c)) = (r.ans.as_mut(), c) {
            a.grammar = Some(c.matcher.save());
        }
    }
    for (r, g) in running.iter_mut().zip(grams) {
        r.lane.grammar = g;
    }
    match got {
        Ok(rows) => {
            if rows > 1 {
                io.m.batched_passes += 1;
            }
            io.m.batch_rows_max = io.m.batch_rows_max.max(rows as u64);
        }
        Err(_) => {
            // The pass failed: every running answer ends with the model's error (at
            // the next finishing pass, through `end_answer`'s error path).
            for r in running.iter_mut() {
                r.stream.done = true;
                r.failed = true;
            }
        }
    }
    for r in running.iter_mut() {
        let mut max_new = None;
        if let Some(a) = r.ans.as_mut() {
            io.m.tokens_generated += core::mem::take(&mut a.sink.uncounted);
            max_new = Some(a.max_new);
        }
        let decoded = r.stream.st.gen_tokens;
        io.gen_slots[r.seq.seq] = GenSlot {
            task: Some(r.job.task()),
            n_past: ctx.sess.n_past_of(r.seq.seq),
            n_decoded: decoded,
            n_remain: max_new.map(|m| m.saturating_sub(decoded)),
        };
    }
}

/// Give a slot's buffers and sequence back to the free pools.
fn release<'a, P: Platform>(
    io: &mut Io<'_, '_, '_, P>,
    lanes: &mut heapless::Vec<Lane<'a>, MAX_SEQS>,
    seqs: &mut heapless::Vec<SeqCache<'a>, MAX_SEQS>,
    lane: Lane<'a>,
    seq: SeqCache<'a>,
) {
    io.gen_slots[seq.seq] = GenSlot {
        n_past: seq.n_cached,
        ..Default::default()
    };
    let _ = lanes.push(lane);
    let _ = seqs.push(seq);
}
