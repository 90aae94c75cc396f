#!/usr/bin/env python3
"""Random qwen35 models with an MTP ("nextn") draft head, and llama.cpp's outputs for it.

Qwen3.5 GGUFs may carry one multi-token-prediction block after the trunk: block_count is
n_layer + 1, `qwen35.nextn_predict_layers` is 1 and blk.{n_layer} holds a full-attention
decoder block (attn_norm, post_attention_norm, gated attn_q, attn_k/v/output, q/k norms,
ffn_gate/up/down) plus nextn.eh_proj {2*n_embd, n_embd}, nextn.enorm, nextn.hnorm and
optionally nextn.shared_head_norm / nextn.embed_tokens / nextn.shared_head_head. The MTP
step at position p takes (h_{p-1}, x_p), h = the trunk's final hidden state after
output_norm (h_{-1} = 0), and returns logits for x_{p+1} and its own h (after
shared_head_norm, else output_norm), which the next draft step takes as its h.

This script draws a qwen35 shape as tools/gen_random.py does, appends the MTP block, and
stores what llama.cpp (llama-cpp-python 0.3.36 = llama.cpp 0c1e570) computes, driving the
MTP context as common/speculative.cpp's common_speculative_impl_draft_mtp does.

Usage (PYTHONPATH with numpy, gguf and llama_cpp, as for gen_random.py):
    python3 gen_mtp.py OUT_ROOT SEED [SEED ...] [--set KEY=JSON ...] [--no-quant] [--check]
--set pins shape keys (gen_random's, plus shnorm / mtp_embed / mtp_head, booleans);
--check also runs the one-off verifications (numpy reference of the MTP block, eh_proj
perturbation, trunk unaffected by the block, ...) and prints their numbers.

For each seed, OUT_ROOT/<seed>/ gets (raw little-endian f32, row-major):
    F32.gguf            the model (trunk + MTP block), F32
    Q8_0.gguf           the same quantized by llama.cpp (left out if it refuses)
and for M in F32, Q8_0:
    M.target.f32        trunk logits, all n prompt positions, one batched decode   n x n_vocab
    M.h.f32             trunk h_nextn rows (after output_norm), same decode        n x n_embd
    M.mtp.f32           MTP logits of the catch-up pass: one batch, entry k =
                        (token x_k, position k, h_{k-1}; h_{-1} = 0), all outputs  n x n_vocab
    M.mtp_h.f32         the MTP's own h_nextn rows of that pass                    n x n_embd
    M.draft.f32         N_DRAFT greedy draft steps: step 0 = (id_last, pos n, h_{n-1}),
                        step i = (d_i, pos n+i, MTP h of step i-1); logits rows    N_DRAFT x n_vocab
    meta.txt            `key: values`: seed arch summary n_vocab n_embd n_layer (trunk
                        layers) n_draft tokens id_last draft_tokens (F32 model's),
                        Q8_0.id_last Q8_0.draft_tokens, quants
    meta.json           the same plus the drawn shape
id_last = argmax of M.target's last row, d_{i+1} = argmax of draft row i.
llama.cpp runs as gen_random's f32kv config: F32 KV cache, flash attention off, 1 thread;
one model object (loaded with load_mtp) serves the target and the MTP context.
"""

import ctypes
import json
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_random as gr  # noqa: E402

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("needs the `gguf` package (pip install gguf)")

GEN_VERSION = 1       # bump when a change alters what a seed generates
N_DRAFT = 4
QUANT = "Q8_0"


# --------------------------------------------------------------------------
# shape and writer
# --------------------------------------------------------------------------

def draw(rng):
    s = gr.draw_shape(rng, "qwen35")
    s["shnorm"] = bool(rng.random() < 0.5)      # nextn.shared_head_norm, else output_norm
    s["mtp_embed"] = bool(rng.random() < 0.25)  # nextn.embed_tokens, else token_embd
    s["mtp_head"] = bool(rng.random() < 0.25)   # nextn.shared_head_head, else output
    return s


