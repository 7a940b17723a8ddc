"""relpos_attention (Triton) against relpos_attention_ref at small odd sizes and the perception's
own (R 72, left context 70, head_dim 128): fp32 and bf16, one and two queries a step, first frames
(rows masked), frames past the ring (wraparound), slots out of order in a larger state, int32 and
int64 slots; the rings are read, never written. Then the ref against the model's own math, and a
tiny perception streamed with the hook installed against the reference path."""
import pytest
import torch

from gpu.engine.decode_ops import TritonDecodeOps, install_perception
from gpu.kernels.layer_norm import add_layer_norm_ref
from gpu.kernels.relpos_attention import relpos_attention, relpos_attention_ref
from gpu.model import perception as P
from gpu.model import perception_weights as PW
from tests.tensorkit import counting, edit_loop, exact_fp32, rel

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def make(batch, n_f, heads, dh, rows, max_slots, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n_f, heads, dh, generator=g)
    k = torch.randn(max_slots, heads, rows, dh, generator=g)
    v = torch.randn(max_slots, heads, rows, dh, generator=g)
    pos = torch.randn(rows, heads, dh, generator=g)
    bu, bv = 0.5 * torch.randn(heads, dh, generator=g), 0.5 * torch.randn(heads, dh, generator=g)
    return [t.to(dtype).to(DEV) for t in (q, k, v, pos, bu, bv)]


