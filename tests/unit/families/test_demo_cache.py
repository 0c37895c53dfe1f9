"""The shared demo writer: a demo folder appears whole or not at all, is written once, and merges modules."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from vidloom.core.errors import CheckpointError
from vidloom.loading.name_map import NameMap
from vidloom.demo.cache import ensure_written, fill_zeros, noise_note, save_merged
from vidloom.demo.tokenizer import train_t5_tokenizer, unigram_vocab
from vidloom.demo.writer import scale_parameters


def _writer(calls: list[str]):
    def write(folder):
        calls.append(folder.name)
        (folder / "weights.bin").write_bytes(b"x")
        (folder / "model_index.json").write_text("{}")
    return write


def test_written_once_then_reused(tmp_path):
    calls: list[str] = []
    first = ensure_written(tmp_path, "demo-v1", _writer(calls))
    again = ensure_written(tmp_path, "demo-v1", _writer(calls))
    assert first == again == tmp_path / "demo-v1" and len(calls) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-v1"]  # the staging folder is gone


def test_a_failed_write_leaves_no_folder_and_the_next_call_writes(tmp_path):
    def broken(folder):
        (folder / "half.bin").write_bytes(b"x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        ensure_written(tmp_path, "demo-v1", broken)
    assert list(tmp_path.iterdir()) == []  # no half-written demo for a reader to load
    calls: list[str] = []
    assert (ensure_written(tmp_path, "demo-v1", _writer(calls)) / "weights.bin").is_file() and calls


def test_fill_zeros_leaves_initialised_parameters_alone():
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    with torch.no_grad():
        layer.bias.zero_()
    weight = layer.weight.clone()
    fill_zeros(layer)
    assert torch.equal(layer.weight, weight) and layer.bias.abs().sum() > 0


def test_save_merged_writes_two_modules_in_checkpoint_names_and_refuses_a_clash(tmp_path):
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 3)
    text = NameMap((("text.weight", "weight"), ("text.bias", "bias")))  # (checkpoint, module) prefixes
    gen = NameMap((("gen.weight", "weight"), ("gen.bias", "bias")))
    save_merged(tmp_path / "t", ((a, text), (b, gen)))
    with safe_open(str(tmp_path / "t" / "diffusion_pytorch_model.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == ["gen.bias", "gen.weight", "text.bias", "text.weight"]
        assert torch.equal(f.get_tensor("gen.weight"), b.weight.detach())
    with pytest.raises(CheckpointError, match="two modules write tensor 'weight'"):
        save_merged(tmp_path / "u", ((a, NameMap(())), (b, NameMap(()))))


def test_noise_note_says_random_weights_and_noise_by_design():
    note = noise_note("x-demo", "Family", "org/real")
    assert "RANDOM weights" in note and "noise by design" in note and "org/real" in note


def test_each_demo_note_names_its_checkpoint_layout_and_a_hub_id():
    """The adapter's note reads as English, Qwen-Omni's names a transformers folder, every one a Hub id (#39)."""
    from vidloom import registry

    notes = {card.model_id: " ".join(card.notes) for card in registry.list_cards() if card.model_id.endswith("-demo")}
    assert "(the real CogVideoX architecture at a tiny size, run by diffusers through the adapter)" in notes[
        "diffusers-adapter-demo"]
    assert "a transformers checkpoint directory" in notes["qwen-omni-demo"]
    assert "e.g. Qwen/Qwen2.5-Omni-3B" in notes["qwen-omni-demo"] and "e.g. nvidia/Cosmos3-Nano" in notes["cosmos3-demo"]
    assert "a diffusers checkpoint directory" in notes["ltx2-demo"]


def test_unigram_vocab_covers_every_character_and_orders_by_score():
    vocab = unigram_vocab(["▁a", "▁cat", "▁cats", "▁at", "▁bat"], size=12, max_piece_len=3)
    pieces = [piece for piece, _ in vocab]
    assert len(vocab) == 12 and len(set(pieces)) == 12
    assert {"▁", "a", "b", "c", "s", "t"} <= set(pieces)  # every character, so no corpus word maps to <unk>
    assert "at" in pieces and "▁ca" in pieces  # seen 4 and 2 times
    assert "▁ba" not in pieces  # seen once: below min_count
    assert vocab == sorted(vocab, key=lambda item: (-item[1], item[0]))
    assert all(score < 0 for _, score in vocab)


def test_unigram_vocab_refuses_a_size_below_the_character_count():
    with pytest.raises(ValueError, match="size=3"):
        unigram_vocab(["▁abc"], size=3)


def test_demo_tokenizer_is_the_same_on_every_call():
    # The tokenizers UnigramTrainer it replaced gave a different vocabulary on each call, even in one process.
    first, second = train_t5_tokenizer(), train_t5_tokenizer()
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()
    ids = first("a red fox jumps over a frozen river").input_ids
    assert first.unk_token_id not in ids and ids[-1] == first.eos_token_id
    assert first.decode(ids, skip_special_tokens=True) == "a red fox jumps over a frozen river"


def test_scale_parameters_multiplies_the_matching_parameters_only():
    """Patterns are fnmatch over our names; factors of several matching patterns multiply."""
    torch.manual_seed(0)
    module = torch.nn.ModuleDict({"cross": torch.nn.Linear(2, 2), "self": torch.nn.Linear(2, 2)})
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    scale_parameters(module, (("*.weight", 2.0), ("cross.weight", 3.0)))
    after = dict(module.named_parameters())
    assert torch.equal(after["cross.weight"], before["cross.weight"] * 6.0)
    assert torch.equal(after["self.weight"], before["self.weight"] * 2.0)
    assert torch.equal(after["cross.bias"], before["cross.bias"]) and torch.equal(after["self.bias"], before["self.bias"])
