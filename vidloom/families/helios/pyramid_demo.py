"""helios-pyramid-demo: Helios-Mid's pyramid (three resolution stages, CFG-Zero*) on helios-demo's tiny transformer,
seeded random weights.

Written once into the user's cache as a HeliosPyramidPipeline folder and loaded through the same loader as real
pyramid checkpoints, so the staged chunk loop (each chunk from a 4x smaller grid up, renoised between stages) runs
offline in seconds. Its weights are random: the video is noise by design.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vidloom.core.card import Geometry, ModelCard
from vidloom.demo.cache import DemoCheckpoint, noise_note
from vidloom.demo.writer import model_index
from vidloom.families.helios.cards import GEOMETRY, PYRAMID_DEFAULTS, PYRAMID_NOTE, ZERO_STAR_NOTE
from vidloom.families.helios.demo import helios_demo_card, write_helios_demo

DEMO_ID = "helios-pyramid-demo"
DEMO_VERSION = 1  # bump when the demo's architecture or files change
DEMO_SEED = 20260307
DEMO_NOTE = noise_note(DEMO_ID, "Helios", "BestWishYsh/Helios-Mid")

STAGES = 3  # Helios-Mid's
# Helios-Mid's HeliosScheduler: three stages over the train range in thirds, block-noise correlation 1/3, UniPC with
# the time shift by mu.
DEMO_SCHEDULER = {"_class_name": "HeliosScheduler", "num_train_timesteps": 1000, "stages": STAGES,
                  "stage_range": [0, 1 / 3, 2 / 3, 1], "gamma": 1 / 3, "scheduler_type": "unipc", "solver_order": 2,
                  "use_dynamic_shifting": True, "time_shift_type": "exponential"}
MODEL_INDEX = model_index(
    "HeliosPyramidPipeline",
    scheduler="diffusers:HeliosScheduler", text_encoder="transformers:UMT5EncoderModel",
    tokenizer="transformers:T5TokenizerFast", transformer="diffusers:HeliosTransformer3DModel",
    vae="diffusers:AutoencoderKLWan", is_cfg_zero_star=True, is_distilled=False,
)
# Sizes are multiples of 16 * 2^(stages - 1) = 64: one 64x64 chunk, 2 steps per stage (the first stage's two are the
# ones CFG-Zero* zeroes).
DEMO_GEOMETRY = Geometry(spatial_multiple=GEOMETRY.spatial_multiple << (STAGES - 1),
                         temporal_factor=GEOMETRY.temporal_factor)
DEMO_DEFAULTS = dataclasses.replace(PYRAMID_DEFAULTS, height=64, width=64, num_frames=33, fps=8,
                                    num_inference_steps=2 * STAGES)


def demo_card() -> ModelCard:
    return helios_demo_card(DEMO_ID, DEMO_DEFAULTS, "Helios-Mid's pyramid (three stages, CFG-Zero*) on history-"
                            "conditioned chunks at a tiny size, random weights", DEMO_NOTE, geometry=DEMO_GEOMETRY,
                            notes=(PYRAMID_NOTE, ZERO_STAR_NOTE))


def write_demo_checkpoint(folder: Path) -> None:
    """A HeliosPyramidPipeline folder."""
    write_helios_demo(folder, DEMO_SEED, DEMO_SCHEDULER, MODEL_INDEX)


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint).ensure
