"""Hearing and thinking half, whole-model checks: checkpoint names and shapes (docs/MODEL.md §7),
parameter counts of the full configs on the meta device (§1, §4), random init (§8), configs that
fit together, and one tiny frame-by-frame run of mel → perception → RNNT → thinker."""
import math

import pytest
import torch

from gpu.model import mel as M
from gpu.model import perception as P
from gpu.model import perception_weights as PW
from gpu.model import rnnt as R
from gpu.model import thinker as TH
from gpu.model import thinker_weights as THW
from wave_actors.core.text import PAD

MODULES = [(M, M.MelConfig, M.MelFrontEnd), (PW, PW.PerceptionConfig, P.Perception),
           (R, R.RNNTConfig, R.RNNT), (THW, THW.ThinkerConfig, TH.Thinker)]


def module_names(mod, model):
    return {mod.PREFIX + k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("mod,Config,Model", MODULES, ids=["mel", "perception", "rnnt", "thinker"])
@pytest.mark.parametrize("size", ["full", "tiny"])
def test_param_shapes_are_the_module_names(mod, Config, Model, size):
    cfg = getattr(Config, size)()
    assert module_names(mod, Model(cfg, device="meta")) == mod.param_shapes(cfg)


@pytest.mark.parametrize("mod,Config,Model", MODULES, ids=["mel", "perception", "rnnt", "thinker"])
def test_init_random_fills_every_name_and_loads(mod, Config, Model):
    cfg = Config.tiny()
    sd = mod.init_random(cfg, torch.Generator().manual_seed(0))
    assert {k: tuple(v.shape) for k, v in sd.items()} == mod.param_shapes(cfg)
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in sd.values())
    model = Model(cfg, device="meta")
    model.load_named(sd)                                           # meta → real tensors, strict
    assert all(p.device.type == "cpu" for p in model.state_dict().values())


def count(mod, Model, cfg, keep=lambda name: True):
    return sum(math.prod(s) for n, s in mod.param_shapes(cfg).items() if keep(n))


def test_full_parameter_counts_match_model_md():
    """§2.4: 7.71 B in layers + 3 × 0.587 B tables = 9.475 B; §4: perception 0.614 B, RNNT 8.94 M."""
    th = THW.ThinkerConfig.full()
    model = TH.Thinker(th, device="meta")
    total = sum(p.numel() for p in model.parameters())
    assert total == count(TH, TH.Thinker, th)
    assert round(total / 1e9, 3) == 9.475
    assert round(count(TH, None, th, lambda n: ".llm." in n) / 1e9, 2) == 7.71
    assert th.vocab * th.hidden == 587_202_560                     # each of embed / lm_head / function_head
    assert (th.pattern.count("M"), th.pattern.count("-"), th.pattern.count("*")) == (27, 25, 4)
    assert [i for i, k in enumerate(th.pattern) if k == "*"] == [14, 21, 30, 39]
    pe = sum(p.numel() for p in P.Perception(PW.PerceptionConfig.full(), device="meta").parameters())
    assert round(pe / 1e9, 3) == 0.614
    rn = sum(p.numel() for p in R.RNNT(R.RNNTConfig.full(), device="meta").parameters())
    assert round(rn / 1e6, 2) == 8.94


