//! The x86 kernel tables: AVX2 (with FMA and F16C), AVX2 + AVX-512 VNNI, and that +
//! AVX-512 VBMI (the VNNI table with Q1_0's `vpermb` lookup kernel).
//!
//! Each entry names the kernels of one (type, layout); the kernels themselves live in
//! the format-family files (`x86_legacy`, `x86_kquant`: one row; `x86_rows`: row x
//! token tiles; `x86_min`: Q4_1/Q5_1, one row and row ranges; `x86_gemm`,
//! `x86_gemm_lanes`: prompt tiles; `x86_repack`: repacked layouts). A row-range entry tries the prompt tiles first when there are two or more
//! tokens, then the one-token tiles; a `false` from all of them sends the caller to the
//! one-row kernel per (row, token).
//!
//! Every function here is `unsafe` with the table's contract (the CPU has the table's
//! ISA, see [`super::table`]).
#![allow(unsafe_code)]

use core::ops::Range;

use super::table::{block_dot, float_dot, kquant_dot, KernelTable, Kernels};
use super::x86_iq4 as iq4;
use super::x86_iq4_nl_rows as nlr;
use super::x86_kquant512 as k5;
use super::x86_min as mn;
use super::x86_q1_lut::Avx2 as Q1Lut;
use super::x86_q1_lut512::Vbmi as Q1Lut512;
use super::{q1_lut, x86_q4_0_rows as q40, x86_q5_0x4s, x86_repack, x86_rows as xr, Job};
use super::{x86_gemm as gemm, x86_gemm_lanes as gl, x86_kquant as kq, x86_legacy as lg};
use crate::quant::iq4_nl::BlockIq4Nl;
use crate::quant::iq4_xs::BlockIq4Xs;
use crate::quant::q1_0::BlockQ1_0;
use crate::quant::q2_0::BlockQ2_0;
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q4_1::BlockQ4_1;
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q5_1::BlockQ5_1;
use crate::quant::q8_0::BlockQ8_0;
use crate::quant::tq2_0::BlockTq2_0;
use crate::quant::{
    q2_k::BlockQ2K, q3_k::BlockQ3K, q4_k::BlockQ4K, q5_k::BlockQ5K, q6_k::BlockQ6K,
};
use crate::repack::Layout;
use crate::{CpuFeatures, GgmlType as T};

/// The table for `feat`, if it has AVX2.
pub(super) fn for_features(feat: &CpuFeatures) -> Option<&'static KernelTable> {
    if feat.avx512vbmi() {
        Some(&VBMI)
    } else if feat.avx512vnni() {
        Some(&VNNI)
    } else if feat.avx2() {
        Some(&AVX2)
    } else {
        None
    }
}

block_dot!(q8_0_dot, BlockQ8_0, lg::q8_0);
block_dot!(q4_0_dot, BlockQ4_0, lg::q4_0);
block_dot!(q5_0_dot, BlockQ5_0, lg::q5_0);
block_dot!(q4_1_dot, BlockQ4_1, mn::dot::<BlockQ4_1>);
block_dot!(q5_1_dot, BlockQ5_1, mn::dot::<BlockQ5_1>);
block_dot!(q1_0_dot, BlockQ1_0, lg::q1_0);
block_dot!(q2_0_dot, BlockQ2_0, lg::q2_0);
block_dot!(tq2_0_dot, BlockTq2_0, lg::tq2_0);

float_dot!(f32_dot, lg::f32_row, 4);
float_dot!(f16_dot, lg::f16_row, 2);

