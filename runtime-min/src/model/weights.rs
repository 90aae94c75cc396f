//! The model's tensors: resident ones loaded into the arena, streamed ones described by
//! where they sit in the file (see `crate::residency` and `crate::model::stream`).
use core::fmt::Write;

use pinch_kernels::GgmlType;

use crate::arena::Arena;
use crate::gguf::{Gguf, TensorInfo};
use crate::model::config::Config;
use crate::model::layer::{Layer, LayerStream};
use crate::model::ModelError;
use crate::platform::Platform;
use crate::residency::{self, ResidencyPlan, Span};

pub use crate::model::config::MAX_LAYERS;

/// A 2-D (or 1-D) weight: `rows` rows of `cols` values of type `ty`.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    pub ty: GgmlType,
    pub cols: usize,
    pub rows: usize,
    pub data: &'a [u8],
    /// How `data` is arranged (`Plain` unless `crate::repack_cache` repacked it).
    pub layout: pinch_kernels::repack::Layout,
    /// Where the tensor's bytes are in the model file (empty for rows gathered from
    /// several places): a streamed layer's matrices are viewed there in a stream zone.
    pub file: Span,
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

    /// Rows `r0..r0 + rows` as a matrix of their own (one expert of a 3-D stack, the q,
    /// k or v rows of a fused `attn_qkv`), its file span narrowed to match. A row range
    /// is one byte range in the plain layout and, when it is whole groups, in a repacked
    /// one (`pinch_kernels::repack`: group `g` fills the bytes its plain rows did). A
    /// streamed matrix (no data until its zone lends it) gives a view without data.
    ///
    /// # Errors
    /// [`ModelError::BadShape`]: rows past the end, or a range that splits a repacked
    /// group.
    pub fn row_range(&self, r0: usize, rows: usize) -> Result<Tensor<'a>, ModelError> {
        let rb = self
            .ty
            .row_bytes(self.cols as u64)
            .ok_or(ModelError::BadShape(
                "row range of rows that are not whole blocks",
            ))? as usize;
        let g = self.layout.group_rows();
        if r0 + rows > self.rows || !r0.is_multiple_of(g) || !rows.is_multiple_of(g) {
            return Err(ModelError::BadShape(
                "row range past the matrix or splitting a repacked row group",
            ));
        }
        let (a, b) = (r0 * rb, (r0 + rows) * rb);
        let data = if self.data.is_empty() {
            self.data
        } else {
            self.data
                .get(a..b)
                .ok_or(ModelError::BadShape("row range past the matrix's bytes"))?
        };
        let file = if self.file.len == 0 {
            self.file
        } else {
            Span {
                offset: self.file.offset + a as u64,
                len: (b - a) as u64,
            }
        };
        Ok(Tensor {
            data,
            rows,
            file,
            ..*self
        })
    }
}

/// A 1-D f32 vector (norm gains, biases).
pub type Vector<'a> = &'a [f32];

/// Input embeddings: rows `0..resident.rows` from memory (a tied head that is resident),
/// the others read from the file on demand.
#[derive(Clone, Copy, Debug)]
pub struct Embedding<'a> {
    pub ty: GgmlType,
    pub cols: usize,
    pub rows: usize,
    pub row_bytes: usize,
    /// File offset of row 0.
    pub offset: u64,
    pub resident: Tensor<'a>,
}

/// LM head rows streamed from the file in chunks.
#[derive(Clone, Copy, Debug)]
pub struct HeadStream {
    /// File offset of head row 0 (resident rows included) and bytes per row.
    pub offset: u64,
    pub row_bytes: usize,
    /// All rows of the head (the resident ones are `Weights::output`).
    pub rows: usize,
    pub chunk_rows: usize,
}

/// All weights of a dense model.
pub struct Weights<'a> {
    pub token_embd: Embedding<'a>,
    pub output_norm: Vector<'a>,
    /// The resident rows of `output.weight`, or of `token_embd.weight` when the output
    /// is tied: all of them unless `head_stream` says otherwise.
    pub output: Tensor<'a>,
    /// The head's streamed rows (`output.rows..head_stream.rows`), if any.
    pub head_stream: Option<HeadStream>,
    /// What is resident and what is streamed.
    pub plan: ResidencyPlan,
    /// Pruned LM head (see `crate::head`): `output` row `j` is vocabulary id
    /// `head_ids[j]`, and every other id gets logit -inf. `None`: the full head.
    pub head_ids: Option<&'a [u32]>,
    pub layers: heapless::Vec<Layer<'a>, MAX_LAYERS>,
}

