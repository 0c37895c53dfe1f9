"""Our Cosmos3 understanding pathway vs transformers' Cosmos3OmniForConditionalGeneration on the same weights.

Both read one diffusers-written Cosmos3OmniPipeline folder: we load `transformer/` through our name map,
the oracle gets the same tensors under its names (tests/helpers/cosmos3_checkpoints.py). Text prompts
only: the diffusers checkpoint carries no vision tower (the generation pathway reads VAE latents), so
the reasoner's image path would run random vision weights we never load; image prompts are refused
with InvalidRequest naming the content part (tested in tests/unit/runtime/test_chat_engine.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.cosmos3_checkpoints import build_reasoner
from vidloom.generator import VideoGenerator
from vidloom.layers.rotary import text_positions
from vidloom.families.cosmos3.load import load_text_model
from vidloom.loading.chat_tokenizer import load_chat_tokenizer

# fp32 on CPU: the same math in a different order (packed vs batched layout, our own RMSNorm/rotary)
# leaves ~1e-5 on logits of magnitude ~25; 1e-4 is the bound.
LOGITS_TOL = 1e-4
PROMPTS = ([{"role": "user", "content": "hello world, tell me a story about robots"}],
           [{"role": "system", "content": "you are a helpful assistant"},
            {"role": "user", "content": "what is in this picture?"},
            {"role": "assistant", "content": "a red fox"}, {"role": "user", "content": "the quick brown fox"}])


def _oracle(folder: Path):
    from diffusers import Cosmos3OmniTransformer

    tokenizer = load_chat_tokenizer(folder / "text_tokenizer")
    return build_reasoner(Cosmos3OmniTransformer.from_pretrained(folder / "transformer"), tokenizer), tokenizer


@torch.no_grad()
def test_logits_match_transformers(tiny_cosmos3_dir: Path):
    ours = load_text_model(tiny_cosmos3_dir / "transformer", torch.device("cpu"), torch.float32)
    reference, tokenizer = _oracle(tiny_cosmos3_dir)
    assert ours.config.vocab_size > len(tokenizer)  # padded vocabulary, as released
    for messages in PROMPTS:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        x = torch.tensor(ids)
        got = ours(x, text_positions(0, len(ids)))
        want = reference(input_ids=x[None]).logits[0]
        err = (got - want).abs().max().item()
        print(f"{tiny_cosmos3_dir.name}: {len(ids)} tokens, max |logit diff| {err:.2e}")
        assert err < LOGITS_TOL
        assert want.abs().max() > 5  # logits that move: a broken path could not hide under the tolerance


@torch.no_grad()
def test_greedy_decode_matches_generate(tiny_cosmos3_dir: Path):
    generator = VideoGenerator.from_pretrained(tiny_cosmos3_dir, device="cpu")
    reference, tokenizer = _oracle(tiny_cosmos3_dir)
    messages = PROMPTS[0]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    expected = reference.generate(input_ids=torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids):]
    result = generator.chat(messages, max_tokens=32, temperature=0)
    assert list(result.token_ids) == expected.tolist()
    assert len(set(result.token_ids)) > 4  # not a degenerate repeat that any model would produce
    assert result.prompt_tokens == len(ids)
    if result.finish_reason == "length":
        assert result.completion_tokens == 32
