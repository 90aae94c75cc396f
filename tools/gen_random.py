#!/usr/bin/env python3
"""Random-SHAPE GGUF models and llama.cpp's logits for them (differential tests).

tools/gen_tiny.py writes one fixture per architecture, of one shape each; a bug of
another shape (a head_dim of 80, an odd FFN length, MQA, a vocabulary that is not a
multiple of 8, a partial rope, a layer pattern) hides behind it. This script draws
the shape from a seed instead, writes the model (F32, then quantized types made by
llama.cpp's own quantizer), and stores llama.cpp's logits next to it, so that
tests/tests/random_shapes.rs can compare pinch with llama.cpp on many shapes.

Usage (needs numpy + gguf, and llama-cpp-python 0.3.36 = llama.cpp 0c1e570 on
PYTHONPATH; `cargo xtask randshape` installs both and sets it):
    python3 gen_random.py OUT_ROOT SEED [SEED ...] [--set KEY=JSON ...] [--quants Q,Q]
(--set / --quants pin shape values or quant types, to narrow a failing seed down.)

For each seed, OUT_ROOT/<seed>/ gets
    F32.gguf, <Q>.gguf                  the model; Q = quantized types llama.cpp produced
    <Q>.dequant.gguf                    <Q> dequantized back to F32 by llama.cpp
                                        (`llama_model_quantize`, allow_requantize, F32)
    <F>.batched.f32, <F>.seq.f32        llama.cpp's logits for F in F32, <Q>, <Q>.dequant:
                                        all positions of one batched decode / one token
                                        per decode; raw little-endian f32, row-major,
                                        n_tokens x n_vocab
    meta.txt                            `key: values` lines for the Rust test
    meta.json                           the same plus the drawn shape, for people
llama.cpp runs with an F32 KV cache, flash attention off, one thread (the goldens'
`f32kv` config). A directory whose meta.txt exists is left alone when the same
GEN_VERSION made it (delete it to redo).

Shapes: the arch is ARCHS[seed % len(ARCHS)] (so consecutive seeds cover every arch);
everything else comes from numpy's PCG64 stream of the seed. A shape llama.cpp
refuses to load, or whose logits are not finite or are degenerate (constant rows, one
argmax everywhere), is printed with the reason and redrawn from the same stream. A
quant type llama-quantize refuses for the shape is printed and left out.

Weights are scaled as in gen_tiny.py (projections std 1/sqrt(fan_in), norm gains
~1, tied embeddings small with a final norm gain ~3), so logits have std ~2-4.
"""

import ctypes
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_tiny  # noqa: E402  (vocabulary and weight helpers)

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("needs the `gguf` package (pip install gguf)")

GEN_VERSION = 3     # bump when a change alters what a seed generates (3: qwen3 + Q1_0)
CTX = 256

