#!/usr/bin/env python3
"""The official implementation's frame step, timed on the same GPU as moshid.

Builds the official `LMGen` (PyPI `moshi` 0.2.13) with random weights at
Moshi 7B's shape in bf16, and the official Mimi (random weights, f32), and
times one frame as the official server runs it -- `mimi.encode` of 1920
samples, `lm_gen.step`, `mimi.decode` of the generated codes, then a
synchronisation -- for each batch size, with the CUDA graphs the official
code captures itself (`CUDAGraphed` around the temporal transformer and the
depformer, and inside Mimi). Prints one JSON object (and writes it to
`--out`).

Full context without 3,000 steps: after entering streaming mode, the script
sets every position counter of the state to `--position` (default: the
context, 3,000): the temporal transformer's RoPE offsets
(`_TransformerState.offsets`), each attention layer's ring-cache end offset
(`RingKVCache.end_offset`, so no cached position is masked as unwritten:
every query attends the whole window of `context` keys, as moshid's
`--full-context` does) and the generator's token-cache offsets
(`_LMGenState.offsets`, past the acoustic delays). The cache contents are
zeros rather than real keys: attention costs the same either way (the
official attention always reads its whole ring, masking unwritten slots).

Imports: the GPU machine has PyTorch but no network and a PyTorch newer
than `moshi` 0.2.13 accepts (`torch<2.10`), so the wheel is installed with
`pip install --no-deps` and the only other package its model code needs,
`einops` (pure Python), beside it (`bench/torch_side_wheels.sh`). The
loaders module imports `huggingface_hub`, `safetensors` and `sentencepiece`
at import time but this script downloads, reads and tokenizes nothing, so
when they are missing they are replaced by empty modules before the import
(and `numpy`, used for one `np.prod`, by `math.prod`).

    python3 bench/torch_step.py [--batch 1,8,32,64] [--steps 50] [--warmup 10]
        [--position N] [--device cuda|cpu] [--tiny] [--out FILE]

`--tiny --device cpu` rehearses the whole path on a small shape without a GPU.
"""

import argparse
import importlib
import json
import math
import sys
import time
import types


def stub_missing_imports():
    """Empty stand-ins for the import-time-only dependencies of moshi's
    loaders, when they are not installed (see the module doc)."""
    stubs = {
        "huggingface_hub": {"hf_hub_download": None},
        "huggingface_hub.errors": {"EntryNotFoundError": Exception},
        "safetensors": {},
        "safetensors.torch": {"load_file": None},
        "sentencepiece": {"SentencePieceProcessor": object},
        "sphn": {},
    }
    stubbed = []
    for name, attrs in stubs.items():
        try:
            importlib.import_module(name)
        except ImportError:
            m = types.ModuleType(name)
            for k, v in attrs.items():
                setattr(m, k, v)
            sys.modules[name] = m
            stubbed.append(name)
    try:
        import numpy  # noqa: F401
    except ImportError:
        np = types.ModuleType("numpy")
        np.prod = math.prod
        sys.modules["numpy"] = np
        stubbed.append("numpy")
    return stubbed


TINY_LM = {
    "dim": 64, "text_card": 100, "existing_text_padding_id": 3, "n_q": 16, "dep_q": 8,
    "card": 2048, "num_heads": 4, "num_layers": 2, "hidden_scale": 4.125, "causal": True,
    "layer_scale": None, "context": 32, "max_period": 10000, "gating": "silu",
    "norm": "rms_norm_f32", "positional_embedding": "rope", "depformer_dim": 32,
    "depformer_dim_feedforward": 64, "depformer_num_heads": 2, "depformer_num_layers": 1,
    "depformer_layer_scale": None, "depformer_multi_linear": True, "depformer_context": 8,
    "depformer_max_period": 10000, "depformer_gating": "silu", "depformer_pos_emb": "none",
    "depformer_weights_per_step": True,
    "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
}