def summary(s):
    x = gr.summary(s) + " mtp"
    for k, tag in (("shnorm", "shnorm"), ("mtp_embed", "membd"), ("mtp_head", "mhead")):
        if s[k]:
            x += " " + tag
    return x


def mtp_block(s, perturb=None):
    """write_model's `extra` hook: the keys and tensors of the MTP block blk.{n_layer}.

    perturb = (lo, hi): eh_proj's input columns lo..hi are redrawn (for --check)."""
    e, V, L = s["n_embd"], s["n_vocab"], s["n_layer"]
    H, KV, HD, FF = s["n_head"], s["n_head_kv"], gr.head_dim(s), s["n_ff"]
    # the norm in front of the LM head has gain ~3 for tied models (gen_random's output_norm)
    gain = 3.0 if s["tied"] else 1.0

    def hook(w, g):
        w.kv_data[0][gguf.Keys.LLM.BLOCK_COUNT.format(arch="qwen35")] = gguf.GGUFValue(
            value=L + 1, type=gguf.GGUFValueType.UINT32)
        w.add_uint32(gguf.Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch="qwen35"), 1)
        i = L
        g.norm(f"blk.{i}.attn_norm.weight", e)
        g.norm(f"blk.{i}.post_attention_norm.weight", e)
        g.mat(f"blk.{i}.attn_q.weight", (e, 2 * H * HD))
        g.mat(f"blk.{i}.attn_k.weight", (e, KV * HD))
        g.mat(f"blk.{i}.attn_v.weight", (e, KV * HD))
        g.mat(f"blk.{i}.attn_output.weight", (H * HD, e))
        g.norm(f"blk.{i}.attn_q_norm.weight", HD)
        g.norm(f"blk.{i}.attn_k_norm.weight", HD)
        g.mat(f"blk.{i}.ffn_gate.weight", (e, FF))
        g.mat(f"blk.{i}.ffn_up.weight", (e, FF))
        g.mat(f"blk.{i}.ffn_down.weight", (FF, e))
        g.mat(f"blk.{i}.nextn.eh_proj.weight", (2 * e, e))
        g.norm(f"blk.{i}.nextn.enorm.weight", e)
        g.norm(f"blk.{i}.nextn.hnorm.weight", e)
        if s["shnorm"]:
            g.norm(f"blk.{i}.nextn.shared_head_norm.weight", e, mean=gain)
        if s["mtp_embed"]:
            g.normal(f"blk.{i}.nextn.embed_tokens.weight", (e, V), 0.25)
        if s["mtp_head"]:
            g.mat(f"blk.{i}.nextn.shared_head_head.weight", (e, V), 4.0 / gain)
        if perturb:
            name = f"blk.{i}.nextn.eh_proj.weight"
            k = [j for j, (n, _) in enumerate(g.tensors) if n == name][0]
            a = g.tensors[k][1].copy()
            lo, hi = perturb
            a[:, lo:hi] = np.random.default_rng(12345).standard_normal((e, hi - lo)) / np.sqrt(2 * e)
            g.tensors[k] = (name, a.astype(np.float32))
    return hook


def write(s, path, seed, mtp=True, perturb=None):
    gr.write_model(s, path, seed, extra=mtp_block(s, perturb) if mtp else None)


# --------------------------------------------------------------------------
# llama.cpp (run in a forked child, as gen_random.logits)
# --------------------------------------------------------------------------

def _cparams(lc):
    p = lc.llama_context_default_params()
    p.n_ctx = p.n_batch = p.n_ubatch = gr.CTX
    p.n_threads = p.n_threads_batch = 1
    p.type_k = p.type_v = 0  # F32 KV
    p.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return p


def _load(lc, path, load_mtp):
    mp = lc.llama_model_default_params()
    mp.load_mtp = load_mtp
    m = lc.llama_model_load_from_file(str(path).encode(), mp)
    if not m:
        raise RuntimeError(f"cannot load {path.name} (load_mtp={load_mtp})")
    return m


