"""Cosmos3 LoRA parity: a PEFT adapter on diffusers' Cosmos3OmniTransformer (diffusers gives Cosmos3OmniPipeline no
LoRA loader, so PEFT injects it), in the layout save_lora_weights writes, loaded per request by vidloom vs the
pipeline with the adapter injected.

The adapter touches both pathways of the one diffusers module: the prompt's (to_q/to_k/to_v/to_out and the MLP,
our chat backbone, whose K/V the generated tokens attend) and the generation pathways (add_*_proj, to_add_out,
mlp_moe_gen, proj_in/proj_out, the time embedder: our generator). fp32 on CPU; the base program matches the pipeline
to 1e-4 on float frames (test_cosmos3_generation), so the adapted uint8 frames must be within one level of the
pipeline's. The adapter moves the frames by MIN_EFFECT levels on average, and each pathway alone moves them too, so a
pathway the LoRA missed could not pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.lora_files import LoRASpec, write_peft_lora
from vidloom.core.errors import CheckpointError, InvalidRequest
from vidloom.generator import VideoGenerator

TOLERANCE = 1  # uint8 levels
MIN_EFFECT = 2.0  # mean uint8 levels
PROMPT_PATH = r".*layers\.\d+\.(self_attn\.(to_q|to_k|to_v|to_out)|mlp\.(gate_proj|up_proj|down_proj))"
GENERATION_PATH = (r".*(layers\.\d+\.(self_attn\.(add_q_proj|add_k_proj|add_v_proj|to_add_out)"
                   r"|mlp_moe_gen\.(gate_proj|up_proj|down_proj))|proj_in|proj_out|time_embedder\.linear_\d)")
BOTH = LoRASpec(rank=4, alpha=8, targets=f"({PROMPT_PATH})|({GENERATION_PATH})", seed=31, std=0.2)
REQUEST = dict(num_frames=5, height=32, width=32, num_inference_steps=2, guidance_scale=3.0, fps=16, seed=4,
               negative_prompt="blurry")
PROMPT = "a red fox jumps over the lazy dog"


def _theirs(pipe) -> np.ndarray:
    r = REQUEST
    out = pipe(prompt=PROMPT, negative_prompt=r["negative_prompt"], num_frames=r["num_frames"], height=r["height"],
               width=r["width"], num_inference_steps=r["num_inference_steps"], guidance_scale=r["guidance_scale"],
               fps=r["fps"], generator=torch.Generator().manual_seed(r["seed"]), output_type="np")
    return np.round(np.asarray(out.video, dtype=np.float64) * 255).astype(np.int16)


def _ours(gen, loras=None) -> np.ndarray:
    return gen.generate(PROMPT, loras=loras, **REQUEST).frames.astype(np.int16)


def _moved(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).mean())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tests.helpers.cosmos3_checkpoints import COSMOS3_B, write_tiny_cosmos3

    return write_tiny_cosmos3(tmp_path_factory.mktemp("cosmos3-lora") / "tiny", COSMOS3_B)


def test_a_request_adapter_matches_the_pipeline_with_peft(folder, tmp_path):
    from diffusers import Cosmos3OmniPipeline

    pipe = Cosmos3OmniPipeline.from_pretrained(folder, enable_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    lora = write_peft_lora(pipe.transformer, BOTH, tmp_path, "cosmos3-lora")
    gen = VideoGenerator.from_pretrained(folder, device="cpu", dtype=torch.float32)
    gen.load_lora("peft", lora)
    adapted, plain = _ours(gen, {"peft": 1.0}), _ours(gen)
    theirs = _theirs(pipe)
    assert adapted.shape == theirs.shape
    diff = int(np.abs(adapted - theirs).max())
    print(f"cosmos3 LoRA frames: max |ours - diffusers+peft| {diff} levels; moved {_moved(adapted, plain):.1f}")
    assert diff <= TOLERANCE
    assert _moved(adapted, plain) > MIN_EFFECT  # the adapter acted
    (adapter,) = gen.engine.instance["lora_adapters"].adapters
    placed = {key.partition(":")[0] for key in adapter.layers}
    assert placed == {"transformer", "generator"}


@pytest.mark.parametrize("targets", [PROMPT_PATH, GENERATION_PATH], ids=["prompt-pathway", "generation-pathways"])
def test_each_pathway_alone_moves_the_video(folder, tmp_path, targets):
    """A LoRA on one pathway only: the prompt's (through the prefilled K/V) or the generated tokens'."""
    from diffusers import Cosmos3OmniTransformer

    model = Cosmos3OmniTransformer.from_pretrained(folder / "transformer")
    lora = write_peft_lora(model, LoRASpec(rank=4, alpha=8, targets=targets, seed=5, std=0.2), tmp_path, "one")
    gen = VideoGenerator.from_pretrained(folder, device="cpu", dtype=torch.float32)
    gen.load_lora("one", lora)
    assert _moved(_ours(gen, {"one": 1.0}), _ours(gen)) > MIN_EFFECT


def test_a_key_of_neither_pathway_names_both(folder, tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "stray.safetensors"
    save_file({"transformer.layers.0.self_attn.nowhere.lora_A.weight": torch.zeros(4, 8),
               "transformer.layers.0.self_attn.nowhere.lora_B.weight": torch.zeros(8, 4)}, str(path))
    gen = VideoGenerator.from_pretrained(folder, device="cpu", dtype=torch.float32)
    with pytest.raises(CheckpointError, match="matches no linear layer of the transformer / generator"):
        gen.load_lora("stray", path)


def test_a_chat_only_folder_refuses_adapters_with_the_reason(folder, tmp_path):
    """Without a VAE the folder loads for chat only: an adapter could change nothing a request runs."""
    import json
    import shutil

    chat = tmp_path / "chat-only"
    shutil.copytree(folder, chat)
    index = json.loads((chat / "model_index.json").read_text())
    for name in ("vae", "scheduler"):
        shutil.rmtree(chat / name)
        index[name] = [None, None]
    (chat / "model_index.json").write_text(json.dumps(index))
    gen = VideoGenerator.from_pretrained(chat, device="cpu", dtype=torch.float32)
    with pytest.raises(InvalidRequest, match="takes no LoRA adapters: chat only"):
        gen.load_lora("any", tmp_path / "missing.safetensors")