def set_position(lm, lm_gen, position):
    """Moves every position counter of the streaming state to `position`
    (see the module doc); returns how many attention caches it moved."""
    from moshi.modules.transformer import RingKVCache

    moved = 0
    st = lm.transformer._streaming_state
    st.offsets.fill_(position)
    for m in lm.transformer.modules():
        s = getattr(m, "_streaming_state", None)
        kv = getattr(s, "kv_cache", None)
        if isinstance(kv, RingKVCache):
            kv.end_offset.fill_(position)
            moved += 1
    lm_gen._streaming_state.offsets.fill_(position)
    return moved


def quantile(sorted_ms, q):
    rank = max(1, math.ceil(q * len(sorted_ms)))
    return sorted_ms[min(rank, len(sorted_ms)) - 1]


def time_batch(torch, lm, mimi, lm_gen_cls, b, args, dev):
    """Steps `warmup + steps` frames of batch `b`; the timed frames' ms."""
    frame = int(mimi.sample_rate / mimi.frame_rate)
    lm_gen = lm_gen_cls(lm, temp=0.8, temp_text=0.7, top_k=250, top_k_text=25)
    times = []
    moved = 0
    with torch.no_grad(), lm_gen.streaming(b), mimi.streaming(b):
        position = args.position if args.position is not None else lm.context
        moved = set_position(lm, lm_gen, position)
        gen = torch.Generator(device=dev).manual_seed(b)
        for i in range(args.warmup + args.steps):
            pcm = 0.1 * torch.randn(b, 1, frame, device=dev, generator=gen)
            if dev == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            codes = mimi.encode(pcm)
            tokens = lm_gen.step(codes)
            if tokens is not None:
                mimi.decode(tokens[:, 1:])
            if dev == "cuda":
                torch.cuda.synchronize()
            ms = (time.perf_counter() - t) * 1e3
            if i >= args.warmup:
                times.append(ms)
    del lm_gen
    return sorted(times), moved


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", default="1,8,32,64")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--position", type=int, default=None,
                   help="stream position of every slot (default: the context)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="a small shape (rehearsal)")
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args()
    batches = [int(x) for x in args.batch.split(",") if x.strip()]

    stubbed = stub_missing_imports()
    import torch
    import moshi
    from moshi.models import LMGen
    from moshi.models.loaders import get_mimi, get_moshi_lm, _lm_kwargs

    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_step.py: no CUDA device (use --device cpu --tiny to rehearse)")
    torch.manual_seed(0)
    t0 = time.perf_counter()
    lm_kwargs = TINY_LM if args.tiny else _lm_kwargs
    lm = get_moshi_lm(None, lm_kwargs=lm_kwargs, device=dev, dtype=torch.bfloat16)
    lm.eval()
    mimi = get_mimi(None, device=dev)
    mimi.set_num_codebooks(lm.dep_q)
    mimi.eval()
    build_s = time.perf_counter() - t0

    out = {
        "tool": "bench/torch_step.py",
        "implementation": f"moshi {moshi.__version__} LMGen + Mimi (official), random weights",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "shape": "tiny" if args.tiny else "moshi7b",
        "context": lm.context,
        "position": args.position if args.position is not None else lm.context,
        "lm_dtype": "bf16",
        "cuda_graphs": dev == "cuda",
        "stubbed_imports": stubbed,
        "build_s": round(build_s, 1),
        "steps": args.steps,
        "warmup": args.warmup,
        "step": "mimi.encode + lm_gen.step + mimi.decode + synchronize, wall clock",
        "results": [],
    }
    for b in batches:
        try:
            times, moved = time_batch(torch, lm, mimi, LMGen, b, args, dev)
            r = {
                "batch": b,
                "p50_ms": round(quantile(times, 0.5), 3),
                "p99_ms": round(quantile(times, 0.99), 3),
                "mean_ms": round(sum(times) / len(times), 3),
                "attention_caches_at_position": moved,
            }
        except Exception as e:  # an OOM at a large batch must not lose the rest
            r = {"batch": b, "error": f"{type(e).__name__}: {e}"[:500]}
        out["results"].append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
        if dev == "cuda":
            torch.cuda.empty_cache()
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
