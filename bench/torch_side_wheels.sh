#!/usr/bin/env bash
# Fetches the wheels bench/torch_step.py needs on a GPU machine that has
# PyTorch but no network: the official `moshi` 0.2.13 (pure Python; its
# dependencies are not taken, it pins torch<2.10) and `einops` (pure Python,
# imported by its model code). About 180 KB, in .cache/torch-side-wheels
# (git-ignored) for the runbook to carry. There, before the script:
#
#   python3 -m pip install --no-deps --no-index .cache/torch-side-wheels/*.whl
#   python3 bench/torch_step.py --batch 1,8,32,64 --out torch-step.json
#
# (or, without installing: PYTHONPATH=<the wheels unzipped>). Every other
# import-time dependency of moshi's loaders is replaced by an empty module
# when missing (see bench/torch_step.py).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.cache/torch-side-wheels
mkdir -p "$dir"
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$dir" \
  "moshi==0.2.13" "einops>=0.7,<0.9"
ls -l "$dir"
du -sh "$dir"
