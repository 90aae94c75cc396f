//! `pinch recut -m M (--head head.ids | --head-rows N) -o M2.gguf`: write a GGUF whose
//! `output.weight` holds only the rows of a pruned head, so the small head is what
//! loads (no full output read, no copy at start).
//!
//! The new file has every key of the original plus [`crate::head::KEY_IDS`] and
//! [`crate::head::KEY_N_VOCAB`]; every tensor but `output.weight` is copied unchanged
//! (so `token_embd.weight` keeps the full vocabulary for input), and `output.weight`
//! (last) is `[n_embd, rows]` in the original quant type. A tied model gets an explicit
//! `output.weight` made from the embedding rows. With `-o FILE` the file is built in
//! memory and written atomically ([`Platform::write_file`] takes it in one call);
//! without `-o` (or with `-o -`) it streams to stdout.
use super::head_select::file_name;
use super::head_select::{read_ids, select_from_corpus};
use super::{open_model, read_header, AppError};
use crate::arena::Arena;
use crate::cli::Opts;
use crate::gguf::{
    CountSink, Gguf, GgufWriter, Sink, SliceSink, TensorInfo, Value, ValueType, WriteError,
};
use crate::head::{KEY_IDS, KEY_N_VOCAB};
use crate::model::ModelError;
use crate::platform::Platform;
use crate::tokenizer::Tokenizer;

/// Buffers writes to the platform's stdout.
struct StdoutSink<'p, 'b, P: Platform> {
    p: &'p P,
    buf: &'b mut [u8],
    n: usize,
}

impl<P: Platform> StdoutSink<'_, '_, P> {
    fn flush(&mut self) {
        if self.n > 0 {
            self.p.stdout(&self.buf[..self.n]);
            self.n = 0;
        }
    }
}

impl<P: Platform> Sink for StdoutSink<'_, '_, P> {
    type Error = core::convert::Infallible;
    fn write(&mut self, mut bytes: &[u8]) -> Result<(), Self::Error> {
        while !bytes.is_empty() {
            if self.n == self.buf.len() {
                self.flush();
            }
            let k = bytes.len().min(self.buf.len() - self.n);
            self.buf[self.n..self.n + k].copy_from_slice(&bytes[..k]);
            self.n += k;
            bytes = &bytes[k..];
        }
        Ok(())
    }
}

fn werr<E>(_: WriteError<E>) -> AppError {
    AppError::Usage("recut: the GGUF writer rejected the layout (a bug: please report it)")
}

fn read_exact<P: Platform>(
    p: &P,
    f: &P::File,
    offset: u64,
    buf: &mut [u8],
) -> Result<(), AppError> {
    let mut done = 0;
    while done < buf.len() {
        let got = p
            .read_at(f, offset + done as u64, &mut buf[done..], false)
            .map_err(|e| AppError::Model(ModelError::Platform(e)))?;
        if got == 0 {
            return Err(AppError::Model(ModelError::ShortRead {
                offset: offset + done as u64,
            }));
        }
        done += got;
    }
    Ok(())
}

