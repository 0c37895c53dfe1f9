"""Attention backend registry: explicit names, load-time failures, and the function reaching every block."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch

from vidloom.core.errors import DeployError
from vidloom.layers.attention import ATTENTION_BACKENDS, DEFAULT_SDPA, attention, resolve_attention, resolve_sdpa_scope
from vidloom.models.wan.transformer import WanTransformer
from vidloom.models.wan.transformer_config import WanTransformerConfig

CUDA = torch.device("cuda")  # a device object only: resolve_attention never allocates on it


def _qkv(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 7, 3, 8, generator=g) for _ in range(3))  # type: ignore[return-value]


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # Attention written out in [B, S, H, D]: softmax(q k^T / sqrt(d)) v per head.
    scores = torch.einsum("bshd,blhd->bhsl", q, k) / q.shape[-1] ** 0.5
    return torch.einsum("bhsl,blhd->bshd", scores.softmax(-1), v)


def test_sdpa_is_the_default_and_matches_written_out_attention():
    q, k, v = _qkv()
    fn = resolve_attention("sdpa", torch.device("cpu"), torch.float32)
    assert fn is attention
    # fp32 on CPU: SDPA's fused kernel reorders the sums; observed ~1e-7.
    assert torch.allclose(fn(q, k, v), _reference(q, k, v), atol=1e-6)


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(DeployError, match="unknown attention backend 'xformers'; known: sdpa, math, flash, sage"):
        resolve_attention("xformers", torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("name", ["flash", "sage"])
def test_cuda_kernels_refuse_cpu(name):
    with pytest.raises(DeployError, match=f"'{name}' needs a CUDA device; this model is loading on cpu"):
        resolve_attention(name, torch.device("cpu"), torch.bfloat16)


@pytest.mark.parametrize("name", ["flash", "sage"])
def test_missing_package_is_named(name):
    module = ATTENTION_BACKENDS[name].kernel.partition(":")[0]
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    with pytest.raises(DeployError, match=f"needs the '{ATTENTION_BACKENDS[name].package}' package"):
        resolve_attention(name, CUDA, torch.bfloat16)


def _fake_kernels(monkeypatch) -> list[dict]:
    """FAKE kernels: stand-ins for flash_attn_func / sageattn that record their call and compute reference
    attention. They check only our adapters (argument layout, keywords, mask refusal), not the real
    kernels' numerics: those are unverified until tests/gpu/test_attention_kernels.py runs on a GPU
    with flash-attn / SageAttention installed."""
    calls: list[dict] = []

    def kernel(q, k, v, **kwargs):
        calls.append(kwargs)
        return _reference(q, k, v)

    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(flash_attn_func=kernel))
    monkeypatch.setitem(sys.modules, "sageattention", types.SimpleNamespace(sageattn=kernel))
    return calls


@pytest.mark.parametrize("name, kwargs", [("flash", {}), ("sage", {"tensor_layout": "NHD", "is_causal": False})])
def test_adapters_pass_our_layout_through(monkeypatch, name, kwargs):
    # Against FAKE kernels (see _fake_kernels): a pass here says nothing about the real kernels' output.
    calls = _fake_kernels(monkeypatch)
    fn = resolve_attention(name, CUDA, torch.bfloat16)
    q, k, v = _qkv()
    assert torch.equal(fn(q, k, v), _reference(q, k, v)) and calls == [kwargs]
    with pytest.raises(ValueError, match="does not take an attention mask"):
        fn(q, k, v, torch.ones(1, dtype=torch.bool))


def test_half_precision_kernels_refuse_float32(monkeypatch):
    _fake_kernels(monkeypatch)
    with pytest.raises(DeployError, match="'flash' runs in bfloat16, float16 only; this model computes in float32"):
        resolve_attention("flash", CUDA, torch.float32)


def test_transformer_calls_the_function_it_was_built_with():
    config = WanTransformerConfig(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
                                  text_dim=8, freq_dim=8, ffn_dim=16, num_layers=3)
    calls: list[tuple[int, ...]] = []

    def counting(q, k, v, mask=None):
        calls.append(tuple(k.shape))
        return attention(q, k, v, mask)

    torch.manual_seed(0)
    plain = WanTransformer(config).eval()
    counted = WanTransformer(config, counting).eval()
    counted.load_state_dict(plain.state_dict())
    latents, t, text = torch.randn(1, 4, 2, 4, 4), torch.tensor([500.0]), torch.randn(1, 5, 8)
    with torch.no_grad():
        assert torch.equal(counted(latents, t, text), plain(latents, t, text))
    # self- then cross-attention in each of the 3 blocks: keys are 8 video tokens, then 5 text tokens
    assert calls == [(1, 8, 2, 8), (1, 5, 2, 8)] * 3


@pytest.mark.parametrize("name", ["flash", "sage"])
def test_a_maskless_kernel_is_refused_at_load_for_a_model_that_masks_every_call(name):
    # LTX-2 passes its padded-text mask on every attention call: refused at load, not on every request.
    with pytest.raises(DeployError, match=f"attention_backend '{name}' takes no attention mask.*'sdpa'"):
        resolve_attention(name, CUDA, torch.bfloat16, masked=True)
    assert resolve_attention("sdpa", CUDA, torch.bfloat16, masked=True) is not None


def test_ltx2_refuses_flash_attention_at_load(tmp_path):
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator

    with pytest.raises(DeployError, match="attention_backend 'flash' takes no attention mask"):
        VideoGenerator.from_pretrained("ltx2-demo", device="cpu", cache_dir=tmp_path,
                                       deploy=DeployConfig(attention_backend="flash"))


def test_math_holds_sdpa_to_its_math_kernel_and_matches_sdpa():
    q, k, v = _qkv()
    mask = torch.rand(1, 1, 7, 7, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[..., 0] = True  # every query keeps a key
    flags: list[bool] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        flags.append(torch.backends.cuda.flash_sdp_enabled())
        return real(*args, **kwargs)

    fn = resolve_attention("math", torch.device("cpu"), torch.float32, masked=True)
    assert fn is not attention
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
        out = fn(q, k, v, mask)
        plain = attention(q, k, v, mask)
    assert flags == [False, True]  # held to math inside the call only, restored after it
    # fp32 on CPU: the math kernel and the fused one order their sums differently; observed ~3e-7.
    assert torch.allclose(out, plain, atol=1e-6)


def test_sdpa_scopes_for_models_that_attend_through_kv_stores():
    assert resolve_sdpa_scope("sdpa", torch.device("cpu"), torch.float32) == DEFAULT_SDPA
    scope = resolve_sdpa_scope("math", torch.device("cpu"), torch.float32)
    with scope():
        assert not torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()
    for name in ("flash", "sage"):  # no masks: refused before any package or device check
        with pytest.raises(DeployError, match=f"attention_backend '{name}' takes no attention mask.*'sdpa', 'math'"):
            resolve_sdpa_scope(name, CUDA, torch.bfloat16)
    with pytest.raises(DeployError, match="unknown attention backend 'xformers'"):
        resolve_sdpa_scope("xformers", torch.device("cpu"), torch.float32)
