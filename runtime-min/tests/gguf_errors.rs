//! One test per reader error: each builds the smallest file with exactly that defect
//! and asserts on the variant (not on the message).
mod gguf_util;

use gguf_util::*;
use pinch_runtime_min::gguf::{Gguf, GgufError, MAX_ALIGNMENT, MAX_ARRAY_DEPTH};

fn parse(r: &Raw) -> Result<Gguf<'_>, GgufError> {
    Gguf::parse(&r.0, r.len())
}

/// One valid Q8_0 tensor of 32 weights (34 bytes), with `pre` metadata keys.
fn one_tensor(
    n_kv: u64,
    kvs: impl FnOnce(&mut Raw),
    name: &str,
    dims: &[u64],
    ty: u32,
    off: u64,
) -> Raw {
    let mut r = Raw::header(3, 1, n_kv);
    kvs(&mut r);
    r.tensor(name, dims, ty, off).data(32, 34 * 64);
    r
}

#[test]
fn accepts_minimal_valid_files() {
    assert!(parse(&Raw::header(3, 0, 0)).is_ok());
    let r = one_tensor(0, |_| {}, "t", &[32], 8, 0);
    assert_eq!(parse(&r).unwrap().tensor("t").unwrap().bytes, 34);
}

#[test]
fn asks_for_more_when_prefix_ends_in_header() {
    let r = one_tensor(
        1,
        |r| {
            r.kv_u32("a", 1);
        },
        "t",
        &[32],
        8,
        0,
    );
    let e = Gguf::parse(&r.0[..30], r.len()).unwrap_err();
    assert!(matches!(e, GgufError::NeedMore { need } if need > 30));
}

#[test]
fn rejects_truncated_file() {
    let r = Raw::header(3, 0, 0);
    let e = Gguf::parse(&r.0[..20], 20).unwrap_err();
    assert_eq!(
        e,
        GgufError::Truncated {
            field: "metadata key count",
            offset: 16,
            need: 8,
            file_len: 20
        }
    );
    assert!(matches!(
        Gguf::parse(&[], 0),
        Err(GgufError::Truncated { field: "magic", .. })
    ));
}

#[test]
fn rejects_bad_magic() {
    let mut r = Raw::header(3, 0, 0);
    r.0[..4].copy_from_slice(b"GGML");
    assert_eq!(
        parse(&r).unwrap_err(),
        GgufError::BadMagic { found: *b"GGML" }
    );
}

#[test]
fn rejects_version_1_and_unknown_versions() {
    for v in [0, 1, 4, 0x0300_0000] {
        assert_eq!(
            parse(&Raw::header(v, 0, 0)).unwrap_err(),
            GgufError::UnsupportedVersion { found: v }
        );
    }
}

#[test]
fn rejects_tensor_count_larger_than_file() {
    let r = Raw::header(3, u64::MAX, 0);
    assert!(matches!(
        parse(&r),
        Err(GgufError::TooManyTensors {
            count: u64::MAX,
            ..
        })
    ));
    // 1000 tensors cannot fit in 24 + 100 bytes.
    let mut r = Raw::header(3, 1000, 0);
    r.bytes(&[0; 100]);
    assert!(matches!(
        parse(&r),
        Err(GgufError::TooManyTensors {
            count: 1000,
            max: 4
        })
    ));
}

#[test]
fn rejects_key_count_larger_than_file() {
    let r = Raw::header(3, 0, 1 << 40);
    assert!(matches!(
        parse(&r),
        Err(GgufError::TooManyKeys {
            count: 0x100_0000_0000,
            max: 0
        })
    ));
}

#[test]
fn rejects_string_longer_than_file() {
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX - 3).bytes(b"abcdefghijklmnop");
    let e = parse(&r);
    assert!(
        matches!(
            e,
            Err(GgufError::StringTooLong {
                field: "key",
                offset: 32,
                len: 0xffff_ffff_ffff_fffc,
                ..
            })
        ),
        "{e:?}"
    );
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(100).bytes(b"short");
    assert!(matches!(
        parse(&r),
        Err(GgufError::StringTooLong {
            field: "string value",
            len: 100,
            ..
        })
    ));
}

