#!/usr/bin/env python3
"""Interop check with Kyutai's own Opus stack: speaks to a running moshid the
way the official Python client does (aiohttp WebSocket, sphn.OpusStreamWriter
for the audio sent, sphn.OpusStreamReader for the audio received) and checks
the handshake, the audio and the text that come back.

Usage: tests/interop/sphn_client.py ws://127.0.0.1:8998/api/chat [seconds]
Needs: pip install sphn aiohttp numpy (all come with `pip install moshi`).
Exit status 0 when every check passes.
"""
import asyncio, sys
import aiohttp
import numpy as np
import sphn


async def main(url: str, seconds: float) -> int:
    sr = 24000
    t = np.arange(int(sr * seconds)) / sr
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    writer = sphn.OpusStreamWriter(sr)
    reader = sphn.OpusStreamReader(sr)
    received, text, first_kind = [], [], None
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url) as ws:
            async def recv():
                nonlocal first_kind
                async for msg in ws:
                    if msg.type != aiohttp.WSMsgType.BINARY:
                        continue
                    kind, payload = msg.data[0], msg.data[1:]
                    if first_kind is None:
                        first_kind = kind
                    if kind == 1:
                        out = reader.append_bytes(payload)
                        if out.shape[-1]:
                            received.append(out)
                    elif kind == 2:
                        text.append(payload.decode())
            task = asyncio.create_task(recv())
            for i in range(0, len(pcm), 1920):
                data = writer.append_pcm(pcm[i:i + 1920])
                if len(data):
                    await ws.send_bytes(b"\x01" + data)
                await asyncio.sleep(0.08)
            await asyncio.sleep(1.5)
            await ws.close()
            await task
    got = sum(x.shape[-1] for x in received) if received else 0
    frames_sent = len(pcm) // 1920
    print(f"first message kind {first_kind}, sent {frames_sent} frames, received {got} samples "
          f"({got / 1920:.1f} frames), text: {''.join(text)!r}")
    ok = first_kind == 0 and got >= (frames_sent - 2) * 1920 and len(text) > 0
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    url = sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:8998/api/chat"
    secs = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    sys.exit(asyncio.run(main(url, secs)))
