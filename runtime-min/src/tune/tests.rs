//! The choice logic on fake measurements and a fake planner: plenty of memory, one core,
//! slow storage, little RAM, a huge vocabulary and a MoE model.
use super::*;

const MIB: u64 = 1 << 20;

/// A model of `layers` + `head` bytes whose fixed memory grows with batch and context:
/// what does not fit the budget is streamed, over 8 MiB of stream zones.
struct FakePlanner {
    layers: u64,
    head_rows: u64,
    head_row_bytes: u64,
}

impl FakePlanner {
    fn fixed(c: &Choice) -> u64 {
        10 * MIB + c.batch as u64 * 256 * 1024 + c.ctx as u64 * 16 * 1024
    }
}

impl Planner for FakePlanner {
    fn cost(&self, c: &Choice) -> PlanCost {
        let rows = if c.head_rows == 0 {
            self.head_rows
        } else {
            c.head_rows as u64
        };
        let weights = self.layers + rows * self.head_row_bytes;
        let fixed = FakePlanner::fixed(c);
        let least = fixed + 8 * MIB;
        match c.budget {
            Some(b) if fixed + weights > b => {
                if least > b {
                    PlanCost {
                        fits: false,
                        total: least,
                        streamed_per_token: 0,
                    }
                } else {
                    PlanCost {
                        fits: true,
                        total: b,
                        streamed_per_token: weights - (b - least),
                    }
                }
            }
            _ => PlanCost {
                fits: true,
                total: fixed + weights,
                streamed_per_token: 0,
            },
        }
    }
}

/// 100 MiB of layers and a 16k-row head of 1 KiB rows (16 MiB).
fn small_model() -> (FakePlanner, ModelFacts) {
    (
        FakePlanner {
            layers: 100 * MIB,
            head_rows: 16384,
            head_row_bytes: 1024,
        },
        ModelFacts {
            head_rows: 16384,
            n_ctx: 2048,
            moe: None,
        },
    )
}

fn secs(v: &[f64]) -> heapless::Vec<f64, MAX_THREADS> {
    heapless::Vec::from_slice(v).unwrap()
}

/// Four cores that scale well, fast storage, 8 GiB available.
fn device() -> Measurements {
    Measurements {
        seq_read_bps: 1e9,
        rand_read_bps: 5e8,
        available: Some(8 << 30),
        guard_floor: 180 * MIB,
        cores: 4,
        layer_secs: secs(&[0.040, 0.021, 0.015, 0.012]),
        head_secs: secs(&[0.010, 0.0055, 0.004, 0.003]),
    }
}

#[test]
fn plenty_of_memory_keeps_everything_resident_on_all_cores() {
    let (pl, f) = small_model();
    let r = recommend(&device(), &f, &pl, None).unwrap();
    assert_eq!(r.streamed_per_token, 0);
    assert_eq!(r.ceiling_tps, None);
    assert_eq!(r.bound, Bound::Compute);
    assert_eq!(r.choice.threads, 4);
    assert_eq!(r.choice.batch, 64);
    assert_eq!(r.choice.head_rows, 0);
    assert_eq!(r.choice.ctx, 2048);
    assert!((r.predicted_tps - 1.0 / 0.015).abs() < 1e-6);
    // The budget is the plan rounded up to whole MiB.
    let b = r.choice.budget.unwrap();
    assert!(b >= r.total && b - r.total < MIB && b.is_multiple_of(MIB));
}

#[test]
fn fewer_threads_win_a_near_tie() {
    let (pl, f) = small_model();
    let mut m = device();
    m.layer_secs = secs(&[0.040, 0.0205, 0.0203, 0.0202]);
    m.head_secs = secs(&[0.010, 0.005, 0.005, 0.005]);
    let r = recommend(&m, &f, &pl, None).unwrap();
    assert_eq!(r.choice.threads, 2);
}

#[test]
fn one_core_runs_one_thread() {
    let (pl, f) = small_model();
    let mut m = device();
    m.cores = 1;
    let r = recommend(&m, &f, &pl, None).unwrap();
    assert_eq!(r.choice.threads, 1);
    assert!((r.predicted_tps - 1.0 / 0.050).abs() < 1e-6);
}

#[test]
fn slow_storage_is_the_bound_and_reads_add_to_compute() {
    let (pl, f) = small_model();
    let mut m = device();
    m.seq_read_bps = 20e6;
    // 100 MiB usable: the plan streams.
    let r = recommend(&m, &f, &pl, Some(100 * MIB)).unwrap();
    assert!(r.streamed_per_token > 0);
    assert_eq!(r.bound, Bound::Storage);
    let ceiling = r.ceiling_tps.unwrap();
    assert!((ceiling - 20e6 / r.streamed_per_token as f64).abs() < 1e-9);
    // The reads take seconds: more threads gain under 2 %, so one thread is kept.
    let t = r.choice.threads;
    assert_eq!(t, 1);
    let compute = m.layer_secs[t - 1] + m.head_secs[t - 1];
    let read = r.streamed_per_token as f64 / m.seq_read_bps;
    assert!((1.0 / r.predicted_tps - (compute + read)).abs() < 1e-9);
    assert!(r.predicted_tps < ceiling);
    assert!(r.choice.budget.unwrap() <= 100 * MIB);
}

