"""The cpu executor (gpu/engine/cpu_executor.py): session start over several beats, beats equal to
the reference model's frames (forced function tokens included), the end of context, and the real
node serving a WAV file through it."""
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from gpu.engine.cpu_executor import CPU_SHAPE, CpuExecutor
from bench.harness.beat_driver import BeatDriver
from wave_actors.core.prompt import prompt_tokens, render_system_prompt
from wave_actors.core.text import BOS, EOS, PAD, ByteFallbackCodec
from gpu.model.voicechat import VoiceChat
from tests.model.test_model_voicechat_kit import CFG, FP32, start
from wave_actors.core.contract import NO_TOKEN, ExecutorOptions, SessionSpec

ROOT = Path(__file__).resolve().parents[2]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
MAX_PROMPT, PREFILL_CHUNK = CPU_SHAPE["max_prompt"], CPU_SHAPE["prefill_chunk"]
SPEC = SessionSpec("You are a friendly voice assistant. Keep answers short and ask before booking.", TOOLS)




def beat_audio(beat: int, slots: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(beat).standard_normal((slots, 2, 1280))).astype(np.float32)


async def serve(driver: BeatDriver, beats: int, push: dict | None = None) -> list:
    """Run `beats` beats the way the clock does (only ready slots are in a beat); returns per
    beat (in-beat mask, copy of the outputs)."""
    log = []
    for k in range(beats):
        for slot, ids in (push or {}).get(k, {}).items():
            driver.force(slot, ids)
        plan, out = await driver.beat(beat_audio(k, driver.executor.max_sessions))
        assert out.compute_s > 0
        log.append((driver.inp.live.copy(),
                    {f: getattr(out, f).copy() for f in ("pcm", "text", "func", "user")}))
    return log


