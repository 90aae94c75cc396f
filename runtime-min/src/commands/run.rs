//! `pinch run` (generate from a prompt) and `pinch chat` (interactive, chat template).
use core::fmt::Write;

use super::out::{json_str, Mib, Out};
use super::{AppError, Ctx};
use crate::chat::{ChatMessage, Named, Template};
use crate::grammar::parse::Parsed;
use crate::guard::MemoryGuard;
use crate::platform::Platform;
use crate::sampler::Sampler;
use crate::server::constrain::{GrammarBufs, SlotGrammar};
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
    grammar: Option<&mut crate::generate::Constrain<'_>>,
    emit: &mut dyn FnMut(u32, &[u8]),
) -> Result<GenStats, AppError> {
    let s = Settings {
        sampler,
        guard,
        adjust: None,
        max_new: n,
        ignore_eos: ctx.o.ignore_eos,
        feed_last: true,
        draft: ctx.draft.as_mut(),
        grammar,
    };
    crate::generate::generate(ctx.p, ctx.tok, &mut ctx.sess, s, prompt, &mut Emit(emit))
}

/// `--grammar`, `--grammar-file`, `--json-schema` (`run`, and each reply of `chat`):
/// the grammar parsed into buffers carved from the arena; `None` without one.
fn grammar<'a, P: Platform>(
    ctx: &mut Ctx<'_, '_, 'a, P>,
) -> Result<Option<(GrammarBufs<'a>, SlotGrammar<'a>, Parsed)>, AppError> {
    let o = ctx.o;
    let (text, schema) = match (o.grammar_file, o.grammar, o.json_schema) {
        (Some(f), ..) => (read_text(ctx, f)?, false),
        (None, Some(g), _) => (g, false),
        (None, None, Some(j)) => (j, true),
        (None, None, None) => return Ok(None),
    };
    let mut b = GrammarBufs::carve(ctx.arena, ctx.tok)?;
    let mut slot = SlotGrammar::carve(ctx.arena, ctx.tok.n_vocab() as usize)?;
    match b.prepare_text(&mut slot, text, schema) {
        Ok(g) => Ok(Some((b, slot, g))),
        Err(e) => {
            let _ = writeln!(Out::stderr(ctx.p), "pinch: {e}");
            Err(AppError::Usage(
                "--grammar/--grammar-file/--json-schema: the grammar is invalid (see above)",
            ))
        }
    }
}

