"""The profile phase's plumbing with stand-in gpu-bench executables (one with
`--profile`, one without, as a baseline built before it existed): which
mode each build is run in, the arguments, the reports collected, the
summary's comparison line."""

import json
import os
import stat
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from gpucheck import profile  # noqa: E402
from gpucheck.bundle import Bundle  # noqa: E402
from gpucheck.runner import Runner  # noqa: E402

# A gpu-bench stand-in: --help prints a usage (with or without --profile);
# a run writes the report gpu-bench would, p50 = 10 × batch (+ 5 for the
# old build), where gpu-bench would write it.
FAKE = r'''#!/usr/bin/env python3
import json, os, sys
PROFILE = %(profile)r
a = sys.argv[1:]
if a == ["--help"]:
    print("usage: gpu-bench [--model M] [--batch B]" + (" [--profile] [--json FILE]" if PROFILE else ""))
    sys.exit(2)
if "--profile" in a and not PROFILE:
    print("unknown argument `--profile`"); sys.exit(2)
v = lambda k: a[a.index(k) + 1]
batches = [int(b) for b in v("--batch").split(",")]
rows = [{"graphs": True, "batch": b, "wall_p50_ms" if PROFILE else "p50_ms": 10.0 * b + (0 if PROFILE else 5),
         "phases": [{"phase": "attention", "ms": 1.0 * b, "share": 0.5, "x_floor": 3.0}]} for b in batches]
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls"), "a") as f:
    f.write(" ".join(a) + "\n")
if PROFILE:
    path, doc = v("--json"), {"tool": "gpu-bench --profile", "profiles": rows}
else:
    path = os.path.join(v("--out"), "gpu-bench-%%s-kv%%s.json" %% (os.path.basename(v("--model")), v("--kv")))
    doc = {"results": rows, "not_measured": []}
with open(path, "w") as f:
    json.dump(doc, f)
'''


def fake_bundle(root, with_profile):
    os.makedirs(os.path.join(root, "bin"))
    exe = os.path.join(root, "bin", "gpu-bench")
    with open(exe, "w") as f:
        f.write(FAKE % {"profile": with_profile})
    os.chmod(exe, os.stat(exe).st_mode | stat.S_IEXEC)
    with open(os.path.join(root, "MANIFEST"), "w") as f:
        f.write("commit: %s\n" % ("new" if with_profile else "old"))
    return Bundle(root)


class Settings:
    steps, warmup, profile_steps, rehearsal = 5, 1, 2, False


class ProfilePhaseTest(unittest.TestCase):
    def test_both_builds_side_by_side(self):
        top = tempfile.mkdtemp()
        cur = fake_bundle(os.path.join(top, "cur"), True)
        base = fake_bundle(os.path.join(top, "base"), False)
        r = Runner(tempfile.mkdtemp(), 600, os.getcwd(), tempfile.mkdtemp())
        r.min_step_s = 0
        r.start_phase("profile", 300)
        results = {}
        saved = []
        old_runs = profile.PROFILE_RUNS
        profile.PROFILE_RUNS = [("moshi7b", "bf16", [1, 64], [1, 64], 3000, 30),
                                ("hibiki2b", "bf16", [1], [], 1500, 30)]
        try:
            profile.profile_phase(r, [("current", cur), ("baseline", base)], Settings, results,
                                  lambda: saved.append(1))
        finally:
            profile.PROFILE_RUNS = old_runs
        self.assertEqual([x[2] for x in r.results], ["PASS"] * 3)
        with open(os.path.join(cur.root, "bin", "calls")) as f:
            calls = f.read().splitlines()
        self.assertTrue(calls[0].startswith("--profile --profile-steps 2 --json "), calls[0])
        self.assertIn("--context 3000", calls[0])
        with open(os.path.join(base.root, "bin", "calls")) as f:
            old = f.read().splitlines()
        self.assertEqual(len(old), 1, "the baseline runs only what it has batches for")
        self.assertIn("--graphs on", old[0])
        self.assertNotIn("--profile", old[0])
        self.assertEqual([e["mode"] for e in results["profile"]["current"]], ["profile", "profile"])
        self.assertEqual(results["profile"]["baseline"][0]["mode"], "steps")
        self.assertEqual(len(saved), 3)
        lines = profile.profile_lines(results)
        self.assertEqual(lines[0], "moshi7b bf16 p50 ms, previous → this build: b1 15.0 → 10.0 "
                                   "(0.67×) b64 645.0 → 640.0 (0.99×)")
        self.assertIn("attention", lines[-1])
        json.dumps(results)


if __name__ == "__main__":
    unittest.main()
