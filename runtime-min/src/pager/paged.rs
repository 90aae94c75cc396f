//! The pager in the forward pass: each paged MoE layer's pool of expert slots in the
//! arena, filled from the model file as its router picks experts.
//!
//! The MoE block asks for a batch's experts once, after routing ([`ExpertPager::prepare`]
//! with the union of the batch's picks, ascending): the [`Pool`] says which are resident
//! and where to put the others, and every admitted miss is read at once, its three
//! matrices (the expert's rows of `ffn_{gate,up,down}_exps`) as one aligned direct read
//! each, spread over the platform's workers. A miss the pool does not admit (LFU keeps
//! something more used, or the batch needs more experts than the pool has slots) is
//! read into the one transient slot just before it is computed ([`ExpertPager::expert`]).
//! The bytes an expert is computed from are the file's bytes whichever way they came,
//! so the block's output is the all-resident one bit for bit.
//!
//! Pre-gated prefetch ([`ExpertPager::prefetch`]): the next MoE layer's router applied
//! to the current layer's input guesses its picks; the guessed experts that are missing
//! are read into free or evictable slots ahead of use. A wrong guess costs a read, never
//! a wrong number: prepare checks the pool as always.
//!
//! # Invariants
//! A slot's bytes are the file bytes of the expert the pool says it holds; the transient
//! slot's are those of `transient`'s expert.
use core::sync::atomic::{AtomicUsize, Ordering};

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
    /// Time spent reading (the compute thread waits for it).
    pub read_ns: u64,
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

/// Every paged layer's pool and slots, the transient slot, the routing trace.
pub struct ExpertPager<'a> {
    pages: heapless::Vec<LayerPages<'a>, MAX_LAYERS>,
    at: [u8; MAX_LAYERS],
    transient: &'a mut [u8],
    transient_holds: Option<(usize, u16)>,
    /// The current batch's picks and where each is: slot, or `u16::MAX` (transient).
    batch: heapless::Vec<(u16, u16), MAX_EXPERTS>,
    batch_layer: usize,
    pub routing: Routing,
    /// Read ahead the next MoE layer's guessed experts.
    pub prefetch: bool,
    trace: Option<TraceWriter<'a>>,
    /// Tokens of the pass the trace is recording.
    trace_tokens: usize,
    /// MoE layers in order (for the trace's layer index).
    moe_order: [u8; MAX_LAYERS],
    n_moe: usize,
    /// Experts per MoE layer.
    n_expert: usize,
}

/// A read job: an expert part's aligned span and where it goes.
type Job<'d> = spin::Mutex<Option<(Span, &'d mut [u8], usize, u16)>>;

/// Most reads issued at once (each worker takes jobs in turn).
const JOBS: usize = 48;

