#!/usr/bin/env python3
"""Write dequantization test vectors for pinch-kernels from the tiny GGUF fixtures.

For each type it writes kernels/tests/data/<family>/<TYPE>.bin (raw block bytes of the
first rows of one tensor) and <TYPE>.f32 (the dequantized values, f32 little-endian),
as llama.cpp's reference dequantizers compute them:

- gguf-py's `gguf.quants.dequantize` (a numpy port of llama.cpp's dequantize_row_*)
  for every type it implements;
- for Q1_0 (id 41, gguf-py 0.19 knows the id but has no dequantizer) and Q2_0 (id 42,
  unknown to gguf-py 0.19), the formula of llama.cpp's ggml-quants.c, written out in
  `dequant_q1_0` / `dequant_q2_0` below.

Types that no fixture contains (Q4_1, Q5_1, IQ4_NL, BF16) are quantized here with
gguf-py's quantizer from the same rows of the F32 fixture, then dequantized by gguf-py.

Usage: python3 tools/gen_dequant_vectors.py [FIXTURES_DIR] [OUT_ROOT]
(defaults: /work/shared/fixtures and kernels/tests/data). Per-type code lives in
functions so other families (K-quants) can add theirs: see LEGACY and `main`.
"""
import os
import struct
import sys

import numpy as np
import gguf
from gguf.quants import dequantize, quantize

GGML_TYPE_ID = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
                "IQ4_NL": 20, "BF16": 30, "TQ1_0": 34, "TQ2_0": 35, "Q1_0": 41, "Q2_0": 42}
# (weights per block, bytes per block) for the types read straight from a file.
GEOMETRY = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
            8: (32, 34), 20: (32, 18), 30: (1, 2), 34: (256, 54), 35: (256, 66),
            41: (128, 18), 42: (64, 18)}


# ---------------------------------------------------------------- GGUF reading
def read_gguf_tensors(path):
    """Minimal GGUF reader (gguf-py 0.19's reader rejects type 42): returns
    (bytes of the file, {name: (type_id, dims, absolute offset)})."""
    data = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t in scalar:
            return take(scalar[t])
        if t == 8:
            return string()
        if t == 9:
            it = take("I")
            n = take("Q")
            return [value(it) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {t}")

    assert data[:4] == b"GGUF", path
    pos = 4
    take("I")  # version
    n_tensors = take("Q")
    n_kv = take("Q")
    alignment = 32
    for _ in range(n_kv):
        key = string()
        v = value(take("I"))
        if key == "general.alignment":
            alignment = v
    infos = {}
    for _ in range(n_tensors):
        name = string()
        nd = take("I")
        dims = [take("Q") for _ in range(nd)]
        ty = take("I")
        off = take("Q")
        infos[name] = (ty, dims, off)
    start = (pos + alignment - 1) // alignment * alignment
    return data, {k: (t, d, start + o) for k, (t, d, o) in infos.items()}


def first_rows(path, tensor, rows):
    """Raw bytes and element count of the first `rows` rows of `tensor`."""
    data, infos = read_gguf_tensors(path)
    ty, dims, off = infos[tensor]
    qk, bb = GEOMETRY[ty]
    n = dims[0] * rows
    nbytes = n // qk * bb
    return ty, np.frombuffer(data[off:off + nbytes], dtype=np.uint8).copy(), n


# ---------------------------------------------- dequantizers gguf-py lacks
def dequant_q1_0(raw):
    """llama.cpp dequantize_row_q1_0: block = f16 d + 16 bytes; weight j is +d if bit
    j%8 of qs[j/8] is set, else -d."""
    b = raw.reshape(-1, 18)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)  # (nb, 1)
    bits = np.unpackbits(b[:, 2:], axis=1, bitorder="little").astype(bool)  # (nb, 128)
    return np.where(bits, d, -d).astype(np.float32).reshape(-1)


def dequant_q2_0(raw):
    """llama.cpp dequantize_row_q2_0: block = f16 d + 16 bytes; weight j has code
    (qs[j/4] >> 2*(j%4)) & 3 and value ((int)code - 1) * d."""
    b = raw.reshape(-1, 18)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    qs = b[:, 2:]
    codes = np.stack([(qs >> s) & 3 for s in (0, 2, 4, 6)], axis=2).reshape(-1, 64)
    return ((codes.astype(np.int32) - 1).astype(np.float32) * d).reshape(-1)


def dequant_any(ty, raw):
    if ty == 41:
        return dequant_q1_0(raw)
    if ty == 42:
        return dequant_q2_0(raw)
    return dequantize(raw, gguf.GGMLQuantizationType(ty)).astype(np.float32).reshape(-1)


