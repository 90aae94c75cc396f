//! The model's tensors, loaded into the arena (all resident for now).
use core::fmt::Write;

use pinch_kernels::GgmlType;

use crate::arena::Arena;
use crate::gguf::{Gguf, TensorInfo};
use crate::model::config::{Arch, Config};
use crate::model::ModelError;
use crate::platform::Platform;

/// A 2-D (or 1-D) weight: `rows` rows of `cols` values of type `ty`.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    pub ty: GgmlType,
    pub cols: usize,
    pub rows: usize,
    pub data: &'a [u8],
}

impl<'a> Tensor<'a> {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }
    /// Row `r`'s bytes.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// A 1-D f32 vector (norm gains, biases).
pub type Vector<'a> = &'a [f32];

/// One transformer block's weights.
pub struct LayerWeights<'a> {
    pub attn_norm: Vector<'a>,
    pub wq: Tensor<'a>,
    pub wk: Tensor<'a>,
    pub wv: Tensor<'a>,
    pub wo: Tensor<'a>,
    pub bq: Option<Vector<'a>>,
    pub bk: Option<Vector<'a>>,
    pub bv: Option<Vector<'a>>,
    pub q_norm: Option<Vector<'a>>,
    pub k_norm: Option<Vector<'a>>,
    pub post_attn_norm: Option<Vector<'a>>,
    pub ffn_norm: Vector<'a>,
    pub w_gate: Tensor<'a>,
    pub w_up: Tensor<'a>,
    pub w_down: Tensor<'a>,
    pub post_ffn_norm: Option<Vector<'a>>,
}

/// Maximum layers pinch loads (a fixed table keeps runtime-min allocation-free).
pub const MAX_LAYERS: usize = 128;

/// All weights of a dense model.
pub struct Weights<'a> {
    pub token_embd: Tensor<'a>,
    pub output_norm: Vector<'a>,
    /// `output.weight`, or `token_embd.weight` when the output is tied.
    pub output: Tensor<'a>,
    /// Pruned LM head (see `crate::head`): `output` row `j` is vocabulary id
    /// `head_ids[j]`, and every other id gets logit -inf. `None`: the full head.
    pub head_ids: Option<&'a [u32]>,
    pub layers: heapless::Vec<LayerWeights<'a>, MAX_LAYERS>,
}

/// Reads tensors from a file into the arena.
pub struct Loader<'p, 'g, 'a, P: Platform> {
    pub platform: &'p P,
    pub file: &'p P::File,
    pub gguf: &'g Gguf<'g>,
    pub arena: &'p mut Arena<'a>,
}

