#!/usr/bin/env python3
"""Times the official PyTorch implementation (PyPI `moshi` 0.2.13) on a
fixture folder (same weights, same inputs, same batch, same number of
frames as moshid's `cpu-step`), with PyTorch limited to one thread since
moshid's engine steps on one core, then runs `cpu-step` and prints the ratio
moshid / PyTorch (below 1.0: moshid is faster).

Usage: bench/torch_compare.py [FIXTURE_DIR] [--batch 1 8] [--frames 16]
Needs: pip install moshi==0.2.13 (brings PyTorch).
"""
import argparse, json, subprocess, sys, time
from pathlib import Path

import torch
from safetensors.torch import load_file
from moshi.models import LMGen
from moshi.models.loaders import get_mimi, get_moshi_lm


def time_torch(folder: Path, batch: int, frames: int, repeats: int) -> float:
    torch.set_num_threads(1)
    mimi_cfg = json.loads((folder / "mimi_config.json").read_text())
    lm_cfg = json.loads((folder / "lm_config.json").read_text())
    n_user = lm_cfg["n_q"] - lm_cfg["dep_q"]
    mimi = get_mimi(folder / "mimi.safetensors", mimi_cfg,
                    num_codebooks=max(lm_cfg["dep_q"], n_user))
    lm_kwargs = {k: v for k, v in lm_cfg.items() if k != "model_type"}
    lm = get_moshi_lm(folder / "lm.safetensors", lm_kwargs=lm_kwargs, dtype=torch.float32)
    lm.eval()
    cfg_coef, cond = 1.0, None
    if lm_cfg.get("model_type") == "hibiki":
        from moshi.conditioners import ConditionAttributes
        cfg_coef = 3.0
        conds = [ConditionAttributes(text={"description": "very_good"}, tensor={}) for _ in range(batch)]
        conds += [ConditionAttributes(text={"description": "very_bad"}, tensor={}) for _ in range(batch)]
        cond = lm.condition_provider.prepare_and_provide(conds)
    pcm = load_file(str(folder / "io.safetensors"))["pcm_in"]
    streams = pcm.shape[0]
    idx = torch.arange(batch) % streams
    pcm = pcm[idx]
    frame = 1920
    total = pcm.shape[-1]
    best = float("inf")
    for _ in range(repeats):
        gen = LMGen(lm, use_sampling=False, cfg_coef=cfg_coef, condition_tensors=cond)
        with torch.no_grad(), mimi.streaming(batch), gen.streaming(batch):
            start = time.perf_counter()
            for t in range(frames):
                off = (t * frame) % total
                codes = mimi.encode(pcm[:, :, off:off + frame])
                tokens = gen.step(codes[:, :n_user, :])
                if tokens is not None:
                    mimi.decode(tokens[:, 1:])
            best = min(best, time.perf_counter() - start)
    return best * 1000.0 / frames


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fixture", nargs="?", default=str(Path(__file__).resolve().parents[2] / "shared/golden/moshi-tiny"))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    folder = Path(a.fixture).resolve()
    root = Path(__file__).resolve().parents[1]
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "moshid-bench", "--bin", "cpu-step"], cwd=root, check=True)
    for b in a.batch:
        torch_ms = time_torch(folder, b, a.frames, a.repeats)
        out = subprocess.run([str(root / "target/release/cpu-step"), "--model", str(folder), "--batch", str(b),
                              "--frames", str(a.frames), "--repeats", str(a.repeats)],
                             cwd=root, check=True, capture_output=True, text=True).stdout
        ours = json.loads(out)["ms_per_step"]
        print(f"{folder.name} batch {b}: moshid {ours:.3f} ms/step, PyTorch (1 thread) {torch_ms:.3f} ms/step, "
              f"ratio moshid/PyTorch = {ours / torch_ms:.3f}")


if __name__ == "__main__":
    sys.exit(main())