kquant_dot!(q2_k_dot, BlockQ2K, kq::dot_avx2);
kquant_dot!(q3_k_dot, BlockQ3K, kq::dot_avx2);
kquant_dot!(q4_k_dot, BlockQ4K, kq::dot_avx2);
kquant_dot!(q5_k_dot, BlockQ5K, kq::dot_avx2);
kquant_dot!(q6_k_dot, BlockQ6K, kq::dot_avx2);
kquant_dot!(iq4_xs_dot, BlockIq4Xs, iq4::dot_avx2);
kquant_dot!(q4_k_dot_vnni, BlockQ4K, k5::dot_vnni);
kquant_dot!(q6_k_dot_vnni, BlockQ6K, k5::dot_vnni);
block_dot!(iq4_nl_dot, BlockIq4Nl, iq4::nl_avx2);

/// Row-range entries: `$name(job, w, acts, out)` runs the first kernel of the list that
/// takes the job (`prompt` kernels only for two or more tokens).
macro_rules! rows_fn {
    ($name:ident, prompt [$($p:expr),*], $one:expr) => {
        unsafe fn $name(job: &Job, w: &[u8], acts: &[u8], out: &mut [f32]) -> bool {
            // SAFETY: the table's contract (the CPU has this table's ISA); `Job::new`
            // checked every row and activation slice the kernels index.
            unsafe {
                (job.n_tok >= xr::GEMM_MIN_TOK && (false $(|| $p(job, w, acts, out))*))
                    || $one(job, w, acts, out)
            }
        }
    };
}
rows_fn!(
    q8_0_rows,
    prompt[gl::job_avx2::<BlockQ8_0, 1, 8>],
    xr::lanes_job::<BlockQ8_0>
);
rows_fn!(
    q5_0_rows,
    prompt[gl::job_avx2::<BlockQ5_0, 1, 8>],
    xr::lanes_job::<BlockQ5_0>
);
rows_fn!(
    q8_0_rows_vnni,
    prompt[gl::job_vnni::<BlockQ8_0, 4, 8>],
    xr::lanes_job_vnni::<BlockQ8_0>
);
rows_fn!(
    q5_0_rows_vnni,
    prompt[gl::job_vnni::<BlockQ5_0, 4, 8>],
    xr::lanes_job_vnni::<BlockQ5_0>
);
rows_fn!(q4_0_rows, prompt [], q40::job_avx2);
rows_fn!(q4_0_rows_vnni, prompt [], q40::job_vnni);
rows_fn!(iq4_nl_rows, prompt [], nlr::job_avx2);
rows_fn!(q4_1_rows, prompt [], mn::job_avx2::<BlockQ4_1>);
rows_fn!(q5_1_rows, prompt [], mn::job_avx2::<BlockQ5_1>);
rows_fn!(q2_k_rows, prompt [], xr::kquant_job::<BlockQ2K>);
rows_fn!(q3_k_rows, prompt [], xr::kquant_job::<BlockQ3K>);
rows_fn!(q5_k_rows, prompt [], xr::kquant_job::<BlockQ5K>);
rows_fn!(
    q4_k_rows,
    prompt[gemm::job_avx2::<BlockQ4K>],
    xr::kquant_job::<BlockQ4K>
);
rows_fn!(
    q6_k_rows,
    prompt[gemm::job_avx2::<BlockQ6K>],
    xr::kquant_job::<BlockQ6K>
);
rows_fn!(
    q4_k_rows_vnni,
    prompt[gemm::job_vnni::<BlockQ4K>],
    k5::job_vnni::<BlockQ4K>
);
rows_fn!(
    q6_k_rows_vnni,
    prompt[gemm::job_vnni::<BlockQ6K>],
    k5::job_vnni::<BlockQ6K>
);

/// Q8_0x4 over AVX2 (`VNNI`: with `vpdpbusd`).
unsafe fn q8_0x4<const VNNI: bool>(
    table: &'static KernelTable,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    // SAFETY: the table's contract.
    unsafe { x86_repack::matmul::<VNNI>(table, w, row_bytes, rows, acts, out) }
}

/// Q5_0x4s with AVX-512 VNNI (one token: the transposed product; prompts: the plain
/// tiles on unpacked groups).
unsafe fn q5_0x4s(
    table: &'static KernelTable,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    // SAFETY: the table's contract (this entry is in the VNNI table only).
    unsafe { x86_q5_0x4s::matmul(table, w, row_bytes, rows, acts, out) }
}

