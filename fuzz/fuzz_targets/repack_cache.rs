//! Fuzz target for the repack-cache reader (`repack_cache::decode_header`), checked
//! against the tiny Q8_0 llama fixture as the model.
//!
//! Input: byte 0 holds flags, bytes 1-8 the cache file's size (u64 LE), the rest is the
//! start of the cache file. A random header never passes the checksum, so flag bit 0
//! writes the model's identity into the header and bit 1 recomputes the checksum
//! (FNV-1a 64, as the writer does): the fuzzer then reaches the entry checks. Checked:
//! an accepted header's entries name tensors of the model with their type and offset,
//! no longer than the tensor, each payload 64-byte aligned, in order and inside the
//! file, the last ending at the file's end.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinch_kernels::CpuFeatures;
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::platform::MemPlatform;
use pinch_runtime_min::repack_cache::{decode_header, full_header_len, ModelId, MAX_ENTRIES};
use std::sync::OnceLock;

const MODEL: &str = "tiny/tiny-llama-Q8_0.gguf";
const FIXED: usize = 56;

fn model() -> &'static (Gguf<'static>, ModelId) {
    static M: OnceLock<(Gguf<'static>, ModelId)> = OnceLock::new();
    M.get_or_init(|| {
        let bytes = pinch_fuzz::leak_file(MODEL);
        let g = Gguf::parse(bytes, bytes.len() as u64).unwrap();
        let p = MemPlatform {
            bytes,
            cpu: CpuFeatures::default(),
        };
        let id = ModelId::of(&p, &(), &g).unwrap();
        (g, id)
    })
}

fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in parts.iter().flat_map(|p| p.iter()) {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fuzz_target!(init: { model(); }, |data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let flags = data[0];
    let file_size = u64::from_le_bytes(data[1..9].try_into().unwrap());
    let mut header = data[9..].to_vec();
    let (g, id) = model();
    if flags & 1 != 0 && header.len() >= FIXED {
        header[16..24].copy_from_slice(&id.size.to_le_bytes());
        header[24..32].copy_from_slice(&id.stamp.to_le_bytes());
        header[32..40].copy_from_slice(&id.header_hash.to_le_bytes());
        header[40..48].copy_from_slice(&id.sample_hash.to_le_bytes());
    }
    if flags & 2 != 0 && header.len() >= FIXED {
        let n = u32::from_le_bytes(header[12..16].try_into().unwrap()) as usize;
        let hl = full_header_len(n.min(MAX_ENTRIES)).min(header.len());
        let sum = fnv(&[&header[..48], &[0u8; 8], &header[FIXED..hl]]);
        header[48..56].copy_from_slice(&sum.to_le_bytes());
    }
    let Ok(entries) = decode_header(&header, file_size, id, g) else {
        return;
    };
    let mut end = full_header_len(entries.len()) as u64;
    for e in entries.iter() {
        let t = g
            .tensor(&e.name)
            .expect("entry names a tensor of the model");
        assert!(t.ty == e.ty && t.offset == e.model_offset && e.len <= t.bytes);
        assert!(e.offset % 64 == 0 && e.offset >= end);
        end = e.offset + e.len;
        assert!(end <= file_size);
    }
    assert_eq!(end, file_size);
});
