//! Helpers shared by the GGUF integration tests: a `Vec` sink, the fixture, and a raw
//! byte builder for hostile headers the writer would refuse to produce.
#![allow(dead_code)]

use pinch_runtime_min::gguf::Sink;

/// The fixture copied from `/work/shared/fixtures` (provenance in `data/README.md`).
pub const LLAMA_Q4_0: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/tiny-llama-Q4_0.gguf"
);

pub fn data(name: &str) -> Vec<u8> {
    let p = format!("{}/tests/data/{}", env!("CARGO_MANIFEST_DIR"), name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

pub fn llama_q4_0() -> Vec<u8> {
    data("tiny-llama-Q4_0.gguf")
}

/// Header-only copies of bigger fixtures and the length of the file they came from.
pub const HEADERS: [(&str, u64); 3] = [
    ("tiny-qwen3moe-Q4_K_M.header", 840_576),
    ("tiny-bailingmoe2-Q4_K_M.header", 850_176),
    ("tiny-lfm2-Q4_K_M.header", 848_736),
];

#[derive(Default)]
pub struct VecSink(pub Vec<u8>);

impl Sink for VecSink {
    type Error = std::convert::Infallible;
    fn write(&mut self, bytes: &[u8]) -> Result<(), Self::Error> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

/// Builds GGUF bytes field by field, with no checks.
#[derive(Default, Clone)]
pub struct Raw(pub Vec<u8>);

impl Raw {
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw::default();
        r.bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Raw {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Raw {
        self.bytes(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Raw {
        self.bytes(&v.to_le_bytes())
    }
    pub fn str(&mut self, s: &str) -> &mut Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Raw {
        self.str(key).u32(4).u32(v)
    }
    /// A tensor info: name, dims, ggml type id, relative offset.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Raw {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to `align` and appends `n` data bytes.
    pub fn data(&mut self, align: usize, n: usize) -> &mut Raw {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self.0.extend(std::iter::repeat_n(0x5a, n));
        self
    }
    pub fn len(&self) -> u64 {
        self.0.len() as u64
    }
}
