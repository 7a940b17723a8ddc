"""The model side of a beat, shared by the executors that run the real model (cpu, graph): the
model and its slot-indexed state, built once; and the plan's pieces that every such executor runs
the same way — slot resets (with the talker's warm-up copied in) and context rolls, start rows
(prompt chunks), and the live frames run eagerly on a window of the KV caches.

The KV caches are sized for `max_context` frames; an eager call runs on a window of them rounded
up to WINDOW_STEP positions past the longest session in the call, which keeps the attention cost
proportional to the context in use (results identical, see `VoiceChatState.window`).
"""
from __future__ import annotations

import logging
import math

import numpy as np
import torch

from gpu.engine.slot_resets import SlotResets
from gpu.engine.snapshot_rows import SnapshotRows, model_salt, space_for
from gpu.model.checkpoint import available_host_memory, load_checkpoint
from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.talker.text import CharTable
from gpu.model.voicechat import VoiceChat
from gpu.model.voicechat_state import session_state_bytes
from gpu.model.voicechat_weights import param_shapes
from wave_actors.core.contract import BeatOutput, ExecutorOptions, SessionSpec
from wave_actors.core.prompt import fitted_prompt_tokens
from wave_actors.core.sched.slot_book import BookPlan
from wave_actors.core.sched.start_shape import StartShape
from wave_actors.core.text import PAD, TextCodec, UserByteFallbackCodec, load_text_codec

log = logging.getLogger("wave.model_runner")

WINDOW_STEP = 64            # KV windows are multiples of this many positions
VOCAB_PROBE = "Hello! How is the weather in Zürich today? Call get_weather({\"city\": \"Paris\"})."


def model_config(opts: ExecutorOptions, codec: TextCodec) -> tuple[VoiceChatConfig, CharTable | None]:
    """The model config; with a tokenizer, the talker's character table comes from its pieces
    (M_c = the longest piece), and a tokenizer whose ids overflow the model's vocabulary (a real
    131k tokenizer with the tiny config) is refused at start."""
    cfg = VoiceChatConfig.named(opts.config)
    if opts.tokenizer is None:
        return cfg, None
    probe = codec.encode(VOCAB_PROBE)
    if max(probe, default=0) >= cfg.thinker.vocab:
        raise ValueError(f"the tokenizer {opts.tokenizer} gives ids up to {max(probe)} but the "
                         f"{cfg.name} model's vocabulary has {cfg.thinker.vocab}; use --config full")
    pieces = codec.char_pieces(cfg.thinker.vocab)
    cfg = cfg.with_max_chars(max(1, max(len(p) for p in pieces)))
    return cfg, CharTable.from_pieces(pieces, cfg.talker)


def check_host_memory(cfg: VoiceChatConfig, profile: Profile, opts: ExecutorOptions,
                      max_prompt: int) -> None:
    """Refuse at start, saying why, a model that cannot fit in host memory (the full config is
    ~44 GB of fp32 weights while loading) instead of being killed half-way."""
    weights = 4 * sum(math.prod(s) for s in param_shapes(cfg).values())
    state = opts.max_sessions * session_state_bytes(cfg, profile, opts.max_context,
                                                    max_prompt)["total"]
    available = available_host_memory()
    if available is not None and weights + state > available:
        raise MemoryError(
            f"the {cfg.name} model needs {weights / 1e9:.1f} GB of host memory for its weights "
            f"(fp32 while loading) + {state / 1e9:.1f} GB of state for {opts.max_sessions} "
            f"sessions; {available / 1e9:.1f} GB are available. Use --config tiny, or a GPU "
            f"executor")


