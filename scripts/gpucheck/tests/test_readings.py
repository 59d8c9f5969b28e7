"""The pure parts: the summary's shape, the readings of the tools' reports,
the serve phase's plans and analyses, the phase boxes, µ-law."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from gpucheck import checks, main, profile, rtp_peer, serve, summary  # noqa: E402

# gpu-bench's step-time report, as the first H200 run wrote it (shortened).
STEPS_REPORT = {
    "gpu": "NVIDIA H200", "model": "moshi7b", "full_context": True,
    "results": [
        {"graphs": True, "batch": 1, "steps": 200, "p50_ms": 36.87, "p99_ms": 37.09, "max_ms": 37.5},
        {"graphs": True, "batch": 64, "steps": 200, "p50_ms": 65.36, "p99_ms": 65.56, "max_ms": 66.0},
        {"graphs": False, "batch": 1, "steps": 200, "p50_ms": 38.01, "p99_ms": 38.2, "max_ms": 39.0},
    ],
    "not_measured": [{"graphs": True, "batch": 128, "why": "does not fit"}],
}
# A per-phase profile, in the shape issue 26 describes (field names may differ:
# the readers look for a batch and a p50 wherever they are).
PROFILE_REPORT = {
    "model": "moshi7b", "kv": "bf16",
    "runs": [
        {"batch": 1, "wall_p50_ms": 12.5, "wall_p99_ms": 13.0, "gpu_ms": 11.9, "nodes": 900,
         "phases": [{"name": "attention", "ms": 4.0, "share": 0.33, "x_floor": 6.1},
                    {"name": "mimi encoder", "ms": 3.0, "share": 0.25, "x_floor": 9.0},
                    {"name": "depformer gemms", "ms": 1.0, "share": 0.08, "x_floor": 1.5}]},
        {"batch": 64, "wall_p50_ms": 30.0, "wall_p99_ms": 31.0, "phases": []},
    ],
}


class SummaryTest(unittest.TestCase):
    def test_the_summary_has_at_most_100_lines_whatever_is_recorded(self):
        results = [("p", "step-%d" % i, "FAIL(1)", 1, "x") for i in range(150)]
        failures = [("step-%d" % i, "FAIL(1)", ["error: %d" % i]) for i in range(150)]
        text = summary.compose("now", 1, 540, "p", ["gpu: x"], results,
                               [("sec", ["a"] * 30)], failures)
        lines = text.splitlines()
        self.assertLessEqual(len(lines), summary.MAX_LINES)
        self.assertEqual(lines[-1], "=== end of summary")

    def test_failures_follow_the_sections(self):
        text = summary.compose("now", 1, 540, "p", [], [("p", "a", "FAIL(2)", 1, "n")],
                               [("golden", ["g1"]), ("empty", [])],
                               [("a", "FAIL(2)", ["error: boom"])])
        self.assertIn("--- golden\ng1\n--- failures", text)
        self.assertNotIn("--- empty", text)
        self.assertIn("    error: boom", text)

    def test_step_rows_of_both_report_kinds(self):
        self.assertEqual(summary.step_rows(STEPS_REPORT)[0], (True, 1, 36.87, 37.09))
        rows = summary.step_rows(PROFILE_REPORT)
        self.assertEqual(rows, [(None, 1, 12.5, 13.0), (None, 64, 30.0, 31.0)])
        self.assertEqual(summary.best_p50(STEPS_REPORT, 1), 36.87)
        self.assertIsNone(summary.best_p50(STEPS_REPORT, 8))

    def test_step_line_and_comparison(self):
        lines = summary.step_line("moshi7b bf16", STEPS_REPORT)
        self.assertEqual(lines[0], "moshi7b bf16 graphs on: b1 36.87/37.09 b64 65.36/65.56")
        self.assertIn("1 batch size(s) not measured", lines[-1])
        line = summary.compare_line("moshi7b bf16", [1, 8, 64], PROFILE_REPORT, STEPS_REPORT)
        self.assertEqual(line, "moshi7b bf16 p50 ms, previous → this build: b1 36.9 → 12.5 (0.34×) "
                               "b64 65.4 → 30.0 (0.46×)")
        self.assertIn("b1 - → 12.5", summary.compare_line("x", [1], PROFILE_REPORT, None))

    def test_slowest_phases(self):
        lines = summary.profile_phases(PROFILE_REPORT)
        self.assertEqual(lines[0], "b1: attention 4.00 ms (33 %, 6.1× floor); mimi encoder 3.00 ms "
                                   "(25 %, 9.0× floor); depformer gemms 1.00 ms (8 %, 1.5× floor)")

    def test_golden_lines(self):
        log = "noise\nAGREEMENT moshi-tiny f32: 100% agree\nAGREEMENT x\n"
        self.assertEqual(summary.golden_lines(log), ["moshi-tiny f32: 100% agree", "x"])


class ProfileTest(unittest.TestCase):
    def test_profile_lines_compare_builds_and_fall_back_to_steps(self):
        results = {"profile": {
            "current": [{"model": "moshi7b", "kv": "bf16", "batches": [1, 64], "mode": "profile",
                         "report": PROFILE_REPORT},
                        {"model": "hibiki2b", "kv": "bf16", "batches": [1], "mode": "steps",
                         "report": {"results": [{"graphs": True, "batch": 1, "p50_ms": 27.0,
                                                 "p99_ms": 28.0}]}}],
            "baseline": [{"model": "moshi7b", "kv": "bf16", "batches": [1, 64], "mode": "steps",
                          "report": STEPS_REPORT}]}}
        lines = profile.profile_lines(results)
        self.assertTrue(lines[0].startswith("moshi7b bf16 p50 ms, previous → this build: b1 36.9"))
        self.assertEqual(lines[1], "hibiki2b bf16 p50 ms, previous → this build: b1 - → 27.0")
        self.assertIn("slowest phases: b1: attention", lines[2])

    def test_torch_ratio(self):
        results = {"profile": {"current": [{"model": "moshi7b", "kv": "bf16", "batches": [1, 64],
                                            "mode": "profile", "report": PROFILE_REPORT}]},
                   "torch": {"batches": [1, 8], "context": 3000,
                             "report": {"rows": [{"batch": 1, "p50_ms": 30.0},
                                                 {"batch": 8, "p50_ms": 40.0}]}}}
        line = profile.torch_lines(results)[0]
        self.assertIn("b1 30.0 vs 12.5 ms (2.40×)", line)
        self.assertIn("b8 40.0 vs -", line)

    def test_gpu_bench_arguments(self):
        class S:
            steps, warmup, profile_steps, rehearsal = 30, 5, 10, False
        argv, path = profile.bench_argv("gb", True, "moshi7b", "fp8", [64, 128], 3000, "/o", "/c", S)
        self.assertEqual(argv[:10], ["gb", "--profile", "--profile-steps", "10", "--json",
                                     "/o/profile-moshi7b-kvfp8.json", "--model", "moshi7b",
                                     "--batch", "64,128"])
        self.assertIn("--context", argv)
        argv, path = profile.bench_argv("gb", False, "moshi7b", "bf16", [1], 3000, "/o", "/c", S)
        self.assertNotIn("--profile", argv)
        self.assertEqual(path, "/o/gpu-bench-moshi7b-kvbf16.json")
        self.assertEqual(argv[argv.index("--graphs") + 1], "on")

    def test_torch_arguments_follow_its_help(self):
        args = profile.torch_args("usage: [--batch BATCH [BATCH ...]] [--context N] [--json PATH]", "/j")
        self.assertEqual(args, ["--batch", "1", "8", "32", "64", "--context", "3000", "--json", "/j"])
        # bench/torch_step.py's own --help.
        theirs = ("usage: torch_step.py [-h] [--batch BATCH] [--steps STEPS] [--warmup WARMUP] "
                  "[--position POSITION] [--device {cuda,cpu}] [--tiny] [--out OUT]")
        self.assertEqual(profile.torch_args(theirs, "/j"),
                         ["--batch", "1,8,32,64", "--steps", "30", "--warmup", "5", "--out", "/j"])
        self.assertEqual(profile.torch_args(theirs, "/j", rehearsal=True)[:2], ["--batch", "1,2"])
        self.assertEqual(profile.torch_args(theirs, "/j", rehearsal=True)[-3:],
                         ["--device", "cpu", "--tiny"])


class ServeTest(unittest.TestCase):
    def test_cpus_are_split_between_daemon_and_load_generator(self):
        daemon, engine, io, loadgen = serve.plan_cpus(16)
        self.assertEqual(daemon, list(range(8)))
        self.assertEqual((engine, io, loadgen), (0, [1, 2, 3, 4, 5, 6], list(range(8, 16))))
        self.assertIsNone(serve.plan_cpus(2))
        self.assertEqual(serve.plan_cpus(4)[2], [1])

    def test_ramps(self):
        self.assertEqual(serve.ramp_for(75, False), [1, 32, 64, 75])
        self.assertEqual(serve.ramp_for(150, False), [1, 32, 64, 96, 128, 150])
        self.assertEqual(serve.ramp_for(64, False), [1, 32, 64])
        self.assertEqual(serve.ramp_for(1, False), [1])
        self.assertEqual(serve.ramp_for(8, True), [1, 2, 4])

    def test_a_ramp_is_cut_to_its_time(self):
        ramp = [1, 32, 64, 96, 128, 160]
        self.assertEqual(serve.fit_ramp(ramp, 200, 8), ramp)
        self.assertEqual(serve.fit_ramp(ramp, 8 + 4 * 12, 8), [1, 64, 96, 160])
        self.assertEqual(serve.fit_ramp(ramp, 8 + 2 * 12, 8), [1, 160])
        self.assertEqual(serve.fit_ramp(ramp, 10, 8), [1])

    def test_ready_line(self):
        err = ("<6>backend: cuda ...\n<6>ready: 75 slots, auto phase group(s), budget 75.0 ms, "
               "predicted step 36.10 ms at batch 1, 64.20 ms at batch 75; RANDOM WEIGHTS\n")
        self.assertIsNone(serve.parse_ready(err.replace("75.0 ms,", "inf ms,"))["budget_ms"])
        r = serve.parse_ready(err)
        self.assertEqual((r["slots"], r["predicted_step_ms_b1"], r["predicted_step_ms_max"]),
                         (75, 36.1, 64.2))
        self.assertIsNone(serve.parse_ready("nothing"))

    def test_metrics_and_loads(self):
        def metrics(active, count, secs, b40, b80):
            return "\n".join([
                "moshid_active_sessions %d" % active,
                'moshid_stage_duration_seconds_bucket{stage="model_step",core="all",le="0.04"} %d' % b40,
                'moshid_stage_duration_seconds_bucket{stage="model_step",core="all",le="0.08"} %d' % b80,
                'moshid_stage_duration_seconds_bucket{stage="model_step",core="all",le="+Inf"} %d' % count,
                'moshid_stage_duration_seconds_sum{stage="model_step",core="all"} %f' % secs,
                'moshid_stage_duration_seconds_count{stage="model_step",core="all"} %d' % count,
                'moshid_stage_duration_seconds_count{stage="model_step",core="engine",group="0",batch="1"} 5',
            ])
        m = serve.parse_metrics(metrics(3, 10, 0.3, 8, 10))
        self.assertEqual((m["active"], m["steps"], m["step_s"]), (3, 10, 0.3))
        samples = [dict(serve.parse_metrics(metrics(32, 100, 3.0, 100, 100)), t=0.0, gpu_util=40.0,
                        rss_mib=100.0),
                   dict(serve.parse_metrics(metrics(32, 200, 7.0, 150, 200)), t=8.0, gpu_util=60.0,
                        rss_mib=120.0, gpu_mem_mib=90000.0)]
        loads = serve.per_load(samples)
        row = loads[32]
        self.assertAlmostEqual(row["step_ms_mean"], 40.0)
        self.assertEqual(row["step_ms_p99_bucket"], 80.0)
        self.assertEqual((row["gpu_util_mean"], row["rss_mib_max"], row["gpu_mem_mib_max"]),
                         (50.0, 120.0, 90000.0))
        self.assertAlmostEqual(row["steps_per_s"], 12.5)

    def test_headline(self):
        report = {"largest_streams_held": 64, "first_streams_broken": 75, "steps": [
            {"streams": 64, "sessions": 64, "latency_ms": {"p50": 40.0, "p99": 70.0, "max": 90.0},
             "mean_batch": 60.0, "held": True, "deadline_misses": 0, "refused": 0,
             "cpu_ms_per_stream_s_excl_engine": 3.2, "ratio_to_bare_opus_excl_engine": 1.2},
            {"streams": 75, "sessions": 75, "latency_ms": {"p50": 80.0, "p99": 170.0, "max": 200.0},
             "held": False, "broke": ["3 deadline misses"], "deadline_misses": 3, "refused": 0}]}
        h = serve.headline("bf16", report, {64: {"step_ms_mean": 65.0, "gpu_util_mean": 97.0}}, None)
        self.assertEqual(h, "bf16 KV: 64 callers with zero misses, added latency p50 40.0 p99 70.0 max "
                            "90.0 ms, step 65.0 ms mean, batch 60.0, GPU 97 %, I/O CPU 3.20 "
                            "ms/stream-s (1.20x Opus) (misses from 75)")
        none = serve.headline("fp8", {"steps": [{"streams": 1, "sessions": 0, "refused": 1,
                                                 "deadline_misses": 0, "broke": ["refused 1"]}]},
                              {}, None)
        self.assertEqual(none, "fp8 KV: no load without misses (first miss at 1: refused 1)")
        # loadgen's own verdict may say held (stop-on error only): misses decide.
        missed = {"largest_streams_held": 1, "steps": [
            {"streams": 1, "sessions": 1, "deadline_misses": 24, "refused": 0, "held": True}]}
        self.assertIn("no load without misses (first miss at 1: 24 deadline misses",
                      serve.headline("bf16", missed, {}, None))
        self.assertEqual(len(serve.step_lines("bf16", report, {})), 2)


class MiscTest(unittest.TestCase):
    def test_boxes_scale_and_override(self):
        b = main.boxes(270, "serve=300")
        self.assertEqual(b["device"], 20.0)
        self.assertEqual(b["serve"], 300.0)
        self.assertLessEqual(sum(main.boxes(540, "").values()), 540)
        with self.assertRaises(ValueError):
            main.boxes(540, "nope=1")
        self.assertEqual(main.boxes(540, "", {"golden": 360})["golden"], 360)

    def test_settings(self):
        s = main.Settings({"REHEARSAL": "1", "BENCH": "0", "PHASES": "device,profile,serve"})
        self.assertEqual(s.phases, ["device", "serve"])
        self.assertEqual((s.serve_shape, s.serve_backend), ("moshi-tiny", "emu"))
        self.assertEqual((s.budget, s.boxes["golden"], s.limit_scale), (900, 360, 4))
        with self.assertRaises(ValueError):
            main.Settings({"PHASES": "device,warp"})

    def test_kernel_families(self):
        listing = "attention::a: test\nattention::b: test\nscheduler::x: test\ngemm::g: test\n2 tests\n"
        self.assertEqual(checks.kernel_families(listing), ["attention", "gemm"])

    def test_mulaw(self):
        self.assertEqual(rtp_peer.mulaw(0), 0xFF)
        self.assertEqual(rtp_peer.mulaw(-1), 0x7F)
        self.assertEqual(rtp_peer.mulaw(32767), 0x80)
        self.assertEqual(rtp_peer.mulaw(-32768), 0x00)
        self.assertEqual(rtp_peer.mulaw(1000), 0xCE)
        self.assertEqual(len(rtp_peer.tone_payload(0)), 160)
        self.assertEqual(len(rtp_peer.packet(1, 2, 3, b"x" * 160)), 172)


if __name__ == "__main__":
    unittest.main()
