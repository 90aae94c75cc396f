#!/usr/bin/env python3
"""A random-weight qwen3 model shaped like Bonsai-1.7B, in Q1_0, for speed comparisons
(not a test fixture; generated at bench time, never committed).

Bonsai-1.7B is Qwen3-1.7B's shape with 1-bit (Q1_0) weights: n_embd 2048, 28 layers,
FFN 6144, 16 query heads and 8 KV heads of 128, qk-norm, rope base 1e6, tied
embeddings (Qwen3-1.7B ties its head to token_embd), vocab 151936 (VOCAB below may be
given smaller, as `cargo xtask bench --bonsai` does not). About 1.7 G parameters.

Weights are random (numpy PCG64, seed 1701) with gen_tiny.py's scales; the file is
written as F16, then quantized by llama.cpp's own quantizer (llama-cpp-python's
`llama_model_quantize`, ftype 40 = LLAMA_FTYPE_MOSTLY_Q1_0, with the token embeddings
and head forced to Q1_0 too, as Bonsai has them; norms stay F32) with AMX denied
(tools/gen_random.py's deny_amx). An existing F16 file is reused:

    python3 tools/gen_bonsai_bench.py OUT_DIR SITE [VOCAB]
    # OUT_DIR/bonsai-F16.gguf (deleted by the caller) and OUT_DIR/bonsai-Q1_0.gguf

Needs numpy and gguf (gguf-py).
"""
import ctypes
import sys
from pathlib import Path

import numpy as np
import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_random  # noqa: E402
import gen_tiny  # noqa: E402

ARCH = "qwen3"
N_EMBD, N_LAYER, N_HEAD, N_KV, HD, N_FF = 2048, 28, 16, 8, 128, 6144
CTX = 4096
Q1_0 = 41  # GGML_TYPE_Q1_0


def vocab(n):
    # A byte-level SentencePiece-style vocabulary (<unk>, <s>, </s>, 256 bytes, filler
    # pieces): the bench feeds token ids and short ASCII prompts.
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += [f"\u2581t{i}" for i in range(n - len(toks))]
    types = [2, 3, 3] + [6] * 256 + [1] * (n - 259)
    scores = [-float(i) for i in range(n)]
    return toks, scores, types


def main(argv):
    if len(argv) not in (3, 4):
        print(__doc__)
        return 2
    n_vocab = int(argv[3]) if len(argv) == 4 else 151936
    out = Path(argv[1]) / "bonsai-F16.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.is_file():
        write_f16(out, n_vocab)
    sys.path.insert(0, argv[2])
    gen_random.deny_amx()
    import llama_cpp  # noqa: PLC0415
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = 40  # LLAMA_FTYPE_MOSTLY_Q1_0
    p.nthread = 2
    # Bonsai is 1-bit end to end: the (tied) embeddings and head in Q1_0 too, where
    # llama.cpp's default mix would make them Q6_K.
    p.token_embedding_type = Q1_0
    p.output_tensor_type = Q1_0
    dst = out.with_name("bonsai-Q1_0.gguf")
    if llama_cpp.llama_model_quantize(str(out).encode(), str(dst).encode(), ctypes.byref(p)) != 0:
        sys.exit(f"llama_model_quantize failed on {out}")
    print(dst)
    return 0


def write_f16(out, n_vocab):
    rng = np.random.default_rng(1701)
    w = gguf.GGUFWriter(str(out), ARCH)
    w.add_name("bench-bonsai-random")
    w.add_description("random-weight qwen3 model shaped like Bonsai-1.7B, for speed comparisons")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    w.add_vocab_size(n_vocab)
    gen_tiny.build_vocab = lambda: vocab(n_vocab)
    gen_tiny.add_vocab(w, ARCH)

    def mat(name, ne, scale=1.0):
        shape = tuple(reversed(ne))
        a = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale / np.sqrt(ne[0]))
        w.add_tensor(name, a.astype(np.float16))

    def norm(name, n, mean=1.0):
        a = mean + 0.1 * mean * rng.standard_normal(n, dtype=np.float32)
        w.add_tensor(name, a.astype(np.float32))

    # Tied head: small embeddings, a final norm gain ~3 (gen_random.py's tied scales).
    mat("token_embd.weight", (N_EMBD, n_vocab), 0.8)
    norm("output_norm.weight", N_EMBD, 3.0)
    for i in range(N_LAYER):
        norm(f"blk.{i}.attn_norm.weight", N_EMBD)
        mat(f"blk.{i}.attn_q.weight", (N_EMBD, N_HEAD * HD))
        mat(f"blk.{i}.attn_k.weight", (N_EMBD, N_KV * HD))
        mat(f"blk.{i}.attn_v.weight", (N_EMBD, N_KV * HD))
        mat(f"blk.{i}.attn_output.weight", (N_HEAD * HD, N_EMBD))
        norm(f"blk.{i}.attn_q_norm.weight", HD)
        norm(f"blk.{i}.attn_k_norm.weight", HD)
        norm(f"blk.{i}.ffn_norm.weight", N_EMBD)
        mat(f"blk.{i}.ffn_gate.weight", (N_EMBD, N_FF))
        mat(f"blk.{i}.ffn_up.weight", (N_EMBD, N_FF))
        mat(f"blk.{i}.ffn_down.weight", (N_FF, N_EMBD))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
