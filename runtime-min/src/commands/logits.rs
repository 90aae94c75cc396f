//! `pinch logits`: the logits at every position of a sequence of token ids, written raw
//! in the layout of the llama.cpp goldens in `tests/data/tiny` (little-endian f32,
//! position-major, `n_vocab` values a row), so the very binary shipped to a device can
//! be checked against them on that device or under qemu.
use super::head_select::file_name;
use super::{AppError, Ctx};
use crate::model::Logits;
use crate::platform::Platform;

const USAGE: &str = "pinch logits -m M -p ID,ID,... -o FILE: -p takes comma-separated token ids";

/// The token ids of a comma-separated list like `1,17,42`.
pub fn parse_ids<'a>(list: &str, into: &'a mut [u32]) -> Result<&'a [u32], AppError> {
    let mut n = 0;
    for id in list.split(',') {
        let slot = into.get_mut(n).ok_or(AppError::Usage(USAGE))?;
        *slot = id.trim().parse().map_err(|_| AppError::Usage(USAGE))?;
        n += 1;
    }
    Ok(&into[..n])
}

pub fn logits<P: Platform>(ctx: &mut Ctx<'_, '_, '_, P>) -> Result<(), AppError> {
    let o = ctx.o;
    let (Some(list), Some(out)) = (o.prompt, o.output) else {
        return Err(AppError::Usage(USAGE));
    };
    let room = ctx.arena.slice::<u32>("tokens", list.split(',').count())?;
    let ids = parse_ids(list, room)?;
    let n_vocab = ctx.cfg.n_vocab;
    let rows = ctx.arena.bytes("logits", ids.len() * n_vocab * 4)?;
    // `-b` cuts the sequence into eval passes as generation does (`-b 1`: one token a
    // pass, the path of decoding; the default 64: the prompt's batched path).
    ctx.sess.eval(ctx.p, ids, Logits::All, &mut |pos, row| {
        let at = &mut rows[pos * n_vocab * 4..(pos + 1) * n_vocab * 4];
        for (b, v) in at.chunks_exact_mut(4).zip(row) {
            b.copy_from_slice(&v.to_le_bytes());
        }
    })?;
    ctx.p
        .write_file(out, &[rows])
        .map_err(|e| AppError::Output(file_name(out), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_comma_separated_numbers() {
        let mut room = [0u32; 4];
        assert_eq!(parse_ids("1, 17,42", &mut room).unwrap(), &[1, 17, 42]);
        assert!(parse_ids("1,x", &mut room).is_err());
        assert!(parse_ids("1,,2", &mut room).is_err());
        let mut one = [0u32; 1];
        assert!(parse_ids("1,2", &mut one).is_err());
    }
}
