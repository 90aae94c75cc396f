//! The pager in the forward pass: each paged MoE layer's pool of expert slots in the
//! arena, filled from the model file as its router picks experts.
//!
//! The MoE block asks for a batch's experts once, after routing ([`ExpertPager::prepare`]
//! with the union of the batch's picks, ascending): the [`Pool`] says which are resident
//! and where to put the others: an admitted miss into its pool slot, one the pool does
//! not admit (LFU keeps something more used) into a staging slot, and past those into
//! the transient slot just before it is computed. [`ExpertPager::each`] then reads the
//! misses, each of an expert's three matrices (its rows of `ffn_{gate,up,down}_exps`)
//! as one aligned direct read, and hands the block every expert: on the platform's
//! reader pool (threads made once for the run, `--moe-readers`) up to
//! [`ExpertPager::readers`] reads run at once, taken from the batch's queue of reads in
//! order (an expert's three parts, then the next expert's), while the compute thread
//! works through the experts already in memory and sleeps only until the one it needs
//! next is in; a platform with an I/O thread but no pool starts reader threads for
//! the batch through it (as before the pool); with neither, the reads are spread over the workers first. The bytes an expert is
//! computed from are the file's bytes
//! whichever way they came, and the block adds the experts' outputs in a fixed order,
//! so its output is the all-resident one bit for bit.
//!
//! Repacked slots ([`ExpertPager::repack_slots`]): each part (gate, up, down) may have a
//! layout of the CPU's kernels (`Layout::preferred`: Q2_K experts in Q2Kx8 on aarch64,
//! Q4_K in Q4Kx4, ...); the reader that brings a part in rearranges its rows in place in
//! the slot, through one of a few small scratch buffers, so every later use of the expert
//! runs the repacked kernels. Repacked products are the plain kernels' bits
//! (`pinch_kernels::repack`), so this changes the speed, not the output. Each read then
//! costs a repack, so `pinch run` does it only where that was measured to pay
//! ([`repack_pays`]: Q2_K).
//!
//! Pre-gated prefetch ([`ExpertPager::prefetch_into`]): the next MoE layer's router
//! applied to the current layer's input guesses its picks; the guessed experts that
//! are missing are read, after the batch's misses, into a slot the pool gives them or
//! else a staging slot. A wrong guess costs a read, never a wrong number: prepare
//! checks the pool and the staging slots as always.
//!
//! # Invariants
//! A slot's bytes are the file bytes of the expert the pool says it holds, a staging
//! slot's those of the expert `stage_holds` names, the transient slot's those of
//! `transient_holds`'s expert, once the reads [`ExpertPager::each`] does are done; a
//! read that fails or never runs is forgotten (the pool and the holders let go).
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use super::pool::{Access, Policy, Pool, PoolError, PoolMem};
use super::trace::TraceWriter;
use super::MAX_EXPERTS;
use crate::arena::Arena;
use crate::model::config::MAX_LAYERS;
use crate::model::ffn_moe::{Experts, MoeFfn, Products, SwiGlu};
use crate::model::moe_route::{route, MoeConfig};
use crate::model::stream::{fill, ReadFn};
use crate::model::weights::Tensor;
use crate::model::ModelError;
use crate::residency::{slot_part_bytes, Span, IO_ALIGN};
use pinch_kernels::repack::{self, Layout};

/// Why the pager could not read or place an expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PagerError {
    /// The pool refused the picks (an id outside the layer, too many at once).
    Pool { layer: usize, err: PoolError },
    /// A read of expert `expert` of layer `layer` failed or came back short.
    Read {
        layer: usize,
        expert: u16,
        offset: u64,
    },
    /// An expert asked for that the batch did not route to (a bug).
    NotPrepared { layer: usize, expert: u16 },
}

impl core::fmt::Display for PagerError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PagerError::Pool { layer, err } => write!(f, "expert pool of layer {layer}: {err}"),
            PagerError::Read {
                layer,
                expert,
                offset,
            } => write!(
                f,
                "reading expert {expert} of layer {layer} (blk.{layer}.ffn_*_exps.weight) failed at file offset {offset}"
            ),
            PagerError::NotPrepared { layer, expert } => write!(
                f,
                "expert {expert} of layer {layer} asked for outside the batch's picks"
            ),
        }
    }
}

impl core::error::Error for PagerError {}

/// What the pager did, per layer or in total.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PagerStats {
    /// Experts a batch asked for that were resident / were not.
    pub hits: u64,
    pub misses: u64,
    /// Misses that a prefetch had read ahead (counted in `hits`: they were resident).
    pub read_ahead: u64,
    /// Expert reads (misses into slots, transient reads, prefetches) and their bytes.
    pub reads: u64,
    pub bytes: u64,
    /// Prefetched experts, and those the layer then did not use.
    pub prefetched: u64,
    pub prefetch_wasted: u64,
    /// Wall time of the reads: per batch, from its start to the last part read (on the
    /// reader threads, or the workers when there are none), plus the transient reads.
    pub read_ns: u64,
    /// Time the compute thread waited for expert reads (with an I/O thread: for the
    /// expert it needed next, and for the reads still under way when it was done).
    pub wait_ns: u64,
    /// Expert reads compared with a buffered read of the file (`--verify-stream`).
    pub verified: u64,
}

impl PagerStats {
    pub fn add(&mut self, o: &PagerStats) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.read_ahead += o.read_ahead;
        self.reads += o.reads;
        self.bytes += o.bytes;
        self.prefetched += o.prefetched;
        self.prefetch_wasted += o.prefetch_wasted;
        self.read_ns += o.read_ns;
        self.wait_ns += o.wait_ns;
        self.verified += o.verified;
    }
    /// What was added since `earlier`.
    pub fn since(&self, earlier: &PagerStats) -> PagerStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        PagerStats {
            hits: d(self.hits, earlier.hits),
            misses: d(self.misses, earlier.misses),
            read_ahead: d(self.read_ahead, earlier.read_ahead),
            reads: d(self.reads, earlier.reads),
            bytes: d(self.bytes, earlier.bytes),
            prefetched: d(self.prefetched, earlier.prefetched),
            prefetch_wasted: d(self.prefetch_wasted, earlier.prefetch_wasted),
            read_ns: d(self.read_ns, earlier.read_ns),
            wait_ns: d(self.wait_ns, earlier.wait_ns),
            verified: d(self.verified, earlier.verified),
        }
    }
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }
}

/// Where one of an expert's three matrices lies in the file and in a slot.
#[derive(Clone, Copy, Debug)]
struct Part {
    ty: pinch_kernels::GgmlType,
    cols: usize,
    /// Rows of one expert.
    rows: usize,
    /// File offset of expert 0's rows, and bytes of one expert.
    offset: u64,
    bytes: u64,
    /// Where the part starts in a slot.
    at: usize,
    /// How the part's rows are arranged in a slot once read ([`ExpertPager::repack_slots`]).
    layout: Layout,
}

impl Part {
    fn exact(&self, e: u16) -> Span {
        Span {
            offset: self.offset + e as u64 * self.bytes,
            len: self.bytes,
        }
    }
}

/// One paged layer.
struct LayerPages<'a> {
    il: usize,
    pool: Pool<'a>,
    slots: &'a mut [u8],
    slot_bytes: usize,
    parts: [Part; 3],
    stats: PagerStats,
    /// Experts a prefetch read that no batch has used yet (1: yes).
    prefetched: &'a mut [u8],
    /// The layer's router, for a prefetch from the layer before.
    pub router: Tensor<'a>,
    pub bias: Option<&'a [f32]>,
    pub cfg: MoeConfig,
}

const NO_PAGES: u8 = u8::MAX;

/// Runtime routing knobs (`--experts N`, `--moe-bias X`); the default changes nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Routing {
    /// Experts per token instead of the model's.
    pub n_used: Option<usize>,
    /// Added to the selection score of experts resident before the batch.
    pub resident_bias: f32,
}

/// Reader threads a pager starts with: flash reads at several at once (eMMC command
/// queues, UFS and NVMe) faster than one after another, and an expert is three reads.
pub const READERS: usize = 4;

/// Most staging slots a pager has.
pub const MAX_STAGE: usize = 32;

/// Staging slots for layers of `n_expert` experts, top-`n_used`: twice the picks of one
/// token (its misses the pool does not admit, plus the next layer's guesses), but no
/// more than a quarter of the experts nor [`MAX_STAGE`], and none for layers of fewer
/// than 16 experts (tiny models, whose pools are a slot or two). The plan reserves
/// them beside the pools.
pub fn staging_slots(n_expert: usize, n_used: usize) -> usize {
    if n_expert < 16 {
        return 0;
    }
    (2 * n_used).min(n_expert / 4).min(MAX_STAGE)
}

/// Scratch buffers paged parts are repacked through ([`ExpertPager::repack_slots`]): one
/// per reader at once (a fifth for the transient slot), each one group of rows.
pub const REPACK_SCRATCH: usize = READERS + 1;

/// Bytes the plan reserves for repacking paged parts: `group_bytes` is the largest group
/// of rows any part's layouts can have (`Layout::max_group_rows` x row bytes), 0 when no
/// part's type has a layout.
pub fn repack_scratch_bytes(group_bytes: u64) -> u64 {
    if group_bytes == 0 {
        return 0;
    }
    // The arena's 64-byte alignment of the one allocation.
    REPACK_SCRATCH as u64 * group_bytes + 64
}

/// The expert types whose slots `pinch run` repacks as they are read: Q2_K, whose pack
/// costs about 1.5 instructions per weight under qemu and saves 1.2 per weight on each
/// later use (README, issue 13). The other layouts' packs are per-weight code that costs
/// more than a read saves at low hit rates in the size-optimised build (tiny Q4_K_M MoE,
/// every pick a read: 0.74 -> 1.80 M instructions per token): plain slots for them.
pub fn repack_pays(ty: pinch_kernels::GgmlType) -> bool {
    ty == pinch_kernels::GgmlType::Q2_K
}

