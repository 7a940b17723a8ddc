"""The WAV client with real parts: files written by soundfile in each format, a real node (sim
backend) as a subprocess on TCP, and `python -m transports.wavclient` run as a subprocess."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from transports import audio as A
from transports.wavclient import OUT_FORMATS, read_audio, write_audio

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
SECONDS = 0.48              # six whole 80 ms frames of the node at every input rate
NODE_FRAMES = 6
SIM_RATE = 22050            # the sim node's output_sample_rate
# (format, subtype, rate, channels) of each input; rates off the protocol's list are resampled
INPUTS = {
    "wav-u8": ("WAV", "PCM_U8", 16000, 1),
    "wav-s16-stereo": ("WAV", "PCM_16", 16000, 2),
    "wav-s24": ("WAV", "PCM_24", 48000, 1),
    "wav-s32": ("WAV", "PCM_32", 8000, 1),
    "wav-f32": ("WAV", "FLOAT", 16000, 1),
    "wav-f64": ("WAV", "DOUBLE", 44100, 1),
    "flac-stereo": ("FLAC", "PCM_24", 44100, 2),
    "ogg-vorbis": ("OGG", "VORBIS", 22050, 1),
}
SUFFIX = {"WAV": ".wav", "FLAC": ".flac", "OGG": ".ogg"}


def tone(rate: int, seconds: float = SECONDS) -> np.ndarray:
    t = np.arange(int(round(seconds * rate))) / rate
    return 0.3 * np.sin(2 * np.pi * 220 * t)


def write_input(tmp_path: Path, name: str) -> tuple[Path, np.ndarray]:
    """The file of INPUTS[name] and the mono samples it should read as (stereo: the left
    channel is the tone, the right half of it, so the mix is 0.75 of the tone)."""
    fmt, subtype, rate, channels = INPUTS[name]
    x = tone(rate)
    data = np.stack([x, 0.5 * x], axis=1) if channels == 2 else x
    path = tmp_path / f"{name}{SUFFIX[fmt]}"
    sf.write(path, data, rate, format=fmt, subtype=subtype)
    return path, (0.75 * x if channels == 2 else x)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wavclient(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transports.wavclient", *args], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=60)


def assert_one_line_error(out: subprocess.CompletedProcess) -> str:
    assert out.returncode != 0 and out.stdout == ""
    assert "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wavclient: "), out.stderr
    return lines[0]


@pytest.fixture(scope="module")
def node():
    """The endpoint of a real node on the sim backend, one for the module."""
    proc = subprocess.Popen([sys.executable, "-m", "wave_actors.node", "--backend", "sim",
                             "--bind", "tcp://127.0.0.1:0", "--max-sessions", "2"], cwd=ROOT,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, f"node exited: {proc.stderr.read()}"
        yield json.loads(line)["listening"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


# -- in-process: reading and writing files --------------------------------------------------------
@pytest.mark.parametrize("name", INPUTS)
def test_read_audio_gives_the_files_mono_samples_and_rate(tmp_path, name):
    """Catches a decoder that mis-scales a sample width (8-bit offset, 24-bit, float read as
    integer), drops the file's rate, or keeps one channel instead of mixing them."""
    path, want = write_input(tmp_path, name)
    x, rate = read_audio(path)
    assert rate == INPUTS[name][2] and x.dtype == np.float32 and x.ndim == 1
    assert len(x) == len(want)
    if INPUTS[name][1] == "VORBIS":                # lossy: the level, not each sample
        assert np.sqrt(np.mean(x ** 2)) == pytest.approx(np.sqrt(np.mean(want ** 2)), rel=0.05)
    else:
        assert np.max(np.abs(x - want)) < (1 / 128 if INPUTS[name][1] == "PCM_U8" else 1e-4)


