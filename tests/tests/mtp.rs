//! Qwen3.5's MTP block (`pinch_runtime_min::model::mtp`) against llama.cpp 0c1e570 and
//! as a draft source.
//!
//! `tests/data/tiny/mtp/` holds a small random qwen35 model with an MTP block and
//! llama.cpp's outputs for it (`tools/gen_mtp.py`): the trunk's logits, the block's
//! logits over the prompt (each token paired with the trunk's hidden state of the
//! position before, as llama.cpp's MTP driver does) and a greedy 4-token draft after
//! it. `cargo xtask randshape` runs the same comparison on random shapes
//! (`mtp_matches_llama_cpp_on_random_shapes`, ignored otherwise). Drafting from the
//! block must leave greedy output unchanged.
use std::path::Path;

use pinch_runtime_min::arena::Arena;
use pinch_runtime_min::generate::{self, Settings};
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::guard::MemoryGuard;
use pinch_runtime_min::model::mtp::{self, Mtp, MtpWeights};
use pinch_runtime_min::model::{Config, KvType, Loader, Logits, Math, Session, SessionOptions};
use pinch_runtime_min::platform::{MemPlatform, Platform};
use pinch_runtime_min::residency;
use pinch_runtime_min::sampler::{Sampler, SamplerParams};
use pinch_tests::*;

fn opts(math: Math, n_batch: usize, cpu: pinch_kernels::CpuFeatures) -> SessionOptions {
    SessionOptions {
        n_ctx: 256,
        n_batch,
        kv: KvType::F32,
        kv_v: KvType::F32,
        math,
        threads: 1,
        head_group: 8,
        attn_skip: false,
        swa_ring: false,
        state_f16: false,
        n_seq: 1,
        cpu,
    }
}

/// Load the block of the model `g` into `arena` and let `sess` draft from it.
fn attach<'a>(
    sess: &mut Session<'_, 'a>,
    plat: &MemPlatform<'_>,
    g: &Gguf<'_>,
    cfg: &Config,
    arena: &mut Arena<'a>,
) {
    let il = mtp::block_index(g, cfg).expect("the fixture has an MTP block");
    let mut loader = Loader {
        platform: plat,
        file: &(),
        gguf: g,
        arena,
    };
    let w = MtpWeights::load(&mut loader, cfg, il).unwrap();
    let m = Mtp::new(arena, w, cfg, il, &sess.opts).unwrap();
    sess.attach_mtp(m).unwrap();
}

/// What pinch computes where llama.cpp's outputs are: trunk logits, the block's logits
/// over the prompt, and the greedy draft after it (its tokens and logits).
struct Outputs {
    target: Vec<Vec<f32>>,
    mtp: Vec<Vec<f32>>,
    draft_tokens: Vec<u32>,
    draft: Vec<Vec<f32>>,
}

