"""The GPU runbook (`scripts/gpu-check`): checks, profiles and a serving
measurement of moshid's CUDA backend on a machine WITH a GPU, in one short
lease, everything it finds written into one output folder.

Module map: `main` (the phases in order, their time boxes, the exit
status), `runner` (the clock, steps as child processes, the output folder),
`summary` (the compact summary, pure functions), `cuda_env` (the CUDA
libraries, headers and tools, and env.txt), `probe` (loads the libraries
as cudarc does, in a child process), `checks` (device, per-kernel and
golden tests, the compile gate), `profile` (per-phase profiles of the
previous build and of this one, and the official PyTorch implementation
beside them), `serve` (the daemon serving real-time callers from the GPU),
`rtp_peer` (one RTP call through the daemon's control API).

Standard library only: the GPU machine has python3 (3.12) and nothing can
be installed there.
"""
