"""The demo of `make run`: a few conversations streamed from the bundled WAV into a running node
through the real ZMQ socket, replies written to WAV files, a summary at the end."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np

from transports.client import NodeClient
from transports.wavclient import read_audio, stream, write_audio

DEMO_TOOLS = [{"name": "lookup_weather", "description": "Weather for a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


async def run_demo(endpoint: str, args) -> list[dict]:
    x, rate = read_audio(args.demo_wav)
    seconds = max(1.0, args.demo_seconds - 1.5)
    reps = int(np.ceil(seconds * rate / len(x)))
    x = np.tile(x, reps)[: int(seconds * rate)]
    out = Path(args.out)
    async with NodeClient(endpoint) as client:
        tasks = [stream(client, f"demo-{i}", x, rate, tail_s=1.0,
                        instructions="You are a helpful voice assistant.",
                        tools=DEMO_TOOLS if i == 0 else None,
                        function_output='{"city": "Paris", "forecast": "sunny"}')
                 for i in range(args.demo_sessions)]
        results = await asyncio.gather(*tasks)
    summary = []
    for i, res in enumerate(results):
        path = out / f"demo-reply-{i}.wav"
        write_audio(path, res.audio, res.rate)
        summary.append({"session": res.session, "reply": str(path),
                        "seconds_out": round(len(res.audio) / res.rate, 2),
                        "agent_text": res.agent_text[:60], "user_text": res.user_text[:40],
                        "function_calls": [c.name for c in res.calls],
                        "errors": len(res.errors), **res.stats})
    print("\n" + json.dumps(summary, indent=1), flush=True)
    return summary
