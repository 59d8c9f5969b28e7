#!/usr/bin/env python3
"""The official `openai` package (unmodified) against a running moshid's
Realtime endpoints, as an application uses it:

  conversation ADDR MODEL TOKEN [QUERY]   AsyncOpenAI(...).realtime.connect(model=...)
  translation  ADDR MODEL TOKEN [QUERY]   AsyncOpenAI(...).realtime.translations.connect(model=...)

QUERY (`k=v&k=v`) goes on the URL (`extra_query`): session parameters.

Each mode streams 6 s of test audio in real time (100 ms appends), receives
the server's events as they come, and prints one JSON line (prefixed
`SUMMARY `) with what it saw; the Rust test (tests/e2e_realtime.rs)
asserts on it. Exit status 0 once the session ran to its end; the checks
are the test's.

Needs: pip install 'openai[realtime]' (scripts/setup --tests).
"""
import asyncio
import base64
import json
import math
import random
import struct
import sys
import time

from openai import AsyncOpenAI

RATE = 24000
CHUNK = 2400  # 100 ms
SECONDS = 6.0


def speech_like(start: int, n: int) -> bytes:
    """Bursts of a loud, noisy 180 Hz buzz (1.2 s) and silence (0.8 s)."""
    out = []
    for i in range(start, start + n):
        t = i / RATE
        on = (t % 2.0) < 1.2
        x = 0.0
        if on:
            x = 0.35 * math.sin(2 * math.pi * 180 * t) + 0.05 * (random.random() - 0.5)
        out.append(max(-32768, min(32767, int(x * 32767))))
    return struct.pack("<%dh" % n, *out)


def client(addr: str, token: str) -> AsyncOpenAI:
    return AsyncOpenAI(
        api_key=token,
        base_url=f"http://{addr}/v1",
        websocket_base_url=f"ws://{addr}/v1",
    )


async def collect(conn, events, stop):
    """Every event with its arrival time, until the connection closes."""
    try:
        async for event in conn:
            events.append((time.monotonic(), event))
            if stop(event):
                return
    except Exception as e:  # the connection closing under the iterator
        events.append((time.monotonic(), {"type": "client.exception", "error": repr(e)}))


def kind(event):
    return event.get("type") if isinstance(event, dict) else event.type


async def stream_audio(send, on_half=None):
    """6 s of audio in real time; returns when the last append was sent."""
    t0 = time.monotonic()
    total = int(SECONDS * RATE)
    half = total // CHUNK // 2
    for k, start in enumerate(range(0, total, CHUNK)):
        await send(audio=base64.b64encode(speech_like(start, CHUNK)).decode())
        if on_half is not None and k == half:
            await on_half()
        delay = t0 + (k + 1) * CHUNK / RATE - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
    return time.monotonic()