/// The repack scratch buffers, shared by the readers: a reader takes a free one (or waits
/// for the first), so more readers than buffers are slower, never wrong.
#[derive(Default)]
struct RepackScratch<'a> {
    bufs: heapless::Vec<spin::Mutex<&'a mut [u8]>, REPACK_SCRATCH>,
}

impl RepackScratch<'_> {
    /// Part `p` of expert `e`, just read into `dst` (its aligned read), rearranged in
    /// place into the part's layout.
    fn repack(&self, p: &Part, e: u16, dst: &mut [u8]) -> Result<(), ModelError> {
        if p.layout == Layout::Plain {
            return Ok(());
        }
        let exact = p.exact(e);
        let lead = (exact.offset - exact.aligned().offset) as usize;
        let data = dst
            .get_mut(lead..lead + p.bytes as usize)
            .ok_or(ModelError::BadShape("expert part past its slot"))?;
        let row_bytes = p.bytes as usize / p.rows.max(1);
        let first = self.bufs.first().ok_or(ModelError::BadShape(
            "repacked expert parts without repack scratch",
        ))?;
        let mut buf = self
            .bufs
            .iter()
            .find_map(|b| b.try_lock())
            .unwrap_or_else(|| first.lock());
        repack::repack_in_place(p.layout, p.ty, data, row_bytes, &mut buf)?;
        Ok(())
    }
}

/// Where one of the batch's experts is, or is being read to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loc {
    /// A slot of its layer's pool.
    Slot(u16),
    /// A staging slot.
    Stage(u8),
    /// The transient slot, read just before the expert is computed.
    Transient,
}

/// A read decided on and not done yet: expert `e` of paged layer `page` into `to`.
#[derive(Clone, Copy, Debug)]
struct Pending {
    page: u8,
    e: u16,
    to: Loc,
}

/// Reads decided per batch at most: the batch's misses and the next layer's guesses.
const MAX_PENDING: usize = 2 * MAX_EXPERTS;

/// Every paged layer's pool and slots, the staging and transient slots, the routing
/// trace.
///
/// Staging slots hold experts outside the pools, one layer's at a time: a batch's
/// misses the pool does not admit (LFU keeps something more used), and the pre-gated
/// prefetch's guesses for the next layer that the pool does not admit either. So a
/// prefetch reads ahead even where LFU would not let the guess in: a guess that is
/// then picked is a hit (copied into the pool if the pool now admits it).
pub struct ExpertPager<'a> {
    pages: heapless::Vec<LayerPages<'a>, MAX_LAYERS>,
    at: [u8; MAX_LAYERS],
    transient: &'a mut [u8],
    transient_holds: Option<(usize, u16)>,
    stage: heapless::Vec<&'a mut [u8], MAX_STAGE>,
    /// (paged layer, expert) each staging slot holds.
    stage_holds: [Option<(u8, u16)>; MAX_STAGE],
    /// Staging slots the current batch or its prefetch uses.
    stage_pin: [bool; MAX_STAGE],
    /// The current batch's picks and where each is.
    batch: heapless::Vec<(u16, Loc), MAX_EXPERTS>,
    batch_layer: usize,
    /// Reads of the current batch and its prefetch, done by [`Self::each`].
    pending: heapless::Vec<Pending, MAX_PENDING>,
    /// `--verify-stream`: compare every expert read with a buffered read.
    verify: Option<&'a mut [u8]>,
    pub routing: Routing,
    /// Read ahead the next MoE layer's guessed experts.
    pub prefetch: bool,
    /// Reads at once on the platform's reader pool, and the threads the pool is made
    /// with on the first batch that reads (`--moe-readers N`; 1: one after another).
    pub readers: usize,
    trace: Option<TraceWriter<'a>>,
    /// Tokens of the pass the trace is recording.
    trace_tokens: usize,
    /// MoE layers in order (for the trace's layer index).
    moe_order: [u8; MAX_LAYERS],
    n_moe: usize,
    /// Experts per MoE layer.
    n_expert: usize,
    /// What the readers repack parts through (empty: every part plain).
    scratch: RepackScratch<'a>,
}

impl<'a> ExpertPager<'a> {
    /// A pager for `layers` (the model's layers; the MoE ones whose stacks have no data
    /// are paged) with `slots` slots each under `policy`, plus `stage` staging slots
    /// and a transient one of `slot_bytes_max`, from `arena`.
    pub fn new(
        arena: &mut Arena<'a>,
        layers: &[crate::model::layer::Layer<'a>],
        slots: usize,
        slot_bytes_max: u64,
        stage: usize,
        policy: Policy,
    ) -> Result<ExpertPager<'a>, ModelError> {
        let mut pages = heapless::Vec::new();
        let mut at = [NO_PAGES; MAX_LAYERS];
        let mut moe_order = [NO_PAGES; MAX_LAYERS];
        let mut n_moe = 0;
        let mut n_expert = 1;
        for (il, l) in layers.iter().enumerate() {
            let crate::model::layer::Ffn::Moe(m) = &l.ffn else {
                continue;
            };
            n_expert = m.cfg.n_expert;
            moe_order[il] = n_moe as u8;
            n_moe += 1;
            if !m.gate_exps.data.is_empty() || l.stream.is_some() {
                continue;
            }
            let ne = m.cfg.n_expert;
            let mut parts = [m.gate_exps, m.up_exps, m.down_exps].map(|t| Part {
                ty: t.ty,
                cols: t.cols,
                rows: t.rows / ne.max(1),
                offset: t.file.offset,
                bytes: t.file.len / ne.max(1) as u64,
                at: 0,
                layout: Layout::Plain,
            });
            let mut sb = 0;
            for p in parts.iter_mut() {
                p.at = sb;
                sb += slot_part_bytes(p.bytes) as usize;
            }
            let mem = PoolMem::from_arena(arena, ne)?;
            let pool = Pool::new(ne, slots, policy, mem)
                .map_err(|err| PagerError::Pool { layer: il, err })?;
            let buf = arena.bytes_aligned("expert pool", pool.slots() * sb, IO_ALIGN as usize)?;
            at[il] = pages.len() as u8;
            let _ = pages.push(LayerPages {
                il,
                pool,
                slots: buf,
                slot_bytes: sb,
                parts,
                stats: PagerStats::default(),
                prefetched: arena.slice("expert pool", ne)?,
                router: m.router,
                bias: m.bias,
                cfg: m.cfg,
            });
        }
        let mut staging = heapless::Vec::new();
        let transient = if pages.is_empty() {
            &mut [][..]
        } else {
            let n = stage.min(MAX_STAGE);
            let sb = slot_bytes_max as usize;
            let all = arena.bytes_aligned("expert pool", (n + 1) * sb, IO_ALIGN as usize)?;
            let (t, rest) = all.split_at_mut(sb);
            for s in rest.chunks_exact_mut(sb.max(1)).take(n) {
                let _ = staging.push(s);
            }
            t
        };
        Ok(ExpertPager {
            pages,
            at,
            transient,
            transient_holds: None,
            stage: staging,
            stage_holds: [None; MAX_STAGE],
            stage_pin: [false; MAX_STAGE],
            batch: heapless::Vec::new(),
            batch_layer: usize::MAX,
            pending: heapless::Vec::new(),
            verify: None,
            routing: Routing::default(),
            prefetch: false,
            readers: READERS,
            trace: None,
            trace_tokens: 0,
            moe_order,
            n_moe,
            n_expert,
            scratch: RepackScratch::default(),
        })
    }

    /// Give every paged part whose type `which` accepts and has a repacked layout with a
    /// kernel on `cpu` (`Layout::preferred`, at least one group of rows per expert) that
    /// layout: from now on a part is repacked in its slot as soon as it is read, and
    /// computed by the layout's kernels (the plain kernels' bits). Takes the scratch
    /// buffers from `arena` (within what the plan reserved: [`repack_scratch_bytes`]) and
    /// empties the pools, whose slots held plain parts. Returns how many parts (of all
    /// layers) are repacked; a second call changes nothing. `pinch run` passes
    /// [`repack_pays`].
    pub fn repack_slots(
        &mut self,
        cpu: &pinch_kernels::CpuFeatures,
        which: &dyn Fn(pinch_kernels::GgmlType) -> bool,
        arena: &mut Arena<'a>,
    ) -> Result<usize, ModelError> {
        if !self.scratch.bufs.is_empty() {
            return Ok(0);
        }
        let (mut n, mut need) = (0, 0);
        for lp in self.pages.iter_mut() {
            for p in lp.parts.iter_mut() {
                let Some(l) = Layout::preferred(p.ty, cpu).filter(|_| which(p.ty)) else {
                    continue;
                };
                if !repack::has_fast_kernel(l, cpu) || p.rows < l.group_rows() {
                    continue;
                }
                p.layout = l;
                n += 1;
                need = need.max(l.scratch_bytes(p.bytes as usize / p.rows.max(1)));
            }
        }
        if need == 0 {
            return Ok(0);
        }
        let all = arena.bytes("expert pool", REPACK_SCRATCH * need)?;
        for b in all.chunks_exact_mut(need) {
            let _ = self.scratch.bufs.push(spin::Mutex::new(b));
        }
        self.abandon_pending();
        for lp in self.pages.iter_mut() {
            let policy = lp.pool.policy();
            lp.pool.reset(policy);
            lp.prefetched.fill(0);
        }
        self.transient_holds = None;
        self.stage_holds = [None; MAX_STAGE];
        Ok(n)
    }

    /// MoE layers (paged or not): the trace's layer count.
    pub fn n_moe(&self) -> usize {
        self.n_moe
    }