@pytest.mark.parametrize("ext", OUT_FORMATS)
def test_write_audio_uses_the_extensions_format_and_keeps_the_wire_samples(tmp_path, ext):
    """Catches a reply written in one container whatever its name says, at the wrong rate, or
    (lossless formats) with the node's 16-bit samples rescaled or unclipped."""
    wire = np.array([0, 1, -1, 16384, 32767, -32768, 12345], np.int16)
    x = np.concatenate([A.decode(wire.tobytes(), "pcm_s16le"), np.float32([1.5, -1.5])])
    path = tmp_path / f"reply{ext}"
    write_audio(path, x, SIM_RATE)
    info = sf.info(path)
    assert (info.format, info.subtype) == OUT_FORMATS[ext] and info.samplerate == SIM_RATE
    if info.subtype == "PCM_16":
        back, _ = sf.read(path, dtype="int16")
        assert back.tolist() == wire.tolist() + [32767, -32768]


# -- the command against a real node ------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", INPUTS)
def test_each_input_format_streams_and_the_reply_is_written(tmp_path, node, name):
    """Catches an input format the client cannot stream (a 32-bit float WAV stopped it with
    `wave.Error: unknown format: 3`), a rate sent wrongly (the node would count another number
    of frames), and a reply not written in the format its extension names."""
    path, _ = write_input(tmp_path, name)
    ext = list(OUT_FORMATS)[list(INPUTS).index(name) % len(OUT_FORMATS)]
    reply = tmp_path / f"reply{ext}"
    out = wavclient("--connect", node, "--wav", str(path), "--out", str(reply),
                    "--pace", "8", "--tail", "0.3")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    report = json.loads(out.stdout)
    stats = report["stats"]
    assert stats["frames_in"] + stats["dropped"] == NODE_FRAMES and report["errors"] == []
    info = sf.info(reply)
    assert info.samplerate == SIM_RATE and info.format == OUT_FORMATS[ext][0]
    assert info.frames > 0 and abs(info.frames / SIM_RATE - report["seconds_out"]) < 0.01


# -- failures: one line on stderr, a non-zero status, no traceback --------------------------------
def test_a_missing_file_is_one_line_naming_it(tmp_path):
    """Catches a missing input that ends in a traceback, or in a message without its path."""
    path = tmp_path / "nope.wav"
    line = assert_one_line_error(wavclient("--wav", str(path), "--timeout", "0.5"))
    assert line == f"wavclient: {path}: No such file or directory"


def test_a_corrupt_file_is_one_line_naming_it(tmp_path):
    """Catches a file libsndfile cannot decode ending in a traceback (soundfile's error, or the
    `wave` module's `unknown format`) instead of one line with the path and the reason."""
    path = tmp_path / "corrupt.wav"
    path.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(256)) * 4)
    line = assert_one_line_error(wavclient("--wav", str(path), "--timeout", "0.5"))
    assert line.startswith(f"wavclient: {path}: not a readable audio file")


def test_an_unsupported_output_extension_fails_before_the_call(tmp_path):
    """Catches an output path whose format is found wrong only after the call (then a
    traceback), or a reply written as WAV under another name. Nothing listens at the address
    and the wait for it is long: checked after connecting, this would take 20 s."""
    path, _ = write_input(tmp_path, "wav-f32")
    reply = tmp_path / "reply.mp3"
    t0 = time.monotonic()
    out = wavclient("--connect", f"tcp://127.0.0.1:{free_port()}", "--wav", str(path),
                    "--out", str(reply), "--timeout", "20")
    line = assert_one_line_error(out)
    assert line.startswith(f"wavclient: {reply}: unsupported output extension '.mp3'")
    assert time.monotonic() - t0 < 10 and not reply.exists()


def test_a_dead_address_is_one_line_naming_it_within_the_timeout(tmp_path):
    """Catches a client that waits out its 10 s open and ends in a `NodeUnavailable` traceback
    when no node listens, or that does not say which address did not answer."""
    path, _ = write_input(tmp_path, "wav-s16-stereo")
    endpoint = f"tcp://127.0.0.1:{free_port()}"          # nothing listens there
    t0 = time.monotonic()
    out = wavclient("--connect", endpoint, "--wav", str(path), "--out",
                    str(tmp_path / "reply.wav"), "--timeout", "0.5")
    line = assert_one_line_error(out)
    assert line == f"wavclient: no node answered at {endpoint} within 0.5 s"
    assert time.monotonic() - t0 < 5 and not (tmp_path / "reply.wav").exists()
