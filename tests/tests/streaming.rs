//! Weight streaming: logits under a budget that streams part of the weights must be
//! bit-identical to the all-resident run, and the bytes read must be what the plan says.
//! Both the reader-thread path and the read-before-use path are exercised.
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::model::{Config, KvType, Math};
use pinch_runtime_min::residency::{self, ResidencyPlan};
use pinch_tests::{
    data_dir, gemma_model, run_logits, run_logits_streamed, run_logits_threaded, scale_layers,
    RunSpec,
};

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

/// Bytes one pass of `m` positions (all wanting logits, head groups of 4) reads.
fn pass_bytes(g: &Gguf, plan: &ResidencyPlan, m: usize) -> u64 {
    let layers: u64 = (plan.resident_layers..plan.n_layer)
        .map(|il| residency::layer_span(g, il).unwrap().read_len(g.file_len))
        .sum();
    let head = plan.streamed_per_pass - layers;
    layers + m.div_ceil(4) as u64 * head
}

/// Run `bytes` all resident and at weight budgets a fraction `f` of the way from the
/// smallest plan to the all-resident need; every streamed run must give the same bits.
fn check_model(name: &str, bytes: &[u8], n_tok: usize, batch: usize, fractions: &[f64]) {
    let g = Gguf::parse(bytes, bytes.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let all = residency::plan(&g, &cfg, None, None).unwrap();
    assert!(!all.streams());
    let toks = tokens(n_tok, cfg.n_vocab);
    let (_, want) = run_logits(bytes, &toks, spec(batch)).unwrap();
    let min = residency::plan(&g, &cfg, Some(0), None)
        .unwrap_err()
        .min_bytes;
    assert!(min < all.bytes(), "{name}: streaming saves nothing");
    for &f in fractions {
        let budget = min + ((all.bytes() - min) as f64 * f) as u64;
        let plan = residency::plan(&g, &cfg, Some(budget), None).unwrap();
        assert!(plan.bytes() <= budget, "{name} at {f}: plan over budget");
        assert!(plan.streams(), "{name} at {f}: nothing streamed");
        for threaded in [false, true] {
            let run = if threaded {
                run_logits_threaded
            } else {
                run_logits_streamed
            };
            let (_, got, (p2, stats)) = run(bytes, &toks, spec(batch), Some(budget)).unwrap();
            assert_eq!(p2, plan);
            for (t, (a, b)) in want.iter().zip(&got).enumerate() {
                let same =
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{name} at {f} (threaded {threaded}): logits differ at position {t}"
                );
            }
            let expected: u64 = toks
                .chunks(batch)
                .map(|c| pass_bytes(&g, &plan, c.len()))
                .sum();
            assert_eq!(
                stats.bytes, expected,
                "{name} at {f}: bytes read differ from the plan"
            );
            assert_eq!(stats.passes as usize, n_tok.div_ceil(batch));
        }
    }
}

#[test]
fn tiny_models_streamed_give_the_resident_logits() {
    for name in [
        "tiny-llama-Q8_0.gguf",
        "tiny-llama-Q4_K_M.gguf",
        "tiny-gemma3-Q4_K_M.gguf",
        "tiny-qwen3-Q8_0.gguf",
    ] {
        let bytes = std::fs::read(data_dir().join("tiny").join(name)).unwrap();
        check_model(name, &bytes, 9, 4, &[0.0, 0.5, 0.9]);
    }
}