    /// `--verify-stream`: compare every expert read with a buffered read of the same
    /// bytes, in pieces of `buf.len()`; a difference is [`ModelError::StreamMismatch`].
    pub fn set_verify(&mut self, buf: &'a mut [u8]) {
        self.verify = Some(buf);
    }

    /// Warm start: place layer `il`'s hot list `hot` (most used first) into its free
    /// slots and read them. Returns how many were placed.
    pub fn warm(&mut self, io: &Io<'_>, il: usize, hot: &[u16]) -> Result<usize, ModelError> {
        let Some(pi) = self.pages_of(il) else {
            return Ok(0);
        };
        self.abandon_pending();
        let mut placed = [(0u16, 0u16); MAX_EXPERTS];
        let n = self.pages[pi]
            .pool
            .warm(hot, &mut placed)
            .map_err(|err| PagerError::Pool { layer: il, err })?;
        for &(e, s) in &placed[..n] {
            let _ = self.pending.push(Pending {
                page: pi as u8,
                e,
                to: Loc::Slot(s),
            });
        }
        self.batch.clear();
        self.batch_layer = il;
        self.each(io, true, &mut |_, _| Ok(()))?;
        Ok(n)
    }

    /// Expert matrices (of all paged layers) repacked in their slots
    /// ([`Self::repack_slots`]).
    pub fn repacked_parts(&self) -> usize {
        let parts = self.pages.iter().flat_map(|p| p.parts.iter());
        parts.filter(|p| p.layout != Layout::Plain).count()
    }

    /// Whether any layer is paged.
    pub fn pages(&self) -> bool {
        !self.pages.is_empty()
    }

    /// Empty every pool and use `policy` from now on.
    pub fn set_policy(&mut self, policy: Policy) {
        self.abandon_pending();
        for lp in self.pages.iter_mut() {
            lp.pool.reset(policy);
            lp.prefetched.fill(0);
        }
        self.transient_holds = None;
        self.stage_holds = [None; MAX_STAGE];
    }

    /// Record every token's picks into `buf` (a PMOE trace, see [`super::trace`]).
    pub fn record_trace(&mut self, buf: &'a mut [u8], picks: usize) -> Result<(), ModelError> {
        let w = TraceWriter::new(buf, self.n_moe.max(1), self.n_expert, picks)
            .map_err(|_| ModelError::BadShape("trace buffer smaller than its header"))?;
        self.trace = Some(w);
        Ok(())
    }

    /// The trace recorded so far (whole tokens).
    pub fn trace_bytes(&self) -> Option<&[u8]> {
        self.trace.as_ref().map(|t| t.bytes())
    }

    /// Counts of paged layer `il`, if it is paged.
    pub fn layer_stats(&self, il: usize) -> Option<PagerStats> {
        self.pages_of(il).map(|p| self.pages[p].stats)
    }

