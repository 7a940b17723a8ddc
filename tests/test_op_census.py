"""bench/op_census.py counts the engine path's launches per frame without a GPU: the structural
counts it reports (one attention launch pair per layer and CFG row, one fused norm per RMSNorm)
follow from the config, and no stage runs an unfused RMSNorm."""
from bench.op_census import census
from gpu.model.config import VoiceChatConfig


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
    # the talker's norms, each one launch: the char encoder layer's 4 and its final norm, the
    # fusion's final norm per CFG row, 4 a backbone layer (its q/k head norms are in
    # qk_norm_rope) and its final norm, and per MoG pass 2 per block plus the stack's final norm
    passes = sum(1 for w in cfg.talker.schedule if w)
    norms = 5 + rows + 4 * cfg.talker.n_layers + 1 + passes * (2 * cfg.talker.mog_layers + 1)
    assert talker["triton rms_norm"] == norms
    for stage in ("talker", "thinker"):                          # nothing left of a torch norm
        assert not {op for (s, op) in counts if s == stage} & {"rsqrt", "mean"}, stage
    assert sum(counts.values()) > 0
