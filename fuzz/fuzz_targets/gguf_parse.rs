//! Fuzz target for the GGUF reader: the input is parsed both as a whole file and as the
//! prefix of a longer file; whatever parses is walked through every accessor, `inspect`
//! and a rewrite through the writer, which must parse back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinch_kernels::CpuFeatures;
use pinch_runtime_min::gguf::{CountSink, Gguf, GgufError, GgufWriter, Value};

struct Discard;
impl core::fmt::Write for Discard {
    fn write_str(&mut self, _: &str) -> core::fmt::Result {
        Ok(())
    }
}

fn walk(g: &Gguf) {
    for (_, v) in g.kv() {
        if let Value::Array(a) = v {
            for e in a.iter() {
                let _ = e.as_array().map(|x| x.iter().count());
            }
            let _ = a.iter_str().count();
            let _ = (a.f32_at(0), a.i32_at(a.len()), a.u32_at(1), a.str_at(2));
        }
    }
    for t in g.tensors() {
        assert!(t.offset + t.bytes <= g.file_len);
        assert!(g.tensor(t.name).is_some());
    }
    let _ = pinch_runtime_min::inspect::inspect(g, &CpuFeatures::default(), &mut Discard);
    // Metadata survives a rewrite (data is not in the input, so tensors are dropped).
    let mut w = GgufWriter::new(CountSink::default(), 0, g.kv_count() as u64).unwrap();
    w.copy_kvs(g, |_| true).unwrap();
    w.finish().unwrap();
}

fuzz_target!(|data: &[u8]| {
    match Gguf::parse(data, data.len() as u64) {
        Ok(g) => walk(&g),
        Err(GgufError::NeedMore { .. }) => panic!("a whole file never needs more"),
        Err(e) => {
            let _ = format!("{e}");
        }
    }
    // As the prefix of a 1 TiB file, so that header-only seeds reach the accessors.
    let claimed = 1u64 << 40;
    match Gguf::parse(data, claimed) {
        Ok(g) => walk(&g),
        Err(GgufError::NeedMore { need }) => assert!(need > data.len() as u64 && need <= claimed),
        Err(_) => {}
    }
});
