"""Qwen-Image's batched true CFG (`cfg_mode="batched"`): prompt and negative prompt of different lengths run as one
forward of two, the shorter zero-padded and its padding masked out of the joint attention; in float32 the image
equals the two-forward path's (text to image, and a two-reference edit, with and without zero_cond_t)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.qwen_image_checkpoints import write_qwen_image_edit, write_qwen_image_wide
from tests.parity.test_qwen_image_edit import _pattern
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.core.parallel import ParallelPlan
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
# float32 on CPU: one SDPA call over a batch of two with a key mask vs two unmasked calls; only the kernels'
# summation order differs.
TOLERANCE = 1e-5
PROMPT, NEGATIVE = "a red fox jumps over the lazy brown dog at dusk", "blurry"


def _runs(folder, request: GenerationRequest) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(sequential image, batched image, batch of every first-block call of the batched run)."""
    plain = VideoGenerator.from_pretrained(folder, device="cpu").engine.run(request)["video"][0]
    gen = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(cfg_mode="batched"))
    seen: list[int] = []
    block = gen.engine.instance["transformer"].blocks[0]
    handle = block.register_forward_pre_hook(lambda module, args: seen.append(int(args[0].shape[0])))
    try:
        batched = gen.engine.run(request)["video"][0]
    finally:
        handle.remove()
    return plain, batched, seen


def test_batched_cfg_equals_two_forwards(tmp_path):
    folder = write_qwen_image_wide(tmp_path / "wide")
    request = GenerationRequest(prompt=PROMPT, negative_prompt=NEGATIVE, task=Task.T2I, height=32, width=48, seed=2,
                                num_inference_steps=3, guidance_scale=4.0)
    plain, batched, seen = _runs(folder, request)
    assert seen == [2, 2, 2]  # one forward of both branches per step
    assert np.abs(plain - batched).max() < TOLERANCE, np.abs(plain - batched).max()
    # The padding is masked: unmasked, the zero-padded negative's keys move the image.
    with pytest.MonkeyPatch.context() as patch:
        from vidloom.families.qwen_image import transformer

        real = transformer.QwenImageTransformer.embed
        patch.setattr(transformer.QwenImageTransformer, "embed",
                      lambda self, *a, text_mask=None, **kw: real(self, *a, **kw))
        _, unmasked, _ = _runs(folder, request)
    assert np.abs(plain - unmasked).max() > 100 * TOLERANCE


@pytest.mark.parametrize("zero_cond_t", [False, True], ids=["edit-plus", "edit-2511"])
def test_batched_cfg_edit_equals_two_forwards(tmp_path, zero_cond_t):
    folder = write_qwen_image_edit(tmp_path / "plus", pipeline="QwenImageEditPlusPipeline", zero_cond_t=zero_cond_t)
    request = GenerationRequest(prompt=PROMPT, negative_prompt=NEGATIVE, task=Task.T2I, height=32, width=32, seed=2,
                                num_inference_steps=2, guidance_scale=3.0,
                                image=(_pattern(64, 96, 1), _pattern(80, 80, 2)))
    plain, batched, seen = _runs(folder, request)
    assert seen == [2, 2]
    assert np.abs(plain - batched).max() < TOLERANCE, np.abs(plain - batched).max()


def test_batched_cfg_with_sequence_parallel_is_refused(tmp_path):
    from vidloom.families.qwen_image.load import load_instance
    from vidloom.families.qwen_image.cards import card_from_checkpoint

    folder = write_qwen_image_wide(tmp_path / "wide")
    deploy = DeployConfig(cfg_mode="batched", devices=3, parallel=ParallelPlan(sp=3))
    with pytest.raises(DeployError, match="sequence parallel"):
        load_instance(card_from_checkpoint(folder), folder, torch.device("cpu"), torch.float32, deploy)
