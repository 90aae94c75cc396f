//! The expert pager in the forward pass: under budgets whose pools hold fewer experts
//! than a layer has, every MoE layer is paged, and the logits must be the all-resident
//! run's bit for bit (one token at a time and in batches, LFU and LRU, with prefetch,
//! with and without an I/O thread reading experts while the compute runs);
//! the weights and pools stay under the budget; the simulator replaying the pager's own
//! trace counts the same hits and misses. With the resident weights repacked and the
//! paged experts of every type repacked in their slots as they are read (Q2_K experts in
//! Q2Kx8 on aarch64, Q8_0 in Q8_0x4 on x86, ...; `pinch run` does it for Q2_K), the
//! logits are still the plain all-resident run's bit for bit
//! (`tests/data/pager/tiny-qwen3moe-Q2_K.gguf`: every expert matrix Q2_K).
use pinch_kernels::repack::{self, Layout};
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::model::{Config, KvType, Logits, Math, ModelError, Session};
use pinch_runtime_min::pager::{simulate, ExpertPager, PagerError, PagerStats, Policy, Trace};
use pinch_runtime_min::platform::Platform;
use pinch_runtime_min::residency::{self, ResidencyPlan};
use pinch_tests::{
    data_dir, host_cpu, with_session_budget, with_session_reads, with_session_threaded, RunSpec,
};

const MODELS: [&str; 5] = [
    "tiny-qwen3moe-Q8_0.gguf",
    "tiny-qwen3moe-Q4_K_M.gguf",
    "tiny-bailingmoe2-Q8_0.gguf",
    "tiny-bailingmoe2-Q4_K_M.gguf",
    Q2_K_MOE,
];

/// Every expert matrix Q2_K (`tests/data/pager/README.md`).
const Q2_K_MOE: &str = "tiny-qwen3moe-Q2_K.gguf";

fn spec(batch: usize) -> RunSpec {
    RunSpec {
        math: Math::Fast,
        kv: KvType::F32,
        batch,
        threads: 1,
        attn_skip: false,
    }
}

fn tokens(n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 5) % n_vocab) as u32).collect()
}

fn load(name: &str) -> Vec<u8> {
    let dir = if name == Q2_K_MOE { "pager" } else { "tiny" };
    std::fs::read(data_dir().join(dir).join(name)).unwrap()
}

/// The expert matrices (of all layers) `pinch run` repacks in their slots on this CPU:
/// those whose type has a repacked layout with a kernel here, one group of rows at least.
fn repackable_parts(bytes: &[u8]) -> usize {
    let g = Gguf::parse(bytes, bytes.len() as u64).unwrap();
    let cpu = host_cpu();
    g.tensors()
        .filter(|t| residency::is_expert_stack(t))
        .filter(|t| {
            Layout::preferred(t.ty, &cpu).is_some_and(|l| {
                repack::has_fast_kernel(l, &cpu) && t.dims[1] as usize >= l.group_rows()
            })
        })
        .count()
}

