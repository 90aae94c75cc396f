//! The tiny fixtures in `tests/data/tiny` and how their logits are judged against
//! llama.cpp's (the tolerances of `tests/data/tiny/README.md`), shared by the in-process
//! goldens (`golden_tiny`) and the check of a shipped device binary (`device_binary`).
use crate::{argmax, data_dir, max_abs_diff, read_rows, top1_margin};

pub const N_VOCAB: usize = 300;

/// The fixtures' file names (`tiny-ARCH-QUANT.gguf`), sorted.
pub fn fixtures() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(data_dir().join("tiny"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".gguf"))
        .collect();
    v.sort();
    assert!(v.len() >= 20, "tiny fixtures missing from tests/data/tiny");
    v
}

fn stem(name: &str) -> &str {
    name.trim_end_matches(".gguf")
}

/// llama.cpp's logits for fixture `name`, run config `cfg` (`f32kv`, `dequant-f32kv`)
/// and `kind` (`batched`, `seq`, `greedy`).
pub fn golden(name: &str, cfg: &str, kind: &str) -> Vec<Vec<f32>> {
    read_rows(
        &data_dir()
            .join("tiny")
            .join(format!("{}.{cfg}.{kind}.f32", stem(name))),
        N_VOCAB,
    )
}

pub fn is_f32(name: &str) -> bool {
    name.ends_with("-F32.gguf")
}

/// The golden config the f32 oracle must match: `f32kv` for F32 files, else the run on
/// llama.cpp's own dequantization of the weights.
pub fn oracle_config(name: &str) -> &'static str {
    if is_f32(name) {
        "f32kv"
    } else {
        "dequant-f32kv"
    }
}

/// Architectures whose fixtures and goldens are in `tests/data/tiny` but that pinch does
/// not run yet: loading them must fail with `UnsupportedArch`. An architecture leaves
/// this list in the change that makes it pass the goldens.
const PENDING_ARCHS: &[&str] = &[];

pub fn pending_arch(name: &str) -> bool {
    PENDING_ARCHS
        .iter()
        .any(|a| name.starts_with(&format!("tiny-{a}-")))
}

/// The f32 oracle's largest allowed distance from llama.cpp (gemma3: its f16 GELU table).
pub fn oracle_tol(name: &str) -> f32 {
    if name.contains("gemma3") {
        2e-3
    } else {
        1e-4
    }
}

/// Where two sets of logit rows differ most.
#[derive(Clone, Copy, Debug)]
pub struct Worst {
    pub diff: f32,
    pub position: usize,
    pub token: usize,
    pub got: f32,
    pub want: f32,
}

impl core::fmt::Display for Worst {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "max |diff| {:.3e} at position {} token {} (pinch {}, llama.cpp {})",
            self.diff, self.position, self.token, self.got, self.want
        )
    }
}

/// The largest difference of `got` from `want`; a row count that differs or a value
/// that is not finite counts as infinitely far (and is named).
pub fn worst(got: &[Vec<f32>], want: &[Vec<f32>]) -> Worst {
    let mut w = Worst {
        diff: 0.0,
        position: 0,
        token: 0,
        got: 0.0,
        want: 0.0,
    };
    if got.len() != want.len() {
        w.diff = f32::INFINITY;
        w.position = got.len().min(want.len());
        return w;
    }
    for (position, (g, r)) in got.iter().zip(want).enumerate() {
        for (token, (&a, &b)) in g.iter().zip(r).enumerate() {
            let d = if a.is_finite() {
                (a - b).abs()
            } else {
                f32::INFINITY
            };
            if d > w.diff || (d.is_infinite() && w.diff.is_finite()) {
                w = Worst {
                    diff: d,
                    position,
                    token,
                    got: a,
                    want: b,
                };
            }
        }
    }
    w
}

/// The fast path (activations quantized like llama.cpp) against llama.cpp's `f32kv`
/// logits, judged as the README recommends.
#[derive(Clone, Copy, Debug)]
pub struct FastCheck {
    pub positions: usize,
    /// Positions more than 1e-4 away.
    pub over: usize,
    pub worst: Worst,
    /// llama.cpp's own `f32kv`-vs-`dequant-f32kv` distance (the activation quantization's
    /// noise), times 1.5, at least 0.075.
    pub bound: f32,
    /// Positions where llama.cpp's top-1 leads by at least 0.5 and pinch's differs.
    pub top1_bad: usize,
}

impl FastCheck {
    pub fn new(got: &[Vec<f32>], want: &[Vec<f32>], dequant: &[Vec<f32>]) -> FastCheck {
        let bound = want
            .iter()
            .zip(dequant)
            .map(|(a, b)| max_abs_diff(a, b))
            .fold(0.0, f32::max)
            .max(0.05)
            * 1.5;
        let mut over = 0;
        let mut top1_bad = 0;
        for (g, w) in got.iter().zip(want) {
            if worst(core::slice::from_ref(g), core::slice::from_ref(w)).diff > 1e-4 {
                over += 1;
            }
            if top1_margin(w) >= 0.5 && argmax(g) != argmax(w) {
                top1_bad += 1;
            }
        }
        FastCheck {
            positions: got.len(),
            over,
            worst: worst(got, want),
            bound,
            top1_bad,
        }
    }

    /// x86 reproduces llama.cpp's x86 sums, so all but a few positions agree to 1e-4.
    /// NEON (aarch64 and armv7) sums Q8_0/Q5_0 per block (`q8_0::Order::BlockSum`, as
    /// llama.cpp's own ARM code does in its way): the int8 rounding flips that follow
    /// then reach most positions (`block_sums`), still bounded by the quantization noise
    /// and with the same top-1.
    pub fn passes(&self, block_sums: bool) -> bool {
        (self.over <= 3 || block_sums) && self.worst.diff <= self.bound && self.top1_bad == 0
    }
}

impl core::fmt::Display for FastCheck {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{:2}/{} positions > 1e-4, {} (bound {:.3}), top-1 mismatches {}",
            self.over, self.positions, self.worst, self.bound, self.top1_bad
        )
    }
}
