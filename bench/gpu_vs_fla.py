#!/usr/bin/env python3
"""Side-by-side GPU prefill: transformers (+ fla Triton kernels) vs Wren on one checkpoint.

Run on the GPU machine (bench/gpu_vs_fla.sh does all steps in one go):
  1. build a random Kimi-Linear-48B-A3B-size checkpoint with transformers (6 layers: KDA x5 + MLA at
     layer 4, hidden 2304, 32 KDA heads x 128, 256 experts top-8, vocab 163840; BF16) and save it;
  2. time transformers' prefill (logits of the last position) at each prompt length, with the fla
     kernels when fla imports, else transformers' PyTorch fallbacks (the script says which);
  3. time `wren bench prefill` on the same folder (the caller passes the Wren command line);
  4. print the ratios.
Every step prints its wall time. Timings: one warm-up, then the median of --repeat runs,
synchronized (torch.cuda.synchronize) host clock; Wren the same (bench prefill).
"""
import argparse
import json
import os
import subprocess
import sys
import time

CONFIG = {  # transformers 5.17 `kimi_linear` keys (as its save_pretrained writes them), 48B-A3B sizes
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "dtype": "bfloat16",
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2304, "initializer_range": 0.02,
    "intermediate_size": 9216, "kv_lora_rank": 512, "mla_use_nope": True, "model_max_length": 1048576,
    "moe_intermediate_size": 1024, "moe_layer_freq": 1, "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid", "num_attention_heads": 32, "num_expert_group": 1,
    "num_experts": 256, "num_experts_per_token": 8, "num_hidden_layers": 6, "num_key_value_heads": 32,
    "num_shared_experts": 1, "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "head_dim": 192, "qk_head_dim": 192, "rms_norm_eps": 1e-05,
    "rope_parameters": None, "rope_theta": 10000.0, "routed_scaling_factor": 2.446, "tie_word_embeddings": False,
    "topk_group": 1, "use_cache": True, "use_grouped_topk": True, "vocab_size": 163840,
    "linear_attn_config": {"full_attn_layers": [4], "head_dim": 128, "kda_layers": [1, 2, 3, 5, 6],
                           "num_heads": 32, "short_conv_kernel_size": 4},
    "linear_conv_kernel_dim": 4, "linear_head_dim": 128, "linear_num_heads": 32,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 2,
    "mlp_layer_types": ["dense"] + ["sparse"] * 5,
    "transformers_version": "5.17.0",
}


