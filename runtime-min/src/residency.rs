//! The residency plan: which weights stay in memory and which are streamed from flash.
//!
//! Computed from the GGUF header, the budget and the session's sizes before a weight
//! byte is read. Every weight of a dense model is read once per token, so a resident
//! byte saves the same read wherever it sits; what decides is granularity and use:
//!
//! - norm gains and biases: always resident (tiny, dequantized to f32 at load);
//! - input embeddings: never resident for their own sake; rows are read on demand
//!   into a small cache (a tied head that is resident serves them for free);
//! - transformer layers: whole layers, resident from the first one on, because every
//!   token (prompt tokens included) passes through every layer;
//! - the LM head last, row by row with what is left: a prompt batch computes logits
//!   only for its last position, so the head is the weight used least per byte.
//!
//! A mixture-of-experts model that does not fit is planned differently ([`ExpertPlan`]):
//! every non-expert weight stays resident (attention, norms, routers, shared experts, the
//! whole head), and what is left becomes a pool of expert slots per MoE layer, filled
//! from the file as the routers pick experts (`crate::pager::paged`). Only when even the
//! non-expert weights do not fit are whole layers streamed as for a dense model.
//!
//! What is not resident is streamed: each streamed layer is one aligned read of its
//! tensors' span, the head's streamed rows are read in chunks of the same size, into
//! two zones (one being computed on, one being filled).
use crate::gguf::{Gguf, TensorInfo};
use crate::model::Config;

/// Alignment of direct (uncached) reads: offsets, lengths and buffers.
pub const IO_ALIGN: u64 = 4096;
/// Zones the streamer cycles through: one computed on while the next is read.
pub const STREAM_ZONES: usize = 2;
/// Input-embedding rows cached after an on-demand read.
pub const EMBD_CACHE_ROWS: usize = 64;
/// The arena's per-allocation alignment slack.
const SLACK: u64 = 64;

/// A byte range of the model file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Span {
    pub offset: u64,
    pub len: u64,
}

impl Span {
    /// The span widened to whole `IO_ALIGN` blocks (what a direct read fetches).
    pub fn aligned(&self) -> Span {
        let start = self.offset / IO_ALIGN * IO_ALIGN;
        let end = (self.offset + self.len).div_ceil(IO_ALIGN) * IO_ALIGN;
        Span {
            offset: start,
            len: end - start,
        }
    }
}

impl Span {
    /// Bytes a direct read of this span's aligned form returns from a file of
    /// `file_len` bytes (the last block may be cut short by the end of the file).
    pub fn read_len(&self, file_len: u64) -> u64 {
        let a = self.aligned();
        (a.offset + a.len).min(file_len).saturating_sub(a.offset)
    }
}

/// What the plan decided, and what it costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ResidencyPlan {
    pub n_layer: usize,
    /// Layers `0..resident_layers` are resident; the rest are streamed.
    pub resident_layers: usize,
    /// LM head rows (vocabulary size, or the pruned head's rows).
    pub head_rows: usize,
    pub head_row_bytes: u64,
    /// Head rows `0..head_resident_rows` are resident; the rest are streamed in
    /// chunks of `head_chunk_rows`.
    pub head_resident_rows: usize,
    pub head_chunk_rows: usize,
    /// Bytes of each stream zone (0: nothing is streamed).
    pub zone_bytes: u64,
    /// Resident bytes by kind (each with the arena's alignment slack).
    pub layer_bytes: u64,
    pub head_bytes: u64,
    pub vector_bytes: u64,
    pub embd_cache_bytes: u64,
    /// Bytes read from storage per weight pass (one generated token), aligned reads.
    pub streamed_per_pass: u64,
    /// Paged experts (MoE models only; `layers == 0`: none).
    pub experts: ExpertPlan,
}

/// The expert pager's share of the plan: a pool of `slots` expert slots in each of the
/// `layers` MoE layers, plus staging slots (`crate::pager::paged::staging_slots`), one
/// transient slot for experts the pools do not admit, and the repack scratch
/// (`crate::pager::paged::repack_scratch_bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ExpertPlan {
    /// MoE layers whose experts are paged (0: every expert resident).
    pub layers: usize,
    pub n_expert: usize,
    /// Experts each token uses per layer.
    pub n_used: usize,
    /// Slots per paged layer (at most `n_expert`).
    pub slots: usize,
    /// Bytes of one slot, summed over the paged layers (slots differ by quant type).
    pub slot_bytes_sum: u64,
    /// The largest slot (the size of the transient and each staging slot).
    pub slot_bytes_max: u64,
    /// Bytes one expert read fetches (three aligned reads), summed over paged layers.
    pub read_bytes_sum: u64,
    /// Pools, staging and transient slots, repack scratch and the pools' bookkeeping.
    pub bytes: u64,
}