/// Run the fixture through a session with the block attached; `stream`: as little
/// resident as a plan that keeps the whole LM head allows (what `pinch run --budget`
/// plans when the block drafts): every layer streams.
fn run_planned(
    bytes: &[u8],
    tokens: &[u32],
    id_last: u32,
    n_draft: usize,
    math: Math,
    batch: usize,
    stream: bool,
) -> Outputs {
    let plat = MemPlatform {
        bytes,
        cpu: host_cpu(),
    };
    let g = Gguf::parse(bytes, bytes.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let mut region = vec![0u64; (bytes.len() * 2 + (64 << 20)) / 8];
    let region = pinch_kernels::blocks::bytes_of_mut(&mut region[..]);
    let mut arena = Arena::new(region);
    let plan = match stream {
        false => residency::plan(&g, &cfg, None, None).unwrap(),
        true => {
            let least = residency::plan_with(&g, &cfg, Some(1), None, true).unwrap_err();
            let p = residency::plan_with(&g, &cfg, Some(least.min_bytes), None, true).unwrap();
            assert_eq!(p.resident_layers, 0, "{p:?}");
            assert!(p.streams() && !p.head_streams(), "{p:?}");
            p
        }
    };
    let weights = Loader {
        platform: &plat,
        file: &(),
        gguf: &g,
        arena: &mut arena,
    }
    .load_planned(&cfg, None, &plan)
    .unwrap();
    let read = |off: u64, buf: &mut [u8], d: bool| plat.read_at(&(), off, buf, d);
    let mut sess = Session::new(cfg, &weights, &mut arena, opts(math, batch, plat.cpu())).unwrap();
    sess.set_reader(&read);
    attach(&mut sess, &plat, &g, &cfg, &mut arena);
    let (mut target, mut mtp_rows) = (vec![], vec![]);
    for chunk in tokens.chunks(batch) {
        sess.eval(&plat, chunk, Logits::All, &mut |_, l| {
            target.push(l.to_vec())
        })
        .unwrap();
        sess.mtp_pass_logits(&plat, &mut |_, l| mtp_rows.push(l.to_vec()))
            .unwrap();
    }
    let mut out = vec![0u32; n_draft];
    let mut draft = vec![];
    let n = sess
        .mtp_draft_logits(&plat, id_last, 0.0, &mut out, &mut |_, l| {
            draft.push(l.to_vec())
        })
        .unwrap();
    out.truncate(n);
    Outputs {
        target,
        mtp: mtp_rows,
        draft_tokens: out,
        draft,
    }
}

/// Largest |difference| between two sets of rows, and the rows whose argmax differs
/// where the reference's top-1 margin is at least `margin`.
fn compare(got: &[Vec<f32>], want: &[Vec<f32>], margin: f32) -> (f32, usize) {
    assert_eq!(got.len(), want.len(), "row count");
    let mut worst = 0f32;
    let mut top1 = 0;
    for (g, w) in got.iter().zip(want) {
        worst = worst.max(max_abs_diff(g, w));
        if argmax(g) != argmax(w) && top1_margin(w) >= margin {
            top1 += 1;
        }
    }
    (worst, top1)
}

/// Check one generated directory (`tools/gen_mtp.py`'s layout) for the model files it
/// lists; returns a report line per file and the failures.
fn check_dir(dir: &Path) -> (String, Vec<String>) {
    let meta = Meta::load(&dir.join("meta.txt"));
    let tokens = meta.u32s("tokens");
    let n_vocab: usize = meta.get("n_vocab").unwrap().parse().unwrap();
    let summary = meta.get("summary").unwrap_or("").to_string();
    let mut report = String::new();
    let mut bad = vec![];
    for q in meta.get("quants").unwrap_or("F32").split_whitespace() {
        let bytes = std::fs::read(dir.join(format!("{q}.gguf"))).unwrap();
        let key = |k: &str| match q {
            "F32" => k.to_string(),
            _ => format!("{q}.{k}"),
        };
        let id_last: u32 = meta.get(&key("id_last")).unwrap().parse().unwrap();
        let want_draft: Vec<u32> = meta
            .get(&key("draft_tokens"))
            .unwrap()
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        let rows = |f: &str| {
            let v = read_rows(&dir.join(format!("{q}.{f}.f32")), n_vocab);
            assert!(!v.is_empty(), "{}: {q}.{f}.f32 is empty", dir.display());
            v
        };
        let (target, mtp_want, draft_want) = (rows("target"), rows("mtp"), rows("draft"));
        // F32 weights: the f32 oracle, which llama.cpp's F32 computation matches to
        // rounding (1e-4, top-1 identical where llama.cpp's margin is 0.05 or more).
        // Quantized: the fast path (activations quantized like llama.cpp's), held as
        // tests/tests/random_shapes.rs holds it: within 1.5 x max(llama.cpp's own
        // quantized-vs-F32 distance, 0.05), no top-1 flip where the margin is 0.5.
        let f32_rows = |f: &str| read_rows(&dir.join(format!("F32.{f}.f32")), n_vocab);
        let bound = |f: &str, mine: &[Vec<f32>]| {
            let (d, _) = compare(mine, &f32_rows(f), f32::INFINITY);
            1.5 * d.max(0.05)
        };
        let (math, margin, tols) = match q {
            "F32" => (Math::Reference, 0.05, [1e-4; 3]),
            _ => (
                Math::Fast,
                0.5,
                [
                    bound("target", &target),
                    bound("mtp", &mtp_want),
                    bound("draft", &draft_want),
                ],
            ),
        };
        for batch in [tokens.len(), 1] {
            let got = run_planned(
                &bytes,
                &tokens,
                id_last,
                want_draft.len(),
                math,
                batch,
                false,
            );
            let (t_diff, t_top1) = compare(&got.target, &target, margin);
            let (m_diff, m_top1) = compare(&got.mtp, &mtp_want, margin);
            let (d_diff, d_top1) = compare(&got.draft, &draft_want, margin);
            let line = format!(
                "{} {q:5} batch {batch:2}: trunk {t_diff:.1e} mtp {m_diff:.1e} draft {d_diff:.1e} (tolerance {:.1e}) tokens {:?} (llama.cpp {:?})  [{summary}]\n",
                dir.display(),
                tols[1],
                got.draft_tokens,
                want_draft
            );
            report += &line;
            let tokens_ok = got.draft_tokens == want_draft
                || d_top1 == 0 && got.draft_tokens.len() == want_draft.len();
            let beyond = t_diff > tols[0] || m_diff > tols[1] || d_diff > tols[2];
            if beyond || t_top1 + m_top1 + d_top1 > 0 || !tokens_ok {
                bad.push(line);
            }
        }
    }
    (report, bad)
}

#[test]
fn mtp_block_matches_llama_cpp_on_the_fixture() {
    let (report, bad) = check_dir(&mtp_fixture());
    println!("{report}");
    assert!(
        bad.is_empty(),
        "MTP outputs differ from llama.cpp's:\n{}",
        bad.join("")
    );
}

#[test]
fn mtp_block_drafts_with_every_layer_streamed_and_the_head_resident() {
    let dir = mtp_fixture();
    let meta = Meta::load(&dir.join("meta.txt"));
    let bytes = std::fs::read(dir.join("F32.gguf")).unwrap();
    let tokens = meta.u32s("tokens");
    let id_last: u32 = meta.get("id_last").unwrap().parse().unwrap();
    for math in [Math::Reference, Math::Fast] {
        let resident = run_planned(&bytes, &tokens, id_last, 4, math, 8, false);
        let streamed = run_planned(&bytes, &tokens, id_last, 4, math, 8, true);
        assert_eq!(streamed.target, resident.target, "{math:?}: trunk logits");
        assert_eq!(streamed.mtp, resident.mtp, "{math:?}: MTP logits");
        assert_eq!(streamed.draft, resident.draft, "{math:?}: draft logits");
        assert_eq!(streamed.draft_tokens, resident.draft_tokens);
    }
}

/// The random shapes `cargo xtask randshape` generated with an MTP block
/// (`PINCH_MTP_DIR`, one directory per seed).
#[test]
#[ignore = "needs tools/gen_mtp.py's output (cargo xtask randshape)"]
fn mtp_matches_llama_cpp_on_random_shapes() {
    let root = std::env::var("PINCH_MTP_DIR").expect("PINCH_MTP_DIR");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|d| d.ok().map(|d| d.path()))
        .filter(|d| d.join("meta.txt").is_file())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no generated MTP models in {root}");
    let mut failures = vec![];
    for d in &dirs {
        let (report, bad) = check_dir(d);
        print!("{report}");
        failures.extend(bad);
    }
    assert!(
        failures.is_empty(),
        "MTP outputs differ from llama.cpp's:\n{}",
        failures.join("")
    );
}

