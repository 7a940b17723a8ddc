"""decode_attention's partial kernels for one query head per kv head (GROUP == 1: the talker),
and the row addressing (`_span`, `row_bases`) that the GQA kernel shares. Three forms: head_dim
as one padded tile (`attn_mha_kernel`), as a power of two + the rest (`attn_mha_split_kernel`:
72 = 64 + 8, no idle lanes), and the same with one online softmax per L lane
(`attn_mha_lanes_kernel`, the default at the model's shapes). Each writes the split partials
(max, sum, unnormalised acc) that decode_attention's combine kernel merges; scores are in the
log2 domain (qk_scale carries log2 e).
"""
import triton
import triton.language as tl

from gpu.kernels.e4m3 import e4m3_decode


@triton.jit
def kv_load(ptr, mask):
    # K or V rows as fp32: an fp8 cache (uint8) holds e4m3 bits, decoded here; its per-head
    # scale is applied once per program (`kv_scale_of`), not per element
    raw = tl.load(ptr, mask=mask, other=0)
    if ptr.dtype.element_ty == tl.uint8:
        return e4m3_decode(raw)
    return raw.to(tl.float32)


@triton.jit
def kv_scale_of(CACHE, SCALE, kh):
    # kv head kh's scale of an fp8 cache (1 for others): keys' folds into q, values' into acc
    if CACHE.dtype.element_ty == tl.uint8:
        return tl.load(SCALE + kh)
    return 1.0


@triton.jit
def _span(SLOTS, LENS, b, sp, window, max_slots, length_bias, N_SPLITS: tl.constexpr,
          BLOCK_L: tl.constexpr):
    # This split's slice [lo, hi) of the row's attended range [start, length); BLOCK_L-aligned chunks.
    slot = tl.load(SLOTS + b)
    tl.device_assert((slot >= 0) & (slot < max_slots), "decode_attention: slot out of range")
    length = tl.load(LENS + b).to(tl.int32) + length_bias
    start = tl.where(window > 0, tl.maximum(length - window, 0), 0)
    chunk = tl.cdiv(tl.cdiv(length - start, N_SPLITS), BLOCK_L) * BLOCK_L
    lo = start + sp * chunk
    hi = tl.minimum(lo + chunk, length)
    return slot.to(tl.int64), lo, hi


@triton.jit
def row_bases(Q, K, V, SLOTS, LENS, kh, sp, window, max_slots, length_bias,
               sq_b, sq_r, sk_s, sk_r, sk_h, sv_s, sv_r, sv_h,
               ROWS: tl.constexpr, N_SPLITS: tl.constexpr, BLOCK_L: tl.constexpr):
    # Program dim 0 is b·ROWS + r: q row (b, r), and kv head kh of cache row r of slot slots[b].
    row = tl.program_id(0)
    b = row // ROWS
    r = row % ROWS
    slot, lo, hi = _span(SLOTS, LENS, b, sp, window, max_slots, length_bias, N_SPLITS, BLOCK_L)
    qp = Q + b * sq_b + r * sq_r
    kp = K + slot * sk_s + r * sk_r + kh * sk_h
    vp = V + slot * sv_s + r * sv_r + kh * sv_h
    return row, qp, kp, vp, lo, hi