    /// Every paged layer's index, slots and counts.
    pub fn layers(&self) -> impl Iterator<Item = (usize, usize, usize, PagerStats)> + '_ {
        self.pages
            .iter()
            .map(|p| (p.il, p.pool.slots(), p.slot_bytes, p.stats))
    }

    pub fn total(&self) -> PagerStats {
        let mut t = PagerStats::default();
        for p in &self.pages {
            t.add(&p.stats);
        }
        t
    }

    /// Staging slots (see [`staging_slots`]).
    pub fn staging(&self) -> usize {
        self.stage.len()
    }

    /// The experts of paged layers by decayed use, most used first, as one hot list per
    /// layer (`--moe-warm`): `write(il, ids)` for each.
    pub fn hot_lists(&self, write: &mut dyn FnMut(usize, &[u16])) {
        let mut ids = [0u16; MAX_EXPERTS];
        for p in &self.pages {
            let n = p.pool.hottest(&mut ids[..p.pool.slots()]);
            write(p.il, &ids[..n]);
        }
    }

    fn pages_of(&self, il: usize) -> Option<usize> {
        self.at
            .get(il)
            .copied()
            .filter(|&i| i != NO_PAGES)
            .map(|i| i as usize)
    }

    /// Layer `il` is not paged (its experts are in the stacks) and no read is pending.
    pub fn in_stacks(&self, il: usize) -> bool {
        self.pages_of(il).is_none() && self.pending.is_empty()
    }

    /// Whether expert `e` of layer `il` is in memory (every expert of a layer that is
    /// not paged is).
    pub fn is_resident(&self, il: usize, e: u16) -> bool {
        match self.pages_of(il) {
            Some(p) => self.pages[p].pool.slot(e).is_some(),
            None => true,
        }
    }

    /// Start a pass of `tokens` tokens (the trace's records for them).
    pub fn begin_pass(&mut self, tokens: usize) {
        self.trace_tokens = tokens;
        if let Some(t) = &mut self.trace {
            t.reserve(tokens);
        }
    }

    /// Token `t` of the pass picked `ids` in MoE layer `il`.
    pub fn record(&mut self, il: usize, t: usize, ids: &[u32]) {
        let l = self.moe_order.get(il).copied().unwrap_or(NO_PAGES);
        if let (Some(w), true) = (&mut self.trace, l != NO_PAGES) {
            let mut v = [0u16; MAX_EXPERTS];
            let k = ids.len().min(MAX_EXPERTS);
            for (o, &i) in v.iter_mut().zip(&ids[..k]) {
                *o = i as u16;
            }
            w.set(t, l as usize, &v[..k]);
        }
    }

    /// Reads decided and never done (a batch that stopped on an error): their slots do
    /// not hold what the pool says, so forget them.
    fn abandon_pending(&mut self) {
        for r in core::mem::take(&mut self.pending) {
            forget(&mut self.pages, &mut self.stage_holds, r);
        }
    }

    /// The staging slot holding expert `e` of paged layer `page`.
    fn staged(&self, page: usize, e: u16) -> Option<usize> {
        self.stage_holds[..self.stage.len()]
            .iter()
            .position(|h| *h == Some((page as u8, e)))
    }

    /// A staging slot no read of this batch uses (an empty one first), now pinned; what
    /// it held is dropped (a prefetched expert never used counts as wasted).
    fn free_stage(&mut self) -> Option<usize> {
        let n = self.stage.len();
        let free = |j: &usize| !self.stage_pin[*j];
        let j = (0..n)
            .filter(free)
            .find(|&j| self.stage_holds[j].is_none())
            .or_else(|| (0..n).find(free))?;
        if let Some((pg, x)) = self.stage_holds[j].take() {
            if let Some(lp) = self.pages.get_mut(pg as usize) {
                if core::mem::take(&mut lp.prefetched[x as usize]) == 1 {
                    lp.stats.prefetch_wasted += 1;
                }
            }
        }
        self.stage_pin[j] = true;
        Some(j)
    }

    /// Layer `il`'s batch of `tokens` tokens needs `want` (distinct, ascending): look
    /// them up and decide where each miss goes; [`Self::each`] then reads and computes.
    pub fn prepare(&mut self, il: usize, want: &[u16], tokens: usize) -> Result<(), ModelError> {
        self.prepare_counted(il, want, None, tokens)
    }

    /// [`Self::prepare`] knowing how many of the batch's tokens picked each expert
    /// (`uses[i]` for `want[i]`), which the pool counts as that many uses.
    pub fn prepare_counted(
        &mut self,
        il: usize,
        want: &[u16],
        uses: Option<&[u16]>,
        tokens: usize,
    ) -> Result<(), ModelError> {
        self.abandon_pending();
        self.batch.clear();
        self.batch_layer = il;
        self.stage_pin = [false; MAX_STAGE];
        let Some(pi) = self.pages_of(il) else {
            return Ok(());
        };
        let mut acc = [Access::Hit(0); MAX_EXPERTS];
        let lp = &mut self.pages[pi];
        lp.pool
            .access_counted(want, uses, &mut acc)
            .map_err(|err| PagerError::Pool { layer: il, err })?;
        for _ in 0..tokens {
            lp.pool.tick();
        }
        for (&e, a) in want.iter().zip(&acc) {
            let staged = self.staged(pi, e);
            let lp = &mut self.pages[pi];
            let loc = match *a {
                Access::Hit(s) => {
                    lp.stats.hits += 1;
                    if core::mem::take(&mut lp.prefetched[e as usize]) == 1 {
                        lp.stats.read_ahead += 1;
                    }
                    Loc::Slot(s)
                }
                Access::Miss { slot, evicted } => {
                    if let Some(v) = evicted {
                        if core::mem::take(&mut lp.prefetched[v as usize]) == 1 {
                            lp.stats.prefetch_wasted += 1;
                        }
                    }
                    match (staged, slot) {
                        (Some(j), slot) => {
                            // Read ahead into a staging slot: a hit. Left there by an
                            // earlier batch: a miss that costs no read (as the pool
                            // alone, which the simulator replays, would count it).
                            if core::mem::take(&mut lp.prefetched[e as usize]) == 1 {
                                lp.stats.hits += 1;
                                lp.stats.read_ahead += 1;
                            } else {
                                lp.stats.misses += 1;
                            }
                            match slot {
                                Some(s) => {
                                    let sb = lp.slot_bytes;
                                    let at = s as usize * sb;
                                    lp.slots[at..at + sb].copy_from_slice(&self.stage[j][..sb]);
                                    self.stage_holds[j] = None;
                                    Loc::Slot(s)
                                }
                                None => {
                                    self.stage_pin[j] = true;
                                    Loc::Stage(j as u8)
                                }
                            }
                        }
                        (None, Some(s)) => {
                            lp.stats.misses += 1;
                            self.queue(pi, e, Loc::Slot(s))
                        }
                        (None, None) => {
                            lp.stats.misses += 1;
                            match self.free_stage() {
                                Some(j) => {
                                    self.stage_holds[j] = Some((pi as u8, e));
                                    self.queue(pi, e, Loc::Stage(j as u8))
                                }
                                None => Loc::Transient,
                            }
                        }
                    }
                }
            };
            let _ = self.batch.push((e, loc));
        }
        let lp = &self.pages[pi];
        if self
            .transient_holds
            .is_some_and(|(l, e)| l == il && lp.pool.slot(e).is_some())
        {
            self.transient_holds = None;
        }
        Ok(())
    }

    fn queue(&mut self, page: usize, e: u16, to: Loc) -> Loc {
        match self.pending.push(Pending {
            page: page as u8,
            e,
            to,
        }) {
            Ok(()) => to,
            Err(r) => {
                forget(&mut self.pages, &mut self.stage_holds, r);
                Loc::Transient
            }
        }
    }

    /// Pre-gated prefetch: `guess` (distinct) are the experts layer `il` will probably
    /// pick; decide where the missing ones go (a slot the pool gives, else a staging
    /// slot); [`Self::each`] reads them after the current batch's misses. Not a use.
    pub fn prefetch_into(&mut self, il: usize, guess: &[u16]) {
        let Some(pn) = self.pages_of(il) else {
            return;
        };
        for &e in guess {
            if self.pages[pn].pool.slot(e).is_some() || self.staged(pn, e).is_some() {
                continue;
            }
            let to = match self.pages[pn].pool.place_ahead(e, guess) {
                Some((s, evicted)) => {
                    let lp = &mut self.pages[pn];
                    if let Some(v) = evicted {
                        if core::mem::take(&mut lp.prefetched[v as usize]) == 1 {
                            lp.stats.prefetch_wasted += 1;
                        }
                    }
                    Loc::Slot(s)
                }
                None => match self.free_stage() {
                    Some(j) => {
                        self.stage_holds[j] = Some((pn as u8, e));
                        Loc::Stage(j as u8)
                    }
                    None => break,
                },
            };
            if self.queue(pn, e, to) == to {
                let lp = &mut self.pages[pn];
                lp.prefetched[e as usize] = 1;
                lp.stats.prefetched += 1;
            }
        }
        let lp = &self.pages[pn];
        if self
            .transient_holds
            .is_some_and(|(l, e)| l == il && lp.pool.slot(e).is_some())
        {
            self.transient_holds = None;
        }
    }

    /// Read what [`Self::prepare`] and [`Self::prefetch_into`] decided and run
    /// `f(e, expert e)` for each expert of the batch. Returns `false` when the batch's
    /// layer is not paged (its stacks hold every expert; `f` was not called).
    ///
    /// Each read is one part of an expert (its gate, up or down rows, one aligned
    /// direct read), the batch's misses first, then the prefetch. On a platform with a
    /// reader pool, up to [`Self::readers`] of its threads take the reads in that order
    /// (so an expert's three parts, and the next experts', are read at once; with an
    /// I/O thread instead, as many threads started through it), while this thread computes: in
    /// batch order (ascending ids), or, `any_order`, the experts already in memory first
    /// and then each read expert as soon as its three parts are in; either way it
    /// sleeps ([`Io::wait`]) only until the expert it needs next is in. With neither,
    /// the reads are spread over the workers first. A failed read is the error of its
    /// expert ([`PagerError::Read`]: layer, expert, offset). An expert the batch had no
    /// slot for is read into the transient slot just before it is computed. The time
    /// waited is counted in `wait_ns`, the reads' wall time in `read_ns`.
    pub fn each(
        &mut self,
        io: &Io<'_>,
        any_order: bool,
        f: &mut dyn FnMut(u16, SwiGlu<'_>) -> Result<(), ModelError>,
    ) -> Result<bool, ModelError> {
        // A layer that is not paged may still have prefetched for the next one.
        let (pi, paged) = match (self.pages_of(self.batch_layer), self.pending.first()) {
            (Some(p), _) => (p, true),
            (None, Some(r)) => (r.page as usize, false),
            (None, None) => return Ok(false),
        };
        let il = self.pages[pi].il;
        let pending = core::mem::take(&mut self.pending);
        let readers = self.readers;
        let ExpertPager {
            pages,
            transient,
            transient_holds,
            stage,
            stage_holds,
            batch,
            verify,
            scratch,
            ..
        } = self;
        let scratch = &*scratch;
        let pn = pending.iter().map(|r| r.page as usize).find(|&p| p != pi);
        let (cur, next) = two_pages(pages, pi, pn);
        let (cur_parts, cur_sb) = (cur.parts, cur.slot_bytes);
        let mut cur_slots: heapless::Vec<Option<&mut [u8]>, MAX_EXPERTS> =
            cur.slots.chunks_exact_mut(cur_sb).map(Some).collect();
        let next_at = next
            .as_ref()
            .map_or((il, cur_parts, cur_sb), |n| (n.il, n.parts, n.slot_bytes));
        let mut next_slots: heapless::Vec<Option<&mut [u8]>, MAX_EXPERTS> = heapless::Vec::new();
        let mut next_book = None;
        if let Some(n) = next {
            next_slots = n.slots.chunks_exact_mut(n.slot_bytes).map(Some).collect();
            next_book = Some((&mut n.stats, &mut n.pool));
        }
        let mut stage_bufs: heapless::Vec<Option<&mut [u8]>, MAX_STAGE> =
            stage.iter_mut().map(|b| Some(&mut **b)).collect();
        // The reads, each into its own slot's bytes.
        let mut jobs: heapless::Vec<ReadJob<'_>, MAX_PENDING> = heapless::Vec::new();
        let mut job_of = [u16::MAX; MAX_EXPERTS];
        for r in &pending {
            let mine = r.page as usize == pi;
            let (sb, parts) = if mine {
                (cur_sb, &cur_parts)
            } else {
                (next_at.2, &next_at.1)
            };
            let buf = match r.to {
                Loc::Slot(s) if mine => cur_slots.get_mut(s as usize).and_then(Option::take),
                Loc::Slot(s) => next_slots.get_mut(s as usize).and_then(Option::take),
                Loc::Stage(j) => stage_bufs.get_mut(j as usize).and_then(Option::take),
                Loc::Transient => None,
            };
            let Some(buf) = buf else { continue };
            if mine {
                job_of[r.e as usize] = jobs.len() as u16;
            }
            let _ = jobs.push(ReadJob::new(*r, split_mut(parts, &mut buf[..sb]), !mine));
        }
        // What the batch computes from, in the order it is computed.
        let mut order: heapless::Vec<(u16, Src<'_>), MAX_EXPERTS> = heapless::Vec::new();
        for &(e, loc) in batch.iter() {
            let j = job_of[e as usize];
            let src = if j != u16::MAX {
                Src::Job(j)
            } else {
                let buf = match loc {
                    Loc::Slot(s) => cur_slots.get_mut(s as usize).and_then(Option::take),
                    Loc::Stage(j) => stage_bufs.get_mut(j as usize).and_then(Option::take),
                    Loc::Transient => {
                        let _ = order.push((e, Src::Transient));
                        continue;
                    }
                };
                let buf = buf.ok_or(PagerError::NotPrepared {
                    layer: il,
                    expert: e,
                })?;
                Src::Ready(split(&cur_parts, &buf[..cur_sb]))
            };
            let _ = order.push((e, src));
        }
        if any_order {
            // Ready experts first, then the reads, then the transient ones; each group
            // in batch order.
            order.sort_unstable_by_key(|&(e, ref s)| (s.rank(), e));
        }
        let parts_of = |j: &ReadJob| {
            if j.next {
                (next_at.0, next_at.1)
            } else {
                (il, cur_parts)
            }
        };
        let verifying = verify.is_some();
        let verify = spin::Mutex::new(verify.as_deref_mut());
        let items = 3 * jobs.len();
        let taken = AtomicUsize::new(0);
        let t_io = (io.now)();
        let io_end = AtomicU64::new(t_io);
        // One reader: the next part not taken yet, until none is left.
        let reader = |_: usize| loop {
            let i = taken.fetch_add(1, Ordering::Relaxed);
            let Some(j) = jobs.get(i / 3) else { break };
            let (l, parts) = parts_of(j);
            j.run_part(io, l, &parts, i % 3, verifying.then_some(&verify), scratch);
            io_end.fetch_max((io.now)(), Ordering::Relaxed);
        };
        let mut waited = 0u64;
        let mut transient_reads = PagerStats::default();
        let mut compute = |waited: &mut u64| -> Result<(), ModelError> {
            for (e, src) in order.iter_mut() {
                let e = *e;
                let bytes: [&[u8]; 3] = match src {
                    Src::Ready(b) => *b,
                    Src::Job(j) => {
                        let job = &jobs[*j as usize];
                        let t0 = (io.now)();
                        if job.state.load(Ordering::Acquire) == PENDING {
                            (io.wait)(&job.state, PENDING);
                        }
                        *waited += (io.now)().saturating_sub(t0);
                        job.result(il)?;
                        let b = job.take().ok_or(PagerError::NotPrepared {
                            layer: il,
                            expert: e,
                        })?;
                        *src = Src::Ready(b);
                        b
                    }
                    Src::Transient => {
                        if *transient_holds != Some((il, e)) {
                            *transient_holds = None;
                            let t0 = (io.now)();
                            let mut v = verify.lock();
                            let n = read_expert(
                                io.read,
                                &cur_parts,
                                il,
                                e,
                                transient,
                                v.as_deref_mut(),
                                scratch,
                            )?;
                            drop(v);
                            let dt = (io.now)().saturating_sub(t0);
                            transient_reads.reads += 1;
                            transient_reads.bytes += n;
                            transient_reads.read_ns += dt;
                            transient_reads.wait_ns += dt;
                            transient_reads.verified += verifying as u64;
                            *transient_holds = Some((il, e));
                        }
                        split(&cur_parts, &transient[..cur_sb])
                    }
                };
                f(e, views(&cur_parts, bytes, e))?;
            }
            Ok(())
        };
        // One reader when verifying (the comparison buffer is one).
        let n_readers = if verifying {
            1
        } else {
            readers.clamp(1, items.max(1))
        };
        // The reads go to the platform's reader pool (asked for `readers` threads, so
        // the pool made on the first call has them all; those past `n_readers` find
        // nothing to do), or else threads started through its I/O thread.
        let pooled = |r: usize| {
            if r < n_readers {
                reader(r)
            }
        };
        let result = match (io.readers, io.overlap) {
            (pool, overlap) if items > 0 && (pool.is_some() || overlap.is_some()) => {
                let mut r = Ok(());
                let mut done_at = 0;
                let mut work = || {
                    r = compute(&mut waited);
                    done_at = (io.now)();
                };
                match (pool, overlap) {
                    (Some(pool), _) => pool(readers.max(1), &pooled, &mut work),
                    (None, Some(overlap)) => {
                        overlap(&mut || spread(overlap, n_readers, &reader), &mut work)
                    }
                    (None, None) => work(),
                }
                waited += (io.now)().saturating_sub(done_at);
                r
            }
            _ => {
                let n = if verifying {
                    1
                } else {
                    io.workers.clamp(1, items.max(1))
                };
                if n > 1 {
                    (io.parallel)(n, &reader);
                } else {
                    reader(0);
                }
                waited += (io.now)().saturating_sub(t_io);
                compute(&mut waited)
            }
        };
        drop(order);
        // Counts, and forget what a failed read left stale.
        let mut failed = None;
        for j in jobs.iter() {
            let (stats, pool) = match (j.next, next_book.as_mut()) {
                (true, Some((s, p))) => (&mut **s, &mut **p),
                _ => (&mut cur.stats, &mut cur.pool),
            };
            stats.reads += 1;
            stats.bytes += j.bytes.load(Ordering::Relaxed);
            let outcome = j.result(parts_of(j).0);
            stats.verified += (verifying && outcome.is_ok()) as u64;
            if let Err(e) = outcome {
                failed.get_or_insert(e);
                match j.what.to {
                    Loc::Slot(_) => pool.forget(j.what.e),
                    Loc::Stage(s) => stage_holds[s as usize] = None,
                    Loc::Transient => {}
                }
            }
        }
        // The reads' wall time, from the start to the last part in (the prefetch's
        // included: they share the readers).
        cur.stats.read_ns += io_end.load(Ordering::Relaxed).saturating_sub(t_io);
        cur.stats.wait_ns += waited;
        cur.stats.add(&transient_reads);
        if let Some(e) = failed {
            return Err(e);
        }
        result?;
        Ok(paged)
    }

    /// The paged layer after `il` (in layer order) with its router, if any.
    pub fn next_paged(
        &self,
        il: usize,
    ) -> Option<(usize, Tensor<'a>, Option<&'a [f32]>, MoeConfig)> {
        self.pages
            .iter()
            .find(|p| p.il > il)
            .map(|p| (p.il, p.router, p.bias, p.cfg))
    }
}

/// A read that never happened or failed: its slot does not hold the expert.
fn forget(pages: &mut [LayerPages<'_>], stage_holds: &mut [Option<(u8, u16)>], r: Pending) {
    match r.to {
        Loc::Slot(_) => {
            if let Some(lp) = pages.get_mut(r.page as usize) {
                lp.pool.forget(r.e);
            }
        }
        Loc::Stage(j) => stage_holds[j as usize] = None,
        Loc::Transient => {}
    }
}

/// Paged layers `a` and `b` (`b != a`) mutably at once.
fn two_pages<'p, 'a>(
    pages: &'p mut [LayerPages<'a>],
    a: usize,
    b: Option<usize>,
) -> (&'p mut LayerPages<'a>, Option<&'p mut LayerPages<'a>>) {
    match b {
        Some(b) if b > a => {
            let (lo, hi) = pages.split_at_mut(b);
            (&mut lo[a], Some(&mut hi[0]))
        }
        Some(b) if b < a => {
            let (lo, hi) = pages.split_at_mut(a);
            (&mut hi[0], Some(&mut lo[b]))
        }
        _ => (&mut pages[a], None),
    }
}

/// An expert's bytes for the compute: in memory (its three parts), the read job
/// bringing them, or the transient slot, read when the expert is computed.
#[derive(Clone, Copy)]
enum Src<'d> {
    Ready([&'d [u8]; 3]),
    Job(u16),
    Transient,
}

impl Src<'_> {
    /// The order `any_order` computes in: what is in memory, what is being read, what
    /// is read last.
    fn rank(&self) -> u8 {
        match self {
            Src::Ready(_) => 0,
            Src::Job(_) => 1,
            Src::Transient => 2,
        }
    }
}

const PENDING: u32 = 0;
const DONE: u32 = 1;
const FAILED: u32 = 2;
const MISMATCH: u32 = 3;

/// The comparison buffer of `--verify-stream`, shared by the readers.
type VerifyBuf<'v> = spin::Mutex<Option<&'v mut [u8]>>;

/// One expert read: its three parts' bytes in the slot (each lent to the reader that
/// reads it, then to the compute), and how it went.
struct ReadJob<'d> {
    what: Pending,
    /// For the next layer (a prefetch), not the batch's.
    next: bool,
    dst: [spin::Mutex<Option<&'d mut [u8]>>; 3],
    /// Parts not read yet; the last reader to finish one publishes `state`.
    left: AtomicU8,
    /// The first failure (`FAILED`, `MISMATCH`; 0: none) and its offset.
    fail: AtomicU32,
    at: AtomicU64,
    /// `PENDING` until the last part is in; the compute thread waits on it.
    state: AtomicU32,
    bytes: AtomicU64,
}

impl<'d> ReadJob<'d> {
    fn new(what: Pending, dst: [&'d mut [u8]; 3], next: bool) -> ReadJob<'d> {
        ReadJob {
            what,
            next,
            dst: dst.map(|d| spin::Mutex::new(Some(d))),
            left: AtomicU8::new(3),
            fail: AtomicU32::new(0),
            at: AtomicU64::new(0),
            state: AtomicU32::new(PENDING),
            bytes: AtomicU64::new(0),
        }
    }

    /// Read part `k` (one aligned read); the last part in publishes the outcome.
    fn run_part(
        &self,
        io: &Io<'_>,
        il: usize,
        parts: &[Part; 3],
        k: usize,
        verify: Option<&VerifyBuf<'_>>,
        scratch: &RepackScratch<'_>,
    ) {
        let e = self.what.e;
        let mut dst = self.dst[k].lock();
        let p = &parts[k];
        let outcome = match (dst.as_deref_mut(), verify) {
            (Some(buf), Some(v)) => {
                read_part(io.read, p, il, e, buf, v.lock().as_deref_mut(), scratch)
            }
            (Some(buf), None) => read_part(io.read, p, il, e, buf, None, scratch),
            (None, _) => Err(ModelError::Pager(PagerError::NotPrepared {
                layer: il,
                expert: e,
            })),
        };
        drop(dst);
        let failed = match outcome {
            Ok(n) => {
                self.bytes.fetch_add(n, Ordering::Relaxed);
                None
            }
            Err(ModelError::StreamMismatch { offset }) => Some((MISMATCH, offset)),
            Err(ModelError::Pager(PagerError::Read { offset, .. })) => Some((FAILED, offset)),
            Err(_) => Some((FAILED, parts[k].exact(e).offset)),
        };
        if let Some((code, offset)) = failed {
            if self
                .fail
                .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.at.store(offset, Ordering::Release);
            }
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let state = match self.fail.load(Ordering::Acquire) {
                0 => DONE,
                f => f,
            };
            self.state.store(state, Ordering::Release);
            (io.wake)();
        }
    }

    /// The three parts' bytes, once read (`None` if taken already).
    fn take(&self) -> Option<[&'d [u8]; 3]> {
        let [a, b, c] = &self.dst;
        let (a, b, c) = (a.lock().take()?, b.lock().take()?, c.lock().take()?);
        Some([a, b, c])
    }

    /// The read's outcome as the error it was (`il`: its layer).
    fn result(&self, il: usize) -> Result<(), ModelError> {
        let offset = self.at.load(Ordering::Acquire);
        match self.state.load(Ordering::Acquire) {
            DONE => Ok(()),
            MISMATCH => Err(ModelError::StreamMismatch { offset }),
            _ => Err(ModelError::Pager(PagerError::Read {
                layer: il,
                expert: self.what.e,
                offset,
            })),
        }
    }
}

/// Run `reader(i)` for `i` in `0..n`, each on an I/O thread of its own, through the
/// platform's `overlap` nested (a platform with an I/O thread but no reader pool: each
/// level runs one reader on its own thread and hands the rest to a new one; called on
/// an I/O thread, so the compute thread is never one of them).
fn spread(overlap: &OverlapFn<'_>, n: usize, reader: &(dyn Fn(usize) + Sync)) {
    if n <= 1 {
        reader(0);
        return;
    }
    let mut rest = || spread(overlap, n - 1, reader);
    overlap(&mut rest, &mut || reader(n - 1));
}

/// `parallel(n, f)`: run `f(i)` for `i in 0..n` on the platform's workers.
pub type ParallelFn<'x> = dyn Fn(usize, &(dyn Fn(usize) + Sync)) + Sync + 'x;

/// `overlap(io, work)`: [`crate::platform::Platform::overlap`] on a platform with an I/O
/// thread.
pub type OverlapFn<'x> = dyn Fn(&mut (dyn FnMut() + Send), &mut dyn FnMut()) + Sync + 'x;

/// `readers(n, read, work)`: [`crate::platform::Platform::with_readers`].
pub type ReadersFn<'x> = dyn Fn(usize, &(dyn Fn(usize) + Sync), &mut dyn FnMut()) + Sync + 'x;

/// `wait(word, value)`: [`crate::platform::Platform::wait_while`].
pub type WaitFn<'x> = dyn Fn(&AtomicU32, u32) + Sync + 'x;

/// What reading needs from the session: the file reader, the platform's workers,
/// reader pool or I/O thread, its wait and wake, and its clock.
#[derive(Clone, Copy)]
pub struct Io<'x> {
    pub read: &'x ReadFn<'x>,
    pub workers: usize,
    pub parallel: &'x ParallelFn<'x>,
    /// The platform's reader pool, if it has one (the reads run there).
    pub readers: Option<&'x ReadersFn<'x>>,
    /// Else its I/O thread, if it has one (reader threads are started through it per
    /// batch); with neither, the reads happen before the compute.
    pub overlap: Option<&'x OverlapFn<'x>>,
    /// The compute thread waits for a read's state to change; a reader wakes it.
    pub wait: &'x WaitFn<'x>,
    pub wake: &'x (dyn Fn() + Sync),
    pub now: &'x (dyn Fn() -> u64 + Sync),
}

/// Run `f` with platform `p`'s I/O: the file reader `read`, up to `threads` workers,
/// the reader pool and I/O thread if `p` has them, its wait, wake and clock.
pub fn with_io<P: crate::platform::Platform, R>(
    p: &P,
    read: &ReadFn<'_>,
    threads: usize,
    f: impl FnOnce(Io<'_>) -> R,
) -> R {
    let parallel = |k: usize, g: &(dyn Fn(usize) + Sync)| p.parallel(k, g);
    let overlap = |io: &mut (dyn FnMut() + Send), work: &mut dyn FnMut()| p.overlap(io, work);
    let readers =
        |n: usize, r: &(dyn Fn(usize) + Sync), work: &mut dyn FnMut()| p.with_readers(n, r, work);
    let wait = |w: &AtomicU32, v: u32| p.wait_while(w, v);
    let wake = || p.wake_all();
    let now = || p.now_ns();
    let overlap: &OverlapFn = &overlap;
    let readers: &ReadersFn = &readers;
    f(Io {
        read,
        workers: threads.min(p.workers()),
        parallel: &parallel,
        readers: p.reader_pool().then_some(readers),
        overlap: p.io_thread().then_some(overlap),
        wait: &wait,
        wake: &wake,
        now: &now,
    })
}

/// A slot's bytes cut into its three parts' (gate, up, down).
fn split<'b>(parts: &[Part; 3], slot: &'b [u8]) -> [&'b [u8]; 3] {
    let (a, rest) = slot.split_at(parts[1].at);
    let (b, c) = rest.split_at(parts[2].at - parts[1].at);
    [a, b, c]
}

/// [`split`] for writing.
fn split_mut<'b>(parts: &[Part; 3], slot: &'b mut [u8]) -> [&'b mut [u8]; 3] {
    let (a, rest) = slot.split_at_mut(parts[1].at);
    let (b, c) = rest.split_at_mut(parts[2].at - parts[1].at);
    [a, b, c]
}