/// Greedy generation through the command's driver with MTP drafts of `draft` tokens
/// (0: none); returns the tokens and the drafted / accepted counts.
fn greedy_with_mtp(
    bytes: &[u8],
    prompt: &[u32],
    n: usize,
    draft: usize,
) -> (Vec<u32>, usize, usize, usize) {
    with_tokenizer_session(
        bytes,
        None,
        |cpu| SessionOptions {
            head_group: draft + 1,
            ..opts(Math::Fast, 32, cpu)
        },
        |sess, tok, plat, arena| {
            let g = Gguf::parse(bytes, bytes.len() as u64).unwrap();
            let cfg = sess.cfg;
            let mut drafter = generate::drafter(draft, sess.opts.n_ctx, arena).unwrap();
            if let Some(d) = drafter.as_mut() {
                sess.keep_draft_point(arena).unwrap();
                attach(sess, plat, &g, &cfg, arena);
                d.mtp_p_min = Some(0.0);
            }
            let mut sampler = Sampler::new(SamplerParams {
                temp: 0.0,
                ..SamplerParams::default()
            });
            let mut guard = MemoryGuard::new(0);
            let settings = Settings {
                sampler: &mut sampler,
                guard: &mut guard,
                adjust: None,
                max_new: n,
                ignore_eos: true,
                feed_last: true,
                draft: drafter.as_mut(),
                grammar: None,
            };
            let (tokens, st) = generate_tokens(plat, tok, sess, settings, prompt);
            (tokens, st.drafted, st.accepted, st.passes)
        },
    )
}

