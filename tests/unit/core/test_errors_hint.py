"""NonFiniteOutput's hint fits the precision the run used (never "try float32" to a float32 run)."""

from __future__ import annotations

import torch

from vidloom.core.errors import NonFiniteOutput


def test_float16_runs_are_told_to_use_a_wider_dtype():
    message = str(NonFiniteOutput.of("denoising", torch.float16))
    assert "float16 overflows" in message and "bfloat16 or float32" in message


def test_float32_and_bfloat16_runs_are_not_told_to_change_precision():
    for dtype in (torch.float32, torch.bfloat16):
        message = str(NonFiniteOutput.of("rollout", dtype))
        assert message.startswith("rollout produced NaN/inf latents")
        assert "try float32" not in message and "use bfloat16" not in message
        assert str(dtype).removeprefix("torch.") in message and "guidance_scale" in message
