//! `pinch run` (generate from a prompt) and `pinch chat` (interactive, chat template).
use core::fmt::Write;

use super::out::{json_str, Mib, Out};
use super::{AppError, Ctx};
use crate::chat::{ChatMessage, ChatTemplate};
use crate::guard::MemoryGuard;
use crate::platform::Platform;
use crate::sampler::Sampler;
use crate::tokenizer::{Tokenizer, TokenizerError, Utf8Stream};

/// Read the whole file `path` into the arena (for `-f`).
pub fn read_text<'a, P: Platform>(
    ctx: &mut Ctx<'_, '_, 'a, P>,
    path: &str,
) -> Result<&'a str, AppError> {
    let f = super::open_model(ctx.p, path)?;
    let n = ctx.p.file_size(&f) as usize;
    let buf = ctx.arena.bytes("text", n)?;
    let mut done = 0;
    while done < n {
        let got = ctx
            .p
            .read_at(&f, done as u64, &mut buf[done..], false)
            .map_err(|e| AppError::Model(e.into_model()))?;
        if got == 0 {
            break;
        }
        done += got;
    }
    let buf: &'a [u8] = buf;
    core::str::from_utf8(&buf[..done])
        .map_err(|_| AppError::Usage("the text file is not valid UTF-8"))
}

trait IntoModel {
    fn into_model(self) -> crate::model::ModelError;
}
impl IntoModel for crate::platform::PlatformError {
    fn into_model(self) -> crate::model::ModelError {
        crate::model::ModelError::Platform(self)
    }
}

/// Tokenize `text` into `out`, mapping a full buffer to a prompt-too-long error.
pub fn encode_into(
    tok: &Tokenizer,
    text: &str,
    add_special: bool,
    parse_special: bool,
    scratch: &mut [u8],
    out: &mut [u32],
    n_ctx: usize,
) -> Result<usize, AppError> {
    match tok.encode(text, add_special, parse_special, scratch, out) {
        Ok(n) => Ok(n),
        Err(TokenizerError::OutputFull { .. }) => Err(AppError::PromptTooLong {
            tokens: out.len() + 1,
            n_ctx,
        }),
        Err(e) => Err(e.into()),
    }
}

pub use crate::generate::GenStats;
use crate::generate::{Emit, Settings};

/// Evaluate `prompt` and generate up to `n` tokens, calling `emit` with each token's id
/// and text bytes: [`crate::generate::generate`] with the command's settings (stops at
/// an end-of-generation token unless `--ignore-eos`, and when `guard` finds available
/// memory under its floor; `GenStats::stopped` says so).
pub fn generate<P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    sampler: &mut Sampler,
    guard: &mut MemoryGuard,
    prompt: &[u32],
    n: usize,
    emit: &mut dyn FnMut(u32, &[u8]),
) -> Result<GenStats, AppError> {
    let s = Settings {
        sampler,
        guard,
        adjust: None,
        max_new: n,
        ignore_eos: ctx.o.ignore_eos,
        feed_last: true,
    };
    crate::generate::generate(ctx.p, ctx.tok, &mut ctx.sess, s, prompt, &mut Emit(emit))
}

/// One line on what streaming read per generated token, against the plan.
pub fn print_stream<P: Platform>(p: &P, st: &GenStats, plan_per_token: u64) {
    let s = &st.stream;
    if s.passes == 0 {
        return;
    }
    let per = s.bytes / s.passes;
    let mut err = Out::stderr(p);
    if let Some(os) = st.os_read_bytes {
        let _ = write!(
            err,
            "storage reads counted by the OS: {} per generated token; ",
            Mib(os / s.passes)
        );
    }
    let _ = writeln!(
        err,
        "streamed: {} per generated token (plan {}, {:+.1} %), {:.0} MB/s, waiting {:.0} % of the generation time{}",
        Mib(per),
        Mib(plan_per_token),
        (per as f64 / plan_per_token.max(1) as f64 - 1.0) * 100.0,
        s.bytes as f64 / st.gen_s.max(1e-9) / 1e6,
        s.wait_ns as f64 / 1e9 / st.gen_s.max(1e-9) * 100.0,
        if s.verified > 0 { "; every unit verified against the file" } else { "" }
    );
}

fn print_stats<P: Platform>(p: &P, st: &GenStats) {
    let mut err = Out::stderr(p);
    let _ = write!(
        err,
        "\n\nprompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s",
        st.prompt_tokens,
        st.prompt_tps(),
        st.gen_tokens,
        st.gen_tps()
    );
    match p.peak_rss() {
        Some(r) => {
            let _ = writeln!(err, " | peak RSS {}", Mib(r));
        }
        None => {
            let _ = writeln!(err);
        }
    }
}