impl<'p, 'g, 'a, P: Platform> Loader<'p, 'g, 'a, P> {
    fn info(&self, name: &str) -> Option<TensorInfo<'g>> {
        self.gguf.tensor(name)
    }

    fn read(
        &mut self,
        info: &TensorInfo,
        account: &'static str,
    ) -> Result<&'a mut [u8], ModelError> {
        let n = info.bytes as usize;
        let buf = self.arena.bytes(account, n)?;
        let mut done = 0usize;
        while done < n {
            let got = self
                .platform
                .read_at(
                    self.file,
                    info.offset + done as u64,
                    &mut buf[done..],
                    false,
                )
                .map_err(ModelError::Platform)?;
            if got == 0 {
                return Err(ModelError::ShortRead {
                    offset: info.offset + done as u64,
                });
            }
            done += got;
        }
        Ok(buf)
    }

    /// A matrix with `cols` values per row; checks the shape.
    pub fn matrix(
        &mut self,
        name: &str,
        cols: usize,
        rows: Option<usize>,
    ) -> Result<Tensor<'a>, ModelError> {
        let info = self
            .info(name)
            .ok_or(ModelError::MissingTensorNamed(name_buf(name)))?;
        let (c, r) = (info.dims[0] as usize, info.dims[1] as usize);
        if c != cols || rows.is_some_and(|want| want != r) || info.dims[2] != 1 || info.dims[3] != 1
        {
            return Err(ModelError::TensorShape {
                name: name_buf(name),
                expected: [cols as u64, rows.unwrap_or(r) as u64],
                found: [info.dims[0], info.dims[1]],
            });
        }
        if !info.ty.can_dequantize() {
            return Err(ModelError::UnsupportedType {
                name: name_buf(name),
                ty: info.ty,
            });
        }
        let data = self.read(&info, "weights")?;
        Ok(Tensor {
            ty: info.ty,
            cols: c,
            rows: r,
            data,
        })
    }

    /// Rows `ids` of the matrix `info` (`cols` x `rows`), read one by one into the arena.
    fn rows_of(
        &mut self,
        info: &TensorInfo,
        cols: usize,
        rows: usize,
        ids: &[u32],
    ) -> Result<Tensor<'a>, ModelError> {
        if info.dims[0] as usize != cols || info.dims[1] as usize != rows {
            return Err(ModelError::TensorShape {
                name: name_buf(info.name),
                expected: [cols as u64, rows as u64],
                found: [info.dims[0], info.dims[1]],
            });
        }
        if !info.ty.can_dequantize() {
            return Err(ModelError::UnsupportedType {
                name: name_buf(info.name),
                ty: info.ty,
            });
        }
        let rb = info.bytes as usize / rows.max(1);
        let data = self.arena.bytes("weights", rb * ids.len())?;
        for (j, &id) in ids.iter().enumerate() {
            if id as usize >= rows {
                return Err(ModelError::BadToken { id, n_vocab: rows });
            }
            let dst = &mut data[j * rb..(j + 1) * rb];
            let off = info.offset + (id as usize * rb) as u64;
            let mut done = 0;
            while done < rb {
                let got = self
                    .platform
                    .read_at(self.file, off + done as u64, &mut dst[done..], false)
                    .map_err(ModelError::Platform)?;
                if got == 0 {
                    return Err(ModelError::ShortRead {
                        offset: off + done as u64,
                    });
                }
                done += got;
            }
        }
        Ok(Tensor {
            ty: info.ty,
            cols,
            rows: ids.len(),
            data,
        })
    }

    /// A 1-D f32 vector of length `n` (norms and biases are always F32 in GGUF).
    pub fn vector(&mut self, name: &str, n: usize) -> Result<Vector<'a>, ModelError> {
        let info = self
            .info(name)
            .ok_or(ModelError::MissingTensorNamed(name_buf(name)))?;
        if info.dims[0] as usize != n || info.dims[1] != 1 {
            return Err(ModelError::TensorShape {
                name: name_buf(name),
                expected: [n as u64, 1],
                found: [info.dims[0], info.dims[1]],
            });
        }
        let out: &'a mut [f32] = self.arena.slice("weights", n)?;
        match info.ty {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
                let raw = self.read(&info, "load scratch")?;
                pinch_kernels::matvec::dequantize_row(info.ty, raw, out).map_err(|_| {
                    ModelError::UnsupportedType {
                        name: name_buf(name),
                        ty: info.ty,
                    }
                })?;
            }
            ty => {
                return Err(ModelError::UnsupportedType {
                    name: name_buf(name),
                    ty,
                })
            }
        }
        Ok(out)
    }

    fn opt_vector(&mut self, name: &str, n: usize) -> Result<Option<Vector<'a>>, ModelError> {
        if self.info(name).is_some() {
            self.vector(name, n).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Load every weight of a dense model with config `c`.
    pub fn load(&mut self, c: &Config) -> Result<Weights<'a>, ModelError> {
        self.load_with_head(c, None)
    }

    /// [`Self::load`] with a pruned LM head of vocabulary ids `head` (increasing): an
    /// untied `output.weight` is read row by row, so the full matrix never enters
    /// memory; a tied one is copied from the (full, resident) embedding.
    pub fn load_with_head(
        &mut self,
        c: &Config,
        head: Option<&'a [u32]>,
    ) -> Result<Weights<'a>, ModelError> {
        let token_embd = self.matrix("token_embd.weight", c.n_embd, Some(c.n_vocab))?;
        let output_norm = self.vector("output_norm.weight", c.n_embd)?;
        // A recut file (`pinch recut`) stores only the kept rows and their ids.
        let stored = crate::head::ids_from_gguf(self.gguf, c.n_vocab, self.arena)?;
        if stored.is_some() && head.is_some() {
            return Err(ModelError::BadShape(
                "the file already has a pruned head (recut); do not prune it again",
            ));
        }
        let head_ids = stored.or(head);
        let output = match (self.info("output.weight"), head) {
            (Some(info), Some(ids)) => self.rows_of(&info, c.n_embd, c.n_vocab, ids)?,
            (Some(_), None) => {
                let rows = head_ids.map_or(c.n_vocab, |h| h.len());
                self.matrix("output.weight", c.n_embd, Some(rows))?
            }
            (None, Some(ids)) => crate::head::prune(&token_embd, ids, self.arena)?,
            (None, None) => token_embd,
        };
        if c.n_layer > MAX_LAYERS {
            return Err(ModelError::BadShape(
                "more layers than pinch supports (128)",
            ));
        }
        let mut layers = heapless::Vec::new();
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        for il in 0..c.n_layer {
            let mut n = Names::new(il);
            let lw = LayerWeights {
                attn_norm: self.vector(n.get("attn_norm.weight"), c.n_embd)?,
                wq: self.matrix(n.get("attn_q.weight"), c.n_embd, Some(qd))?,
                wk: self.matrix(n.get("attn_k.weight"), c.n_embd, Some(kvd))?,
                wv: self.matrix(n.get("attn_v.weight"), c.n_embd, Some(kvd))?,
                wo: self.matrix(n.get("attn_output.weight"), qd, Some(c.n_embd))?,
                bq: self.opt_vector(n.get("attn_q.bias"), qd)?,
                bk: self.opt_vector(n.get("attn_k.bias"), kvd)?,
                bv: self.opt_vector(n.get("attn_v.bias"), kvd)?,
                q_norm: self.opt_vector(n.get("attn_q_norm.weight"), c.head_dim)?,
                k_norm: self.opt_vector(n.get("attn_k_norm.weight"), c.head_dim)?,
                post_attn_norm: self.opt_vector(n.get("post_attention_norm.weight"), c.n_embd)?,
                ffn_norm: self.vector(n.get("ffn_norm.weight"), c.n_embd)?,
                w_gate: self.matrix(n.get("ffn_gate.weight"), c.n_embd, Some(c.n_ff))?,
                w_up: self.matrix(n.get("ffn_up.weight"), c.n_embd, Some(c.n_ff))?,
                w_down: self.matrix(n.get("ffn_down.weight"), c.n_ff, Some(c.n_embd))?,
                post_ffn_norm: self.opt_vector(n.get("post_ffw_norm.weight"), c.n_embd)?,
            };
            if c.qk_norm && (lw.q_norm.is_none() || lw.k_norm.is_none()) {
                return Err(ModelError::MissingTensorNamed(name_buf(
                    n.get("attn_q_norm.weight"),
                )));
            }
            if c.post_norms && (lw.post_attn_norm.is_none() || lw.post_ffn_norm.is_none()) {
                return Err(ModelError::MissingTensorNamed(name_buf(
                    n.get("post_attention_norm.weight"),
                )));
            }
            if c.arch == Arch::Qwen2 && lw.bq.is_none() {
                return Err(ModelError::MissingTensorNamed(name_buf(
                    n.get("attn_q.bias"),
                )));
            }
            let _ = layers.push(lw);
        }
        Ok(Weights {
            token_embd,
            output_norm,
            output,
            head_ids,
            layers,
        })
    }
}

/// Tensor-name buffer for errors (names are short).
pub type NameBuf = heapless::String<64>;

pub(crate) fn name_buf(s: &str) -> NameBuf {
    let mut b = NameBuf::new();
    let _ = b.push_str(&s[..s.len().min(64)]);
    b
}

struct Names {
    il: usize,
    buf: heapless::String<64>,
}

impl Names {
    fn new(il: usize) -> Names {
        Names {
            il,
            buf: heapless::String::new(),
        }
    }
    fn get(&mut self, suffix: &str) -> &str {
        self.buf.clear();
        let _ = write!(self.buf, "blk.{}.{}", self.il, suffix);
        &self.buf
    }
}