impl ExpertPlan {
    pub fn pages(&self) -> bool {
        self.layers > 0
    }
    /// Expected bytes read per token if routing were uniform (a pool of `slots` of
    /// `n_expert` then misses `1 - slots / n_expert` of the picks).
    pub fn uniform_read_per_token(&self) -> u64 {
        let miss = 1.0 - self.slots as f64 / self.n_expert.max(1) as f64;
        (self.n_used as f64 * miss * self.read_bytes_sum as f64) as u64
    }
    /// Bytes read per token when every pick misses (the most a token can cost).
    pub fn worst_read_per_token(&self) -> u64 {
        self.n_used as u64 * self.read_bytes_sum
    }
}

/// Bytes a slot part holding `len` bytes read at any offset takes: the aligned read
/// covers at most the length rounded up to whole blocks plus one block.
pub fn slot_part_bytes(len: u64) -> u64 {
    len.div_ceil(IO_ALIGN) * IO_ALIGN + IO_ALIGN
}

/// A 3-D expert stack (`ffn_{gate,up,down}_exps`): paged by experts under a budget.
pub fn is_expert_stack(t: &TensorInfo) -> bool {
    t.dims[2] > 1 && t.name.ends_with("_exps.weight")
}

/// One paged layer's expert sizes from its three stacks: slot bytes, bytes of one
/// expert's aligned reads, resident bytes of its stacks, and the largest group of rows
/// any layout of theirs can repack at once (the repack scratch); `None` for a dense
/// layer.
struct ExpertSizes {
    slot: u64,
    read: u64,
    resident: u64,
    group_bytes: u64,
}

fn expert_sizes(g: &Gguf, il: usize, file_len: u64) -> Option<ExpertSizes> {
    let mut slot = 0;
    let mut read = 0;
    let mut resident = 0;
    let mut group_bytes = 0;
    let mut n = 0;
    for t in layer_matrices(g, il).filter(is_expert_stack) {
        let ne = t.dims[2].max(1);
        let eb = t.bytes / ne;
        let group_rows = pinch_kernels::repack::Layout::max_group_rows(t.ty) as u64;
        if group_rows > 1 {
            group_bytes = group_bytes.max(group_rows * (eb / t.dims[1].max(1)));
        }
        slot += slot_part_bytes(eb);
        // Expert 1's aligned read (a middle expert: neither end of the file).
        let e1 = Span {
            offset: t.offset + eb.min(t.bytes - eb),
            len: eb,
        };
        read += e1.read_len(file_len);
        resident += t.bytes + SLACK;
        n += 1;
    }
    (n > 0).then_some(ExpertSizes {
        slot,
        read,
        resident,
        group_bytes,
    })
}

/// Every paged layer's (layer index, slot bytes, bytes one expert read fetches).
pub fn expert_layers<'g>(
    g: &'g Gguf<'g>,
    n_layer: usize,
) -> impl Iterator<Item = (usize, u64, u64)> + 'g {
    (0..n_layer).filter_map(move |il| expert_sizes(g, il, g.file_len).map(|x| (il, x.slot, x.read)))
}

/// The expert-paged plan under `budget`, from the all-resident one; `Err` holds the
/// least it needs (every pool empty).
fn expert_plan(
    g: &Gguf,
    cfg: &Config,
    all: &ResidencyPlan,
    budget: u64,
) -> Result<ResidencyPlan, u64> {
    let Some(m) = cfg.moe else {
        return Err(u64::MAX);
    };
    let mut e = ExpertPlan {
        n_expert: m.n_expert,
        n_used: m.n_used,
        ..ExpertPlan::default()
    };
    let mut stacks = 0;
    let mut group_bytes = 0;
    for il in 0..cfg.n_layer {
        if let Some(x) = expert_sizes(g, il, g.file_len) {
            e.layers += 1;
            e.slot_bytes_sum += x.slot;
            e.slot_bytes_max = e.slot_bytes_max.max(x.slot);
            e.read_bytes_sum += x.read;
            stacks += x.resident;
            group_bytes = group_bytes.max(x.group_bytes);
        }
    }
    if e.layers == 0 {
        return Err(u64::MAX);
    }
    let book =
        e.layers as u64 * (crate::pager::PoolMem::bytes_needed(m.n_expert) as u64 + IO_ALIGN);
    // The transient slot and the staging slots, each as large as the largest slot, and
    // the scratch the readers repack parts through.
    let extra = (1 + crate::pager::paged::staging_slots(m.n_expert, m.n_used) as u64)
        * e.slot_bytes_max
        + crate::pager::paged::repack_scratch_bytes(group_bytes);
    let base = all.bytes() - stacks + book + extra + IO_ALIGN;
    if base > budget {
        return Err(base);
    }
    e.slots = (((budget - base) / e.slot_bytes_sum.max(1)) as usize).min(m.n_expert);
    e.bytes = book + extra + IO_ALIGN + e.slots as u64 * e.slot_bytes_sum;
    Ok(ResidencyPlan {
        layer_bytes: all.layer_bytes - stacks,
        experts: e,
        ..*all
    })
}

