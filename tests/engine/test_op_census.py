"""bench/op_census.py counts the engine path's launches per frame without a GPU: the structural
counts it reports (one attention launch pair per layer and CFG row, one fused norm per RMSNorm,
one perception attention launch per layer, one launch per perception residual add and its
LayerNorm) follow from the config, and no stage runs an unfused RMSNorm."""
import pytest

from bench.op_census import census
from gpu.model.config import VoiceChatConfig


@pytest.mark.slow
def test_census_counts_the_engine_path_structure():
    cfg = VoiceChatConfig.tiny()
    counts = census(3, "reference", "tiny")
    talker = {op: n for (stage, op), n in counts.items() if stage == "talker"}
    thinker = {op: n for (stage, op), n in counts.items() if stage == "thinker"}
    rows = 2                                                     # CFG in the reference profile
    assert talker["triton decode_attention (+ combine)"] == 2 * cfg.talker.n_layers  # all rows
    assert talker["triton qk_norm_rope"] == cfg.talker.n_layers
    n_mamba = cfg.thinker.pattern.count("M")
    assert thinker["triton mamba_step (conv, ssm, norm)"] == 3 * n_mamba
    # the talker's norms, each one launch: a layer's first norm alone, its residual steps
    # (x + post_norm(y), with the next sublayer's norm) fused. The char encoder layer: 1 norm,
    # 2 residual steps, its final norm; the fusion's final norm per CFG row; a backbone layer:
    # 1 norm (its q/k head norms are in qk_norm_rope) and 2 residual steps, then the final
    # norm; per MoG pass and block 1 norm and 1 residual step, plus the stack's final norm
    passes = sum(1 for w in cfg.talker.schedule if w)
    n_layers, mog = cfg.talker.n_layers, cfg.talker.mog_layers
    assert talker["triton rms_norm"] == 2 + rows + n_layers + 1 + passes * (mog + 1)
    assert talker["triton residual_rms_norm"] == 2 + 2 * n_layers + passes * mog
    assert talker["triton gelu_mul"] == 1 + n_layers + passes * mog        # one per gated MLP
    # perception: one attention launch a layer, no ring gather (the one index_select left is
    # the conv modules' time cache, once a step), nothing left of the torch attention
    perception = {op: n for (stage, op), n in counts.items() if stage == "perception"}
    n_conformer = cfg.perception.n_layers
    assert perception["triton relpos_attention"] == n_conformer
    # a layer's 4 residual adds each one launch with the LayerNorm after it (the last also with
    # the next layer's first); torch LayerNorms left: the conv module's and the first layer's
    # first. Matmuls: FF 2 + 2, qkv 1, out 1, the conv module's pointwise 2
    assert perception["triton add_layer_norm"] == 4 * n_conformer
    assert perception["native_layer_norm"] == n_conformer + 1
    assert perception["mm"] == 8 * n_conformer
    assert perception["index_select"] == 1
    assert not set(perception) & {"_softmax", "gather", "bmm", "masked_fill"}
    for stage in ("talker", "thinker"):                          # nothing left of a torch norm
        assert not {op for (s, op) in counts if s == stage} & {"rsqrt", "mean"}, stage
    assert sum(counts.values()) > 0
