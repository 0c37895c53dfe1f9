"""Reason-then-generate on Cosmos3: the written prompt is transformers' reasoner's greedy decode on the same
weights, and the generation that follows equals Cosmos3OmniPipeline run on that prompt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.cosmos3_checkpoints import build_reasoner
from vidloom import registry
from vidloom.core.errors import InvalidRequest
from vidloom.core.output import TextEvent
from vidloom.core.program import Program
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator, build_request
from vidloom.families.cosmos3.gen_program import generation_nodes
from vidloom.loading.chat_tokenizer import load_chat_tokenizer
from vidloom.families.cosmos3.program import build_program
from vidloom.families.cosmos3.reason import reasoner_request
from vidloom.runtime.engine import Engine

MAX_TOKENS = 12  # the reasoner's budget here (random weights rarely emit EOS)
FRAMES_TOL = 1e-4
KW = dict(num_frames=5, height=32, width=32, num_inference_steps=2, guidance_scale=3.0, fps=24, seed=4)


def _engine(generator: VideoGenerator) -> Engine:
    instance = generator.engine.instance
    loop = build_program(instance).chat_loop
    nodes = generation_nodes(instance, loop, reason_max_tokens=MAX_TOKENS)
    # The chat loop gives the engine its paged KV pool, where the reasoner's sequence lives.
    return Engine(instance, Program(nodes=nodes, inputs=frozenset({"request"}), outputs=("video", "reasoned_prompt"),
                                    chat_loop=loop))


@torch.no_grad()
def test_reason_then_generate_matches_reasoner_and_pipeline(tiny_cosmos3_dir: Path):
    from diffusers import Cosmos3OmniPipeline, Cosmos3OmniTransformer

    generator = VideoGenerator.from_pretrained(tiny_cosmos3_dir, device="cpu")
    engine = _engine(generator)
    request = GenerationRequest(prompt="a fox in the snow", reason=True, **KW)
    baseline = engine.caches.bytes_in_use
    events: list = []
    out = engine.run(request, on_event=events.append)
    assert engine.caches.bytes_in_use == baseline
    assert engine.decoder.stats()["kv_blocks_in_use"] == 0  # the reasoner's K/V blocks went back with the request
    assert any(getattr(e, "phase", None) == "reason" for e in events)
    # The text streamed as TextEvents, in order, is the written prompt, and all of it came before denoising.
    texts = [i for i, e in enumerate(events) if isinstance(e, TextEvent)]
    assert "".join(events[i].text for i in texts).strip() == out["reasoned_prompt"]
    first_denoise = next(i for i, e in enumerate(events) if getattr(e, "phase", None) == "denoise")
    assert texts and max(texts) < first_denoise

    tokenizer = load_chat_tokenizer(tiny_cosmos3_dir / "text_tokenizer")
    reasoner = build_reasoner(Cosmos3OmniTransformer.from_pretrained(tiny_cosmos3_dir / "transformer"), tokenizer)
    ids = build_program(generator.engine.instance).chat_loop.prompt(reasoner_request(request, MAX_TOKENS))
    want = reasoner.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False)[0, len(ids):]
    reasoned_ids = [t for i in texts for t in events[i].token_ids]  # each reasoning step's token, as streamed
    assert reasoned_ids == want.tolist()
    assert out["reasoned_prompt"] and out["reasoned_prompt"] != request.prompt

    pipe = Cosmos3OmniPipeline.from_pretrained(tiny_cosmos3_dir, enable_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    expected = pipe(out["reasoned_prompt"], num_frames=KW["num_frames"], height=KW["height"], width=KW["width"],
                    fps=KW["fps"], num_inference_steps=KW["num_inference_steps"], guidance_scale=KW["guidance_scale"],
                    generator=torch.Generator("cpu").manual_seed(KW["seed"]), output_type="np",
                    enable_safety_check=False).video
    diff = float(np.abs(out["video"] - np.asarray(expected)).max())
    print(f"{tiny_cosmos3_dir.name}: reasoned {len(reasoned_ids)} tokens, max |frame diff| {diff:.2e}")
    assert diff <= FRAMES_TOL
    plain = engine.run(GenerationRequest(prompt="a fox in the snow", **KW))
    assert plain["reasoned_prompt"] is None
    assert np.abs(plain["video"] - out["video"]).max() > 1e-3  # generation really used the written prompt


def test_reason_metadata_and_refusals(cosmos3_dir: Path, tiny_wan_dir: Path):
    generator = VideoGenerator.from_pretrained(cosmos3_dir, device="cpu")
    out = generator.generate("a fox", reason=True, num_frames=1, height=16, width=16, num_inference_steps=1)
    assert out.metadata["reasoned_prompt"]
    with pytest.raises(InvalidRequest) as exc:
        generator.generate("a fox", reason="yes", num_frames=1, height=16, width=16)  # type: ignore[arg-type]
    assert exc.value.field == "reason"
    with pytest.raises(InvalidRequest) as exc:  # a card without an ar_decode loop
        build_request(registry.resolve_card(tiny_wan_dir), "a fox", reason=True)
    assert exc.value.field == "reason" and "ar_decode" in str(exc.value)