impl<'a> ExpertPager<'a> {
    /// A pager for `layers` (the model's layers; the MoE ones whose stacks have no data
    /// are paged) with `slots` slots each under `policy`, from `arena`.
    pub fn new(
        arena: &mut Arena<'a>,
        layers: &[crate::model::layer::Layer<'a>],
        slots: usize,
        slot_bytes_max: u64,
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
        let transient = if pages.is_empty() {
            &mut [][..]
        } else {
            arena.bytes_aligned("expert pool", slot_bytes_max as usize, IO_ALIGN as usize)?
        };
        Ok(ExpertPager {
            pages,
            at,
            transient,
            transient_holds: None,
            batch: heapless::Vec::new(),
            batch_layer: usize::MAX,
            routing: Routing::default(),
            prefetch: false,
            trace: None,
            trace_tokens: 0,
            moe_order,
            n_moe,
            n_expert,
        })
    }

    /// MoE layers (paged or not): the trace's layer count.
    pub fn n_moe(&self) -> usize {
        self.n_moe
    }

    /// Warm start: place layer `il`'s hot list `hot` (most used first) into its free
    /// slots and read them. Returns how many were placed.
    pub fn warm(&mut self, io: &Io<'_>, il: usize, hot: &[u16]) -> Result<usize, ModelError> {
        let Some(pi) = self.pages_of(il) else {
            return Ok(0);
        };
        let lp = &mut self.pages[pi];
        let mut placed = [(0u16, 0u16); MAX_EXPERTS];
        let n = lp
            .pool
            .warm(hot, &mut placed)
            .map_err(|err| PagerError::Pool { layer: il, err })?;
        read_into_slots(io, lp, &placed[..n])?;
        Ok(n)
    }

    /// Whether any layer is paged.
    pub fn pages(&self) -> bool {
        !self.pages.is_empty()
    }

    /// Empty every pool and use `policy` from now on.
    pub fn set_policy(&mut self, policy: Policy) {
        for lp in self.pages.iter_mut() {
            lp.pool.reset(policy);
            lp.prefetched.fill(0);
        }
        self.transient_holds = None;
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

    /// Layer `il`'s batch of `tokens` tokens needs `want` (distinct, ascending): look
    /// them up, and read the admitted misses into their slots with `read`, over `par`.
    pub fn prepare(
        &mut self,
        io: &Io<'_>,
        il: usize,
        want: &[u16],
        tokens: usize,
    ) -> Result<(), ModelError> {
        self.batch.clear();
        self.batch_layer = il;
        let Some(pi) = self.pages_of(il) else {
            return Ok(());
        };
        let lp = &mut self.pages[pi];
        let mut acc = [Access::Hit(0); MAX_EXPERTS];
        lp.pool
            .access(want, &mut acc)
            .map_err(|err| PagerError::Pool { layer: il, err })?;
        for _ in 0..tokens {
            lp.pool.tick();
        }
        let mut misses = heapless::Vec::<(u16, u16), MAX_EXPERTS>::new();
        for (&e, a) in want.iter().zip(&acc) {
            let at = match *a {
                Access::Hit(s) => {
                    lp.stats.hits += 1;
                    if core::mem::take(&mut lp.prefetched[e as usize]) == 1 {
                        lp.stats.read_ahead += 1;
                    }
                    s
                }
                Access::Miss { slot, evicted } => {
                    lp.stats.misses += 1;
                    if let Some(v) = evicted {
                        if core::mem::take(&mut lp.prefetched[v as usize]) == 1 {
                            lp.stats.prefetch_wasted += 1;
                        }
                    }
                    match slot {
                        Some(s) => {
                            let _ = misses.push((e, s));
                            s
                        }
                        None => u16::MAX,
                    }
                }
            };
            let _ = self.batch.push((e, at));
        }
        if self
            .transient_holds
            .is_some_and(|(l, e)| l == il && lp.pool.slot(e).is_some())
        {
            self.transient_holds = None;
        }
        read_into_slots(io, lp, &misses)
    }

    /// Expert `e` of the current batch's layer (after [`Self::prepare`]), or `None` when
    /// the layer is not paged (its stacks hold every expert).
    pub fn expert(&mut self, io: &Io<'_>, e: u16) -> Result<Option<SwiGlu<'_>>, ModelError> {
        let il = self.batch_layer;
        let Some(pi) = self.pages_of(il) else {
            return Ok(None);
        };
        let &(_, at) = self
            .batch
            .iter()
            .find(|(x, _)| *x == e)
            .ok_or(ModelError::Pager(PagerError::NotPrepared {
                layer: il,
                expert: e,
            }))?;
        let lp = &mut self.pages[pi];
        let buf: &[u8] = if at == u16::MAX {
            if self.transient_holds != Some((il, e)) {
                self.transient_holds = None;
                let t0 = (io.now)();
                let n = read_expert(io.read, &lp.parts, il, e, self.transient)?;
                lp.stats.reads += 1;
                lp.stats.bytes += n;
                lp.stats.read_ns += (io.now)().saturating_sub(t0);
                self.transient_holds = Some((il, e));
            }
            &self.transient[..lp.slot_bytes]
        } else {
            let s = at as usize * lp.slot_bytes;
            &lp.slots[s..s + lp.slot_bytes]
        };
        let [g, u, d] = lp.parts.map(|p| view(&p, buf, e));
        Ok(Some(SwiGlu {
            gate: g,
            up: u,
            down: d,
        }))
    }

    /// Pre-gated prefetch: `guess` (distinct) are the experts layer `il` will probably
    /// pick; read the missing ones into slots now. Does not count as a use.
    pub fn prefetch_into(
        &mut self,
        io: &Io<'_>,
        il: usize,
        guess: &[u16],
    ) -> Result<(), ModelError> {
        let Some(pi) = self.pages_of(il) else {
            return Ok(());
        };
        let lp = &mut self.pages[pi];
        let mut jobs = heapless::Vec::<(u16, u16), MAX_EXPERTS>::new();
        for &e in guess {
            if lp.pool.slot(e).is_some() {
                continue;
            }
            if let Some((s, evicted)) = lp.pool.place_ahead(e, guess) {
                if let Some(v) = evicted {
                    if core::mem::take(&mut lp.prefetched[v as usize]) == 1 {
                        lp.stats.prefetch_wasted += 1;
                    }
                }
                lp.prefetched[e as usize] = 1;
                lp.stats.prefetched += 1;
                let _ = jobs.push((e, s));
            }
        }
        if self
            .transient_holds
            .is_some_and(|(l, e)| l == il && lp.pool.slot(e).is_some())
        {
            self.transient_holds = None;
        }
        read_into_slots(io, lp, &jobs)
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

/// `parallel(n, f)`: run `f(i)` for `i in 0..n` on the platform's workers.
pub type ParallelFn<'x> = dyn Fn(usize, &(dyn Fn(usize) + Sync)) + Sync + 'x;

/// What reading needs from the session: the file reader, the platform's workers and
/// clock.
pub struct Io<'x> {
    pub read: &'x ReadFn<'x>,
    pub workers: usize,
    pub parallel: &'x ParallelFn<'x>,
    pub now: &'x (dyn Fn() -> u64 + Sync),
}

/// Expert `e`'s part `p` viewed in a slot's bytes.
fn view<'b>(p: &Part, slot: &'b [u8], e: u16) -> Tensor<'b> {
    let exact = p.exact(e);
    let lead = (exact.offset - exact.aligned().offset) as usize;
    let at = p.at + lead;
    Tensor {
        ty: p.ty,
        cols: p.cols,
        rows: p.rows,
        data: &slot[at..at + p.bytes as usize],
        layout: pinch_kernels::repack::Layout::Plain,
        file: exact,
    }
}

/// Read expert `e`'s three parts into `slot` (one after another); returns the bytes.
fn read_expert(
    read: &ReadFn,
    parts: &[Part; 3],
    il: usize,
    e: u16,
    slot: &mut [u8],
) -> Result<u64, ModelError> {
    let mut n = 0;
    for p in parts {
        let span = p.exact(e).aligned();
        let dst = &mut slot[p.at..p.at + slot_part_bytes(p.bytes) as usize];
        n += fill(read, dst, span, None).map_err(|err| read_err(err, il, e, span))?;
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

/// Read `(expert, slot)` pairs into their slots: every part one aligned read, spread
/// over the workers.
fn read_into_slots(
    io: &Io<'_>,
    lp: &mut LayerPages<'_>,
    misses: &[(u16, u16)],
) -> Result<(), ModelError> {
    if misses.is_empty() {
        return Ok(());
    }
    let t0 = (io.now)();
    let il = lp.il;
    let sb = lp.slot_bytes;
    let parts = lp.parts;
    let mut by_slot: heapless::Vec<Option<&mut [u8]>, MAX_EXPERTS> =
        lp.slots.chunks_exact_mut(sb).map(Some).collect();
    let mut jobs: heapless::Vec<Job<'_>, JOBS> = heapless::Vec::new();
    let err = spin::Mutex::new(None);
    let bytes = core::sync::atomic::AtomicU64::new(0);
    let run = |jobs: &heapless::Vec<Job<'_>, JOBS>| {
        let next = AtomicUsize::new(0);
        let work = |_: usize| loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(j) = jobs.get(i) else { break };
            let Some((span, dst, layer, e)) = j.lock().take() else {
                continue;
            };
            match fill(io.read, dst, span, None) {
                Ok(n) => {
                    bytes.fetch_add(n, Ordering::Relaxed);
                }
                Err(x) => {
                    err.lock().get_or_insert(read_err(x, layer, e, span));
                }
            }
        };
        let n = io.workers.clamp(1, jobs.len().max(1));
        if n > 1 {
            (io.parallel)(n, &work);
        } else {
            work(0);
        }
    };
    for &(e, s) in misses {
        let Some(mut slot) = by_slot.get_mut(s as usize).and_then(Option::take) else {
            continue;
        };
        for p in &parts {
            let len = slot_part_bytes(p.bytes) as usize;
            let (dst, rest) = core::mem::take(&mut slot).split_at_mut(len);
            slot = rest;
            let _ = jobs.push(spin::Mutex::new(Some((p.exact(e).aligned(), dst, il, e))));
        }
        if jobs.len() + 3 > JOBS {
            run(&jobs);
            jobs.clear();
        }
    }
    run(&jobs);
    drop(jobs);
    lp.stats.reads += misses.len() as u64;
    lp.stats.bytes += bytes.into_inner();
    lp.stats.read_ns += (io.now)().saturating_sub(t0);
    match err.into_inner() {
        Some(e) => {
            // The slots that failed hold stale bytes: forget every expert of this read.
            for &(e, _) in misses {
                lp.pool.forget(e);
            }
            Err(e)
        }
        None => Ok(()),
    }
}

/// The MoE block's [`Experts`] when the session has a pager: hits from the pools,
/// misses read through `io`; layers that are not paged use their stacks.
pub struct Paged<'x, 'a> {
    pub pager: &'x mut ExpertPager<'a>,
    pub io: Io<'x>,
}

impl Experts for Paged<'_, '_> {
    fn prepare(&mut self, block: &MoeFfn<'_>, want: &[u16], n: usize) -> Result<(), ModelError> {
        self.pager.prepare(&self.io, block.il, want, n)
    }
    fn get<'y>(&'y mut self, block: &'y MoeFfn<'_>, e: usize) -> Result<SwiGlu<'y>, ModelError> {
        match self.pager.expert(&self.io, e as u16)? {
            Some(sw) => Ok(sw),
            None => block.expert(e),
        }
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
        self.pager.prefetch_into(&self.io, il, &guess)
    }
}

impl From<PagerError> for ModelError {
    fn from(e: PagerError) -> Self {
        ModelError::Pager(e)
    }
}
