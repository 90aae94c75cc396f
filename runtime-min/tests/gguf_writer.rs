//! The writer: fixture round trips (byte for byte), files built from scratch with every
//! value type, model rewriting (drop a tensor, add a key), and the writer's refusals.
mod gguf_util;

use gguf_util::*;
use pinch_kernels::GgmlType;
use pinch_runtime_min::gguf::{
    CountSink, Gguf, GgufWriter, Sink, SliceSink, SliceSinkFull, Value, ValueType, WriteError,
};

/// Deep comparison of two parsed files: every key, value (arrays element by element,
/// nested included) and tensor, and the tensor data bytes.
fn assert_same(a: &Gguf, a_bytes: &[u8], b: &Gguf, b_bytes: &[u8]) {
    assert_eq!(a.kv_count(), b.kv_count());
    for ((ka, va), (kb, vb)) in a.kv().zip(b.kv()) {
        assert_eq!(ka, kb);
        assert_same_value(&va, &vb, ka);
    }
    assert_eq!(a.tensor_count(), b.tensor_count());
    for (ta, tb) in a.tensors().zip(b.tensors()) {
        assert_eq!(
            (ta.name, ta.ty, ta.n_dims, ta.dims, ta.bytes),
            (tb.name, tb.ty, tb.n_dims, tb.dims, tb.bytes)
        );
        let da = &a_bytes[ta.offset as usize..(ta.offset + ta.bytes) as usize];
        let db = &b_bytes[tb.offset as usize..(tb.offset + tb.bytes) as usize];
        assert!(da == db, "data of {} differs", ta.name);
    }
}

fn assert_same_value(a: &Value, b: &Value, key: &str) {
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!((x.elem, x.len), (y.elem, y.len), "{key}");
            assert_eq!(x.iter().count() as u64, x.len, "{key}");
            for (ex, ey) in x.iter().zip(y.iter()) {
                assert_same_value(&ex, &ey, key);
            }
        }
        // Bitwise, so that NaN payloads also count.
        (Value::F32(x), Value::F32(y)) => assert_eq!(x.to_bits(), y.to_bits(), "{key}"),
        (Value::F64(x), Value::F64(y)) => assert_eq!(x.to_bits(), y.to_bits(), "{key}"),
        _ => assert_eq!(a, b, "{key}"),
    }
}

/// Rewrites `g` keeping the keys and tensors that pass the filters.
fn rewrite(
    g: &Gguf,
    file: &[u8],
    keep_key: impl Fn(&str) -> bool,
    keep_tensor: impl Fn(&str) -> bool,
    extra: &[(&str, Value)],
) -> Vec<u8> {
    let n_kv = g.kv().filter(|(k, _)| keep_key(k)).count() + extra.len();
    let n_t = g.tensors().filter(|t| keep_tensor(t.name)).count();
    let mut w = GgufWriter::new(VecSink::default(), n_t as u64, n_kv as u64).unwrap();
    w.copy_kvs(g, &keep_key).unwrap();
    for (k, v) in extra {
        w.kv(k, *v).unwrap();
    }
    for t in g.tensors().filter(|t| keep_tensor(t.name)) {
        w.copy_tensor_info(&t).unwrap();
    }
    for t in g.tensors().filter(|t| keep_tensor(t.name)) {
        // In two chunks, as a rewriter streaming from flash would.
        let d = &file[t.offset as usize..(t.offset + t.bytes) as usize];
        w.begin_tensor_data(t.bytes).unwrap();
        w.write_data(&d[..d.len() / 3]).unwrap();
        w.write_data(&d[d.len() / 3..]).unwrap();
    }
    w.finish().unwrap().0
}

#[test]
fn fixture_round_trips_byte_for_byte() {
    let f = llama_q4_0();
    let g = Gguf::parse(&f, f.len() as u64).unwrap();
    let out = rewrite(&g, &f, |_| true, |_| true, &[]);
    let g2 = Gguf::parse(&out, out.len() as u64).unwrap();
    assert_same(&g, &f, &g2, &out);
    // llama.cpp wrote the fixture; the same layout rules give the same bytes.
    assert_eq!(out.len(), f.len());
    assert!(
        out == f,
        "first difference at {:?}",
        out.iter().zip(&f).position(|(a, b)| a != b)
    );
}

