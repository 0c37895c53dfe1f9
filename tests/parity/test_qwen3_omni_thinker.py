"""Qwen3-Omni's thinker (our MoE decoder on the paged KV pool) against transformers'
Qwen3OmniMoeForConditionalGeneration on two tiny random configs (tests/helpers/qwen3_omni_checkpoints.py):
greedy chat ids equal `generate`'s, alone and as concurrent chats batched into shared decode forwards, and the
paged decoder's logits (prefill, then token by token) within LOGITS of the reference forward's."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.helpers.qwen3_omni_checkpoints import THINKERS, load_reference, write_tiny_thinker
from vidloom.core.chat import build_chat_request
from vidloom.generator import VideoGenerator
from vidloom.families.qwen3_omni.program import eos_ids
from vidloom.layers.rotary import text_positions
from vidloom.runtime.async_engine import AsyncEngine
from vidloom.runtime.paged_kv import KVLayout, PagedKVPool

# float32 on both sides; the expert sums and attention reductions run in another order than the reference's
# (measured through the pool: max |diff| 7.7e-6 on moe-a, 9.5e-6 on moe-b, against logits up to 22 and 30).
LOGITS = 1e-4
MAX_TOKENS = 12
PROMPTS = ("tell me about kites in one sentence please", "the quick brown fox", "hello world! 1 2 3")


@pytest.fixture(scope="module", params=THINKERS, ids=lambda spec: spec.name)
def tiny(request, tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the reference is far slower with two threads on a shared CPU
    folder = write_tiny_thinker(tmp_path_factory.mktemp(request.param.name), request.param)
    yield folder, VideoGenerator.from_pretrained(str(folder), device="cpu"), load_reference(folder)
    torch.set_num_threads(threads)


def _messages(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "you are a helpful assistant"}, {"role": "user", "content": text}]


def _reference_ids(gen: VideoGenerator, reference, text: str) -> list[int]:
    tokenizer = gen.engine.instance["tokenizer"]
    prompt = tokenizer.apply_chat_template(_messages(text), add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    with torch.inference_mode():
        out = reference.generate(prompt["input_ids"], attention_mask=prompt["attention_mask"], return_audio=False,
                                 thinker_max_new_tokens=MAX_TOKENS, thinker_do_sample=False,
                                 thinker_eos_token_id=list(eos_ids(tokenizer)))
    return out[0, prompt["input_ids"].shape[1]:].tolist()


def test_greedy_chat_ids_equal_generate(tiny):
    _, gen, reference = tiny
    for text in PROMPTS[:2]:
        ours = list(gen.chat(_messages(text), max_tokens=MAX_TOKENS, temperature=0.0).token_ids)
        assert ours == _reference_ids(gen, reference, text)
        assert len(set(ours)) > 3  # a reply that moves: the comparison is not of one repeated token


def test_concurrent_chats_share_decode_forwards_and_equal_generate(tiny):
    _, gen, reference = tiny
    thinker = gen.engine.instance["thinker"]
    widths: list[int] = []  # sequences per thinker forward
    hook = thinker.register_forward_hook(lambda m, a, kw, out: widths.append(kw["kv"].key_slots.shape[0]),
                                         with_kwargs=True)
    engine = AsyncEngine(gen.engine)
    requests = [build_chat_request(_messages(t), temperature=0, max_tokens=MAX_TOKENS) for t in PROMPTS]

    async def collect(request):
        return [item async for item in engine.chat(request)][-1]

    async def main():
        return await asyncio.gather(*(collect(r) for r in requests))

    try:
        results = asyncio.run(main())
    finally:
        hook.remove()
        engine.close()
    assert max(widths) > 1, widths  # decode steps of several chats ran as one forward
    for text, result in zip(PROMPTS, results):
        assert list(result.token_ids) == _reference_ids(gen, reference, text)


def test_paged_logits_within_tolerance(tiny):
    _, gen, reference = tiny
    thinker = gen.engine.instance["thinker"]
    config = thinker.config
    pool = PagedKVPool(KVLayout(config.num_hidden_layers, config.num_key_value_heads, config.head_dim, num_blocks=4),
                       torch.device("cpu"), torch.float32)
    pool.allocator.reserve("seq", 64)
    ids = torch.randint(0, config.vocab_size, (24,), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        theirs = reference.thinker(input_ids=ids[None]).logits[0]
        # prefill 16 tokens, then one token per forward, each through the pool
        steps = [(0, 16)] + [(n, 1) for n in range(16, 24)]
        ours = torch.cat([thinker(ids[start:start + count], text_positions(start, count),
                                  kv=pool.batch([("seq", start, count)], thinker.attention_scale))
                          for start, count in steps])
    assert (ours - theirs).abs().max().item() <= LOGITS