ARCHS = ["llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "bailingmoe2", "qwen35", "lfm2"]

# Quant types (llama.cpp ftype names/ids) that may be drawn; llama.cpp decides per tensor
# what a shape allows (K-quant rows need 256 values, legacy ones 32; it falls back
# itself and refuses what it cannot do).
QUANTS = {
    "Q8_0": 7, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q4_K_M": 15, "Q4_K_S": 14,
    "Q5_K_M": 17, "Q6_K": 18, "Q3_K_S": 11, "Q2_K": 10, "F16": 1, "IQ4_NL": 25,
}
# Types added to every seed of some architectures on top of the two drawn ones (kept out
# of QUANTS so the other seeds draw what they drew before): Q1_0 (Bonsai's 1-bit
# format) on qwen3, Bonsai's architecture.
EXTRA_QUANTS = {"qwen3": ["Q1_0"]}
# Every type's llama.cpp ftype id (`--quants` may name any of them for any seed). IQ4_XS
# is pinned by xtask/src/randshape.rs on seeds of its own (`IQ4_SEEDS`), never drawn.
FTYPES = {**QUANTS, "Q1_0": 40, "IQ4_XS": 30}


# --------------------------------------------------------------------------
# shape
# --------------------------------------------------------------------------

def pick(rng, xs):
    return xs[int(rng.integers(len(xs)))]


def draw_heads(rng, max_q_dim):
    """(n_head, n_head_kv, head_dim): GQA ratios 1..4 and MQA, head_dim 32..256."""
    while True:
        hd = pick(rng, [32, 64, 96, 128, 160, 256, 80, 48])
        kind = pick(rng, ["mha", "gqa2", "gqa3", "gqa4", "mqa"])
        if kind == "mha":
            kv = int(rng.integers(1, 5))
            h = kv
        elif kind == "mqa":
            kv, h = 1, int(rng.integers(2, 9))
        else:
            r = int(kind[3])
            kv = int(rng.integers(1, 3))
            h = kv * r
        if h * hd <= max_q_dim:
            return h, kv, hd


def draw_ff(rng):
    """FFN length: a multiple of 32 (not of 256) or any odd-ish number."""
    if rng.random() < 0.6:
        return 32 * int(rng.integers(2, 25))
    return int(rng.integers(40, 700))


def draw_shape(rng, arch):
    s = {"arch": arch}
    s["n_embd"] = pick(rng, [256, 512]) if rng.random() < 0.4 else 32 * int(rng.integers(2, 17))
    while True:
        v = int(rng.integers(280, 1001))
        if v % 8:
            break
    s["n_vocab"] = v
    s["n_layer"] = int(rng.integers(1, 5))
    s["tied"] = bool(rng.random() < 0.5)
    s["add_bos"] = bool(rng.random() < 0.5)
    s["rms_eps"] = pick(rng, [1e-5, 1e-6])
    s["rope_base"] = pick(rng, [10000.0, 500000.0, 1000000.0])
    s["n_ff"] = draw_ff(rng)
    h, kv, hd = draw_heads(rng, 1024)
    s["n_head"], s["n_head_kv"], s["head_dim"] = h, kv, hd
    # llama.cpp wants head_dim = n_embd / n_head for llama, qwen2, lfm2 and bailingmoe2
    # (it refuses other q shapes)
    if arch in ("llama", "qwen2", "lfm2", "bailingmoe2"):
        s["head_dim"] = None  # = n_embd / n_head, no key_length key
        cands = [x for x in range(1, 9) if s["n_embd"] % x == 0 and 32 <= s["n_embd"] // x <= 256
                 and (s["n_embd"] // x) % 8 == 0]
        if cands:
            s["n_head"] = pick(rng, cands)
            n = s["n_head"]
            kvs = [x for x in range(1, n + 1) if n % x == 0 and (n // x <= 4 or x == 1)]
            s["n_head_kv"] = pick(rng, kvs)
    if arch == "gemma3":
        s["tied"] = bool(rng.random() < 0.7)
        s["swa"] = int(rng.integers(3, 17))
        s["swa_pattern"] = int(rng.integers(2, 5))  # 1 = no SWA layer: llama.cpp asserts
    if arch in ("qwen3moe", "bailingmoe2"):
        ne = int(rng.integers(2, 9))
        s["n_expert"] = ne
        s["n_expert_used"] = int(rng.integers(1, min(4, ne) + 1))
        s["expert_ff"] = draw_ff(rng)
    if arch == "bailingmoe2":
        s["tied"] = False  # llama.cpp requires output.weight for bailingmoe2
        ne = s["n_expert"]
        groups = [g for g in (1, 2, 4) if ne % g == 0 and ne // g >= 2] or [1]
        s["n_group"] = pick(rng, groups)
        # llama.cpp asserts n_group_used < n_group when there are groups
        s["n_group_used"] = int(rng.integers(1, s["n_group"])) if s["n_group"] > 1 else 1
        s["n_expert_used"] = min(s["n_expert_used"], s["n_group_used"] * (ne // s["n_group"]))
        s["leading_dense"] = int(rng.integers(0, s["n_layer"]))
        s["rope_dims"] = head_dim(s) // pick(rng, [1, 2])
        s["expert_scale"] = pick(rng, [1.0, 2.5])
    if arch == "qwen35":
        # at least one attention and one recurrent layer (llama.cpp asserts on a hybrid
        # cache without either)
        s["n_layer"] = max(s["n_layer"], 2)
        s["full_attn_interval"] = int(rng.integers(2, s["n_layer"] + 1))
        nk = int(rng.integers(1, 4))
        s["ssm_groups"] = nk
        s["ssm_heads"] = nk * int(rng.integers(1, 3))
        s["ssm_state"] = pick(rng, [32, 64, 128])
        s["rope_dims"] = s["head_dim"] // 4
    if arch == "lfm2":
        # at least one attention and one conv layer (llama.cpp asserts otherwise)
        s["n_layer"] = max(s["n_layer"], 2)
        kvs = [s["n_head_kv"] if rng.random() < 0.4 else 0 for _ in range(s["n_layer"])]
        at, conv = rng.choice(s["n_layer"], size=2, replace=False)
        kvs[int(at)], kvs[int(conv)] = s["n_head_kv"], 0
        s["kv_per_layer"] = kvs
        s["l_cache"] = 3
    if arch in EXTRA_QUANTS and "Q1_0" in EXTRA_QUANTS[arch]:
        # Q1_0 rows are whole blocks of 128: FFN lengths rounded up so that the drawn
        # n_embd decides alone whether llama-quantize can make Q1_0
        s["n_ff"] = -(-s["n_ff"] // 128) * 128
    s["n_tokens"] = int(rng.integers(24, 33))
    return s


def head_dim(s):
    return s["head_dim"] or s["n_embd"] // s["n_head"]


def n_params(s):
    e, hd, L = s["n_embd"], head_dim(s), s["n_layer"]
    attn = e * hd * (2 * s["n_head"] + 2 * s["n_head_kv"])
    ff = 3 * e * s["n_ff"] + 3 * e * s.get("expert_ff", 0) * s.get("n_expert", 0)
    return e * s["n_vocab"] * (1 if s["tied"] else 2) + L * (attn + ff)


def summary(s):
    """One short line: the shape as the result table shows it."""
    a = s["arch"]
    parts = [f"e{s['n_embd']}", f"L{s['n_layer']}", f"h{s['n_head']}/{s['n_head_kv']}x{head_dim(s)}",
             f"ff{s['n_ff']}", f"v{s['n_vocab']}", "tied" if s["tied"] else "untied",
             "bos" if s["add_bos"] else "nobos"]
    if a == "gemma3":
        parts.append(f"swa{s['swa']}/p{s['swa_pattern']}")
    if "n_expert" in s:
        parts.append(f"x{s['n_expert']}k{s['n_expert_used']}ff{s['expert_ff']}")
    if a == "bailingmoe2":
        parts.append(f"g{s['n_group']}/{s['n_group_used']} dense{s['leading_dense']} rot{s['rope_dims']}")
    if a == "qwen35":
        parts.append(f"fai{s['full_attn_interval']} dn{s['ssm_groups']}/{s['ssm_heads']}x{s['ssm_state']}")
    if a == "lfm2":
        parts.append("kv[" + ",".join(map(str, s["kv_per_layer"])) + "]")
    return " ".join(parts)


# --------------------------------------------------------------------------
# writer (tensor names and keys as gen_tiny.py and llama.cpp use them)
# --------------------------------------------------------------------------

def write_model(s, path, seed, extra=None):
    """`extra(w, g)`, when given, runs after the layers' tensors are drawn and before the
    vocabulary and the tensors are written: it may add keys and tensors (gen_mtp.py)."""
    a, e, V, L = s["arch"], s["n_embd"], s["n_vocab"], s["n_layer"]
    H, KV, HD, FF = s["n_head"], s["n_head_kv"], head_dim(s), s["n_ff"]
    w = gguf.GGUFWriter(str(path), a)
    g = gen_tiny.Gen(seed)
    w.add_name(f"random-{a}-{seed}")
    w.add_description("random-shape random-weight test model; weights are meaningless")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(CTX)
    w.add_embedding_length(e)
    w.add_block_count(L)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(s["kv_per_layer"] if a == "lfm2" else KV)
    w.add_layer_norm_rms_eps(s["rms_eps"])
    w.add_rope_freq_base(s["rope_base"])
    w.add_vocab_size(V)
    if s["head_dim"]:
        w.add_key_length(HD)
        w.add_value_length(HD)
    if "rope_dims" in s:
        w.add_rope_dimension_count(s["rope_dims"])
    elif a in ("llama", "qwen2"):
        w.add_rope_dimension_count(HD)

    # embedding + head, scaled so that logits have std ~2.4 (tied) / ~4 (untied) for
    # any n_embd (gen_tiny.embd's values at n_embd = 256)
    out_norm = "token_embd_norm.weight" if a == "lfm2" else "output_norm.weight"
    if s["tied"]:
        g.normal("token_embd.weight", (e, V), 0.8 / np.sqrt(e))
        g.norm(out_norm, e, mean=3.0)
    else:
        g.normal("token_embd.weight", (e, V), 0.25)
        g.mat("output.weight", (e, V), 4.0)
        g.norm(out_norm, e)

    def ffn(i, n_ff, suffix=""):
        g.mat(f"blk.{i}.ffn_gate{suffix}.weight", (e, n_ff))
        g.mat(f"blk.{i}.ffn_up{suffix}.weight", (e, n_ff))
        g.mat(f"blk.{i}.ffn_down{suffix}.weight", (n_ff, e))

    def attn(i, q_mult=1, qk_norm=True, bias=False, kv=KV):
        g.mat(f"blk.{i}.attn_q.weight", (e, H * HD * q_mult))
        g.mat(f"blk.{i}.attn_k.weight", (e, kv * HD))
        g.mat(f"blk.{i}.attn_v.weight", (e, kv * HD))
        if bias:
            g.normal(f"blk.{i}.attn_q.bias", (H * HD,), 0.2)
            g.normal(f"blk.{i}.attn_k.bias", (kv * HD,), 0.2)
            g.normal(f"blk.{i}.attn_v.bias", (kv * HD,), 0.2)
        g.mat(f"blk.{i}.attn_output.weight", (H * HD, e))
        if qk_norm:
            g.norm(f"blk.{i}.attn_q_norm.weight", HD)
            g.norm(f"blk.{i}.attn_k_norm.weight", HD)

    def experts(i):
        NE, FFE = s["n_expert"], s["expert_ff"]
        g.mat(f"blk.{i}.ffn_gate_inp.weight", (e, NE), 2.0)
        g.mat(f"blk.{i}.ffn_gate_exps.weight", (e, FFE, NE))
        g.mat(f"blk.{i}.ffn_up_exps.weight", (e, FFE, NE))
        g.mat(f"blk.{i}.ffn_down_exps.weight", (FFE, e, NE))

    if a in ("qwen3moe", "bailingmoe2"):
        w.add_expert_count(s["n_expert"])
        w.add_expert_used_count(s["n_expert_used"])
        w.add_expert_feed_forward_length(s["expert_ff"])

    if a == "gemma3":
        w.add_sliding_window(s["swa"])
        w.add_sliding_window_pattern(s["swa_pattern"])
        w.add_add_space_prefix(False)
    if a == "bailingmoe2":
        w.add_leading_dense_block_count(s["leading_dense"])
        w.add_expert_shared_feed_forward_length(s["expert_ff"])
        w.add_expert_shared_count(1)
        w.add_expert_weights_scale(s["expert_scale"])
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_group_count(s["n_group"])
        w.add_expert_group_used_count(s["n_group_used"])
    if a == "qwen35":
        n = s["rope_dims"] // 2
        w.add_rope_dimension_sections([n - 2 * (n // 3), n // 3, n // 3, 0])
        w.add_ssm_conv_kernel(4)
        w.add_ssm_state_size(s["ssm_state"])
        w.add_ssm_group_count(s["ssm_groups"])
        w.add_ssm_time_step_rank(s["ssm_heads"])
        w.add_ssm_inner_size(s["ssm_state"] * s["ssm_heads"])
        w.add_full_attention_interval(s["full_attn_interval"])
    if a == "lfm2":
        w.add_shortconv_l_cache(s["l_cache"])

    for i in range(L):
        g.norm(f"blk.{i}.attn_norm.weight", e)
        if a == "llama":
            attn(i, qk_norm=False)
        elif a == "qwen2":
            attn(i, qk_norm=False, bias=True)
        elif a in ("qwen3", "qwen3moe"):
            attn(i)
        elif a == "gemma3":
            attn(i)
            g.norm(f"blk.{i}.post_attention_norm.weight", e, mean=4.0)
        elif a == "bailingmoe2":
            g.mat(f"blk.{i}.attn_qkv.weight", (e, H * HD + 2 * KV * HD))
            g.mat(f"blk.{i}.attn_output.weight", (H * HD, e))
            g.norm(f"blk.{i}.attn_q_norm.weight", HD)
            g.norm(f"blk.{i}.attn_k_norm.weight", HD)
        elif a == "qwen35":
            g.norm(f"blk.{i}.post_attention_norm.weight", e)
            if (i + 1) % s["full_attn_interval"] != 0:
                nk, nv, dk = s["ssm_groups"], s["ssm_heads"], s["ssm_state"]
                conv_dim = 2 * nk * dk + nv * dk
                g.mat(f"blk.{i}.attn_qkv.weight", (e, conv_dim))
                g.mat(f"blk.{i}.attn_gate.weight", (e, nv * dk))
                g.normal(f"blk.{i}.ssm_conv1d.weight", (4, conv_dim), 0.3)
                g.normal(f"blk.{i}.ssm_dt.bias", (nv,), 0.5, mean=-2.0)
                g.raw(f"blk.{i}.ssm_a", -np.exp(g.rng.uniform(np.log(0.02), np.log(2.0), nv)))
                g.mat(f"blk.{i}.ssm_beta.weight", (e, nv))
                g.mat(f"blk.{i}.ssm_alpha.weight", (e, nv))
                g.norm(f"blk.{i}.ssm_norm.weight", dk)
                g.mat(f"blk.{i}.ssm_out.weight", (nv * dk, e))
            else:
                attn(i, q_mult=2)
        elif a == "lfm2":
            kv = s["kv_per_layer"][i]
            if kv == 0:
                g.normal(f"blk.{i}.shortconv.conv.weight", (s["l_cache"], e), 0.4)
                g.mat(f"blk.{i}.shortconv.in_proj.weight", (e, 3 * e))
                g.mat(f"blk.{i}.shortconv.out_proj.weight", (e, e))
            else:
                attn(i, kv=kv)
        if a != "qwen35":
            g.norm(f"blk.{i}.ffn_norm.weight", e)
        if a == "qwen3moe":
            experts(i)
        elif a == "bailingmoe2" and i >= s["leading_dense"]:
            experts(i)
            g.normal(f"blk.{i}.exp_probs_b.bias", (s["n_expert"],), 0.1)
            ffn(i, s["expert_ff"], "_shexp")
        else:
            ffn(i, FF)
        if a == "gemma3":
            g.norm(f"blk.{i}.post_ffw_norm.weight", e, mean=4.0)
    if extra:
        extra(w, g)

    toks, scores, types = gen_tiny.build_vocab(V)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(s["add_bos"])
    w.add_add_eos_token(False)
    for name, arr in g.tensors:
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# --------------------------------------------------------------------------
# llama.cpp
# --------------------------------------------------------------------------

_LLAMA = []


def no_extra_bufts():
    """Load every model without llama.cpp's "extra buffer types" (AMX, CPU_REPACK).

    Some llama-cpp-python builds on these VMs crash in a multi-token llama_decode with
    them on (SIGSEGV/SIGILL in ggml_backend_amx_mul_mat); the plain CPU path is
    llama.cpp's reference computation anyway. Call before the first model is loaded.
    """
    import llama_cpp  # noqa: PLC0415
    import llama_cpp.llama  # noqa: PLC0415
    default = llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama_model_default_params = params
    llama_cpp.llama.llama_cpp.llama_model_default_params = params


def deny_amx():
    """Make this process's request for AMX tile state fail, so ggml runs without AMX.

    llama-cpp-python built natively on an AMX-capable x86 VM segfaults in
    ggml_backend_amx_mul_mat on every quantized model. ggml enables AMX only if
    arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) succeeds; a seccomp filter makes
    that one call fail with EPERM (everything else is allowed), and llama.cpp keeps its
    other CPU paths, including CPU_REPACK, as on the machine that made the goldens
    (no AMX): the tiny goldens are then reproduced bit for bit.
    """
    import platform  # noqa: PLC0415
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return

    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte),
                    ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]

    ld, jeq, ret = 0x20, 0x15, 0x06           # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
    nr_arch_prctl, req_xcomp_perm = 158, 0x1023
    allow, eperm = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO|EPERM
    code = (Insn * 6)(
        Insn(ld, 0, 0, 0),                     # syscall number
        Insn(jeq, 0, 3, nr_arch_prctl),
        Insn(ld, 0, 0, 16),                    # first argument (low 32 bits)
        Insn(jeq, 0, 1, req_xcomp_perm),
        Insn(ret, 0, 0, eperm),
        Insn(ret, 0, 0, allow))
    prog = Prog(len(code), code)
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if (libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0
            or libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(prog), 0, 0) != 0):
        sys.exit(f"cannot install the seccomp filter that keeps ggml off AMX (errno {ctypes.get_errno()})")


def llama():
    """The llama_cpp module, imported (and its backend initialised) on first use."""
    if not _LLAMA:
        deny_amx()
        import llama_cpp  # noqa: PLC0415  (only when running llama.cpp)
        from llama_cpp import _logger
        _logger.set_verbose(False)
        llama_cpp.llama_backend_init()
        os.environ["GGML_NO_BACKTRACE"] = "1"  # an abort must not start gdb
        _LLAMA.append(llama_cpp)
    return _LLAMA[0]


def quantize(src, dst, ftype, requantize=False):
    """llama.cpp's quantizer; False (llama.cpp printed why) when it refuses."""
    lc = llama()
    p = lc.llama_model_quantize_default_params()
    p.ftype = ftype
    p.nthread = 2
    p.allow_requantize = requantize
    return lc.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p)) == 0


def in_child(path, compute, tag):
    """`compute()` (bytes) for the model `path` in a forked child whose output goes to
    `path` with the suffix `.log`:
    llama.cpp crashes on some shapes (e.g. a segfault decoding a Q8_0 matrix of 319
    rows) and that must cost one file, not the whole run. Raises RuntimeError saying
    what happened (the log's error lines, and those `tag` printed) when there is no
    result; the log is removed when there is.
    """
    log = path.with_suffix(".log")
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: compute, send the bytes, leave without cleanup
        os.close(r)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        code = 1
        try:
            data = compute()
            with os.fdopen(wfd, "wb") as f:
                f.write(data)
            code = 0
        except Exception as e:  # llama.cpp refused the file (its log says why)
            print(f"{tag}: {e}", file=sys.stderr, flush=True)
        os._exit(code)
    os.close(wfd)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0:
        what = (f"crashed (signal {os.WTERMSIG(status)})" if os.WIFSIGNALED(status)
                else "refused")
        lines = log.read_text(errors="replace").splitlines()
        why = [x.strip() for x in lines
               if any(w in x.lower() for w in ("error", "assert", tag.lower()))]
        raise RuntimeError(f"llama.cpp {what} on {path.name}: {' | '.join(why[-2:]) or '?'}")
    log.unlink()
    return data


def logits(path, tokens, batched):
    """llama.cpp's logits of every position (f32kv config: F32 KV, no flash attention),
    computed in a forked child (`in_child`)."""
    lc = llama()
    n = len(tokens)

    def compute():
        llm = lc.Llama(model_path=str(path), n_ctx=CTX, n_batch=CTX, n_ubatch=CTX,
                       logits_all=True, type_k=0, type_v=0, flash_attn=False,
                       n_threads=1, n_threads_batch=1, verbose=True)
        if batched:
            llm.eval(tokens)
        else:
            for t in tokens:
                llm.eval([t])
        return np.array(llm.scores[:n], dtype=np.float32).tobytes()

    data = in_child(path, compute, "llama-cpp-python")
    return np.frombuffer(data, dtype=np.float32).reshape(n, -1)


def degenerate(rows):
    """Why llama.cpp's logits are useless for a comparison, or None."""
    if not np.all(np.isfinite(rows)):
        return "non-finite logits"
    std = rows.std(axis=1)
    if std.min() < 0.3:
        return f"a logits row is nearly constant (std {std.min():.3g})"
    if len(set(rows.argmax(axis=1).tolist())) < 2:
        return "the same argmax at every position"
    return None


def draw_tokens(rng, s):
    ids = [int(x) for x in rng.integers(3, s["n_vocab"], size=s["n_tokens"])]
    if s["add_bos"]:
        ids[0] = 1
    return ids


def generate(root, seed, overrides=None, quant_names=None):
    """Model, quantized files and llama.cpp's logits of `seed` into ROOT/<seed>/.

    `overrides` (shape keys -> values) replace drawn values and `quant_names` the drawn
    quant types, to pin one shape down while chasing a bug; such a directory is always
    regenerated.
    """
    out = Path(root) / str(seed)
    if (overrides or quant_names) and out.is_dir():
        for f in out.iterdir():
            f.unlink()
    if (out / "meta.txt").exists():
        made = json.loads((out / "meta.json").read_text()).get("gen_version")
        if made == GEN_VERSION:
            print(f"seed {seed}: cached in {out}")
            return True
        for f in out.iterdir():  # another generator version made it
            f.unlink()
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([GEN_VERSION, seed])
    arch = ARCHS[seed % len(ARCHS)]
    for attempt in range(20):
        s = draw_shape(rng, arch)
        s.update(overrides or {})
        if n_params(s) > 3_000_000:
            continue  # keep the step fast: redraw silently, nothing was refused
        tokens = draw_tokens(rng, s)
        f32 = out / "F32.gguf"
        write_model(s, f32, seed * 100 + attempt)
        try:
            rows = {"F32": (logits(f32, tokens, True), logits(f32, tokens, False))}
        except RuntimeError as e:  # llama.cpp refused the file; it logged why above
            print(f"seed {seed} attempt {attempt}: {summary(s)}: {e}; redrawing")
            continue
        why = degenerate(rows["F32"][0])
        if why:
            print(f"seed {seed} attempt {attempt}: {summary(s)}: {why}; redrawing")
            continue
        break
    else:
        print(f"seed {seed}: no usable shape in 20 attempts")
        return False
    names = list(QUANTS)
    extra = EXTRA_QUANTS.get(arch, [])
    chosen = quant_names or [names[(seed + k * 5) % len(names)] for k in range(2)] + extra
    quants, refused = [], []
    for q in chosen:
        qf, df = out / f"{q}.gguf", out / f"{q}.dequant.gguf"
        if not quantize(f32, qf, FTYPES[q]):
            refused.append(q)
            print(f"seed {seed}: llama-quantize refuses {q} for {summary(s)}")
            continue
        if not quantize(qf, df, 0, requantize=True):
            sys.exit(f"seed {seed}: llama-quantize cannot dequantize {qf}")
        try:
            got = {q: (logits(qf, tokens, True), logits(qf, tokens, False)),
                   q + ".dequant": (logits(df, tokens, True), logits(df, tokens, False))}
        except RuntimeError as e:
            refused.append(q)
            print(f"seed {seed}: {q} dropped: {e} ({summary(s)})")
            continue
        rows.update(got)
        quants.append(q)
    meta = {"seed": seed, "gen_version": GEN_VERSION, "shape": s, "summary": summary(s),
            "tokens": tokens, "n_vocab": s["n_vocab"], "quants": quants, "refused": refused,
            "batched_vs_seq": {}}
    for name, (b, q) in rows.items():
        b.tofile(out / f"{name}.batched.f32")
        q.tofile(out / f"{name}.seq.f32")
        meta["batched_vs_seq"][name] = float(np.abs(b - q).max())
        if name in quants:
            meta.setdefault("quant_vs_dequant", {})[name] = float(np.abs(b - rows[name + ".dequant"][0]).max())
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    lines = [f"seed: {seed}", f"arch: {arch}", f"summary: {summary(s)}",
             f"tokens: {' '.join(map(str, tokens))}", f"n_vocab: {s['n_vocab']}",
             f"quants: {' '.join(['F32'] + quants)}"]
    for name, d in meta["batched_vs_seq"].items():
        lines.append(f"{name}.batched_vs_seq: {d!r}")
    for name, d in meta.get("quant_vs_dequant", {}).items():
        lines.append(f"{name}.quant_vs_dequant: {d!r}")
    (out / "meta.txt").write_text("\n".join(lines) + "\n")
    print(f"seed {seed}: {arch} {summary(s)} quants {' '.join(quants) or '-'}")
    return True


def main(argv):
    args, overrides, quants = [], {}, None
    it = iter(argv[1:])
    for a in it:
        if a == "--set":  # --set key=json-value, e.g. --set n_ff=576 --set tied=false
            k, v = next(it).split("=", 1)
            overrides[k] = json.loads(v)
        elif a == "--quants":  # --quants Q5_0,Q4_K_M
            quants = next(it).split(",")
        else:
            args.append(a)
    if len(args) < 2:
        print(__doc__)
        return 2
    ok = all([generate(args[0], int(x), overrides, quants) for x in args[1:]])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