class ModelRunner:
    """A model, its state and the plan's pieces that run eagerly. `model` is built by the
    executor (on its device, with its kernels); `slots` rows of state (a GPU executor adds a
    trash row for padded batch entries)."""

    def __init__(self, model: VoiceChat, opts: ExecutorOptions, shape: StartShape, slots: int,
                 snapshot_bytes: float = 0.0):
        self.model, self.opts, self.shape = model, opts, shape
        self.state = model.alloc_state(slots, opts.max_context, shape.max_prompt)
        salt = model_salt(model.cfg, opts.profile, str(self.state.thinker.k.dtype),
                          opts.checkpoint or f"random seed {opts.seed}", opts.tokenizer)
        self.snapshots = SnapshotRows(self.state, space_for(self.state, snapshot_bytes, salt))
        self.resets = SlotResets(self.state, model)     # a GPU executor captures them

    @property
    def device(self) -> torch.device:
        return self.state.text_prev.device

    def prompt_tokens(self, codec: TextCodec, spec: SessionSpec) -> list[int]:
        """The session's prompt as the model takes it (PromptRejected past MAX_TOOLS tools or
        the positions reserved for it), ids inside the vocabulary."""
        vocab = self.model.cfg.thinker.vocab
        tokens = fitted_prompt_tokens(codec, spec.instructions, list(spec.tools or []),
                                      self.shape.max_prompt)
        if max(tokens) >= vocab:
            # a text codec wider than a small test config's vocabulary: not the caller's doing
            log.warning("prompt ids outside the vocabulary dropped")
            tokens = [t for t in tokens if t < vocab]
        return tokens

    def index(self, values) -> torch.Tensor:
        """Host ints → an int64 tensor on the state's device (slots, tokens, counts)."""
        return torch.as_tensor(np.asarray(values, np.int64), device=self.device)

    def window(self, thinker_need: int, talker_need: int):
        """The state's KV caches cut to the positions a call writes, rounded up (see top)."""
        cut = lambda need, cap: min(cap, max(1, -(-need // WINDOW_STEP)) * WINDOW_STEP)  # noqa: E731
        return self.state.window(cut(thinker_need, self.state.thinker.max_positions),
                                 cut(talker_need, self.state.talker.max_positions))

    def reset(self, plan: BookPlan) -> None:
        """The plan's slot resets (sessions opened), before anything else of it; the talker's
        warm-up is copied in with them (it is the same for every session); then the prompt
        snapshots that starting slots copy."""
        self.reset_slots(plan)
        self.snapshots.copy_in(plan.copies)

    def reset_slots(self, plan: BookPlan) -> None:
        """The plan's slot resets: one captured replay where the executor captured a count that
        holds them (calls opening at scattered slots), else by runs of consecutive slots (plain
        fills of views, a few launches a run, no index to send). A slot that copies a snapshot
        in this plan keeps its thinker part for the copy, which writes all of it."""
        if plan.resets:
            self.resets.run(plan.resets, {slot for slot, _, _ in plan.copies})

    def clean(self, plan: BookPlan) -> None:
        """The plan's cleans: slots whose sessions closed, wholly reset behind the beat's work
        (nothing of the beat reads them), so their next sessions start without a reset."""
        if plan.cleans:
            self.resets.clean(plan.cleans)

    def save(self, plan: BookPlan) -> None:
        """The plan's snapshot saves, after its start rows."""
        self.snapshots.save(plan.saves)

    def roll(self, plan: BookPlan) -> None:
        """The plan's context rolls, after its frames (nothing read back: queued on a device,
        they run behind the beat's work)."""
        for slot, sink in plan.roll:
            self.model.roll(self.state, slot, sink, plan.roll_frames)

    def row_tokens(self, rows: list[tuple[int, list[int], int]], count: int,
                   pad_slot: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Start rows as the prefill takes them: slots [count], tokens [count, chunk] (PAD
        after each row's part), valid counts [count]; rows past `rows` go to `pad_slot` with
        nothing valid."""
        slots = np.full(count, pad_slot, np.int64)
        tokens = np.full((count, self.shape.prefill_chunk), PAD, np.int64)
        valid = np.zeros(count, np.int64)
        for r, (slot, part, _) in enumerate(rows):
            slots[r], valid[r] = slot, len(part)
            tokens[r, :len(part)] = part
        return slots, tokens, valid

    def start_rows(self, plan: BookPlan) -> None:
        """The plan's start rows, eagerly: one prompt chunk for each starting slot named."""
        if not plan.rows:
            return
        slots, tokens, valid = self.row_tokens(plan.rows, len(plan.rows))
        # One window for every batch (the prompt's positions and a chunk past them), not the
        # longest row's: a row's numbers then do not depend on which rows share its beat, so a
        # prompt snapshot equals the state any later prefill of that prompt leaves, bit for bit.
        self.model.prefill_chunk(self.window(self.shape.max_prompt + self.shape.prefill_chunk, 1),
                                 self.index(slots), self.index(tokens), self.index(valid))

    def frames(self, plan: BookPlan, audio: np.ndarray, out: BeatOutput, on_frame=None) -> None:
        """The live rows' two frames, eagerly, outputs into `out`'s slot rows; audio [S, 2,
        1280] is the clock's ring slot (the rows of `plan.live` are gathered here).
        `on_frame(f)` is called once frame f's outputs are in `out`."""
        live = plan.live
        session = self.index(plan.session)
        window = self.window(plan.thinker_need, plan.talker_need)
        noise_of = lambda f: self.model.noise(self.opts.seed, session, self.index(plan.frame0 + f))  # noqa: E731

        def emit(f: int, o) -> None:
            out.pcm[live, f] = o.pcm.cpu().numpy()
            out.text[live, f] = o.text.cpu().numpy()
            out.func[live, f] = o.func.cpu().numpy()
            out.user[live, f] = o.user.cpu().numpy()
            if on_frame is not None:
                on_frame(f)

        x = torch.from_numpy(audio)[self.index(live).cpu()].to(self.device)
        self.model.frames(window, x, self.index(live), noise_of, self.index(plan.forced), emit)

    def facts(self, name: str, codec: TextCodec, profile: Profile) -> dict:
        """What every model executor prints at start: the model, its weights and sizes."""
        opts, cfg = self.opts, self.model.cfg
        return {"backend": name, "max_sessions": opts.max_sessions, "config": cfg.name,
                "profile": profile.name, "parameters": self.model.parameter_count(),
                "weights": opts.checkpoint or f"random (seed {opts.seed})",
                "text_codec": getattr(codec, "name", type(codec).__name__),
                "max_context_frames": opts.max_context, "max_prompt_tokens": self.shape.max_prompt,
                "state_bytes_per_session": session_state_bytes(
                    cfg, profile, opts.max_context, self.shape.max_prompt)["total"],
                "snapshots": {"entries": self.snapshots.space.entries,
                              "capacity_bytes": int(self.snapshots.space.capacity_bytes)}}


def load_model(cfg: VoiceChatConfig, profile: Profile, opts: ExecutorOptions,
               device: torch.device | str, char_table: CharTable | None) -> VoiceChat:
    if opts.checkpoint:
        return load_checkpoint(opts.checkpoint, cfg, profile, device, char_table)
    return VoiceChat.random(cfg, profile, device, opts.seed, char_table)


def text_codecs(opts: ExecutorOptions) -> tuple[TextCodec, TextCodec]:
    """The thinker's text codec (the real tokenizer when given) and the RNNT's user codec."""
    return load_text_codec(opts.tokenizer), UserByteFallbackCodec()