CASES = [  # (F, H, dh, left_context, rows, S, frames, slots)
    (1, 3, 24, 5, 7, 9, [0, 1, 3, 40], [6, 0, 3, 8]),         # first frames, then wrapped
    (2, 3, 24, 5, 7, 9, [0, 1, 6, 1001], [2, 7, 0, 5]),
    (2, 3, 40, 5, 7, 6, [5, 2, 123], [5, 1, 3]),              # dh 40 in a 64 tile
    (1, 3, 40, 5, 6, 6, [4, 5, 6, 77], [0, 4, 2, 1]),         # ring of left_context + 1 rows
    (2, 2, 128, 70, 72, 5, [0, 71, 500], [4, 1, 2]),          # perception's shape
    (1, 2, 128, 70, 72, 4, [69, 70, 71], [3, 0, 2]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_f,heads,dh,left,rows,max_slots,frames,slots", edit_loop(CASES, 3))
def test_relpos_attention_matches_ref(dtype, n_f, heads, dh, left, rows, max_slots, frames, slots):
    q, k, v, pos, bu, bv = make(len(frames), n_f, heads, dh, rows, max_slots, dtype, seed=dh + rows)
    slot_dtype = torch.int32 if n_f == 1 else torch.int64
    slots = torch.tensor(slots, dtype=slot_dtype, device=DEV)
    frames = torch.tensor(frames, device=DEV)
    kw = dict(left_context=left, scale=dh ** -0.5)
    k0, v0 = k.clone(), v.clone()
    out = torch.full_like(q, float("nan"))
    o = relpos_attention(q, k, v, slots, frames, pos, bu, bv, out=out, **kw)
    assert o is out and o.dtype == dtype and torch.isfinite(o).all()
    assert torch.equal(k, k0) and torch.equal(v, v0), "attention must not write the rings"
    with exact_fp32():
        o_ref = relpos_attention_ref(q, k, v, slots, frames, pos, bu, bv, **kw)
    assert rel(o, o_ref) < TOL[dtype], rel(o, o_ref)


@pytest.mark.parametrize("n_f", [1, 2])
def test_relpos_attention_reads_q_out_of_fused_qkv(n_f):
    """q as the engine passes it: a view into [B, F, 3·H·dh] (row stride 3·H·dh), not copied."""
    q, k, v, pos, bu, bv = make(3, n_f, 3, 24, 7, 4, torch.float32, seed=6 + n_f)
    qkv = torch.randn(3, n_f, 3, 3, 24, device=DEV)
    qkv[:, :, 0] = q
    slots, frames = torch.tensor([2, 0, 3], device=DEV), torch.tensor([0, 4, 11], device=DEV)
    kw = dict(left_context=5, scale=24 ** -0.5)
    o = relpos_attention(qkv[:, :, 0], k, v, slots, frames, pos, bu, bv, **kw)
    assert o.is_contiguous()
    torch.testing.assert_close(o, relpos_attention(q, k, v, slots, frames, pos, bu, bv, **kw),
                               rtol=0, atol=0)


def test_first_frame_sees_only_itself():
    """Frame 0 of a session attends to its own row alone: o = V at row 0, whatever the scores."""
    q, k, v, pos, bu, bv = make(2, 1, 3, 24, 7, 4, torch.float32, seed=3)
    slots = torch.tensor([3, 1], device=DEV)
    o = relpos_attention(q, k, v, slots, torch.zeros(2, dtype=torch.long, device=DEV), pos, bu, bv,
                         left_context=5, scale=0.2)
    torch.testing.assert_close(o[:, 0], v[slots, :, 0], rtol=1e-6, atol=1e-6)


def test_relpos_attention_rejects_bad_args():
    q, k, v, pos, bu, bv = make(2, 2, 3, 24, 7, 4, torch.float32, seed=4)
    slots, frames = torch.tensor([0, 1], device=DEV), torch.tensor([0, 9], device=DEV)
    with pytest.raises(AssertionError, match="v_ring"):
        relpos_attention(q, k, v.to(torch.bfloat16), slots, frames, pos, bu, bv, left_context=5, scale=1.0)
    with pytest.raises(AssertionError, match="ring rows"):     # a 2-frame step would evict row 0's
        relpos_attention(q, k, v, slots, frames, pos, bu, bv, left_context=6, scale=1.0)
    with pytest.raises(AssertionError, match="stream_pos"):
        relpos_attention(q, k, v, slots, frames, pos[1:], bu, bv, left_context=5, scale=1.0)
    if DEV == "cpu":    # values are checked only where that costs no device sync
        with pytest.raises(AssertionError, match="frames"):
            relpos_attention(q, k, v, slots, torch.tensor([0, -1]), pos, bu, bv, left_context=5, scale=1.0)


def perception_model(seed: int, dtype=torch.float32) -> P.Perception:
    """Tiny perception whose pos_bias_u/v are nonzero (init_random leaves them 0), so the
    kernel's two bias terms are seen."""
    cfg = PW.PerceptionConfig.tiny()
    g = torch.Generator().manual_seed(seed)
    sd = PW.init_random(cfg, g)
    for name, t in sd.items():
        if "pos_bias" in name:
            sd[name] = 0.5 * torch.randn(t.shape, generator=g)
    model = P.Perception(cfg, device=DEV, dtype=dtype)
    model.load_named({k: t.to(DEV) for k, t in sd.items()})
    return model


class _RefOps(TritonDecodeOps):
    """The hooks run by the twins (relpos_attention_ref, add_layer_norm_ref; qkv is plain torch
    already): checks that they are the model's own math."""

    def perception_add_norm(self, x, y, alpha, norm, norm2=None):
        second = () if norm2 is None else (norm2.weight, norm2.bias, norm2.eps)
        return add_layer_norm_ref(x, y, alpha, norm.weight, norm.bias, norm.eps, *second)

    def perception_attention(self, attn, q, k_ring, v_ring, slots, frames):
        c = attn.cfg
        return relpos_attention_ref(q, k_ring, v_ring, slots, frames, attn.stream_pos,
                                    attn.pos_bias_u, attn.pos_bias_v,
                                    left_context=c.left_context, scale=c.head_dim ** -0.5)


def stream(model, ops, chunks, seed=5):
    """Steps of `chunks` frames each (1 or 2) for 2 sessions at slots [3, 0] of 4; slot 0 starts
    3 frames ahead, so the rows' rings wrap at different steps → (enc of every step, state)."""
    install_perception(model, ops)
    cfg, g = model.cfg, torch.Generator().manual_seed(seed)
    state = P.PerceptionState.alloc(cfg, 4, DEV, dtype=model.proj.weight.dtype)
    slots = torch.tensor([3, 0], device=DEV)
    window = lambda b, n: torch.randn(b, n, cfg.window_cols, cfg.mel_bins, generator=g).to(DEV)
    try:
        model.step_frames(state, window(1, 2), slots[1:])
        model.step(state, window(1, 1)[:, 0], slots[1:])
        encs = [model.step_frames(state, window(2, n), slots).enc for n in chunks]
    finally:
        install_perception(model, None)
    return torch.cat(encs, 1), state


CHUNKS = [2, 1, 2, 2, 2, 1, 2, 2]       # 14 frames: the tiny ring (7 rows) wraps twice


def test_ref_is_the_models_attention():
    model = perception_model(seed=1)
    with exact_fp32():
        enc, st = stream(model, None, CHUNKS)
        enc_twin, st_twin = stream(model, _RefOps(), CHUNKS)
        enc_again, _ = stream(model, None, CHUNKS)
    assert torch.equal(enc_again, enc), "uninstalled, the reference path is the one it was"
    assert rel(enc_twin, enc) < 1e-6, rel(enc_twin, enc)
    assert rel(st_twin.k, st.k) < 1e-6 and rel(st_twin.v, st.v) < 1e-6


# bf16: the reference rounds every product to bf16, the kernel none; 8e-3 after 2 layers
@pytest.mark.slow
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_perception_with_kernel_equals_reference_path(dtype, tol):
    model = perception_model(seed=2, dtype=dtype)
    ops = counting(TritonDecodeOps(), "perception_attention")
    with exact_fp32():
        enc, st = stream(model, None, CHUNKS)
        enc_fast, st_fast = stream(model, ops, CHUNKS)
    assert ops.calls == model.cfg.n_layers * (len(CHUNKS) + 2)
    assert rel(enc_fast, enc) < tol, rel(enc_fast, enc)
    assert rel(st_fast.k, st.k) < tol and rel(st_fast.v, st.v) < tol
    assert torch.equal(st_fast.frames, st.frames)
    assert (st_fast.k[:, [1, 2]] == 0).all(), "other slots untouched"