#[test]
fn a_scaled_up_model_several_times_the_budget_streams_exactly() {
    let src = std::fs::read(data_dir().join("tiny").join("tiny-llama-Q4_K_M.gguf")).unwrap();
    let big = scale_layers(&src, 24);
    let g = Gguf::parse(&big, big.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    assert_eq!(cfg.n_layer, 24);
    let all = residency::plan(&g, &cfg, None, None).unwrap();
    // A budget a quarter of the weights: most layers and the head are streamed.
    let budget = all.bytes() / 4;
    let plan = residency::plan(&g, &cfg, Some(budget), None).unwrap();
    assert!(plan.streamed_layers() > 12, "{plan:?}");
    check_model("scaled tiny-llama x24", &big, 6, 3, &[0.0, 0.3]);
}

/// The planner's choices over a sweep of budgets from all-resident down to nothing.
fn sweep(g: &Gguf, cfg: &Config) -> (bool, ResidencyPlan) {
    let all = residency::plan(g, cfg, None, None).unwrap();
    assert_eq!(all.resident_layers, cfg.n_layer);
    assert_eq!(all.head_resident_rows, all.head_rows);
    assert_eq!(all.streamed_per_pass, 0);
    assert_eq!(residency::plan(g, cfg, Some(all.bytes()), None), Ok(all));
    let mut last_streamed = 0;
    let mut saw_partial_head = false;
    let step = all.bytes() / 400;
    let mut budget = all.bytes() - 1;
    let mut min_ok = u64::MAX;
    while budget > step {
        match residency::plan(g, cfg, Some(budget), None) {
            Ok(p) => {
                assert!(p.bytes() <= budget);
                // Less memory never reads less.
                assert!(p.streamed_per_pass >= last_streamed);
                last_streamed = p.streamed_per_pass;
                // Layers are kept first; head rows only once every layer is resident.
                if p.head_resident_rows > 0 {
                    assert_eq!(p.resident_layers, p.n_layer);
                }
                if p.head_resident_rows > 0 && p.head_resident_rows < p.head_rows {
                    saw_partial_head = true;
                    assert_eq!(p.head_resident_rows % 16, 0);
                }
                // Streamed bytes are the aligned spans of what is not resident.
                let layers: u64 = (p.resident_layers..p.n_layer)
                    .map(|il| residency::layer_span(g, il).unwrap().read_len(g.file_len))
                    .sum();
                let head_rows = (p.head_rows - p.head_resident_rows) as u64;
                assert!(p.streamed_per_pass >= layers + head_rows * p.head_row_bytes);
                assert!(
                    p.streamed_per_pass
                        <= layers
                            + head_rows * p.head_row_bytes
                            + 8192 * (p.head_chunks() as u64 + 1)
                );
                min_ok = min_ok.min(budget);
            }
            Err(e) => {
                // Below the smallest plan nothing fits, and the error says how much.
                assert!(e.min_bytes > budget);
                assert!(budget < min_ok);
                break;
            }
        }
        budget -= step;
    }
    (saw_partial_head, all)
}

#[test]
fn planner_decisions() {
    let bytes = std::fs::read(data_dir().join("tiny").join("tiny-llama-Q8_0.gguf")).unwrap();
    let big = scale_layers(&bytes, 12);
    let g = Gguf::parse(&big, big.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let (_, all) = sweep(&g, &cfg);
    // Untied model: the input embedding is never resident, only its row cache.
    assert!(all.embd_cache_bytes > 0 && all.embd_cache_bytes < 64 * 1024);
    // A head pruned at load is scattered in the file: it stays resident.
    let p = residency::plan(&g, &cfg, Some(all.bytes() / 2), Some(64)).unwrap();
    assert_eq!(p.head_resident_rows, 64);
    assert_eq!(p.head_chunks(), 0);

    // Gemma 3 270M's tied head is most of the model: between "everything" and "every
    // layer" the planner keeps part of the head, and a resident tied head serves the
    // input rows (no cache).
    let Some(path) = gemma_model() else {
        return;
    };
    let bytes = std::fs::read(path).unwrap();
    let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let (partial, all) = sweep(&g, &cfg);
    assert!(partial, "no budget kept part of Gemma's head");
    assert_eq!(all.embd_cache_bytes, 0);
}

/// Gemma 3 270M with a budget that holds about half its non-embedding weights: the
/// same logits as the resident run, and exactly the planned bytes read.
#[test]
fn gemma_half_the_layers_streamed_gives_the_resident_logits() {
    let Some(path) = gemma_model() else {
        return;
    };
    let bytes = std::fs::read(path).unwrap();
    let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let layers: u64 = (0..cfg.n_layer)
        .map(|il| residency::layer_span(&g, il).unwrap().len)
        .sum();
    let all = residency::plan(&g, &cfg, None, None).unwrap();
    // Vectors, the embedding cache and the zones, plus half the layers.
    let budget = all.vector_bytes + 600_000 + (10 << 20) + layers / 2;
    let plan = residency::plan(&g, &cfg, Some(budget), None).unwrap();
    assert!(
        (7..=11).contains(&plan.resident_layers),
        "about half the layers resident: {plan:?}"
    );
    assert_eq!(plan.head_resident_rows, 0);
    let toks: Vec<u32> = vec![2, 818, 5279, 529, 7001, 563, 236743, 236770];
    let (_, want) = run_logits(&bytes, &toks, spec(4)).unwrap();
    let (_, got, (_, stats)) = run_logits_threaded(&bytes, &toks, spec(4), Some(budget)).unwrap();
    for (t, (a, b)) in want.iter().zip(&got).enumerate() {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "logits differ at position {t}"
        );
    }
    let expected: u64 = toks.chunks(4).map(|c| pass_bytes(&g, &plan, c.len())).sum();
    assert_eq!(stats.bytes, expected);
}

/// A MoE model's streamed layers carry their experts: the 3-D expert tensors and the
/// router are part of the layer's span, and the logits stay bit-identical. (Layers are
/// streamed only under budgets below the expert pager's plan, which keeps every
/// non-expert weight resident: see tests/moe_pager.rs.)
#[test]
fn moe_layers_stream_with_their_experts() {
    let src = std::fs::read(data_dir().join("tiny").join("tiny-qwen3moe-Q4_K_M.gguf")).unwrap();
    let big = scale_layers(&src, 8);
    let g = Gguf::parse(&big, big.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let span = residency::layer_span(&g, 3).unwrap();
    let experts = g.tensor("blk.3.ffn_down_exps.weight").unwrap();
    assert!(
        span.offset <= experts.offset && experts.offset + experts.bytes <= span.offset + span.len
    );
    let all = residency::plan(&g, &cfg, None, None).unwrap();
    let plan = residency::plan(&g, &cfg, Some(all.bytes() / 2), None).unwrap();
    assert!(plan.experts.pages() && !plan.streams(), "{plan:?}");
    let min = residency::plan(&g, &cfg, Some(0), None)
        .unwrap_err()
        .min_bytes;
    let plan = residency::plan(&g, &cfg, Some(min), None).unwrap();
    assert!(plan.streamed_layers() >= 2, "{plan:?}");
    check_model("scaled tiny-qwen3moe x8", &big, 6, 3, &[0.0]);
}