#[test]
fn rewrite_can_drop_a_tensor_and_add_keys() {
    let f = llama_q4_0();
    let g = Gguf::parse(&f, f.len() as u64).unwrap();
    let out = rewrite(
        &g,
        &f,
        |k| k != "general.description",
        |n| n != "output.weight",
        &[
            ("pinch.recut", Value::Bool(true)),
            ("general.description", Value::Str("recut")),
        ],
    );
    let g2 = Gguf::parse(&out, out.len() as u64).unwrap();
    assert_eq!(g2.tensor_count(), 20);
    assert!(g2.tensor("output.weight").is_none());
    assert_eq!(g2.kv_count(), 26);
    assert_eq!(g2.get_bool("pinch.recut"), Some(true));
    assert_eq!(g2.get_str("general.description"), Some("recut"));
    assert_eq!(
        g2.get_array("tokenizer.ggml.tokens").unwrap().str_at(2),
        Some("</s>")
    );
    let e1 = g.tensor("token_embd.weight").unwrap();
    let e2 = g2.tensor("token_embd.weight").unwrap();
    assert_eq!(e2.offset % 32, 0);
    assert_eq!(
        &out[e2.offset as usize..][..e2.bytes as usize],
        &f[e1.offset as usize..][..e1.bytes as usize]
    );
    // Data is packed: dropping output.weight (63000 bytes, padded to 63008) shrank it.
    assert_eq!(g2.data_offset + g2.tensor_bytes_total(), out.len() as u64);
}

#[test]
fn header_only_fixtures_round_trip_their_metadata() {
    for (name, len) in HEADERS {
        let h = data(name);
        let g = Gguf::parse(&h, len).unwrap();
        let n = g.kv_count() as u64;
        let mut w = GgufWriter::new(VecSink::default(), 0, n).unwrap();
        assert_eq!(w.copy_kvs(&g, |_| true).unwrap(), n);
        let out = w.finish().unwrap().0;
        let g2 = Gguf::parse(&out, out.len() as u64).unwrap();
        assert_eq!(g2.kv_count(), g.kv_count());
        for ((ka, va), (kb, vb)) in g.kv().zip(g2.kv()) {
            assert_eq!(ka, kb);
            assert_same_value(&va, &vb, ka);
        }
        // Same bytes as the original's metadata section.
        let kv_end = g2.header_bytes().len();
        assert_eq!(&out[24..kv_end], &h[24..kv_end], "{name}");
    }
}

