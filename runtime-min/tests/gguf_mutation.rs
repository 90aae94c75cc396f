//! Mutation test: >= 100,000 damaged variants of real headers go through `parse` and,
//! when it succeeds, through every accessor and `inspect`. Nothing may panic or hang,
//! and a `NeedMore` must always ask for more than it was given (so callers converge).
//!
//! Seeds: the llama fixture (whole file and header prefix), three header-only fixtures,
//! and a writer-built file with every value type and nested arrays.
mod gguf_util;

use std::fmt::Write as _;
use std::time::Instant;

use gguf_util::*;
use pinch_kernels::CpuFeatures;
use pinch_runtime_min::gguf::{Gguf, GgufError, GgufWriter, Value, ValueType};
use pinch_runtime_min::inspect::inspect;

/// xorshift64*: deterministic, so a failure can be replayed from its variant number.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn writer_seed() -> Vec<u8> {
    let mut w = GgufWriter::new(VecSink::default(), 2, 7).unwrap();
    w.kv("general.architecture", Value::Str("llama")).unwrap();
    w.kv("general.alignment", Value::U32(16)).unwrap();
    w.kv("llama.context_length", Value::U64(4096)).unwrap();
    w.kv_str_array("tokenizer.ggml.tokens", &["a", "bc", "", "\u{2581}x"])
        .unwrap();
    w.kv_f32_array("tokenizer.ggml.scores", &[0.0, -1.0, -2.0, -3.0])
        .unwrap();
    w.begin_array("x.nested", ValueType::Array, 2).unwrap();
    w.begin_nested_array(ValueType::I16, 2).unwrap();
    w.elem(Value::I16(-1)).unwrap();
    w.elem(Value::I16(2)).unwrap();
    w.begin_nested_array(ValueType::Str, 1).unwrap();
    w.elem(Value::Str("s")).unwrap();
    w.kv("x.f64", Value::F64(0.25)).unwrap();
    w.tensor_info("token_embd.weight", pinch_kernels::GgmlType::Q8_0, &[32, 4])
        .unwrap();
    w.tensor_info(
        "blk.0.attn_norm.weight",
        pinch_kernels::GgmlType::F32,
        &[32],
    )
    .unwrap();
    w.tensor_data(&[7; 136]).unwrap();
    w.tensor_data(&[0; 128]).unwrap();
    w.finish().unwrap().0
}

/// Exercises everything a caller could touch; returns a checksum so the work is not
/// optimised away.
fn walk(g: &Gguf, sink: &mut String, with_inspect: bool) -> u64 {
    let mut acc = 0u64;
    for (k, v) in g.kv() {
        acc = acc.wrapping_add(k.len() as u64);
        // The skipping lookup must agree with the decoding iterator.
        assert_eq!(
            g.get(k).map(|x| x.value_type()),
            Some(v.value_type()),
            "{k}"
        );
        if let Value::Array(a) = v {
            for e in a.iter().take(4096) {
                if let Value::Array(inner) = e {
                    acc = acc.wrapping_add(inner.iter().count() as u64);
                }
            }
            acc = acc.wrapping_add(a.iter_str().map(|s| s.len() as u64).sum::<u64>());
            for i in [0, 1, a.len().saturating_sub(1), a.len(), usize::MAX] {
                acc = acc.wrapping_add(a.f32_at(i).map_or(0, |x| x.to_bits() as u64));
                acc = acc.wrapping_add(a.i32_at(i).map_or(0, |x| x as u64));
                acc = acc.wrapping_add(a.u32_at(i).map_or(0, |x| x as u64));
            }
            acc = acc.wrapping_add(a.str_at(3).map_or(0, |s| s.len() as u64));
        }
        acc = acc.wrapping_add(v.as_u64().unwrap_or(1));
    }
    let mut prev_end = g.data_offset;
    for t in g.tensors() {
        assert!(t.offset >= prev_end, "{}: tensors overlap", t.name);
        prev_end = t.offset + t.bytes;
        acc = acc.wrapping_add(t.offset ^ t.bytes);
        assert!(t
            .offset
            .checked_add(t.bytes)
            .is_some_and(|e| e <= g.file_len));
        assert_eq!(t.offset % g.alignment, g.data_offset % g.alignment);
        acc = acc.wrapping_add(g.tensor(t.name).map_or(0, |x| x.bytes));
    }
    acc = acc.wrapping_add(g.get_u32("llama.context_length").unwrap_or(0) as u64);
    acc = acc.wrapping_add(g.architecture().map_or(0, |a| a.len() as u64));
    if with_inspect {
        sink.clear();
        inspect(g, &CpuFeatures::default(), sink).unwrap();
        acc = acc.wrapping_add(sink.len() as u64);
    }
    acc
}

