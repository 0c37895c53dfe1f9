"""The Cosmos3 card: detected from model_index.json; chat (ar_decode) always, generation (denoise) with a VAE."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.cosmos3_checkpoints import strip_generation
from vidloom import registry
from vidloom.core.card import InvalidCard, LoopSpec
from vidloom.core.errors import CheckpointError, InvalidRequest
from vidloom.core.request import Task
from vidloom.generator import VideoGenerator
from vidloom.families.cosmos3.cards import card_from_checkpoint


def _chat_only(cosmos3_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "chat-only"
    shutil.copytree(cosmos3_dir, folder)
    return strip_generation(folder)


def test_card_from_a_cosmos3_folder(cosmos3_dir: Path, tmp_path: Path):
    card = card_from_checkpoint(cosmos3_dir)
    assert card.family == "cosmos3" and set(card.loops) == {"ar_decode", "denoise"}
    assert card.tasks == {Task.T2V, Task.I2V} and card.inputs == {"image"} and "reason" in card.option_names
    assert set(card.components) == {"transformer", "text_tokenizer", "vae", "scheduler"}
    chat = card_from_checkpoint(_chat_only(cosmos3_dir, tmp_path))
    assert set(chat.loops) == {"ar_decode"} and not chat.tasks
    assert set(chat.components) == {"transformer", "text_tokenizer"}
    assert card.context_window and card.context_window >= 2
    assert registry.PIPELINES["Cosmos3OmniPipeline"].endswith(":card_from_checkpoint")


def test_chat_card_rules(cosmos3_dir: Path, tmp_path: Path):
    import dataclasses

    card = card_from_checkpoint(_chat_only(cosmos3_dir, tmp_path))
    with pytest.raises(InvalidCard, match="context_window"):
        dataclasses.replace(card, context_window=None)
    with pytest.raises(InvalidCard, match="serves no task"):
        dataclasses.replace(card, loops={"denoise": LoopSpec(samplers=("unipc",))},
                            recipe=dataclasses.replace(card.recipe, loop="denoise"))


def test_generation_on_a_chat_card_names_the_task(cosmos3_dir: Path, tmp_path: Path):
    generator = VideoGenerator.from_pretrained(_chat_only(cosmos3_dir, tmp_path), device="cpu")
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
