//! The kernel table: per ISA level, (weight type, layout) → kernels.
//!
//! Each ISA file set (`x86_*`, `neon_*`, `arm32_*`) builds its levels' tables as `static`s
//! ([`super::x86_table`], [`super::neon_table`]) whose entries are `unsafe fn` pointers
//! with one contract: *the CPU has the table's ISA*. A table is reachable only through
//! [`table`], which picks it from a [`CpuFeatures`] value, and `CpuFeatures` can only
//! hold features that detection proved (see [`crate::cpu`]). So the safe methods below
//! may call the entries, and no safe function of this crate runs an instruction the CPU
//! was not shown to have.
//!
//! Adding a kernel is its file and one [`Kernels`] line in its ISA's table.
#![allow(unsafe_code)]
// armv7 has one-row kernels only: the row-range and repacked parts go unused there.
#![cfg_attr(target_arch = "arm", allow(dead_code))]

use core::ops::Range;

use super::Job;
use crate::blocks::cast;
use crate::quant::{QuantBlock, WeightBlock};
use crate::repack::Layout;
use crate::{CpuFeatures, GgmlType};

/// One weight row dotted with one activation row; `None` when the shapes are not whole,
/// matching blocks.
///
/// # Safety
/// The CPU has the ISA of the table holding the pointer.
pub(crate) type DotFn = unsafe fn(&[u8], &[u8]) -> Option<f32>;

/// Row-range product over a checked [`Job`] (plain rows): `out[i * n_tok + t]` for row
/// `job.rows.start + i` and token `t`; `false` (nothing written) when the shapes do not
/// fit the kernel.
///
/// # Safety
/// The CPU has the ISA of the table holding the pointer.
pub(crate) type RowsFn = unsafe fn(&Job, &[u8], &[u8], &mut [f32]) -> bool;

/// Row-range product over a repacked tensor (`w`: all of its rows; see
/// [`crate::repack::matmul_rows`]), given the table it came from for the plain tail
/// rows; `false` (nothing written) when the shapes do not fit.
///
/// # Safety
/// The CPU has the ISA of the table holding the pointer (and of the table passed).
pub(crate) type PackedFn =
    unsafe fn(&'static KernelTable, &[u8], usize, Range<usize>, &[u8], &mut [f32]) -> bool;

/// The kernels of one (type, layout) on one ISA level.
pub struct Kernels {
    pub(super) ty: GgmlType,
    pub(super) layout: Layout,
    /// One row x one token (plain layout).
    pub(super) dot: Option<DotFn>,
    /// Row ranges x tokens, tiled (plain layout).
    pub(super) rows: Option<RowsFn>,
    /// Row ranges x tokens over a repacked layout.
    pub(super) packed: Option<PackedFn>,
}

impl Kernels {
    /// A plain-layout entry.
    pub(super) const fn plain(ty: GgmlType, dot: Option<DotFn>, rows: Option<RowsFn>) -> Kernels {
        Kernels {
            ty,
            layout: Layout::Plain,
            dot,
            rows,
            packed: None,
        }
    }
    /// A repacked-layout entry (`layout` holds tensors of `ty`).
    pub(super) const fn packed(ty: GgmlType, layout: Layout, packed: PackedFn) -> Kernels {
        Kernels {
            ty,
            layout,
            dot: None,
            rows: None,
            packed: Some(packed),
        }
    }
}

/// Every kernel of one ISA level. Repacked entries are listed in order of preference
/// (the first one for a type is [`crate::repack::Layout::preferred`]).
pub struct KernelTable {
    /// Short name (`"avx2"`, `"neon+dotprod"`, `"scalar"`).
    pub name: &'static str,
    pub(super) entries: &'static [Kernels],
}

/// No SIMD kernel: everything takes the scalar references.
static SCALAR: KernelTable = KernelTable {
    name: "scalar",
    entries: &[],
};

/// The table of the best ISA level `feat` allows (chosen once per call by the entry
/// points; each table is a `static`, built at compile time).
pub fn table(feat: &CpuFeatures) -> &'static KernelTable {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = super::x86_table::for_features(feat) {
        return t;
    }
    #[cfg(target_arch = "aarch64")]
    if let Some(t) = super::neon_table::for_features(feat) {
        return t;
    }
    #[cfg(target_arch = "arm")]
    if let Some(t) = super::arm32_table::for_features(feat) {
        return t;
    }
    let _ = feat;
    &SCALAR
}

