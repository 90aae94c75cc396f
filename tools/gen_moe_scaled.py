#!/usr/bin/env python3
"""A scaled random-weight MoE model with Q2_K experts for the expert pager (issue 13).

Shaped like Qwen3-MoE (`qwen3moe`): n_embd 2048, 16 layers, all MoE; 16/4 heads x 128
with qk-norm; 64 experts of width 768 per layer, softmax router, top-8, weights
renormalised; untied output; vocab 8192. The experts are Q2_K (1.55 MiB per expert,
1.5 GiB in all), the rest Q8_0: about 1.8 GB on disk.

The file is written block by block, never from a float source (a float copy of a
2 GB Q2_K model would need ~20 GB): each Q2_K block gets random 2-bit quants and 4-bit
scales/mins from numpy (PCG64, seed 2026) and d / dmin chosen so that the weights
have mean ~0 and the std a random float matrix of that width would have (dmin = 1.5 d
cancels the mean of d * scale * q). Every block is a valid Q2_K block, so the model is
a valid random-weight Q2_K model; Q8_0 blocks likewise: random int8 with d = std / 73.
llama.cpp (llama-cpp-python 0.3.36) loads it, and its greedy tokens after the prompt
"T" are pinch's for the first five, then part: with top-8 routing over 64 close
router scores, last-bit differences flip a pick now and then and the text drifts.

Expert popularity is skewed like a real router's: each router row has its own scale,
calibrated by Monte Carlo on Gaussian inputs so that expert r's chance of being in a
token's top 8 follows Zipf (1 / r^ZIPF, capped at 0.9), with the ranks shuffled per
layer. The attention and expert output projections are scaled down (RESID) so that
one layer changes the residual stream by a fraction of its size, as in real models;
that is what lets the next layer's router, applied to this layer's input, guess the
next layer's picks (pre-gated prefetch).

    python3 tools/gen_moe_scaled.py OUT_DIR   # OUT_DIR/moe-scaled-Q2_K.gguf
    python3 tools/gen_moe_scaled.py OUT_DIR --layers 4   # moe-scaled-4l-Q2_K.gguf
    python3 tools/gen_moe_scaled.py OUT_DIR --tiny   # moe-tiny-Q2_K.gguf

`cargo xtask bench --moe-scaled` makes it on first use (in .cache/, never committed).
`--layers N` keeps the shapes and writes N layers (instruction counts under qemu);
`--tiny` writes the same design at test size (n_embd 256, 2 layers of 8 experts of
width 256, top-2, 4/2 heads x 64, vocab 512, every expert matrix Q2_K: 1.4 MB), the
fixture `tests/data/tiny/tiny-qwen3moe-Q2_K.gguf` of the expert pager's repacked-slot
tests. Needs numpy and gguf (gguf-py).
"""
import sys
from pathlib import Path

import numpy as np
import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_moe_bench  # noqa: E402
import gen_tiny  # noqa: E402

ARCH = "qwen3moe"
N_EMBD, N_LAYER, N_HEAD, N_KV, HD = 2048, 16, 16, 4, 128
N_EXP, N_USED, FF_EXP = 64, 8, 768
N_VOCAB, CTX = 8192, 4096
ZIPF, P_MAX = 1.0, 0.9
RESID = 0.35
Q = gguf.GGMLQuantizationType


