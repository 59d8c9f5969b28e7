#!/usr/bin/env python3
"""Flame graph and top entries from `perf script` output (moshid profiling).

Usage:
    perf script -i perf.data | python3 bench/perf_flame.py OUT_DIR [--thread SUBSTR]

Writes OUT_DIR/flame.svg (a static flame graph: width = share of samples,
root at the bottom), OUT_DIR/folded.txt (one `frame;frame;... count` line per
distinct stack, the format flamegraph tools exchange) and OUT_DIR/top.txt
(self and total share of the heaviest functions), OUT_DIR/breakdown.txt
(each sample counted once, in the first of moshid's cost categories its
stack falls in: libopus, WebSocket read/write, reactor, ...). `--thread`
keeps only the
samples of threads whose name contains SUBSTR (e.g. `moshid-io`).
"""

import html
import re
import sys
from collections import Counter, defaultdict


def parse(lines, thread_filter):
    """Yields (thread, [frames root..leaf]) per sample of `perf script`."""
    header = None
    frames = []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if header is not None and frames:
                yield header, frames[::-1]
            header, frames = None, []
            continue
        if header is None:
            # "comm pid/tid time: period event:" -> comm may contain spaces.
            m = re.match(r"^(\S.*?)\s+\d+(/\d+)?\s", line)
            header = m.group(1) if m else line.split()[0]
            if thread_filter and thread_filter not in header:
                header = "__skip__"
            continue
        if header == "__skip__":
            continue
        parts = line.strip().split(None, 1)
        if len(parts) < 2:
            continue
        sym = parts[1]
        dso = re.search(r"\(([^()]*)\)$", sym)
        sym = re.sub(r"\s+\(\S*\)$", "", sym)  # the DSO
        if sym.startswith("[unknown]") and dso and "/" in dso.group(1):
            # A stripped library (the system's libopus): name the library.
            sym = "[" + dso.group(1).rsplit("/", 1)[-1].split(".so")[0] + "]"
        sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
        sym = re.sub(r"::h[0-9a-f]{16}$", "", sym)
        frames.append(sym or "[unknown]")
    if header not in (None, "__skip__") and frames:
        yield header, frames[::-1]


# Cost categories, first match wins (substrings of the folded stack).
CATEGORIES = [
    ("opus encode", ["opus_encode_float"]),
    ("opus decode", ["opus_decode_float"]),
    ("libopus, caller not unwound", ["[libopus]"]),
    ("Ogg pages (CRC, reader, writer)", ["ogg_page_crc", "OggPageWriter", "OggPacketReader"]),
    ("WebSocket read: zero-fill of tungstenite's read buffer", ["BytesMut::resize"]),
    ("WebSocket read (tungstenite, recv)", ["WebSocketContext::read", "poll_next"]),
    ("WebSocket write (framing, send)", ["start_send", "poll_flush", "WebSocketContext::write",
                                         "write_all", "poll_write", "write_wire", "WsOut"]),
    ("lanes and mailboxes", ["send_frame", "dispatch", "Mailbox", "rtrb"]),
    ("glommio reactor, park and wake", ["Reactor::react", "Parker::park"]),
    ("timers", ["timer::"]),
    ("session events", ["events::"]),
]


def breakdown(folded, total):
    counts = Counter()
    for stack, n in folded.items():
        joined = ";".join(stack)
        for name, keys in CATEGORIES:
            if any(k in joined for k in keys):
                counts[name] += n
                break
        else:
            counts["other"] += n
    return "".join(f"{100.0 * n / total:6.2f}%  {name}\n" for name, n in counts.most_common())


def short(name):
    """Drops generic arguments so that one function is one entry."""
    out, depth = [], 0
    for ch in name:
        if ch == "<":
            depth += 1
            if depth == 1:
                out.append("<..>")
            continue
        if ch == ">" and depth > 0:
            depth -= 1
            continue
        if depth == 0:
            out.append(ch)
    return "".join(out)


def svg(folded, total, path, title):
    width, row = 1600, 17
    tree = {}
    for stack, n in folded.items():
        node = tree
        for f in stack:
            child = node.setdefault(f, [0, {}])
            child[0] += n
            node = child[1]
    rects = []
    max_depth = [0]

    def walk(node, x, depth):
        for name, (n, kids) in sorted(node.items()):
            w = n / total * (width - 20)
            if w >= 0.3:
                rects.append((x, depth, w, name, n))
                max_depth[0] = max(max_depth[0], depth)
                walk(kids, x, depth + 1)
            x += w

    walk(tree, 10.0, 0)
    height = (max_depth[0] + 3) * row + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace" font-size="11">',
        f'<text x="10" y="18" font-size="14">{html.escape(title)}</text>',
    ]
    for x, depth, w, name, n in rects:
        y = height - (depth + 1) * row - 5
        h = abs(hash(name)) % 60
        color = f"rgb({205 + h // 2},{80 + h * 2},{40 + h // 3})"
        label = html.escape(name)
        pct = 100.0 * n / total
        chars = int(w / 6.6)
        text = label if len(name) <= chars else html.escape(name[: max(chars - 2, 0)]) + ".."
        out.append(
            f'<g><title>{label} ({n} samples, {pct:.2f}%)</title>'
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 1}" fill="{color}"/>'
            + (f'<text x="{x + 2:.1f}" y="{y + 12}">{text}</text>' if chars >= 3 else "")
            + "</g>"
        )
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    out_dir = args[0]
    thread = None
    if "--thread" in args:
        thread = args[args.index("--thread") + 1]
    folded = Counter()
    for comm, frames in parse(sys.stdin, thread):
        folded[tuple([comm] + [short(f) for f in frames])] += 1
    total = sum(folded.values())
    if total == 0:
        sys.exit("no samples")
    with open(f"{out_dir}/folded.txt", "w") as f:
        for stack, n in folded.most_common():
            f.write(";".join(stack) + f" {n}\n")
    self_c, total_c = Counter(), Counter()
    for stack, n in folded.items():
        self_c[stack[-1]] += n
        for name in set(stack[1:]):
            total_c[name] += n
    with open(f"{out_dir}/top.txt", "w") as f:
        f.write(f"{total} samples{' of threads ~' + thread if thread else ''}\n\n")
        f.write("self%   function (leaf)\n")
        for name, n in self_c.most_common(40):
            f.write(f"{100.0 * n / total:6.2f}  {name}\n")
        f.write("\ntotal%  function (anywhere on the stack)\n")
        for name, n in total_c.most_common(60):
            f.write(f"{100.0 * n / total:6.2f}  {name}\n")
    with open(f"{out_dir}/breakdown.txt", "w") as f:
        f.write(f"{total} samples{' of threads ~' + thread if thread else ''}\n")
        f.write(breakdown(folded, total))
    svg(folded, total, f"{out_dir}/flame.svg",
        f"moshid under moshid-loadgen: {total} samples" + (f", threads ~{thread}" if thread else ""))


if __name__ == "__main__":
    main()