def test_full_shapes_spot_checks_from_model_md_section_7():
    th = THW.param_shapes(THW.ThinkerConfig.full())
    L = "stt_model.llm.layers."
    assert th[L + "0.mixer.in_proj.weight"] == (22656, 4480) and th[L + "0.mixer.conv1d.weight"] == (12288, 1, 4)
    assert th[L + "0.mixer.norm.weight"] == (10240,) and th[L + "0.mixer.out_proj.weight"] == (4480, 10240)
    assert th[L + "1.mixer.up_proj.weight"] == (15680, 4480) and th[L + "14.mixer.q_proj.weight"] == (5120, 4480)
    assert th[L + "14.mixer.k_proj.weight"] == (1024, 4480) and th[L + "14.mixer.o_proj.weight"] == (4480, 5120)
    assert th["stt_model.lm_head.weight"] == th["stt_model.function_head.weight"] == (131072, 4480)
    pe = PW.param_shapes(PW.PerceptionConfig.full())
    assert pe["stt_model.perception.encoder.pre_encode.out.weight"] == (1024, 256 * 17)
    assert pe["stt_model.perception.encoder.layers.23.self_attn.pos_bias_u"] == (8, 128)
    assert pe["stt_model.perception.encoder.layers.0.conv.depthwise_conv.weight"] == (1024, 1, 9)
    assert pe["stt_model.perception.proj.weight"] == (4480, 1024)
    assert "stt_model.perception.encoder.layers.0.feed_forward1.linear1.bias" not in pe   # use_bias = False
    rn = R.param_shapes(R.RNNTConfig.full())
    assert rn["stt_model.rnnt_decoder.prediction.embed.weight"] == (1025, 640)
    assert rn["stt_model.rnnt_decoder.prediction.dec_rnn.lstm.weight_ih_l1"] == (2560, 640)
    assert rn["stt_model.rnnt_joint.joint_net.2.weight"] == (1025, 640)
    assert M.param_shapes(M.MelConfig.full())[M.PREFIX + "fb"] == (1, 128, 257)


@pytest.mark.parametrize("size", ["full", "tiny"])
def test_configs_fit_together(size):
    mc, pc = getattr(M.MelConfig, size)(), getattr(PW.PerceptionConfig, size)()
    rc, tc = getattr(R.RNNTConfig, size)(), getattr(THW.ThinkerConfig, size)()
    assert mc.n_mels == pc.mel_bins and mc.window_cols == pc.window_cols and mc.cols_per_frame == pc.new_cols
    assert pc.out_dim == tc.hidden and pc.d_model == rc.enc_dim
    assert PW.subsampled_len(pc.window_cols) - pc.drop_frames == 1


@torch.no_grad()
def test_tiny_chain_frame_by_frame_is_finite():
    g = torch.Generator().manual_seed(1)
    mc, pc, rc, tc = M.MelConfig.tiny(), PW.PerceptionConfig.tiny(), R.RNNTConfig.tiny(), THW.ThinkerConfig.tiny()
    models = []
    for mod, Model, cfg in ((M, M.MelFrontEnd, mc), (PW, P.Perception, pc), (R, R.RNNT, rc), (THW, TH.Thinker, tc)):
        models.append(Model(cfg))
        models[-1].load_named(mod.init_random(cfg, g))
    mel, per, rnnt, thk = models
    S, slots = 4, torch.tensor([2, 0, 3])
    ms, ps, rs, ts = M.MelState.alloc(mc, S), P.PerceptionState.alloc(pc, S), R.RNNTState.alloc(rnnt, S), \
        TH.ThinkerState.alloc(tc, S, 16)
    thk.prefill(ts, torch.tensor([[1, 1100, 2]] * 3), torch.tensor([3, 2, 0]), slots)
    y = f = torch.full((3,), PAD)
    for _ in range(5):
        window = mel.step(ms, 0.1 * torch.randn(3, 1280, generator=g), slots).window
        p = per.step(ps, window, slots)
        r = rnnt.step(rs, p.enc, slots)
        o = thk.step(ts, p.audio, y, f, slots)
        y, f = o.text, o.func
        assert torch.isfinite(p.enc).all() and torch.isfinite(p.audio).all()
        assert torch.isfinite(o.text_logits).all() and torch.isfinite(o.func_logits).all()
        assert r.tokens.shape == (3, rc.max_symbols) and ((r.tokens >= -1) & (r.tokens < rc.vocab)).all()
        assert ((0 <= y) & (y < tc.vocab)).all()
    assert ts.length[slots].tolist() == [8, 7, 5] and ps.frames[slots].tolist() == [5] * 3