/// The entries both tables share: one-row kernels, and row ranges of the formats without
/// a VNNI variant.
macro_rules! common {
    ($($extra:expr),* $(,)?) => {
        &[
            $($extra,)*
            Kernels::plain(T::Q4_1, Some(q4_1_dot), Some(q4_1_rows)),
            Kernels::plain(T::Q5_1, Some(q5_1_dot), Some(q5_1_rows)),
            Kernels::plain(T::Q1_0, Some(q1_0_dot), None),
            Kernels::plain(T::Q2_0, Some(q2_0_dot), None),
            Kernels::plain(T::TQ2_0, Some(tq2_0_dot), None),
            Kernels::plain(T::F32, Some(f32_dot), None),
            Kernels::plain(T::F16, Some(f16_dot), None),
            Kernels::plain(T::Q2_K, Some(q2_k_dot), Some(q2_k_rows)),
            Kernels::plain(T::Q3_K, Some(q3_k_dot), Some(q3_k_rows)),
            Kernels::plain(T::Q5_K, Some(q5_k_dot), Some(q5_k_rows)),
            Kernels::plain(T::IQ4_XS, Some(iq4_xs_dot), None),
            Kernels::plain(T::IQ4_NL, Some(iq4_nl_dot), Some(iq4_nl_rows)),
        ]
    };
}

/// AVX2 + FMA + F16C.
pub(super) static AVX2: KernelTable = KernelTable {
    name: "avx2",
    entries: common![
        Kernels::plain(T::Q8_0, Some(q8_0_dot), Some(q8_0_rows)),
        Kernels::plain(T::Q4_0, Some(q4_0_dot), Some(q4_0_rows)),
        Kernels::plain(T::Q5_0, Some(q5_0_dot), Some(q5_0_rows)),
        Kernels::plain(T::Q4_K, Some(q4_k_dot), Some(q4_k_rows)),
        Kernels::plain(T::Q6_K, Some(q6_k_dot), Some(q6_k_rows)),
        Kernels::packed(T::Q8_0, Layout::Q8_0x4, q8_0x4::<false>),
        Kernels::packed(T::Q1_0, Layout::Q1_0x16, q1_lut::matmul::<Q1Lut>),
    ],
};

/// The VNNI entries, with `$q1` for Q1_0x16.
macro_rules! vnni {
    ($q1:expr) => {
        common![
            Kernels::plain(T::Q8_0, Some(q8_0_dot), Some(q8_0_rows_vnni)),
            Kernels::plain(T::Q4_0, Some(q4_0_dot), Some(q4_0_rows_vnni)),
            Kernels::plain(T::Q5_0, Some(q5_0_dot), Some(q5_0_rows_vnni)),
            Kernels::plain(T::Q4_K, Some(q4_k_dot_vnni), Some(q4_k_rows_vnni)),
            Kernels::plain(T::Q6_K, Some(q6_k_dot_vnni), Some(q6_k_rows_vnni)),
            Kernels::packed(T::Q8_0, Layout::Q8_0x4, q8_0x4::<true>),
            Kernels::packed(T::Q5_0, Layout::Q5_0x4s, q5_0x4s),
            Kernels::packed(T::Q1_0, Layout::Q1_0x16, $q1),
        ]
    };
}

/// AVX2 + AVX-512 F/BW/VL/VNNI.
pub(super) static VNNI: KernelTable = KernelTable {
    name: "avx2+avx512vnni",
    entries: vnni!(q1_lut::matmul::<Q1Lut>),
};

/// AVX2 + AVX-512 F/BW/VL/VNNI/VBMI.
pub(super) static VBMI: KernelTable = KernelTable {
    name: "avx2+avx512vbmi",
    entries: vnni!(q1_lut::matmul::<Q1Lut512>),
};
