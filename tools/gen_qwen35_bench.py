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

    python3 tools/gen_qwen35_bench.py OUT_DIR [--vocab N] [--mtp | --mtp-oracle]
    # OUT_DIR/bench-qwen35-Q4_K_M.gguf

--mtp appends a random MTP ("nextn") block as blk.24 (tools/gen_mtp.py's mtp_block, drawn
after the trunk from the same stream and scaled like it; with nextn.shared_head_norm,
sharing token_embd and the tied head): OUT_DIR/bench-qwen35-mtp-Q4_K_M.gguf. Its drafts
are random guesses, so almost none is accepted: it measures the cost of drafting.

--mtp-oracle writes the same file with two changes (OUT_DIR/bench-qwen35-oracle-Q4_K_M.gguf):
every layer's mixer output (attn_output, ssm_out) and ffn_down, the MTP block's included,
is zero, so each residual stream stays the token's embedding and the trunk is a bigram
model (logits = head(output_norm(embed(x_p)))); and the MTP block is an oracle of it:
nextn.eh_proj = [I | 0] (passes the enorm(embed) half through), nextn.enorm gains 1,
nextn.shared_head_norm = output_norm's gains, so the block's guess for x_{p+1} is the
trunk's (nearly every draft is accepted, up to quantization rounding in near ties).
The zeros are written in F32 and stay zero in Q4_K_M.

Needs numpy, gguf and llama-cpp-python 0.3.36 on PYTHONPATH.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_random  # noqa: E402
import numpy as np  # noqa: E402

SHAPE = {
    "arch": "qwen35", "n_embd": 1024, "n_vocab": 248320, "n_layer": 24, "tied": True,
    "add_bos": False, "rms_eps": 1e-6, "rope_base": 10000000.0, "n_ff": 3584,
    "n_head": 8, "n_head_kv": 2, "head_dim": 256, "rope_dims": 64,
    "full_attn_interval": 4, "ssm_groups": 16, "ssm_heads": 16, "ssm_state": 128,
}
Q4_K_M = 15


def oracle(s, hook):
    """Wrap gen_mtp's MTP hook: zero every mixer output / ffn_down and make the block an
    oracle of the resulting bigram trunk (see the module doc)."""
    e, L = s["n_embd"], s["n_layer"]
    zero = ("attn_output.weight", "ssm_out.weight", "ffn_down.weight")

    def wrapped(w, g):
        hook(w, g)
        b = f"blk.{L}."
        gains = {n: a for n, a in g.tensors}["output_norm.weight"]
        for k, (name, a) in enumerate(g.tensors):
            if name.startswith("blk.") and name.endswith(zero):
                a = np.zeros_like(a)
            elif name == b + "nextn.eh_proj.weight":   # numpy (e, 2e): [I | 0]
                a = np.zeros_like(a)
                a[:, :e] = np.eye(e, dtype=np.float32)
            elif name == b + "nextn.enorm.weight":
                a = np.ones_like(a)
            elif name == b + "nextn.shared_head_norm.weight":
                a = gains.copy()
            else:
                continue
            g.tensors[k] = (name, a.astype(np.float32))
    return wrapped


def main(argv):
    args, shape, kind = [], dict(SHAPE), None
    it = iter(argv[1:])
    try:
        for a in it:
            if a == "--vocab":
                shape["n_vocab"] = int(next(it))
            elif a in ("--mtp", "--mtp-oracle") and kind is None:
                kind = a[2:]
            else:
                args.append(a)
    except (StopIteration, ValueError):
        args = []
    if len(args) != 1:
        print(__doc__)
        return 2
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    tag = {None: "", "mtp": "-mtp", "mtp-oracle": "-oracle"}[kind]
    f32 = out / f"bench-qwen35{tag}-F32.gguf"
    dst = out / f"bench-qwen35{tag}-Q4_K_M.gguf"
    gen_random.CTX = 4096  # the bench runs pp512 / tg128 inside the trained context
    extra = None
    if kind:
        import gen_mtp  # noqa: PLC0415
        shape.update(shnorm=True, mtp_embed=False, mtp_head=False)
        extra = gen_mtp.mtp_block(shape)
        if kind == "mtp-oracle":
            extra = oracle(shape, extra)
    gen_random.write_model(shape, f32, 35, extra=extra)
    # gen_random.quantize denies AMX before llama.cpp's backend starts.
    ok = gen_random.quantize(f32, dst, Q4_K_M)
    f32.unlink()
    if not ok:
        sys.exit(f"llama_model_quantize failed on {f32}")
    print(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
