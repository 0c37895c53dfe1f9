"""Tiny Cosmos3 Omni checkpoints with the action pathway (`action_gen`): two configs, several embodiments.

Built like tests/helpers/cosmos3_checkpoints.py (Cosmos3OmniPipeline.save_pretrained, random weights), with
the per-domain action projections scaled to unit gain so the actions move the frames (and the frames the
predicted actions) by far more than the parity tolerances: a broken action path cannot pass.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from tests.helpers.cosmos3_checkpoints import COSMOS3_A, COSMOS3_B, TinyCosmos3, build_pipeline

# action_dim is the padded width: the widest embodiment used (av 9, bridge/fractal 10) fits, pusht (2) is padded.
COSMOS3_ACTION_A = dataclasses.replace(
    COSMOS3_A, name="cosmos3-action-a",
    transformer={**COSMOS3_A.transformer, "action_gen": True, "action_dim": 10, "num_embodiment_domains": 8})
COSMOS3_ACTION_B = dataclasses.replace(
    COSMOS3_B, name="cosmos3-action-b",
    transformer={**COSMOS3_B.transformer, "action_gen": True, "action_dim": 12, "num_embodiment_domains": 21})
COSMOS3_ACTION_CONFIGS = (COSMOS3_ACTION_A, COSMOS3_ACTION_B)


def build_action_pipeline(spec: TinyCosmos3, seed: int = 0):
    pipe = build_pipeline(spec, seed)
    transformer = pipe.transformer
    g = torch.Generator().manual_seed(seed + 11)
    with torch.no_grad():
        for head in (transformer.action_proj_in, transformer.action_proj_out):
            fan_in = head.input_size
            head.fc.weight.copy_(torch.randn(head.fc.weight.shape, generator=g) / fan_in ** 0.5)
            head.bias.weight.copy_(0.1 * torch.randn(head.bias.weight.shape, generator=g))
        transformer.action_modality_embed.copy_(0.5 * torch.randn(transformer.action_modality_embed.shape,
                                                                  generator=g))
    return pipe


def write_tiny_cosmos3_action(folder: Path, spec: TinyCosmos3 = COSMOS3_ACTION_A, seed: int = 0) -> Path:
    """Save a tiny Cosmos3OmniPipeline folder whose transformer has the action pathway."""
    build_action_pipeline(spec, seed).save_pretrained(folder)
    return folder