/// Time per kind of operation, largest first.
pub fn print_profile<P: Platform>(p: &P, prof: &crate::model::forward::Profile) {
    use crate::model::forward::Op;
    let mut err = Out::stderr(p);
    let total = prof.total().max(1);
    let mut ops = Op::ALL;
    ops.sort_unstable_by_key(|op| core::cmp::Reverse(prof.ns[*op as usize]));
    let _ = writeln!(err, "profile ({:.1} ms in eval):", total as f64 / 1e6);
    for op in ops {
        let ns = prof.ns[op as usize];
        let _ = writeln!(
            err,
            "  {:<28} {:>9.1} ms {:>5.1} %",
            op.name(),
            ns as f64 / 1e6,
            100.0 * ns as f64 / total as f64
        );
    }
}

/// `pinch run`.
pub fn run<P: Platform>(ctx: &mut Ctx<'_, '_, '_, P>) -> Result<(), AppError> {
    let o = ctx.o;
    let text: &str = match (o.prompt, o.file) {
        (Some(t), _) => t,
        (None, Some(f)) => read_text(ctx, f)?,
        (None, None) => "",
    };
    let n_ctx = ctx.sess.opts.n_ctx;
    let scratch = ctx
        .arena
        .bytes("tokenizer scratch", ctx.tok.scratch_bytes(text.len()))?;
    let toks = ctx.arena.slice::<u32>("tokens", n_ctx)?;
    let n = encode_into(
        ctx.tok,
        text,
        !o.no_bos,
        o.parse_special,
        scratch,
        toks,
        n_ctx,
    )?;
    if n == 0 {
        return Err(AppError::Usage(
            "empty prompt and the model adds no BOS token: give -p TEXT",
        ));
    }
    if n > n_ctx {
        return Err(AppError::PromptTooLong { tokens: n, n_ctx });
    }
    let text_cap = o.n_predict.saturating_mul(16).clamp(256, 1 << 20);
    let gen_text = ctx.arena.bytes("generated text", text_cap)?;
    let mut gen_len = 0usize;
    let mut sampler = Sampler::new(o.sampler);
    let mut guard = MemoryGuard::from_opt(o.guard);
    let p = ctx.p;
    let mut out = Out::stdout(p);
    out.bytes(text.as_bytes());
    let mut stream = Utf8Stream::new();
    let json = o.json;
    let st = generate(
        ctx,
        &mut sampler,
        &mut guard,
        &toks[..n],
        o.n_predict,
        &mut |_, bytes| {
            let _ = stream.push(bytes, &mut |s: &str| -> Result<(), ()> {
                out.bytes(s.as_bytes());
                if json {
                    let take = s.len().min(text_cap - gen_len);
                    gen_text[gen_len..gen_len + take].copy_from_slice(&s.as_bytes()[..take]);
                    gen_len += take;
                }
                Ok(())
            });
        },
    )?;
    let _ = stream.finish(&mut |s: &str| -> Result<(), ()> {
        out.bytes(s.as_bytes());
        Ok(())
    });
    drop(out);
    print_stats(p, &st);
    print_stream(p, &st, ctx.plan.streamed_per_token());
    if o.profile {
        print_profile(p, &ctx.sess.profile);
    }
    if json {
        let mut w = Out::stdout(p);
        let _ = write!(
            w,
            "\n{{\"command\":\"run\",\"prompt_tokens\":{},\"gen_tokens\":{},\"prompt_tps\":{:.3},\"gen_tps\":{:.3},\"peak_rss\":{},\"stream_bytes\":{},\"stream_passes\":{},\"stream_plan_per_token\":{},\"stream_verified\":{},\"os_read_bytes\":{},\"stopped\":",
            st.prompt_tokens,
            st.gen_tokens,
            st.prompt_tps(),
            st.gen_tps(),
            p.peak_rss().unwrap_or(0),
            st.stream.bytes,
            st.stream.passes,
            ctx.plan.streamed_per_token(),
            st.stream.verified,
            st.os_read_bytes.unwrap_or(0)
        );
        match st.stopped {
            Some(s) => {
                let mut m = heapless::String::<128>::new();
                let _ = write!(m, "{s}");
                let _ = json_str(&mut w, &m);
            }
            None => {
                let _ = w.write_str("null");
            }
        }
        let _ = w.write_str(",\"text\":");
        let _ = json_str(
            &mut w,
            core::str::from_utf8(&gen_text[..gen_len]).unwrap_or(""),
        );
        let _ = writeln!(w, "}}");
    }
    match st.stopped {
        Some(s) => Err(AppError::Stopped(s)),
        None => Ok(()),
    }
}

