#!/usr/bin/env python3
"""wren-tiny: a small Kimi K3-architecture model, trained in PyTorch and exported in the published
K3 checkpoint layout that Wren loads unchanged.

The math is Wren's CPU forward (shared/spec/kimi-k3.md §4, tests/reference_model.cpp), written once
here for [B, T] batches:
  - AttnRes blocks (block size 4): Mix = softmax_e(res_proj . rms(v_e; res_norm)) weighted sum of RAW v_e;
  - KDA: q/k/v projections -> causal depthwise conv (4 taps) -> SiLU -> per-head L2 norm (q also / sqrt(d));
    decay gate g = lower_bound * sigmoid(exp(A_log[h]) * (f_b(f_a(x)) + dt_bias)), alpha = exp(g);
    beta = sigmoid(b_proj x); per token S <- diag(alpha) S; u = k^T S; S += k (beta (v - u))^T; o = q^T S;
    out = o_proj(rms(o; o_norm) * sigmoid(g_proj x));
  - gated NoPE MLA: q = q_b(rms(q_a x; eps 1e-6)); latent = rms(kv_a x [:kv_lora]; eps 1e-6), shared raw
    key part kv_a x [kv_lora:]; kv_b -> per head [k_nope | v]; softmax(q.k / sqrt(nope + extra)) causal;
    ctx * sigmoid(g_proj x) -> o_proj;
  - LatentMoE: sigmoid router, top-k on score + e_score_correction_bias (bias only selects), weights =
    selected scores / their sum; experts run in the latent space (routed_expert_down_proj), aggregate ->
    RMSNorm (routed_expert_norm) -> routed_expert_up_proj; plus the fused shared experts at full width;
  - SiTU-GLU: [b1 tanh(g / b1) sigmoid(g)] * [b2 tanh(u / b2)], b1 = 4, b2 = 25;
  - dense SiTU MLP at layer 0; head = lm_head(rms(Mix(blocks + [P]; output_attn_res); model.norm)).
The KDA recurrence is run token by token in training too (exact form, f32, outside autocast); the rest
runs under bf16 autocast. Routed experts: quantization-aware training in the last QAT_FRACTION of the
run (MXFP4 fake-quant with a straight-through gradient); the export writes exactly those codes, and the
export-time check runs this same forward in float64 on the exported bytes (BF16 dense weights upcast,
MXFP4 dequantized), which is what Wren's exact-f32 CPU forward must match.

Usage (on the GPU machine):  python3 k3_tiny.py train IDS.u16 OUT_DIR --seconds 330
                             python3 k3_tiny.py smoke IDS.u16 OUT_DIR
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

RANKS = 16384
VOCAB = RANKS + 256
BOS, EOS, EOM = RANKS, RANKS + 1, RANKS + 2

TEXT = {
    "model_type": "kimi_linear", "hidden_size": 256, "num_hidden_layers": 8,
    "vocab_size": VOCAB, "first_k_dense_replace": 1, "intermediate_size": 768,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 128, "kv_lora_rank": 64,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "num_experts": 32,
    "num_experts_per_token": 4, "moe_intermediate_size": 96, "routed_expert_hidden_size": 128,
    "num_shared_experts": 2, "attn_res_block_size": 4, "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0, "rms_norm_eps": 1e-5, "hidden_act": "situ",
    "latent_moe_use_norm": True, "moe_router_activation_func": "sigmoid", "moe_renormalize": True,
    "routed_scaling_factor": 1.0, "use_grouped_topk": True, "num_expert_group": 1, "topk_group": 1,
    "topk_method": "noaux_tc", "moe_layer_freq": 1, "mla_use_nope": True, "mla_use_output_gate": True,
    "num_nextn_predict_layers": 0, "max_position_embeddings": 1048576,
    "linear_attn_config": {"num_heads": 4, "head_dim": 64, "short_conv_kernel_size": 4,
                           "gate_lower_bound": -5.0, "use_full_rank_gate": True,
                           "kda_layers": [1, 2, 3, 5, 6, 7], "full_attn_layers": [4, 8]},
}

# The size trained on a CPU (a shared 2-core machine, about 45 minutes) when no GPU machine is available: every
# feature of the layout (KDA + gated MLA as the last layer, AttnRes blocks, LatentMoE with MXFP4
# experts and shared experts, SiTU, dense layer 0), small enough to train there.
TEXT_CPU = dict(TEXT)
TEXT_CPU.update({
    "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 192,
    "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 32,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16, "num_experts": 16,
    "num_experts_per_token": 4, "moe_intermediate_size": 32, "routed_expert_hidden_size": 32,
    "num_shared_experts": 2, "attn_res_block_size": 2,
    "linear_attn_config": {"num_heads": 2, "head_dim": 32, "short_conv_kernel_size": 4,
                           "gate_lower_bound": -5.0, "use_full_rank_gate": True,
                           "kda_layers": [1, 2, 3], "full_attn_layers": [4]},
})
SIZES = {"gpu": TEXT, "cpu": TEXT_CPU}


def full_config(text):
    group = {"format": "mxfp4-pack-quantized", "targets": ["Linear"],
             "weights": {"num_bits": 4, "type": "float", "group_size": 32}, "input_activations": None}
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
            "bos_token_id": BOS, "eos_token_id": EOM, "pad_token_id": RANKS + 255,
            "tie_word_embeddings": False, "text_config": text,
            "quantization_config": {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
                                    "config_groups": {"group_0": group},
                                    "ignore": ["re:.*(?<!experts\\.\\d+\\.w[123])$"]}}


# ----------------------------------------------------------------------------------------------
# MXFP4 (e2m1 codes, ue8m0 scale per 32 inputs; low nibble = even column)
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mx_quant(w):
    """w [rows, cols] float -> (codes uint8 [rows, cols] in 0..15, scale codes uint8 [rows, cols/32]).
    Per group: exponent floor(log2(amax)) - 2 (OCP) or one more, whichever gives the smaller squared
    error; codes = nearest e2m1 magnitude (ties to the smaller), sign bit 3 (never -0)."""
    w = w.detach().float()
    r, c = w.shape
    g = w.reshape(r, c // 32, 32)
    amax = g.abs().amax(-1)
    e0 = torch.floor(torch.log2(amax.clamp_min(2.0 ** -120))) - 2
    mags = torch.tensor(E2M1[:8], device=w.device)
    best_err, best_codes, best_e = None, None, None
    for de in (0.0, 1.0):
        e = (e0 + de).clamp(-126, 127)
        x = g / torch.exp2(e)[..., None]
        idx = (x.abs()[..., None] - mags).abs().argmin(-1)  # first minimum: ties -> smaller magnitude
        q = mags[idx] * torch.where(x < 0, -1.0, 1.0)
        err = ((q * torch.exp2(e)[..., None] - g) ** 2).sum(-1)
        codes = (idx + torch.where((x < 0) & (idx > 0), 8, 0)).to(torch.uint8)
        if best_err is None:
            best_err, best_codes, best_e = err, codes, e
        else:
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_codes = torch.where(better[..., None], codes, best_codes)
            best_e = torch.where(better, e, best_e)
    return best_codes.reshape(r, c), (best_e + 127).to(torch.uint8)


def mx_dequant(codes, scale, dtype=torch.float32):
    table = torch.tensor(E2M1, dtype=torch.float64, device=codes.device)
    r, c = codes.shape
    v = table[codes.long()].reshape(r, c // 32, 32) * torch.exp2(scale.double() - 127)[..., None]
    return v.reshape(r, c).to(dtype)


def mx_pack(codes):
    c = codes.cpu().numpy().astype(np.uint8)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)


def mx_unpack(packed):
    p = torch.as_tensor(packed)
    out = torch.empty(p.shape[0], p.shape[1] * 2, dtype=torch.uint8)
    out[:, 0::2] = p & 15
    out[:, 1::2] = p >> 4
    return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class FakeQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w):
        shp = w.shape
        w2 = w.reshape(-1, shp[-1])
        codes, scale = mx_quant(w2)
        return mx_dequant(codes, scale, w.dtype).reshape(shp)

    @staticmethod
    def backward(ctx, g):
        return g


# ----------------------------------------------------------------------------------------------
def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def situ(g, u, b1=4.0, b2=25.0):
    return b1 * torch.tanh(g / b1) * torch.sigmoid(g) * (b2 * torch.tanh(u / b2))


def lin(x, w):
    return x @ w.t()


class Model(nn.Module):
    """Parameters are named after the checkpoint tensors ('.' -> '__')."""

    def __init__(self, c=TEXT):
        super().__init__()
        self.c = c
        D, L = c["hidden_size"], c["num_hidden_layers"]
        la = c["linear_attn_config"]
        self.H, self.d, self.K = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
        self.lb = la["gate_lower_bound"]
        self.kda_layers = {n - 1 for n in la["kda_layers"]}
        self.eps = c["rms_norm_eps"]
        self.E, self.topk = c["num_experts"], c["num_experts_per_token"]
        self.lat, self.inter = c["routed_expert_hidden_size"], c["moe_intermediate_size"]
        self.block = c["attn_res_block_size"]
        self.qat = False
        P = self.H * self.d
        self.specs = {}  # name -> (shape, kind) kind: 'mat', 'vec', 'one', 'zero', special
        S = self.specs
        S["model.embed_tokens.weight"] = ((VOCAB, D), "embed")
        S["model.norm.weight"] = ((D,), "one")
        S["model.output_attn_res_norm.weight"] = ((D,), "one")
        S["model.output_attn_res_proj.weight"] = ((1, D), "zero")
        S["lm_head.weight"] = ((VOCAB, D), "mat")
        for i in range(L):
            b = f"model.layers.{i}."
            for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
                S[b + n + ".weight"] = ((D,), "one")
            S[b + "self_attention_res_proj.weight"] = ((1, D), "zero")
            S[b + "mlp_res_proj.weight"] = ((1, D), "zero")
            a = b + "self_attn."
            if i in self.kda_layers:
                for n in ("q", "k", "v"):
                    S[a + n + "_proj.weight"] = ((P, D), "mat")
                    S[a + n + "_conv1d.weight"] = ((P, 1, self.K), "conv")
                S[a + "f_a_proj.weight"] = ((self.d, D), "mat")
                S[a + "f_b_proj.weight"] = ((P, self.d), "mat")
                S[a + "A_log"] = ((max(self.H, self.d),), "alog")
                S[a + "dt_bias"] = ((P,), "dtbias")
                S[a + "b_proj.weight"] = ((self.H, D), "mat")
                S[a + "g_proj.weight"] = ((P, D), "mat")
                S[a + "o_norm.weight"] = ((self.d,), "one")
                S[a + "o_proj.weight"] = ((D, P), "out")
            else:
                Hm, nope, ex, vh = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
                S[a + "q_a_proj.weight"] = ((c["q_lora_rank"], D), "mat")
                S[a + "q_a_layernorm.weight"] = ((c["q_lora_rank"],), "one")
                S[a + "q_b_proj.weight"] = ((Hm * (nope + ex), c["q_lora_rank"]), "mat")
                S[a + "kv_a_proj_with_mqa.weight"] = ((c["kv_lora_rank"] + ex, D), "mat")
                S[a + "kv_a_layernorm.weight"] = ((c["kv_lora_rank"],), "one")
                S[a + "kv_b_proj.weight"] = ((Hm * (nope + vh), c["kv_lora_rank"]), "mat")
                S[a + "g_proj.weight"] = ((Hm * vh, D), "mat")
                S[a + "o_proj.weight"] = ((D, Hm * vh), "out")
            if i < c["first_k_dense_replace"]:
                I = c["intermediate_size"]
                S[b + "mlp.gate_proj.weight"] = ((I, D), "mat")
                S[b + "mlp.up_proj.weight"] = ((I, D), "mat")
                S[b + "mlp.down_proj.weight"] = ((D, I), "out")
            else:
                m = b + "block_sparse_moe."
                Sh = self.inter * c["num_shared_experts"]
                S[m + "gate.weight"] = ((self.E, D), "mat")
                S[m + "routed_expert_down_proj.weight"] = ((self.lat, D), "mat")
                S[m + "routed_expert_norm.weight"] = ((self.lat,), "one")
                S[m + "routed_expert_up_proj.weight"] = ((D, self.lat), "out")
                S[m + "shared_experts.gate_proj.weight"] = ((Sh, D), "mat")
                S[m + "shared_experts.up_proj.weight"] = ((Sh, D), "mat")
                S[m + "shared_experts.down_proj.weight"] = ((D, Sh), "out")
                # routed experts, stacked: w1 = gate [E, inter, lat], w3 = up, w2 = down [E, lat, inter]
                S[m + "experts.w1"] = ((self.E, self.inter, self.lat), "emat")
                S[m + "experts.w3"] = ((self.E, self.inter, self.lat), "emat")
                S[m + "experts.w2"] = ((self.E, self.lat, self.inter), "eout")
                self.register_buffer(self.key(m + "gate.e_score_correction_bias"), torch.zeros(self.E))
        self.params = nn.ParameterDict()
        gen = torch.Generator().manual_seed(2026)
        for n, (shape, kind) in S.items():
            self.params[self.key(n)] = nn.Parameter(self.init(shape, kind, gen, L))

    @staticmethod
    def key(n):
        return n.replace(".", "__")

    def init(self, shape, kind, gen, L):
        if kind == "one":
            return torch.ones(shape)
        if kind == "zero":
            return torch.zeros(shape)
        if kind == "embed":
            return torch.randn(shape, generator=gen)
        if kind == "conv":
            return (torch.rand(shape, generator=gen) * 2 - 1) / math.sqrt(shape[-1])
        if kind == "alog":
            v = torch.zeros(shape)
            v[: self.H] = torch.log(1 + 15 * torch.rand(self.H, generator=gen))
            return v
        if kind == "dtbias":  # decay exp(-5 p) with p in (0.002, 0.2): alpha in (0.37, 0.99)
            p = 0.002 + 0.198 * torch.rand(shape, generator=gen)
            return torch.log(p / (1 - p))  # divided by exp(A_log) later in forward? no: set below
        fan_in = shape[-1]
        std = 1 / math.sqrt(fan_in)
        if kind in ("out", "eout"):
            std /= math.sqrt(2 * L)
        return torch.randn(shape, generator=gen) * std

    def p(self, n):
        return self.params[self.key(n)]

    def bias(self, n):
        return getattr(self, self.key(n))

    # -- blocks ------------------------------------------------------------------------------
    def mix(self, entries, norm, proj):
        V = torch.stack(entries, 0)  # [N, B, T, D]
        s = (rms(V, norm, self.eps) * proj.reshape(-1)).sum(-1)  # [N, B, T]
        p = torch.softmax(s, 0)
        return (p[..., None] * V).sum(0)

    def kda(self, a, x):
        B, T, _ = x.shape
        H, d, K = self.H, self.d, self.K

        def conv(y, w):  # y [B, T, P]; causal depthwise conv, tap K-1 = current token
            yp = F.pad(y.transpose(1, 2), (K - 1, 0))
            return F.silu(F.conv1d(yp, w.to(y.dtype), groups=y.shape[-1]).transpose(1, 2))

        q = conv(lin(x, self.p(a + "q_proj.weight")), self.p(a + "q_conv1d.weight"))
        k = conv(lin(x, self.p(a + "k_proj.weight")), self.p(a + "k_conv1d.weight"))
        v = conv(lin(x, self.p(a + "v_proj.weight")), self.p(a + "v_conv1d.weight"))
        z = lin(lin(x, self.p(a + "f_a_proj.weight")), self.p(a + "f_b_proj.weight"))
        beta = torch.sigmoid(lin(x, self.p(a + "b_proj.weight")))  # [B, T, H]
        gate = lin(x, self.p(a + "g_proj.weight"))
        dt = self.exact_dtype or torch.float32
        with torch.autocast("cuda", enabled=False) if AMP else _null():
            q, k, v, z, beta = (t.to(dt) for t in (q, k, v, z, beta))
            q = q.reshape(B, T, H, d)
            k = k.reshape(B, T, H, d)
            v = v.reshape(B, T, H, d)
            q = q / torch.sqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) / math.sqrt(d)
            k = k / torch.sqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
            A = torch.exp(self.p(a + "A_log")[:H].to(dt))  # [H]
            zz = (z + self.p(a + "dt_bias").to(dt)).reshape(B, T, H, d)
            alpha = torch.exp(self.lb * torch.sigmoid(A[:, None] * zz))  # [B, T, H, d]
            S = torch.zeros(B, H, d, d, dtype=dt, device=x.device)
            outs = []
            for t in range(T):
                S = S * alpha[:, t, :, :, None]
                kt = k[:, t]
                u = torch.einsum("bhr,bhrc->bhc", kt, S)
                S = S + kt[..., :, None] * (beta[:, t, :, None] * (v[:, t] - u))[..., None, :]
                outs.append(torch.einsum("bhr,bhrc->bhc", q[:, t], S))
            o = torch.stack(outs, 1)  # [B, T, H, d]
            o = rms(o, self.p(a + "o_norm.weight").to(dt), self.eps)
        o = o.to(gate.dtype) * torch.sigmoid(gate).reshape(B, T, H, d)
        return lin(o.reshape(B, T, H * d), self.p(a + "o_proj.weight"))

    def mla(self, a, x):
        c = self.c
        B, T, _ = x.shape
        Hm, nope, ex, vh, kvl = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
        qh = nope + ex
        q = lin(rms(lin(x, self.p(a + "q_a_proj.weight")), self.p(a + "q_a_layernorm.weight"), 1e-6), self.p(a + "q_b_proj.weight"))
        q = q.reshape(B, T, Hm, qh)
        ckv = lin(x, self.p(a + "kv_a_proj_with_mqa.weight"))
        lat = rms(ckv[..., :kvl], self.p(a + "kv_a_layernorm.weight"), 1e-6)
        kx = ckv[..., kvl:]
        kv = lin(lat, self.p(a + "kv_b_proj.weight")).reshape(B, T, Hm, nope + vh)
        key = torch.cat([kv[..., :nope], kx[:, :, None, :].expand(B, T, Hm, ex)], -1)
        val = kv[..., nope:]
        s = torch.einsum("bthi,bshi->bhts", q, key) / math.sqrt(qh)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s.float() if self.exact_dtype is None else s, -1).to(val.dtype)
        ctx = torch.einsum("bhts,bshi->bthi", p, val).reshape(B, T, Hm * vh)
        ctx = ctx * torch.sigmoid(lin(x, self.p(a + "g_proj.weight")))
        return lin(ctx, self.p(a + "o_proj.weight"))

    def moe(self, m, x, stats=None):
        B, T, D = x.shape
        logits = lin(x, self.p(m + "gate.weight"))
        s = torch.sigmoid(logits.float() if self.exact_dtype is None else logits)
        biased = s + self.bias(m + "gate.e_score_correction_bias").to(s.dtype)
        sel = torch.topk(biased.detach(), self.topk, -1).indices  # [B, T, k]
        ssel = torch.gather(s, -1, sel)
        wsel = ssel / ssel.sum(-1, keepdim=True)
        W = torch.zeros_like(s).scatter(-1, sel, wsel)  # [B, T, E]
        if stats is not None:
            stats.append(torch.bincount(sel.reshape(-1), minlength=self.E))
        z = lin(x, self.p(m + "routed_expert_down_proj.weight"))
        w1, w3, w2 = (self.p(m + "experts." + n) for n in ("w1", "w3", "w2"))
        if self.qat:
            w1, w3, w2 = FakeQuant.apply(w1), FakeQuant.apply(w3), FakeQuant.apply(w2)
        if self.exact_dtype is not None:
            w1, w3, w2 = self.deq[m + "w1"], self.deq[m + "w3"], self.deq[m + "w2"]
        g = torch.einsum("btl,eil->btei", z, w1.to(z.dtype))
        u = torch.einsum("btl,eil->btei", z, w3.to(z.dtype))
        act = situ(g, u) * W.to(g.dtype)[..., None]
        y = torch.einsum("btei,eli->btl", act, w2.to(act.dtype))
        y = lin(rms(y, self.p(m + "routed_expert_norm.weight"), self.eps), self.p(m + "routed_expert_up_proj.weight"))
        sh = lin(situ(lin(x, self.p(m + "shared_experts.gate_proj.weight")), lin(x, self.p(m + "shared_experts.up_proj.weight"))),
                 self.p(m + "shared_experts.down_proj.weight"))
        return y + sh

    exact_dtype = None
    deq = None

    def forward(self, ids, stats=None, trace=None, hidden_only=False):
        c = self.c
        P = F.embedding(ids, self.p("model.embed_tokens.weight"))
        if self.exact_dtype is not None:
            P = P.to(self.exact_dtype)
        blocks = []
        for i in range(c["num_hidden_layers"]):
            b = f"model.layers.{i}."
            h = P if not blocks else self.mix(blocks + [P], self.p(b + "self_attention_res_norm.weight"), self.p(b + "self_attention_res_proj.weight"))
            if i % self.block == 0:
                blocks.append(P)
                P = torch.zeros_like(P)
            xa = rms(h, self.p(b + "input_layernorm.weight"), self.eps)
            a = self.kda(b + "self_attn.", xa) if i in self.kda_layers else self.mla(b + "self_attn.", xa)
            P = P + a.to(P.dtype)
            mm = self.mix(blocks + [P], self.p(b + "mlp_res_norm.weight"), self.p(b + "mlp_res_proj.weight"))
            xm = rms(mm, self.p(b + "post_attention_layernorm.weight"), self.eps)
            if i < c["first_k_dense_replace"]:
                f = lin(situ(lin(xm, self.p(b + "mlp.gate_proj.weight")), lin(xm, self.p(b + "mlp.up_proj.weight"))), self.p(b + "mlp.down_proj.weight"))
            else:
                f = self.moe(b + "block_sparse_moe.", xm, stats)
            P = P + f.to(P.dtype)
            if trace is not None:
                trace.append(P)
        out = self.mix(blocks + [P], self.p("model.output_attn_res_norm.weight"), self.p("model.output_attn_res_proj.weight"))
        h = rms(out, self.p("model.norm.weight"), self.eps)
        return h if hidden_only else lin(h, self.p("lm_head.weight"))


def fix_dt_bias(model):
    """dt_bias was drawn as logit(p); divide by exp(A_log[h]) so that sigmoid(A z) = p at z = 0."""
    with torch.no_grad():
        for n, (shape, kind) in model.specs.items():
            if kind == "dtbias":
                alog = model.p(n.replace("dt_bias", "A_log"))[: model.H]
                model.p(n).copy_((model.p(n).reshape(model.H, model.d) / torch.exp(alog)[:, None]).reshape(-1))


# ----------------------------------------------------------------------------------------------
SHARD_BYTES = 15_000_000
F32_SUFFIX = ("A_log", "dt_bias", "conv1d.weight", "o_norm.weight", "e_score_correction_bias")


def export(model, out_dir):
    """Writes config.json, model.safetensors.index.json and one shard; returns the exported tensors
    (name -> numpy array as stored) for the exact check."""
    os.makedirs(out_dir, exist_ok=True)
    tensors = []  # (name, dtype string, shape, bytes)
    stored = {}
    pfx = "language_model."

    def add(name, t):
        if name.endswith(F32_SUFFIX):
            a = t.detach().float().cpu().numpy().astype("<f4")
            tensors.append((pfx + name, "F32", list(a.shape), a.tobytes()))
        else:
            b = t.detach().float().cpu().to(torch.bfloat16).view(torch.int16).numpy().astype("<i2")
            tensors.append((pfx + name, "BF16", list(b.shape), b.tobytes()))
        stored[name] = t.detach().float().cpu().to(torch.bfloat16 if not name.endswith(F32_SUFFIX) else torch.float32)

    L = model.c["num_hidden_layers"]
    glob = ["model.embed_tokens.weight", "model.norm.weight", "model.output_attn_res_norm.weight",
            "model.output_attn_res_proj.weight", "lm_head.weight"]
    for i in range(L):
        b = f"model.layers.{i}."
        for n in model.specs:
            if n.startswith(b) and ".experts." not in n:
                add(n, model.p(n))
        m = b + "block_sparse_moe."
        if m + "experts.w1" in model.specs:
            add(m + "gate.e_score_correction_bias", model.bias(m + "gate.e_score_correction_bias"))
            for e in range(model.E):
                for part in ("w1", "w2", "w3"):
                    codes, scale = mx_quant(model.p(m + "experts." + part)[e])
                    nm = f"{m}experts.{e}.{part}"
                    pk = mx_pack(codes)
                    sc = scale.cpu().numpy().astype(np.uint8)
                    tensors.append((pfx + nm + ".weight_packed", "U8", list(pk.shape), pk.tobytes()))
                    tensors.append((pfx + nm + ".weight_scale", "U8", list(sc.shape), sc.tobytes()))
                    stored[nm + ".weight_packed"] = pk
                    stored[nm + ".weight_scale"] = sc
    for n in glob:
        add(n, model.p(n))
    # Shards of at most SHARD_BYTES (the device returns files of up to 16 MiB); a tensor, or one
    # expert's six tensors, never straddles two shards.
    units, i = [], 0
    while i < len(tensors):
        n = 6 if tensors[i][1] == "U8" else 1
        units.append(tensors[i: i + n])
        i += n
    shards, cur = [[]], 0
    for u in units:
        size = sum(len(t[3]) for t in u)
        if cur and cur + size > SHARD_BYTES:
            shards.append([])
            cur = 0
        shards[-1].extend(u)
        cur += size
    names = [f"model-{k + 1:05d}-of-{len(shards):06d}.safetensors" for k in range(len(shards))]
    weight_map, total = {}, 0
    for name, ts in zip(names, shards):
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for tn, dt, shape, data in ts:
            header[tn] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
            off += len(data)
            weight_map[tn] = name
        total += off
        hs = json.dumps(header, separators=(",", ":"))
        hs += " " * ((8 - len(hs) % 8) % 8)
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(struct.pack("<Q", len(hs)))
            f.write(hs.encode())
            for _, _, _, data in ts:
                f.write(data)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(full_config(model.c), f, indent=1)
    return stored


def exact_model(stored, device, c, dtype=torch.float64):
    """A Model whose weights are the exported values (BF16 / F32 upcast, MXFP4 dequantized)."""
    m = Model(c).to(device)
    m.exact_dtype = dtype
    m.deq = {}
    with torch.no_grad():
        for n, (shape, kind) in m.specs.items():
            if kind in ("emat", "eout"):
                part = n.rsplit(".", 1)[1]
                base = n[: -len("experts." + part)]
                mats = []
                for e in range(m.E):
                    nm = f"{base}experts.{e}.{part}"
                    mats.append(mx_dequant(mx_unpack(stored[nm + ".weight_packed"]), torch.as_tensor(stored[nm + ".weight_scale"]), dtype))
                m.deq[base + part] = torch.stack(mats).to(device)
            else:
                m.p(n).data = stored[n].to(dtype).to(device)
        for n, t in m.named_buffers():
            nm = n.replace("__", ".")
            t.data = stored[nm].to(dtype).to(device)
    return m


# ----------------------------------------------------------------------------------------------
DEV = "cuda" if torch.cuda.is_available() else "cpu"
AMP = DEV == "cuda"  # bf16 autocast on the GPU; the CPU path (local checks) runs in f32


def train(args):
    dev = DEV
    torch.manual_seed(0)
    data = torch.from_numpy(np.fromfile(args.ids, dtype="<u2").astype(np.int64))
    print(f"tokens {len(data)}", flush=True)
    model = Model(SIZES[args.size]).to(dev)
    fix_dt_bias(model)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"params {nparams}", flush=True)
    decay = [p for n, p in model.params.items() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in model.params.items() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), **({"fused": True} if AMP else {}))
    B, T = args.batch, args.seq
    gpu_data = data.to(dev)
    t0 = time.time()
    step = 0
    log = []
    moe_names = [n[: -len("gate.weight")] for n in model.specs if n.endswith("block_sparse_moe.gate.weight")]
    while True:
        el = time.time() - t0
        frac = el / args.seconds
        if frac >= 1 or (args.steps and step >= args.steps):
            break
        warm = min(1.0, step / args.warmup)
        lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1))))
        for gr in opt.param_groups:
            gr["lr"] = lr
        model.qat = frac >= 1 - args.qat_fraction
        starts = torch.randint(0, len(data) - T - 1, (B,), device=dev)
        idx = starts[:, None] + torch.arange(T + 1, device=dev)
        batch = gpu_data[idx]
        stats = []
        tgt = batch[:, 1:].reshape(-1)
        with torch.autocast("cuda", dtype=torch.bfloat16) if AMP else _null():
            if args.sampled_softmax:
                # CPU speed-up: softmax over the batch's target ids plus N random ids (a sampled
                # softmax; the full head is trained row by row as ids come up, evaluation is exact)
                h = model(batch[:, :-1], stats, hidden_only=True).reshape(-1, model.c["hidden_size"])
                cand = torch.unique(torch.cat([tgt, torch.randint(0, VOCAB, (args.sampled_softmax,), device=dev)]))
                remap = torch.full((VOCAB,), -1, dtype=torch.long, device=dev)
                remap[cand] = torch.arange(len(cand), device=dev)
                logits = lin(h, model.p("lm_head.weight")[cand])
                tgt = remap[tgt]
            else:
                logits = model(batch[:, :-1], stats).reshape(-1, VOCAB)
        loss = F.cross_entropy(logits.float(), tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # aux-loss-free balancing of the selection bias
            for m, cnt in zip(moe_names, stats):
                bvec = model.bias(m + "gate.e_score_correction_bias")
                bvec -= args.bias_rate * torch.sign(cnt.float() - cnt.float().mean())
        if step % args.log_every == 0:
            ls = loss.item()
            log.append({"step": step, "s": round(el, 1), "loss": ls, "lr": lr, "qat": model.qat})
            print(f"step {step} t {el:.0f}s loss {ls:.3f} lr {lr:.2e} qat {model.qat}", flush=True)
        step += 1
    print(f"trained {step} steps in {time.time() - t0:.0f}s, {step * B * T} tokens", flush=True)
    return model, log


@torch.no_grad()
def heldout_ppl(model, ids, dev, window=256, dtype=None):
    """Perplexity as `wren perplexity` defines it: windows of [BOS] + window-1 file tokens (the last
    one shorter), each from a fresh state; every file token scored once."""
    nll, n = 0.0, 0
    step = window - 1
    wins = [ids[i: i + step] for i in range(0, len(ids), step)]
    groups = {}
    for w in wins:
        groups.setdefault(len(w), []).append(w)
    for ln, ws in groups.items():
        for j in range(0, len(ws), 32):
            x = torch.tensor([[BOS] + list(w) for w in ws[j: j + 32]], device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16) if AMP and dtype is None else _null():
                lg = model(x).double()
            lp = torch.log_softmax(lg[:, :-1], -1).gather(-1, x[:, 1:, None])
            nll -= lp.sum().item()
            n += lp.numel()
    return math.exp(nll / n), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["train", "smoke"])
    ap.add_argument("ids")
    ap.add_argument("out")
    ap.add_argument("--heldout", default=None, help="uint16 ids of the held-out text (tokenize.js heldout-text.u16)")
    ap.add_argument("--prompts", default=None, help="JSON list of id lists: reference logits are saved for them")
    ap.add_argument("--heldout-tokens", type=int, default=40000)
    ap.add_argument("--size", choices=sorted(SIZES), default="gpu")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0 = torch's default)")
    ap.add_argument("--seconds", type=float, default=330)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--warmup", type=int, default=100, help="warm-up steps")
    ap.add_argument("--sampled-softmax", type=int, default=0,
                    help="train the head on the batch's targets + N random ids (CPU speed-up; 0 = full softmax)")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--qat-fraction", type=float, default=0.25)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    args = ap.parse_args()
    if args.mode == "smoke":
        args.steps = args.steps or 30
        args.qat_fraction = 0.5
    dev = DEV
    if args.threads:
        torch.set_num_threads(args.threads)
    model, log = train(args)
    stored = export(model, args.out)
    report = {"log": log}
    torch.set_grad_enabled(False)
    ex = exact_model(stored, dev, model.c)
    # training forward (autocast off, f32) on the exported values vs the exact f64 forward
    if args.prompts:
        prompts = json.load(open(args.prompts))
        ref_dir = os.path.join(args.out, "reference")
        os.makedirs(ref_dir, exist_ok=True)
        cases = []
        for k, ids in enumerate(prompts):
            x = torch.tensor([ids], device=dev)
            lg = ex(x)[0]
            lg.float().cpu().numpy().astype("<f4").tofile(os.path.join(ref_dir, f"prompt{k}.logits.f32"))
            # greedy continuation by full recompute
            seq, margins = list(ids), []
            for _ in range(8):
                last = ex(torch.tensor([seq], device=dev))[0, -1]
                top = torch.topk(last, 2).values
                margins.append(float(top[0] - top[1]))
                seq.append(int(last.argmax()))
            cases.append({"ids": ids, "greedy_next": seq[len(ids):], "greedy_margins": margins})
            ex32 = exact_model(stored, dev, model.c, torch.float32) if k == 0 else ex32
            l32 = ex32(x)[0].double()
            rel = float((l32 - lg).norm() / lg.norm())
            cases[-1]["f32_vs_f64_rel_l2"] = rel
            print(f"prompt {k}: {len(ids)} ids, f32 vs f64 rel-L2 {rel:.2e}, greedy {cases[-1]['greedy_next']}", flush=True)
        json.dump(cases, open(os.path.join(ref_dir, "cases.json"), "w"), indent=1)
    if args.heldout:
        h = np.fromfile(args.heldout, dtype="<u2").astype(np.int64).tolist()
        ppl, n = heldout_ppl(ex, h[: args.heldout_tokens], dev, dtype=torch.float64)
        report["heldout_ppl_exact"] = {"ppl": ppl, "tokens": n}
        print(f"heldout ppl (exact, exported weights) {ppl:.3f} over {n} tokens", flush=True)
    json.dump(report, open(os.path.join(args.out, "train_log.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