def _row(ptr, n):
    if not ptr:
        raise RuntimeError("llama.cpp returned no row")
    return np.ctypeslib.as_array(ptr, shape=(n,)).astype(np.float32)


def _compute(path, tokens, one_model=True, catchup_outputs=True):
    """Target logits + h, the MTP catch-up pass and N_DRAFT greedy draft steps."""
    lc = gr.llama()
    from llama_cpp import llama_cpp_ext as ext  # noqa: PLC0415  (llama-ext.h bindings)
    n = len(tokens)
    model = _load(lc, path, True)
    model_tgt = model if one_model else _load(lc, path, False)
    V = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    E = lc.llama_model_n_embd(model)

    # target: one batched decode, every position an output, nextn rows unmasked
    ctx_tgt = lc.llama_init_from_model(model_tgt, _cparams(lc))
    if not ctx_tgt:
        raise RuntimeError("cannot create the target context")
    ext.llama_set_embeddings_nextn(ctx_tgt, True, False)
    b = lc.llama_batch_init(n, 0, 1)
    for i, t in enumerate(tokens):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, i, 1, 1
        b.seq_id[i][0] = 0
    b.n_tokens = n
    if (rc := lc.llama_decode(ctx_tgt, b)) != 0:
        raise RuntimeError(f"llama_decode(target) = {rc}")
    target = np.stack([_row(lc.llama_get_logits_ith(ctx_tgt, i), V) for i in range(n)])
    h = np.ctypeslib.as_array(ext.llama_get_embeddings_nextn(ctx_tgt), shape=(n, E)).copy()
    h_ith = np.stack([_row(ext.llama_get_embeddings_nextn_ith(ctx_tgt, i), E) for i in range(n)])
    assert np.array_equal(h, h_ith)

    # MTP context on the same model
    cp = _cparams(lc)
    cp.ctx_type = 1  # LLAMA_CONTEXT_TYPE_MTP
    cp.ctx_other = ctx_tgt
    ctx_dft = lc.llama_init_from_model(model, cp)
    if not ctx_dft:
        raise RuntimeError("cannot create the MTP context")
    ext.llama_set_embeddings_nextn(ctx_dft, True, True)
    bx = lc.llama_batch_ext_init(ctx_dft)

    def add(tok, pos, hrow, out):
        idx = lc.llama_batch_ext_add_token(bx, 0, tok)
        if idx < 0:
            raise RuntimeError(f"llama_batch_ext_add_token = {idx}")
        p = (lc.llama_pos * 4)(pos, 0, 0, 0)
        hrow = np.ascontiguousarray(hrow, dtype=np.float32)
        ok = lc.llama_batch_ext_set_pos(bx, idx, p) and lc.llama_batch_ext_set_embd_token(
            bx, idx, lc.llama_embd(hrow.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, E))
        if not ok:
            raise RuntimeError("llama_batch_ext_set_pos/_set_embd_token failed")
        if out:
            lc.llama_batch_ext_set_output_logits(bx, idx, True)

    # catch-up (common_speculative_impl_draft_mtp::process): x_k paired with h_{k-1}
    h_in = np.zeros((n, E), np.float32)
    h_in[1:] = h[:-1]
    lc.llama_batch_ext_clear(bx)
    for k, t in enumerate(tokens):
        add(t, k, h_in[k], catchup_outputs)
    if (rc := lc.llama_process(ctx_dft, lc.LLAMA_PROCESS_TYPE_DECODE, bx)) != 0:
        raise RuntimeError(f"llama_process(catch-up) = {rc}")
    mtp = mtp_h = None
    if catchup_outputs:
        mtp = np.stack([_row(lc.llama_get_logits_ith(ctx_dft, k), V) for k in range(n)])
        mtp_h = np.stack([_row(ext.llama_get_embeddings_nextn_ith(ctx_dft, k), E) for k in range(n)])

    # draft(): greedy, one token per llama_process, positions n, n+1, ...
    id_last = int(np.argmax(target[-1]))
    tok, hcur = id_last, h[-1]
    draft, draft_h, drafted = [], [], []
    for i in range(N_DRAFT):
        lc.llama_batch_ext_clear(bx)
        add(tok, n + i, hcur, True)
        if (rc := lc.llama_process(ctx_dft, lc.LLAMA_PROCESS_TYPE_DECODE, bx)) != 0:
            raise RuntimeError(f"llama_process(draft {i}) = {rc}")
        draft.append(_row(lc.llama_get_logits_ith(ctx_dft, 0), V))
        hcur = _row(ext.llama_get_embeddings_nextn_ith(ctx_dft, 0), E)
        draft_h.append(hcur)
        tok = int(np.argmax(draft[-1]))
        drafted.append(tok)
    lc.llama_batch_ext_free(bx)
    return {"target": target, "h": h, "mtp": mtp, "mtp_h": mtp_h, "draft": np.stack(draft),
            "draft_h": np.stack(draft_h), "id_last": id_last, "draft_tokens": drafted}


