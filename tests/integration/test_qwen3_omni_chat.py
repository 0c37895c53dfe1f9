"""Qwen3-Omni (the thinker, text out) as users reach it: the demo from a fresh cache, the OpenAI chat endpoint with
the official openai client (plain and streamed, equal to generate's greedy ids), its deploy features (a small KV
pool, the math attention kernel), and what it refuses by name (audio output, mask-less kernels); media parts:
test_qwen3_omni_media.py."""

from __future__ import annotations

import httpx
import pytest
import torch

from tests.helpers.qwen3_omni_checkpoints import THINKER_B, load_reference, write_tiny_thinker
from tests.helpers.servers import ThreadServer
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CacheBudgetExceeded, DeployError, InvalidRequest
from vidloom.families.qwen3_omni.program import eos_ids
from vidloom.generator import VideoGenerator
from vidloom.serving.config import ServeConfig

MESSAGES = [{"role": "user", "content": "tell me about kites"}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.set_num_threads(1)
    return write_tiny_thinker(tmp_path_factory.mktemp("q3") / "qwen3-omni-tiny", THINKER_B)


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    engine = VideoGenerator.from_pretrained(str(folder), device="cpu").engine
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("q3-data"), queue_size=8, graceful_shutdown_s=2)
    with ThreadServer(engine, config) as running:
        yield running


def test_the_demo_chats_from_a_fresh_cache(tmp_path):
    gen = VideoGenerator.from_pretrained("qwen3-omni-demo", device="cpu", cache_dir=tmp_path / "cache")
    first = gen.chat(MESSAGES, temperature=0.0, max_tokens=10)
    assert first.completion_tokens == 10 and first.text and len(set(first.token_ids)) > 3
    again = VideoGenerator.from_pretrained("qwen3-omni-demo", device="cpu", cache_dir=tmp_path / "cache")
    assert again.chat(MESSAGES, temperature=0.0, max_tokens=10).token_ids == first.token_ids
    card = gen.engine.instance.card
    assert card.family == "qwen3-omni" and card.speech is not None  # the demo speaks too (test_qwen3_omni_speech)


def test_openai_client_chat_plain_and_streamed_equal_generate(server, folder):
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    model = server.app.state.jobs.card.model_id
    reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10, temperature=0)
    stream = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10, temperature=0, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert reply.choices[0].message.content == streamed and reply.usage.completion_tokens == 10
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        ids = load_reference(folder).generate(prompt["input_ids"], attention_mask=prompt["attention_mask"],
                                              return_audio=False, thinker_max_new_tokens=10, thinker_do_sample=False,
                                              thinker_eos_token_id=list(eos_ids(tokenizer)))
    assert reply.choices[0].message.content == tokenizer.decode(ids[0, prompt["input_ids"].shape[1]:])


@pytest.mark.parametrize("extra,param", [
    ({"modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "wav"}}, "modalities"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]}, None),
])
def test_audio_output_and_media_parts_are_400s(server, extra, param):
    body = {"model": server.app.state.jobs.card.model_id, "messages": MESSAGES, **extra}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    if param is not None:
        assert r.json()["error"]["param"] == param


def test_a_small_kv_pool_bounds_the_chat(folder):
    gen = VideoGenerator.from_pretrained(str(folder), device="cpu", deploy=DeployConfig(kv_pool_tokens=32))
    assert gen.chat(MESSAGES, temperature=0.0, max_tokens=4).completion_tokens == 4
    with pytest.raises((CacheBudgetExceeded, InvalidRequest)):
        gen.chat(MESSAGES, temperature=0.0, max_tokens=64)


def test_math_attention_keeps_the_ids_and_mask_less_kernels_are_refused(folder):
    plain = VideoGenerator.from_pretrained(str(folder), device="cpu").chat(MESSAGES, temperature=0.0, max_tokens=8)
    math = VideoGenerator.from_pretrained(str(folder), device="cpu", deploy=DeployConfig(attention_backend="math"))
    assert math.chat(MESSAGES, temperature=0.0, max_tokens=8).token_ids == plain.token_ids
    with pytest.raises(DeployError, match="attention_backend 'flash' takes no attention mask"):
        VideoGenerator.from_pretrained(str(folder), device="cpu", deploy=DeployConfig(attention_backend="flash"))
