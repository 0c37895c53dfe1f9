"""Community LoRA formats (vidloom.lora.formats): a file written in each format from a known PEFT adapter loads as
the same adapter as the PEFT file (every layer's scaling * B @ A equal), and an end-to-end run agrees; keys no
rule understands are refused naming the file and the key.

The rewrites in tests/helpers/lora_files.py invert diffusers' converters (lora_conversion_utils), so a format our
converter read differently from diffusers would not give the PEFT adapter back.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.helpers.flux2_checkpoints import TINY_DISTILLED, write_tiny_flux2
from tests.helpers.lora_files import (LoRASpec, rewrite_flux2_kohya, rewrite_wan_community,
                                      tie_and_rewrite_flux2_aitoolkit, write_lora)
from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError, DeployError
from vidloom.generator import VideoGenerator
from vidloom.families.ltx2.lora import ltx2_keys
from vidloom.lora.registry import attach_registry

WAN_SPEC = LoRASpec(rank=4, alpha=8, seed=31, targets=("to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj",
                                                      "ffn.net.2", "proj_out", "time_proj", "linear_1"))
FLUX2_SPEC = LoRASpec(rank=4, alpha=4, seed=32, targets=r".*(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj|"
                      r"to_out\.0|to_add_out|ff\.linear_in|ff_context\.linear_out|to_qkv_mlp_proj|x_embedder|"
                      r"single_transformer_blocks\.\d+\.attn\.to_out)")


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    folder = write_tiny_wan(tmp_path_factory.mktemp("wan"), TINY_A)
    return folder, VideoGenerator.from_pretrained(folder, device="cpu")


@pytest.fixture(scope="module")
def flux2(tmp_path_factory):
    folder = write_tiny_flux2(tmp_path_factory.mktemp("flux2"), TINY_DISTILLED)
    return folder, VideoGenerator.from_pretrained(folder, device="cpu")


def _deltas(gen: VideoGenerator, name: str) -> dict[str, torch.Tensor]:
    [adapter] = [a for a in attach_registry(gen.engine.instance).adapters if a.name == name]
    return {key: layer.scaling * layer.up @ layer.down for key, layer in adapter.layers.items()}


def _assert_same_adapter(gen: VideoGenerator, first: str, second: str) -> None:
    a, b = _deltas(gen, first), _deltas(gen, second)
    assert sorted(a) == sorted(b)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)


@pytest.mark.parametrize("musubi", [False, True], ids=["original-repo", "musubi"])
def test_wan_community_files_load_as_the_peft_adapter(wan, tmp_path, musubi):
    folder, gen = wan
    peft = write_lora(folder, "WanPipeline", WAN_SPEC, tmp_path)
    community = rewrite_wan_community(peft, tmp_path / "community.safetensors", musubi=musubi)
    gen.load_lora("peft", peft)
    gen.load_lora("community", community)
    try:
        _assert_same_adapter(gen, "peft", "community")
        kw = dict(height=32, width=32, num_frames=5, num_inference_steps=2, guidance_scale=1.0, seed=5)
        via_peft = gen.generate("a fox", loras={"peft": 0.7}, **kw).frames
        assert np.abs(gen.generate("a fox", loras={"community": 0.7}, **kw).frames.astype(int) - via_peft).max() <= 1
        assert np.abs(gen.generate("a fox", **kw).frames.astype(int) - via_peft).max() > 10
    finally:
        gen.unload_lora("peft")
        gen.unload_lora("community")


def test_flux2_ai_toolkit_file_loads_as_the_peft_adapter(flux2, tmp_path):
    folder, gen = flux2
    peft = write_lora(folder, "Flux2KleinPipeline", FLUX2_SPEC, tmp_path, with_metadata=False)
    tied, community = tie_and_rewrite_flux2_aitoolkit(peft, tmp_path / "tied.safetensors",
                                                      tmp_path / "aitoolkit.safetensors")
    gen.load_lora("tied", tied)
    gen.load_lora("aitoolkit", community)
    try:
        _assert_same_adapter(gen, "tied", "aitoolkit")
    finally:
        gen.unload_lora("tied")
        gen.unload_lora("aitoolkit")


def test_flux2_kohya_file_loads_as_the_peft_adapter(flux2, tmp_path):
    folder, gen = flux2
    spec = LoRASpec(rank=4, alpha=6, seed=33, targets=FLUX2_SPEC.targets)  # alpha != rank: the .alpha keys matter
    peft = write_lora(folder, "Flux2KleinPipeline", spec, tmp_path)
    kohya = rewrite_flux2_kohya(peft, tmp_path / "kohya.safetensors")
    gen.load_lora("peft", peft)
    gen.load_lora("kohya", kohya)
    try:
        _assert_same_adapter(gen, "peft", "kohya")  # every layer's scaling * B @ A within 1e-6
        kw = dict(height=32, width=32, num_inference_steps=2, seed=5)
        via_peft = gen.generate("a fox", loras={"peft": 0.8}, **kw).frames.astype(int)
        assert np.abs(gen.generate("a fox", loras={"kohya": 0.8}, **kw).frames - via_peft).max() <= 1
        assert np.abs(gen.generate("a fox", **kw).frames - via_peft).max() > 10
    finally:
        gen.unload_lora("peft")
        gen.unload_lora("kohya")


def test_flux2_kohya_dense_qkv_shares_its_down_factor(tmp_path):
    from vidloom.families.flux2.lora import flux2_keys

    g = torch.Generator().manual_seed(0)
    down, up = torch.randn(6, 8, generator=g), torch.randn(12, 6, generator=g)  # not block-diagonal
    out = flux2_keys(tmp_path, {"lora_unet_double_blocks_1_txt_attn_qkv.lora_down.weight": down,
                                "lora_unet_double_blocks_1_txt_attn_qkv.lora_up.weight": up,
                                "lora_unet_double_blocks_1_txt_attn_qkv.alpha": torch.tensor(3.0)})
    for i, name in enumerate(("add_q_proj", "add_k_proj", "add_v_proj")):
        prefix = f"transformer.transformer_blocks.1.attn.{name}"
        assert torch.equal(out[f"{prefix}.lora_A.weight"], down)
        assert torch.equal(out[f"{prefix}.lora_B.weight"], up[4 * i:4 * (i + 1)])
        assert float(out[f"{prefix}.alpha"]) == 3.0


@pytest.mark.parametrize("key,family", [
    ("diffusion_model.blocks.0.self_attn.norm_q.lora_down.weight", "wan"),
    ("diffusion_model.blocks.0.self_attn.q.diff_b", "wan"),
    ("lora_unet_blocks_0_self_attn_q.lora_mid.weight", "wan"),
    ("diffusion_model.double_blocks.0.img_mod.lin.lora_A.weight", "flux2"),
    ("lora_unet_double_blocks_0_img_mod_lin.lora_down.weight", "flux2"),
    ("lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", "flux2"),  # no lora_up partner
])
def test_keys_no_rule_understands_are_refused_naming_file_and_key(wan, flux2, tmp_path, key, family):
    gen = (wan if family == "wan" else flux2)[1]
    path = tmp_path / "odd.safetensors"
    save_file({key: torch.zeros(2, 2)}, str(path))
    with pytest.raises(CheckpointError) as err:
        gen.load_lora("odd", path)
    assert str(path) in str(err.value) and key in str(err.value)
    assert "odd" not in gen.loras


def test_zero_norm_diffs_are_dropped_like_diffusers_nonzero_refused(wan, tmp_path):
    folder, gen = wan
    peft = write_lora(folder, "WanPipeline", WAN_SPEC, tmp_path)
    community = rewrite_wan_community(peft, tmp_path / "c.safetensors")
    from safetensors.torch import load_file

    state = load_file(str(community))
    save_file({**state, "diffusion_model.blocks.0.norm3.diff": torch.zeros(4)}, str(tmp_path / "zero.safetensors"))
    gen.load_lora("zero", tmp_path / "zero.safetensors")
    gen.unload_lora("zero")
    save_file({**state, "diffusion_model.blocks.0.norm3.diff": torch.ones(4)}, str(tmp_path / "ones.safetensors"))
    with pytest.raises(CheckpointError, match="norm3.diff"):
        gen.load_lora("ones", tmp_path / "ones.safetensors")


def test_ltx2_original_keys_are_renamed_connectors_included(tmp_path):
    t = torch.zeros(1)
    out = ltx2_keys(tmp_path, {"diffusion_model.adaln_single.linear.lora_A.weight": t,
                               "diffusion_model.audio_patchify_proj.lora_B.weight": t,
                               "diffusion_model.transformer_blocks.0.attn1.to_q.lora_A.weight": t,
                               "diffusion_model.av_ca_a2v_gate_adaln_single.linear.lora_A.weight": t})
    assert sorted(out) == ["transformer.audio_proj_in.lora_B.weight",
                           "transformer.av_cross_attn_video_a2v_gate.linear.lora_A.weight",
                           "transformer.time_embed.linear.lora_A.weight",
                           "transformer.transformer_blocks.0.attn1.to_q.lora_A.weight"]
    peft = {"transformer.proj_in.lora_A.weight": t}
    assert ltx2_keys(tmp_path, peft) is peft
    # The text connectors: diffusers' converter renames aggregate_embed (LTX-2.0's projection) to text_proj_in.
    assert sorted(ltx2_keys(tmp_path, {"text_embedding_projection.aggregate_embed.lora_A.weight": t,
                                       "diffusion_model.proj_out.lora_A.weight": t})) == [
        "connectors.text_proj_in.lora_A.weight", "transformer.proj_out.lora_A.weight"]
    with pytest.raises(CheckpointError, match="'transformer.x.lora_A.weight' is not an LTX-2"):
        ltx2_keys(tmp_path, {"diffusion_model.proj_out.lora_A.weight": t, "transformer.x.lora_A.weight": t})


def test_stage2_lora_needs_the_two_stage_program():
    with pytest.raises(DeployError, match="stage2_lora"):
        DeployConfig(stage2_lora="./distilled.safetensors")
    assert DeployConfig(upsampler="./up", stage2_lora="./d.safetensors:0.8").stage2_lora == "./d.safetensors:0.8"