fn mutate(rng: &mut Rng, v: &mut Vec<u8>) {
    if v.is_empty() {
        v.push(0);
    }
    let interesting_u64 = [
        u64::MAX,
        1 << 63,
        1 << 32,
        u32::MAX as u64,
        0,
        1,
        255,
        1 << 20,
    ];
    let interesting_u32 = [0u32, 1, 4, 8, 9, 12, 13, 42, u32::MAX];
    // Bias positions towards the start, where counts, keys and lengths live.
    let pos = |rng: &mut Rng, len: usize| {
        if rng.next().is_multiple_of(2) {
            rng.below(len.min(512))
        } else {
            rng.below(len)
        }
    };
    match rng.below(9) {
        0 => {
            for _ in 0..1 + rng.below(8) {
                let p = pos(rng, v.len());
                v[p] ^= 1 << rng.below(8);
            }
        }
        1 => {
            let p = pos(rng, v.len());
            v[p] = [0, 0xff, rng.next() as u8][rng.below(3)];
        }
        2 => {
            let n = rng.below(v.len());
            v.truncate(n);
        }
        3 => {
            let p = pos(rng, v.len() + 1).min(v.len());
            let n = 1 + rng.below(16);
            for _ in 0..n {
                v.insert(p, rng.next() as u8);
            }
        }
        4 => {
            let p = pos(rng, v.len());
            let n = (1 + rng.below(16)).min(v.len() - p);
            v.drain(p..p + n);
        }
        5 | 6 => {
            // A u64 field (count, length, dim, offset) set to a huge or edge value;
            // 8-aligned-from-start positions hit the fixed header's counts.
            let p = if rng.next().is_multiple_of(4) {
                8 + 8 * rng.below(2)
            } else {
                pos(rng, v.len())
            };
            let x = interesting_u64[rng.below(interesting_u64.len())];
            let b = x.to_le_bytes();
            for (i, &byte) in b.iter().enumerate() {
                if let Some(d) = v.get_mut(p + i) {
                    *d = byte;
                }
            }
        }
        7 => {
            // A u32 field (type id, n_dims) set to an edge value.
            let p = pos(rng, v.len());
            let x = interesting_u32[rng.below(interesting_u32.len())];
            for (i, &byte) in x.to_le_bytes().iter().enumerate() {
                if let Some(d) = v.get_mut(p + i) {
                    *d = byte;
                }
            }
        }
        _ => {
            // Copy a random slice over another place (duplicates keys and names).
            let a = rng.below(v.len());
            let b = rng.below(v.len());
            let n = rng.below(64).min(v.len() - a).min(v.len() - b);
            let tmp: Vec<u8> = v[a..a + n].to_vec();
            v[b..b + n].copy_from_slice(&tmp);
        }
    }
}

#[test]
fn mutated_headers_never_panic() {
    let llama = llama_q4_0();
    // (bytes, file_len): whole files and header prefixes of longer files.
    let mut seeds: Vec<(Vec<u8>, u64)> = vec![
        (llama[..8768].to_vec(), llama.len() as u64),
        (writer_seed(), 0),
    ];
    for (name, len) in HEADERS {
        seeds.push((data(name), len));
    }
    for s in &mut seeds {
        if s.1 == 0 {
            s.1 = s.0.len() as u64;
        }
        Gguf::parse(&s.0, s.1).expect("seed must parse");
    }

    // PINCH_MUTATIONS=10000000 for a long run.
    let variants: u64 = std::env::var("PINCH_MUTATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300_000);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut text = String::new();
    let (mut ok, mut need_more, mut errors, mut acc) = (0u64, 0u64, 0u64, 0u64);
    let start = Instant::now();
    let mut buf = Vec::new();
    for i in 0..variants {
        let (seed, seed_len) = &seeds[(i % seeds.len() as u64) as usize];
        buf.clear();
        buf.extend_from_slice(seed);
        for _ in 0..1 + rng.below(3) {
            mutate(&mut rng, &mut buf);
        }
        // Whole-file seeds stay whole files; prefixes keep (or sometimes shrink) the
        // length of the file they came from.
        let grown = buf.len() as u64 > seed.len() as u64;
        let file_len = match rng.below(4) {
            _ if *seed_len == seed.len() as u64 => buf.len() as u64,
            0 => buf.len() as u64,
            1 => rng.next() % (seed_len + 1),
            _ if grown => seed_len + (buf.len() - seed.len()) as u64,
            _ => *seed_len,
        };
        match Gguf::parse(&buf, file_len) {
            Ok(g) => {
                ok += 1;
                acc = acc.wrapping_add(walk(&g, &mut text, ok % 8 == 0));
            }
            Err(GgufError::NeedMore { need }) => {
                need_more += 1;
                assert!(
                    need > buf.len() as u64 && need <= file_len,
                    "variant {i}: NeedMore {{ need: {need} }} with {} bytes of a {file_len}-byte file",
                    buf.len()
                );
            }
            Err(e) => {
                errors += 1;
                text.clear();
                write!(text, "{e}").unwrap();
                assert!(!text.is_empty());
            }
        }
    }
    let dt = start.elapsed();
    eprintln!(
        "{variants} variants in {:.2} s ({:.0}/s): {ok} parsed, {need_more} need more, {errors} rejected (checksum {acc:x})",
        dt.as_secs_f64(),
        variants as f64 / dt.as_secs_f64()
    );
    assert!(
        ok > 1000 && errors > 1000,
        "mutations should both keep and break files"
    );
    assert!(dt.as_secs() < 60, "took {dt:?}");
}

#[test]
fn growing_a_mutated_prefix_never_loops() {
    // The caller protocol: on NeedMore read more and retry. For damaged files too, the
    // loop must end (Ok or a real error) within a few rounds.
    let llama = llama_q4_0();
    let mut rng = Rng(42);
    for _ in 0..2000 {
        let mut f = llama.clone();
        mutate(&mut rng, &mut f);
        let mut have = 64.min(f.len());
        for round in 0.. {
            assert!(round < 64, "no convergence");
            match Gguf::parse(&f[..have], f.len() as u64) {
                Err(GgufError::NeedMore { need }) => {
                    have = (need as usize).max(have * 2).min(f.len());
                }
                _ => break,
            }
        }
    }
}
