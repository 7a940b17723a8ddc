"""The node's front and its session workers: the messages between them, over one ipc socket pair
per worker (the front's ROUTER, the worker's DEALER).

Both ends are processes of one node, started by the front on a private ipc directory, so control
messages are pickled tuples; the hot ones are flat:

    clock → worker   [BEAT, rows (BEAT_ROW), pcm]                  a beat's rows for the worker's
                                                                   sessions, pcm (k, F, 1764) f32,
                                                                   on the worker's frames socket
                     [BEAT_AT, rows (BEAT_ROW), slots (i4),        the same, its PCM left in the
                      where (SHARED_AT), segment name]             engine's shared output buffer
                                                                   (`shared_outputs`): the rows'
                                                                   slots in it, and which fill
                     [FRAMES_AT, where (RING_AT), segment name]    where to write its frames'
                                                                   samples (`shared_frames`);
                                                                   no name: in the messages
    front → worker   [AUDIO, rows (AUDIO_ROW), payloads]           the clients' audio messages of
                                                                   one loop turn, payloads joined
                     [CTRL, pickle(tuple)]                         start, close, func, flooded,
                                                                   finish, flush, stop
    worker → front   [SENDS, pickle([(rid, audio, parts), ...]), *frames]   what its sessions
                                                                   sent their clients, one loop
                                                                   turn's worth
                     [CTRL, pickle(tuple)]                         ready, closing, crashed,
                                                                   tokens, ended, drops, gone

`rid` is the front's number for a session (its route); messages naming a rid the other side no
longer knows are counted and dropped.
"""
from __future__ import annotations

import pickle

import numpy as np

from wave_actors.core.contract import MAX_USER_TOKENS
from wave_actors.core.frames import FRAMES_PER_BEAT

AUDIO, BEAT, BEAT_AT, CTRL, FRAMES_AT, SENDS = b"A", b"B", b"R", b"C", b"F", b"S"
AUDIO_ROW = np.dtype([("rid", "<i4"), ("seq", "<i8"), ("nbytes", "<i4")])
# A beat's header for one session: the front's number for it, its first output frame, and the
# frames' text, function and user-transcript tokens.
# A row carries the beat's token rows whole; the message delivers the beat's frames lo..hi-1
# (the first frame alone while the second computes, then the rest), `frame` being lo's number.
BEAT_ROW = np.dtype([("rid", "<i8"), ("frame", "<i8"), ("text", "<i4", (FRAMES_PER_BEAT,)),
                     ("func", "<i4", (FRAMES_PER_BEAT,)),
                     ("user", "<i4", (FRAMES_PER_BEAT, MAX_USER_TOKENS)),
                     ("lo", "<i1"), ("hi", "<i1")])


def clock_identity(index: int, pid: int) -> bytes:
    """A worker's frames socket's identity on the beat clock's ROUTER (outputs come back on it);
    the pid makes a restarted worker's a new one."""
    return b"w%d.%d" % (index, pid)


def ctrl(*msg) -> list[bytes]:
    return [CTRL, pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)]


def audio(items: list[tuple[int, int, bytes]]) -> list[bytes]:
    rows = np.array([(rid, seq, len(p)) for rid, seq, p in items], AUDIO_ROW)
    return [AUDIO, rows.tobytes(), b"".join(p for *_, p in items)]


def read_audio(rows: bytes, payloads: bytes) -> list[tuple[int, int, bytes]]:
    """(rid, seq, payload) for each message, or ValueError when the parts disagree."""
    head = np.frombuffer(rows, AUDIO_ROW)
    if int(head["nbytes"].sum()) != len(payloads) or (head["nbytes"] < 0).any():
        raise ValueError("audio rows and payload bytes disagree")
    ends = np.cumsum(head["nbytes"])
    starts = ends - head["nbytes"]
    return [(int(r), int(q), payloads[a:b]) for r, q, a, b in
            zip(head["rid"].tolist(), head["seq"].tolist(), starts.tolist(), ends.tolist())]


def beat(head: np.ndarray, pcm: np.ndarray) -> list:
    """A beat's rows for one worker: `head` a BEAT_ROW record a row, their PCM one float32 array
    (k, frames delivered, samples); both sent as they are."""
    return [BEAT, head, np.ascontiguousarray(pcm, np.float32)]


