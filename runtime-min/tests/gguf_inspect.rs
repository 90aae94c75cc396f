//! `inspect` on fixtures: the expected numbers are summed here from the tensor list with
//! explicit name lists, not with `inspect`'s own grouping.
mod gguf_util;

use gguf_util::*;
use pinch_kernels::CpuFeatures;
use pinch_runtime_min::gguf::{Gguf, GgufWriter, Value};
use pinch_runtime_min::inspect::inspect;

fn run(g: &Gguf) -> String {
    let mut s = String::new();
    inspect(g, &CpuFeatures::default(), &mut s).unwrap();
    s
}

fn sum(g: &Gguf, pred: impl Fn(&str) -> bool) -> u64 {
    g.tensors().filter(|t| pred(t.name)).map(|t| t.bytes).sum()
}

#[test]
fn inspect_llama_lists_metadata_tensors_and_groups() {
    let f = llama_q4_0();
    let g = Gguf::parse(&f, f.len() as u64).unwrap();
    let out = run(&g);
    println!("{out}");
    for needle in [
        "architecture: llama",
        "name: \"tiny-llama-random\"",
        "context length: 256",
        "embedding length: 256",
        "block count: 2",
        "heads: 4",
        "kv heads: 2",
        "vocab size: 300",
        "file type: 2 (Q4_0)",
        "quantization version: 2",
        "tokenizer: llama",
    ] {
        assert!(out.contains(needle), "missing {needle:?}");
    }
    // Every tensor appears with its type and byte count.
    for t in g.tensors() {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{} ", t.name)))
            .unwrap();
        assert!(
            line.contains(t.ty.name()) && line.ends_with(&t.bytes.to_string()),
            "{line}"
        );
    }
    assert!(out.contains("[256, 300]"));

    let attn = |n: &str| {
        ["attn_q.", "attn_k.", "attn_v.", "attn_output."]
            .iter()
            .any(|p| n.contains(p))
    };
    let ffn = |n: &str| {
        ["ffn_gate.", "ffn_up.", "ffn_down."]
            .iter()
            .any(|p| n.contains(p))
    };
    let norm = |n: &str| n.ends_with("_norm.weight");
    let expect = [
        ("embedding", sum(&g, |n| n == "token_embd.weight")),
        ("output", sum(&g, |n| n == "output.weight")),
        ("attention", sum(&g, attn)),
        ("ffn", sum(&g, ffn)),
        ("norms", sum(&g, norm)),
    ];
    assert_eq!(expect[0].1, 43200); // gguf-py
    let total: u64 = expect.iter().map(|e| e.1).sum();
    assert_eq!(
        total,
        g.tensors().map(|t| t.bytes).sum::<u64>(),
        "the groups cover every tensor"
    );
    for (group, bytes) in expect {
        assert!(
            out.contains(&format!("  {group}: {bytes} bytes")),
            "{group} {bytes}"
        );
    }
    assert!(!out.contains("experts:") && !out.contains("other:"));
    assert!(out.contains(&format!("bytes by group (total {total})")));
}

#[test]
fn inspect_moe_counts_experts_separately() {
    let (name, len) = HEADERS[0];
    let h = data(name);
    let g = Gguf::parse(&h, len).unwrap();
    let out = run(&g);
    println!("{out}");
    assert!(out.contains("architecture: qwen3moe"));
    assert!(out.contains("experts: 4"));
    let experts = sum(&g, |n| n.ends_with("_exps.weight"));
    let ffn = sum(&g, |n| {
        n.contains(".ffn_") && !n.contains("_exps") && !n.contains("norm")
    });
    assert!(experts > 0 && ffn > 0);
    assert!(
        out.contains(&format!("  experts: {experts} bytes")),
        "{experts}"
    );
    assert!(out.contains(&format!("  ffn: {ffn} bytes")), "{ffn}");

    let (name, len) = HEADERS[1];
    let h = data(name);
    let g = Gguf::parse(&h, len).unwrap();
    let out = run(&g);
    let experts = sum(&g, |n| n.contains("_exps") || n.contains("_shexp"));
    assert!(g.tensors().any(|t| t.name.contains("_shexp")));
    assert!(
        out.contains(&format!("  experts: {experts} bytes")),
        "{out}"
    );
}

#[test]
fn inspect_describes_the_layer_kinds() {
    let (name, len) = HEADERS[0];
    let h = data(name);
    let g = Gguf::parse(&h, len).unwrap();
    let out = run(&g);
    assert!(
        out.contains("layers:\n  0-1: attention 4/2 heads x 64, rope on 64 dims; 4 experts x 128, top 2, softmax router, weights renormalised\n"),
        "{out}"
    );
    let (name, len) = HEADERS[1];
    let h = data(name);
    let g = Gguf::parse(&h, len).unwrap();
    let out = run(&g);
    assert!(
        out.contains("layers:\n  0: attention 4/2 heads x 64, rope on 32 dims; dense ffn 256\n  1: attention 4/2 heads x 64, rope on 32 dims; 4 experts x 128, top 2, sigmoid router, best 1 of 2 groups, weights renormalised x 2.5, shared expert 128\n"),
        "{out}"
    );
    // A file pinch cannot run says why instead of listing layers.
    let mut w = GgufWriter::new(VecSink::default(), 0, 1).unwrap();
    w.kv("general.architecture", Value::Str("gptneox")).unwrap();
    let f = w.finish().unwrap().0;
    let g = Gguf::parse(&f, f.len() as u64).unwrap();
    let out = run(&g);
    assert!(
        out.contains("layers: pinch cannot run this file: unsupported architecture"),
        "{out}"
    );
}

#[test]
fn inspect_reports_matrices_without_fast_kernel() {
    let f = llama_q4_0();
    let g = Gguf::parse(&f, f.len() as u64).unwrap();
    let feat = CpuFeatures::default();
    let mut out = String::new();
    inspect(&g, &feat, &mut out).unwrap();
    let section = out.split("without a fast kernel").nth(1).unwrap();
    let slow: Vec<_> = g
        .tensors()
        .filter(|t| t.n_dims >= 2 && !pinch_kernels::arch::has_fast_kernel(t.ty, &feat))
        .collect();
    if slow.is_empty() {
        assert!(section.contains("none"));
    } else {
        for t in &slow {
            let n = slow.iter().filter(|x| x.ty == t.ty).count();
            assert!(
                section.contains(&format!("{}: {n} tensors", t.ty.name())),
                "{section}"
            );
        }
    }
    // Norm vectors are never listed: they are not matrices.
    assert!(!section.contains("norm.weight"));
}

#[test]
fn inspect_fails_cleanly_on_a_full_writer() {
    struct Tiny(usize);
    impl core::fmt::Write for Tiny {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            self.0 = self.0.checked_sub(s.len()).ok_or(core::fmt::Error)?;
            Ok(())
        }
    }
    let f = llama_q4_0();
    let g = Gguf::parse(&f, f.len() as u64).unwrap();
    assert!(inspect(&g, &CpuFeatures::default(), &mut Tiny(100)).is_err());
}
