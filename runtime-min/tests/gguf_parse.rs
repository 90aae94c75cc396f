//! The reader on real files: values checked against what gguf-py (an independent reader)
//! reports for the same fixtures, the accessors' API, and the `NeedMore` retry protocol.
mod gguf_util;

use gguf_util::*;
use pinch_kernels::GgmlType;
use pinch_runtime_min::gguf::{Gguf, GgufError, Value, ValueType};

#[test]
fn reads_llama_fixture_metadata() {
    let f = llama_q4_0();
    let g = Gguf::parse(&f, f.len() as u64).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.kv_count(), 25);
    assert_eq!(g.tensor_count(), 21);
    assert_eq!(g.alignment, 32);
    assert_eq!(g.data_offset, 8768);
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(g.get_str("general.name"), Some("tiny-llama-random"));
    assert_eq!(g.get_u32("llama.context_length"), Some(256));
    assert_eq!(g.arch_u32("context_length"), Some(256));
    assert_eq!(g.arch_u32("attention.head_count_kv"), Some(2));
    assert_eq!(g.get_u64("llama.block_count"), Some(2));
    assert_eq!(g.get_f32("llama.rope.freq_base"), Some(10000.0));
    assert_eq!(g.arch_f32("attention.layer_norm_rms_epsilon"), Some(1e-5));
    assert_eq!(g.get_bool("tokenizer.ggml.add_bos_token"), Some(true));
    assert_eq!(g.get_bool("tokenizer.ggml.add_eos_token"), Some(false));
    assert_eq!(g.get_u32("general.file_type"), Some(2));
    // Wrong-type lookups are None, not a panic or a coercion.
    assert_eq!(g.get_str("llama.context_length"), None);
    assert_eq!(g.get_u32("general.name"), None);
    assert_eq!(g.get("no.such.key"), None);
    let first: Vec<&str> = g.kv().map(|(k, _)| k).take(3).collect();
    assert_eq!(
        first,
        [
            "general.architecture",
            "general.name",
            "general.description"
        ]
    );
}

#[test]
fn lookups_agree_with_iteration_for_every_key() {
    let f = llama_q4_0();
    let g = Gguf::parse(&f, f.len() as u64).unwrap();
    let mut n = 0;
    for (k, v) in g.kv() {
        assert_eq!(g.get(k), Some(v), "{k}");
        n += 1;
    }
    assert_eq!(n, 25);
    // Keys after the 300-string vocabulary are found by stepping over it.
    assert_eq!(g.get_u32("general.quantization_version"), Some(2));
    assert_eq!(
        g.find_kv(|k| k.ends_with("_token_id") && k.contains("eos")),
        Some(Value::U32(2))
    );
}

#[test]
fn reads_tokenizer_arrays() {
    let f = llama_q4_0();
    let g = Gguf::parse(&f, f.len() as u64).unwrap();
    let tokens = g.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.elem, ValueType::Str);
    assert_eq!(tokens.len(), 300);
    assert_eq!(tokens.str_at(0), Some("<unk>"));
    assert_eq!(tokens.str_at(1), Some("<s>"));
    assert_eq!(tokens.str_at(3), Some("<0x00>"));
    assert_eq!(tokens.str_at(258), Some("<0xFF>"));
    assert_eq!(tokens.str_at(259), Some("\u{2581}"));
    assert_eq!(tokens.str_at(300), None);
    assert_eq!(tokens.iter_str().count(), 300);
    assert_eq!(tokens.iter_str().nth(260), Some("e")); // gguf-py: pieces in frequency order
    assert_eq!(tokens.f32_at(0), None);

    let types = g.get_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(types.elem, ValueType::I32);
    assert_eq!(types.i32_at(0), Some(2));
    assert_eq!(types.i32_at(1), Some(3));
    assert_eq!(types.i32_at(3), Some(6));
    assert_eq!(types.u32_at(3), Some(6));
    assert_eq!(types.i32_at(300), None);
    assert_eq!(types.iter_str().count(), 0);

    let scores = g.get_array("tokenizer.ggml.scores").unwrap();
    assert_eq!(scores.len(), 300);
    assert_eq!(scores.f32_at(0), Some(0.0));
    assert!(scores.iter().all(|v| matches!(v, Value::F32(_))));
}

#[test]
fn reads_llama_fixture_tensors() {
    let f = llama_q4_0();
    let g = Gguf::parse(&f, f.len() as u64).unwrap();
    let out = g.tensor("output.weight").unwrap();
    assert_eq!(out.ty, GgmlType::Q6_K);
    assert_eq!(out.n_dims, 2);
    assert_eq!(out.dims, [256, 300, 1, 1]);
    assert_eq!(out.shape(), &[256, 300]);
    assert_eq!(out.offset, 8768);
    assert_eq!(out.bytes, 63000);
    let e = g.tensor("token_embd.weight").unwrap();
    assert_eq!((e.ty, e.offset, e.bytes), (GgmlType::Q4_0, 72800, 43200));
    let n = g.tensor("blk.1.ffn_norm.weight").unwrap();
    assert_eq!(
        (n.ty, n.n_dims, n.dims, n.offset, n.bytes),
        (GgmlType::F32, 1, [256, 1, 1, 1], 524576, 1024)
    );
    let last = g.tensors().last().unwrap();
    assert_eq!(last.name, "blk.1.ffn_up.weight");
    assert_eq!(last.offset + last.bytes, f.len() as u64);
    assert!(g.tensor("blk.2.ffn_up.weight").is_none());
    assert_eq!(g.tensors().count(), 21);
    assert_eq!(
        g.tensors().filter(|t| t.ty == GgmlType::Q4_0).count(),
        15,
        "README: Q4_0x15, F32x5, Q6_Kx1"
    );
}

