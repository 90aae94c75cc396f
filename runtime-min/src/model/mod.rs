//! Models: config, weights, the blocks a layer is made of, and the forward pass.
//!
//! One forward pass ([`forward`]) serves every architecture: a layer is its blocks
//! ([`layer`]: a token mixer and a feed-forward, each kind in its own file), and the
//! per-architecture differences are data in [`config::Config`]. Two arithmetic modes
//! share it: [`Math::Reference`] dequantizes weights to f32 and never quantizes
//! activations (the oracle), [`Math::Fast`] quantizes activations like llama.cpp and uses
//! the SIMD kernels.
//!
//! - [`config`]: hyper-parameters and per-layer kinds from the GGUF metadata; [`hybrid`]:
//!   those of the recurrent architectures (qwen35, lfm2), the recurrent state and its
//!   checkpoint;
//! - [`weights`]: the loader and the model's tensors; [`layer`]: a layer's blocks, their
//!   matrices (for streaming and repacking) and per-layer state;
//! - blocks: token mixers [`attention`] (optionally gated), [`deltanet`] (Gated
//!   DeltaNet), [`shortconv`] (short convolution); feed-forwards [`ffn_dense`] and
//!   [`ffn_moe`] ([`moe_route`]: which experts a token runs);
//! - [`forward`]: the session (position, state, scratch) and the pass; [`matmul`]: matrix
//!   products over the workers; [`scratch`]: the shared activations; [`kv`]: a KV plane;
//!   [`stream`]: weights read from the file alongside the pass.
pub mod attention;
pub mod config;
pub mod deltanet;
pub mod draft_log;
pub mod ffn_dense;
pub mod ffn_moe;
pub mod forward;
pub mod hybrid;
pub mod kv;
pub mod layer;
pub mod matmul;
pub mod moe_route;
pub mod mtp;
pub mod scratch;
pub mod shortconv;
pub mod stream;
pub mod weights;

use pinch_kernels::GgmlType;

pub use config::{Arch, Config};
pub use forward::{Logits, Math, Op, Placement, Session, SessionOptions};
pub use kv::KvType;
pub use weights::{Loader, Tensor, Weights};

use crate::arena::ArenaError;
use crate::platform::PlatformError;
use weights::NameBuf;

/// Why a model could not be loaded or run.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ModelError {
    MissingKey(&'static str),
    UnsupportedArch,
    MissingTensor(&'static str),
    MissingTensorNamed(NameBuf),
    TensorShape {
        name: NameBuf,
        expected: [u64; 2],
        found: [u64; 2],
    },
    UnsupportedType {
        name: NameBuf,
        ty: GgmlType,
    },
    BadShape(&'static str),
    Arena(ArenaError),
    Platform(PlatformError),
    ShortRead {
        offset: u64,
    },
    /// The tokens do not fit in the context window.
    ContextFull {
        n_ctx: usize,
        needed: usize,
    },
    /// A token id outside the vocabulary.
    BadToken {
        id: u32,
        n_vocab: usize,
    },
    Kernel(pinch_kernels::matvec::KernelError),
    /// `--verify-stream`: a streamed byte differs from the file.
    StreamMismatch {
        offset: u64,
    },
    /// Input embedding rows must be read from the file, but the session has no reader.
    NoReader,
    /// The expert pager could not read or place an expert.
    Pager(crate::pager::PagerError),
    /// `Session::truncate` to a position the session cannot return to.
    Truncate {
        to: usize,
        n_past: usize,
    },
    /// `Session::truncate` of a model with recurrent layers to a position between 0 and
    /// the current one: their state holds only the latest position (and the checkpoint,
    /// if kept, another one).
    TruncateRecurrent {
        to: usize,
        n_past: usize,
    },
    /// Several sequences (`--parallel` above 1) of a model with recurrent layers: a
    /// session keeps one recurrent state.
    ParallelRecurrent,
    /// A sequence id at or above the session's sequence count, or twice in one pass.
    BadSeq {
        seq: usize,
        n_seq: usize,
    },
}

impl From<ArenaError> for ModelError {
    fn from(e: ArenaError) -> Self {
        ModelError::Arena(e)
    }
}

impl From<pinch_kernels::matvec::KernelError> for ModelError {
    fn from(e: pinch_kernels::matvec::KernelError) -> Self {
        ModelError::Kernel(e)
    }
}

impl core::fmt::Display for ModelError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ModelError::MissingKey(k) => write!(f, "missing metadata key '{k}'"),
            ModelError::UnsupportedArch => write!(
                f,
                "unsupported architecture (pinch runs llama, qwen2, qwen3, gemma3, qwen3moe, bailingmoe2, qwen35, lfm2)"
            ),
            ModelError::MissingTensor(n) => write!(f, "missing tensor '{n}'"),
            ModelError::MissingTensorNamed(n) => write!(f, "missing tensor '{n}'"),
            ModelError::TensorShape {
                name,
                expected,
                found,
            } => {
                write!(
                    f,
                    "tensor '{name}' has shape {found:?}, expected {expected:?}"
                )
            }
            ModelError::UnsupportedType { name, ty } => {
                write!(
                    f,
                    "tensor '{name}' has type {} which pinch cannot compute with",
                    ty.name()
                )
            }
            ModelError::BadShape(what) => write!(f, "bad model shape: {what}"),
            ModelError::Arena(e) => write!(f, "{e}"),
            ModelError::Platform(e) => write!(f, "{e}"),
            ModelError::ShortRead { offset } => {
                write!(f, "file ends early: short read at offset {offset}")
            }
            ModelError::ContextFull { n_ctx, needed } => write!(
                f,
                "context full: {needed} tokens needed but the context holds {n_ctx} (raise -c)"
            ),
            ModelError::BadToken { id, n_vocab } => {
                write!(f, "token id {id} outside the vocabulary of {n_vocab}")
            }
            ModelError::Kernel(e) => write!(f, "{e}"),
            ModelError::StreamMismatch { offset } => write!(
                f,
                "--verify-stream: the streamed weight byte at file offset {offset} differs from the file"
            ),
            ModelError::Pager(e) => write!(f, "{e}"),
            ModelError::Truncate { to, n_past } => write!(
                f,
                "cannot return the session to position {to}: it holds {n_past} positions"
            ),
            ModelError::TruncateRecurrent { to, n_past } => write!(
                f,
                "cannot return the session to position {to} of {n_past}: the model's recurrent state holds only the latest position (start again from 0)"
            ),
            ModelError::ParallelRecurrent => write!(
                f,
                "--parallel above 1 needs a model without recurrent layers: qwen35 and lfm2 keep one recurrent state, for one sequence"
            ),
            ModelError::BadSeq { seq, n_seq } => write!(
                f,
                "sequence {seq} is not one of the session's {n_seq} sequences, or appears twice in one pass"
            ),
            ModelError::NoReader => write!(
                f,
                "weights or embedding rows must be read from the model file, but the session has no reader"
            ),
        }
    }
}