impl ResidencyPlan {
    /// Resident weight bytes plus stream zones and the embedding cache.
    pub fn bytes(&self) -> u64 {
        self.layer_bytes
            + self.head_bytes
            + self.vector_bytes
            + self.embd_cache_bytes
            + self.zone_total()
            + self.experts.bytes
    }
    /// Bytes of all stream zones (with alignment slack).
    pub fn zone_total(&self) -> u64 {
        if self.zone_bytes == 0 {
            0
        } else {
            STREAM_ZONES as u64 * self.zone_bytes + IO_ALIGN
        }
    }
    pub fn streams(&self) -> bool {
        self.zone_bytes > 0
    }
    /// Whether some LM head rows are streamed.
    pub fn head_streams(&self) -> bool {
        self.head_resident_rows < self.head_rows
    }
    pub fn streamed_layers(&self) -> usize {
        self.n_layer - self.resident_layers
    }
    pub fn head_chunks(&self) -> usize {
        let rest = self.head_rows - self.head_resident_rows;
        if rest == 0 {
            0
        } else {
            rest.div_ceil(self.head_chunk_rows.max(1))
        }
    }
    /// Head rows of streamed chunk `i` (absolute row indices).
    pub fn head_chunk(&self, i: usize) -> core::ops::Range<usize> {
        let start = self.head_resident_rows + i * self.head_chunk_rows;
        start..(start + self.head_chunk_rows).min(self.head_rows)
    }
}

/// Why no plan fits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoPlan {
    /// The smallest weight memory any plan needs (everything streamed).
    pub min_bytes: u64,
}

/// The matrices of layer `il`: every tensor named `blk.{il}.*` with more than one row.
/// Its 1-D tensors (norm gains, biases) are always resident (dequantized at load); the
/// blocks load every matrix through `Loader::layer_matrix`, so this is what a streamed
/// layer's read must fetch, whatever the layer's kinds.
pub fn layer_matrices<'g>(g: &'g Gguf<'g>, il: usize) -> impl Iterator<Item = TensorInfo<'g>> + 'g {
    let mut prefix: heapless::String<24> = heapless::String::new();
    let _ = core::fmt::write(&mut prefix, format_args!("blk.{il}."));
    g.tensors()
        .filter(move |t| t.name.starts_with(prefix.as_str()) && t.dims[1] > 1)
}

/// The file span of layer `il`'s matrices (one read fetches all of them).
pub fn layer_span(g: &Gguf, il: usize) -> Option<Span> {
    let mut lo = u64::MAX;
    let mut hi = 0u64;
    for t in layer_matrices(g, il) {
        lo = lo.min(t.offset);
        hi = hi.max(t.offset + t.bytes);
    }
    (hi > lo).then(|| Span {
        offset: lo,
        len: hi - lo,
    })
}

/// Resident bytes of layer `il`'s matrices as the loader lays them out.
fn layer_matrix_bytes(g: &Gguf, il: usize) -> u64 {
    layer_matrices(g, il).map(|t| t.bytes + SLACK).sum()
}

/// The tensor that holds the LM head rows in the file (output, or the tied embedding).
pub fn head_tensor<'g>(g: &'g Gguf<'g>) -> Option<TensorInfo<'g>> {
    g.tensor("output.weight")
        .or_else(|| g.tensor("token_embd.weight"))
}

/// Bytes of the 1-D tensors (dequantized to f32 at load, read through a scratch copy).
fn vector_bytes(g: &Gguf) -> u64 {
    g.tensors()
        .filter(|t| t.dims[1] == 1 && t.dims[2] == 1 && t.dims[3] == 1)
        .map(|t| 4 * t.dims[0] + SLACK + t.bytes + SLACK)
        .sum()
}

/// Plan residency so that the weights take at most `weight_budget` bytes (`None`: all
/// resident). `pruned_rows`: a head pruned at load to that many rows (kept resident:
/// its rows are scattered in the file). A recut file's smaller head is read from the
/// file's own `output.weight` shape.
pub fn plan(
    g: &Gguf,
    cfg: &Config,
    weight_budget: Option<u64>,
    pruned_rows: Option<usize>,
) -> Result<ResidencyPlan, NoPlan> {
    plan_with(g, cfg, weight_budget, pruned_rows, false)
}

