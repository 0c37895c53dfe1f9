"""Every published config in the corpus loads through the public API and runs one step; every registered card
loads the folder of its own source repo from an offline Hugging Face cache.

tests/fixtures/published/<org>/<repo> holds the real model_index.json and component configs (SOURCES.md says
where each comes from); tests/helpers/published.py scales only their size keys and writes random weights, so a
config key the loaders refuse fails here with the loader's own error, naming the file and key.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers.published import build_scaled, corpus_repos, hub_cache, read_json
from tests.helpers.wan_i2v_checkpoints import make_image
from vidloom import registry
from vidloom.core.card import ModelCard
from vidloom.generator import VideoGenerator

REPOS = corpus_repos()
MIN_SIDE = 32  # the smallest output side the tiny CLIP path takes comfortably


@pytest.fixture(scope="module")
def scaled_dir(tmp_path_factory):
    """repo id -> its scaled folder, built once per module (cards and folders share them)."""
    root = tmp_path_factory.mktemp("published")
    built: dict[str, Path] = {}

    def get(repo: str) -> Path:
        if repo not in built:
            built[repo] = build_scaled(repo, root / repo)
        return built[repo]

    return get


def min_steps(folder: Path, card: ModelCard) -> int:
    """One step, except where the checkpoint allows no fewer: a distilled card's step list, or 2 when the
    scheduler has a shift_terminal (one step cannot stretch the schedule to it; the runtime refuses it)."""
    if card.recipe.timesteps:
        return len(card.recipe.timesteps)
    scheduler = folder / "scheduler" / "scheduler_config.json"
    index = folder / "model_index.json"
    if index.is_file() and read_json(index).get("_class_name") == "HeliosPyramidPipeline":
        return int(read_json(scheduler).get("stages", 3))  # one step per pyramid stage
    return 2 if scheduler.is_file() and read_json(scheduler).get("shift_terminal") else 1


def one_step_request(card: ModelCard, folder: Path) -> dict:
    """The smallest request `card` accepts: the fewest steps, the smallest size and frame count (or seconds)."""
    steps = min_steps(folder, card)
    if card.audio is not None:  # audio-only: a short clip, no size or frames
        return dict(seconds=max(card.audio.min_seconds, 0.5), num_inference_steps=steps, seed=0)
    # Two latent patches a side: some VAEs (LTX-2's) decode no fewer than 2x2 latents.
    side = max(2 * card.geometry.spatial_multiple, MIN_SIDE)
    fields: dict = dict(height=side, width=side, seed=0, num_inference_steps=steps)
    if card.optional_fields is not None and "height" not in card.optional_fields:  # the image sets the size
        del fields["height"], fields["width"]
    if "t2i" not in {task.value for task in card.tasks}:
        fields["num_frames"] = card.geometry.temporal_factor + 1
    for i, name in enumerate(("image", "last_image")):
        if name in card.required_inputs:
            fields[name] = make_image(side, side, seed=i)
    if "camera" in card.request_blocks:  # camera-controlled (SANA-WM): walk forward, pinhole at the centre
        fields.update(camera=f"w-{fields['num_frames'] - 1}", intrinsics=[side, side, side / 2, side / 2],
                      image=make_image(side, side, seed=0))
    return fields


def _runs_one_step(generator: VideoGenerator, folder: Path) -> None:
    if not generator.card.tasks:  # a chat model (Qwen2.5-Omni): two decode steps, and a few speech codes
        reply = generator.chat([{"role": "user", "content": "hello"}], max_tokens=2, seed=0)
        assert reply.completion_tokens == 2
        if "talker" in generator.card.loops:
            speech = generator.speak("hello", max_audio_tokens=4, seed=0)
            assert speech.audio.size > 0 and np.isfinite(speech.audio).all()
        return
    out = generator.generate("a red fox in the snow", **one_step_request(generator.card, folder))
    if generator.card.audio is not None:
        assert out.audio is not None and out.audio.size > 0 and np.isfinite(out.audio).all()
    else:
        assert out.frames.ndim == 4 and out.frames.shape[-1] == 3
        assert np.isfinite(out.frames.astype(np.float64)).all()


def test_the_corpus_lists_every_registered_source_repo():
    sources = {registry.resolve_card(card_id).source for card_id in registry.CARDS}
    missing = sorted(s.removeprefix("hf:") for s in sources if s.startswith("hf:") and s[3:] not in REPOS)
    assert not missing, f"registered cards whose source repo has no folder in tests/fixtures/published: {missing}"
    for repo in REPOS:  # a diffusers folder, or a transformers one (config.json naming its architectures)
        folder = Path(__file__).parents[1] / "fixtures" / "published" / repo
        assert (folder / "model_index.json").is_file() or "architectures" in read_json(folder / "config.json")


@pytest.mark.parametrize("repo", REPOS)
def test_published_folder_loads_and_runs_one_step(repo, scaled_dir):
    folder = scaled_dir(repo)
    generator = VideoGenerator.from_pretrained(folder, device="cpu", dtype="float32")
    try:
        _runs_one_step(generator, folder)
    finally:
        generator.close()


HF_CARDS = sorted(card_id for card_id in registry.CARDS
                  if registry.resolve_card(card_id).source.startswith("hf:"))


@pytest.mark.parametrize("card_id", HF_CARDS)
def test_registered_card_loads_its_source_repo_offline(card_id, scaled_dir, tmp_path, monkeypatch):
    import huggingface_hub.constants

    repo = registry.resolve_card(card_id).source.removeprefix("hf:")
    cache = tmp_path / "hub"
    folder = hub_cache(repo, scaled_dir(repo), cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    # huggingface_hub reads HF_HUB_CACHE when it is first imported; snapshot_download reads this at call time.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    generator = VideoGenerator.from_pretrained(card_id, device="cpu", dtype="float32")
    try:
        assert generator.card.model_id == card_id
        _runs_one_step(generator, folder)
    finally:
        generator.close()