#[test]
fn rejects_invalid_utf8_in_keys_values_and_tensor_names() {
    let mut r = Raw::header(3, 0, 1);
    r.u64(2).bytes(&[0xc3, 0x28]).u32(4).u32(0);
    assert!(matches!(
        parse(&r),
        Err(GgufError::InvalidUtf8 {
            field: "key",
            offset: 32
        })
    ));
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(1).bytes(&[0xff]);
    assert!(matches!(
        parse(&r),
        Err(GgufError::InvalidUtf8 {
            field: "string value",
            ..
        })
    ));
    let mut r = Raw::header(3, 0, 1);
    r.str("k")
        .u32(9)
        .u32(8)
        .u64(2)
        .str("ok")
        .u64(1)
        .bytes(&[0x80]);
    assert!(matches!(
        parse(&r),
        Err(GgufError::InvalidUtf8 {
            field: "string value",
            ..
        })
    ));
    let mut r = Raw::header(3, 1, 0);
    r.u64(1)
        .bytes(&[0xfe])
        .u32(1)
        .u64(32)
        .u32(8)
        .u64(0)
        .data(32, 34);
    assert!(matches!(
        parse(&r),
        Err(GgufError::InvalidUtf8 {
            field: "tensor name",
            ..
        })
    ));
}

#[test]
fn rejects_unknown_value_type() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(13).u32(0);
    let e = parse(&r).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::UnknownValueType {
                found: 13,
                offset: 33,
                ..
            }
        ),
        "{e:?}"
    );
    // ...also as an array element type.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(0xffff_ffff).u64(0);
    assert!(matches!(
        parse(&r),
        Err(GgufError::UnknownValueType {
            found: 0xffff_ffff,
            ..
        })
    ));
}

fn nested(depth: u32) -> Raw {
    let mut r = Raw::header(3, 0, 1);
    r.str("deep").u32(9);
    for _ in 1..depth {
        r.u32(9).u64(1);
    }
    r.u32(4).u64(1).u32(42);
    r
}

#[test]
fn rejects_arrays_nested_too_deep() {
    assert!(parse(&nested(MAX_ARRAY_DEPTH)).is_ok());
    let e = parse(&nested(MAX_ARRAY_DEPTH + 1)).unwrap_err();
    assert!(
        matches!(e, GgufError::ArrayTooDeep { depth, .. } if depth == MAX_ARRAY_DEPTH + 1),
        "{e:?}"
    );
    // Deep nesting with huge counts must still fail fast, not recurse per element.
    let e = parse(&nested(10_000)).unwrap_err();
    assert!(matches!(e, GgufError::ArrayTooDeep { .. }));
}

#[test]
fn rejects_array_longer_than_file() {
    // len * 4 overflows u64.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(4).u64(1 << 62);
    assert!(matches!(
        parse(&r),
        Err(GgufError::ArrayTooLong {
            len: 0x4000_0000_0000_0000,
            elem_size: 4,
            ..
        })
    ));
    // Fits u64 but not the file.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(6).u64(3).u32(0).u32(0);
    assert!(matches!(
        parse(&r),
        Err(GgufError::ArrayTooLong {
            len: 3,
            elem_size: 4,
            ..
        })
    ));
    // Strings are at least 8 bytes each.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(8).u64(1 << 61);
    assert!(matches!(
        parse(&r),
        Err(GgufError::ArrayTooLong { elem_size: 8, .. })
    ));
}

#[test]
fn rejects_duplicate_keys() {
    let mut r = Raw::header(3, 0, 3);
    r.kv_u32("a", 1).kv_u32("b", 2).kv_u32("a", 3);
    let e = parse(&r).unwrap_err();
    assert!(
        matches!(e, GgufError::DuplicateKey { first: 0, second: 2, key } if key.as_str() == "a"),
        "{e:?}"
    );
}