def test_start_takes_several_beats_then_frames_come_out():
    backend = CpuExecutor(ExecutorOptions(max_sessions=3, profile="fp32", max_context=24))
    driver = BeatDriver(backend)
    try:
        driver.open(0, SPEC)
        driver.open(2, SessionSpec("Hi.", []))
        assert not driver.ready(0) and not driver.ready(2)
        log = asyncio.run(serve(driver, 10))
    finally:
        backend.close()
    n_prompt = len(prompt_tokens(backend.text_codec, SPEC.instructions, SPEC.tools))
    ready_at = [next(k for k, (live, _) in enumerate(log) if live[s]) for s in (0, 2)]
    assert ready_at == [-(-n_prompt // PREFILL_CHUNK), 1] and ready_at[0] >= 4
    assert not any(live[1] for live, _ in log)
    for live, out in log[ready_at[0]:]:
        assert live[0] and live[2]
        assert out["pcm"].shape == (3, 2, 1764) and np.isfinite(out["pcm"][[0, 2]]).all()
        assert np.abs(out["pcm"][[0, 2]]).max() > 0
        assert ((0 <= out["text"][[0, 2]]) & (out["text"][[0, 2]] < CFG.thinker.vocab)).all()
        user = out["user"][[0, 2]]
        assert ((user == NO_TOKEN) | ((0 <= user) & (user < CFG.rnnt.vocab))).all()
    info = backend.describe()
    assert info["backend"] == "cpu" and info["config"] == "tiny" and info["profile"] == "fp32"
    assert len(backend.beat_cpu_s) == 10
    assert info["parameters"] == VoiceChat(CFG, FP32, "meta").parameter_count()
    assert info["state_bytes_per_session"] > 0 and info["max_prompt_tokens"] == MAX_PROMPT
    driver.close(0)
    assert not driver.ready(0)


@pytest.mark.slow
def test_beats_equal_the_reference_frames_with_forced_tokens_and_rolls_past_the_context():
    """Slot 1's beats equal VoiceChat.step frame by frame on a full (unwindowed) state, with a
    tool result forced over three frames; past max_context frames the session rolls (the
    reference rolls by VoiceChat.roll at the same frames) and its beats still equal the
    reference's. Bug it catches: the session went silent at max_context."""
    context, forced_ids = 16, [1000 + ord(c) for c in "<T>"]
    options = ExecutorOptions(max_sessions=2, profile="fp32", max_context=context, seed=4)
    backend = CpuExecutor(options)
    driver = BeatDriver(backend)
    try:
        driver.open(1, SPEC)
        log = asyncio.run(serve(driver, 24, push={7: {1: forced_ids}}))
    finally:
        backend.close()
    first = next(k for k, (live, _) in enumerate(log) if live[1])
    assert first + context // 2 + 4 < len(log)            # some beats past the context
    model = VoiceChat.random(CFG, FP32, seed=4)
    state = model.alloc_state(2, context, MAX_PROMPT)
    tokens = prompt_tokens(ByteFallbackCodec(), SPEC.instructions, SPEC.tools)
    start(model, state, [1], [tokens], chunk=PREFILL_CHUNK, warm=8)
    slot = torch.tensor([1])
    forced_at = {2 * (7 - first) + i: t for i, t in enumerate(forced_ids)}
    held = 0

    def rolls(held: int) -> bool:
        # a lone session rolls as soon as it is within a roll of the window (the book spreads
        # rolls over the beats before the window is full; one session's share is one a beat)
        return held + 2 > context - options.roll_frames and held >= options.roll_frames
    for k in range(first, len(log)):
        if rolls(held):
            model.roll(state, 1, len(tokens), options.roll_frames)
            held -= options.roll_frames
        for f in range(2):
            t = 2 * (k - first) + f
            noise = model.noise(4, torch.tensor([1]), torch.tensor([t]))
            o = model.step(state, torch.from_numpy(beat_audio(k, 2)[1:2, f]), slot, noise,
                           torch.tensor([forced_at.get(t, -1)]))
            out = log[k][1]
            assert out["text"][1, f] == o.text[0] and out["func"][1, f] == o.func[0], (k, f)
            assert (out["user"][1, f] == o.user[0].numpy()).all()
            np.testing.assert_allclose(out["pcm"][1, f], o.pcm[0].numpy(), atol=1e-5, rtol=0)
        held += 2
        assert np.abs(log[k][1]["pcm"][1]).max() > 0, k              # never silenced
    if rolls(held):                        # the executor rolled after its last beat, for the next
        model.roll(state, 1, len(tokens), options.roll_frames)
        held -= options.roll_frames
    # The caches the windows wrote are the caches of the full state, row for row.
    mine, ref = backend.runner.state, state
    n = int(ref.thinker.length[1])
    assert n == len(tokens) + held <= ref.thinker.max_positions
    assert mine.thinker.length[1] == n and mine.talker.position[1] == ref.talker.position[1]
    assert torch.allclose(mine.thinker.k[:, 1, :n], ref.thinker.k[:, 1, :n], atol=1e-5)
    assert torch.allclose(mine.thinker.v[:, 1, :n], ref.thinker.v[:, 1, :n], atol=1e-5)
    assert torch.allclose(mine.thinker.ssm[:, 1], ref.thinker.ssm[:, 1], atol=1e-5)
    p = int(ref.talker.position[1])
    assert torch.allclose(mine.talker.k[1, :, :, :, :p], ref.talker.k[1, :, :, :, :p], atol=1e-5)
    assert torch.allclose(mine.talker.v[1, :, :, :, :p], ref.talker.v[1, :, :, :, :p], atol=1e-5)


@pytest.mark.slow
def test_a_long_call_keeps_talking_with_bounded_state():
    """The tiny model with a 32-frame context runs 320 frames (ten contexts): it rolls every
    few beats, its outputs keep flowing (no stretch of PAD-only text with silent audio, as a
    session had once it ran out of context) and its caches never pass their size."""
    context, frames = 32, 320
    options = ExecutorOptions(max_sessions=1, profile="fp32", max_context=context)
    with pytest.raises(ValueError, match="context_roll"):
        CpuExecutor(ExecutorOptions(max_sessions=1, max_context=context, context_roll=3))
    backend = CpuExecutor(options)
    driver = BeatDriver(backend)
    th, tk = backend.runner.state.thinker, backend.runner.state.talker

    async def run() -> tuple[list, int]:
        outs, rolls, k = [], 0, 0
        while len(outs) < frames // 2:
            plan, out = await driver.beat(beat_audio(k, 1))
            k += 1
            rolls += len(plan.roll)
            if plan.live:
                outs.append((out.pcm[0].copy(), out.text[0].copy()))
                assert int(th.length[0]) <= th.max_positions
                assert int(tk.position[0]) <= tk.max_positions
        return outs, rolls

    try:
        driver.open(0, SessionSpec("Hi.", []))
        outs, rolls = asyncio.run(run())
    finally:
        backend.close()
    assert rolls >= (frames - context) // options.roll_frames
    n_prompt = len(prompt_tokens(backend.text_codec, "Hi.", []))
    assert int(th.length[0]) - n_prompt == int(tk.position[0]) - CFG.talker.n_warmup <= context
    window = 16                                       # beats: any 2.56 s has some output
    for i in range(0, len(outs) - window + 1, window // 2):
        part = outs[i:i + window]
        assert any(np.abs(pcm).max() > 0 for pcm, _ in part), i
        assert all(np.isfinite(pcm).all() for pcm, _ in part), i
        assert any((text != PAD).any() for _, text in part), i


# ----------------------------------------------------------------------------- the real node

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def excerpt(src: Path, dst: Path, seconds: float) -> None:
    with wave.open(str(src)) as w:
        rate, width, ch = w.getframerate(), w.getsampwidth(), w.getnchannels()
        frames = w.readframes(int(seconds * rate))
    with wave.open(str(dst), "wb") as w:
        w.setnchannels(ch)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(frames)


@pytest.mark.slow
def test_node_serves_a_wav_file_through_the_cpu_backend(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    port = free_port()
    node = subprocess.Popen([sys.executable, "-m", "wave_actors.node", "--backend", "cpu", "--bind",
                             f"tcp://127.0.0.1:{port}", "--max-sessions", "2"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = node.stdout.readline()
        assert line, f"node exited: {node.stderr.read()}"
        info = json.loads(line)
        assert info["backend"] == "cpu" and info["config"] == "tiny" and info["max_sessions"] == 2
        wav_in, wav_out = tmp_path / "in.wav", tmp_path / "reply.wav"
        excerpt(ROOT / "assets" / "demo_user.wav", wav_in, 2.0)
        out = subprocess.run([sys.executable, "-m", "transports.wavclient", "--connect",
                              f"tcp://127.0.0.1:{port}", "--wav", str(wav_in), "--out", str(wav_out),
                              "--tail", "1.5"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        stats = report["stats"]
        print("\nwavclient report:", json.dumps({k: report[k] for k in ("seconds_out", "stats")}))
        assert report["errors"] == []
        # the cpu executor routes each beat's frame 0 before its frame 1: they arrive in order
        assert report["frames_in_order"]
        assert stats["frames_in"] + stats["dropped"] == 25 and stats["frames_in"] >= 20
        assert stats["frames_out"] >= stats["frames_in"]
        with wave.open(str(wav_out)) as w:                    # one 80 ms frame out per frame
            assert w.getframerate() == 22050
            seconds = w.getnframes() / 22050
        assert abs(seconds - report["seconds_out"]) < 0.01
        assert abs(seconds - 0.08 * stats["frames_out"]) < 0.01 and seconds >= 0.08 * stats["frames_in"]
    finally:
        node.send_signal(signal.SIGTERM)
        rc = node.wait(timeout=30)
    assert rc == 0, node.stderr.read()


def test_three_sessions_go_live_together_and_every_beat_is_timed():
    """The node's default (tiny config, reference profile) without prompt snapshots: three
    short prompts start in one beat, then every beat carries all three and records the
    worker's CPU time (printed: what a beat costs here, not asserted)."""
    backend = CpuExecutor(ExecutorOptions(max_sessions=3, snapshot_mb=0))
    driver = BeatDriver(backend)
    try:
        for s in range(3):
            driver.open(s, SessionSpec("Hi.", []))
        log = asyncio.run(serve(driver, 10))
        assert all(live.all() for live, _ in log[1:])
        cpu = sorted(list(backend.beat_cpu_s)[2:])
    finally:
        backend.close()
    print(f"\n3 sessions: beat CPU min {1000 * cpu[0]:.1f} ms, median {1000 * cpu[len(cpu) // 2]:.1f} ms, "
          f"max {1000 * cpu[-1]:.1f} ms")
    assert len(cpu) == 8


def test_system_prompt_renders_tools_between_bos_and_eos():
    codec = ByteFallbackCodec()
    text = render_system_prompt("Be brief.", TOOLS + [{"name": "hang_up", "parameters": {}}])
    assert text == ('Be brief.\n\n<AVAILABLE_TOOLS>[{"name":"get_weather","description":"Current weather '
                    'for a city.","parameters":{"type":"object","properties":{"city":{"type":"string"}},'
                    '"required":["city"]}}, {"name":"hang_up","parameters":{}}]</AVAILABLE_TOOLS>')
    assert render_system_prompt("Be brief.") == "Be brief."
    ids = prompt_tokens(codec, "Be brief.", TOOLS)
    assert ids[0] == BOS and ids[-1] == EOS and codec.decode_bytes(ids[1:-1]).decode().startswith("Be brief.")
    with pytest.raises(ValueError, match="at most 5"):
        render_system_prompt("", TOOLS * 6)


def test_a_tokenizer_supplies_the_text_codec_and_the_talker_characters(tmp_path):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    vocab = {f"<SPECIAL_{i}>": i for i in range(1000)}
    for c in "abcdefghijklmnopqrstuvwxyz.,!?":
        vocab[c] = len(vocab)
    for w in ("hello", "weather", "tomorrow"):
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<SPECIAL_0>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(f"<SPECIAL_{i}>", special=True) for i in range(1000)])
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    backend = CpuExecutor(ExecutorOptions(max_sessions=1, profile="fp32", max_context=8, tokenizer=str(path)))
    driver = BeatDriver(backend)
    try:
        assert backend.text_codec.encode("hello weather") == [vocab["hello"], vocab["weather"]]
        assert backend.cfg.talker.max_chars == len("tomorrow")
        table = backend.model.talker.tts_model.embed_subword
        assert table.char_lengths[vocab["tomorrow"]] == 8 and table.char_lengths[vocab["a"]] == 1
        driver.open(0, SessionSpec("hello", []))
        log = asyncio.run(serve(driver, 3))
        assert log[-1][0][0] and np.isfinite(log[-1][1]["pcm"][0]).all()
    finally:
        backend.close()
