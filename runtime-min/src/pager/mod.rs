//! The expert pager's decisions for mixture-of-experts models under a budget.
//!
//! Only the non-expert weights and a pool of expert slots per MoE layer stay in memory;
//! the pool's hit rate sets the speed on flash. This module holds what is policy, with
//! no I/O: which experts of a layer sit in its slots and which to evict ([`pool`]), the
//! compact record of which experts each token used ([`trace`], written by a run and
//! replayed by `pinch moe-sim`), and the replay itself ([`sim`]), which also computes the
//! best fixed pool for a trace (each layer's most used experts) to judge a policy by.
//! [`paged`] is the I/O side: the pools' slots in the arena, filled from the file during
//! the forward pass, behind the MoE block's weight access.
pub mod paged;
pub mod pool;
pub mod sim;
pub mod trace;

pub use paged::{ExpertPager, Io, PagerError, PagerStats, Routing};
pub use pool::{Access, Policy, Pool, PoolArrays, PoolError, PoolMem};
pub use sim::{simulate, LayerStats, SimReport};
pub use trace::{Trace, TraceError, TraceWriter};

/// Most experts per MoE layer the pager tracks (Qwen3 MoE 128, Ling 256).
pub const MAX_EXPERTS: usize = 512;