/// The weight budget whose plan gives each MoE layer `slots` expert slots, or `None`
/// when all weights fit in less (slots are aligned reads, larger than an expert).
fn try_budget_for(bytes: &[u8], slots: usize) -> Option<(u64, ResidencyPlan)> {
    let g = Gguf::parse(bytes, bytes.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let all = residency::plan(&g, &cfg, None, None).unwrap();
    let p = residency::plan(&g, &cfg, Some(all.bytes() - 1), None).unwrap();
    assert!(p.experts.pages(), "the MoE plan was not chosen: {p:?}");
    let e = p.experts;
    let base = p.bytes() - e.slots as u64 * e.slot_bytes_sum;
    let budget = base + slots as u64 * e.slot_bytes_sum;
    if budget >= all.bytes() {
        return None;
    }
    let q = residency::plan(&g, &cfg, Some(budget), None).unwrap();
    assert_eq!(q.experts.slots, slots);
    assert!(q.bytes() <= budget);
    // One byte less holds one slot fewer (or, at 0 slots, no plan of this kind).
    if slots > 0 {
        let r = residency::plan(&g, &cfg, Some(budget - 1), None).unwrap();
        assert_eq!(r.experts.slots, slots - 1);
    }
    Some((budget, q))
}

fn budget_for(bytes: &[u8], slots: usize) -> (u64, ResidencyPlan) {
    try_budget_for(bytes, slots).unwrap_or_else(|| panic!("no paged plan with {slots} slots"))
}

/// Pool sizes below the expert count that some budget pages with: 0, 1 and the
/// largest (at least 2 on every tiny fixture).
fn pool_sizes(bytes: &[u8], n_expert: usize) -> Vec<usize> {
    let most = (0..n_expert)
        .rev()
        .find(|&s| try_budget_for(bytes, s).is_some())
        .unwrap();
    assert!(most >= 2, "only {most} slots can be paged");
    let mut v = vec![0, 1, most];
    v.dedup();
    v
}

/// What one run gives back.
struct Run {
    logits: Vec<Vec<f32>>,
    layers: Vec<(usize, usize, PagerStats)>,
    /// Arena bytes of the weights and the pools.
    weight_bytes: u64,
    trace: Option<Vec<u8>>,
    /// Expert matrices repacked in their slots.
    repacked: usize,
}

fn run(
    bytes: &[u8],
    toks: &[u32],
    batch: usize,
    budget: Option<u64>,
    setup: &dyn Fn(&mut ExpertPager),
) -> Run {
    run_on(false, false, bytes, toks, batch, budget, setup)
}

/// [`run`], `threaded`: on a platform with an I/O thread (the expert reads overlap the
/// compute); `repack`: resident weights repacked, expert slots of every type repacked
/// as they are read.
fn run_on(
    threaded: bool,
    repack: bool,
    bytes: &[u8],
    toks: &[u32],
    batch: usize,
    budget: Option<u64>,
    setup: &dyn Fn(&mut ExpertPager),
) -> Run {
    let s = spec(batch);
    let got = if threaded {
        with_session_threaded(bytes, s, budget, repack, |x, p, a| {
            run_in(x, p, a, toks, batch, setup)
        })
    } else {
        with_session_budget(bytes, s, budget, repack, |x, p, a| {
            run_in(x, p, a, toks, batch, setup)
        })
    };
    got.unwrap()
}

fn run_in<P: Platform>(
    sess: &mut Session,
    p: &P,
    acc: &[(&'static str, usize)],
    toks: &[u32],
    batch: usize,
    setup: &dyn Fn(&mut ExpertPager),
) -> Run {
    {
        let weight_bytes = acc
            .iter()
            .filter(|(a, _)| {
                ["weights", "load scratch", "expert pool", "embedding cache"].contains(a)
            })
            .map(|(_, n)| *n as u64)
            .sum();
        setup(sess.experts_mut().unwrap());
        let mut logits = vec![Vec::new(); toks.len()];
        for (c, chunk) in toks.chunks(batch).enumerate() {
            sess.eval(p, chunk, Logits::All, &mut |i, l| {
                logits[c * batch + i] = l.to_vec()
            })
            .unwrap();
        }
        let x = sess.experts().unwrap();
        Run {
            logits,
            layers: x.layers().map(|(il, s, _, st)| (il, s, st)).collect(),
            weight_bytes,
            trace: x.trace_bytes().map(|b| b.to_vec()),
            repacked: x.repacked_parts(),
        }
    }
}

fn assert_same_bits(name: &str, what: &str, want: &[Vec<f32>], got: &[Vec<f32>]) {
    for (t, (a, b)) in want.iter().zip(got).enumerate() {
        let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{name} {what}: logits differ at position {t}");
    }
}

fn moe_layers(bytes: &[u8]) -> usize {
    let g = Gguf::parse(bytes, bytes.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    (0..cfg.n_layer)
        .filter(|&il| residency::expert_layers(&g, cfg.n_layer).any(|(l, _, _)| l == il))
        .count()
}

#[test]
fn paged_experts_give_the_resident_logits_bit_for_bit() {
    for name in MODELS {
        let bytes = load(name);
        let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
        let cfg = Config::from_gguf(&g).unwrap();
        let ne = cfg.moe.unwrap().n_expert;
        let toks = tokens(20, cfg.n_vocab);
        let want = run(&bytes, &toks, 1, None, &|_| {});
        assert!(want.layers.is_empty(), "{name}: paged without a budget");
        // All resident with the stacks repacked at load: the plain bits too.
        let packed = run_on(false, true, &bytes, &toks, 1, None, &|_| {});
        assert_same_bits(name, "resident, repacked", &want.logits, &packed.logits);
        for slots in pool_sizes(&bytes, ne) {
            let (budget, plan) = budget_for(&bytes, slots);
            // Batches up to 16 tokens may compute experts out of order (with an I/O
            // thread: as their reads come in); the batch of 20 computes them in order.
            for (batch, policy, prefetch, threaded, repack) in [
                (1, Policy::LFU, false, false, false),
                (4, Policy::LFU, false, false, false),
                (1, Policy::Lru, false, false, false),
                (1, Policy::LFU, true, false, false),
                (5, Policy::Lru, true, false, false),
                (20, Policy::LFU, true, false, false),
                (1, Policy::LFU, false, true, false),
                (1, Policy::Lru, true, true, false),
                (5, Policy::LFU, true, true, false),
                (20, Policy::Lru, true, true, false),
                (1, Policy::LFU, false, false, true),
                (5, Policy::Lru, true, false, true),
                (1, Policy::LFU, true, true, true),
                (20, Policy::Lru, true, true, true),
            ] {
                let what = format!(
                    "{slots} slots, batch {batch}, {policy:?}, prefetch {prefetch}, I/O thread {threaded}, repacked {repack}"
                );
                let setup = |x: &mut ExpertPager| {
                    x.set_policy(policy);
                    x.prefetch = prefetch;
                };
                let got = run_on(threaded, repack, &bytes, &toks, batch, Some(budget), &setup);
                assert_same_bits(name, &what, &want.logits, &got.logits);
                let expect = if repack { repackable_parts(&bytes) } else { 0 };
                assert_eq!(
                    got.repacked, expect,
                    "{name} {what}: expert matrices repacked"
                );
                // Every MoE layer is paged, with a pool smaller than its experts.
                assert_eq!(got.layers.len(), moe_layers(&bytes), "{name} {what}");
                assert_eq!(got.layers.len(), plan.experts.layers);
                let mut t = PagerStats::default();
                for (_, s, st) in &got.layers {
                    assert_eq!(*s, slots);
                    t.add(st);
                }
                assert!(t.misses > 0 && t.reads > 0, "{name} {what}: {t:?}");
                if slots == 0 {
                    assert_eq!(t.hits, 0, "{name} {what}");
                }
                // Weights and pools in the arena stay under the budget the plan was
                // made for.
                assert!(
                    got.weight_bytes <= budget,
                    "{name} {what}: {} bytes of weights and pools over the budget {budget}",
                    got.weight_bytes
                );
                if prefetch && slots > 0 && batch == 1 && got.layers.len() > 1 {
                    assert!(t.prefetched > 0, "{name} {what}: nothing prefetched {t:?}");
                }
                if !prefetch {
                    assert_eq!(t.prefetched, 0);
                }
            }
        }
    }
}

#[test]
fn a_batch_reads_each_expert_once() {
    let bytes = load("tiny-qwen3moe-Q8_0.gguf");
    let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let toks = tokens(8, cfg.n_vocab);
    let (budget, _) = budget_for(&bytes, 0);
    // No slots: every pick is a read, so reads count what each batch asked for.
    let one = run(&bytes, &toks, 1, Some(budget), &|_| {});
    let all = run(&bytes, &toks, 8, Some(budget), &|_| {});
    for ((_, _, a), (_, _, b)) in one.layers.iter().zip(&all.layers) {
        // One token at a time: two picks per token; one batch: the union, at most
        // the layer's four experts.
        assert_eq!(a.misses, 8 * 2);
        assert!(b.misses <= 4 && b.misses >= 2, "{b:?}");
        assert_eq!(b.reads, b.misses);
    }
}

#[test]
fn the_simulator_counts_what_the_pager_counted() {
    for name in MODELS {
        let bytes = load(name);
        let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
        let cfg = Config::from_gguf(&g).unwrap();
        let m = cfg.moe.unwrap();
        let toks = tokens(40, cfg.n_vocab);
        let record = |x: &mut ExpertPager| {
            let buf = Box::leak(vec![0u8; 1 << 16].into_boxed_slice());
            x.record_trace(buf, m.n_used).unwrap();
        };
        // At bias 0 routing does not depend on what is resident: the all-resident
        // run records the same trace.
        let resident = run(&bytes, &toks, 1, None, &record).trace.unwrap();
        for slots in pool_sizes(&bytes, m.n_expert) {
            let (budget, _) = budget_for(&bytes, slots);
            for policy in [Policy::LFU, Policy::Lru] {
                let got = run(&bytes, &toks, 1, Some(budget), &|x| {
                    x.set_policy(policy);
                    record(x);
                });
                let bytes = got.trace.unwrap();
                assert_eq!(bytes, resident, "{name}: the paged run routed differently");
                let trace = Trace::parse(&bytes).unwrap();
                assert_eq!(trace.tokens(), toks.len());
                let sim = simulate(&trace, slots, policy).unwrap();
                assert_eq!(sim.layers.len(), got.layers.len());
                for (s, (il, _, p)) in sim.layers.iter().zip(&got.layers) {
                    assert_eq!(
                        (s.hits, s.misses),
                        (p.hits, p.misses),
                        "{name} layer {il}, {slots} slots, {policy:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_budget_under_the_non_expert_weights_says_what_is_needed() {
    let bytes = load("tiny-qwen3moe-Q8_0.gguf");
    let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let (zero_slots, _) = budget_for(&bytes, 0);
    // Below the expert plan's least the dense streaming plan may still fit; below
    // both, the error names the least of them.
    let e = residency::plan(&g, &cfg, Some(1000), None).unwrap_err();
    assert!(e.min_bytes > 1000 && e.min_bytes <= zero_slots, "{e:?}");
}

/// Pre-gated prefetch on the two-MoE-layer fixture: the second layer's experts guessed
/// from the first layer's input are read ahead; what a batch then finds resident
/// because of it is counted, every prefetched expert is either used, evicted unused or
/// still waiting, and the logits are unchanged (checked above for every pool size).
#[test]
fn prefetch_reads_guesses_ahead_and_counts_them() {
    let bytes = load("tiny-qwen3moe-Q8_0.gguf");
    let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let toks = tokens(40, cfg.n_vocab);
    let (budget, _) = budget_for(&bytes, 2);
    let plain = run(&bytes, &toks, 1, Some(budget), &|x| {
        x.set_policy(Policy::Lru)
    });
    let ahead = run(&bytes, &toks, 1, Some(budget), &|x| {
        x.set_policy(Policy::Lru);
        x.prefetch = true;
    });
    assert_same_bits("qwen3moe", "prefetch", &plain.logits, &ahead.logits);
    // Layer 0 has no layer before it: nothing is prefetched there.
    let (l0, l1) = (ahead.layers[0].2, ahead.layers[1].2);
    assert_eq!(l0.prefetched, 0);
    assert!(l1.prefetched > 0 && l1.read_ahead > 0, "{l1:?}");
    assert!(
        l1.read_ahead + l1.prefetch_wasted <= l1.prefetched,
        "{l1:?}"
    );
    // Reads: admitted misses and transient reads, plus every prefetch.
    assert!(l1.reads >= l1.prefetched);
    // Picks the same: every access is a hit or a miss either way.
    let p1 = plain.layers[1].2;
    assert_eq!(p1.hits + p1.misses, l1.hits + l1.misses);
}

/// Storage failing under the pager: with no expert slot resident every routed expert is
/// read, and when reads of the expert tensors fail the evaluation stops with an error
/// naming the layer, the expert and the file offset (never a panic, no logits handed out).
#[test]
fn a_failing_expert_read_is_an_error_naming_layer_expert_and_offset() {
    for name in MODELS {
        let bytes = load(name);
        let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
        let cfg = Config::from_gguf(&g).unwrap();
        let (budget, _) = budget_for(&bytes, 0);
        let toks = tokens(3, cfg.n_vocab);
        let experts: Vec<(u64, u64)> = g
            .tensors()
            .filter(|t| t.name.contains("_exps"))
            .map(|t| (t.offset, t.offset + t.bytes))
            .collect();
        assert!(!experts.is_empty(), "{name}: no expert tensors");
        let fail = |off: u64, len: usize| {
            let end = off + len as u64;
            experts.iter().any(|&(a, b)| off < b && a < end)
        };
        let mut handed_out = 0;
        let err = with_session_reads(&bytes, spec(1), Some(budget), Some(&fail), |sess, p, _| {
            sess.eval(p, &toks, Logits::All, &mut |_, _| handed_out += 1)
                .unwrap_err()
        })
        .unwrap();
        assert_eq!(handed_out, 0, "{name}: logits after a failed read");
        match err {
            ModelError::Pager(PagerError::Read {
                layer,
                expert,
                offset,
            }) => {
                assert!(layer < cfg.n_layer, "{name}: layer {layer}");
                assert!((expert as usize) < 64, "{name}: expert {expert}");
                assert!(
                    offset > 0 && offset < bytes.len() as u64,
                    "{name}: {offset}"
                );
                let msg = err.to_string();
                assert!(
                    msg.contains(&layer.to_string()) && msg.contains(&offset.to_string()),
                    "{name}: {msg}"
                );
            }
            e => panic!("{name}: expected a pager read error, got {e:?}"),
        }
    }
}

/// `pinch run` in-process on an in-memory file system holding `name`: its exit code
/// and standard error.
fn pinch_run(name: &str, extra: &[&str]) -> (i32, String) {
    let fs = pinch_tests::memfs::MemFs::new();
    let path = format!("/m/{name}");
    fs.put(&path, load(name));
    let mut region = vec![0u64; (96 << 20) / 8];
    let region = pinch_kernels::blocks::bytes_of_mut(&mut region[..]);
    let mut argv = vec![
        "run", "-m", &path, "-p", "abc", "-n", "2", "--temp", "0", "-t", "1",
    ];
    argv.extend_from_slice(extra);
    let code = pinch_runtime_min::commands::main(&fs, &argv, region);
    (code, fs.take_output().1)
}

/// The number (digits and a point) after `key` in `text`.
fn number_after(text: &str, key: &str) -> f64 {
    let rest = text
        .split(key)
        .nth(1)
        .unwrap_or_else(|| panic!("`{key}` not in {text:?}"));
    let s: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    s.parse().unwrap()
}

/// The least `--budget` (to 4 KiB) whose plan gives a pool of `slots` experts.
fn cli_budget_for(name: &str, slots: usize) -> u64 {
    // Slots at budget `b`: none when no plan fits, all when nothing is paged.
    let pool = |b: u64| {
        let (code, err) = pinch_run(name, &["-n", "0", "-v", "--budget", &b.to_string()]);
        match (code, err.contains("experts paged")) {
            (0, true) => number_after(&err, "a pool of ") as usize,
            (0, false) => usize::MAX,
            _ => 0,
        }
    };
    let (mut lo, mut hi) = (1u64 << 20, 256u64 << 20);
    while hi - lo > 4096 {
        let mid = (lo + hi) / 2;
        if pool(mid) < slots {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    assert_eq!(pool(hi), slots, "{name}: no budget gives {slots} slots");
    hi
}

/// `--moe-bias` favours the experts in memory, so its cost is measured from pools as a
/// run has them (full), not empty: with a pool of top-k slots and a bias that outweighs
/// any router score, the biased pass keeps to the k experts the pool holds, every pick
/// a hit and no read. (Measured from empty pools, as it was, the first token's picks
/// were reads, and the pool size hardly mattered: the first token's experts won.)
#[test]
fn moe_bias_cost_is_measured_from_full_pools() {
    let name = "tiny-qwen3moe-Q8_0.gguf";
    let bytes = load(name);
    let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
    let m = Config::from_gguf(&g).unwrap().moe.unwrap();
    let budget = cli_budget_for(name, m.n_used).to_string();
    let (code, err) = pinch_run(name, &["--budget", &budget, "--moe-bias", "10"]);
    assert_eq!(code, 0, "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("moe cost of --moe-bias 10"))
        .unwrap_or_else(|| panic!("no cost line in {err}"));
    let biased_reads: f64 = line.rsplit(" -> ").next().unwrap().trim().parse().unwrap();
    assert_eq!(biased_reads, 0.0, "{line}");
    assert!(line.contains("% -> 100.0 %"), "{line}");
    // The exact pass from the same pools misses: the bias did change the routing.
    assert!(number_after(line, "expert reads ") > 0.0, "{line}");
}

/// The Q2_K fixture's six expert matrices are what `pinch run` repacks in their slots on
/// aarch64 (Q2Kx8, with and without dotprod), so the bit-for-bit test above runs the
/// repacked Q2_K kernels on paged experts there; x86 has no Q2_K layout.
#[test]
fn q2_k_experts_are_repacked_where_q2kx8_has_kernels() {
    let bytes = load(Q2_K_MOE);
    let want = if cfg!(target_arch = "aarch64") { 6 } else { 0 };
    assert_eq!(repackable_parts(&bytes), want);
    let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
    let stacks: Vec<_> = g
        .tensors()
        .filter(|t| residency::is_expert_stack(t))
        .collect();
    assert_eq!(stacks.len(), 6);
    assert!(stacks.iter().all(|t| t.ty == pinch_kernels::GgmlType::Q2_K));
}