/// Expert `e`'s part `p` viewed in the part's bytes of a slot.
fn view<'b>(p: &Part, part: &'b [u8], e: u16) -> Tensor<'b> {
    let exact = p.exact(e);
    let lead = (exact.offset - exact.aligned().offset) as usize;
    Tensor {
        ty: p.ty,
        cols: p.cols,
        rows: p.rows,
        data: &part[lead..lead + p.bytes as usize],
        layout: p.layout,
        file: exact,
    }
}

/// Expert `e`'s three matrices in a slot's parts.
fn views<'b>(parts: &[Part; 3], bytes: [&'b [u8]; 3], e: u16) -> SwiGlu<'b> {
    let [g, u, d] = [0, 1, 2].map(|k| view(&parts[k], bytes[k], e));
    SwiGlu {
        gate: g,
        up: u,
        down: d,
    }
}

/// Read expert `e`'s part `p` (one aligned read) into `dst` and put it in the part's
/// layout (after `verify` compared the file's bytes); returns the bytes read.
fn read_part(
    read: &ReadFn,
    p: &Part,
    il: usize,
    e: u16,
    dst: &mut [u8],
    verify: Option<&mut [u8]>,
    scratch: &RepackScratch<'_>,
) -> Result<u64, ModelError> {
    let span = p.exact(e).aligned();
    let dst = &mut dst[..slot_part_bytes(p.bytes) as usize];
    let n = fill(read, dst, span, verify).map_err(|err| read_err(err, il, e, span))?;
    scratch.repack(p, e, dst)?;
    Ok(n)
}