def run(path, tokens, **kw):
    """_compute in a forked child (gen_random.in_child): a crash costs this file, not
    the run."""
    gr.llama()
    data = gr.in_child(path,
                       lambda: pickle.dumps(_compute(path, tokens, **kw)), "gen_mtp")
    return pickle.loads(data)


# --------------------------------------------------------------------------
# numpy reference of the MTP block (--check)
# --------------------------------------------------------------------------

def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def ref_mtp(path, s, tokens, h_in):
    """Logits and h of the MTP block for the entries (tokens[p], position p, h_in[p]),
    causal over all of them, in float64 from the F32 file's tensors."""
    rd = gguf.GGUFReader(str(path))
    T = {t.name: np.asarray(t.data, dtype=np.float64) for t in rd.tensors}
    L, e, eps = s["n_layer"], s["n_embd"], s["rms_eps"]
    H, KV, HD, nrot = s["n_head"], s["n_head_kv"], gr.head_dim(s), s["rope_dims"]
    b = f"blk.{L}."
    n = len(tokens)
    emb = T.get(b + "nextn.embed_tokens.weight", T["token_embd.weight"])[tokens]
    x = np.concatenate([rms(emb, T[b + "nextn.enorm.weight"], eps),
                        rms(np.asarray(h_in, np.float64), T[b + "nextn.hnorm.weight"], eps)], axis=1)
    cur = x @ T[b + "nextn.eh_proj.weight"].T
    res = cur
    a = rms(cur, T[b + "attn_norm.weight"], eps)
    qg = (a @ T[b + "attn_q.weight"].T).reshape(n, H, 2 * HD)
    q, gate = qg[:, :, :HD], qg[:, :, HD:].reshape(n, H * HD)
    k = (a @ T[b + "attn_k.weight"].T).reshape(n, KV, HD)
    v = (a @ T[b + "attn_v.weight"].T).reshape(n, KV, HD)
    q = rms(q, T[b + "attn_q_norm.weight"], eps)
    k = rms(k, T[b + "attn_k_norm.weight"], eps)
    # IMROPE with one position for all sections = NEOX rope over the first nrot dims
    pos = np.arange(n, dtype=np.float64)
    th = pos[:, None] * s["rope_base"] ** (-2.0 * np.arange(nrot // 2) / nrot)[None, :]
    c, sn = np.cos(th)[:, None, :], np.sin(th)[:, None, :]

    def rope(t):
        t = t.copy()
        x0, x1 = t[..., :nrot // 2].copy(), t[..., nrot // 2:nrot].copy()
        t[..., :nrot // 2] = x0 * c - x1 * sn
        t[..., nrot // 2:nrot] = x0 * sn + x1 * c
        return t
    q, k = rope(q), rope(k)
    out = np.zeros((n, H, HD))
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for hh in range(H):
        kv = hh // (H // KV)
        sc = q[:, hh] @ k[:, kv].T / np.sqrt(HD) + mask
        p = np.exp(sc - sc.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, hh] = p @ v[:, kv]
    att = out.reshape(n, H * HD) / (1.0 + np.exp(-gate))
    cur = att @ T[b + "attn_output.weight"].T + res
    f = rms(cur, T[b + "post_attention_norm.weight"], eps)
    g = f @ T[b + "ffn_gate.weight"].T
    f = (g / (1.0 + np.exp(-g)) * (f @ T[b + "ffn_up.weight"].T)) @ T[b + "ffn_down.weight"].T
    cur = cur + f
    hn = rms(cur, T.get(b + "nextn.shared_head_norm.weight", T["output_norm.weight"]), eps)
    head = T.get(b + "nextn.shared_head_head.weight", T.get("output.weight", T["token_embd.weight"]))
    return hn @ head.T, hn


def rel(a, b):
    """max |a - b| / max |b|"""
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


def check(out, s, tokens, got, wseed):
    """One-off verifications for the report (printed, stored in meta.json)."""
    f32 = out / "F32.gguf"
    n = len(tokens)
    c = {}
    # 1. numpy reference: catch-up rows + the draft chain, inputs = llama.cpp's h rows
    seq = tokens + [got["id_last"]] + got["draft_tokens"][:-1]
    h_in = np.concatenate([np.zeros((1, s["n_embd"])), got["h"], got["draft_h"][:-1]])
    lg, hn = ref_mtp(f32, s, seq, h_in)
    c["np_mtp_rel"] = rel(got["mtp"], lg[:n])
    c["np_draft_rel"] = rel(got["draft"], lg[n:])
    c["np_mtp_h_rel"] = rel(got["mtp_h"], hn[:n])
    c["np_draft_h_rel"] = rel(got["draft_h"], hn[n:])
    # 2. MTP logits are not the trunk's
    c["mtp_vs_target_rel"] = rel(got["mtp"], got["target"])
    # 3. h_{-1} = 0: zeroing vs redrawing eh_proj's h half (columns e..2e) leaves row 0 alone
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        e = s["n_embd"]
        pert = {}
        for name, cols in (("h", (e, 2 * e)), ("e", (0, e))):
            p = td / f"pert_{name}.gguf"
            write(s, p, wseed, perturb=cols)
            pert[name] = run(p, tokens)
        d = np.abs(pert["h"]["mtp"] - got["mtp"]).max(axis=1)
        c["pert_h_row0_maxabs"] = float(d[0])
        c["pert_h_rows1_min_maxabs"] = float(d[1:].min())
        c["pert_h_target_same"] = bool(np.array_equal(pert["h"]["target"], got["target"]))
        d = np.abs(pert["e"]["mtp"] - got["mtp"]).max(axis=1)
        c["pert_e_rows_min_maxabs"] = float(d.min())
        # 4. trunk unaffected: the same model without the block, and load_mtp=false
        p = td / "nomtp.gguf"
        write(s, p, wseed, mtp=False)
        plain = gr.logits(p, tokens, True)
        c["target_vs_nomtp_file_maxabs"] = float(np.abs(plain - got["target"]).max())
        c["target_vs_load_mtp_false_maxabs"] = float(
            np.abs(gr.logits(f32, tokens, True) - got["target"]).max())
        # 5. two model objects (target without MTP tensors) and the catch-up with outputs
        #    off, as process() does it: the same drafts
        two = run(f32, tokens, one_model=False)
        c["two_models_same"] = bool(all(np.array_equal(two[k], got[k])
                                        for k in ("target", "h", "mtp", "draft")))
        off = run(f32, tokens, catchup_outputs=False)
        c["outputs_off_draft_same"] = bool(np.array_equal(off["draft"], got["draft"]))
    for k, v in c.items():
        print(f"    check {k}: {v}")
    return c


# --------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------

def finite(rows):
    return None if np.all(np.isfinite(rows)) else "non-finite logits"


def generate(root, seed, overrides=None, quant=True, do_check=False):
    t0 = time.time()
    out = Path(root) / str(seed)
    if (overrides or do_check) and out.is_dir():
        for f in out.iterdir():
            f.unlink()
    if (out / "meta.txt").exists():
        if json.loads((out / "meta.json").read_text()).get("gen_version") == GEN_VERSION:
            print(f"seed {seed}: cached in {out}")
            return True
        for f in out.iterdir():
            f.unlink()
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([gr.GEN_VERSION, seed])
    for attempt in range(20):
        s = draw(rng)
        s.update(overrides or {})
        if gr.n_params(s) > 3_000_000:
            continue
        tokens = gr.draw_tokens(rng, s)
        f32 = out / "F32.gguf"
        wseed = seed * 100 + attempt
        write(s, f32, wseed)
        try:
            got = {"F32": run(f32, tokens)}
        except RuntimeError as e:
            print(f"seed {seed} attempt {attempt}: {summary(s)}: {e}; redrawing")
            continue
        why = (gr.degenerate(got["F32"]["target"]) or gr.degenerate(got["F32"]["mtp"])
               or finite(got["F32"]["draft"]))
        if why:
            print(f"seed {seed} attempt {attempt}: {summary(s)}: {why}; redrawing")
            continue
        break
    else:
        print(f"seed {seed}: no usable shape in 20 attempts")
        return False
    quants, refused = [], []
    if quant:
        qf = out / f"{QUANT}.gguf"
        if not gr.quantize(f32, qf, gr.FTYPES[QUANT]):
            refused.append(QUANT)
            print(f"seed {seed}: llama-quantize refuses {QUANT} for {summary(s)}")
        else:
            try:
                got[QUANT] = run(qf, tokens)
                quants.append(QUANT)
            except RuntimeError as e:
                refused.append(QUANT)
                print(f"seed {seed}: {QUANT} dropped: {e} ({summary(s)})")
    meta = {"seed": seed, "gen_version": GEN_VERSION, "shape": s, "summary": summary(s),
            "tokens": tokens, "n_vocab": s["n_vocab"], "n_embd": s["n_embd"],
            "n_layer": s["n_layer"], "n_draft": N_DRAFT, "quants": quants, "refused": refused}
    lines = [f"seed: {seed}", "arch: qwen35", f"summary: {summary(s)}",
             f"n_vocab: {s['n_vocab']}", f"n_embd: {s['n_embd']}", f"n_layer: {s['n_layer']}",
             f"n_draft: {N_DRAFT}", f"tokens: {' '.join(map(str, tokens))}"]
    for m, r in got.items():
        for k in ("target", "h", "mtp", "mtp_h", "draft"):
            r[k].astype("<f4").tofile(out / f"{m}.{k}.f32")
        pre = "" if m == "F32" else m + "."
        lines += [f"{pre}id_last: {r['id_last']}",
                  f"{pre}draft_tokens: {' '.join(map(str, r['draft_tokens']))}"]
        meta[pre + "id_last"] = r["id_last"]
        meta[pre + "draft_tokens"] = r["draft_tokens"]
        if m != "F32":
            meta[m + ".mtp_vs_F32"] = float(np.abs(r["mtp"] - got["F32"]["mtp"]).max())
    lines.append(f"quants: {' '.join(['F32'] + quants)}")
    if do_check:
        meta["check"] = check(out, s, tokens, got["F32"], wseed)
    meta["seconds"] = round(time.time() - t0, 2)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / "meta.txt").write_text("\n".join(lines) + "\n")
    print(f"seed {seed}: {summary(s)} n{len(tokens)} quants {' '.join(quants) or '-'} "
          f"id_last {got['F32']['id_last']} draft {got['F32']['draft_tokens']} "
          f"({time.time() - t0:.1f}s)")
    return True


def main(argv):
    args, overrides, quant, do_check = [], {}, True, False
    it = iter(argv[1:])
    for a in it:
        if a == "--set":
            k, v = next(it).split("=", 1)
            overrides[k] = json.loads(v)
        elif a == "--no-quant":
            quant = False
        elif a == "--check":
            do_check = True
        else:
            args.append(a)
    if len(args) < 2:
        print(__doc__)
        return 2
    ok = all([generate(args[0], int(x), overrides, quant, do_check) for x in args[1:]])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