# ----------------------------------------------------------- the vectors
def legacy_from_file(fixtures, name, file, tensor, rows):
    path = os.path.join(fixtures, file)
    ty, raw, n = first_rows(path, tensor, rows)
    assert ty == GGML_TYPE_ID[name], (name, ty)
    out = dequant_any(ty, raw)
    assert out.size == n
    src = f"{file}, tensor {tensor}, first {rows} rows"
    how = ("dequantized with the formula of llama.cpp's ggml-quants.c (this script)"
           if ty in (41, 42) else "dequantized with gguf-py's gguf.quants.dequantize")
    return raw, out, src, how


def legacy_quantized_here(fixtures, name, tensor, rows):
    path = os.path.join(fixtures, "tiny-llama-F32.gguf")
    ty, raw, n = first_rows(path, tensor, rows)
    assert ty == 0
    x = raw.view(np.float32).reshape(rows, -1)
    qt = gguf.GGMLQuantizationType[name]
    q = quantize(x, qt).reshape(-1).view(np.uint8)
    out = dequantize(q, qt).astype(np.float32).reshape(-1)
    src = (f"tiny-llama-F32.gguf, tensor {tensor}, first {rows} rows, quantized to {name} "
           "by gguf-py's gguf.quants.quantize (no fixture has this type)")
    return q, out, src, "dequantized with gguf-py's gguf.quants.dequantize"


def iq4_nl_synthetic(fixtures, tensor, rows):
    """gguf-py 0.19 has no IQ4_NL quantizer (and no fixture has the type): blocks get the
    f16 scale amax/127 of the F32 rows and random indices (numpy seed 41), which
    exercises every table entry; gguf-py dequantizes them."""
    path = os.path.join(fixtures, "tiny-llama-F32.gguf")
    _, raw, n = first_rows(path, tensor, rows)
    x = raw.view(np.float32).reshape(-1, 32)
    d = (np.abs(x).max(axis=1, keepdims=True) / 127).astype(np.float16).view(np.uint8)
    qs = np.random.default_rng(41).integers(0, 256, size=(x.shape[0], 16), dtype=np.uint8)
    q = np.concatenate([d, qs], axis=1).reshape(-1)
    out = dequantize(q, gguf.GGMLQuantizationType.IQ4_NL).astype(np.float32).reshape(-1)
    src = (f"synthetic: scale = f16(amax/127) of {tensor} rows 0..{rows} of tiny-llama-F32.gguf, "
           "random indices (numpy default_rng(41))")
    return q, out, src, "dequantized with gguf-py's gguf.quants.dequantize"


# name -> producer; rows of 256 weights: 8 rows = 2048 values = 8 KiB of f32 each.
LEGACY = {
    "F16": lambda fx: legacy_from_file(fx, "F16", "tiny-llama-F16.gguf", "blk.0.attn_k.weight", 8),
    "Q8_0": lambda fx: legacy_from_file(fx, "Q8_0", "tiny-llama-Q8_0.gguf", "blk.0.attn_k.weight", 8),
    "Q4_0": lambda fx: legacy_from_file(fx, "Q4_0", "tiny-llama-Q4_0.gguf", "blk.0.attn_k.weight", 8),
    "Q5_0": lambda fx: legacy_from_file(fx, "Q5_0", "tiny-llama-Q5_0.gguf", "blk.0.attn_k.weight", 8),
    "Q1_0": lambda fx: legacy_from_file(fx, "Q1_0", "tiny-llama-Q1_0.gguf", "blk.0.attn_k.weight", 8),
    "Q2_0": lambda fx: legacy_from_file(fx, "Q2_0", "tiny-llama-Q2_0.gguf", "blk.0.attn_k.weight", 8),
    "TQ1_0": lambda fx: legacy_from_file(fx, "TQ1_0", "tiny-llama-TQ1_0.gguf", "blk.0.attn_k.weight", 8),
    "TQ2_0": lambda fx: legacy_from_file(fx, "TQ2_0", "tiny-llama-TQ2_0.gguf", "blk.0.attn_k.weight", 8),
    "Q4_1": lambda fx: legacy_quantized_here(fx, "Q4_1", "blk.0.attn_k.weight", 8),
    "Q5_1": lambda fx: legacy_quantized_here(fx, "Q5_1", "blk.0.attn_k.weight", 8),
    "IQ4_NL": lambda fx: iq4_nl_synthetic(fx, "blk.0.attn_k.weight", 8),
    "BF16": lambda fx: legacy_quantized_here(fx, "BF16", "blk.0.attn_k.weight", 8),
}