/// The recut command.
pub fn recut<P: Platform>(p: &P, o: &Opts, region: &mut [u8]) -> Result<(), AppError> {
    let path = o.model.ok_or(AppError::NoModel)?;
    let file = open_model(p, path)?;
    let mut arena = Arena::new(region);
    let g = read_header(p, &file, &mut arena)?;
    if g.get_array(KEY_IDS).is_some() {
        return Err(AppError::Usage("this file is already recut"));
    }
    let tok = Tokenizer::from_gguf(&g, &mut arena)?;
    let nv = tok.n_vocab() as usize;
    let ids = match (o.head, o.head_rows) {
        (Some(h), _) => read_ids(p, &mut arena, h, nv)?,
        (None, n) if n > 0 => select_from_corpus(p, &tok, &mut arena, o.corpus, o.head_lang, n)?,
        _ => {
            return Err(AppError::Usage(
                "give the head with --head FILE or --head-rows N",
            ))
        }
    };
    let src = g
        .tensor("output.weight")
        .or_else(|| g.tensor("token_embd.weight"))
        .ok_or(AppError::Model(ModelError::MissingTensor(
            "token_embd.weight",
        )))?;
    if src.dims[1] as usize != nv || src.dims[2] != 1 || src.dims[3] != 1 {
        return Err(AppError::Model(ModelError::BadShape(
            "the output matrix does not have one row per vocabulary token",
        )));
    }
    let rb = (src.bytes / nv as u64) as usize;
    let n_kv = g
        .keys()
        .filter(|k| *k != KEY_IDS && *k != KEY_N_VOCAB)
        .count() as u64
        + 2;
    let n_tensors = g.tensors().filter(|t| t.name != "output.weight").count() as u64 + 1;
    let job = Job {
        g: &g,
        ids,
        src: &src,
        rb,
        n_kv,
        n_tensors,
    };
    match o.output {
        Some(out) if out != "-" => {
            // `write_file` takes the whole file at once: size it with a counting pass
            // (no reads), build it in the arena, write it atomically.
            let chunk = arena.bytes("recut io", 1 << 20)?;
            let total = job
                .emit(p, &file, CountSink { bytes: 0 }, chunk, false)?
                .bytes;
            let buf = arena.bytes("recut output", total as usize)?;
            let sink = job.emit(p, &file, SliceSink::new(buf), chunk, true)?;
            p.write_file(out, &[sink.written()])
                .map_err(|e| AppError::Output(file_name(out), e))
        }
        _ => {
            let buf = arena.bytes("recut io", 1 << 20)?;
            let (sink_buf, chunk) = buf.split_at_mut(256 << 10);
            let sink = StdoutSink {
                p,
                buf: sink_buf,
                n: 0,
            };
            let mut sink = job.emit(p, &file, sink, chunk, true)?;
            sink.flush();
            Ok(())
        }
    }
}

/// What the recut file holds.
struct Job<'j, 'g> {
    g: &'j Gguf<'g>,
    ids: &'j [u32],
    src: &'j TensorInfo<'g>,
    rb: usize,
    n_kv: u64,
    n_tensors: u64,
}

impl Job<'_, '_> {
    /// Write the recut GGUF into `sink`, reading tensors through `chunk`; with
    /// `read == false` the tensor bytes are not read (for a counting sink).
    fn emit<P: Platform, S: Sink>(
        &self,
        p: &P,
        file: &P::File,
        sink: S,
        chunk: &mut [u8],
        read: bool,
    ) -> Result<S, AppError> {
        let (g, ids, src, rb) = (self.g, self.ids, self.src, self.rb);
        let mut w = GgufWriter::new(sink, self.n_tensors, self.n_kv).map_err(werr)?;
        w.copy_kvs(g, |k| k != KEY_IDS && k != KEY_N_VOCAB)
            .map_err(werr)?;
        w.begin_array(KEY_IDS, ValueType::U32, ids.len() as u64)
            .map_err(werr)?;
        for &id in ids {
            w.elem(Value::U32(id)).map_err(werr)?;
        }
        w.kv(KEY_N_VOCAB, Value::U32(src.dims[1] as u32))
            .map_err(werr)?;
        for t in g.tensors().filter(|t| t.name != "output.weight") {
            w.copy_tensor_info(&t).map_err(werr)?;
        }
        w.tensor_info("output.weight", src.ty, &[src.dims[0], ids.len() as u64])
            .map_err(werr)?;
        for t in g.tensors().filter(|t| t.name != "output.weight") {
            w.begin_tensor_data(t.bytes).map_err(werr)?;
            let mut off = 0u64;
            while off < t.bytes {
                let k = (t.bytes - off).min(chunk.len() as u64) as usize;
                if read {
                    read_exact(p, file, t.offset + off, &mut chunk[..k])?;
                }
                w.write_data(&chunk[..k]).map_err(werr)?;
                off += k as u64;
            }
        }
        w.begin_tensor_data((rb * ids.len()) as u64).map_err(werr)?;
        let row = &mut chunk[..rb];
        for &id in ids {
            if read {
                read_exact(p, file, src.offset + (id as usize * rb) as u64, row)?;
            }
            w.write_data(row).map_err(werr)?;
        }
        w.finish().map_err(werr)
    }
}
