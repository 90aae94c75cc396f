//! `pinch tokenize`: like llama-tokenize (ids and pieces, or `--ids` as a list).
use core::fmt::Write;

use super::out::Out;
use super::run::{encode_into, read_text};
use super::{AppError, Ctx};
use crate::platform::Platform;

pub fn tokenize<P: Platform>(ctx: &mut Ctx<'_, '_, '_, P>) -> Result<(), AppError> {
    let o = ctx.o;
    let text: &str = match (o.prompt, o.file) {
        (Some(t), _) => t,
        (None, Some(f)) => read_text(ctx, f)?,
        (None, None) => return Err(AppError::Usage("give the text with -p TEXT or -f FILE")),
    };
    let cap = text.len() + 8;
    let scratch = ctx
        .arena
        .bytes("tokenizer scratch", ctx.tok.scratch_bytes(text.len()))?;
    let toks = ctx.arena.slice::<u32>("tokens", cap)?;
    let n = encode_into(
        ctx.tok,
        text,
        !o.no_bos,
        o.parse_special,
        scratch,
        toks,
        cap,
    )?;
    let mut out = Out::stdout(ctx.p);
    if o.ids {
        let _ = out.write_char('[');
        for (i, t) in toks[..n].iter().enumerate() {
            let _ = write!(out, "{}{}", if i > 0 { ", " } else { "" }, t);
        }
        let _ = writeln!(out, "]");
    } else {
        for &t in &toks[..n] {
            let _ = write!(out, "{t:6} -> '");
            out.bytes(ctx.tok.token_bytes(t));
            let _ = writeln!(out, "'");
        }
    }
    Ok(())
}