/// One line on what streaming read per generated token, against the plan (which counts
/// one weight pass per token; with drafts a pass can produce several).
pub fn print_stream<P: Platform>(p: &P, st: &GenStats, plan_per_token: u64) {
    let s = &st.stream;
    if s.passes == 0 {
        return;
    }
    let per_pass = s.bytes / s.passes;
    let per = s.bytes / (st.gen_tokens as u64).max(1);
    let mut err = Out::stderr(p);
    if let Some(os) = st.os_read_bytes {
        let _ = write!(
            err,
            "storage reads counted by the OS: {} per generated token; ",
            Mib(os / (st.gen_tokens as u64).max(1))
        );
    }
    let _ = write!(err, "streamed: {} per generated token", Mib(per));
    if st.drafted > 0 {
        let _ = write!(err, ", {} per pass", Mib(per_pass));
    }
    let _ = writeln!(
        err,
        " (plan {} per pass, {:+.1} %), {:.0} MB/s, waiting {:.0} % of the generation time{}",
        Mib(plan_per_token),
        (per_pass as f64 / plan_per_token.max(1) as f64 - 1.0) * 100.0,
        s.bytes as f64 / st.gen_s.max(1e-9) / 1e6,
        s.wait_ns as f64 / 1e9 / st.gen_s.max(1e-9) * 100.0,
        if s.verified > 0 {
            "; every unit verified against the file"
        } else {
            ""
        }
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
    if let Some(r) = p.peak_rss() {
        let _ = write!(err, " | peak RSS {}", Mib(r));
    }
    let _ = writeln!(err);
    if st.drafts > 0 {
        let _ = writeln!(
            err,
            "drafts: {} tokens drafted in {} of {} passes, {} accepted ({:.1} %), {:.2} tokens per pass",
            st.drafted,
            st.drafts,
            st.passes,
            st.accepted,
            st.acceptance() * 100.0,
            st.gen_tokens as f64 / st.passes.max(1) as f64
        );
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
    let mut gram = grammar(ctx)?;
    let mut parts = gram.as_mut().and_then(|(b, slot, g)| {
        let (m, masked) = slot.matcher(g, None)?;
        Some((m, &b.vocab, masked))
    });
    let mut constrain = parts
        .as_mut()
        .map(|(m, vocab, masked)| crate::generate::Constrain::new(m, vocab, masked));
    let text_cap = o.n_predict.saturating_mul(16).clamp(256, 1 << 20);
    let gen_text = ctx.arena.bytes("generated text", text_cap)?;
    let mut gen_len = 0usize;
    let mut sampler = Sampler::new(o.sampler.resolve_seed(ctx.p.now_ns()));
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
        constrain.as_mut(),
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
            "\n{{\"command\":\"run\",\"prompt_tokens\":{},\"gen_tokens\":{},\"prompt_tps\":{:.3},\"gen_tps\":{:.3},\"peak_rss\":{},\"stream_bytes\":{},\"stream_passes\":{},\"stream_plan_per_token\":{},\"stream_verified\":{},\"os_read_bytes\":{},\"gen_passes\":{},\"drafted\":{},\"accepted\":{},",
            st.prompt_tokens,
            st.gen_tokens,
            st.prompt_tps(),
            st.gen_tps(),
            p.peak_rss().unwrap_or(0),
            st.stream.bytes,
            st.stream.passes,
            ctx.plan.streamed_per_token(),
            st.stream.verified,
            st.os_read_bytes.unwrap_or(0),
            st.passes,
            st.drafted,
            st.accepted
        );
        let x = &st.experts;
        let _ = write!(
            w,
            "\"expert_hits\":{},\"expert_misses\":{},\"expert_read_ahead\":{},\"expert_reads\":{},\"expert_bytes\":{},\"expert_prefetched\":{},\"expert_read_ns\":{},\"expert_wait_ns\":{},\"stopped\":",
            x.hits, x.misses, x.read_ahead, x.reads, x.bytes, x.prefetched, x.read_ns, x.wait_ns
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

/// The chat template for `pinch chat` and `pinch serve`: `--chat-template NAME|FILE`
/// (or inline Jinja text) and `--chat-template-file FILE` override the GGUF's; the
/// choice is printed on stderr.
pub fn select_template<'a, P: Platform>(
    ctx: &mut Ctx<'_, '_, 'a, P>,
) -> Result<Template<'a>, AppError> {
    let o = ctx.o;
    let read = |ctx: &mut Ctx<'_, '_, 'a, P>, path: &str| {
        if let Err(e) = ctx.p.open(path) {
            let mut name = heapless::String::new();
            for c in path.chars() {
                if name.push(c).is_err() {
                    break;
                }
            }
            return Err(AppError::TemplateFile(name, e));
        }
        read_text(ctx, path).map(Some)
    };
    let text: Option<&'a str> = match (o.chat_template_file, o.chat_template) {
        (Some(path), _) => read(ctx, path)?,
        (None, Some(v))
            if Named::from_name(v).is_some() || v.contains("{{") || v.contains("{%") =>
        {
            // Copied into the arena: the template lives as long as the model.
            let buf = ctx.arena.bytes("chat template text", v.len())?;
            buf.copy_from_slice(v.as_bytes());
            let buf: &'a [u8] = buf;
            Some(core::str::from_utf8(buf).unwrap_or(""))
        }
        (None, Some(path)) => read(ctx, path)?,
        (None, None) => None,
    };
    let t = Template::select(ctx.g, text).map_err(AppError::Chat)?;
    let _ = writeln!(Out::stderr(ctx.p), "pinch: chat template: {}", t.describe());
    Ok(t)
}

/// The longest valid UTF-8 prefix of `b` (a reply cut inside a character).
fn utf8_prefix(b: &[u8]) -> &str {
    match core::str::from_utf8(b) {
        Ok(s) => s,
        Err(e) => core::str::from_utf8(&b[..e.valid_up_to()]).unwrap_or(""),
    }
}

/// Messages most `pinch chat` conversations keep before starting over.
const CHAT_MESSAGES: usize = 64;