# Where a beat's PCM lies in the engine's shared outputs: the segment's shape (slots, buffers),
# the buffer, and the fill it must still hold when the worker has copied its rows.
SHARED_AT = np.dtype([("slots", "<i4"), ("depth", "<i4"), ("index", "<i4"), ("fill", "<i8")])


def beat_at(head: np.ndarray, slots: np.ndarray, where: np.ndarray, name: bytes) -> list:
    """A beat's rows for one worker whose PCM stays in the shared buffer `where` names."""
    return [BEAT_AT, head, np.ascontiguousarray(slots, np.int32), where, name]


# The engine's shared ring of frames: its slots and places a slot (`shared_frames.layout`).
RING_AT = np.dtype([("slots", "<i4"), ("ring", "<i4")])


def frames_at(slots: int, ring: int, name: bytes) -> list:
    return [FRAMES_AT, np.array([(slots, ring)], RING_AT).tobytes(), name]


def read_frames_at(where, name) -> tuple[int, int, str]:
    """(slots, ring, segment name: "" for none), or ValueError."""
    where = np.frombuffer(where, RING_AT)
    if len(where) != 1:
        raise ValueError("a ring's place is one record")
    return int(where["slots"][0]), int(where["ring"][0]), bytes(name).decode()


def read_beat_at(head, slots, where, name
                 ) -> tuple[list[tuple[int, dict]], np.ndarray, dict, slice]:
    """(rid, header) a row, the rows' slots in the shared buffer, where it lies, and which of
    the beat's frames the message delivers."""
    rows, frames = _headers(head)
    slots = np.frombuffer(slots, np.int32)
    where = np.frombuffer(where, SHARED_AT)
    if len(slots) != len(rows) or len(where) != 1:
        raise ValueError("a shared beat's rows, slots and place disagree")
    at = {k: int(where[k][0]) for k in SHARED_AT.names}
    at["name"] = bytes(name).decode()
    return rows, slots, at, frames


def _headers(head) -> tuple[list[tuple[int, dict]], slice]:
    """The rows' headers, their token lists cut to the message's frames, and those frames."""
    head = np.frombuffer(head, BEAT_ROW)
    lo, hi = (int(head["lo"][0]), int(head["hi"][0])) if len(head) else (0, FRAMES_PER_BEAT)
    if not 0 <= lo < hi <= FRAMES_PER_BEAT or (head["lo"] != lo).any() or (head["hi"] != hi).any():
        raise ValueError("a beat message's frames are out of range or differ between rows")
    return [(rid, {"frame": first, "text": text[lo:hi], "func": func[lo:hi], "user": user[lo:hi]})
            for rid, first, text, func, user in zip(
                head["rid"].tolist(), head["frame"].tolist(), head["text"].tolist(),
                head["func"].tolist(), head["user"].tolist())], slice(lo, hi)


def read_beat(head, pcm, samples: int) -> tuple[list[tuple[int, dict]], np.ndarray]:
    """(rid, the session's header) a row, and the rows' PCM of the message's frames (a view of
    the message), or ValueError."""
    rows, frames = _headers(head)
    n = frames.stop - frames.start
    if len(pcm) != 4 * len(rows) * n * samples:
        raise ValueError("a beat's rows and PCM bytes disagree")
    return rows, np.frombuffer(pcm, np.float32).reshape(len(rows), n, samples)


def sends(items: list[tuple[int, bool, list[bytes]]]) -> list[bytes]:
    meta = [(rid, audio_msg, len(parts)) for rid, audio_msg, parts in items]
    out = [SENDS, pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL)]
    for _rid, _a, parts in items:
        out.extend(parts)
    return out


def read_sends(parts: list) -> list[tuple[int, bool, list]]:
    meta = pickle.loads(parts[0])
    items, i = [], 1
    for rid, audio_msg, n in meta:
        items.append((rid, audio_msg, parts[i:i + n]))
        i += n
    return items


def read_ctrl(blob: bytes) -> tuple:
    return pickle.loads(blob)
