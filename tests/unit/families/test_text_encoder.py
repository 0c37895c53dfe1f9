"""WanTextEncoder: prompt cleaning, padding zeros, the embedding cache and offload."""

from __future__ import annotations

import pytest
import torch

from vidloom.families.wan.demo import ensure_demo_checkpoint
from vidloom.models.wan.text import WanTextEncoder, clean_prompt


def _encoder(demo_cache, **options) -> WanTextEncoder:
    folder = ensure_demo_checkpoint(demo_cache)
    return WanTextEncoder.load(folder / "tokenizer", folder / "text_encoder", torch.device("cpu"), torch.float32, **options)


def test_clean_prompt_matches_reference_rules():
    assert clean_prompt("  a  &amp;amp; b\n\tc ") == "a & b c"


def test_padding_positions_are_exact_zeros(demo_cache):
    emb = _encoder(demo_cache).encode(["a cat"])
    assert emb.shape[1] == 512
    used = (emb[0].abs().sum(-1) > 0).sum().item()
    assert 0 < used < 10 and torch.all(emb[0, used:] == 0)


def test_cache_returns_identical_embeddings_and_skips_the_encoder(demo_cache):
    plain = _encoder(demo_cache)
    cached = _encoder(demo_cache, cache_size=4)
    prompts = ["a cat walks", "a dog runs"]
    first = cached.encode(prompts)
    assert (cached.cache.hits, cached.cache.misses) == (0, 2)
    calls = []
    cached.model.register_forward_hook(lambda *a: calls.append(1))
    again = cached.encode(list(reversed(prompts)))
    assert calls == [] and cached.cache.hits == 2
    assert torch.equal(again, first.flip(0))
    assert torch.equal(first, plain.encode(prompts))


def test_cache_evicts_least_recent(demo_cache):
    enc = _encoder(demo_cache, cache_size=1)
    enc.encode(["one"])
    enc.encode(["two"])
    enc.encode(["one"])
    assert enc.cache.hits == 0 and enc.cache.misses == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="offload only moves weights on an accelerator")
def test_offload_keeps_weights_on_cpu_between_calls(demo_cache):
    folder = ensure_demo_checkpoint(demo_cache)
    enc = WanTextEncoder.load(folder / "tokenizer", folder / "text_encoder", torch.device("cuda"), torch.float32, offload=True)
    out = enc.encode(["a cat"])
    assert out.device.type == "cuda"
    assert next(enc.model.parameters()).device.type == "cpu"


def test_offloaded_weights_use_a_device_copy_and_drop_it_afterwards(demo_cache):
    # On CPU the "device" copy is a second CPU tensor: the swap itself is what is tested here
    # (tests/gpu/ checks pinned memory and that the GPU copy is freed).
    from vidloom.text_encoders.offloaded_weights import OffloadedWeights

    enc = _encoder(demo_cache)
    reference = enc.encode(["a cat walks"])
    params = list(enc.model.parameters())
    host_ptrs = [p.data_ptr() for p in params]
    offloaded = OffloadedWeights(enc.model, torch.device("cpu"))
    seen: list[list[int]] = []
    enc.model.register_forward_hook(lambda *a: seen.append([p.data_ptr() for p in params]))
    enc._offloaded = offloaded
    assert torch.equal(enc.encode(["a cat walks"]), reference)
    assert seen and all(a != b for a, b in zip(seen[0], host_ptrs)), "the encode ran on the copy"
    assert [p.data_ptr() for p in params] == host_ptrs, "afterwards the module points at the host weights again"


def test_long_prompt_is_truncated_with_a_warning_giving_the_count(demo_cache):
    import warnings

    from vidloom.models.wan.text import PromptTruncated

    enc = _encoder(demo_cache)
    long_prompt = " ".join(["cat"] * 600)
    count = len(enc.tokenizer(long_prompt)["input_ids"])
    assert count > 512
    with pytest.warns(PromptTruncated, match=f"is {count} tokens; the text encoder reads the first 512 and ignores the other {count - 512}"):
        emb = enc.encode([long_prompt])
    assert emb.shape[1] == 512
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a prompt within the limit warns about nothing
        enc.encode(["a cat"])


def test_tokenizer_loads_without_sentencepiece(demo_cache):
    """sentencepiece is not a dependency: Wan's Diffusers checkpoints ship tokenizer.json, read by `tokenizers`."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    folder = ensure_demo_checkpoint(demo_cache)
    code = (
        "import sys; sys.modules['sentencepiece'] = None\n"  # any import of it now fails
        "from transformers import AutoTokenizer\n"
        f"tok = AutoTokenizer.from_pretrained({str(folder / 'tokenizer')!r})\n"
        "print(len(tok('a cat walks')['input_ids']))\n"
    )
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) > 1
