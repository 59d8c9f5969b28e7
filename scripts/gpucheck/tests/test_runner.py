"""The runner: time limits, verdicts, failure lines, and the output folder's
guarantees (whole files, only the names allowed)."""

import os
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from gpucheck import runner  # noqa: E402
from gpucheck.runner import Runner, failure_lines  # noqa: E402


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def read(path):
    with open(path) as f:
        return f.read()


def make(budget=100, clock=time.monotonic):
    out = tempfile.mkdtemp()
    scratch = tempfile.mkdtemp()
    return Runner(out, budget, os.getcwd(), scratch, clock=clock), out


class RunnerTest(unittest.TestCase):
    def test_a_step_passes_fails_or_times_out_and_is_recorded(self):
        r, out = make()
        r.min_step_s = 0
        r.start_phase("t", 60)
        ok = r.step("tests.log", "ok", 10, ["sh", "-c", "echo hello"])
        self.assertEqual((ok.verdict, ok.output), ("PASS", "hello\n"))
        bad = r.step("tests.log", "bad", 10, ["sh", "-c", "echo 'error: it broke'; exit 3"])
        self.assertEqual(bad.verdict, "FAIL(3)")
        t0 = time.monotonic()
        slow = r.step("tests.log", "slow", 1, ["sh", "-c", "sleep 30 & sleep 30; wait"])
        self.assertEqual(slow.verdict, "TIMEOUT")
        self.assertLess(time.monotonic() - t0, 15, "the whole group was killed at the limit")
        text = read(os.path.join(out, "summary.txt"))
        for want in ("ok", "FAIL(3)", "TIMEOUT", "error: it broke", "=== end of summary"):
            self.assertIn(want, text)
        log = read(os.path.join(out, "tests.log"))
        self.assertIn("hello", log)
        self.assertIn("=== bad (limit 10s)", log)

    def test_a_step_without_time_is_not_started(self):
        clock = FakeClock()
        r, _ = make(budget=100, clock=clock)
        r.start_phase("p", 50)
        clock.now += 48
        self.assertIsNone(r.step("tests.log", "late", 30, ["false"]))
        self.assertEqual(r.results[-1][2], "NO-TIME")

    def test_a_phase_never_outlasts_the_deadline(self):
        clock = FakeClock()
        r, _ = make(budget=100, clock=clock)
        clock.now += 90
        r.start_phase("p", 50)
        self.assertAlmostEqual(r.left(), 10)

    def test_output_is_capped(self):
        r, out = make()
        r.min_step_s = 0
        r.start_phase("t", 60)
        o = r.step("bench.log", "loud", 20, ["sh", "-c", "yes 0123456789012345678901234567890123456789 | head -c 3000000"])
        self.assertEqual(o.verdict, "PASS")
        self.assertLess(os.path.getsize(os.path.join(out, "bench.log")), runner.STEP_OUTPUT_CAP + 10000)
        self.assertIn("truncated", o.output.splitlines()[-1])

    def test_only_the_allowed_files_are_written_and_whole(self):
        r, out = make()
        r.write("results.json", "{}")
        with self.assertRaises(AssertionError):
            r.write("other.txt", "x")
        os.makedirs(os.path.join(r.raw, "x"))
        with open(os.path.join(r.raw, "x", "f"), "w") as f:
            f.write("y")
        r.pack()
        r.write_summary()
        names = sorted(os.listdir(out))
        self.assertTrue(set(names) <= set(runner.OUT_FILES), names)
        self.assertLessEqual(len(names), 8)
        self.assertFalse(any(n.endswith(".part") for n in names))

    def test_failure_lines_name_the_panic_errors_and_failed_tests(self):
        out = "\n".join([
            "running 3 tests",
            "thread 'a' panicked at kernels/tests/x.rs:27:6:",
            "called `Result::unwrap()` on an `Err` value: CUDA_ERROR_ILLEGAL_ADDRESS",
            "test attention::a ... FAILED",
            "test attention::b ... FAILED",
            "error: test failed",
            "error: test failed",
        ])
        lines = failure_lines(out)
        self.assertEqual(lines[0], "panic at kernels/tests/x.rs:27:6: called `Result::unwrap()` on an "
                         "`Err` value: CUDA_ERROR_ILLEGAL_ADDRESS")
        self.assertIn("error: test failed", lines)
        self.assertEqual(lines.count("error: test failed"), 1)
        self.assertIn("failed: attention::a attention::b", lines)

    def test_repeated_failures_say_as_above(self):
        r, _ = make()
        r.add_failure("a", "FAIL(1)", ["error: x"])
        r.add_failure("b", "FAIL(1)", ["error: x"])
        self.assertEqual(r.failures[1][2], ["(as above)"])


if __name__ == "__main__":
    unittest.main()
