#!/usr/bin/env python3
"""A scaled random-weight MoE model for speed comparisons (not a test fixture).

Shaped like Ling-mini-2.0 (`bailingmoe2`, the seed's MoE model) at a size this machine
can hold: n_embd 1024, 8 layers (the first dense, as `leading_dense_block_count` 1),
16/4 heads x 64 with the fused `attn_qkv`, qk-norm, rope on 32 of 64 dims, 32 experts of
width 256 in 8 groups (4 kept), top-6, sigmoid router with a selection bias, weights
renormalised and x 2.5, one shared expert of width 256, untied output, vocab 32000.
About 290 M parameters, 69 M of them active per token.

Weights are random (numpy PCG64, seed 2024) with the scales of `gen_tiny.py`; the file
is written as F16, then quantized by llama.cpp's own quantizer (llama-cpp-python's
`llama_model_quantize`, default Q4_K_M mix) when SITE holds llama-cpp-python:

    python3 tools/gen_moe_bench.py OUT_DIR [SITE]
    # OUT_DIR/bench-moe-F16.gguf, and with SITE OUT_DIR/bench-moe-Q4_K_M.gguf

`cargo xtask bench --moe` runs it. Needs numpy and gguf (gguf-py).
"""
import sys
from pathlib import Path

import numpy as np
import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_tiny  # noqa: E402

ARCH = "bailingmoe2"
N_EMBD, N_LAYER, N_HEAD, N_KV, HD = 1024, 8, 16, 4, 64
N_FF, N_EXP, N_USED, FF_EXP, FF_SH = 2816, 32, 6, 256, 256
N_GROUP, N_GROUP_USED = 8, 4
N_VOCAB, CTX = 32000, 4096


def vocab():
    # A byte-level SentencePiece-style vocabulary: <unk>, <s>, </s>, 256 byte tokens,
    # then filler pieces (the bench feeds token ids, never text).
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += [f"\u2581t{i}" for i in range(N_VOCAB - len(toks))]
    types = [2, 3, 3] + [6] * 256 + [1] * (N_VOCAB - 259)
    scores = [-float(i) for i in range(N_VOCAB)]
    return toks, scores, types


def quantize(site, src, dst):
    import ctypes
    sys.path.insert(0, site)
    import llama_cpp
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p)) != 0:
        sys.exit(f"llama_model_quantize failed on {src}")
    print(dst)


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__)
        return 2
    out = Path(argv[1]) / "bench-moe-F16.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2024)
    w = gguf.GGUFWriter(str(out), ARCH)
    w.add_name("bench-moe-random")
    w.add_description("random-weight bailingmoe2-shaped model for speed comparisons")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(32)
    w.add_uint32(f"{ARCH}.leading_dense_block_count", 1)
    w.add_uint32(f"{ARCH}.vocab_size", N_VOCAB)
    w.add_expert_count(N_EXP)
    w.add_expert_used_count(N_USED)
    w.add_expert_feed_forward_length(FF_EXP)
    w.add_uint32(f"{ARCH}.expert_shared_feed_forward_length", FF_SH)
    w.add_expert_shared_count(1)
    w.add_expert_weights_scale(2.5)
    w.add_expert_weights_norm(True)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_uint32(f"{ARCH}.expert_group_count", N_GROUP)
    w.add_uint32(f"{ARCH}.expert_group_used_count", N_GROUP_USED)
    # gen_tiny's tokenizer keys, over this file's larger vocabulary (no BOS added).
    gen_tiny.build_vocab = vocab
    gen_tiny.add_vocab(w, ARCH)

    def mat(name, ne, scale=1.0, dtype=np.float16):
        shape = tuple(reversed(ne))
        a = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale / np.sqrt(ne[0]))
        w.add_tensor(name, a.astype(dtype))

    def norm(name, n, mean=1.0):
        a = mean + 0.1 * mean * rng.standard_normal(n, dtype=np.float32)
        w.add_tensor(name, a.astype(np.float32))

    qkv = N_HEAD * HD + 2 * N_KV * HD
    w.add_tensor("token_embd.weight",
                 (0.25 * rng.standard_normal((N_VOCAB, N_EMBD), dtype=np.float32)).astype(np.float16))
    mat("output.weight", (N_EMBD, N_VOCAB), 4.0)
    norm("output_norm.weight", N_EMBD)
    for i in range(N_LAYER):
        norm(f"blk.{i}.attn_norm.weight", N_EMBD)
        mat(f"blk.{i}.attn_qkv.weight", (N_EMBD, qkv))
        mat(f"blk.{i}.attn_output.weight", (N_HEAD * HD, N_EMBD))
        norm(f"blk.{i}.attn_q_norm.weight", HD)
        norm(f"blk.{i}.attn_k_norm.weight", HD)
        norm(f"blk.{i}.ffn_norm.weight", N_EMBD)
        if i == 0:
            mat(f"blk.{i}.ffn_gate.weight", (N_EMBD, N_FF))
            mat(f"blk.{i}.ffn_up.weight", (N_EMBD, N_FF))
            mat(f"blk.{i}.ffn_down.weight", (N_FF, N_EMBD))
            continue
        mat(f"blk.{i}.ffn_gate_inp.weight", (N_EMBD, N_EXP), 2.0, np.float32)
        w.add_tensor(f"blk.{i}.exp_probs_b.bias",
                     (0.05 * rng.standard_normal(N_EXP, dtype=np.float32)).astype(np.float32))
        mat(f"blk.{i}.ffn_gate_exps.weight", (N_EMBD, FF_EXP, N_EXP))
        mat(f"blk.{i}.ffn_up_exps.weight", (N_EMBD, FF_EXP, N_EXP))
        mat(f"blk.{i}.ffn_down_exps.weight", (FF_EXP, N_EMBD, N_EXP))
        mat(f"blk.{i}.ffn_gate_shexp.weight", (N_EMBD, FF_SH))
        mat(f"blk.{i}.ffn_up_shexp.weight", (N_EMBD, FF_SH))
        mat(f"blk.{i}.ffn_down_shexp.weight", (FF_SH, N_EMBD))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out)
    if len(argv) == 3:
        quantize(argv[2], out, out.with_name("bench-moe-Q4_K_M.gguf"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
