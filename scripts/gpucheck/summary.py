"""The compact summary (summary.txt, also the last lines a run prints) and
the readings it quotes from the tools' JSON reports.

Pure functions of what the run recorded, so that they are tested without a
run. The summary has at most `MAX_LINES` lines: the header, one line per
step, the sections (each cut to its own size), and the failures in what is
left.

The step-time readers accept both of gpu-bench's reports: the step-time
report (`results`: one row per graphs mode and batch size with `p50_ms` and
`p99_ms`) and the per-phase profile (`--profile --json`), whose rows are
found wherever an object carries a batch size and a p50.
"""

MAX_LINES = 100


def compose(stamp, elapsed, budget, phase, header, results, sections, failures):
    """The summary's text. `results`: (phase, step, verdict, seconds, note);
    `sections`: (title, lines); `failures`: (step, verdict, lines)."""
    out = [
        "=== gpu-check summary: %s UTC, %ds of TIME_BUDGET %ds, phase %s"
        % (stamp, elapsed, budget, phase)
    ]
    out += [h[:240] for h in header]
    out.append(
        "--- steps (verdict, seconds; logs in tests.log, golden.log, bench.log, "
        "serve.tar.gz, logs.tar.gz)"
    )
    for ph, name, verdict, secs, note in results:
        out.append(("%-7s %-28s %-8s %5ss  %s" % (ph, name, verdict, secs, note))[:200])
    for title, lines in sections:
        if lines:
            out.append("--- " + title)
            out += [l[:260] for l in lines]
    out = out[: MAX_LINES - 4]
    if failures:
        block = ["--- failures: first lines of each failing step"]
        for name, verdict, lines in failures:
            block.append("%s: %s" % (name, verdict))
            block += ["    " + l for l in lines]
        out += block[: MAX_LINES - 3 - len(out) + 1]
    out.append("=== end of summary")
    return "\n".join(out) + "\n"


def _p50(d):
    for k in ("p50_ms", "wall_p50_ms", "wall_ms_p50", "step_p50_ms"):
        if isinstance(d.get(k), (int, float)):
            return float(d[k])
    wall = d.get("wall_ms") or d.get("wall")
    if isinstance(wall, dict) and isinstance(wall.get("p50"), (int, float)):
        return float(wall["p50"])
    return None


def _p99(d):
    for k in ("p99_ms", "wall_p99_ms", "wall_ms_p99", "step_p99_ms"):
        if isinstance(d.get(k), (int, float)):
            return float(d[k])
    wall = d.get("wall_ms") or d.get("wall")
    if isinstance(wall, dict) and isinstance(wall.get("p99"), (int, float)):
        return float(wall["p99"])
    return None


def step_rows(report):
    """(graphs, batch, p50 ms, p99 ms or None) of every measured row of a
    gpu-bench report (either kind), in the report's order; graphs is True,
    False or None (a profile row that does not say)."""
    rows = []

    def walk(v, graphs):
        if isinstance(v, dict):
            g = v.get("graphs", graphs)
            if isinstance(g, str):
                g = {"on": True, "off": False}.get(g, graphs)
            b = v.get("batch")
            p50 = _p50(v)
            if isinstance(b, int) and not isinstance(b, bool) and p50 is not None:
                rows.append((g if isinstance(g, bool) else None, b, p50, _p99(v)))
                return
            for x in v.values():
                walk(x, g)
        elif isinstance(v, list):
            for x in v:
                walk(x, graphs)

    walk(report, None)
    return rows


def not_measured(report):
    """How many batch sizes a report says it skipped."""
    n = report.get("not_measured") if isinstance(report, dict) else None
    return len(n) if isinstance(n, list) else 0


def step_line(label, report):
    """One line per graphs mode: "moshi7b bf16 graphs on: b1 36.87/37.09 b64 …"."""
    by_mode = {}
    for g, b, p50, p99 in step_rows(report):
        by_mode.setdefault(g, []).append(
            "b%d %.2f/%s" % (b, p50, "-" if p99 is None else "%.2f" % p99)
        )
    if not by_mode:
        return ["%s: nothing measured" % label]
    lines = []
    for g, cells in by_mode.items():
        mode = "" if g is None else (" graphs on" if g else " graphs off")
        lines.append("%s%s: %s" % (label, mode, " ".join(cells)))
    skipped = not_measured(report)
    if skipped:
        lines.append("%s: %d batch size(s) not measured (see bench.log)" % (label, skipped))
    return lines


def best_p50(report, batch):
    """The p50 of `batch` in a report (graphs on preferred), or None."""
    rows = [r for r in step_rows(report) if r[1] == batch]
    rows.sort(key=lambda r: (r[0] is not True, r[2]))
    return rows[0][2] if rows else None


def compare_line(label, batches, current, baseline):
    """"moshi7b bf16 p50 ms, previous → this build: b1 36.9 → 12.1 (0.33×) …"."""
    cells = []
    for b in batches:
        new = best_p50(current, b) if current is not None else None
        old = best_p50(baseline, b) if baseline is not None else None
        if new is None and old is None:
            continue
        if new is not None and old is not None:
            cells.append("b%d %.1f → %.1f (%.2f×)" % (b, old, new, new / old if old else 0.0))
        elif new is not None:
            cells.append("b%d - → %.1f" % (b, new))
        else:
            cells.append("b%d %.1f → -" % (b, old))
    if not cells:
        return None
    return "%s p50 ms, previous → this build: %s" % (label, " ".join(cells))


def profile_phases(report, most=6):
    """The slowest phases of a profile report: "attention 12.1 ms (33 %, 4.2× floor)"."""
    found = []

    def walk(v):
        if isinstance(v, dict):
            ph = v.get("phases")
            if isinstance(ph, list) and ph and isinstance(ph[0], dict):
                found.append((v.get("batch"), ph))
                return
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(report)
    lines = []
    for batch, phases in found:
        cells = []
        ms_of = lambda p: p.get("ms") if isinstance(p.get("ms"), (int, float)) else 0.0
        for p in sorted(phases, key=ms_of, reverse=True)[:most]:
            cell = "%s %.2f ms" % (p.get("name", p.get("phase", "?")), ms_of(p))
            share = p.get("share")
            floor = p.get("x_floor", p.get("times_floor"))
            extra = []
            if isinstance(share, (int, float)):
                extra.append("%.0f %%" % (share * 100 if share <= 1 else share))
            if isinstance(floor, (int, float)):
                extra.append("%.1f× floor" % floor)
            if extra:
                cell += " (%s)" % ", ".join(extra)
            cells.append(cell)
        lines.append("b%s: %s" % (batch if batch is not None else "?", "; ".join(cells)))
    return lines


def golden_lines(golden_log_text, most=24):
    """The golden tests' AGREEMENT lines, without the prefix."""
    out = []
    for line in golden_log_text.splitlines():
        if line.startswith("AGREEMENT "):
            out.append(line[len("AGREEMENT "):][:260])
    return out[:most]
