"""Fused Mamba2 decode step for one layer over slot-indexed state (docs/MODEL.md §2.4 step 3).

For each batch row b with state row s = slots[b]:
    xBC   = SiLU(conv1d_k4([conv_state[s]; xBC_raw[b]]) + conv_b);  conv_state[s] <- last 3 columns
    x, B, C = split(xBC, [d_inner, G*N, G*N]);  Δ = softplus(dt + dt_bias);  A = -exp(A_log)
    S_h  <- exp(Δ_h A_h) S_h + Δ_h x_h B_gᵀ        (S_h [P, N] fp32, g = h // (H/G))
    y_h   = S_h C_g + D_h x_h
    y     = groupRMSNorm(y * silu(z)) * norm_w      (G groups of d_inner/G, eps)
Three launches: conv (+ conv_state update; `mamba_conv`), SSM (+ ssm_state update, gating), group norm.
They are split because every SSM program needs its group's B/C columns: a conv fused into the SSM
launch would race on conv_state between the programs that read and the one that writes it.
Bytes per row at full shapes: ssm_state 5.24 MB read + 5.24 MB written (the whole cost), conv_state
74 KB, activations ~0.2 MB. The SSM launch reads and writes each state element exactly once.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from gpu.kernels._check import FLOATS, check, check_slots, next_pow2
from gpu.kernels.rms_norm import _round_bf16
from gpu.model.formats import store_ssm

CONV_K = 4  # conv kernel width; conv_state keeps CONV_K - 1 = 3 columns


@triton.jit
def _mix32(x):
    # gpu/model/formats.py's mix32 on uint32 (wrapping multiplies)
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _round_bf16_sr(y, key, elem):
    # gpu/model/formats.py's round_bf16_stochastic: 16 hashed bits added below bf16's last
    # bit, then truncated (in magnitude: the sign bit is untouched); NaN kept
    r = _mix32(elem.to(tl.uint32) + key) & 0xFFFF
    b = (y.to(tl.uint32, bitcast=True) + r) & 0xFFFF0000
    return tl.where(y != y, y, b.to(tl.float32, bitcast=True))


@triton.jit
def _softplus(v):
    # torch.nn.functional.softplus (threshold 20) with an accurate log1p (no libdevice: the
    # interpreter lacks it). log1p(u) = log(1+u) * u / ((1+u) - 1) is exact to a few ulp.
    u = tl.exp(-tl.abs(v))
    onep = 1.0 + u
    den = tl.where(onep == 1.0, 1.0, onep - 1.0)
    log1p_u = tl.where(onep == 1.0, u, tl.log(onep) * (u / den))
    return tl.where(v > 20.0, v, tl.maximum(v, 0.0) + log1p_u)


@triton.jit
def _conv_kernel(XBC, CONV_STATE, SLOTS, W, BIAS, XACT, conv_dim, max_slots,
                 BLOCK_C: tl.constexpr):
    # grid (B, cdiv(conv_dim, BLOCK_C)); each channel is owned by one program: no race between
    # programs on the state. The program's state [BLOCK_C, 3] is one contiguous run, read as one
    # [BLOCK_C, 4] tile (column 3 masked) and written back as one tile shifted one element left:
    # window (s0, s1, s2, x) stored at columns -1..2 of each channel, column -1 masked. The
    # weights are one [BLOCK_C, 4] tile (16-byte rows), the 4-tap dot a sum over axis 1.
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    j = tl.arange(0, 4)[None, :]
    m = c < conv_dim
    m2 = m[:, None]
    slot = tl.load(SLOTS + b)
    tl.device_assert((slot >= 0) & (slot < max_slots), "mamba_step: slot out of range")
    st = CONV_STATE + slot.to(tl.int64) * conv_dim * 3 + c[:, None] * 3 + j      # [BLOCK_C, 4]
    s = tl.load(st, mask=m2 & (j < 3), other=0.0)                                 # (s0, s1, s2, 0)
    x_raw = tl.load(XBC + b * conv_dim + c, mask=m, other=0.0)
    last = j == 3
    win = tl.where(last, x_raw.to(tl.float32)[:, None], s.to(tl.float32))
    w = tl.load(W + c[:, None] * 4 + j, mask=m2, other=0.0).to(tl.float32)
    acc = tl.sum(w * win, axis=1) + tl.load(BIAS + c, mask=m, other=0.0).to(tl.float32)
    tl.store(XACT + b * conv_dim + c, acc * tl.sigmoid(acc), mask=m)
    new = tl.where(last, x_raw.to(CONV_STATE.dtype.element_ty)[:, None], s)       # raw bits kept
    # The element a thread stores was loaded by its neighbour (column j+1 -> j): every load of
    # the program before any store.
    tl.debug_barrier()
    tl.store(st - 1, new, mask=m2 & (j >= 1))


@triton.jit
def _conv_kernel_cols(XBC, CONV_STATE, SLOTS, W, BIAS, XACT, conv_dim, max_slots,
                      BLOCK_C: tl.constexpr):
    # The column kernel (A/B baseline, `conv_tiles=False`): three strided scalar state loads and
    # stores, four strided weight loads; each thread owns whole channels.
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    m = c < conv_dim
    slot = tl.load(SLOTS + b)
    tl.device_assert((slot >= 0) & (slot < max_slots), "mamba_step: slot out of range")
    st = CONV_STATE + slot.to(tl.int64) * conv_dim * 3 + c * 3
    x_raw = tl.load(XBC + b * conv_dim + c, mask=m, other=0.0)
    s0 = tl.load(st + 0, mask=m, other=0.0)
    s1 = tl.load(st + 1, mask=m, other=0.0)
    s2 = tl.load(st + 2, mask=m, other=0.0)
    acc = tl.load(BIAS + c, mask=m, other=0.0).to(tl.float32)
    acc += tl.load(W + c * 4 + 0, mask=m, other=0.0).to(tl.float32) * s0.to(tl.float32)
    acc += tl.load(W + c * 4 + 1, mask=m, other=0.0).to(tl.float32) * s1.to(tl.float32)
    acc += tl.load(W + c * 4 + 2, mask=m, other=0.0).to(tl.float32) * s2.to(tl.float32)
    acc += tl.load(W + c * 4 + 3, mask=m, other=0.0).to(tl.float32) * x_raw.to(tl.float32)
    tl.store(XACT + b * conv_dim + c, acc * tl.sigmoid(acc), mask=m)
    tl.store(st + 0, s1, mask=m)
    tl.store(st + 1, s2, mask=m)
    tl.store(st + 2, x_raw.to(CONV_STATE.dtype.element_ty), mask=m)


@triton.jit
def _ssm_kernel(XACT, Z, DT, SSM, SLOTS, DT_BIAS, A_LOG, DSKIP, YG, LENGTH, layer,
                max_slots, conv_dim, d_inner, c_off,
                nheads: tl.constexpr, head_dim: tl.constexpr, d_state: tl.constexpr,
                heads_per_group: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                STREAM: tl.constexpr, TILES: tl.constexpr, STOCHASTIC: tl.constexpr):
    # grid (B, nheads, cdiv(head_dim, BLOCK_P·TILES)); TILES [BLOCK_P, d_state] fp32 state tiles
    # each, every element read once and written once (the 283 MB/session-frame that bounds the
    # beat), the next tile's load issued before this one's store. The model dims are constexpr so
    # the compiler can prove 16-byte alignment and emit vector loads/stores.
    b = tl.program_id(0)
    h = tl.program_id(1)
    p0 = tl.program_id(2) * BLOCK_P * TILES
    n = tl.arange(0, BLOCK_N)
    mn = n < d_state
    slot = tl.load(SLOTS + b)
    tl.device_assert((slot >= 0) & (slot < max_slots), "mamba_step: slot out of range")
    g = h // heads_per_group
    head = SSM + slot.to(tl.int64) * nheads * head_dim * d_state + h * head_dim * d_state
    p = p0 + tl.arange(0, BLOCK_P)
    m2 = (p < head_dim)[:, None] & mn[None, :]
    if STREAM:   # the state is touched once per step: keep it from evicting reused lines in L2
        s_next = tl.load(head + p[:, None] * d_state + n[None, :], mask=m2, other=0.0,
                         eviction_policy="evict_first")
    else:
        s_next = tl.load(head + p[:, None] * d_state + n[None, :], mask=m2, other=0.0)
    row = XACT + b * conv_dim
    bv = tl.load(row + d_inner + g * d_state + n, mask=mn, other=0.0)
    cv = tl.load(row + c_off + g * d_state + n, mask=mn, other=0.0)
    delta = _softplus(tl.load(DT + b * nheads + h).to(tl.float32)
                      + tl.load(DT_BIAS + h).to(tl.float32))
    d_a = tl.exp(delta * -tl.exp(tl.load(A_LOG + h).to(tl.float32)))
    d_skip = tl.load(DSKIP + h).to(tl.float32)
    if STOCHASTIC:      # the row's bits: its position before the step and the layer
        pos = (tl.load(LENGTH + slot) & 0xFFFFFFFF).to(tl.uint32)
        key = _mix32(pos * 0x9E3779B1 + tl.cast(layer, tl.uint32))   # layer == 1 comes as an int
    for t in tl.static_range(TILES):
        p = p0 + t * BLOCK_P + tl.arange(0, BLOCK_P)
        mp = p < head_dim
        m2 = mp[:, None] & mn[None, :]
        st = head + p[:, None] * d_state + n[None, :]
        s = s_next
        if t + 1 < TILES:
            pn = p + BLOCK_P
            mn2 = (pn < head_dim)[:, None] & mn[None, :]
            if STREAM:
                s_next = tl.load(st + BLOCK_P * d_state, mask=mn2, other=0.0,
                                 eviction_policy="evict_first")
            else:
                s_next = tl.load(st + BLOCK_P * d_state, mask=mn2, other=0.0)
        x = tl.load(row + h * head_dim + p, mask=mp, other=0.0)
        # fp32 arithmetic whatever the state is stored in; rounded once on the way back, and
        # y reads the unrounded state (as the reference does)
        s = s.to(tl.float32) * d_a + (delta * x)[:, None] * bv[None, :]
        if STOCHASTIC:
            kept = _round_bf16_sr(s, key, (h * head_dim + p)[:, None] * d_state + n[None, :])
        elif SSM.dtype.element_ty == tl.bfloat16:
            # to nearest in integer bits, as torch rounds (the interpreter's cast truncates)
            kept = _round_bf16(s)
        else:
            kept = s
        if STREAM:
            tl.store(st, kept, mask=m2, cache_modifier=".cs")
        else:
            tl.store(st, kept, mask=m2)
        y = tl.sum(s * cv[None, :], axis=1) + d_skip * x
        zz = tl.load(Z + b * d_inner + h * head_dim + p, mask=mp, other=0.0).to(tl.float32)
        tl.store(YG + b * d_inner + h * head_dim + p, y * zz * tl.sigmoid(zz), mask=mp)


@triton.jit
def _gnorm_kernel(YG, NORM_W, OUT, d_inner, group_size, eps, BLOCK: tl.constexpr):
    # grid (B, ngroups): y * rsqrt(mean(y^2) + eps) * w over one group of group_size columns.
    b = tl.program_id(0)
    g = tl.program_id(1)
    i = tl.arange(0, BLOCK)
    m = i < group_size
    off = b * d_inner + g * group_size + i
    y = tl.load(YG + off, mask=m, other=0.0)
    r = 1.0 / tl.sqrt(tl.sum(y * y, axis=0) / group_size + eps)
    w = tl.load(NORM_W + g * group_size + i, mask=m, other=0.0).to(tl.float32)
    tl.store(OUT + off, (y * r * w).to(OUT.dtype.element_ty), mask=m)


def _dims(xBC, z, dt, ngroups):
    batch, conv_dim = xBC.shape
    nheads, d_inner = dt.shape[1], z.shape[1]
    assert nheads % ngroups == 0 and d_inner % nheads == 0, (nheads, ngroups, d_inner)
    assert (conv_dim - d_inner) % (2 * ngroups) == 0, (conv_dim, d_inner, ngroups)
    return batch, conv_dim, nheads, d_inner, d_inner // nheads, (conv_dim - d_inner) // (2 * ngroups)


def mamba_conv(xBC, conv_state, slots, conv_w, conv_b, *, out=None, tiles: bool = True,
               block_c: int | None = None, num_warps: int = 4):
    """The conv launch alone: out [B, conv_dim] fp32 = SiLU(conv1d_k4([conv_state[s]; xBC]) + conv_b),
    conv_state[slots] <- last 3 columns. Arguments unchecked (mamba_step checks them). `tiles`:
    state and weights as [block_c, 4] tiles (default block_c 512); False: the column kernel, three
    column loads/stores (default block_c 1024), kept as the A/B baseline (docs/FINDINGS.md).
    The state update is the same bits either way; out differs by the 4-tap sum's order (~1 ulp)."""
    batch, conv_dim = xBC.shape
    if out is None:
        out = torch.empty(batch, conv_dim, device=xBC.device, dtype=torch.float32)
    kernel = _conv_kernel if tiles else _conv_kernel_cols
    block_c = min(block_c or (512 if tiles else 1024), next_pow2(conv_dim))
    assert block_c == next_pow2(block_c), block_c
    kernel[(batch, triton.cdiv(conv_dim, block_c))](
        xBC, conv_state, slots, conv_w, conv_b, out, conv_dim, conv_state.shape[0], BLOCK_C=block_c,
        num_warps=num_warps)
    return out