/// [`plan`]; `keep_head`: the whole LM head stays resident and only layers stream (for
/// MTP drafts, each of which reads the head: `crate::model::mtp`).
pub fn plan_with(
    g: &Gguf,
    cfg: &Config,
    weight_budget: Option<u64>,
    pruned_rows: Option<usize>,
    keep_head: bool,
) -> Result<ResidencyPlan, NoPlan> {
    let n_layer = cfg.n_layer;
    let head = head_tensor(g);
    let (file_rows, head_total_bytes) = head.map_or((0, 0), |t| (t.dims[1] as usize, t.bytes));
    let head_row_bytes = head_total_bytes / (file_rows.max(1) as u64);
    let head_rows = pruned_rows.unwrap_or(file_rows);
    let tied = g.tensor("output.weight").is_none();
    let embd_row_bytes = g
        .tensor("token_embd.weight")
        .map_or(0, |t| t.bytes / t.dims[1].max(1));
    let layers: u64 = (0..n_layer).map(|il| layer_matrix_bytes(g, il)).sum();
    let head_all = head_rows as u64 * head_row_bytes + SLACK;
    let vectors = vector_bytes(g);
    let embd_cache = EMBD_CACHE_ROWS as u64 * embd_row_bytes + SLACK;
    let all = ResidencyPlan {
        n_layer,
        resident_layers: n_layer,
        head_rows,
        head_row_bytes,
        head_resident_rows: head_rows,
        head_chunk_rows: 0,
        zone_bytes: 0,
        layer_bytes: layers,
        head_bytes: head_all,
        vector_bytes: vectors,
        // A resident tied head serves the input rows.
        embd_cache_bytes: if tied && pruned_rows.is_none() {
            0
        } else {
            embd_cache
        },
        streamed_per_pass: 0,
        experts: ExpertPlan::default(),
    };
    let Some(budget) = weight_budget else {
        return Ok(all);
    };
    if all.bytes() <= budget {
        return Ok(all);
    }
    let expert_min = match expert_plan(g, cfg, &all, budget) {
        Ok(p) => return Ok(p),
        Err(min) => min,
    };
    // Streaming: zones hold the largest layer span or a head chunk of the same size.
    let zone = (0..n_layer)
        .filter_map(|il| layer_span(g, il))
        .map(|s| s.aligned().len + IO_ALIGN)
        .max()
        .unwrap_or(0)
        .max(64 * head_row_bytes + 2 * IO_ALIGN);
    let head_chunk_rows = if pruned_rows.is_some() || keep_head {
        0 // a head pruned at load stays resident
    } else {
        (((zone - 2 * IO_ALIGN) / head_row_bytes.max(1)) as usize / 16 * 16).max(16)
    };
    let mut p = ResidencyPlan {
        zone_bytes: zone,
        head_chunk_rows,
        embd_cache_bytes: embd_cache,
        resident_layers: 0,
        layer_bytes: 0,
        head_resident_rows: 0,
        head_bytes: SLACK,
        ..all
    };
    if pruned_rows.is_some() || keep_head {
        p.head_resident_rows = head_rows;
        p.head_bytes = head_all;
    }
    if keep_head {
        // A resident tied head serves the input rows, as when nothing streams.
        p.embd_cache_bytes = all.embd_cache_bytes;
    }
    if p.bytes() > budget {
        return Err(NoPlan {
            min_bytes: p.bytes().min(expert_min),
        });
    }
    let mut left = budget - p.bytes();
    for il in 0..n_layer {
        let b = layer_matrix_bytes(g, il);
        if b > left {
            break;
        }
        left -= b;
        p.layer_bytes += b;
        p.resident_layers += 1;
    }
    if pruned_rows.is_none() && !keep_head && p.resident_layers == n_layer {
        let rows = (left / head_row_bytes.max(1)) as usize / 16 * 16;
        p.head_resident_rows = rows.min(head_rows);
        p.head_bytes += p.head_resident_rows as u64 * head_row_bytes;
    }
    let mut per_pass = 0;
    for il in p.resident_layers..n_layer {
        per_pass += layer_span(g, il).map_or(0, |s| s.read_len(g.file_len));
    }
    if let Some(h) = head {
        for i in 0..p.head_chunks() {
            let r = p.head_chunk(i);
            per_pass += head_rows_span(&h, head_row_bytes, r).read_len(g.file_len);
        }
    }
    p.streamed_per_pass = per_pass;
    if p.streamed_per_pass == 0 {
        p.zone_bytes = 0;
    }
    Ok(p)
}

/// The file span of head rows `r` of tensor `h`.
pub fn head_rows_span(h: &TensorInfo, row_bytes: u64, r: core::ops::Range<usize>) -> Span {
    Span {
        offset: h.offset + r.start as u64 * row_bytes,
        len: (r.end - r.start) as u64 * row_bytes,
    }
}
