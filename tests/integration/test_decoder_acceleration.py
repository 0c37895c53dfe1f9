"""FP8, compile and attention backends on the AR decoders: the Qwen2.5-Omni thinker and talker, Cosmos3's backbone.

The runtime applies them written once: FP8 and compile through each decoder's compile units (every block's work
before and after attention, core.denoiser.CompileUnits), the attention backend through the SDPA scope the load
resolves (layers.attention.resolve_sdpa_scope). Tiny random checkpoints on CPU.

FP8 tolerance (CPU dequantizes each FP8 weight before its matmul, so this is the quantization error alone):
relative L2 of one 24-token prefill's logits against float32, measured on both tiny configs:

| config | decoder | bfloat16 | FP8    |
|--------|---------|----------|--------|
| omni-a | thinker | 0.0075   | 0.0378 |
| omni-a | talker  | 0.0090   | 0.0390 |
| omni-b | thinker | 0.0104   | 0.0544 |
| omni-b | talker  | 0.0111   | 0.0620 |

The bound is 0.09 (the worst seen, 0.062, plus half again): an FP8 weight keeps 3 mantissa bits, so each linear
moves its output by ~2-3% and seven linears a layer add up; bfloat16 (8 bits) moves it ~5x less.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers.cosmos3_checkpoints import COSMOS3_A, write_tiny_cosmos3
from tests.helpers.qwen_omni_checkpoints import OMNI_A, OMNI_B, write_tiny_omni
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
import vidloom.layers.grouped_attention as grouped_attention_module
from vidloom.layers.attention import DEFAULT_SDPA
from vidloom.layers.fp8 import FP8Linear
from vidloom.layers.rotary import text_positions
from vidloom.families.qwen_omni.load import load_talker, load_thinker, read_config
from vidloom.runtime.compile_buckets import compile_denoisers
from vidloom.runtime.fp8_denoisers import quantize_denoisers
from vidloom.runtime.paged_kv import ContiguousKV

CPU = torch.device("cpu")
FP8_REL_L2 = 0.09  # see the module docstring
MESSAGES = [{"role": "user", "content": "what is a kite?"}]
LINEARS_PER_BLOCK = 7  # q, k, v, o, gate, up, down


@pytest.fixture(scope="module")
def omni(tmp_path_factory) -> tuple[Path, VideoGenerator]:
    torch.set_num_threads(1)
    folder = write_tiny_omni(tmp_path_factory.mktemp("omni"), OMNI_A)
    return folder, VideoGenerator.from_pretrained(str(folder), device="cpu", dtype="float32")


def _load(folder: Path, **deploy: Any) -> VideoGenerator:
    return VideoGenerator.from_pretrained(str(folder), device="cpu", dtype="float32", deploy=DeployConfig(**deploy))


def _greedy(gen: VideoGenerator) -> tuple[list[int], np.ndarray]:
    chat = gen.chat(MESSAGES, temperature=0.0, max_tokens=12)
    speech = gen.speak("the kite rose over the dunes", voice="Ethan", seed=1, max_audio_tokens=10, greedy=True)
    return list(chat.token_ids), np.asarray(speech.audio)


# -- FP8 ---------------------------------------------------------------------------------------------------------

def test_fp8_quantizes_every_block_linear_and_keeps_embeddings_projection_and_heads(omni):
    folder, _ = omni
    gen = _load(folder, fp8_weights=True)
    for name in ("thinker", "talker"):
        decoder = gen.engine.instance[name]
        in_units = [m for unit in decoder.compile_units() for m in unit.modules()]
        assert sum(isinstance(m, FP8Linear) for m in in_units) == LINEARS_PER_BLOCK * len(decoder.blocks)
        assert not any(type(m) is torch.nn.Linear for m in in_units)
        assert type(decoder.head) is torch.nn.Linear and type(decoder.embed) is torch.nn.Embedding
        assert decoder.proj_in is None or type(decoder.proj_in) is torch.nn.Linear
    _, audio = _greedy(gen)
    assert len(audio) and np.isfinite(audio).all()


@pytest.mark.parametrize("spec", [OMNI_A, OMNI_B], ids=lambda s: s.name)
@pytest.mark.parametrize("name", ["thinker", "talker"])
def test_fp8_logits_stay_within_the_stated_tolerance_of_float32(spec, name, tmp_path_factory):
    folder = write_tiny_omni(tmp_path_factory.mktemp(spec.name), spec)
    config, loader = read_config(folder), {"thinker": load_thinker, "talker": load_talker}[name]
    plain, quantized = (loader(folder, config, CPU, torch.float32) for _ in range(2))
    assert quantize_denoisers({name: quantized}, CPU, torch.float32, spec.name) > 0  # the runtime's FP8 pass
    g = torch.Generator().manual_seed(0)
    positions = text_positions(0, 24)
    with torch.inference_mode():
        if name == "thinker":
            ids = torch.randint(0, plain.config.vocab_size, (24,), generator=g)
            ref, out = plain(ids, positions), quantized(ids, positions)
        else:
            embeds = torch.randn(24, plain.config.embedding_size, generator=g)
            ref, out = (m.head(m.hidden(embeds, positions)) for m in (plain, quantized))
    error = ((out - ref).norm() / ref.norm()).item()
    assert 0 < error < FP8_REL_L2, error


def test_fp8_matmul_path_quantizes_each_shared_input_once(omni, monkeypatch):
    """The GPU path (torch._scaled_mm, which has a CPU implementation; kernel forced, bfloat16): q/k/v read one
    quantized activation, gate/up another, o and down their own: four per layer. Logits moved 0.056 relative L2
    from float32 on omni-a (FP8 activations and bfloat16 on top of the weights' error); the same bound holds."""
    import vidloom.layers.fp8 as fp8

    folder, _ = omni
    config = read_config(folder)
    plain = load_thinker(folder, config, CPU, torch.float32)
    quantized = load_thinker(folder, config, CPU, torch.bfloat16)
    quantize_denoisers({"thinker": quantized}, CPU, torch.bfloat16, "omni")
    for module in quantized.modules():
        if isinstance(module, FP8Linear):
            module.kernel = "scaled_mm"
    quantized_rows: list[int] = []
    real = fp8.quantize_activation
    monkeypatch.setattr(fp8, "quantize_activation", lambda x: quantized_rows.append(x.shape[0]) or real(x))
    ids = torch.randint(0, plain.config.vocab_size, (24,), generator=torch.Generator().manual_seed(0))
    positions = text_positions(0, 24)
    with torch.inference_mode():
        ref, out = plain(ids, positions), quantized(ids, positions)
    assert quantized_rows == [24] * 4 * len(plain.blocks)
    error = ((out.float() - ref).norm() / ref.norm()).item()
    assert error < FP8_REL_L2, error


# -- compile -----------------------------------------------------------------------------------------------------

def test_compiled_decoders_decode_the_eager_tokens_and_codes(omni):
    folder, plain = omni
    ids, audio = _greedy(plain)
    compiled = _load(folder, compile=True, compile_backend="aot_eager")
    assert any(getattr(u, "_compiled_call_impl", None) for u in compiled.engine.instance["thinker"].compile_units())
    assert any(getattr(u, "_compiled_call_impl", None) for u in compiled.engine.instance["talker"].compile_units())
    compiled_ids, compiled_audio = _greedy(compiled)
    assert compiled_ids == ids
    assert np.array_equal(compiled_audio, audio)  # the same codes, so the same (seeded) waveform


def test_any_token_count_runs_on_two_graphs_per_unit_kind(omni):
    """Prompt lengths and decode batches vary every step: the units compile with a symbolic token axis (dynamo
    keeps a count of 1 apart), so five prefill lengths and single-token decodes cost two graphs per unit kind."""
    folder, _ = omni
    config = read_config(folder)
    thinker = load_thinker(folder, config, CPU, torch.float32)
    graphs: list[int] = []

    def counting(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(1)
        return gm.forward

    torch._dynamo.reset()
    compile_denoisers({"thinker": thinker}, counting, "omni")  # type: ignore[arg-type]
    with torch.inference_mode():
        for prompt in (2, 3, 5, 9, 17):
            kv = ContiguousKV(len(thinker.blocks), thinker.attention_scale)
            thinker(torch.arange(prompt), text_positions(0, prompt), kv)
            for step in range(2):
                thinker(torch.tensor([7]), text_positions(prompt + step, 1), kv)
    assert len(graphs) == 4, len(graphs)  # (pre-, post-attention) x (one token, more)


# -- attention backends ------------------------------------------------------------------------------------------

def _sdpa_calls(monkeypatch, caller: ModuleType | None = None) -> list[bool]:
    """Spy on PyTorch SDPA (every call, or only those of module `caller`): for each call, whether only its
    math kernel was allowed."""
    real, seen = F.scaled_dot_product_attention, []

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(not torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled())
        return real(*args, **kwargs)

    if caller is None:
        monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    else:
        monkeypatch.setattr(caller, "F", SimpleNamespace(scaled_dot_product_attention=spy))
    return seen


def test_sdpa_backend_is_the_default(omni):
    folder, plain = omni
    gen = _load(folder, attention_backend="sdpa")
    assert gen.engine.instance["thinker"].sdpa == DEFAULT_SDPA == gen.engine.instance["talker"].sdpa
    assert _greedy(gen)[0] == _greedy(plain)[0]


def test_math_backend_holds_every_decoder_attention_call_to_the_math_kernel(omni, monkeypatch):
    folder, plain = omni
    ids, audio = _greedy(plain)
    gen = _load(folder, attention_backend="math")
    calls = _sdpa_calls(monkeypatch)
    plain_ids, _ = _greedy(plain)
    assert calls and not any(calls)  # the default lets PyTorch pick its fused CPU kernel
    calls.clear()
    math_ids, math_audio = _greedy(gen)
    assert calls and all(calls)
    # float32: the math and fused kernels differ by ~3e-7 per call, far below what moves a greedy id here.
    assert math_ids == ids == plain_ids
    assert np.allclose(math_audio, audio, atol=1e-4)


@pytest.mark.parametrize("name", ["flash", "sage"])
def test_kernels_without_masks_are_refused_at_load_naming_attention_backend(omni, name):
    folder, _ = omni
    with pytest.raises(DeployError, match=f"attention_backend '{name}' takes no attention mask.*'sdpa', 'math'"):
        _load(folder, attention_backend=name)


@pytest.fixture(scope="module")
def cosmos3(tmp_path_factory) -> Path:
    return write_tiny_cosmos3(tmp_path_factory.mktemp("cosmos3") / "cosmos3", COSMOS3_A)


def test_cosmos3_math_backend_reaches_chat_prefill_and_generation(cosmos3, monkeypatch):
    request = GenerationRequest(prompt="a red fox jumps", negative_prompt="blurry", seed=3, height=32, width=32,
                                num_frames=9, num_inference_steps=2, guidance_scale=3.0, fps=16)
    plain = _load(cosmos3)
    frames, ids = plain.run(request).frames, plain.chat(MESSAGES, temperature=0.0, max_tokens=8).token_ids
    gen = _load(cosmos3, attention_backend="math")
    calls = _sdpa_calls(monkeypatch, grouped_attention_module)  # the backbone's and generation's attention (the
    math_frames = gen.run(request).frames                      # VAE's own is not the backend's)
    math_ids = gen.chat(MESSAGES, temperature=0.0, max_tokens=8).token_ids
    assert calls and all(calls)  # prompt prefill, generation blocks and chat decode
    assert math_ids == ids
    # float32 frames; kernel reordering moves a uint8 value by at most one step.
    assert np.abs(math_frames.astype(int) - frames.astype(int)).max() <= 1


@pytest.mark.parametrize("name", ["flash", "sage"])
def test_cosmos3_refuses_kernels_without_masks_at_load(cosmos3, name):
    with pytest.raises(DeployError, match=f"attention_backend '{name}' takes no attention mask"):
        _load(cosmos3, attention_backend=name)