impl Weights<'_> {
    /// Rows of the LM head (vocabulary, or the pruned head's rows).
    pub fn head_rows(&self) -> usize {
        self.head_stream.map_or(self.output.rows, |h| h.rows)
    }
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

    /// `len` bytes of the file at `offset` into a fresh arena buffer.
    fn read_span(
        &mut self,
        offset: u64,
        len: usize,
        account: &'static str,
    ) -> Result<&'a mut [u8], ModelError> {
        let buf = self.arena.bytes(account, len)?;
        read_exact(self.platform, self.file, offset, buf)?;
        Ok(buf)
    }

    fn read(
        &mut self,
        info: &TensorInfo,
        account: &'static str,
    ) -> Result<&'a mut [u8], ModelError> {
        self.read_span(info.offset, info.bytes as usize, account)
    }

    /// The tensor `name` after checking it is a `cols` x `rows` matrix pinch can use.
    fn checked(
        &self,
        name: &str,
        cols: usize,
        rows: Option<usize>,
    ) -> Result<TensorInfo<'g>, ModelError> {
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
        Ok(info)
    }

    /// A matrix with `cols` values per row; checks the shape.
    pub fn matrix(
        &mut self,
        name: &str,
        cols: usize,
        rows: Option<usize>,
    ) -> Result<Tensor<'a>, ModelError> {
        let info = self.checked(name, cols, rows)?;
        let data = self.read(&info, "weights")?;
        Ok(Tensor {
            ty: info.ty,
            cols,
            rows: info.dims[1] as usize,
            data,
            layout: pinch_kernels::repack::Layout::Plain,
            file: Span {
                offset: info.offset,
                len: info.bytes,
            },
        })
    }

    /// A matrix of a layer: read (resident) or only described (`streamed`: its bytes are
    /// viewed in a stream zone when the layer runs).
    pub fn layer_matrix(
        &mut self,
        name: &str,
        cols: usize,
        rows: usize,
        streamed: bool,
    ) -> Result<Tensor<'a>, ModelError> {
        if !streamed {
            return self.matrix(name, cols, Some(rows));
        }
        let info = self.checked(name, cols, Some(rows))?;
        Ok(Tensor {
            ty: info.ty,
            cols,
            rows,
            data: &[],
            layout: pinch_kernels::repack::Layout::Plain,
            file: Span {
                offset: info.offset,
                len: info.bytes,
            },
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
        let info = self.checked(info.name, cols, Some(rows))?;
        let rb = info.bytes as usize / rows.max(1);
        let data = self.arena.bytes("weights", rb * ids.len())?;
        for (j, &id) in ids.iter().enumerate() {
            if id as usize >= rows {
                return Err(ModelError::BadToken { id, n_vocab: rows });
            }
            let off = info.offset + (id as usize * rb) as u64;
            read_exact(
                self.platform,
                self.file,
                off,
                &mut data[j * rb..(j + 1) * rb],
            )?;
        }
        Ok(Tensor {
            ty: info.ty,
            cols,
            rows: ids.len(),
            data,
            layout: pinch_kernels::repack::Layout::Plain,
            file: Span::default(),
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

    pub fn opt_vector(&mut self, name: &str, n: usize) -> Result<Option<Vector<'a>>, ModelError> {
        if self.info(name).is_some() {
            self.vector(name, n).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Load every weight of a dense model with config `c`, all resident.
    pub fn load(&mut self, c: &Config) -> Result<Weights<'a>, ModelError> {
        self.load_with_head(c, None)
    }

    /// [`Self::load`] with a pruned LM head of vocabulary ids `head` (increasing).
    pub fn load_with_head(
        &mut self,
        c: &Config,
        head: Option<&'a [u32]>,
    ) -> Result<Weights<'a>, ModelError> {
        let plan = residency::plan(self.gguf, c, None, head.map(|h| h.len()))
            .map_err(|_| ModelError::BadShape("no residency plan"))?;
        self.load_planned(c, head, &plan)
    }

    /// Load the resident weights of `plan` and describe the streamed ones. A pruned head
    /// (`head`) is read row by row from the file, so the full matrix never enters memory.
    pub fn load_planned(
        &mut self,
        c: &Config,
        head: Option<&'a [u32]>,
        plan: &ResidencyPlan,
    ) -> Result<Weights<'a>, ModelError> {
        let embd_info = self.checked("token_embd.weight", c.n_embd, Some(c.n_vocab))?;
        let output_norm = self.vector(c.output_norm_name, c.n_embd)?;
        // A recut file (`pinch recut`) stores only the kept rows and their ids.
        let stored = crate::head::ids_from_gguf(self.gguf, c.n_vocab, self.arena)?;
        if stored.is_some() && head.is_some() {
            return Err(ModelError::BadShape(
                "the file already has a pruned head (recut); do not prune it again",
            ));
        }
        let head_ids = stored.or(head);
        let out_info = self.info("output.weight");
        let tied = out_info.is_none();
        let mut head_stream = None;
        let output = match head {
            Some(ids) => self.rows_of(&out_info.unwrap_or(embd_info), c.n_embd, c.n_vocab, ids)?,
            None => {
                let rows = head_ids.map_or(c.n_vocab, |h| h.len());
                let name = if tied {
                    "token_embd.weight"
                } else {
                    "output.weight"
                };
                let info = self.checked(name, c.n_embd, Some(rows))?;
                let rb = info.bytes as usize / rows.max(1);
                let keep = plan.head_resident_rows.min(rows);
                if keep < rows {
                    head_stream = Some(HeadStream {
                        offset: info.offset,
                        row_bytes: rb,
                        rows,
                        chunk_rows: plan.head_chunk_rows.max(1),
                    });
                }
                let data = self.read_span(info.offset, keep * rb, "weights")?;
                Tensor {
                    ty: info.ty,
                    cols: c.n_embd,
                    rows: keep,
                    data,
                    layout: pinch_kernels::repack::Layout::Plain,
                    file: Span {
                        offset: info.offset,
                        len: (keep * rb) as u64,
                    },
                }
            }
        };
        let token_embd = Embedding {
            ty: embd_info.ty,
            cols: c.n_embd,
            rows: c.n_vocab,
            row_bytes: embd_info.bytes as usize / c.n_vocab.max(1),
            offset: embd_info.offset,
            resident: if tied && head.is_none() {
                output
            } else {
                Tensor {
                    ty: embd_info.ty,
                    cols: c.n_embd,
                    rows: 0,
                    data: &[],
                    layout: pinch_kernels::repack::Layout::Plain,
                    file: Span::default(),
                }
            },
        };
        if c.n_layer > MAX_LAYERS {
            return Err(ModelError::BadShape(
                "more layers than pinch supports (128)",
            ));
        }
        let mut layers = heapless::Vec::new();
        for il in 0..c.n_layer {
            let stream = if il >= plan.resident_layers {
                let span = residency::layer_span(self.gguf, il)
                    .ok_or(ModelError::MissingTensorNamed(name_buf(
                        Names::new(il).get("attn_norm.weight"),
                    )))?
                    .aligned();
                Some(LayerStream { span })
            } else {
                None
            };
            let paged = plan.experts.pages();
            let _ = layers.push(Layer::load(self, c, il, stream, paged)?);
        }
        Ok(Weights {
            token_embd,
            output_norm,
            output,
            head_stream,
            plan: *plan,
            head_ids,
            layers,
        })
    }
}

/// Fill `buf` from `offset` of `file` (buffered read).
pub fn read_exact<P: Platform>(
    p: &P,
    file: &P::File,
    offset: u64,
    buf: &mut [u8],
) -> Result<(), ModelError> {
    read_exact_via(p, file, offset, buf, false)
}

/// [`read_exact`], uncached (`Platform::read_at`'s direct path) when `direct`.
pub fn read_exact_via<P: Platform>(
    p: &P,
    file: &P::File,
    offset: u64,
    buf: &mut [u8],
    direct: bool,
) -> Result<(), ModelError> {
    let mut done = 0usize;
    while done < buf.len() {
        let got = p
            .read_at(file, offset + done as u64, &mut buf[done..], direct)
            .map_err(ModelError::Platform)?;
        if got == 0 {
            return Err(ModelError::ShortRead {
                offset: offset + done as u64,
            });
        }
        done += got;
    }
    Ok(())
}

/// Tensor-name buffer for errors (names are short).
pub type NameBuf = heapless::String<64>;

pub(crate) fn name_buf(s: &str) -> NameBuf {
    let mut b = NameBuf::new();
    let _ = b.push_str(&s[..s.len().min(64)]);
    b
}

/// The GGUF names of layer `il`'s tensors (`blk.{il}.{suffix}`).
pub struct Names {
    il: usize,
    buf: heapless::String<64>,
}

impl Names {
    pub fn new(il: usize) -> Names {
        Names {
            il,
            buf: heapless::String::new(),
        }
    }
    pub fn get(&mut self, suffix: &str) -> &str {
        self.buf.clear();
        let _ = write!(self.buf, "blk.{}.{}", self.il, suffix);
        &self.buf
    }
}
