#!/usr/bin/env python3
"""Pipecat's OpenAI Realtime service (unmodified, `pipecat-ai[openai]`)
holding a conversation with a running moshid, headless: a pipeline of a tap,
`OpenAIRealtimeLLMService` pointed at ws://ADDR/v1/realtime, and a sink.
6 s of test audio (speech-like bursts and pauses) go in as
`InputAudioRawFrame`s in real time, 20 ms each, as a transport would push
them; the sink counts what the service pushes downstream (the bot's audio,
its transcript, the responses' starts and ends) and the tap what goes
upstream (errors, the user turns the service proposes from the server's
speech events).

Usage: pipecat_realtime.py ADDR MODEL TOKEN
Prints one JSON line prefixed `SUMMARY `; the Rust test
(tests/e2e_realtime.rs) asserts on it.

Needs: pip install 'pipecat-ai[openai]' (scripts/setup --tests).
"""
import asyncio
import json
import math
import random
import struct
import sys
import time

from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    InputAudioRawFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    ProposedUserStartedSpeakingFrame,
    ProposedUserStoppedSpeakingFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

RATE = 24000
CHUNK = 480  # 20 ms
SECONDS = 6.0


def speech_like(start, n):
    out = []
    for i in range(start, start + n):
        t = i / RATE
        x = 0.35 * math.sin(2 * math.pi * 180 * t) + 0.05 * (random.random() - 0.5) if (t % 2.0) < 1.2 else 0.0
        out.append(max(-32768, min(32767, int(x * 32767))))
    return struct.pack("<%dh" % n, *out)


class Counter(FrameProcessor):
    """Counts the frames passing in one direction; passes everything on."""

    def __init__(self, direction, **kwargs):
        super().__init__(**kwargs)
        self.direction = direction
        self.counts = {}
        self.audio_bytes = 0
        self.text = []
        self.errors = []

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        if direction == self.direction:
            name = type(frame).__name__
            self.counts[name] = self.counts.get(name, 0) + 1
            if isinstance(frame, TTSAudioRawFrame):
                self.audio_bytes += len(frame.audio)
            elif isinstance(frame, TTSTextFrame):
                self.text.append(frame.text)
            elif isinstance(frame, ErrorFrame):
                self.errors.append(str(frame.error))
        await self.push_frame(frame, direction)


async def main(addr, model, token):
    llm = OpenAIRealtimeLLMService(
        api_key=token,
        base_url=f"ws://{addr}/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(
            model=model,
            session_properties=events.SessionProperties(
                audio=events.AudioConfiguration(
                    input=events.AudioInput(
                        format=events.PCMAudioFormat(),
                        turn_detection=events.TurnDetection(silence_duration_ms=400),
                    ),
                    output=events.AudioOutput(format=events.PCMAudioFormat()),
                ),
            ),
        ),
    )
    tap = Counter(FrameDirection.UPSTREAM)
    sink = Counter(FrameDirection.DOWNSTREAM)
    worker = PipelineWorker(
        Pipeline([tap, llm, sink]),
        cancel_on_idle_timeout=False,
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker, frame):
        started.set()

    async def speak():
        await asyncio.wait_for(started.wait(), 30)
        # The service connects as the pipeline starts; give it its session.
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        total = int(SECONDS * RATE)
        for k, start in enumerate(range(0, total, CHUNK)):
            frame = InputAudioRawFrame(audio=speech_like(start, CHUNK), sample_rate=RATE, num_channels=1)
            await worker.queue_frame(frame)
            delay = t0 + (k + 1) * CHUNK / RATE - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await asyncio.sleep(2.0)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await asyncio.wait_for(asyncio.gather(runner.run(), speak()), 90)
    return {
        "bot_audio_frames": sink.audio_bytes / 3840,
        "bot_text": "".join(sink.text),
        "responses_started": sink.counts.get(LLMFullResponseStartFrame.__name__, 0),
        "responses_ended": sink.counts.get(LLMFullResponseEndFrame.__name__, 0),
        # The service broadcasts the user's turns both ways: counted once.
        "user_started": sink.counts.get(ProposedUserStartedSpeakingFrame.__name__, 0),
        "user_stopped": sink.counts.get(ProposedUserStoppedSpeakingFrame.__name__, 0),
        "errors": tap.errors + sink.errors,
        "down": sink.counts,
        "up": tap.counts,
    }


if __name__ == "__main__":
    summary = asyncio.run(main(*sys.argv[1:4]))
    print("SUMMARY " + json.dumps(summary, default=str), flush=True)