def q2_k(rng, rows, cols, std):
    """`rows` x `cols` random Q2_K weights of about `std`: bytes (rows, cols/256*84)."""
    nb = rows * (cols // 256)
    b = rng.integers(0, 256, size=(nb, 84), dtype=np.uint8)
    # w = d * (sc & 15) * q - dmin * (sc >> 4), q in 0..3, sc nibbles uniform in 0..15:
    # E[(sc & 15) q] = 11.25 and its std ~12.2; dmin = 1.5 d makes the mean ~0.
    d = (std / 12.2) * rng.uniform(0.8, 1.2, size=nb)
    dmin = 1.5 * d * rng.uniform(0.9, 1.1, size=nb)
    b[:, 80:82] = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
    b[:, 82:84] = dmin.astype(np.float16).view(np.uint8).reshape(nb, 2)
    return b.reshape(rows, cols // 256 * 84)


def q8_0(rng, rows, cols, std):
    nb = rows * (cols // 32)
    b = np.empty((nb, 34), dtype=np.uint8)
    b[:, 2:] = rng.integers(-127, 128, size=(nb, 32), dtype=np.int8).view(np.uint8)
    d = np.full(nb, std / 73.3, dtype=np.float16)
    b[:, :2] = d.view(np.uint8).reshape(nb, 2)
    return b.reshape(rows, cols // 32 * 34)


def router_scales(rng):
    """Per-expert row scales whose top-8 selection rates follow Zipf (rank order)."""
    want = 1.0 / np.arange(1, N_EXP + 1) ** ZIPF
    want = want * N_USED / want.sum()
    for _ in range(20):
        over = want > P_MAX
        if not over.any():
            break
        want[over] = P_MAX
        rest = ~over
        want[rest] *= (N_USED - want[over].sum()) / want[rest].sum()
    s = np.ones(N_EXP)
    z = rng.standard_normal((20000, N_EXP))
    for _ in range(60):
        top = np.argpartition(-(z * s), N_USED, axis=1)[:, :N_USED]
        got = np.bincount(top.ravel(), minlength=N_EXP) / len(z)
        s *= (want / np.maximum(got, 1e-4)) ** 0.3
        s /= s.mean()
    return s, want, got


def main(argv):
    global N_EMBD, N_LAYER, N_HEAD, N_KV, HD, N_EXP, N_USED, FF_EXP, N_VOCAB, CTX
    if len(argv) == 3 and argv[2] == "--tiny":
        N_EMBD, N_LAYER, N_HEAD, N_KV, HD = 256, 2, 4, 2, 64
        N_EXP, N_USED, FF_EXP = 8, 2, 256
        N_VOCAB, CTX = 512, 256
        name = "moe-tiny-Q2_K.gguf"
    elif len(argv) == 4 and argv[2] == "--layers":
        N_LAYER = int(argv[3])
        name = f"moe-scaled-{N_LAYER}l-Q2_K.gguf"
    elif len(argv) == 2:
        name = "moe-scaled-Q2_K.gguf"
    else:
        print(__doc__)
        return 2
    out = Path(argv[1]) / name
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2026)
    w = gguf.GGUFWriter(str(out), ARCH)
    w.add_name("moe-scaled-random")
    w.add_description("random-weight qwen3moe-shaped model, Q2_K experts (pinch issue 13)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q2_K)
    w.add_context_length(CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(FF_EXP)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    w.add_expert_count(N_EXP)
    w.add_expert_used_count(N_USED)
    w.add_expert_feed_forward_length(FF_EXP)
    w.add_vocab_size(N_VOCAB)
    # gen_moe_bench's byte-level vocabulary, at this file's size.
    gen_moe_bench.N_VOCAB = N_VOCAB
    gen_tiny.build_vocab = gen_moe_bench.vocab
    gen_tiny.add_vocab(w, ARCH)

    def q8(name, cols, rows, scale=1.0):
        w.add_tensor(name, q8_0(rng, rows, cols, scale / np.sqrt(cols)), raw_dtype=Q.Q8_0)

    def norm(name, n, mean=1.0):
        a = mean + 0.1 * mean * rng.standard_normal(n, dtype=np.float32)
        w.add_tensor(name, a.astype(np.float32))

    w.add_tensor("token_embd.weight", q8_0(rng, N_VOCAB, N_EMBD, 0.25), raw_dtype=Q.Q8_0)
    q8("output.weight", N_EMBD, N_VOCAB, 4.0)
    norm("output_norm.weight", N_EMBD)
    rates = []
    for i in range(N_LAYER):
        norm(f"blk.{i}.attn_norm.weight", N_EMBD)
        q8(f"blk.{i}.attn_q.weight", N_EMBD, N_HEAD * HD)
        q8(f"blk.{i}.attn_k.weight", N_EMBD, N_KV * HD)
        q8(f"blk.{i}.attn_v.weight", N_EMBD, N_KV * HD)
        q8(f"blk.{i}.attn_output.weight", N_HEAD * HD, N_EMBD, RESID)
        norm(f"blk.{i}.attn_q_norm.weight", HD)
        norm(f"blk.{i}.attn_k_norm.weight", HD)
        norm(f"blk.{i}.ffn_norm.weight", N_EMBD)
        s, want, got = router_scales(rng)
        perm = rng.permutation(N_EXP)
        rates.append(got[np.argsort(perm)])
        r = rng.standard_normal((N_EXP, N_EMBD)).astype(np.float32) / np.sqrt(N_EMBD)
        r *= (2.0 * s[np.argsort(perm)])[:, None].astype(np.float32)
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", r.astype(np.float32))
        for name, cols, rows, std in (
            ("gate", N_EMBD, FF_EXP, 1.0),
            ("up", N_EMBD, FF_EXP, 1.0),
            ("down", FF_EXP, N_EMBD, RESID),
        ):
            data = q2_k(rng, N_EXP * rows, cols, std / np.sqrt(cols))
            w.add_tensor(f"blk.{i}.ffn_{name}_exps.weight",
                         data.reshape(N_EXP, rows, -1), raw_dtype=Q.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    top = np.sort(rates[0])[::-1]
    print(f"{out}: layer 0 selection rates (Monte Carlo), most to least popular: "
          + " ".join(f"{x:.3f}" for x in top[:8]) + " ... " + " ".join(f"{x:.4f}" for x in top[-4:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