/// A file with every value type, nested and empty arrays, alignment 64 and odd tensors.
fn build_everything() -> Vec<u8> {
    let mut w = GgufWriter::new(VecSink::default(), 3, 20).unwrap();
    w.kv("general.alignment", Value::U32(64)).unwrap();
    w.kv("v.u8", Value::U8(200)).unwrap();
    w.kv("v.i8", Value::I8(-5)).unwrap();
    w.kv("v.u16", Value::U16(65535)).unwrap();
    w.kv("v.i16", Value::I16(-300)).unwrap();
    w.kv("v.u32", Value::U32(4_000_000_000)).unwrap();
    w.kv("v.i32", Value::I32(-7)).unwrap();
    w.kv("v.f32", Value::F32(1.5)).unwrap();
    w.kv("v.bool", Value::Bool(true)).unwrap();
    w.kv("v.str", Value::Str("héllo")).unwrap();
    w.kv("v.u64", Value::U64(u64::MAX)).unwrap();
    w.kv("v.i64", Value::I64(i64::MIN)).unwrap();
    w.kv("v.f64", Value::F64(-2.25)).unwrap();
    w.kv_str_array("a.str", &["", "a", "ß", "<0x0A>"]).unwrap();
    w.kv_f32_array("a.f32", &[0.5, -1.0]).unwrap();
    w.kv_i32_array("a.i32", &[]).unwrap();
    w.kv_u32_array("a.u32", &[3, 0, 3]).unwrap();
    // [[["x"], []], [[]]]: strings three levels down.
    w.begin_array("a.nested", ValueType::Array, 2).unwrap();
    w.begin_nested_array(ValueType::Array, 2).unwrap();
    w.begin_nested_array(ValueType::Str, 1).unwrap();
    w.elem(Value::Str("x")).unwrap();
    w.begin_nested_array(ValueType::Str, 0).unwrap();
    w.begin_nested_array(ValueType::Array, 1).unwrap();
    w.begin_nested_array(ValueType::U8, 0).unwrap();
    w.begin_array("a.empty_nested", ValueType::Array, 0)
        .unwrap();
    w.kv("general.architecture", Value::Str("test")).unwrap();
    assert_eq!(w.tensor_info("f32.vec", GgmlType::F32, &[3]).unwrap(), 0);
    assert_eq!(
        w.tensor_info("q4k", GgmlType::Q4_K, &[256, 2, 1, 1])
            .unwrap(),
        64
    );
    assert_eq!(
        w.tensor_info("q80.3d", GgmlType::Q8_0, &[32, 1, 3])
            .unwrap(),
        64 + 320
    );
    w.tensor_data(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
        .unwrap();
    w.tensor_data(&[0xab; 288]).unwrap();
    w.tensor_data(&[0xcd; 102]).unwrap();
    w.finish().unwrap().0
}

#[test]
fn writer_built_file_reads_back() {
    let f = build_everything();
    let g = Gguf::parse(&f, f.len() as u64).unwrap();
    assert_eq!(g.alignment, 64);
    assert_eq!(g.data_offset % 64, 0);
    assert_eq!(g.get("v.u8"), Some(Value::U8(200)));
    assert_eq!(g.get("v.i8"), Some(Value::I8(-5)));
    assert_eq!(g.get("v.u16"), Some(Value::U16(65535)));
    assert_eq!(g.get("v.i16"), Some(Value::I16(-300)));
    assert_eq!(g.get("v.u32"), Some(Value::U32(4_000_000_000)));
    assert_eq!(g.get("v.i32"), Some(Value::I32(-7)));
    assert_eq!(g.get("v.f32"), Some(Value::F32(1.5)));
    assert_eq!(g.get("v.bool"), Some(Value::Bool(true)));
    assert_eq!(g.get_str("v.str"), Some("héllo"));
    assert_eq!(g.get_u64("v.u64"), Some(u64::MAX));
    assert_eq!(g.get_u32("v.u64"), None);
    assert_eq!(g.get_i64("v.i64"), Some(i64::MIN));
    assert_eq!(g.get_f32("v.f64"), Some(-2.25));
    let s: Vec<&str> = g.get_array("a.str").unwrap().iter_str().collect();
    assert_eq!(s, ["", "a", "ß", "<0x0A>"]);
    let fa = g.get_array("a.f32").unwrap();
    assert_eq!(
        (fa.f32_at(0), fa.f32_at(1), fa.f32_at(2)),
        (Some(0.5), Some(-1.0), None)
    );
    assert!(g.get_array("a.i32").unwrap().is_empty());
    assert_eq!(g.get_array("a.u32").unwrap().u32_at(2), Some(3));
    let n = g.get_array("a.nested").unwrap();
    assert_eq!(n.len(), 2);
    let first = n.at(0).unwrap().as_array().unwrap();
    assert_eq!(first.elem, ValueType::Array);
    assert_eq!(
        first.at(0).unwrap().as_array().unwrap().str_at(0),
        Some("x")
    );
    assert!(first.at(1).unwrap().as_array().unwrap().is_empty());
    let second = n.at(1).unwrap().as_array().unwrap();
    assert_eq!(
        second.at(0).unwrap().as_array().unwrap().elem,
        ValueType::U8
    );
    assert_eq!(g.get_array("a.empty_nested").unwrap().len(), 0);
    assert_eq!(g.architecture(), Some("test"));

    let t: Vec<_> = g.tensors().collect();
    assert_eq!(t.len(), 3);
    assert_eq!((t[0].bytes, t[1].bytes, t[2].bytes), (12, 288, 102));
    assert_eq!(t[1].offset - g.data_offset, 64);
    assert_eq!(t[2].dims, [32, 1, 3, 1]);
    assert_eq!(
        &f[t[0].offset as usize..][..12],
        &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    );
    assert!(f[t[2].offset as usize..][..102].iter().all(|&b| b == 0xcd));
    assert_eq!(f.len() % 64, 0, "file padded to the alignment");

    // And again through the copying path.
    let n_kv = g.kv_count() as u64;
    let mut w = GgufWriter::new(VecSink::default(), 3, n_kv).unwrap();
    w.copy_kvs(&g, |_| true).unwrap();
    for t in g.tensors() {
        w.copy_tensor_info(&t).unwrap();
    }
    for t in g.tensors() {
        w.tensor_data(&f[t.offset as usize..][..t.bytes as usize])
            .unwrap();
    }
    let out = w.finish().unwrap().0;
    assert_eq!(out, f);
}

#[test]
fn count_and_slice_sinks_agree_with_vec() {
    let f = build_everything();
    let g = Gguf::parse(&f, f.len() as u64).unwrap();
    fn write_into<S: Sink>(g: &Gguf, sink: S) -> Result<S, WriteError<S::Error>> {
        let mut w = GgufWriter::new(sink, 0, g.kv_count() as u64)?;
        w.copy_kvs(g, |_| true)?;
        w.finish()
    }
    let n = write_into(&g, CountSink::default()).unwrap().bytes;
    let mut buf = vec![0u8; n as usize];
    let s = write_into(&g, SliceSink::new(&mut buf)).unwrap();
    assert_eq!(s.written().len() as u64, n);
    let mut small = vec![0u8; n as usize - 1];
    assert!(matches!(
        write_into(&g, SliceSink::new(&mut small)),
        Err(WriteError::Sink(SliceSinkFull { .. }))
    ));
}

#[test]
fn writer_refuses_broken_sequences() {
    let new = |t, k| GgufWriter::new(VecSink::default(), t, k).unwrap();
    let mut w = new(0, 1);
    w.kv("a", Value::U8(1)).unwrap();
    assert!(matches!(
        w.kv("b", Value::U8(1)),
        Err(WriteError::TooMany { .. })
    ));

    let mut w = new(1, 2);
    w.kv("a", Value::U8(1)).unwrap();
    assert!(matches!(
        w.tensor_info("t", GgmlType::F32, &[1]),
        Err(WriteError::TooFew {
            declared: 2,
            written: 1,
            ..
        })
    ));

    let mut w = new(1, 0);
    w.tensor_info("t", GgmlType::F32, &[1]).unwrap();
    assert!(matches!(
        w.kv("a", Value::U8(1)),
        Err(WriteError::OutOfOrder { .. })
    ));

    let mut w = new(0, 1);
    w.begin_array("a", ValueType::U32, 2).unwrap();
    assert!(matches!(
        w.elem(Value::I32(1)),
        Err(WriteError::ElementType {
            expected: ValueType::U32,
            found: ValueType::I32
        })
    ));
    w.elem(Value::U32(1)).unwrap();
    assert!(matches!(
        w.finish(),
        Err(WriteError::ArrayState { open: 1 })
    ));

    let mut w = new(0, 1);
    assert!(matches!(
        w.elem(Value::U32(1)),
        Err(WriteError::ArrayState { open: 0 })
    ));

    let mut w = new(0, 1);
    assert!(matches!(
        w.kv("general.alignment", Value::U32(48)),
        Err(WriteError::BadAlignment { found: 48 })
    ));

    let mut w = new(1, 0);
    assert!(matches!(
        w.tensor_info("t", GgmlType::Q4_0, &[33]),
        Err(WriteError::BadShape { .. })
    ));
    assert!(matches!(
        w.tensor_info("t", GgmlType::F32, &[1, 0]),
        Err(WriteError::BadShape { .. })
    ));
    assert!(matches!(
        w.tensor_info("t", GgmlType::F32, &[1, 1, 1, 1, 1]),
        Err(WriteError::BadShape { .. })
    ));

    let mut w = new(1, 0);
    w.tensor_info("t", GgmlType::F32, &[4]).unwrap();
    w.begin_tensor_data(16).unwrap();
    assert!(matches!(
        w.write_data(&[0; 17]),
        Err(WriteError::DataSize {
            expected: 16,
            written: 17
        })
    ));
    w.write_data(&[0; 8]).unwrap();
    assert!(matches!(w.finish(), Err(WriteError::TooFew { .. })));

    let mut w = new(1, 0);
    w.tensor_info("t", GgmlType::F32, &[4]).unwrap();
    w.tensor_data(&[0; 8]).unwrap();
    assert!(matches!(
        w.finish(),
        Err(WriteError::DataSize {
            expected: 16,
            written: 8
        })
    ));

    let mut w = new(0, 1);
    w.begin_array("deep", ValueType::Array, 1).unwrap();
    for _ in 0..6 {
        w.begin_nested_array(ValueType::Array, 1).unwrap();
    }
    w.begin_nested_array(ValueType::U8, 1).unwrap();
    assert!(matches!(
        w.begin_nested_array(ValueType::U8, 1),
        Err(WriteError::ElementType { .. })
    ));
    w.elem(Value::U8(1)).unwrap();
    let mut w = new(0, 1);
    w.begin_array("deep", ValueType::Array, 1).unwrap();
    for _ in 0..6 {
        w.begin_nested_array(ValueType::Array, 1).unwrap();
    }
    w.begin_nested_array(ValueType::Array, 1).unwrap();
    assert!(matches!(
        w.begin_nested_array(ValueType::U8, 1),
        Err(WriteError::ArrayTooDeep)
    ));
}

#[test]
fn deepest_writable_array_is_readable() {
    let mut w = GgufWriter::new(VecSink::default(), 0, 1).unwrap();
    w.begin_array("deep", ValueType::Array, 1).unwrap();
    for _ in 0..6 {
        w.begin_nested_array(ValueType::Array, 1).unwrap();
    }
    w.begin_nested_array(ValueType::U8, 1).unwrap();
    w.elem(Value::U8(9)).unwrap();
    let f = w.finish().unwrap().0;
    let g = Gguf::parse(&f, f.len() as u64).unwrap();
    let mut v = g.get("deep").unwrap();
    let mut depth = 0;
    while let Some(a) = v.as_array() {
        depth += 1;
        v = a.at(0).unwrap();
    }
    assert_eq!((depth, v), (8, Value::U8(9)));
}

#[test]
fn rewrite_can_replace_a_tensor_with_another_type() {
    let f = llama_q4_0();
    let g = Gguf::parse(&f, f.len() as u64).unwrap();
    // output.weight Q6_K [256, 300] becomes Q8_0: 300 rows x 8 blocks x 34 bytes.
    let new_bytes: Vec<u8> = (0..300 * 8 * 34).map(|i| (i * 7 % 251) as u8).collect();
    let mut w = GgufWriter::new(
        VecSink::default(),
        g.tensor_count() as u64,
        g.kv_count() as u64,
    )
    .unwrap();
    w.copy_kvs(&g, |_| true).unwrap();
    for t in g.tensors() {
        if t.name == "output.weight" {
            w.tensor_info(t.name, GgmlType::Q8_0, t.shape()).unwrap();
        } else {
            w.copy_tensor_info(&t).unwrap();
        }
    }
    for t in g.tensors() {
        if t.name == "output.weight" {
            w.tensor_data(&new_bytes).unwrap();
        } else {
            w.tensor_data(&f[t.offset as usize..][..t.bytes as usize])
                .unwrap();
        }
    }
    let out = w.finish().unwrap().0;
    let g2 = Gguf::parse(&out, out.len() as u64).unwrap();
    let o = g2.tensor("output.weight").unwrap();
    assert_eq!((o.ty, o.bytes), (GgmlType::Q8_0, 81600));
    assert_eq!(&out[o.offset as usize..][..81600], &new_bytes[..]);
    for t in g.tensors().filter(|t| t.name != "output.weight") {
        let t2 = g2.tensor(t.name).unwrap();
        assert_eq!(
            &out[t2.offset as usize..][..t2.bytes as usize],
            &f[t.offset as usize..][..t.bytes as usize],
            "{}",
            t.name
        );
    }
}