def sanity_vs_f32(fixtures, values, tensor, rows):
    """Relative RMS error against the F32 original: catches a wrong layout (which would
    give an error near or above 1) without being part of the test itself."""
    _, raw, _ = first_rows(os.path.join(fixtures, "tiny-llama-F32.gguf"), tensor, rows)
    x = raw.view(np.float32)
    return float(np.sqrt(np.mean((x - values) ** 2) / np.mean(x ** 2)))


def main():
    fixtures = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/fixtures"
    root = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "tests", "data")
    out_dir = os.path.join(root, "legacy")
    os.makedirs(out_dir, exist_ok=True)
    lines = []
    for name, make in LEGACY.items():
        raw, vals, src, how = make(fixtures)
        raw.tofile(os.path.join(out_dir, f"{name}.bin"))
        vals.astype("<f4").tofile(os.path.join(out_dir, f"{name}.f32"))
        err = sanity_vs_f32(fixtures, vals, "blk.0.attn_k.weight", 8)
        print(f"{name:7s} {raw.size:6d} bytes -> {vals.size} values, rel. RMS vs F32 {err:.3f}")
        lines.append(f"| {name} | {src} | {how} | {raw.size} | {err:.3f} |")
    print("\nrows for the table in data/legacy/README.md:")
    print("\n".join(lines))

if __name__ == "__main__" and not {"--kquant", "--iq4xs"} & set(sys.argv):  # see the sections below
    main()


# ================================================================= K-quants
# Added by the K-quant kernels (kernels/src/quant/q{2..6}_k.rs, q8_k.rs). Kept apart from
# the legacy code above: run `python3 tools/gen_dequant_vectors.py --kquant [FIXTURES]
# [OUT_ROOT]` to (re)write kernels/tests/data/kquant/ only.
KQUANT_ID = {"Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
GEOMETRY.update({10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210)})

# name -> (fixture file, tensor, rows); every row of these tensors is one 256-weight block.
KQUANT = {
    "Q2_K": ("tiny-llama-Q2_K.gguf", "blk.0.attn_k.weight", 16),
    "Q3_K": ("tiny-llama-Q3_K_S.gguf", "blk.0.attn_k.weight", 16),
    "Q4_K": ("tiny-llama-Q4_K_M.gguf", "blk.0.attn_k.weight", 16),
    "Q5_K": ("tiny-llama-IQ2_XXS.gguf", "output.weight", 16),
    "Q6_K": ("tiny-llama-Q6_K.gguf", "blk.0.attn_k.weight", 16),
}


