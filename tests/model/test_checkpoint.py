"""Checkpoint layout and files (gpu/model/checkpoint.py, voicechat_weights.py; docs/MODEL.md §1, §4, §7):
the full layout's names, shapes and parameter counts, random files that load back to the same
model, and files with the wrong tensors rejected by name."""
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from gpu.model.checkpoint import CheckpointError, load_checkpoint, main, write_random
from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.voicechat import VoiceChat
from gpu.model.voicechat_weights import integer_names, parameter_counts, param_shapes, random_weights
from tests.model.test_model_voicechat_kit import CFG, FP32, assert_rows_equal, frame, prompt, row, start

ROOT = Path(__file__).resolve().parents[2]




@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    assert main(["write", "--config", "tiny", "--out", str(path), "--seed", "3"]) == 0
    return path


@pytest.mark.slow
def test_list_full_prints_the_real_layout():
    out = subprocess.run([sys.executable, "-m", "gpu.model.checkpoint", "list", "--config", "full"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    rows = dict(line.split("\t") for line in lines)
    assert len(lines) == len(rows) == len(param_shapes(VoiceChatConfig.full())) == 1525
    assert lines == sorted(lines)
    for name, shape in {
        "stt_model.embed_tokens.weight": "[131072, 4480]",
        "stt_model.lm_head.weight": "[131072, 4480]",
        "stt_model.llm.layers.0.mixer.in_proj.weight": "[22656, 4480]",
        "stt_model.llm.layers.0.mixer.conv1d.weight": "[12288, 1, 4]",
        "stt_model.llm.layers.14.mixer.q_proj.weight": "[5120, 4480]",
        "stt_model.perception.preprocessor.featurizer.fb": "[1, 128, 257]",
        "stt_model.perception.encoder.layers.23.self_attn.pos_bias_u": "[8, 128]",
        "stt_model.perception.proj.weight": "[4480, 1024]",
        "stt_model.rnnt_decoder.prediction.embed.weight": "[1025, 640]",
        "tts_model.tts_model.backbone.layers.27.mlp.gate_proj.weight": "[4608, 1152]",
        "tts_model.tts_model.mog_head.proj_mus.weight": "[65536, 1152]",
        "tts_model.tts_model.mog_head.low_mat": "[1024, 512, 64]",
        "tts_model.tts_model.rvq_embs": "[31, 1024, 512]",
        "tts_model.tts_model.embed_subword.subword_flag_emb.is_continuation": "[131073]",
        "tts_model.tts_model.gated_fusion_audio_text.residual_scale": "[]",
        "tts_model.audio_prompt_latents.Aria": "[1, 37, 1152]",
        "tts_model.audio_codec.prvq.mus_list.30": "[1024, 512]",
        "tts_model.audio_codec.decoder.layers.4.weight": "[1536, 768, 7]",
        "tts_model.audio_codec.decoder.layers.12.weight": "[18, 384, 1]",
    }.items():
        assert rows[name] == shape, name
    total = sum(math.prod(int(d) for d in s.strip("[]").split(", ") if d) for s in rows.values())
    assert round(total / 1e9, 1) == 11.0


def test_full_parameter_counts_match_model_md():
    """§4: thinker 9.475 B, perception 0.614 B, RNNT 8.94 M, talker 0.797 B, codec 108.1 M."""
    counts = parameter_counts(VoiceChatConfig.full())
    assert round(counts["thinker"] / 1e9, 3) == 9.475 and round(counts["perception"] / 1e9, 3) == 0.614
    assert round(counts["rnnt"] / 1e6, 2) == 8.94 and round(counts["talker"] / 1e9, 3) == 0.797
    assert round(counts["codec"] / 1e6, 1) == 108.1 and round(counts["total"] / 1e9, 1) == 11.0
    model = VoiceChat(VoiceChatConfig.full(), Profile.named("reference"), "meta")
    assert all(p.is_meta for p in model.parameters())
    buffers = sum(math.prod(param_shapes(VoiceChatConfig.full())[n]) for n in integer_names(VoiceChatConfig.full()))
    assert model.parameter_count() + buffers + 33_296 + 37 * 1152 == counts["total"]  # + fb, window, Aria


def test_written_file_loads_to_the_in_memory_random_model(tiny_file):
    assert main(["check", "--config", "tiny", "--file", str(tiny_file)]) == 0
    loaded = load_checkpoint(tiny_file, CFG, FP32)
    memory = VoiceChat.random(CFG, FP32, seed=3)
    ref = random_weights(CFG, 3)
    for name, t in loaded.state_dict().items():
        assert not t.is_meta, name
    outs = []
    for model in (loaded, memory):
        state = model.alloc_state(2, 6, 16)
        start(model, state, [0, 1], [prompt(61, 5), prompt(62, 7)])
        outs.append([frame(model, state, [0, 1], [1, 2], t) for t in range(3)])
    for a, b in zip(*outs):
        for i in (0, 1):
            assert_rows_equal(row(a, i), row(b, i), atol=0)
    assert torch.equal(loaded.thinker.embed_tokens.weight, ref["stt_model.embed_tokens.weight"])


def test_profile_dtypes_after_loading(tiny_file):
    model = load_checkpoint(tiny_file, CFG, Profile.named("reference"))
    assert model.thinker.embed_tokens.weight.dtype == torch.bfloat16
    assert model.perception.proj.weight.dtype == torch.bfloat16
    for net in (model.mel, model.rnnt, model.codec):
        assert all(p.dtype == torch.float32 for p in net.state_dict().values())
    flags = model.talker.tts_model.embed_subword.bos_eos_emb.special_flags
    assert flags.dtype == torch.int32 and model.talker.codec_silence_tokens.dtype == torch.int32
    assert model.talker.tts_model.mog_head.low_mat.dtype == torch.float32


def test_wrong_tensors_are_rejected_by_name(tmp_path, capsys):
    w = random_weights(CFG, 0)
    del w["stt_model.llm.layers.1.mixer.up_proj.weight"]
    w["stt_model.llm.layers.99.mixer.bogus"] = torch.zeros(3)
    w["tts_model.tts_model.null_emb"] = torch.zeros(CFG.talker.hidden + 1)
    w["tts_model.audio_codec.encoder.layers.0.weight"] = torch.zeros(2)          # ignored (§7)
    path = tmp_path / "bad.safetensors"
    save_file(w, str(path))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path, CFG, FP32)
    msg = str(err.value)
    assert "1 missing, 1 unexpected, 1 mis-shaped" in msg
    assert "missing: stt_model.llm.layers.1.mixer.up_proj.weight" in msg
    assert "unexpected: stt_model.llm.layers.99.mixer.bogus" in msg
    assert f"mis-shaped: tts_model.tts_model.null_emb is [{CFG.talker.hidden + 1}]" in msg
    assert "encoder" not in msg
    assert main(["check", "--config", "tiny", "--file", str(path)]) == 1
    assert "up_proj" in capsys.readouterr().err


def test_codec_encoder_subtree_is_ignored(tmp_path):
    path = tmp_path / "with_encoder.safetensors"
    assert write_random(path, CFG, seed=1) == sum(math.prod(s) for s in param_shapes(CFG).values())
    w = dict(random_weights(CFG, 1), **{"tts_model.audio_codec.encoder.conv.weight": torch.ones(4, 2)})
    save_file(w, str(path))
    model = load_checkpoint(path, CFG, FP32)
    assert not [n for n, _ in model.named_parameters() if n.startswith("codec.encoder")]
    assert torch.equal(model.codec.prvq.mus_list[0], w["tts_model.audio_codec.prvq.mus_list.0"])