/// `pinch chat`: read lines, answer with the model's chat template, keep the history
/// in the KV cache.
pub fn chat<P: Platform>(ctx: &mut Ctx<'_, '_, '_, P>) -> Result<(), AppError> {
    let o = ctx.o;
    let p = ctx.p;
    let n_ctx = ctx.sess.opts.n_ctx;
    let line = ctx.arena.bytes("chat input", 8192)?;
    let rendered = ctx.arena.bytes("chat template", 16384)?;
    let scratch = ctx
        .arena
        .bytes("tokenizer scratch", ctx.tok.scratch_bytes(16384))?;
    let toks = ctx.arena.slice::<u32>("tokens", n_ctx)?;
    let template = ChatTemplate::from_gguf(ctx.g).map_err(AppError::Chat)?;
    let mut sampler = Sampler::new(o.sampler);
    let mut guard = MemoryGuard::from_opt(o.guard);
    let mut first = true;
    let mut err = Out::stderr(p);
    let _ = writeln!(
        err,
        "pinch chat: type a message and press enter (end of input quits)"
    );
    drop(err);
    loop {
        Out::stdout(p).bytes(b"\n> ");
        let Some(n) = p.read_line(line) else { break };
        let Ok(user) = core::str::from_utf8(&line[..n]) else {
            let _ = writeln!(Out::stderr(p), "pinch: input is not valid UTF-8; ignored");
            continue;
        };
        let mut w = SliceWriter {
            buf: rendered,
            len: 0,
        };
        if !first {
            // Close the model's previous turn: its end-of-turn token was not fed back.
            let _ = w.write_str(template.end_of_turn());
            if template != ChatTemplate::Llama3 {
                let _ = w.write_str("\n");
            }
        }
        let sys = ChatMessage::new("system", o.system.unwrap_or(""));
        let msg = ChatMessage::new("user", user);
        let msgs = [sys, msg];
        let turn_msgs = if first && o.system.is_some() {
            &msgs[..]
        } else {
            &msgs[1..]
        };
        if template.render(turn_msgs, true, &mut w).is_err() {
            let _ = writeln!(Out::stderr(p), "pinch: message too long; ignored");
            continue;
        }
        let len = w.len;
        let turn = core::str::from_utf8(&rendered[..len]).unwrap_or("");
        let nt = encode_into(ctx.tok, turn, first, true, scratch, toks, n_ctx)?;
        if ctx.sess.n_past() + nt + 1 >= n_ctx {
            let _ = writeln!(
                Out::stderr(p),
                "pinch: context full; starting a new conversation"
            );
            ctx.sess.reset();
            sampler.reset();
            first = true;
            continue;
        }
        first = false;
        if o.verbose {
            let mut e = Out::stderr(p);
            let _ = writeln!(e, "[{nt} prompt tokens: {:?}]", &toks[..nt.min(64)]);
        }
        let mut out = Out::stdout(p);
        let mut stream = Utf8Stream::new();
        let st = generate(
            ctx,
            &mut sampler,
            &mut guard,
            &toks[..nt],
            o.n_predict.max(1),
            &mut |_, bytes| {
                let _ = stream.push(bytes, &mut |s: &str| -> Result<(), ()> {
                    out.bytes(s.as_bytes());
                    Ok(())
                });
            },
        )?;
        let _ = stream.finish(&mut |s: &str| -> Result<(), ()> {
            out.bytes(s.as_bytes());
            Ok(())
        });
        drop(out);
        if let Some(s) = st.stopped {
            // The answer ends here; the conversation goes on (memory may come back).
            let _ = writeln!(Out::stderr(p), "\npinch: {s}");
            if st.prompt_tokens == 0 && ctx.sess.n_past() == 0 {
                first = true; // nothing was evaluated: the next turn opens the chat
            }
        }
        if o.verbose {
            print_stats(p, &st);
        }
    }
    super::out::print_peak_rss(p);
    Ok(())
}

/// `core::fmt::Write` into a byte slice (truncates when full).
pub struct SliceWriter<'b> {
    pub buf: &'b mut [u8],
    pub len: usize,
}

impl Write for SliceWriter<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let b = s.as_bytes();
        if self.len + b.len() > self.buf.len() {
            return Err(core::fmt::Error);
        }
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
        Ok(())
    }
}
