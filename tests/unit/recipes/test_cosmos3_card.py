"""The Cosmos3 chat card: detected from model_index.json, an ar_decode loop and no generation task."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vidloom import registry
from vidloom.core.card import InvalidCard, LoopSpec
from vidloom.core.errors import CheckpointError, InvalidRequest
from vidloom.generator import VideoGenerator
from vidloom.recipes.cosmos3.cards import card_from_checkpoint


def test_card_from_a_cosmos3_folder(cosmos3_dir: Path):
    card = card_from_checkpoint(cosmos3_dir)
    assert card.family == "cosmos3" and set(card.loops) == {"ar_decode"} and not card.tasks
    assert set(card.components) == {"transformer", "text_tokenizer"}
    assert card.context_window and card.context_window >= 2
    assert registry.PIPELINES["Cosmos3OmniPipeline"].endswith(":card_from_checkpoint")


def test_chat_card_rules(cosmos3_dir: Path):
    import dataclasses

    card = card_from_checkpoint(cosmos3_dir)
    with pytest.raises(InvalidCard, match="context_window"):
        dataclasses.replace(card, context_window=None)
    with pytest.raises(InvalidCard, match="serves no task"):
        dataclasses.replace(card, loops={"denoise": LoopSpec(samplers=("unipc",))},
                            recipe=dataclasses.replace(card.recipe, loop="denoise"))


def test_generation_on_a_chat_card_names_the_task(cosmos3_dir: Path):
    generator = VideoGenerator.from_pretrained(cosmos3_dir, device="cpu")
    with pytest.raises(InvalidRequest) as exc:
        generator.generate("a fox")
    assert exc.value.field == "task" and "only chat" in str(exc.value)


def test_missing_tokenizer_and_wrong_class_are_checkpoint_errors(cosmos3_dir: Path, tmp_path: Path):
    broken = tmp_path / "no-tokenizer"
    shutil.copytree(cosmos3_dir, broken)
    shutil.rmtree(broken / "text_tokenizer")
    with pytest.raises(CheckpointError, match="text_tokenizer"):
        VideoGenerator.from_pretrained(broken, device="cpu")
    index = json.loads((broken / "model_index.json").read_text())
    index["_class_name"] = "SomethingElse"
    (broken / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="Cosmos3OmniPipeline"):
        card_from_checkpoint(broken)