@triton.jit
def attn_mha_kernel(Q, K, V, KS, VS, SLOTS, LENS, MP, LP, OP, window, qk_scale, max_slots, length_bias,
                     sq_b, sq_r, sq_h, sk_s, sk_r, sk_h, sv_s, sv_r, sv_h,
                     SK_L: tl.constexpr, SV_L: tl.constexpr, ROWS: tl.constexpr, HQ: tl.constexpr,
                     HEAD_DIM: tl.constexpr, N_SPLITS: tl.constexpr,
                     BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):
    # One query head per kv head: scores by fp32 multiply-add (exact fp32 for the fp32 talker KV).
    h = tl.program_id(1)
    sp = tl.program_id(2)
    row, qp, kp, vp, lo, hi = row_bases(Q, K, V, SLOTS, LENS, h, sp, window, max_slots,
                                         length_bias, sq_b, sq_r, sk_s, sk_r, sk_h, sv_s, sv_r,
                                         sv_h, ROWS, N_SPLITS, BLOCK_L)
    d = tl.arange(0, BLOCK_D)
    md = d < HEAD_DIM
    q = tl.load(qp + h * sq_h + d, mask=md, other=0.0).to(tl.float32) * qk_scale
    q = q * kv_scale_of(K, KS, h)
    m_i = tl.max(tl.full([BLOCK_L], -1e30, tl.float32), axis=0)
    l_i = tl.sum(tl.zeros([BLOCK_L], tl.float32), axis=0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for l0 in range(lo, hi, BLOCK_L):
        pos = l0 + tl.arange(0, BLOCK_L)
        ml = pos < hi
        kv_mask = ml[:, None] & md[None, :]
        k = kv_load(kp + pos[:, None] * SK_L + d[None, :], kv_mask)
        v = kv_load(vp + pos[:, None] * SV_L + d[None, :], kv_mask)
        s = tl.where(ml, tl.sum(k * q[None, :], axis=1), float("-inf"))     # log2 domain
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    part = (row * HQ + h) * N_SPLITS + sp
    tl.store(MP + part, m_i)
    tl.store(LP + part, l_i)
    tl.store(OP + part * BLOCK_D + d, acc * kv_scale_of(V, VS, h))


@triton.jit
def _split_q(qp, h, sq_h, qk_scale, HEAD_DIM: tl.constexpr, D_A: tl.constexpr, D_B: tl.constexpr):
    # head_dim as two tiles, D_A (a power of two) + D_B (the rest, padded; mask mdb).
    da = tl.arange(0, D_A)
    db = D_A + tl.arange(0, D_B)
    mdb = db < HEAD_DIM
    qrow = qp + h * sq_h
    qa = tl.load(qrow + da).to(tl.float32) * qk_scale
    qb = tl.load(qrow + db, mask=mdb, other=0.0).to(tl.float32) * qk_scale
    return da, db, mdb, qa, qb


@triton.jit
def _split_tile(kp, vp, l0, hi, da, db, mdb, qa, qb, SK_L: tl.constexpr, SV_L: tl.constexpr,
                BLOCK_L: tl.constexpr):
    # Positions l0 .. l0+BLOCK_L-1: their scores (log2 domain, -inf past hi) and V rows, fp32.
    pos = l0 + tl.arange(0, BLOCK_L)
    ml = pos < hi
    mb = ml[:, None] & mdb[None, :]
    k_a = kv_load(kp + pos[:, None] * SK_L + da[None, :], ml[:, None])
    k_b = kv_load(kp + pos[:, None] * SK_L + db[None, :], mb)
    v_a = kv_load(vp + pos[:, None] * SV_L + da[None, :], ml[:, None])
    v_b = kv_load(vp + pos[:, None] * SV_L + db[None, :], mb)
    s = tl.sum(k_a * qa[None, :], axis=1) + tl.sum(k_b * qb[None, :], axis=1)
    return tl.where(ml, s, float("-inf")), v_a, v_b


@triton.jit
def _store_split_partial(MP, LP, OP, part, m_i, l_i, acc_a, acc_b, da, db, mdb,
                         BLOCK_D: tl.constexpr):
    tl.store(MP + part, m_i)
    tl.store(LP + part, l_i)
    tl.store(OP + part * BLOCK_D + da, acc_a)
    tl.store(OP + part * BLOCK_D + db, acc_b, mask=mdb)


@triton.jit
def attn_mha_split_kernel(Q, K, V, KS, VS, SLOTS, LENS, MP, LP, OP, window, qk_scale, max_slots,
                           length_bias, sq_b, sq_r, sq_h, sk_s, sk_r, sk_h, sv_s, sv_r, sv_h,
                           SK_L: tl.constexpr, SV_L: tl.constexpr, ROWS: tl.constexpr,
                           HQ: tl.constexpr, HEAD_DIM: tl.constexpr, N_SPLITS: tl.constexpr,
                           BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, D_A: tl.constexpr,
                           D_B: tl.constexpr):
    # attn_mha_kernel with head_dim as two tiles, D_A (a power of two) + D_B (the rest, padded):
    # 72 = 64 + 8 uses every lane, where one padded 128 tile leaves 44% of them idle.
    h = tl.program_id(1)
    sp = tl.program_id(2)
    row, qp, kp, vp, lo, hi = row_bases(Q, K, V, SLOTS, LENS, h, sp, window, max_slots,
                                         length_bias, sq_b, sq_r, sk_s, sk_r, sk_h, sv_s, sv_r,
                                         sv_h, ROWS, N_SPLITS, BLOCK_L)
    da, db, mdb, qa, qb = _split_q(qp, h, sq_h, qk_scale * kv_scale_of(K, KS, h), HEAD_DIM,
                                   D_A, D_B)
    m_i = tl.max(tl.full([BLOCK_L], -1e30, tl.float32), axis=0)
    l_i = tl.sum(tl.zeros([BLOCK_L], tl.float32), axis=0)
    acc_a = tl.zeros([D_A], tl.float32)
    acc_b = tl.zeros([D_B], tl.float32)
    for l0 in range(lo, hi, BLOCK_L):
        s, v_a, v_b = _split_tile(kp, vp, l0, hi, da, db, mdb, qa, qb, SK_L, SV_L, BLOCK_L)
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc_a = acc_a * alpha + tl.sum(p[:, None] * v_a, axis=0)
        acc_b = acc_b * alpha + tl.sum(p[:, None] * v_b, axis=0)
        m_i = m_new
    vs = kv_scale_of(V, VS, h)
    _store_split_partial(MP, LP, OP, (row * HQ + h) * N_SPLITS + sp, m_i, l_i, acc_a * vs,
                         acc_b * vs, da, db, mdb, BLOCK_D)


@triton.jit
def attn_mha_lanes_kernel(Q, K, V, KS, VS, SLOTS, LENS, MP, LP, OP, window, qk_scale, max_slots,
                           length_bias, sq_b, sq_r, sq_h, sk_s, sk_r, sk_h, sv_s, sv_r, sv_h,
                           SK_L: tl.constexpr, SV_L: tl.constexpr, ROWS: tl.constexpr,
                           HQ: tl.constexpr, HEAD_DIM: tl.constexpr, N_SPLITS: tl.constexpr,
                           BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, D_A: tl.constexpr,
                           D_B: tl.constexpr):
    # attn_mha_split_kernel with one online softmax per L lane: the loop reduces only over D
    # (mostly in-thread); the cross-warp reductions over L (max, sum, p·V), whose fixed cost per
    # iteration bounds the split kernel once 16-bit KV halves the bytes per iteration, run once
    # after the loop. Costs BLOCK_L x (D_A + D_B) fp32 accumulators in registers.
    h = tl.program_id(1)
    sp = tl.program_id(2)
    row, qp, kp, vp, lo, hi = row_bases(Q, K, V, SLOTS, LENS, h, sp, window, max_slots,
                                         length_bias, sq_b, sq_r, sk_s, sk_r, sk_h, sv_s, sv_r,
                                         sv_h, ROWS, N_SPLITS, BLOCK_L)
    da, db, mdb, qa, qb = _split_q(qp, h, sq_h, qk_scale * kv_scale_of(K, KS, h), HEAD_DIM,
                                   D_A, D_B)
    # A lane that sees no position keeps m = -1e30, l = 0, acc = 0: a masked s = -inf gives
    # alpha = 2^0 = 1 and p = 2^-inf = 0, never inf - inf.
    m_vec = tl.full([BLOCK_L], -1e30, tl.float32)
    l_vec = tl.zeros([BLOCK_L], tl.float32)
    acc_a = tl.zeros([BLOCK_L, D_A], tl.float32)
    acc_b = tl.zeros([BLOCK_L, D_B], tl.float32)
    for l0 in range(lo, hi, BLOCK_L):
        s, v_a, v_b = _split_tile(kp, vp, l0, hi, da, db, mdb, qa, qb, SK_L, SV_L, BLOCK_L)
        m_new = tl.maximum(m_vec, s)
        alpha = tl.exp2(m_vec - m_new)
        p = tl.exp2(s - m_new)
        l_vec = l_vec * alpha + p
        acc_a = acc_a * alpha[:, None] + p[:, None] * v_a
        acc_b = acc_b * alpha[:, None] + p[:, None] * v_b
        m_vec = m_new
    # Merge the lanes: an empty lane weighs 2^(-1e30 - M) = 0 beside a live one; an empty split
    # (all lanes empty) gives m -1e30, l 0, acc 0, as the split kernel does.
    m_i = tl.max(m_vec, axis=0)
    w = tl.exp2(m_vec - m_i)
    vs = kv_scale_of(V, VS, h)
    _store_split_partial(MP, LP, OP, (row * HQ + h) * N_SPLITS + sp, m_i,
                         tl.sum(w * l_vec, axis=0), tl.sum(w[:, None] * acc_a, axis=0) * vs,
                         tl.sum(w[:, None] * acc_b, axis=0) * vs, da, db, mdb, BLOCK_D)
