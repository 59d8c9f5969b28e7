#!/usr/bin/env python3
"""Regenerate the Ogg Opus interop fixtures used by daemon/tests/codec_*.rs.

Run once from anywhere: `python3 daemon/tests/data/make_ogg_fixtures.py`.
Requires `sphn` (Kyutai's Ogg Opus streams; pip install sphn) and numpy.

Each fixture is written exactly as Kyutai's clients and server produce audio on
the WebSocket: `sphn.OpusStreamWriter(24000)`, `append_pcm` of 1920-sample
(80 ms) float32 frames, every returned byte run concatenated. The signals are
deterministic and re-created by the Rust tests from the same formulas
(keep `signal()` in sync with `tests/codec_common/mod.rs`).

Alongside each `.ogg`, `<name>.json` records what sphn's own reader returns
for it (sample count, rms) so the tests can compare our decoder with sphn's.
"""
import json
import os
import sys

import numpy as np
import sphn

SAMPLE_RATE_HZ = 24000
FRAME_SAMPLES = 1920
HERE = os.path.dirname(os.path.abspath(__file__))


def signal(kind: str, n_samples: int) -> np.ndarray:
    t = np.arange(n_samples, dtype=np.float64) / SAMPLE_RATE_HZ
    if kind == "sine440":
        x = 0.5 * np.sin(2.0 * np.pi * 440.0 * t)
    elif kind == "chirp":
        # Linear chirp 200 Hz -> 4000 Hz over the whole signal.
        duration_s = n_samples / SAMPLE_RATE_HZ
        f0, f1 = 200.0, 4000.0
        k = (f1 - f0) / duration_s
        x = 0.4 * np.sin(2.0 * np.pi * (f0 * t + 0.5 * k * t * t))
    else:
        raise ValueError(kind)
    return x.astype(np.float32)


FIXTURES = [
    # name, signal kind, number of 80 ms frames
    ("sphn_sine440_1s", "sine440", 13),   # 13 * 1920 = 24960 samples (1.04 s)
    ("sphn_chirp_2s", "chirp", 25),       # 25 * 1920 = 48000 samples (2 s)
]


def main() -> int:
    for name, kind, n_frames in FIXTURES:
        pcm = signal(kind, n_frames * FRAME_SAMPLES)
        writer = sphn.OpusStreamWriter(SAMPLE_RATE_HZ)
        chunks = []
        for i in range(n_frames):
            out = writer.append_pcm(pcm[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES])
            if len(out) > 0:
                chunks.append(bytes(out))
        data = b"".join(chunks)
        with open(os.path.join(HERE, name + ".ogg"), "wb") as f:
            f.write(data)
        reader = sphn.OpusStreamReader(SAMPLE_RATE_HZ)
        decoded = np.asarray(reader.append_bytes(data), dtype=np.float32)
        meta = {
            "signal": kind,
            "sample_rate_hz": SAMPLE_RATE_HZ,
            "input_samples": int(n_frames * FRAME_SAMPLES),
            "message_bytes": [len(c) for c in chunks],
            "sphn_decoded_samples": int(decoded.shape[-1]),
            "sphn_decoded_rms": float(np.sqrt(np.mean(decoded.astype(np.float64) ** 2))),
        }
        with open(os.path.join(HERE, name + ".json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
        print(name, len(data), "bytes", meta["sphn_decoded_samples"], "samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
