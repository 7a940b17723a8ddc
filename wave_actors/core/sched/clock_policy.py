"""The beat clock's policy: how it releases a beat and how much input it buffers per session.

An object, not constants, so that an A/B of the release hold or of the jitter buffer's shedding
is a flag and every result records the values it ran with.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from wave_actors.core.frames import FRAMES_PER_BEAT
from wave_actors.core.sched.jitter import Shedding


@dataclass(frozen=True, kw_only=True)
class ClockPolicy:
    # Session actors' output work waits from this long before a release until the beat's device
    # work is queued: output work of the previous beat that wakes just before a release would
    # otherwise run first and delay it. 0 turns the hold off.
    release_hold_s: float = 3e-3
    # With hold_inputs, their input work (a client's audio resampled, cut into frames, sent to
    # the clock) waits through the same hold: a burst of frames from many callers just before a
    # release would otherwise run first, and the release waits behind it. A frame held so misses
    # this beat only if its session's buffer was empty. Off by default: no measurement has
    # shown it shortens the release's wake.
    hold_inputs: bool = False
    # Session actors that start a beat's output work in one turn of the event loop; the rest
    # wait for the next turns. asyncio runs every ready task before it fires a timer, so
    # without slices all sessions' output work would run as one block, and a release falling
    # inside it would wake late. 0: no slices.
    output_slice: int = 16
    # The release's last stretch is spun on the loop, not timed: a timer may fire up to a
    # millisecond late (uvloop's are whole milliseconds). A clock alone on its loop (the engine
    # process's) sleeps it in the thread and spins only its end (`Clock.sleep_until(block=)`).
    release_spin_s: float = 1e-3
    # Frame batches are read at most this often: each read queues everything waiting on the
    # socket as one batch. Every wake of the loop to read costs about as much as the frames it
    # queues, and workers send a few hundred small batches a beat at 1,000 sessions; a release
    # drains the socket itself, so a frame waits no longer for its beat. 0: read on arrival.
    # (A clock whose workers write their frames into its shared ring reads its few messages
    # on arrival: `BeatClockActor._reads_every`.)
    frames_every_s: float = 10e-3
    prebuffer: int = 3              # frames queued before a session starts consuming
    max_queue: int = 50             # the jitter buffer's bound per session, in frames
    # The jitter buffer's shedding (jitter.Shedding, whose comments give the reasons): the beats
    # it looks back over, the frames it keeps above their lowest level, the most it sheds a beat.
    # jitter_shed_per_beat 0 never sheds: the delay a session grows to stays for its call.
    jitter_window_s: float = Shedding.window_s
    jitter_keep: int = Shedding.keep
    jitter_shed_per_beat: int = Shedding.per_beat
    name: str = field(default="clock", init=False)

    def __post_init__(self) -> None:
        if min(self.release_hold_s, self.release_spin_s, self.output_slice,
               self.frames_every_s) < 0:
            raise ValueError("release_hold_s, release_spin_s, output_slice and frames_every_s "
                             "must be >= 0")
        if self.prebuffer < 1 or self.max_queue < self.prebuffer + FRAMES_PER_BEAT:
            raise ValueError(f"prebuffer >= 1 and max_queue >= prebuffer + {FRAMES_PER_BEAT}")
        if self.jitter_window_s <= 0 or self.jitter_keep < 0 or self.jitter_shed_per_beat < 0:
            raise ValueError("jitter_window_s > 0, jitter_keep >= 0, jitter_shed_per_beat >= 0")

    @property
    def shedding(self) -> Shedding | None:
        """What the session table's scheduler sheds by; None: a fixed buffer."""
        if self.jitter_shed_per_beat == 0:
            return None
        return Shedding(window_s=self.jitter_window_s, keep=self.jitter_keep,
                        per_beat=self.jitter_shed_per_beat)

    def describe(self) -> dict:
        params = asdict(self)
        params.pop("name")
        return {"name": self.name, "class": f"{__name__}:ClockPolicy", "params": params}
