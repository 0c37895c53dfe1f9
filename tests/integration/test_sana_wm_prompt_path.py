"""SANA-WM's prompt path through the runtime's shared encoder options (DeployConfig.prompt_cache_size,
offload_text_encoder; vidloom/text_encoders: EmbeddingCache, OffloadedWeights), as every other family has them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.sana_wm_checkpoints import SANA_WM_A, write_tiny_sana_wm
from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.text_encoders.offloaded_weights import OffloadedWeights

IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 70, 3), dtype=np.uint8))
REQUEST = dict(prompt="a car driving across a vast desert plain", negative_prompt="blurry", height=64, width=96,
               num_frames=9, num_inference_steps=2, seed=3, guidance_scale=3.0, image=[IMAGE],
               intrinsics=[50.0, 52.0, 35.0, 20.0], camera="w-8")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_sana_wm(tmp_path_factory.mktemp("sana-wm-prompt"), SANA_WM_A)


def _video(gen: VideoGenerator, **changes) -> np.ndarray:
    return gen.engine.run(GenerationRequest(**{**REQUEST, **changes}))["video"]


def test_a_cached_prompt_gives_the_same_video(folder):
    plain = _video(VideoGenerator.from_pretrained(folder, device="cpu"))
    gen = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(prompt_cache_size=4))
    text = gen.engine.instance["text_encoder"]
    first = _video(gen)
    assert (text.cache.hits, text.cache.misses) == (0, 2)  # the prompt and the negative prompt
    again = _video(gen)
    assert (text.cache.hits, text.cache.misses) == (2, 2)
    assert np.array_equal(first, plain) and np.array_equal(again, plain)
    _video(gen, negative_prompt="")  # the negative prompt is encoded apart (no prefix): its own entry
    assert (text.cache.hits, text.cache.misses) == (3, 3)


def test_the_prompt_and_the_negative_prompt_are_cached_apart(folder):
    gen = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(prompt_cache_size=4))
    text = gen.engine.instance["text_encoder"]
    same = "a quiet forest path"
    positive, negative = text.encode_prompt(same), text.encode_negative(same)
    assert not torch.equal(positive.embeds, negative.embeds)  # the instruction prefix makes them differ
    assert torch.equal(text.encode_negative(same).embeds, negative.embeds) and text.cache.hits == 1


def test_offload_leaves_the_encoder_in_host_memory_between_requests(folder):
    # On CPU the "device" copy is a second CPU tensor: the swap is what is tested here (an accelerator run
    # is the skip-marked test below).
    gen = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(offload_text_encoder=True))
    text = gen.engine.instance["text_encoder"]
    reference = _video(gen)
    params = list(text.model.parameters())
    host = [p.data_ptr() for p in params]
    text._offloaded = OffloadedWeights(text.model, torch.device("cpu"))
    seen: list[list[int]] = []
    text.model.register_forward_hook(lambda *a: seen.append([p.data_ptr() for p in params]))
    assert np.array_equal(_video(gen), reference)
    assert seen and all(a != b for a, b in zip(seen[0], host)), "the encode ran on the uploaded copy"
    assert [p.data_ptr() for p in params] == host, "between requests the encoder points at its host weights"
    assert all(p.device.type == "cpu" for p in params)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="offload only moves weights on an accelerator")
def test_offload_on_an_accelerator(folder):
    gen = VideoGenerator.from_pretrained(folder, device="cuda", deploy=DeployConfig(offload_text_encoder=True))
    _video(gen)
    assert all(p.device.type == "cpu" for p in gen.engine.instance["text_encoder"].model.parameters())
