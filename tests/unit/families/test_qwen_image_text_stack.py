"""QwenImageText's stacking rule (#35): prompts of any lengths stack zero-padded at their end with a mask of their real
tokens; where the attention takes no mask (or the stream is sharded) only prompts of one length share a batch."""

from __future__ import annotations

import torch

from vidloom.families.qwen_image.loop import QwenImageText


def _text(length: int, pads: bool = True, seed: int = 0) -> QwenImageText:
    return QwenImageText(torch.randn(1, length, 4, generator=torch.Generator().manual_seed(seed)), pads=pads)


def test_texts_of_any_length_stack_padded_and_masked():
    short, long = _text(3, seed=1), _text(5, seed=2)
    assert short.batch_key() == long.batch_key()
    both = QwenImageText.stack([short, long])
    assert both.embeds.shape == (2, 5, 4) and torch.equal(both.embeds[0, :3], short.embeds[0])
    assert not both.embeds[0, 3:].any() and torch.equal(both.embeds[1], long.embeds[0])
    assert both.mask.tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    # A stacked batch stacks again (batched CFG over requests already stacked): masks carried, padded further.
    again = QwenImageText.stack([both, _text(6, seed=3)])
    assert again.mask.sum(dim=1).tolist() == [3, 5, 6]


def test_texts_of_one_length_stack_unmasked():
    assert QwenImageText.stack([_text(4, seed=1), _text(4, seed=2)]).mask is None


def test_texts_that_cannot_be_padded_stack_only_at_one_length():
    assert _text(3, pads=False).batch_key() != _text(5, pads=False).batch_key()
    assert _text(3, pads=False).batch_key() == _text(3, pads=False, seed=1).batch_key()
    assert _text(3, pads=False).batch_key() != _text(3).batch_key()
