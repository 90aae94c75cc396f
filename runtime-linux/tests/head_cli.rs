//! `pinch head-select`, `--head` and `pinch recut` end to end: the head file's format
//! and guarantees, and a recut file giving the same logits as the original model run
//! with the same pruned head.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::head;
use pinch_runtime_min::model::{
    Config, KvType, Loader, Logits, Math, Session, SessionOptions, Weights,
};
use pinch_runtime_min::platform::MemPlatform;
use pinch_runtime_min::platform::Platform;
use pinch_runtime_min::tokenizer::Tokenizer;
use pinch_runtime_min::Arena;

fn pinch(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pinch"))
        .args(args)
        .output()
        .expect("run pinch")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn path(rel: &str) -> String {
    repo().join(rel).to_string_lossy().into_owned()
}

fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "pinch failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pinch-head-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// head-select on a tiny model: header, order, multiple of 16, forced tokens kept.
fn select(model: &str, rows: usize) -> (String, Vec<u32>) {
    let o = pinch(&[
        "head-select",
        "-m",
        model,
        "--corpus",
        &path("tests/data/corpus"),
        "--rows",
        &rows.to_string(),
    ]);
    ok(&o);
    let text = String::from_utf8(o.stdout).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let ids: Vec<u32> = lines.map(|l| l.parse().unwrap()).collect();
    assert!(
        header.starts_with("pinch-head v1 n_vocab="),
        "header {header:?}"
    );
    assert!(header.ends_with(&format!(" rows={}", ids.len())));
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(ids.len() % 16, 0);
    assert!(ids.len() >= rows);
    (text, ids)
}

#[test]
fn head_select_keeps_byte_and_control_tokens() {
    let model = path("tests/data/tiny/tiny-llama-Q4_K_M.gguf");
    let (_, ids) = select(&model, 40);
    let bytes = std::fs::read(&model).unwrap();
    let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
    let mut region = vec![0u64; 8 << 20];
    let mut arena = Arena::new(pinch_kernels::blocks::bytes_of_mut(&mut region[..]));
    let tok = Tokenizer::from_gguf(&g, &mut arena).unwrap();
    let forced: Vec<u32> = (0..tok.n_vocab())
        .filter(|&i| head::must_keep(&tok, i))
        .collect();
    assert!(!forced.is_empty());
    for f in forced {
        assert!(ids.binary_search(&f).is_ok(), "forced id {f} missing");
    }
}

#[test]
fn run_with_head_file_and_bad_head_file() {
    let model = path("tests/data/tiny/tiny-llama-Q4_K_M.gguf");
    let (text, _) = select(&model, 64);
    let h = tmp("tiny.ids");
    std::fs::write(&h, &text).unwrap();
    let o = pinch(&[
        "run",
        "-m",
        &model,
        "-p",
        "hello",
        "-n",
        "4",
        "--temp",
        "0",
        "--head",
        h.to_str().unwrap(),
    ]);
    ok(&o);
    let bad = tmp("bad.ids");
    std::fs::write(&bad, "pinch-head v1 n_vocab=7 rows=1\n3\n").unwrap();
    let o = pinch(&[
        "run",
        "-m",
        &model,
        "-p",
        "hi",
        "-n",
        "1",
        "--head",
        bad.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("vocabulary of 7"));
}

fn logits(bytes: &[u8], tokens: &[u32], prune_with: Option<&[u32]>) -> Vec<f32> {
    let g = Gguf::parse(bytes, bytes.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let mut region = vec![0u64; (bytes.len() * 2 + (64 << 20)) / 8];
    let mut arena = Arena::new(pinch_kernels::blocks::bytes_of_mut(&mut region[..]));
    let plat = MemPlatform {
        bytes,
        cpu: Default::default(),
    };
    let mut w: Weights = Loader {
        platform: &plat,
        file: &(),
        gguf: &g,
        arena: &mut arena,
    }
    .load(&cfg)
    .unwrap();
    if let Some(ids) = prune_with {
        assert!(w.head_ids.is_none());
        w.output = head::prune(&w.output, ids, &mut arena).unwrap();
        w.head_ids = Some(Box::leak(ids.to_vec().into_boxed_slice()));
    } else {
        assert!(w.head_ids.is_some(), "the recut file has no head ids");
    }
    let opts = SessionOptions {
        n_ctx: 32,
        n_batch: 3,
        kv: KvType::F32,
        kv_v: KvType::F32,
        math: Math::Fast,
        threads: 1,
        head_group: 2,
        attn_skip: false,
        swa_ring: true,
        state_f16: false,
        n_seq: 1,
        cpu: plat.cpu,
    };
    let read = |off: u64, buf: &mut [u8], d: bool| plat.read_at(&(), off, buf, d);
    let mut s = Session::new(cfg, &w, &mut arena, opts).unwrap();
    s.set_reader(&read);
    let mut all = Vec::new();
    s.eval(&plat, tokens, Logits::All, &mut |_, l| {
        all.extend_from_slice(l)
    })
    .unwrap();
    all
}

fn recut_round_trip(model: &str, rows: usize) {
    // Files named after the model: the tests that call this run in parallel threads of
    // one process, which share `tmp`'s directory.
    let stem = Path::new(model).file_stem().unwrap().to_string_lossy();
    let (text, ids) = select(model, rows);
    let h = tmp(&format!("{stem}-{rows}.ids"));
    std::fs::write(&h, &text).unwrap();
    let o = pinch(&["recut", "-m", model, "--head", h.to_str().unwrap()]);
    ok(&o);
    let orig = std::fs::read(model).unwrap();
    let recut = o.stdout;
    let g = Gguf::parse(&recut, recut.len() as u64).unwrap();
    let out = g.tensor("output.weight").unwrap();
    assert_eq!(out.dims[1] as usize, ids.len());
    let stored: Vec<u32> = {
        let a = g.get_array(head::KEY_IDS).unwrap();
        (0..a.len()).map(|i| a.u32_at(i).unwrap()).collect()
    };
    assert_eq!(stored, ids);
    let tokens = [1, 4, 8, 15, 16, 23, 42];
    let a = logits(&orig, &tokens, Some(&ids));
    let b = logits(&recut, &tokens, None);
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.to_bits(), y.to_bits(), "{x} vs {y}");
    }
    assert!(a.iter().any(|v| v.is_finite()));
    // pinch loads the recut file directly.
    let o = pinch(&[
        "run",
        "-m",
        &tmp_write(&format!("{stem}-recut.gguf"), &recut),
        "-p",
        "hello",
        "-n",
        "3",
        "--temp",
        "0",
    ]);
    ok(&o);
}

fn tmp_write(name: &str, bytes: &[u8]) -> String {
    let p = tmp(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn recut_untied_model_gives_same_logits_as_pruned_head() {
    recut_round_trip(&path("tests/data/tiny/tiny-llama-Q4_K_M.gguf"), 48);
}

#[test]
fn recut_tied_model_gets_explicit_output() {
    let model = path("tests/data/tiny/tiny-gemma3-Q8_0.gguf");
    let bytes = std::fs::read(&model).unwrap();
    let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
    assert!(g.tensor("output.weight").is_none(), "fixture is not tied");
    recut_round_trip(&model, 48);
}

/// ppl with a pruned head: bits per byte stay finite and the share of the full
/// tokenization outside the head is reported.
#[test]
fn ppl_with_pruned_head_is_finite_and_reports_outside_tokens() {
    let model = path("tests/data/tiny/tiny-llama-Q4_K_M.gguf");
    let text = tmp_write(
        "ppl.txt",
        "The quick brown fox jumps over the lazy dog. Zebras quietly vex jumping wizards.\n"
            .repeat(4)
            .as_bytes(),
    );
    let (ids, _) = select(&model, 16);
    let h = tmp_write("ppl.ids", ids.as_bytes());
    let o = pinch(&[
        "ppl", "-m", &model, "-f", &text, "-c", "32", "--json", "--head", &h,
    ]);
    ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("outside the head"), "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().rev().find(|l| l.starts_with('{')).unwrap();
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    let bpb = v["bpb"].as_f64().unwrap();
    assert!(bpb.is_finite() && bpb > 0.0, "bpb {bpb}");
}

/// `-o FILE` writes exactly what stdout would get (head-select and recut); `-o -` is
/// stdout; an unwritable path is an error naming it.
#[test]
fn output_flag_writes_the_same_bytes_as_stdout() {
    let model = path("tests/data/tiny/tiny-gemma3-Q8_0.gguf");
    let (text, _) = select(&model, 32);
    let ids_file = tmp("o.ids");
    let base = [
        "head-select",
        "-m",
        &model,
        "--corpus",
        &path("tests/data/corpus"),
        "--rows",
        "32",
    ];
    let o = pinch(&[&base[..], &["-o", ids_file.to_str().unwrap()]].concat());
    ok(&o);
    assert!(o.stdout.is_empty());
    assert_eq!(std::fs::read_to_string(&ids_file).unwrap(), text);
    let o = pinch(&[&base[..], &["-o", "-"]].concat());
    ok(&o);
    assert_eq!(String::from_utf8(o.stdout).unwrap(), text);

    let h = ids_file.to_str().unwrap();
    let o = pinch(&["recut", "-m", &model, "--head", h]);
    ok(&o);
    let streamed = o.stdout;
    let out = tmp("o.gguf");
    let o = pinch(&[
        "recut",
        "-m",
        &model,
        "--head",
        h,
        "-o",
        out.to_str().unwrap(),
    ]);
    ok(&o);
    assert!(o.stdout.is_empty());
    assert!(
        std::fs::read(&out).unwrap() == streamed,
        "recut -o differs from stdout"
    );

    let o = pinch(&[
        "recut",
        "-m",
        &model,
        "--head",
        h,
        "-o",
        "/nonexistent-dir/x.gguf",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("/nonexistent-dir/x.gguf"), "{err}");
}

/// `--head-rows` chooses its rows at load in a scratch scope the plan counts: at the
/// smallest budget the plan accepts (found to 4 KiB), the run succeeds; below it the
/// plan (or the selection, before any weight is read) refuses. Before the plan counted
/// the selection, runs it accepted failed with "budget exhausted".
#[test]
fn head_rows_runs_at_the_smallest_budget_the_plan_accepts() {
    let model = path("tests/data/tiny/tiny-gemma3-Q8_0.gguf");
    let corpus = path("tests/data/corpus");
    let run = |kib: u64| {
        let budget = format!("{kib}K");
        pinch(&[
            "run",
            "-m",
            &model,
            "-p",
            "hello",
            "-n",
            "4",
            "-c",
            "256",
            "--head-rows",
            "64",
            "--corpus",
            &corpus,
            "--budget",
            &budget,
        ])
    };
    let accepted = |o: &Output| String::from_utf8_lossy(&o.stderr).contains("(fits)");
    let (mut lo, mut hi) = (8 << 10, 64 << 10); // KiB: refused, accepted
    assert!(!accepted(&run(lo)) && accepted(&run(hi)));
    while hi - lo > 4 {
        let mid = (lo + hi) / 2;
        if accepted(&run(mid)) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    for kib in [hi, hi + 4, hi + 64, hi + 1024] {
        let o = run(kib);
        assert!(
            o.status.success(),
            "--budget {kib}K: the plan accepted it but the run failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let below = run(hi - 4);
    assert!(!below.status.success(), "--budget {}K ran", hi - 4);
    let e = String::from_utf8_lossy(&below.stderr);
    assert!(
        e.contains("DOES NOT FIT")
            || e.contains("budget exhausted: 'tokenizer scratch'")
            || e.contains("budget exhausted: 'head rank'"),
        "{e}"
    );
}

/// The held-out English of the head measurements (`tests/data/eval`) is not in the
/// selection corpus nor in the topic lines that begin the model's own text: no 64-byte
/// window of it (every 16th) occurs in any corpus or topic file.
#[test]
fn held_out_english_is_not_in_the_selection_corpus() {
    let dir = repo().join("tests/data/corpus");
    let list = std::fs::read_to_string(dir.join("files.txt")).unwrap();
    let mut corpus: Vec<Vec<u8>> = list
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|n| std::fs::read(dir.join(n)).unwrap())
        .collect();
    assert!(corpus.len() >= 8);
    corpus.push(std::fs::read(repo().join("tests/data/topics/en.txt")).unwrap());
    let windows: std::collections::HashSet<&[u8]> =
        corpus.iter().flat_map(|c| c.windows(64)).collect();
    for name in [
        "wiki-excerpt.txt",
        "wiki-excerpt-2.txt",
        "wiki-excerpt-3.txt",
        "literary-excerpt.txt",
    ] {
        let text = std::fs::read(repo().join("tests/data/eval").join(name)).unwrap();
        let found = text
            .windows(64)
            .step_by(16)
            .filter(|w| windows.contains(w))
            .count();
        assert_eq!(found, 0, "{name}: {found} windows occur in the corpus");
    }
}

/// A corpus that cannot be read is named in the error, not the model (a directory
/// without files.txt used to give "MODEL: read failed at offset 0").
#[test]
fn unreadable_corpus_is_named_in_the_error() {
    let model = path("tests/data/tiny/tiny-llama-Q4_K_M.gguf");
    let dir = tmp("no-list-corpus");
    std::fs::create_dir_all(&dir).unwrap();
    let missing = tmp("missing-corpus.txt");
    for corpus in [dir.to_str().unwrap(), missing.to_str().unwrap()] {
        let o = pinch(&[
            "head-select",
            "-m",
            &model,
            "--corpus",
            corpus,
            "--rows",
            "64",
        ]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(corpus), "{err}");
        assert!(!err.contains("tiny-llama"), "{err}");
    }
}

/// `--generate`: the model's predictions over its own text change the ranking, the
/// `--save-soft` file holds them (header, one f32 a vocabulary id) and `--load-soft`
/// ranks the same head from it without generating; bad uses fail with named errors.
#[test]
fn generated_text_ranks_the_head_and_saved_counts_rank_it_again() {
    let model = path("tests/data/tiny/tiny-gemma3-Q8_0.gguf");
    let corpus = path("tests/data/corpus");
    let base = [
        "head-select",
        "-m",
        &model,
        "--corpus",
        &corpus,
        "--rows",
        "64",
    ];
    let plain = pinch(&base);
    ok(&plain);
    let soft = tmp("gen.soft");
    let soft = soft.to_str().unwrap();
    let gen = ["--generate", "40", "-n", "8", "-s", "5"];
    let o = pinch(&[&base[..], &gen[..], &["--save-soft", soft]].concat());
    ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("40 of 40 tokens"), "{err}");
    assert_ne!(
        o.stdout, plain.stdout,
        "the model's own text changed nothing"
    );
    let bytes = std::fs::read(soft).unwrap();
    let nl = bytes.iter().position(|&b| b == b'\n').unwrap();
    assert_eq!(&bytes[..nl], b"pinch-soft v1 n_vocab=300 positions=40");
    let counts: Vec<f32> = bytes[nl + 1..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(counts.len(), 300);
    // Every position adds one softmax: the counts sum to the positions.
    let sum: f32 = counts.iter().sum();
    assert!((sum - 40.0).abs() < 1e-2, "sum {sum}");

    let again = pinch(&[&base[..], &["--load-soft", soft]].concat());
    ok(&again);
    assert_eq!(again.stdout, o.stdout);

    // A truncated file, a file of another vocabulary and --save-soft without --generate.
    let short = tmp("short.soft");
    std::fs::write(&short, &bytes[..bytes.len() - 4]).unwrap();
    let other = tmp("other.soft");
    let mut b = b"pinch-soft v1 n_vocab=301 positions=40\n".to_vec();
    b.extend_from_slice(&bytes[nl + 1..]);
    b.extend_from_slice(&[0; 4]);
    std::fs::write(&other, b).unwrap();
    for bad in [&short, &other] {
        let o = pinch(&[&base[..], &["--load-soft", bad.to_str().unwrap()]].concat());
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("--load-soft"), "{err}");
    }
    let o = pinch(&[&base[..], &gen[..], &["--save-soft", soft, "--soft"]].concat());
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--save-soft"));
    // --generate-from: documents begun with another file's lines rank differently;
    // a missing file is named.
    let topics = tmp_write(
        "topics.txt",
        "fn main() { let x = 1; }\nimpl Drop for T {}\n".as_bytes(),
    );
    let o = pinch(&[&base[..], &gen[..], &["--generate-from", &topics]].concat());
    ok(&o);
    assert_ne!(o.stdout, again.stdout, "--generate-from changed nothing");
    let missing = tmp("no-topics.txt");
    let missing = missing.to_str().unwrap();
    let o = pinch(&[&base[..], &gen[..], &["--generate-from", missing]].concat());
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no-topics.txt"));
    let o = pinch(&[&base[..], &gen[..], &["--generate-weight", "-1"]].concat());
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--generate-weight"));
}

/// `--soft --save-soft`: the model's predictions over the corpus are kept (header
/// `over=corpus`, the corpus's token count) and `--load-soft` ranks the same head from
/// them without the model's time; loading them with `--soft` again or over another
/// corpus fails with a named error.
#[test]
fn corpus_predictions_are_saved_and_rank_the_same_head_again() {
    let model = path("tests/data/tiny/tiny-gemma3-Q8_0.gguf");
    let corpus = path("tests/data/corpus");
    let base = [
        "head-select",
        "-m",
        &model,
        "--corpus",
        &corpus,
        "--head-lang",
        "code",
        "--rows",
        "288",
    ];
    let soft = tmp("corpus.soft");
    let soft = soft.to_str().unwrap();
    let o = pinch(&[&base[..], &["--soft", "-c", "32", "--save-soft", soft]].concat());
    ok(&o);
    let bytes = std::fs::read(soft).unwrap();
    let nl = bytes.iter().position(|&b| b == b'\n').unwrap();
    let head = std::str::from_utf8(&bytes[..nl]).unwrap();
    assert!(
        head.starts_with("pinch-soft v1 n_vocab=300 positions="),
        "{head}"
    );
    assert!(head.ends_with(" over=corpus"), "{head}");
    let tokens: usize = head
        .split(' ')
        .find_map(|w| w.strip_prefix("positions="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(tokens > 1000, "{head}");
    // Every window (BOS and at most 31 tokens) adds one softmax a position: the
    // counts sum to the tokens plus one a window.
    let sum: f32 = bytes[nl + 1..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .sum();
    let least = (tokens + tokens.div_ceil(31)) as f32;
    assert!(
        sum >= least - 0.5 && sum <= tokens as f32 * 1.25,
        "sum {sum}, {tokens} tokens"
    );

    let again = pinch(&[&base[..], &["--load-soft", soft]].concat());
    ok(&again);
    assert_eq!(again.stdout, o.stdout);
    let plain = pinch(&base);
    ok(&plain);
    assert_ne!(plain.stdout, o.stdout, "the predictions changed nothing");

    // With the model's own text too: a run that computes both ranks as the two saved
    // files loaded together; two files of own text add up (the same file twice ranks
    // as once: twice the counts over twice the positions).
    let gen_soft = tmp("corpus-gen.soft");
    let gen_soft = gen_soft.to_str().unwrap();
    let gen = ["--generate", "40", "-n", "8", "-s", "5", "-c", "32"];
    let o = pinch(&[&base[..], &gen[..], &["--save-soft", gen_soft]].concat());
    ok(&o);
    let own_only = o.stdout;
    let both = pinch(&[&base[..], &gen[..], &["--soft", "-c", "32"]].concat());
    ok(&both);
    let list = format!("{soft},{gen_soft}");
    let loaded = pinch(&[&base[..], &["--load-soft", &list]].concat());
    ok(&loaded);
    assert_eq!(loaded.stdout, both.stdout);
    // A loaded corpus file does not stand for --generate: the model still writes.
    let o = pinch(&[&base[..], &gen[..], &["--load-soft", soft]].concat());
    ok(&o);
    assert_eq!(o.stdout, both.stdout);
    // The default weight of the model's own text: 1 with --soft, 4 without.
    let weighed = |files: &str, weight: &str| {
        let o = pinch(
            &[
                &base[..],
                &["--load-soft", files, "--generate-weight", weight],
            ]
            .concat(),
        );
        ok(&o);
        o.stdout
    };
    assert_eq!(weighed(&list, "1"), both.stdout);
    assert_eq!(weighed(gen_soft, "4"), own_only);
    assert_ne!(
        weighed(&list, "4"),
        both.stdout,
        "the weight changed nothing"
    );
    let twice = format!("{gen_soft},{gen_soft}");
    let loaded = pinch(&[&base[..], &["--load-soft", &twice]].concat());
    ok(&loaded);
    assert_eq!(loaded.stdout, own_only);

    for bad in [
        &["--load-soft", soft, "--soft"][..],
        &["--load-soft", &format!("{soft},{soft}")][..],
    ] {
        let o = pinch(&[&base[..], bad].concat());
        assert!(!o.status.success());
        assert!(String::from_utf8_lossy(&o.stderr).contains("--soft"));
    }
    let mut other = base;
    other[6] = "de";
    let o = pinch(&[&other[..], &["--load-soft", soft]].concat());
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("another corpus"));
}