/// `bytes` (an F32 model) made a bigram model whose MTP block knows it: every layer's
/// mixer output and FFN down matrices are zero, so the trunk's logits at a position
/// depend on its token alone (`head(output_norm(embed(x)))`); the block passes
/// `enorm(embed(x))` through eh_proj (attention and FFN adding nothing) into the same
/// norm and head, so its guess for the token after `x` is the trunk's. Its drafts are
/// then accepted (up to rounding), which exercises the accepting path.
fn bigram_with_oracle_block(bytes: &[u8]) -> Vec<u8> {
    let g = Gguf::parse(bytes, bytes.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let (il, e) = (cfg.n_layer, cfg.n_embd);
    let f32s = |name: &str| {
        let t = g.tensor(name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!(t.ty, pinch_kernels::GgmlType::F32, "{name}");
        (t.offset as usize, t.elements() as usize)
    };
    let read = |name: &str| -> Vec<f32> {
        let (o, n) = f32s(name);
        bytes[o..o + 4 * n]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    let out_norm = read("output_norm.weight");
    let mut b = bytes.to_vec();
    let mut write = |name: &str, v: &dyn Fn(usize) -> f32| {
        let (o, n) = f32s(name);
        for i in 0..n {
            b[o + 4 * i..o + 4 * i + 4].copy_from_slice(&v(i).to_le_bytes());
        }
    };
    for l in 0..=il {
        for m in ["attn_output.weight", "ssm_out.weight", "ffn_down.weight"] {
            if g.tensor(&format!("blk.{l}.{m}")).is_some() {
                write(&format!("blk.{l}.{m}"), &|_| 0.0);
            }
        }
    }
    let blk = |s: &str| format!("blk.{il}.{s}");
    // eh_proj: e rows of 2e; row r takes column r (the enorm half).
    write(&blk("nextn.eh_proj.weight"), &|i| {
        (i % (2 * e) == i / (2 * e)) as u8 as f32
    });
    write(&blk("nextn.enorm.weight"), &|_| 1.0);
    if g.tensor(&blk("nextn.shared_head_norm.weight")).is_some() {
        write(&blk("nextn.shared_head_norm.weight"), &|i| out_norm[i]);
    }
    b
}

#[test]
fn mtp_drafts_leave_greedy_output_unchanged() {
    let dir = mtp_fixture();
    let bytes = std::fs::read(dir.join("F32.gguf")).unwrap();
    let meta = Meta::load(&dir.join("meta.txt"));
    let prompt = meta.u32s("tokens");
    let n = 40;
    let (plain, drafted0, _, passes0) = greedy_with_mtp(&bytes, &prompt, n, 0);
    assert_eq!(drafted0, 0);
    let bigram = bigram_with_oracle_block(&bytes);
    let (plain_bigram, _, _, _) = greedy_with_mtp(&bigram, &prompt, n, 0);
    for draft in [1, 3, 6] {
        for (model, want, name) in [
            (&bytes, &plain, "random"),
            (&bigram, &plain_bigram, "bigram"),
        ] {
            let (got, drafted, accepted, passes) = greedy_with_mtp(model, &prompt, n, draft);
            println!("{name} --draft {draft}: {drafted} drafted, {accepted} accepted, {passes} passes (plain {passes0})");
            assert_eq!(
                &got, want,
                "{name} --draft {draft}: tokens differ from plain greedy"
            );
            assert!(
                drafted > 0,
                "{name} --draft {draft}: the MTP block drafted nothing"
            );
            assert_eq!(
                passes + accepted,
                passes0,
                "{name}: one pass per token not drafted"
            );
            if name == "bigram" {
                // The block guesses the trunk's own next token: most drafts are kept.
                assert!(
                    2 * accepted > drafted,
                    "{name} --draft {draft}: {accepted} of {drafted} accepted"
                );
            }
        }
    }
}

/// The committed fixture (`PINCH_MTP_FIXTURE` overrides it, for trying another).
fn mtp_fixture() -> std::path::PathBuf {
    std::env::var_os("PINCH_MTP_FIXTURE")
        .map(Into::into)
        .unwrap_or_else(|| data_dir().join("tiny/mtp"))
}