impl KernelTable {
    fn entry(&self, ty: GgmlType, layout: Layout) -> Option<&Kernels> {
        self.entries
            .iter()
            .find(|e| e.ty == ty && e.layout == layout)
    }

    /// Whether there is a one-row SIMD kernel for `ty` (plain layout).
    pub fn has_dot(&self, ty: GgmlType) -> bool {
        self.entry(ty, Layout::Plain)
            .is_some_and(|e| e.dot.is_some())
    }

    /// Whether there is a SIMD kernel over `layout` (a repacked layout).
    pub fn has_packed(&self, layout: Layout) -> bool {
        self.entries
            .iter()
            .any(|e| e.layout == layout && e.packed.is_some())
    }

    /// The first repacked layout this table lists for `ty` with the type's exact arithmetic
    /// (`Layout::is_exact`: the `--lut8` layouts are only taken on request).
    pub fn preferred_layout(&self, ty: GgmlType) -> Option<Layout> {
        self.entries
            .iter()
            .find(|e| e.ty == ty && e.packed.is_some() && e.layout.is_exact())
            .map(|e| e.layout)
    }

    /// The one-row SIMD kernel for `ty`, as a safe closure-like value.
    pub(crate) fn dot_kernel(&'static self, ty: GgmlType) -> Option<Dot> {
        self.entry(ty, Layout::Plain)
            .and_then(|e| e.dot)
            .map(|f| Dot(f))
    }

    /// Tiled row-range product of plain rows; `false` when there is no such kernel here
    /// or the shapes are not the kernel's.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rows(
        &'static self,
        ty: GgmlType,
        w: &[u8],
        row_bytes: usize,
        rows: Range<usize>,
        acts: &[u8],
        act_row_bytes: usize,
        out: &mut [f32],
    ) -> bool {
        let Some(f) = self.entry(ty, Layout::Plain).and_then(|e| e.rows) else {
            return false;
        };
        let Some(job) = Job::new(w, row_bytes, rows, acts, act_row_bytes, out.len()) else {
            return false;
        };
        // SAFETY: `self` came from `table`, which picks a table only for features the CPU
        // was proven to have; `Job::new` checked the shapes the kernel indexes.
        unsafe { f(&job, w, acts, out) }
    }

    /// Product over a repacked tensor; `false` when there is no kernel for `layout` here
    /// or the shapes do not fit.
    pub(crate) fn packed(
        &'static self,
        layout: Layout,
        w: &[u8],
        row_bytes: usize,
        rows: Range<usize>,
        acts: &[u8],
        out: &mut [f32],
    ) -> bool {
        let Some(f) = self
            .entries
            .iter()
            .find(|e| e.layout == layout && e.packed.is_some())
            .and_then(|e| e.packed)
        else {
            return false;
        };
        // SAFETY: as in `rows`: the table's ISA is the CPU's; the kernel checks the shapes.
        unsafe { f(self, w, row_bytes, rows, acts, out) }
    }
}

/// A one-row kernel of a table picked by [`table`].
#[derive(Clone, Copy)]
pub(crate) struct Dot(DotFn);

impl Dot {
    /// The dot product, `None` when the shapes are not whole, matching blocks.
    #[inline]
    pub(crate) fn call(self, w: &[u8], act: &[u8]) -> Option<f32> {
        // SAFETY: a `Dot` is made only by `KernelTable::dot_kernel` of a table that
        // `table` picked for the CPU's proven features.
        unsafe { (self.0)(w, act) }
    }
}

/// Weight blocks and activation blocks of one row, if their counts agree (a weight block
/// spans `W::QK / W::Act::QK` activation blocks).
#[inline]
pub(super) fn pair<'a, W: WeightBlock>(
    w: &'a [u8],
    act: &'a [u8],
) -> Option<(&'a [W], &'a [W::Act])> {
    let wb = cast::<W>(w)?;
    let ab = cast::<W::Act>(act)?;
    (ab.len() == wb.len() * (W::QK / <W::Act as QuantBlock>::QK)).then_some((wb, ab))
}

