//! Bad MoE metadata and expert tensors are clear, typed errors naming the key or tensor
//! at fault, never a panic: the tiny MoE fixtures with one metadata value changed.
use pinch_runtime_min::gguf::{CountSink, Gguf, GgufWriter, Sink, SliceSink, Value};
use pinch_runtime_min::model::{KvType, Math, ModelError};
use pinch_tests::*;

/// `src` with the value of key `key` replaced by `value` (`None`: the key removed).
fn with_key(src: &[u8], key: &str, value: Option<Value>) -> Vec<u8> {
    let g = Gguf::parse(src, src.len() as u64).unwrap();
    let n_kv = g.keys().count() as u64 - value.is_none() as u64;
    fn write<S: Sink>(s: S, g: &Gguf, src: &[u8], key: &str, value: Option<Value>, n_kv: u64) -> S {
        let mut w = GgufWriter::new(s, g.tensor_count() as u64, n_kv)
            .ok()
            .unwrap();
        for (k, v) in g.kv() {
            match (k == key, value) {
                (false, _) => w.kv(k, v).ok().unwrap(),
                (true, Some(nv)) => w.kv(k, nv).ok().unwrap(),
                (true, None) => {}
            }
        }
        for t in g.tensors() {
            w.copy_tensor_info(&t).ok().unwrap();
        }
        for t in g.tensors() {
            let data = &src[t.offset as usize..(t.offset + t.bytes) as usize];
            w.tensor_data(data).ok().unwrap();
        }
        w.finish().ok().unwrap()
    }
    let n = write(CountSink { bytes: 0 }, &g, src, key, value, n_kv).bytes as usize;
    let mut buf = vec![0u8; n];
    let len = write(SliceSink::new(&mut buf), &g, src, key, value, n_kv)
        .written()
        .len();
    buf.truncate(len);
    buf
}

fn load(name: &str, key: &str, value: Option<Value>) -> Result<(), ModelError> {
    let src = std::fs::read(data_dir().join("tiny").join(name)).unwrap();
    let bytes = with_key(&src, key, value);
    let spec = RunSpec {
        math: Math::Reference,
        kv: KvType::F32,
        batch: 4,
        threads: 1,
        attn_skip: false,
    };
    run_logits(&bytes, &[5, 6, 7], spec).map(|_| ())
}

const QWEN: &str = "tiny-qwen3moe-Q8_0.gguf";
const LING: &str = "tiny-bailingmoe2-Q8_0.gguf";

#[test]
fn the_unchanged_copy_runs() {
    load(QWEN, "general.name", Some(Value::Str("copy"))).unwrap();
    load(LING, "general.name", Some(Value::Str("copy"))).unwrap();
}

#[test]
fn missing_expert_count_names_the_key() {
    let e = load(QWEN, "qwen3moe.expert_count", None).unwrap_err();
    assert_eq!(e, ModelError::MissingKey("expert_count"));
    let e = load(LING, "bailingmoe2.expert_gating_func", None).unwrap_err();
    assert_eq!(e, ModelError::MissingKey("expert_gating_func"));
}

#[test]
fn impossible_expert_counts_are_bad_shapes() {
    for (name, key, v) in [
        (QWEN, "qwen3moe.expert_used_count", 5),
        (QWEN, "qwen3moe.expert_used_count", 0),
        (QWEN, "qwen3moe.expert_count", 0),
        (LING, "bailingmoe2.expert_group_count", 3),
        (LING, "bailingmoe2.expert_group_used_count", 2),
        (LING, "bailingmoe2.expert_gating_func", 7),
    ] {
        match load(name, key, Some(Value::U32(v))) {
            Err(ModelError::BadShape(_)) => {}
            other => panic!("{key} = {v}: expected BadShape, got {other:?}"),
        }
    }
}

#[test]
fn expert_tensors_of_another_shape_name_the_tensor() {
    // The router has 4 rows, the metadata says 3 experts.
    match load(QWEN, "qwen3moe.expert_count", Some(Value::U32(3))) {
        Err(ModelError::TensorShape { name, .. }) => {
            assert_eq!(name.as_str(), "blk.0.ffn_gate_inp.weight")
        }
        other => panic!("expected TensorShape, got {other:?}"),
    }
    // The 3-D expert stacks are 128 wide, the metadata says 64.
    match load(
        QWEN,
        "qwen3moe.expert_feed_forward_length",
        Some(Value::U32(64)),
    ) {
        Err(ModelError::TensorShape {
            name,
            expected,
            found,
        }) => {
            assert_eq!(name.as_str(), "blk.0.ffn_gate_exps.weight");
            assert_eq!((expected, found), ([256, 64], [256, 128]));
        }
        other => panic!("expected TensorShape, got {other:?}"),
    }
}