#[test]
fn header_prefix_is_enough() {
    let f = llama_q4_0();
    let g = Gguf::parse(&f[..8768], f.len() as u64).unwrap();
    assert_eq!(g.tensor_count(), 21);
    for (name, len) in HEADERS {
        let h = data(name);
        let g = Gguf::parse(&h, len).unwrap();
        assert_eq!(g.data_offset, h.len() as u64, "{name}");
        let last = g.tensors().max_by_key(|t| t.offset).unwrap();
        assert!(last.offset + last.bytes <= len);
    }
}

#[test]
fn need_more_converges_with_doubling_reads() {
    let f = llama_q4_0();
    let mut have = 16usize;
    let mut rounds = 0;
    let mut last_need = 0;
    let g = loop {
        rounds += 1;
        assert!(rounds < 32, "no convergence");
        match Gguf::parse(&f[..have], f.len() as u64) {
            Ok(g) => break g,
            Err(GgufError::NeedMore { need }) => {
                assert!(
                    need > have as u64,
                    "need {need} must exceed the {have} bytes given"
                );
                assert!(need >= last_need, "need must grow");
                assert!(need <= f.len() as u64);
                last_need = need;
                have = (need as usize).max(have * 2).min(f.len());
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(g.data_offset, 8768);
    assert!(have >= 8768);
}

#[test]
fn every_short_prefix_asks_for_more() {
    let f = llama_q4_0();
    for have in 0..8768 {
        match Gguf::parse(&f[..have], f.len() as u64) {
            Err(GgufError::NeedMore { need }) => {
                assert!(
                    need > have as u64 && need <= 8768,
                    "have {have} need {need}"
                )
            }
            other => panic!("prefix {have}: {other:?}"),
        }
    }
}

#[test]
fn nested_array_reads_back() {
    // [[1, 2], [], [3]] of u32, written by hand.
    let mut r = Raw::header(3, 0, 1);
    r.str("x.nested").u32(9).u32(9).u64(3);
    r.u32(4).u64(2).u32(1).u32(2);
    r.u32(4).u64(0);
    r.u32(4).u64(1).u32(3);
    let g = Gguf::parse(&r.0, r.len()).unwrap();
    let a = g.get_array("x.nested").unwrap();
    assert_eq!(a.elem, ValueType::Array);
    let inner: Vec<Vec<u32>> = a
        .iter()
        .map(|v| {
            let v = v.as_array().unwrap();
            (0..v.len()).map(|i| v.u32_at(i).unwrap()).collect()
        })
        .collect();
    assert_eq!(inner, vec![vec![1, 2], vec![], vec![3]]);
    assert_eq!(a.at(2).and_then(|v| v.as_array()).map(|v| v.len()), Some(1));
}

#[test]
fn version_2_is_read() {
    let mut r = Raw::header(2, 1, 1);
    r.kv_u32("a.b", 7).tensor("t", &[32], 8, 0).data(32, 34);
    let g = Gguf::parse(&r.0, r.len()).unwrap();
    assert_eq!(g.version, 2);
    assert_eq!(g.get_u32("a.b"), Some(7));
    assert_eq!(g.tensor("t").unwrap().bytes, 34);
}

#[test]
fn error_messages_name_the_problem() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("blk.0.attn_q.weight", &[256, 4], 2, 0)
        .data(32, 100);
    let e = Gguf::parse(&r.0, r.len()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("blk.0.attn_q.weight"), "{msg}");
    assert!(msg.contains(&r.len().to_string()), "{msg}");
    let e = Gguf::parse(b"GGML\x03\0\0\0", 100).unwrap_err();
    assert!(e.to_string().contains("not a GGUF file"));
}

#[test]
fn reads_per_layer_array_of_lfm2() {
    let (name, len) = HEADERS[2];
    let h = data(name);
    let g = Gguf::parse(&h, len).unwrap();
    assert_eq!(g.architecture(), Some("lfm2"));
    // fixtures README: `attention.head_count_kv` is a per-layer array [0, 2, 0].
    assert_eq!(g.arch_u32("attention.head_count_kv"), None);
    let kv = g
        .arch_get("attention.head_count_kv")
        .and_then(|v| v.as_array())
        .unwrap();
    let per_layer: Vec<u32> = (0..kv.len()).map(|i| kv.u32_at(i).unwrap()).collect();
    assert_eq!(per_layer, [0, 2, 0]);
    assert!(g.tensor("token_embd_norm.weight").is_some());
}

#[test]
fn big_endian_files_get_a_specific_message() {
    let e = Gguf::parse(b"GGUF\0\0\0\x03", 1000).unwrap_err();
    assert_eq!(e, GgufError::UnsupportedVersion { found: 0x0300_0000 });
    assert!(e.to_string().contains("big-endian"), "{e}");
}