#[test]
fn little_ram_lowers_the_context_and_the_guard_floor_counts() {
    let (pl, f) = small_model();
    let mut m = device();
    // 10 MiB + batch 8 x 256 KiB + 2048 x 16 KiB + 8 MiB zones = 52 MiB at -c 2048.
    m.available = Some(180 * MIB + 40 * MIB);
    let r = recommend(&m, &f, &pl, None).unwrap();
    assert_eq!(r.usable, Some(40 * MIB));
    assert!(r.choice.ctx < 2048, "{:?}", r.choice);
    assert!(r.total <= 40 * MIB);
    assert!(r.streamed_per_token > 0);
}

#[test]
fn nothing_fits_is_an_error_naming_need_and_usable() {
    let (pl, f) = small_model();
    let mut m = device();
    m.available = Some(180 * MIB + 10 * MIB);
    assert!(matches!(
        recommend(&m, &f, &pl, None),
        Err(TuneError::NoFit { usable, .. }) if usable == 10 * MIB
    ));
    m.layer_secs.clear();
    assert_eq!(
        recommend(&m, &f, &pl, None).unwrap_err(),
        TuneError::NoTimings
    );
}

#[test]
fn a_user_budget_caps_what_the_guard_leaves() {
    let m = device();
    assert_eq!(usable_memory(&m, Some(MIB)), Some(MIB));
    assert_eq!(usable_memory(&m, None), Some((8 << 30) - 180 * MIB));
    let unknown = Measurements {
        available: None,
        ..device()
    };
    assert_eq!(usable_memory(&unknown, None), None);
}

#[test]
fn smaller_batch_when_the_larger_ones_scratch_costs_streaming() {
    let (pl, f) = small_model();
    // 155 MiB streams 13 MiB per token at batch 8; batch 16's 2 MiB more scratch
    // streams 15 MiB, over 5 % more: batch 8 is kept.
    let r = recommend(&device(), &f, &pl, Some(155 * MIB)).unwrap();
    assert!(r.streamed_per_token > 0);
    assert_eq!(r.choice.batch, 8);
}

#[test]
fn a_streamed_huge_head_is_pruned_when_that_is_much_faster() {
    // 256k rows of 680 B (170 MiB) over 65 MiB of layers, 150 MiB usable: the full head
    // streams ~100 MiB per token; a 32k-row head fits resident.
    let pl = FakePlanner {
        layers: 65 * MIB,
        head_rows: 262144,
        head_row_bytes: 680,
    };
    let f = ModelFacts {
        head_rows: 262144,
        n_ctx: 2048,
        moe: None,
    };
    let mut m = device();
    m.seq_read_bps = 500e6;
    let r = recommend(&m, &f, &pl, Some(150 * MIB)).unwrap();
    assert_eq!(r.choice.head_rows, 32768);
    assert_eq!(r.streamed_per_token, 0);
    let full = r.full_head_tps.unwrap();
    assert!(r.predicted_tps >= 1.5 * full);
    // With fast storage the full head's streaming costs little: no pruning.
    m.seq_read_bps = 100e9;
    let r = recommend(&m, &f, &pl, Some(150 * MIB)).unwrap();
    assert_eq!((r.choice.head_rows, r.full_head_tps), (0, None));
}

#[test]
fn moe_gets_an_expert_pool_and_pays_random_reads_for_misses() {
    let pl = FakePlanner {
        layers: 2000 * MIB,
        head_rows: 32000,
        head_row_bytes: 1024,
    };
    let moe = MoeFacts {
        moe_layers: 24,
        n_expert: 64,
        n_used: 8,
        expert_bytes: MIB,
    };
    let f = ModelFacts {
        head_rows: 32000,
        n_ctx: 2048,
        moe: Some(moe),
    };
    let m = device();
    let usable = 700 * MIB;
    let r = recommend(&m, &f, &pl, Some(usable)).unwrap();
    let pool = r.choice.expert_pool;
    assert!((8..=64).contains(&pool), "{pool}");
    // The pool's slots fit the memory above the least plan (fixed + zones).
    let least = FakePlanner::fixed(&r.choice) + 8 * MIB;
    assert!(least + (pool as u64) * 24 * MIB <= usable);
    let missed = 24.0 * 8.0 * (1.0 - pool as f64 / 64.0) * MIB as f64;
    let ceiling = m.rand_read_bps / missed;
    assert!((r.ceiling_tps.unwrap() - ceiling).abs() < 1e-9);
    assert!(r.predicted_tps <= ceiling + 1e-9);
    // All resident: no pool.
    let r = recommend(&m, &f, &pl, None).unwrap();
    assert_eq!(r.choice.expert_pool, 0);
}