def log(msg):
    print(f"[gpu_vs_fla {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_checkpoint(out, seed):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    cfg = AutoConfig.from_pretrained(out)
    torch.manual_seed(seed)
    t0 = time.time()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    torch.cuda.synchronize()
    n = sum(p.numel() for p in model.parameters())
    log(f"model built on the GPU: {n / 1e9:.2f} B parameters, {time.time() - t0:.1f} s")
    t0 = time.time()
    model.save_pretrained(out, max_shard_size="4GB")
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    log(f"checkpoint written: {size / 1e9:.1f} GB in {time.time() - t0:.1f} s ({out})")
    return model


def fla_status(model):
    """Which fla kernels the transformers model module holds (empty: PyTorch fallbacks)."""
    mod = sys.modules.get(type(model).__module__)
    names = sorted(k for k, v in vars(mod).items() if getattr(v, "__module__", "") and
                   str(getattr(v, "__module__", "")).startswith("fla"))
    return names


def time_hf(model, lengths, repeat, vocab):
    import torch
    res = {}
    g = torch.Generator(device="cuda").manual_seed(1)
    for n in lengths:
        ids = torch.randint(0, vocab, (1, n), device="cuda", generator=g)
        ts = []
        try:
            with torch.no_grad():
                for r in range(repeat + 1):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    try:
                        model(input_ids=ids, use_cache=True, logits_to_keep=1)
                    except TypeError:  # no logits_to_keep: every position's logits
                        model(input_ids=ids, use_cache=True)
                    torch.cuda.synchronize()
                    if r > 0:
                        ts.append(time.perf_counter() - t0)
        except torch.cuda.OutOfMemoryError as e:
            log(f"transformers at {n} tokens: out of memory ({str(e)[:120]})")
            torch.cuda.empty_cache()
            continue
        ts.sort()
        res[n] = ts[len(ts) // 2]
        log(f"transformers prefill {n} tokens: {res[n]:.4f} s = {n / res[n]:.0f} tok/s (runs {['%.4f' % t for t in ts]})")
    return res


def time_hf_decode(model, prompt, steps, vocab):
    """transformers' greedy decode: seconds per token (median over `steps` single-token forwards
    with the cache, after a `prompt`-token prefill and 2 warm-up tokens)."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(2)
    ids = torch.randint(0, vocab, (1, prompt), device="cuda", generator=g)
    ts = []
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        cache = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        for s in range(steps + 2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
            nxt.item()  # the token on the host, as a generation loop needs it
            if s >= 2:
                ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/kimi-linear-48b-6l")
    ap.add_argument("--lengths", default="512,4096,16384")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--wren", nargs="*", default=[], help="Wren command lines (each one string), run after transformers")
    ap.add_argument("--json", default="")
    ap.add_argument("--decode-prompt", type=int, default=64, help="prompt before the timed decode tokens (0: no decode)")
    ap.add_argument("--decode-steps", type=int, default=32)
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    import torch
    import transformers
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {torch.cuda.get_device_name(0)}")
    try:
        import fla  # noqa: F401
        import transformers.utils as tu
        import transformers.utils.import_utils as iu
        log(f"transformers sees fla: {iu.is_flash_linear_attention_available()}")
        # fla from source: the caller's folder may lack pip metadata; the import above worked.
        iu.is_flash_linear_attention_available = lambda: True
        tu.is_flash_linear_attention_available = lambda: True
        log(f"fla imported from {os.path.dirname(fla.__file__)} (version {getattr(fla, '__version__', '?')})")
    except Exception as e:  # noqa: BLE001
        log(f"fla not importable: {e!r}")
    t0 = time.time()
    model = build_checkpoint(a.out, 0)
    used = fla_status(model)
    log(f"fla kernels in the transformers model module: {used if used else 'none (PyTorch fallbacks)'}")
    hf = time_hf(model, lengths, a.repeat, CONFIG["vocab_size"])
    hf_decode = None
    if a.decode_prompt > 0:
        hf_decode = time_hf_decode(model, a.decode_prompt, a.decode_steps, CONFIG["vocab_size"])
        log(f"transformers decode after {a.decode_prompt} tokens: {hf_decode * 1e3:.2f} ms/token = {1 / hf_decode:.1f} tok/s")
    loaded = sorted(m for m in sys.modules if m.startswith("fla.ops") and m.count(".") == 2)
    log(f"fla kernel modules loaded after the transformers runs: {loaded if loaded else 'none'}")
    used = used or loaded
    del model
    torch.cuda.empty_cache()
    wren = {}
    decode = {}
    for cmd in a.wren:
        log(f"running: {cmd}")
        t1 = time.time()
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
        # The tables in full (bench prefill --profile prints one per length); the JSON line is kept
        # whole in wren_stdout.txt beside --json.
        sys.stdout.write("\n".join(l for l in p.stdout.splitlines() if not l.startswith("{"))[-30000:] + "\n")
        sys.stderr.write(p.stderr[-4000:])
        if a.json:
            with open(os.path.join(os.path.dirname(a.json) or ".", "wren_stdout.txt"), "a") as f:
                f.write(p.stdout)
        log(f"exit {p.returncode} after {time.time() - t1:.1f} s")
        for line in p.stdout.splitlines():
            if line.startswith("{"):
                j = json.loads(line)
                if "floor_ms" in j:  # bench batch: the one-sequence decode step against its floor
                    for r in j.get("runs", []):
                        if r.get("batch") == 1 and r.get("pass", "default") == "default" and not r.get("host_draw"):
                            decode = {"ms": r["ms_per_step"], "floor_ms": j["floor_ms"], "vs_floor": r["vs_floor"],
                                      "copy_GBps": j["copy_GBps"]}
                    continue
                key = j.get("gpu_precision", "?") + " " + j.get("backend", "")
                wren[key] = {r["tokens"]: r["prefill_s"] for r in j["runs"]}
                if "exact" in j:
                    wren["exact " + j.get("backend", "")] = {j["exact"]["tokens"]: j["exact"]["prefill_s"]}
    print("\n| prompt tokens | transformers+fla tok/s | " + " | ".join(f"Wren {k} tok/s | ratio" for k in wren) + " |")
    print("|---|---|" + "---|---|" * len(wren))
    for n in lengths:
        h = hf.get(n)
        row = f"| {n} | {n / h:.0f} |" if h else f"| {n} | — |"
        for k, v in wren.items():
            w = v.get(n)
            row += f" {n / w:.0f} | {h / w:.2f}x |" if (w and h) else (f" {n / w:.0f} | — |" if w else " — | — |")
        print(row)
    if decode:
        print(f"\n| decode (1 sequence, after {a.decode_prompt} tokens) | ms/token | tok/s | vs floor ({decode['floor_ms']:.3f} ms at "
              f"{decode['copy_GBps']:.0f} GB/s) |")
        print("|---|---|---|---|")
        if hf_decode:
            print(f"| transformers+fla | {hf_decode * 1e3:.2f} | {1 / hf_decode:.1f} | {hf_decode * 1e3 / decode['floor_ms']:.2f}x |")
        print(f"| Wren fast | {decode['ms']:.3f} | {1e3 / decode['ms']:.1f} | {decode['vs_floor']:.2f}x |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"transformers_s": hf, "wren_s": wren, "fla_kernels": used, "transformers_decode_s": hf_decode,
                       "wren_decode": decode}, f, indent=1)
    log(f"total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
