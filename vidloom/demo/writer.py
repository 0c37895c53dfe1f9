"""A demo checkpoint as a table: the weight folders it holds, written in order under one seed.

A demo declares its parts (folder, how to build the module, name map, config, how its zero-initialised
weights are filled) and `write_parts` writes them. Each module is built when its turn comes, so the draws
from the global seed keep the order the demo's files were first written in (the bytes stay the same).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from pathlib import Path
from typing import Any, Callable

import torch

from vidloom.demo.cache import fill_zeros, write_json
from vidloom.loading.name_map import NameMap
from vidloom.loading.safetensors_io import save_weights

OWN_CONFIG = None  # Part.config: write the module's own `config.to_diffusers()`


@dataclasses.dataclass(frozen=True)
class Part:
    """One weights folder of a demo checkpoint."""

    folder: str  # the component's sub-folder, e.g. "transformer"
    build: Callable[[], torch.nn.Module]  # called at write time, after the previous part is saved
    name_map: NameMap | None  # None: the module's own `name_map` attribute
    config: dict[str, Any] | None = OWN_CONFIG  # written as config.json
    fill_std: float | None = 0.02  # zero-initialised weights get N(0, fill_std); None leaves them
    latent_seed: int | None = None  # draw the module's latents_mean/std buffers from this seed
    latent_buffers: tuple[str, str] = ("latents_mean", "latents_std")
    scale: tuple[tuple[str, float], ...] = ()  # (parameter-name pattern, factor): see `scale_parameters`


def write_parts(folder: Path, parts: tuple[Part, ...] | list[Part]) -> None:
    """Every part into `folder/<part.folder>`, in order."""
    for part in parts:
        write_part(folder, part)


def write_part(folder: Path, part: Part) -> torch.nn.Module:
    module = part.build()
    if part.fill_std is not None:
        fill_zeros(module, part.fill_std)
    scale_parameters(module, part.scale)
    if part.latent_seed is not None:
        draw_latent_stats(module, torch.Generator().manual_seed(part.latent_seed), *part.latent_buffers)
    target = folder / part.folder
    save_weights(module, target, module.name_map if part.name_map is None else part.name_map)
    write_json(target / "config.json", module.config.to_diffusers() if part.config is None else part.config)
    return module


def scale_parameters(module: torch.nn.Module, scale: tuple[tuple[str, float], ...]) -> None:
    """Multiply each parameter whose name matches a pattern (fnmatch, our module's names) by its factor.

    Default-initialised layers shrink what passes through them (a Linear's weights have std 1/sqrt(3*fan_in)), and
    attention over a padded text averages the prompt's few tokens with hundreds of identical padding ones: in a
    random demo the text then barely reaches the output. The demos scale up the layers that carry it (attention
    logits to the text, text values, attention output) so a prompt, a negative prompt and the guidance visibly move
    the frames, as they do in a trained model (tests/integration/test_demo_conditioning.py measures it).
    """
    if not scale:
        return
    with torch.no_grad():
        for name, param in module.named_parameters():
            factors = [factor for pattern, factor in scale if fnmatch.fnmatchcase(name, pattern)]
            if factors:
                param.mul_(math.prod(factors))


def draw_latent_stats(module: torch.nn.Module, generator: torch.Generator, mean: str, std: str) -> None:
    """Non-trivial latent statistics in the module's buffers, so (de)normalisation is exercised as a real one is."""
    with torch.no_grad():
        for name, buffer in module.named_buffers():
            if name == mean:
                buffer.copy_(0.3 * torch.randn(buffer.shape, generator=generator))
            elif name == std:
                buffer.copy_(0.5 + torch.rand(buffer.shape, generator=generator))


def latent_stats_config(seed: int, z_dim: int) -> dict[str, list[float]]:
    """Wan-VAE latent statistics for the VAE's config (its normalisation reads them from there)."""
    g = torch.Generator().manual_seed(seed)
    return {"latents_mean": (torch.randn(z_dim, generator=g) * 0.5).tolist(),
            "latents_std": (torch.rand(z_dim, generator=g) * 2 + 0.5).tolist()}


def write_t5_encoder(folder: Path, vocab_size: int, config: dict[str, Any], seed: int, umt5: bool = True) -> None:
    """A T5 (or UMT5) encoder built by transformers from `config`, random weights from `seed`."""
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    config_class, model_class = (UMT5Config, UMT5EncoderModel) if umt5 else (T5Config, T5EncoderModel)
    built = config_class(vocab_size=vocab_size, **config)
    torch.manual_seed(seed)
    model_class(built).save_pretrained(str(folder))


def write_pipeline_files(folder: Path, scheduler: dict[str, Any], model_index: dict[str, Any],
                         tokenizer: Any = None, tokenizer_folder: str = "tokenizer") -> None:
    """The folder's scheduler config, model_index.json and (when given) its tokenizer."""
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder / tokenizer_folder))
    write_json(folder / "scheduler" / "scheduler_config.json", scheduler)
    write_json(folder / "model_index.json", model_index)


def model_index(pipeline: str, **entries: Any) -> dict[str, Any]:
    """A model_index.json: `_class_name` first, then the entries in order; a "library:Class" string is a
    component ([library, Class]), any other value is written as it is (flags, [None, None] for an absent one)."""
    return {"_class_name": pipeline,
            **{key: value.split(":") if isinstance(value, str) else value for key, value in entries.items()}}
