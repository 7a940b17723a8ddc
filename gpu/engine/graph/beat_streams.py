"""One beat's frames over five CUDA streams, so the stages that do not depend on each other run
at the same time on the GPU (inside the beat's graph the stream waits become graph edges).

A frame's stages (VoiceChat.hear_frames / transcribe / think / speak / decode) depend on each other as
    hear(t) ─→ think(t) ─→ speak(t) ─→ decode(t)
      │   └──→ transcribe(t)   │          │
    hear(t+1) ──→ think(t+1) ──┴→ speak(t+1) ─→ decode(t+1)
and each stage also follows the same stage of the previous frame (its networks' state). Both
frames are heard in one step (VoiceChat.hear_frames: perception's ~1000 launches and weight reads
once a beat, not twice), so the beat's critical path is hear(0, 1) → think(0) → think(1) →
speak(1) → decode(1), while both transcriptions, speak(0) and decode(0) run beside it. Why it pays: much of a frame is
launch latency, not bandwidth (the talker is ~1100 small kernels, a fixed cost at any batch), and
latency-bound kernels on one stream leave the memory system idle for another's weight reads (the
thinker streams 17.8 GB per frame). So the streams cut a beat's fixed cost and leave its cost per
session (bandwidth) unchanged: bench/results/graph-stages-reference-n8-96-streams.json.

The lanes are made once per process, from torch's pool of high-priority streams: a
torch.cuda.Stream() comes round-robin from a pool of 32, so streams made per capture (the side
stream of a warm-up, the capture stream) would in time alias a lane; nothing else here takes
high-priority streams. Their priority also puts a live beat ahead of eager start-up work.

Tensors made on one stream and read on another stay referenced until every stream has joined
the caller's stream again, so the caching allocator never hands their memory to later work
that the graph does not order after those reads.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

from gpu.model.voicechat import FrameOutput, VoiceChat
from gpu.model.voicechat_state import VoiceChatState


@functools.cache
def _lanes(device: torch.device, names: tuple[str, ...]) -> dict[str, torch.cuda.Stream]:
    return {lane: torch.cuda.Stream(device, priority=-1) for lane in names}


class StreamedBeat:
    """Runs `frames` frames of a batch with its stages on their own streams (CUDA only)."""

    LANES = ("hear", "transcribe", "think", "speak", "decode")

    def __init__(self, model: VoiceChat, device: torch.device):
        self.model = model
        device = torch.device(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.streams = _lanes(torch.device("cuda", index), self.LANES)

    def run(self, state: VoiceChatState, audio: Tensor, slots: Tensor, noise_of, forced: Tensor,
            emit) -> None:
        """audio [B, F, 1280], forced [B, F]; noise_of(f) → the frame's FrameNoise (drawn on the
        talker's stream); emit(f, FrameOutput) stores a frame's outputs (called on the stream of
        the last stage, with every output of that frame ready on it)."""
        m, s = self.model, self.streams
        caller = torch.cuda.current_stream()
        for stream in s.values():
            stream.wait_stream(caller)
        keep = []                        # cross-stream tensors, alive until the join below
        with torch.cuda.stream(s["hear"]):
            heard_frames = m.hear_frames(state, audio, slots)
        s["transcribe"].wait_stream(s["hear"])
        s["think"].wait_stream(s["hear"])
        for f, heard in enumerate(heard_frames):
            with torch.cuda.stream(s["transcribe"]):
                asr = m.transcribe(state, heard, slots)
            with torch.cuda.stream(s["think"]):
                th = m.think(state, heard, slots, forced[:, f])
            s["speak"].wait_stream(s["think"])
            with torch.cuda.stream(s["speak"]):
                spoken = m.speak(state, th, noise_of(f), slots)
            s["decode"].wait_stream(s["speak"])
            s["decode"].wait_stream(s["transcribe"])
            with torch.cuda.stream(s["decode"]):
                pcm = m.decode(state, spoken, slots)
                emit(f, FrameOutput(pcm, th.text, th.func, asr.tokens, spoken.codes, asr.bou,
                                    asr.eou))
            keep.append((heard, asr, th, spoken, pcm))
        for stream in s.values():
            caller.wait_stream(stream)
        del keep