#[test]
fn rejects_duplicate_keys_across_chunks() {
    // 300 keys: the duplicate pair falls in different chunks of the stack-only check.
    let mut r = Raw::header(3, 0, 300);
    for i in 0..300 {
        let k = if i == 290 {
            "key.7".to_string()
        } else {
            format!("key.{i}")
        };
        r.kv_u32(&k, i);
    }
    let e = parse(&r).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::DuplicateKey {
                first: 7,
                second: 290,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn rejects_alignment_of_wrong_type() {
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(8).str("32");
    assert_eq!(
        parse(&r).unwrap_err(),
        GgufError::WrongKeyType {
            key: "general.alignment",
            expected: "unsigned integer",
            found: "string"
        }
    );
}

#[test]
fn rejects_bad_alignment() {
    for a in [0u32, 3, 48, (MAX_ALIGNMENT * 2) as u32] {
        let mut r = Raw::header(3, 0, 1);
        r.kv_u32("general.alignment", a);
        assert_eq!(
            parse(&r).unwrap_err(),
            GgufError::BadAlignment {
                found: a as u64,
                max: MAX_ALIGNMENT
            }
        );
    }
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 64);
    assert_eq!(parse(&r).unwrap().alignment, 64);
}

#[test]
fn rejects_more_than_four_dims() {
    let r = one_tensor(0, |_| {}, "t5", &[32, 1, 1, 1, 1], 8, 0);
    assert!(
        matches!(parse(&r), Err(GgufError::TooManyDims { n_dims: 5, tensor }) if tensor.as_str() == "t5")
    );
}

#[test]
fn rejects_zero_dim() {
    let r = one_tensor(0, |_| {}, "t", &[32, 0], 8, 0);
    assert!(matches!(parse(&r), Err(GgufError::ZeroDim { dim: 1, .. })));
}

#[test]
fn rejects_shape_overflow() {
    let r = one_tensor(0, |_| {}, "t", &[1 << 32, 1 << 32], 0, 0);
    assert!(matches!(
        parse(&r),
        Err(GgufError::ShapeOverflow {
            dims: [0x1_0000_0000, 0x1_0000_0000, 1, 1],
            ..
        })
    ));
    // Elements fit i64 but F32 bytes (x4) overflow u64... and are past the file anyway.
    let r = one_tensor(0, |_| {}, "t", &[1 << 62], 0, 0);
    assert!(matches!(parse(&r), Err(GgufError::ShapeOverflow { .. })));
}

#[test]
fn rejects_unknown_tensor_type() {
    for id in [4, 5, 31, 43, u32::MAX] {
        let r = one_tensor(0, |_| {}, "t", &[32], id, 0);
        assert!(
            matches!(parse(&r), Err(GgufError::UnknownTensorType { found, .. }) if found == id)
        );
    }
}

#[test]
fn rejects_row_that_is_not_whole_blocks() {
    let r = one_tensor(0, |_| {}, "t", &[33, 2], 8, 0);
    assert!(matches!(
        parse(&r),
        Err(GgufError::RowNotBlockMultiple {
            row: 33,
            block: 32,
            type_name: "Q8_0",
            ..
        })
    ));
    let r = one_tensor(0, |_| {}, "t", &[128], 12, 0);
    assert!(matches!(
        parse(&r),
        Err(GgufError::RowNotBlockMultiple {
            block: 256,
            type_name: "Q4_K",
            ..
        })
    ));
}

#[test]
fn rejects_misaligned_tensor_offset() {
    let r = one_tensor(0, |_| {}, "t", &[32], 8, 16);
    assert_eq!(
        parse(&r).unwrap_err(),
        GgufError::MisalignedTensor {
            tensor: pinch_runtime_min::gguf::Name::new("t"),
            offset: 16,
            alignment: 32
        }
    );
    // With alignment 16 it is aligned, but the first tensor must start at 0.
    let r = one_tensor(
        1,
        |r| {
            r.kv_u32("general.alignment", 16);
        },
        "t",
        &[32],
        8,
        16,
    );
    assert!(matches!(
        parse(&r),
        Err(GgufError::UnexpectedTensorOffset {
            offset: 16,
            expected: 0,
            ..
        })
    ));
}

#[test]
fn rejects_tensor_past_end_of_file() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[32, 2], 8, 0).data(32, 67);
    let e = parse(&r).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::TensorPastEnd {
                offset: 96,
                bytes: 68,
                file_len: 163,
                ..
            }
        ),
        "{e:?}"
    );
    // A byte count far past any file (34 PiB).
    let r = one_tensor(0, |_| {}, "t", &[32, 1 << 50], 8, 0);
    assert!(matches!(
        parse(&r),
        Err(GgufError::TensorPastEnd { bytes, .. }) if bytes == 34 << 50
    ));
    // A header-only prefix with a file length that is too small.
    let f = llama_q4_0();
    let e = Gguf::parse(&f[..8768], f.len() as u64 - 1).unwrap_err();
    assert!(
        matches!(e, GgufError::TensorPastEnd { tensor, .. } if tensor.as_str() == "blk.1.ffn_up.weight")
    );
}

#[test]
fn rejects_duplicate_tensor_names() {
    let mut r = Raw::header(3, 300, 0);
    for i in 0..300u64 {
        let name = if i == 299 {
            "t.5".to_string()
        } else {
            format!("t.{i}")
        };
        r.tensor(&name, &[32], 8, i * 64);
    }
    r.data(32, 300 * 64);
    let e = parse(&r).unwrap_err();
    assert!(
        matches!(e, GgufError::DuplicateTensor { first: 5, second: 299, tensor } if tensor.as_str() == "t.5"),
        "{e:?}"
    );
    let mut r = Raw::header(3, 2, 0);
    r.tensor("x", &[32], 8, 0)
        .tensor("x", &[32], 8, 64)
        .data(32, 128);
    assert!(matches!(
        parse(&r),
        Err(GgufError::DuplicateTensor {
            first: 0,
            second: 1,
            ..
        })
    ));
}