/// `pinch chat`: read lines, answer with the model's chat template, keep the history
/// in the KV cache.
///
/// Each turn renders the whole conversation and feeds only what follows the text
/// already in the cache (the previous prompt and the reply), as llama.cpp's chat does:
/// the template closes the model's turn itself. A template that renders the past
/// differently (some drop old reasoning) makes the turn start over from the full prompt.
pub fn chat<P: Platform>(ctx: &mut Ctx<'_, '_, '_, P>) -> Result<(), AppError> {
    let o = ctx.o;
    let p = ctx.p;
    let n_ctx = ctx.sess.opts.n_ctx;
    let line = ctx.arena.bytes("chat input", 8192)?;
    // The rendered conversation, plus room for the Jinja interpreter's strings.
    let rendered = ctx.arena.bytes("chat template", 32768)?;
    // The text in the KV cache: the last prompt and the reply after it.
    // (Larger than a rendered prompt, which always fits.)
    let fed = ctx.arena.bytes("chat fed text", 49152)?;
    // Message texts of the conversation.
    let hist = ctx.arena.bytes("chat history", 16384)?;
    let scratch = ctx
        .arena
        .bytes("tokenizer scratch", ctx.tok.scratch_bytes(16384))?;
    let toks = ctx.arena.slice::<u32>("tokens", n_ctx)?;
    let template = select_template(ctx)?;
    // `--grammar`/`-j`: every reply follows it (a fresh matcher each turn).
    let mut gram = grammar(ctx)?;
    let mut spans: heapless::Vec<(&'static str, usize, usize), CHAT_MESSAGES> =
        heapless::Vec::new();
    // Bytes of `fed` (the last prompt's first) and of `hist` in use.
    let (mut hist_len, mut fed_len, mut prompt_len) = (0usize, 0usize, 0usize);
    let mut sampler = Sampler::new(o.sampler.resolve_seed(p.now_ns()));
    let mut guard = MemoryGuard::from_opt(o.guard);
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
        if ctx.sess.n_past() == 0 {
            // A new conversation.
            spans.clear();
            (hist_len, fed_len, prompt_len) = (0, 0, 0);
            if let Some(sys) = o.system {
                let n = sys.len().min(hist.len());
                hist[..n].copy_from_slice(&sys.as_bytes()[..n]);
                let _ = spans.push(("system", 0, n));
                hist_len = n;
            }
        }
        if hist_len + user.len() > hist.len() || spans.len() + 2 > CHAT_MESSAGES {
            let _ = writeln!(
                Out::stderr(p),
                "pinch: history full; starting a new conversation"
            );
            ctx.sess.reset();
            sampler.reset();
            continue;
        }
        hist[hist_len..hist_len + user.len()].copy_from_slice(user.as_bytes());
        let _ = spans.push(("user", hist_len, user.len()));
        hist_len += user.len();
        let mut msgs: heapless::Vec<ChatMessage<'_>, CHAT_MESSAGES> = heapless::Vec::new();
        for &(role, at, len) in spans.iter() {
            let _ = msgs.push(ChatMessage::new(role, utf8_prefix(&hist[at..at + len])));
        }
        let len = match template.render(&msgs, true, rendered) {
            Ok(len) => len,
            Err(e) => {
                let _ = writeln!(Out::stderr(p), "pinch: {e}; message ignored");
                spans.pop();
                hist_len -= user.len();
                continue;
            }
        };
        // Where the new text starts: after the text in the cache (the last prompt and the
        // reply); or, when the template writes the reply trimmed, after the reply as the
        // template writes it; else nowhere: start over.
        let r = &rendered[..len];
        let mut skip = None;
        if ctx.sess.n_past() > 0 && r.starts_with(&fed[..prompt_len]) {
            let reply = utf8_prefix(&fed[prompt_len..fed_len]);
            let rest = &r[prompt_len..];
            skip = [reply, reply.trim_end(), reply.trim_start(), reply.trim()]
                .iter()
                .find(|c| rest.starts_with(c.as_bytes()))
                .map(|c| prompt_len + c.len());
        }
        drop(msgs);
        let full = utf8_prefix(&rendered[..len]);
        if ctx.sess.n_past() > 0 && skip.is_none() {
            if o.verbose {
                let _ = writeln!(
                    Out::stderr(p),
                    "[the template renders the past differently: prompt starts over]"
                );
            }
            ctx.sess.reset();
            sampler.reset();
        }
        let add_bos = ctx.sess.n_past() == 0;
        let turn = if let Some(at) = skip {
            full.get(at..).unwrap_or("")
        } else if ctx.tok.adds_bos() {
            template.strip_bos(full)
        } else {
            full
        };
        let nt = encode_into(ctx.tok, turn, add_bos, true, scratch, toks, n_ctx)?;
        if ctx.sess.n_past() + nt + 1 >= n_ctx {
            let _ = writeln!(
                Out::stderr(p),
                "pinch: context full; starting a new conversation"
            );
            ctx.sess.reset();
            sampler.reset();
            continue;
        }
        // What the cache will hold: this prompt, then the reply (appended as it comes).
        fed_len = full.len().min(fed.len());
        fed[..fed_len].copy_from_slice(&full.as_bytes()[..fed_len]);
        prompt_len = fed_len;
        let reply_at = hist_len;
        if o.verbose {
            let mut e = Out::stderr(p);
            let _ = writeln!(e, "[{nt} prompt tokens: {:?}]", &toks[..nt.min(64)]);
        }
        let mut out = Out::stdout(p);
        let mut stream = Utf8Stream::new();
        let mut parts = gram.as_mut().and_then(|(b, slot, g)| {
            let (m, masked) = slot.matcher(g, None)?;
            Some((m, &b.vocab, masked))
        });
        let mut constrain = parts
            .as_mut()
            .map(|(m, vocab, masked)| crate::generate::Constrain::new(m, vocab, masked));
        let st = generate(
            ctx,
            &mut sampler,
            &mut guard,
            &toks[..nt],
            o.n_predict.max(1),
            constrain.as_mut(),
            &mut |_, bytes| {
                for (buf, len) in [(&mut *fed, &mut fed_len), (&mut *hist, &mut hist_len)] {
                    // A reply too long to keep makes the next turn start over.
                    let n = bytes.len().min(buf.len() - *len);
                    buf[*len..*len + n].copy_from_slice(&bytes[..n]);
                    *len += n;
                }
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
        let _ = spans.push(("assistant", reply_at, hist_len - reply_at));
        if let Some(s) = st.stopped {
            // The answer ends here; the conversation goes on (memory may come back).
            let _ = writeln!(Out::stderr(p), "\npinch: {s}");
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