async def conversation(addr, model, token, query):
    summary = {"errors": [], "responses": {}}
    events = []
    async with client(addr, token).realtime.connect(model=model, extra_query=query) as conn:
        first = await asyncio.wait_for(conn.recv(), 30)
        summary["first"] = first.type
        summary["session_type"] = first.session.type
        summary["model"] = first.session.model
        await conn.session.update(session={
            "type": "realtime",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "turn_detection": {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 400,
                                       "interrupt_response": False},
                },
                "output": {"format": {"type": "audio/pcm", "rate": 24000}},
            },
        })
        # A field the model cannot honour and an event moshid does not
        # support: each is answered with an error, and the session goes on.
        await conn.session.update(session={"type": "realtime", "instructions": "Speak like a pirate."})
        await conn.send({"type": "conversation.item.retrieve", "item_id": "item_unknown"})
        receiver = asyncio.create_task(collect(conn, events, lambda e: False))
        cancelled = {}

        async def cancel_open_response():
            open_ids = [e.response.id for _, e in events if kind(e) == "response.created"]
            done_ids = {e.response.id for _, e in events if kind(e) == "response.done"}
            live = [r for r in open_ids if r not in done_ids]
            cancelled["at"] = time.monotonic()
            cancelled["id"] = live[-1] if live else None
            await conn.response.cancel()

        last_append = await stream_audio(conn.input_audio_buffer.append, cancel_open_response)
        await asyncio.sleep(2.0)
        await conn.close()
        await asyncio.wait_for(receiver, 10)
    audio_bytes = 0
    before_last_append = 0
    transcript_deltas = 0
    after_errors = 0
    first_error_at = None
    after_cancel = 0
    for t, e in events:
        k = kind(e)
        if k == "error":
            summary["errors"].append({"code": e.error.code, "param": e.error.param, "message": e.error.message})
            first_error_at = first_error_at or t
        elif k == "response.output_audio.delta":
            n = len(base64.b64decode(e.delta))
            audio_bytes += n
            before_last_append += n if t < last_append else 0
            after_errors += n if first_error_at is not None else 0
            if e.response_id == cancelled.get("id") and t > cancelled["at"] + 0.5:
                after_cancel += 1
        elif k == "response.output_audio_transcript.delta":
            transcript_deltas += 1
        elif k == "response.done":
            r = e.response
            reason = (r.status_details.reason if r.status_details else None)
            summary["responses"][r.id] = {"status": r.status, "reason": reason}
        summary.setdefault("kinds", {})
        summary["kinds"][k] = summary["kinds"].get(k, 0) + 1
    summary.update({
        "audio_frames": audio_bytes / 3840,
        "audio_frames_before_last_append": before_last_append / 3840,
        "audio_frames_after_errors": after_errors / 3840,
        "transcript_deltas": transcript_deltas,
        "cancelled": cancelled.get("id"),
        "deltas_after_cancel": after_cancel,
    })
    return summary


async def translation(addr, model, token, query):
    summary = {"errors": []}
    events = []
    async with client(addr, token).realtime.translations.connect(model=model, extra_query=query) as conn:
        first = await asyncio.wait_for(conn.recv(), 30)
        summary["first"] = first.type
        summary["session_type"] = first.session.type
        summary["language"] = first.session.audio.output.language
        await conn.session.update(session={"audio": {"output": {"language": "de"}}})
        await conn.session.update(session={"audio": {"output": {"language": "en"},
                                                     "input": {"transcription": None}}})
        receiver = asyncio.create_task(
            collect(conn, events, lambda e: kind(e) in ("session.closed", "client.exception")))
        last_append = await stream_audio(conn.session.input_audio_buffer.append)
        await conn.session.close()
        await asyncio.wait_for(receiver, 60)
    audio_bytes = 0
    before_last_append = 0
    elapsed = []
    transcript = []
    for t, e in events:
        k = kind(e)
        summary.setdefault("kinds", {})
        summary["kinds"][k] = summary["kinds"].get(k, 0) + 1
        if k == "error":
            summary["errors"].append({"code": e.error.code, "param": e.error.param, "message": e.error.message})
        elif k == "session.output_audio.delta":
            n = len(base64.b64decode(e.delta))
            audio_bytes += n
            before_last_append += n if t < last_append else 0
            elapsed.append(e.elapsed_ms)
        elif k == "session.output_transcript.delta":
            transcript.append(e.delta)
        elif k == "session.closed":
            record = getattr(e, "record", None)
            if record is None and hasattr(e, "model_extra"):
                record = (e.model_extra or {}).get("record")
            summary["record"] = record
    summary.update({
        "audio_frames": audio_bytes / 3840,
        "audio_frames_before_last_append": before_last_append / 3840,
        "elapsed_ms_steps": sorted({b - a for a, b in zip(elapsed, elapsed[1:])}),
        "transcript": "".join(transcript),
        "transcript_deltas": len(transcript),
        "last": kind(events[-1][1]) if events else None,
    })
    return summary


def main():
    mode, addr, model, token = sys.argv[1:5]
    query = dict(kv.split("=", 1) for kv in sys.argv[5].split("&")) if len(sys.argv) > 5 and sys.argv[5] else {}
    run = {"conversation": conversation, "translation": translation}[mode]
    summary = asyncio.run(run(addr, model, token, query))
    print("SUMMARY " + json.dumps(summary, default=str), flush=True)


if __name__ == "__main__":
    main()