#[test]
fn long_names_are_cut_in_errors() {
    let long = "n".repeat(300);
    let r = one_tensor(0, |_| {}, &long, &[33], 8, 0);
    let e = parse(&r).unwrap_err();
    let GgufError::RowNotBlockMultiple { tensor, .. } = e else {
        panic!("{e:?}")
    };
    assert!(tensor.is_cut());
    assert_eq!(tensor.as_str().len(), pinch_runtime_min::gguf::Name::CAP);
    assert!(e.to_string().contains("nnn..."));
}

#[test]
fn rejects_counts_above_the_supported_maximum() {
    use pinch_runtime_min::gguf::{MAX_KV, MAX_TENSORS};
    let mut r = Raw::header(3, 0, MAX_KV + 1);
    r.bytes(&vec![0; 1 << 20]);
    assert_eq!(
        parse(&r).unwrap_err(),
        GgufError::TooManyKeys {
            count: MAX_KV + 1,
            max: MAX_KV
        }
    );
    let mut r = Raw::header(3, MAX_TENSORS + 1, 0);
    r.bytes(&vec![0; 1 << 20]);
    assert_eq!(
        parse(&r).unwrap_err(),
        GgufError::TooManyTensors {
            count: MAX_TENSORS + 1,
            max: MAX_TENSORS
        }
    );
}

#[test]
fn hostile_maximum_sizes_parse_in_bounded_time() {
    use pinch_runtime_min::gguf::{MAX_KV, MAX_TENSORS};
    // The duplicate checks re-walk the header without a heap; at the maximum counts,
    // and with a 1M-string array that every walk has to step over, they stay fast.
    let mut r = Raw::header(3, MAX_TENSORS, MAX_KV);
    r.str("tok").u32(9).u32(8).u64(1_000_000);
    for _ in 0..1_000_000 {
        r.u64(0);
    }
    for i in 1..MAX_KV {
        r.str(&format!("key.{i:06}")).u32(0).bytes(&[1]);
    }
    for i in 0..MAX_TENSORS {
        r.tensor(&format!("blk.{i}.attn_q.weight"), &[32], 8, i * 64);
    }
    r.data(32, (MAX_TENSORS * 64) as usize);
    let t = std::time::Instant::now();
    let g = parse(&r).unwrap();
    let dt = t.elapsed();
    assert_eq!(
        (g.kv_count() as u64, g.tensor_count() as u64),
        (MAX_KV, MAX_TENSORS)
    );
    eprintln!("parse at maximum counts: {dt:?}");
    assert!(dt.as_secs() < 10, "{dt:?}");
}

#[test]
fn rejects_tensor_at_unexpected_offset() {
    // Q8_0 [32, 2] = 68 bytes, so the next tensor belongs at 96 (alignment 32).
    for (second, bad) in [(96, false), (64, true), (128, true), (0, true)] {
        let mut r = Raw::header(3, 2, 0);
        r.tensor("a", &[32, 2], 8, 0)
            .tensor("b", &[32], 8, second)
            .data(32, 200);
        let res = parse(&r);
        if bad {
            assert!(
                matches!(res, Err(GgufError::UnexpectedTensorOffset { offset, expected: 96, tensor }) if offset == second && tensor.as_str() == "b"),
                "{res:?}"
            );
        } else {
            assert_eq!(res.unwrap().tensor("b").unwrap().offset % 32, 0);
        }
    }
}

#[test]
fn tensor_larger_than_the_address_space_is_rejected_on_32_bit() {
    // 2^27 rows of one Q8_0 block: 4.56 GB of data, in a file that claims to be long
    // enough. A 64-bit build accepts it; a 32-bit one (armv7 under qemu-arm) cannot map
    // or index it and must say so at parse, not truncate the sizes later.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("big", &[32, 1 << 27], 8, 0).data(32, 0);
    let bytes = 34u64 << 27;
    let got = Gguf::parse(&r.0, r.len() + bytes);
    if cfg!(target_pointer_width = "32") {
        assert!(
            matches!(
                got,
                Err(GgufError::TensorTooLarge { ref tensor, bytes: b, elements: e })
                    if tensor.as_str() == "big" && b == bytes && e == 32 << 27
            ),
            "{got:?}"
        );
    } else {
        assert_eq!(got.unwrap().tensor("big").unwrap().bytes, bytes);
    }
}