def mamba_step(xBC, z, dt, conv_state, ssm_state, slots, conv_w, conv_b, dt_bias, A_log, D, norm_w,
               *, ngroups: int, eps: float = 1e-5, out=None, block_p: int = 16, num_warps: int = 4,
               stream: bool = False, tiles: int | None = None, conv_tiles: bool = True,
               round_key: tuple | None = None):
    """One Mamba2 decode step. Mutates conv_state[slots] and ssm_state[slots] in place only.
    An SSM program updates `tiles` [block_p, d_state] state tiles of one head (None: the whole
    head, slightly faster at the thinker's shapes than one tile a program:
    bench/results/mamba-tiles-h200.json). `conv_tiles=False` runs the conv launch's column
    kernel (see `mamba_conv`).

    xBC [B, conv_dim], z [B, d_inner], dt [B, nheads]: in_proj outputs (bf16/fp16/fp32).
    conv_state [S, conv_dim, 3] (any float), ssm_state [S, nheads, head_dim, d_state] fp32 or
    bf16 (stored so; the step computes in fp32 and rounds the new state to nearest).
    conv_w [conv_dim, 4], conv_b [conv_dim], dt_bias/A_log/D [nheads], norm_w [d_inner].
    slots int32[B] distinct. Returns y [B, d_inner] in z's dtype (written into `out` if given).
    `round_key` (length int64[S], layer): a bf16 state is rounded stochastically, by the bits
    `gpu/model/formats.py` draws for the row's position length[slot] before the step (None:
    to nearest).
    """
    batch, conv_dim, nheads, d_inner, head_dim, d_state = _dims(xBC, z, dt, ngroups)
    dev, max_slots = xBC.device, conv_state.shape[0]
    stochastic = round_key is not None
    if stochastic:
        length, layer = round_key
        if ssm_state.dtype != torch.bfloat16:
            raise ValueError("mamba_step: stochastic rounding is for a bf16 ssm_state")
        check("length", length, (max_slots,), (torch.int64,), device=dev)
        if not 0 <= int(layer) < 2 ** 31:
            raise ValueError(f"mamba_step: layer {layer} out of range")
    else:
        length, layer = slots, 0                  # not read
    check("xBC", xBC, (batch, conv_dim), FLOATS, device=dev)
    check("z", z, (batch, d_inner), FLOATS, device=dev)
    check("dt", dt, (batch, nheads), FLOATS, device=dev)
    check("conv_state", conv_state, (max_slots, conv_dim, CONV_K - 1), FLOATS, device=dev)
    check("ssm_state", ssm_state, (max_slots, nheads, head_dim, d_state),
          (torch.float32, torch.bfloat16), device=dev)
    check_slots(slots, batch, max_slots, dev)
    check("conv_w", conv_w, (conv_dim, CONV_K), FLOATS, device=dev)
    check("conv_b", conv_b, (conv_dim,), FLOATS, device=dev)
    for name, t in (("dt_bias", dt_bias), ("A_log", A_log), ("D", D)):
        check(name, t, (nheads,), FLOATS, device=dev)
    check("norm_w", norm_w, (d_inner,), FLOATS, device=dev)
    if out is None:
        out = torch.empty_like(z)
    check("out", out, (batch, d_inner), z.dtype, device=dev)
    assert block_p == next_pow2(block_p), block_p

    xact = mamba_conv(xBC, conv_state, slots, conv_w, conv_b, tiles=conv_tiles)   # SiLU(conv), fp32
    yg = torch.empty(batch, d_inner, device=dev, dtype=torch.float32)      # y * silu(z), pre-norm
    bp = min(block_p, next_pow2(head_dim))
    per_head = triton.cdiv(head_dim, bp)
    tiles = per_head if tiles is None else max(1, min(tiles, per_head))
    _ssm_kernel[(batch, nheads, triton.cdiv(head_dim, bp * tiles))](
        xact, z, dt, ssm_state, slots, dt_bias, A_log, D, yg, length, int(layer),
        max_slots, conv_dim, d_inner, d_inner + ngroups * d_state,
        nheads=nheads, head_dim=head_dim, d_state=d_state, heads_per_group=nheads // ngroups, BLOCK_P=bp, BLOCK_N=next_pow2(d_state),
        STREAM=stream, TILES=tiles, STOCHASTIC=stochastic, num_warps=num_warps)
    group = d_inner // ngroups
    _gnorm_kernel[(batch, ngroups)](yg, norm_w, out, d_inner, group, eps,
                                    BLOCK=next_pow2(group), num_warps=4)
    return out