def q8_k_ref_numpy(x):
    """Independent numpy port of llama.cpp's quantize_row_q8_K_ref (ggml-quants.c): per
    256 values, max = signed value of largest |x| (first on ties), iscale = -127/max in
    f32, q = min(127, round_half_even(f32(iscale * x))), d = f32(1 / iscale), bsums =
    sums of 16-quant groups. Returns the Q8_K bytes (292 per block)."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, 256)
    out = bytearray()
    for blk in x:
        a = np.abs(blk)
        j = int(np.argmax(a))  # argmax returns the first maximum, like the strict `>` scan
        if a[j] == 0:
            out += bytes(292)
            continue
        iscale = np.float32(-127.0) / blk[j]
        v = np.rint((iscale * blk).astype(np.float32)).astype(np.int32)
        q = np.minimum(127, v).astype(np.int8)
        bs = q.reshape(16, 16).astype(np.int32).sum(axis=1).astype("<i2")
        out += struct.pack("<f", float(np.float32(1.0) / iscale)) + q.tobytes() + bs.tobytes()
    return np.frombuffer(bytes(out), dtype=np.uint8)


def kquant_vectors(fixtures, out_dir):
    lines = []
    for name, (file, tensor, rows) in KQUANT.items():
        ty, raw, n = first_rows(os.path.join(fixtures, file), tensor, rows)
        assert ty == KQUANT_ID[name], (name, ty)
        vals = dequantize(raw, gguf.GGMLQuantizationType(ty)).astype(np.float32).reshape(-1)
        assert vals.size == n
        raw.tofile(os.path.join(out_dir, f"{name}.bin"))
        vals.astype("<f4").tofile(os.path.join(out_dir, f"{name}.f32"))
        err = sanity_vs_f32(fixtures, vals, tensor, rows)
        print(f"{name:5s} {raw.size:6d} bytes -> {vals.size} values, rel. RMS vs F32 {err:.3f}")
        lines.append(f"| {name} | {file} | {tensor} | first {rows} rows | {raw.size} | {err:.3f} |")
    # Q8_K: gguf-py has no Q8_K quantizer, so the expected bytes come from the numpy port
    # above. Input: 4 rows of blk.0.ffn_up.weight of the F32 fixture scaled by 37 (an
    # activation-like magnitude), plus 2 crafted blocks: exact .5 ties after scaling, a
    # negative extreme before a positive one of equal magnitude, and an all-zero block.
    _, raw, _ = first_rows(os.path.join(fixtures, "tiny-llama-F32.gguf"), "blk.0.ffn_up.weight", 4)
    x = raw.view(np.float32) * np.float32(37.0)
    ties = (np.arange(256, dtype=np.float32) - 128) * np.float32(0.5)  # iscale*x hits k+0.5
    ties[10] = np.float32(-127.0)
    ties[200] = np.float32(127.0)
    zeros = np.zeros(256, dtype=np.float32)
    x = np.concatenate([x, ties, zeros]).astype(np.float32)
    x.astype("<f4").tofile(os.path.join(out_dir, "Q8_K.input.f32"))
    q8_k_ref_numpy(x).tofile(os.path.join(out_dir, "Q8_K.bin"))
    lines.append(f"| Q8_K | tiny-llama-F32.gguf | blk.0.ffn_up.weight x 37 (+2 crafted blocks) | 4+2 rows | {x.size // 256 * 292} | - |")
    print("\n".join(lines))  # rows for data/kquant/README.md


def main_kquant(argv):
    fixtures = argv[0] if argv else "/work/shared/fixtures"
    root = argv[1] if len(argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "tests", "data")
    out_dir = os.path.join(root, "kquant")
    os.makedirs(out_dir, exist_ok=True)
    kquant_vectors(fixtures, out_dir)


if __name__ == "__main__" and "--kquant" in sys.argv:
    main_kquant([a for a in sys.argv[1:] if a != "--kquant"])


# ================================================================= IQ4_XS
# Added with kernels/src/quant/iq4_xs.rs. No fixture holds IQ4_XS, so llama.cpp itself
# (llama-cpp-python 0.3.36 = commit 0c1e570, `llama_model_quantize`, ftype 30 =
# LLAMA_FTYPE_MOSTLY_IQ4_XS) quantizes tiny-llama-F32.gguf, then dequantizes that file
# back to F32 (allow_requantize, ftype 0: ggml's `dequantize_row_iq4_xs`). The .f32 values
# are llama.cpp's; gguf-py's numpy port is checked to agree bit for bit. Run
# `python3 tools/gen_dequant_vectors.py --iq4xs [FIXTURES] [OUT_ROOT]` with
# llama-cpp-python on PYTHONPATH to (re)write kernels/tests/data/kquant/IQ4_XS.* only.
GEOMETRY[23] = (256, 136)


def iq4_xs_vectors(fixtures, out_dir, rows=16, tensor="blk.0.attn_k.weight"):
    import tempfile  # noqa: PLC0415
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gen_random  # noqa: PLC0415  (llama.cpp's quantizer, AMX kept off)
    src = os.path.join(fixtures, "tiny-llama-F32.gguf")
    with tempfile.TemporaryDirectory() as tmp:
        q, d = os.path.join(tmp, "IQ4_XS.gguf"), os.path.join(tmp, "IQ4_XS.dequant.gguf")
        assert gen_random.quantize(src, q, 30), "llama.cpp refused IQ4_XS"
        assert gen_random.quantize(q, d, 0, requantize=True), "llama.cpp cannot dequantize"
        ty, raw, n = first_rows(q, tensor, rows)
        assert ty == 23, f"{tensor} is type {ty}, not IQ4_XS"
        fty, fraw, fn = first_rows(d, tensor, rows)
        assert fty == 0 and fn == n
    vals = fraw.view("<f4")
    port = dequantize(raw, gguf.GGMLQuantizationType(23)).astype(np.float32).reshape(-1)
    assert np.array_equal(port.view(np.uint32), vals.view(np.uint32)), "gguf-py disagrees"
    raw.tofile(os.path.join(out_dir, "IQ4_XS.bin"))
    vals.astype("<f4").tofile(os.path.join(out_dir, "IQ4_XS.f32"))
    err = sanity_vs_f32(fixtures, vals, tensor, rows)
    print(f"| IQ4_XS | tiny-llama-F32.gguf quantized by llama.cpp | {tensor} | first {rows} rows | {raw.size} | {err:.3f} |")


if __name__ == "__main__" and "--iq4xs" in sys.argv:
    args = [a for a in sys.argv[1:] if a != "--iq4xs"]
    fixtures = args[0] if args else "/work/shared/fixtures"
    root = args[1] if len(args) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "tests", "data")
    iq4_xs_vectors(fixtures, os.path.join(root, "kquant"))