/// Read expert `e`'s three parts into `slot`, one after another; returns the bytes.
fn read_expert(
    read: &ReadFn,
    parts: &[Part; 3],
    il: usize,
    e: u16,
    slot: &mut [u8],
    mut verify: Option<&mut [u8]>,
    scratch: &RepackScratch<'_>,
) -> Result<u64, ModelError> {
    let mut n = 0;
    let sb = parts[2].at + slot_part_bytes(parts[2].bytes) as usize;
    for (p, dst) in parts.iter().zip(split_mut(parts, &mut slot[..sb])) {
        n += read_part(read, p, il, e, dst, verify.as_deref_mut(), scratch)?;
    }
    Ok(n)
}

fn read_err(err: ModelError, layer: usize, expert: u16, span: Span) -> ModelError {
    match err {
        ModelError::ShortRead { offset } => ModelError::Pager(PagerError::Read {
            layer,
            expert,
            offset,
        }),
        ModelError::Platform(_) => ModelError::Pager(PagerError::Read {
            layer,
            expert,
            offset: span.offset,
        }),
        e => e,
    }
}

/// The MoE block's [`Experts`] when the session has a pager: hits from the pools,
/// misses read through `io`; layers that are not paged use their stacks.
pub struct Paged<'x, 'a> {
    pub pager: &'x mut ExpertPager<'a>,
    pub io: Io<'x>,
}

impl Experts for Paged<'_, '_> {
    fn prepare(
        &mut self,
        block: &MoeFfn<'_>,
        want: &[u16],
        uses: &[u16],
        n: usize,
    ) -> Result<(), ModelError> {
        self.pager.prepare_counted(block.il, want, Some(uses), n)
    }
    fn each(
        &mut self,
        block: &MoeFfn<'_>,
        want: &[u16],
        any_order: bool,
        f: &mut dyn FnMut(u16, SwiGlu<'_>) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        if self.pager.each(&self.io, any_order, f)? {
            return Ok(());
        }
        block.each_resident(want, f)
    }
    /// A layer the pager does not page, with no read ahead in flight, has its experts
    /// in the stacks; a paged layer's come from the slots as their reads finish.
    fn in_stacks(&self, block: &MoeFfn<'_>) -> bool {
        self.pager.in_stacks(block.il)
    }
    fn routing(&self) -> Routing {
        self.pager.routing
    }
    fn is_resident(&self, block: &MoeFfn<'_>, e: u16) -> bool {
        self.pager.is_resident(block.il, e)
    }
    fn record(&mut self, block: &MoeFfn<'_>, t: usize, ids: &[u32]) {
        self.pager.record(block.il, t, ids);
    }
    fn prefetch(
        &mut self,
        mm: &mut dyn Products,
        block: &MoeFfn<'_>,
        xn: &[f32],
        n: usize,
    ) -> Result<(), ModelError> {
        if !self.pager.prefetch {
            return Ok(());
        }
        let Some((il, router, bias, mut cfg)) = self.pager.next_paged(block.il) else {
            return Ok(());
        };
        cfg.n_used = self
            .pager
            .routing
            .n_used
            .map_or(cfg.n_used, |k| k.clamp(1, cfg.n_used));
        let (ne, e) = (cfg.n_expert, router.cols);
        let mut used = [false; MAX_EXPERTS];
        let mut logits = [0.0f32; MAX_EXPERTS];
        let (mut ids, mut w) = ([0u32; MAX_EXPERTS], [0.0f32; MAX_EXPERTS]);
        for t in 0..n {
            mm.linear(&router, &xn[t * e..(t + 1) * e], 1, &mut logits[..ne])?;
            route(
                &cfg,
                &logits[..ne],
                bias,
                &mut ids[..cfg.n_used],
                &mut w[..cfg.n_used],
            );
            for &id in &ids[..cfg.n_used] {
                used[id as usize] = true;
            }
        }
        let mut guess = heapless::Vec::<u16, MAX_EXPERTS>::new();
        for (x, _) in used[..ne].iter().enumerate().filter(|(_, &u)| u) {
            let _ = guess.push(x as u16);
        }
        self.pager.prefetch_into(il, &guess);
        Ok(())
    }
}

impl From<PagerError> for ModelError {
    fn from(e: PagerError) -> Self {
        ModelError::Pager(e)
    }
}

#[cfg(test)]
mod tests {
    //! The pager on a fake model file: two MoE layers of 16 F32 experts (one I/O block
    //! per matrix) whose bytes name their layer, matrix and expert, read through a fake reader that counts reads
    //! and can fail, block or lie; with and without an I/O thread.
    extern crate std;
    use super::*;
    use crate::model::attention::Attention;
    use crate::model::layer::{Ffn, Layer, Mixer};
    use crate::model::moe_route::Gating;
    use crate::platform::PlatformError;
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::vec;
    use std::vec::Vec;

    const NE: usize = 16;
    /// Bytes of one expert's matrix (2 rows x 1024 f32: two I/O blocks).
    const PART: usize = 8192;
    const COLS: usize = 1024;
    const BASE: u64 = 8192;

    fn stack_offset(l: usize, p: usize) -> u64 {
        BASE + ((l * 3 + p) * NE * PART) as u64
    }

