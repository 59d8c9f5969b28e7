"""One RTP call answered by the daemon, from a scripted peer (sipp is not on
the GPU machine): a session made through the daemon's RTP control API
(`POST /v1/rtp/sessions`, G.711 µ-law, `remote` = this peer's loopback UDP
port), then `seconds` of a tone sent as RTP every 20 ms from absolute
deadlines while the answers are received, then the session's state
(`GET /v1/rtp/sessions/{id}`: its counters and its release → answer
gauge, `engine_wait_ms`: a frame's release to the jitter buffer until the
engine's answer, about the release lead plus the model step) and its end
(`DELETE`, answering the final record).

Standard library only; bounded everywhere (socket timeouts, a deadline).
"""

import json
import math
import os
import random
import socket
import struct
import time
import urllib.error
import urllib.request

PTIME_MS = 20
SAMPLES = 8000 * PTIME_MS // 1000
# µ-law of silence: what the daemon sends until the model speaks.
MULAW_SILENCE = 0xFF


def mulaw(sample):
    """G.711 µ-law of a 16-bit sample."""
    bias, clip = 0x84, 32635
    sign = 0x80 if sample < 0 else 0
    s = min(abs(sample), clip) + bias
    exponent = 7
    mask = 0x4000
    while exponent > 0 and not s & mask:
        exponent -= 1
        mask >>= 1
    mantissa = (s >> (exponent + 3)) & 0x0F
    return ~(sign | (exponent << 4) | mantissa) & 0xFF


def packet(seq, ts, ssrc, payload, marker=False):
    """An RTP packet (version 2, payload type 0)."""
    return struct.pack("!BBHII", 0x80, (0x80 if marker else 0) | 0, seq & 0xFFFF,
                       ts & 0xFFFFFFFF, ssrc) + payload


def tone_payload(n0):
    """20 ms of a 300 Hz tone whose loudness rises and falls every second."""
    out = bytearray()
    for i in range(SAMPLES):
        t = (n0 + i) / 8000.0
        amp = 6000 * (0.55 + 0.45 * math.sin(2 * math.pi * t))
        out.append(mulaw(int(amp * math.sin(2 * math.pi * 300 * t))))
    return bytes(out)


def http(method, url, body=None, timeout=5):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read().decode() or "null")
    except urllib.error.HTTPError as e:
        raise ValueError("%s %s answered %d: %s" % (method, url.split("/", 3)[-1], e.code,
                                                     e.read().decode(errors="replace")[:200]))


def find_key(v, key):
    """The first value of `key` anywhere in a JSON value."""
    if isinstance(v, dict):
        if key in v:
            return v[key]
        for x in v.values():
            r = find_key(x, key)
            if r is not None:
                return r
    elif isinstance(v, list):
        for x in v:
            r = find_key(x, key)
            if r is not None:
                return r
    return None


def wait_idle(base, timeout_s):
    """Waits until the daemon holds no session (the callers before it may
    still be closing theirs), at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, cap = http("GET", base + "/capacity")
        if find_key(cap, "active_sessions") == 0:
            return True
        time.sleep(0.2)
    return False


def call(http_addr, seconds, folder=None):
    """Places the call; returns what it measured (raises OSError/ValueError
    on a daemon that does not answer as documented)."""
    base = "http://%s" % http_addr
    wait_idle(base, 15)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.005)
    try:
        status, made = http("POST", base + "/v1/rtp/sessions",
                            {"codec": "PCMU", "remote": "127.0.0.1:%d" % sock.getsockname()[1]})
        if status != 201:
            raise ValueError("POST /v1/rtp/sessions answered %s: %s" % (status, made))
        sid, dest = made["id"], (made["address"], int(made["port"]))
        got = exchange(sock, dest, seconds)
        _, state = http("GET", base + "/v1/rtp/sessions/%s" % sid)
        _, final = http("DELETE", base + "/v1/rtp/sessions/%s" % sid, timeout=10)
    finally:
        sock.close()
    result = dict(got, id=sid, engine_wait_ms=find_key(state, "engine_wait_ms"),
                  frames_answered=find_key(state, "frames_answered"),
                  frames_to_engine=find_key(state, "frames_to_engine"))
    if folder:
        with open(os.path.join(folder, "rtp-call.json"), "w") as f:
            json.dump({"result": result, "state": state, "final": final}, f, indent=1)
    return result


def exchange(sock, dest, seconds):
    """Sends `seconds` of tone at 20 ms pace; counts what comes back."""
    ssrc, seq, ts = random.getrandbits(32), random.getrandbits(16), random.getrandbits(32)
    start = time.monotonic()
    sent = received = voiced = 0
    first_ms = first_voiced_ms = None
    n = int(seconds * 1000 / PTIME_MS)
    for k in range(n):
        sock.sendto(packet(seq + k, ts + k * SAMPLES, ssrc, tone_payload(k * SAMPLES), k == 0), dest)
        sent += 1
        deadline = start + (k + 1) * PTIME_MS / 1000.0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                data = sock.recv(2048)
            except socket.timeout:
                break
            if len(data) < 12:
                continue
            received += 1
            now_ms = (time.monotonic() - start) * 1000.0
            first_ms = now_ms if first_ms is None else first_ms
            if any(b not in (MULAW_SILENCE, 0x7F) for b in data[12:]):
                voiced += 1
                first_voiced_ms = now_ms if first_voiced_ms is None else first_voiced_ms
    return {"seconds": seconds, "packets_sent": sent, "packets_received": received,
            "packets_voiced": voiced, "first_packet_ms": first_ms,
            "first_voiced_packet_ms": first_voiced_ms}


def line(result):
    """The summary's line for the call."""
    w = result.get("engine_wait_ms")
    return ("RTP call (PCMU, %.0f s, loopback peer): release → answer %s ms (engine_wait_ms), "
            "frames answered %s of %s, packets %d sent / %d received (%d with sound)" % (
                result["seconds"], "-" if w is None else "%.1f" % w, result.get("frames_answered"),
                result.get("frames_to_engine"), result["packets_sent"], result["packets_received"],
                result["packets_voiced"]))
