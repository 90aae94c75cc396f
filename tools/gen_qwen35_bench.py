#!/usr/bin/env python3
"""A scaled random-weight model shaped like Qwen3.5-0.8B, for speed comparisons (not a
test fixture: `cargo xtask bench --arch qwen35` generates it into a cache).

The shape is Qwen3.5-0.8B's text model as its published config gives it (llama.cpp
converts the same keys: `Qwen3_5TextModel` in convert_hf_to_gguf.py): n_embd 1024,
24 layers with full attention every 4th (18 Gated DeltaNet + 6 gated attention),
attention 8 query / 2 KV heads x 256 (q and its gate interleaved), rope on 64 of 256
dims (IMROPE sections 11/11/10), DeltaNet 16 key / 16 value heads x 128 with a 4-tap
conv, FFN 3584, tied embeddings, vocabulary 248320 (`--vocab N` reduces it). About
0.75 G parameters (0.25 G of them the tied embedding / head).

Weights are random (tools/gen_random.py's writer and scales, seed 35); the file is
written as F32, then quantized by llama.cpp's own quantizer (llama-cpp-python's
`llama_model_quantize`, Q4_K_M, with AMX denied as gen_random.py does), and the F32
file deleted:

    python3 tools/gen_qwen35_bench.py OUT_DIR [--vocab N]
    # OUT_DIR/bench-qwen35-Q4_K_M.gguf

Needs numpy, gguf and llama-cpp-python 0.3.36 on PYTHONPATH.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_random  # noqa: E402

SHAPE = {
    "arch": "qwen35", "n_embd": 1024, "n_vocab": 248320, "n_layer": 24, "tied": True,
    "add_bos": False, "rms_eps": 1e-6, "rope_base": 10000000.0, "n_ff": 3584,
    "n_head": 8, "n_head_kv": 2, "head_dim": 256, "rope_dims": 64,
    "full_attn_interval": 4, "ssm_groups": 16, "ssm_heads": 16, "ssm_state": 128,
}
Q4_K_M = 15


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--vocab"):
        print(__doc__)
        return 2
    shape = dict(SHAPE)
    if len(argv) == 4:
        shape["n_vocab"] = int(argv[3])
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    f32 = out / "bench-qwen35-F32.gguf"
    dst = out / "bench-qwen35-Q4_K_M.gguf"
    gen_random.CTX = 4096  # the bench runs pp512 / tg128 inside the trained context
    gen_random.write_model(shape, f32, 35)
    # gen_random.quantize denies AMX before llama.cpp's backend starts.
    ok = gen_random.quantize(f32, dst, Q4_K_M)
    f32.unlink()
    if not ok:
        sys.exit(f"llama_model_quantize failed on {f32}")
    print(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
