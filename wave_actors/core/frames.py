"""The clock of the model, in one place: every other module derives its sizes from these."""

FRAME_MS = 80
FRAME_S = FRAME_MS / 1000.0
FRAMES_PER_BEAT = 2
BEAT_MS = FRAME_MS * FRAMES_PER_BEAT            # 160: the deadline of one beat
BEAT_S = BEAT_MS / 1000.0
# Which of a beat's frames a routing delivers: all at once, or the first while the rest compute
# (an executor with `Capabilities.first_frame`) and then the rest.
ALL_FRAMES = slice(0, FRAMES_PER_BEAT)
FIRST_FRAME = slice(0, 1)
LATER_FRAMES = slice(1, FRAMES_PER_BEAT)

IN_RATE = 16_000                                # the model hears 16 kHz
OUT_RATE = 22_050                               # the codec speaks 22.05 kHz
SAMPLES_IN = IN_RATE * FRAME_MS // 1000         # 1280 per frame
SAMPLES_OUT = OUT_RATE * FRAME_MS // 1000       # 1764 per frame
SILENCE = -1                                    # the frame number of a frame heard as silence

assert SAMPLES_IN == 1280 and SAMPLES_OUT == 1764