def mamba_step_ref(xBC, z, dt, conv_state, ssm_state, slots, conv_w, conv_b, dt_bias, A_log, D, norm_w,
                   *, ngroups: int, eps: float = 1e-5, out=None, block_p: int = 16, num_warps: int = 4,
                   stream: bool = False, tiles: int | None = None, conv_tiles: bool = True,
                   round_key: tuple | None = None):
    """PyTorch twin of mamba_step (same signature; block_p/num_warps/stream/tiles/conv_tiles
    ignored). Computes in
    fp32, or in fp64 when given fp64 tensors (the device check's upcast reference)."""
    batch, conv_dim, nheads, d_inner, head_dim, d_state = _dims(xBC, z, dt, ngroups)
    f = torch.promote_types(xBC.dtype, torch.float32)
    idx = slots.long()
    window = torch.cat([conv_state[idx].to(f), xBC.to(f)[:, :, None]], dim=-1)   # [B, conv_dim, 4]
    conv_state[idx] = window[:, :, 1:].to(conv_state.dtype)
    xbc = F.silu((window * conv_w.to(f)).sum(-1) + conv_b.to(f))
    x, bm, cm = torch.split(xbc, [d_inner, ngroups * d_state, ngroups * d_state], dim=-1)
    x = x.reshape(batch, nheads, head_dim)
    rep = nheads // ngroups
    bm = bm.reshape(batch, ngroups, d_state).repeat_interleave(rep, dim=1)        # [B, H, N]
    cm = cm.reshape(batch, ngroups, d_state).repeat_interleave(rep, dim=1)
    delta = F.softplus(dt.to(f) + dt_bias.to(f))                                 # [B, H]
    d_a = torch.exp(delta * -torch.exp(A_log.to(f)))
    s = ssm_state[idx].to(f)                                                      # [B, H, P, N]
    s = s * d_a[:, :, None, None] + (delta[:, :, None] * x)[..., None] * bm[:, :, None, :]
    if round_key is None:
        ssm_state[idx] = s.to(ssm_state.dtype)
    else:                       # the thinker's chunk path stores its state the same way
        length, layer = round_key
        ssm_state[idx] = store_ssm(s, ssm_state.dtype, "stochastic", length[idx], int(layer))
    y = (s * cm[:, :, None, :]).sum(-1) + D.to(f)[:, None] * x                   # [B, H, P]
    y = (y.reshape(batch, d_inner) * F.silu(z.to(f))).reshape(batch, ngroups, -1)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    y = (y.reshape(batch, d_inner) * norm_w.to(f)).to(z.dtype)
    if out is None:
        return y
    out.copy_(y)
    return out