/// A `DotFn` over whole blocks: `$name(w, act)` casts and pairs the blocks, then runs
/// `$kernel(&[W], &[W::Act]) -> f32` (an `unsafe` ISA function).
macro_rules! block_dot {
    ($name:ident, $w:ty, $kernel:path) => {
        /// # Safety
        /// The CPU has the ISA `$kernel` is compiled for.
        unsafe fn $name(w: &[u8], act: &[u8]) -> Option<f32> {
            let (x, y) = $crate::arch::table::pair::<$w>(w, act)?;
            // SAFETY: the caller guarantees the ISA; the kernel reads only the slices.
            Some(unsafe { $kernel(x, y) })
        }
    };
}
pub(super) use block_dot;

/// A `DotFn` over float rows: `$kernel(w, act) -> f32` where `act` holds one f32 per
/// weight of `$wbytes` bytes.
#[cfg_attr(target_arch = "arm", allow(unused_macros))] // armv7 has no float kernels
macro_rules! float_dot {
    ($name:ident, $kernel:path, $wbytes:expr) => {
        /// # Safety
        /// The CPU has the ISA `$kernel` is compiled for.
        unsafe fn $name(w: &[u8], act: &[u8]) -> Option<f32> {
            if !w.len().is_multiple_of($wbytes) || act.len() != w.len() / $wbytes * 4 {
                return None;
            }
            // SAFETY: the caller guarantees the ISA; lengths checked above.
            Some(unsafe { $kernel(w, act) })
        }
    };
}
#[cfg_attr(target_arch = "arm", allow(unused_imports))]
pub(super) use float_dot;

/// A `DotFn` for a K-quant (or any Q8_K-paired) format whose kernel pairs the blocks
/// itself: `$kernel(&[B], &[BlockQ8K]) -> f32`.
macro_rules! kquant_dot {
    ($name:ident, $b:ty, $kernel:path) => {
        /// # Safety
        /// The CPU has the ISA `$kernel` is compiled for.
        unsafe fn $name(w: &[u8], act: &[u8]) -> Option<f32> {
            let x = $crate::blocks::cast::<$b>(w).unwrap_or(&[]);
            let y = $crate::quant::q8_k::act_blocks(act);
            // SAFETY: the caller guarantees the ISA; the kernel reads only the slices.
            Some(unsafe { $kernel(x, y) })
        }
    };
}
pub(super) use kquant_dot;

/// The checked shape of a call over a repacked tensor (see [`PackedFn`]).
pub(super) struct PackedJob {
    /// Activation rows (tokens).
    pub(super) n_tok: usize,
    /// Bytes per activation row.
    pub(super) arb: usize,
    /// Rows below `split` lie in whole groups; rows from `split` on are plain.
    pub(super) split: usize,
}

impl PackedJob {
    /// Check `w` (whole rows of `row_bytes`, made of `block`-byte weight blocks, each
    /// paired with `act_per_block` activation bytes), `rows`, `acts` and `out_len`
    /// (one value per row and token) for groups of `group` rows.
    pub(super) fn new(
        w: &[u8],
        row_bytes: usize,
        rows: &Range<usize>,
        acts: &[u8],
        out_len: usize,
        (block, act_per_block, group): (usize, usize, usize),
    ) -> Option<PackedJob> {
        if row_bytes == 0
            || !row_bytes.is_multiple_of(block)
            || !w.len().is_multiple_of(row_bytes)
            || rows.start > rows.end
            || rows.end > w.len() / row_bytes
        {
            return None;
        }
        let arb = row_bytes / block * act_per_block;
        if arb == 0 || !acts.len().is_multiple_of(arb) {
            return None;
        }
        let n_tok = acts.len() / arb;
        if rows.len().checked_mul(n_tok) != Some(out_len) {
            return None;
        }
        let whole = w.len() / row_bytes / group * group;
        Some(PackedJob {
            n_tok,
            arb,
            split: rows.end.min(whole).max(rows.start),
        })
    }
}