    /// The model file: every expert's bytes distinct.
    fn file() -> Vec<u8> {
        let mut f = vec![0u8; BASE as usize + 2 * 3 * NE * PART + 8192];
        for l in 0..2 {
            for p in 0..3 {
                for e in 0..NE {
                    let at = stack_offset(l, p) as usize + e * PART;
                    for (i, b) in f[at..at + PART].iter_mut().enumerate() {
                        *b = (l * 97 + p * 31 + e * 7 + i % 251) as u8;
                    }
                }
            }
        }
        f
    }

    /// Expert `e` of layer `l` as the file has it (gate, up, down).
    fn want_bytes(f: &[u8], l: usize, e: u16) -> Vec<u8> {
        (0..3)
            .flat_map(|p| {
                let at = stack_offset(l, p) as usize + e as usize * PART;
                f[at..at + PART].to_vec()
            })
            .collect()
    }

    fn t(cols: usize, rows: usize, file: Span) -> Tensor<'static> {
        Tensor {
            ty: pinch_kernels::GgmlType::F32,
            cols,
            rows,
            data: &[],
            layout: pinch_kernels::repack::Layout::Plain,
            file,
        }
    }

    fn layers() -> Vec<Layer<'static>> {
        let none = t(4, 4, Span::default());
        (0..2)
            .map(|l| {
                let stack = |p| {
                    t(
                        COLS,
                        2 * NE,
                        Span {
                            offset: stack_offset(l, p),
                            len: (NE * PART) as u64,
                        },
                    )
                };
                Layer {
                    attn_norm: &[],
                    mixer: Mixer::Attention(Attention {
                        wq: none,
                        wk: none,
                        wv: none,
                        wo: none,
                        bq: None,
                        bk: None,
                        bv: None,
                        q_norm: None,
                        k_norm: None,
                        n_head_kv: 1,
                        swa: false,
                        fused_qkv: None,
                        gated: false,
                    }),
                    post_mixer_norm: None,
                    ffn_norm: &[],
                    ffn: Ffn::Moe(MoeFfn {
                        router: t(4, NE, Span::default()),
                        bias: None,
                        gate_exps: stack(0),
                        up_exps: stack(1),
                        down_exps: stack(2),
                        shared: None,
                        cfg: MoeConfig {
                            n_expert: NE,
                            n_used: 2,
                            n_ff_exp: 2,
                            n_ff_shexp: 0,
                            gating: Gating::Softmax,
                            norm_weights: true,
                            weights_scale: 1.0,
                            n_group: 0,
                            n_group_used: 0,
                            n_dense_lead: 0,
                        },
                        il: l,
                    }),
                    post_ffn_norm: None,
                    stream: None,
                }
            })
            .collect()
    }

    /// The fake storage: counts reads; `fail` / `lie` make reads touching expert
    /// `(layer, expert)` fail or (buffered reads) come back with other bytes.
    struct Disk {
        bytes: Vec<u8>,
        reads: AtomicU64,
        fail: Option<(usize, u16)>,
        lie: bool,
    }

    impl Disk {
        fn new() -> Disk {
            Disk {
                bytes: file(),
                reads: AtomicU64::new(0),
                fail: None,
                lie: false,
            }
        }
        fn read(&self, off: u64, buf: &mut [u8], direct: bool) -> Result<usize, PlatformError> {
            if let Some((l, e)) = self.fail {
                let at = stack_offset(l, 0) + (e as usize * PART) as u64;
                if off <= at && at < off + buf.len() as u64 {
                    return Err(PlatformError::Read {
                        offset: off,
                        code: 5,
                    });
                }
            }
            if direct {
                self.reads.fetch_add(1, Ordering::Relaxed);
            }
            let src = self.bytes.get(off as usize..).unwrap_or(&[]);
            let n = src.len().min(buf.len());
            buf[..n].copy_from_slice(&src[..n]);
            if self.lie && !direct && n > 0 {
                buf[n / 2] ^= 1;
            }
            Ok(n)
        }
        fn reads(&self) -> u64 {
            self.reads.load(Ordering::Relaxed)
        }
    }

    /// The platform's threads for reads: none (the reads before the compute), one I/O
    /// thread (`overlap`), a reader pool (`with_readers`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Threads {
        None,
        Io,
        Pool,
    }

    fn slot_bytes() -> u64 {
        3 * slot_part_bytes(PART as u64)
    }

    /// Run `f` with a pager of `slots` slots and `stage` staging slots over the fake
    /// file, reading through `disk` (on the threads `threaded` says).
    fn with_pager(
        disk: &Disk,
        slots: usize,
        stage: usize,
        policy: Policy,
        threaded: Threads,
        f: impl FnOnce(&mut ExpertPager<'_>, &Io<'_>),
    ) {
        let mut region = vec![0u8; 4 << 20];
        let mut arena = Arena::new(&mut region);
        let layers = layers();
        let mut x =
            ExpertPager::new(&mut arena, &layers, slots, slot_bytes(), stage, policy).unwrap();
        let read = |off: u64, buf: &mut [u8], d: bool| disk.read(off, buf, d);
        let parallel = |n: usize, g: &(dyn Fn(usize) + Sync)| (0..n).for_each(g);
        let overlap = |io: &mut (dyn FnMut() + Send), work: &mut dyn FnMut()| {
            std::thread::scope(|s| {
                let h = s.spawn(io);
                work();
                h.join().unwrap();
            })
        };
        // A reader pool as the platform's: `n` threads (here made per call) running
        // `read` while this thread runs `work`.
        let pool = |n: usize, read: &(dyn Fn(usize) + Sync), work: &mut dyn FnMut()| {
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..n).map(|r| s.spawn(move || read(r))).collect();
                work();
                hs.into_iter().for_each(|h| h.join().unwrap());
            })
        };
        let wait = |w: &AtomicU32, v: u32| {
            while w.load(Ordering::Acquire) == v {
                std::thread::yield_now();
            }
        };
        let wake = || {};
        let t0 = std::time::Instant::now();
        let now = || t0.elapsed().as_nanos() as u64;
        let overlap: &OverlapFn = &overlap;
        let pool: &ReadersFn = &pool;
        let io = Io {
            read: &read,
            workers: 1,
            parallel: &parallel,
            readers: (threaded == Threads::Pool).then_some(pool),
            overlap: (threaded != Threads::None).then_some(overlap),
            wait: &wait,
            wake: &wake,
            now: &now,
        };
        f(&mut x, &io);
    }

    /// One batch of layer `il` wanting `want` (and, first, guesses `guess` for layer
    /// `il + 1`): the experts in the order the pager handed them out, with their bytes.
    fn batch(
        x: &mut ExpertPager,
        io: &Io,
        il: usize,
        want: &[u16],
        guess: &[u16],
    ) -> Result<Vec<(u16, Vec<u8>)>, ModelError> {
        x.prepare(il, want, 1)?;
        if !guess.is_empty() {
            x.prefetch_into(il + 1, guess);
        }
        let mut got = Vec::new();
        x.each(io, true, &mut |e, sw| {
            let mut b = sw.gate.data.to_vec();
            b.extend_from_slice(sw.up.data);
            b.extend_from_slice(sw.down.data);
            got.push((e, b));
            Ok(())
        })?;
        Ok(got)
    }

    fn check(disk: &Disk, il: usize, got: &[(u16, Vec<u8>)]) {
        for (e, b) in got {
            assert_eq!(b, &want_bytes(&disk.bytes, il, *e), "layer {il} expert {e}");
        }
    }

    /// LFU keeps two experts used ten times each; a guess for that layer has no count,
    /// so the pool does not admit it. Without staging slots nothing is read ahead (the
    /// 3-9 % the bench-moe model measured); with one, the guess is read there and
    /// the batch that picks it finds it without a read.
    #[test]
    fn lfu_prefetch_reads_a_guess_the_pool_does_not_admit_into_a_staging_slot() {
        for stage in [0, 1] {
            let disk = Disk::new();
            with_pager(&disk, 2, stage, Policy::LFU, Threads::None, |x, io| {
                for _ in 0..10 {
                    check(&disk, 1, &batch(x, io, 1, &[0, 1], &[]).unwrap());
                }
                check(&disk, 0, &batch(x, io, 0, &[3], &[5]).unwrap());
                let before = disk.reads();
                let got = batch(x, io, 1, &[0, 5], &[]).unwrap();
                check(&disk, 1, &got);
                let s = x.layer_stats(1).unwrap();
                if stage == 0 {
                    assert_eq!((s.prefetched, s.read_ahead), (0, 0), "{s:?}");
                    assert_eq!(disk.reads(), before + 3, "expert 5 read on use");
                } else {
                    assert_eq!((s.prefetched, s.read_ahead), (1, 1), "{s:?}");
                    assert_eq!(disk.reads(), before, "expert 5 was read ahead");
                    // Still outside the pool: LFU kept its two favourites.
                    assert!(!x.is_resident(1, 5) && x.is_resident(1, 0));
                }
            });
        }
    }

    /// A guess read into a staging slot that the pool admits when it is picked (its
    /// count, one use, now beats the victim's decayed one) is copied into the slot.
    #[test]
    fn a_staged_guess_the_pool_then_admits_moves_into_its_slot_without_a_read() {
        let disk = Disk::new();
        with_pager(&disk, 1, 2, Policy::LFU, Threads::None, |x, io| {
            check(&disk, 1, &batch(x, io, 1, &[0], &[]).unwrap());
            check(&disk, 0, &batch(x, io, 0, &[2], &[3]).unwrap());
            assert!(!x.is_resident(1, 3), "LFU admitted a guess with no use");
            let before = disk.reads();
            check(&disk, 1, &batch(x, io, 1, &[3], &[]).unwrap());
            assert_eq!(disk.reads(), before);
            assert!(x.is_resident(1, 3) && !x.is_resident(1, 0));
            // From the slot now: the staging slot was let go, the bytes are the same.
            check(&disk, 1, &batch(x, io, 1, &[3], &[]).unwrap());
            assert_eq!(disk.reads(), before);
            let s = x.layer_stats(1).unwrap();
            assert_eq!((s.hits, s.read_ahead, s.prefetched), (2, 1, 1), "{s:?}");
        });
    }

    /// Wrong guesses cost reads and are counted as wasted when their staging slot is
    /// taken; what the batches compute is the file's bytes throughout.
    #[test]
    fn wrong_guesses_cost_reads_and_count_as_wasted() {
        let disk = Disk::new();
        with_pager(&disk, 2, 1, Policy::LFU, Threads::None, |x, io| {
            for _ in 0..3 {
                check(&disk, 1, &batch(x, io, 1, &[0, 1], &[]).unwrap());
            }
            check(&disk, 0, &batch(x, io, 0, &[4], &[7]).unwrap());
            check(&disk, 1, &batch(x, io, 1, &[0, 8], &[]).unwrap());
            check(&disk, 0, &batch(x, io, 0, &[4], &[9]).unwrap());
            check(&disk, 1, &batch(x, io, 1, &[9, 1], &[]).unwrap());
            let s = x.layer_stats(1).unwrap();
            assert_eq!(s.prefetched, 2, "{s:?}");
            assert_eq!(s.read_ahead, 1, "{s:?}");
            assert!(s.prefetch_wasted >= 1, "{s:?}");
        });
    }

    /// LRU admits every guess into the pool: a prefetch there evicts the least recent
    /// expert, as a use would.
    #[test]
    fn lru_prefetch_places_guesses_in_the_pool() {
        let disk = Disk::new();
        with_pager(&disk, 2, 2, Policy::Lru, Threads::None, |x, io| {
            check(&disk, 1, &batch(x, io, 1, &[0, 1], &[]).unwrap());
            check(&disk, 0, &batch(x, io, 0, &[2], &[6]).unwrap());
            assert!(x.is_resident(1, 6));
            check(&disk, 1, &batch(x, io, 1, &[6], &[]).unwrap());
            let s = x.layer_stats(1).unwrap();
            assert_eq!((s.read_ahead, s.prefetched), (1, 1), "{s:?}");
        });
    }

    /// With an I/O thread, the expert already in memory is computed while the missing
    /// one is read: the read of expert 9 waits (up to 5 s) until the compute has had
    /// expert 0, which can only happen when the two run at once.
    #[test]
    fn with_an_io_thread_resident_experts_are_computed_while_misses_are_read() {
        for any_order in [true, false] {
            for threads in [Threads::Io, Threads::Pool] {
                overlaps_in(any_order, threads);
            }
        }
    }

    /// Wait (at most 5 s: a bound, not a timing) until `flag` is set; whether it was.
    fn wait_for(flag: &AtomicBool) -> bool {
        let t0 = std::time::Instant::now();
        while !flag.load(Ordering::Acquire) && t0.elapsed().as_secs() < 5 {
            std::thread::yield_now();
        }
        flag.load(Ordering::Acquire)
    }

    fn overlaps_in(any_order: bool, threads: Threads) {
        let disk = Disk::new();
        let computed = AtomicBool::new(false);
        let saw = AtomicBool::new(false);
        let miss_at = stack_offset(1, 0) + (9 * PART) as u64;
        let read = |off: u64, buf: &mut [u8], d: bool| {
            if off <= miss_at && miss_at < off + buf.len() as u64 {
                saw.store(wait_for(&computed), Ordering::Release);
            }
            disk.read(off, buf, d)
        };
        with_pager(&disk, 2, 0, Policy::LFU, threads, |x, io| {
            check(&disk, 1, &batch(x, io, 1, &[0], &[]).unwrap());
            let io = Io { read: &read, ..*io };
            x.prepare(1, &[0, 9], 1).unwrap();
            let mut order = Vec::new();
            x.each(&io, any_order, &mut |e, sw| {
                if e == 0 {
                    computed.store(true, Ordering::Release);
                }
                let b = [sw.gate.data, sw.up.data, sw.down.data].concat();
                order.push((e, b));
                Ok(())
            })
            .unwrap();
            check(&disk, 1, &order);
            assert_eq!(order.iter().map(|o| o.0).collect::<Vec<_>>(), [0, 9]);
            assert!(
                saw.load(Ordering::Acquire),
                "the read did not overlap the compute"
            );
            let s = x.layer_stats(1).unwrap();
            assert!(s.wait_ns > 0, "{s:?}");
        });
    }

    /// With several readers, an expert's three parts are read at once: the read of
    /// expert 9's gate rows waits (up to 5 s) until the read of its down rows has
    /// begun, which can only happen when two reads run at the same time.
    #[test]
    fn readers_read_the_parts_of_a_miss_at_once() {
        let disk = Disk::new();
        let down_started = AtomicBool::new(false);
        let saw = AtomicBool::new(false);
        let gate_at = stack_offset(1, 0) + (9 * PART) as u64;
        let down_at = stack_offset(1, 2) + (9 * PART) as u64;
        let read = |off: u64, buf: &mut [u8], d: bool| {
            let covers = |at: u64| off <= at && at < off + buf.len() as u64;
            if covers(down_at) {
                down_started.store(true, Ordering::Release);
            }
            if covers(gate_at) {
                saw.store(wait_for(&down_started), Ordering::Release);
            }
            disk.read(off, buf, d)
        };
        with_pager(&disk, 2, 0, Policy::LFU, Threads::Pool, |x, io| {
            x.readers = 3;
            let io = Io { read: &read, ..*io };
            let got = batch(x, &io, 1, &[2, 9], &[]).unwrap();
            check(&disk, 1, &got);
            assert_eq!(got.len(), 2);
            assert!(
                saw.load(Ordering::Acquire),
                "the parts were read one by one"
            );
            // Both misses are in their slots now.
            assert!(x.is_resident(1, 2) && x.is_resident(1, 9));
        });
    }

    /// In batch order (a batch over 16 tokens adds the experts' outputs as they come),
    /// an expert with no slot is read into the transient slot in its place, not after
    /// the others; in any order, the one in memory comes first and the transient ones
    /// last. Either way every expert has the file's bytes, with and without an I/O
    /// thread and for any number of readers.
    #[test]
    fn in_batch_order_transient_experts_are_computed_in_their_place() {
        for threaded in [Threads::None, Threads::Io, Threads::Pool] {
            for readers in [1, 4] {
                let disk = Disk::new();
                // One slot, no staging: LFU keeps expert 5, so 1 and 7 go transient.
                with_pager(&disk, 1, 0, Policy::LFU, threaded, |x, io| {
                    x.readers = readers;
                    for _ in 0..10 {
                        check(&disk, 1, &batch(x, io, 1, &[5], &[]).unwrap());
                    }
                    for (any_order, want) in [(false, [1, 5, 7]), (true, [5, 1, 7])] {
                        x.prepare(1, &[1, 5, 7], 1).unwrap();
                        let mut got = Vec::new();
                        x.each(io, any_order, &mut |e, sw| {
                            got.push((e, [sw.gate.data, sw.up.data, sw.down.data].concat()));
                            Ok(())
                        })
                        .unwrap();
                        check(&disk, 1, &got);
                        let ids: Vec<u16> = got.iter().map(|g| g.0).collect();
                        assert_eq!(ids, want, "any order {any_order}, {threaded:?}");
                    }
                    assert!(x.is_resident(1, 5) && !x.is_resident(1, 1));
                });
            }
        }
    }

    /// A read that fails is an error naming layer, expert and offset, and the expert is
    /// forgotten: the next batch reads it again (and gets the file's bytes). With
    /// several readers the expert's other parts are read fine; the job still fails.
    #[test]
    fn a_failed_read_is_an_error_and_its_expert_is_forgotten() {
        for (threaded, readers) in [
            (Threads::None, 1),
            (Threads::Io, 1),
            (Threads::Pool, 1),
            (Threads::Pool, 4),
        ] {
            let mut disk = Disk::new();
            disk.fail = Some((1, 5));
            let disk = disk;
            let ok = Disk::new();
            with_pager(&disk, 2, 2, Policy::LFU, threaded, |x, io| {
                x.readers = readers;
                let err = batch(x, io, 1, &[1, 5], &[]).unwrap_err();
                match err {
                    ModelError::Pager(PagerError::Read { layer, expert, .. }) => {
                        assert_eq!((layer, expert), (1, 5));
                    }
                    e => panic!("{e:?}"),
                }
                assert!(!x.is_resident(1, 5));
                let read = |off: u64, buf: &mut [u8], d: bool| ok.read(off, buf, d);
                let io = Io { read: &read, ..*io };
                check(&ok, 1, &batch(x, &io, 1, &[1, 5], &[]).unwrap());
                assert!(x.is_resident(1, 5));
            });
        }
    }

    /// `--verify-stream`: each expert read is compared with a buffered read; a
    /// difference is an error naming the offset.
    #[test]
    fn verify_compares_every_expert_read_with_the_file() {
        for lie in [false, true] {
            let mut disk = Disk::new();
            disk.lie = lie;
            with_pager(&disk, 2, 0, Policy::LFU, Threads::Pool, |x, io| {
                x.set_verify(std::boxed::Box::leak(vec![0u8; 4096].into_boxed_slice()));
                let r = batch(x, io, 1, &[2, 3], &[]);
                if lie {
                    assert!(matches!(r, Err(ModelError::StreamMismatch { .. })), "{r:?}");
                    assert!(!x.is_resident(1, 2) || !x.is_resident(1, 3));
                } else {
                    check(&disk, 1, &r.unwrap());
                    assert_eq!(x.layer_stats(1).unwrap().verified, 2);
                }
            });
        }
    }
}
