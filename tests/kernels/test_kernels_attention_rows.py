"""decode_attention's rows form (q [B, R, HQ, D] over caches [S, R, HKV, P, D], one launch pair for
all R rows) against decode_attention_ref applied row by row: the MHA split and padded kernels, the
dot kernel (GQA and mha_dot), fp32 and bf16 KV, with and without a window, several split counts,
a layer view of the talker's 6-D state, int64 slots and lengths given as positions (length_bias);
the per-lane MHA kernel (lanes) at the talker's head_dim 72 against an fp64 twin; and rows past a
position (a reset slot's stale KV, NaN included) read by no kernel."""
import pytest
import torch

from gpu.kernels.decode_attention import decode_attention, decode_attention_ref
from tests.tensorkit import edit_loop, rel
from tests.kernels.test_kernels_attention import run_checked

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def make(q_dtype, kv_dtype, rows, hq, hkv, d, cap, *, state_view, max_slots=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(3, rows, hq, d, generator=g).to(q_dtype)
    if state_view:      # layer 2 of a [S, L, R, HKV, P, D] state: the talker's k_layer argument
        k = torch.randn(max_slots, 4, rows, hkv, cap, d, generator=g).to(kv_dtype)[:, 2]
        v = torch.randn(max_slots, 4, rows, hkv, cap, d, generator=g).to(kv_dtype)[:, 2]
    else:
        k = torch.randn(max_slots, rows, hkv, cap, d, generator=g).to(kv_dtype)
        v = torch.randn(max_slots, rows, hkv, cap, d, generator=g).to(kv_dtype)
    return q.to(DEV), k.to(DEV), v.to(DEV)


CASES = [  # (q dtype, kv dtype, R, HQ, HKV, D, cap, lengths, window, splits, state view, variant)
    (torch.float32, torch.float32, 2, 3, 3, 9, 45, [45, 7, 30], 0, 1, True, {}),        # talker-like
    (torch.float32, torch.float32, 2, 3, 3, 9, 45, [45, 7, 30], 10, 3, False, {}),      # + window
    (torch.float32, torch.bfloat16, 1, 2, 2, 18, 65, [64, 65, 3], 20, 2, True, {}),     # dense profile
    (torch.float32, torch.bfloat16, 2, 2, 2, 18, 65, [64, 65, 3], 0, 4, False, {}),
    (torch.float32, torch.float32, 2, 2, 2, 16, 40, [40, 9, 33], 5, 2, True, {}),       # pow2: padded
    (torch.float32, torch.float32, 2, 3, 3, 9, 45, [45, 7, 30], 0, 2, False, dict(split_d=False)),
    (torch.float32, torch.float32, 2, 3, 3, 9, 45, [45, 7, 30], 6, 1, True, dict(mha_dot=True)),
    (torch.bfloat16, torch.bfloat16, 2, 6, 2, 24, 50, [37, 1, 50], 0, 3, False, {}),    # GQA, bf16
    (torch.float32, torch.float32, 3, 6, 3, 12, 40, [40, 17, 2], 9, 2, True, {}),       # GQA fp32
]


@pytest.mark.parametrize("q_dtype,kv_dtype,rows,hq,hkv,d,cap,lengths,window,splits,state_view,variant",
                         edit_loop(CASES, 2))
def test_rows_form_matches_ref_per_row(q_dtype, kv_dtype, rows, hq, hkv, d, cap, lengths, window,
                                       splits, state_view, variant):
    q, k, v = make(q_dtype, kv_dtype, rows, hq, hkv, d, cap, state_view=state_view, seed=hq + cap)
    o, slots, lens = run_checked(q, k, v, lengths, scale=d ** -0.5, window=window,
                                 num_splits=splits, **variant)
    tol = 1e-2 if torch.bfloat16 in (q_dtype, kv_dtype) else 1e-5
    for r in range(rows):
        o_ref = decode_attention_ref(q[:, r], k[:, r], v[:, r], slots, lens, scale=d ** -0.5,
                                     window=window)
        assert rel(o[:, r], o_ref) < tol, (r, rel(o[:, r], o_ref))


@pytest.mark.parametrize("window", [7, pytest.param(0, marks=pytest.mark.slow)])
def test_rows_form_takes_positions_and_int64_indices(window):
    # The talker's call: int64 slots, its positions pos as lengths with length_bias 1.
    q, k, v = make(torch.float32, torch.float32, 2, 4, 4, 9, 30, state_view=True, seed=5)
    slots = torch.tensor([5, 1, 3], device=DEV)
    pos = torch.tensor([29, 0, 12], device=DEV)
    o = decode_attention(q, k, v, slots, pos, scale=0.25, window=window, length_bias=1)
    lens = (pos + 1).to(torch.int32)
    ref = decode_attention_ref(q, k, v, slots.to(torch.int32), lens, scale=0.25, window=window)
    assert rel(o, ref) < 1e-5
    three_d = decode_attention(q[:, 1].contiguous(), k[:, 1], v[:, 1], slots, pos, scale=0.25,
                               window=window, length_bias=1)
    assert torch.equal(three_d, o[:, 1]), "the rows form runs row r exactly as the plain form"


def test_rows_form_rejects_bad_args():
    q, k, v = make(torch.float32, torch.float32, 2, 4, 4, 9, 30, state_view=False)
    slots = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
    lens = torch.ones(3, dtype=torch.int32, device=DEV)
    with pytest.raises(AssertionError, match="k_cache"):        # rows differ
        decode_attention(q, k[:, :1], v[:, :1], slots, lens, scale=1.0)
    with pytest.raises(AssertionError, match="expected 3-D/4-D"):
        decode_attention(q, k[:, 0], v[:, 0], slots, lens, scale=1.0)
    if DEV == "cpu":
        with pytest.raises(AssertionError, match="bias"):
            decode_attention(q, k, v, slots, torch.tensor([30, 1, 1], device=DEV), scale=1.0,
                             length_bias=1)


LANES = [  # (kv dtype, R, H, cap, positions, window, splits, block_l, state view); q fp32, D 72
    (torch.bfloat16, 1, 4, 96, [95, 0, 70], 0, None, 64, True),      # dense profile, default splits
    (torch.float32, 2, 2, 100, [99, 40, 0], 25, 3, 32, False),        # reference profile + window
    (torch.bfloat16, 2, 2, 90, [4, 0, 2], 0, 8, 16, True),            # most splits empty
    (torch.bfloat16, 1, 3, 200, [199, 127, 63], 50, 2, 32, False),    # whole blocks only
    (torch.float32, 1, 2, 70, [69, 5, 33], 6, 4, 64, True),
]


@pytest.mark.parametrize("kv_dtype,rows,h,cap,positions,window,splits,block_l,state_view",
                         edit_loop(LANES, 2))
def test_rows_form_lanes_kernel_matches_fp64(kv_dtype, rows, h, cap, positions, window, splits,
                                             block_l, state_view):
    # The talker's call (int64 slots, positions with length_bias 1, scale 1/16) through lanes.
    q, k, v = make(torch.float32, kv_dtype, rows, h, h, 72, cap, state_view=state_view,
                   seed=cap + rows)
    slots = torch.tensor([5, 1, 3], device=DEV)
    pos = torch.tensor(positions, device=DEV)
    o = decode_attention(q, k, v, slots, pos, scale=1 / 16, window=window, length_bias=1,
                         num_splits=splits, block_l=block_l, lanes=True)
    ref = decode_attention_ref(q.double(), k.double(), v.double(), slots, pos, scale=1 / 16,
                               window=window, length_bias=1)
    assert rel(o, ref) < 1e-5, rel(o, ref)


# (kv dtype, R, HQ, HKV, D, cap, positions, window, variant): the kernels a talker or thinker
# call takes (lanes: the talker's default), q fp32, int64 slots, positions with length_bias 1
PAST = [
    (torch.bfloat16, 1, 4, 4, 72, 96, [95, 0, 70], 0, dict(lanes=True)),            # dense talker
    (torch.float32, 2, 2, 2, 72, 100, [99, 40, 0], 25, dict(lanes=True, num_splits=3)),
    (torch.float32, 2, 3, 3, 9, 45, [44, 6, 29], 0, dict(num_splits=2)),             # MHA split
    (torch.bfloat16, 1, 6, 2, 24, 50, [36, 0, 49], 7, dict(num_splits=3)),           # GQA dot
]


@pytest.mark.parametrize("kv_dtype,rows,hq,hkv,d,cap,positions,window,variant",
                         edit_loop(PAST, 1))
def test_rows_past_each_position_are_never_read(kv_dtype, rows, hq, hkv, d, cap, positions,
                                                window, variant):
    """A slot reset leaves the talker's KV rows as its last session wrote them; each kernel
    must give the same output with NaN in every row past each position. Bug caught: a kernel
    that loads a block's rows past the length unmasked and multiplies them by 0."""
    q, k, v = make(torch.float32, kv_dtype, rows, hq, hkv, d, cap, state_view=True, seed=cap)
    slots = torch.tensor([5, 1, 3], device=DEV)
    pos = torch.tensor(positions, device=DEV)

    def attend():
        return decode_attention(q, k, v, slots, pos, scale=d ** -0.5, window=window,
                                length_bias=1, **variant)
    want = attend()
    for s, p in zip(slots.tolist(), positions):
        k[s, :, :, p + 1:] = float("nan")
        v[s, :, :, p + 1:] = float("nan")
    assert torch.equal(attend(), want)
