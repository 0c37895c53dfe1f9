"""How close one DiT step gets to this CPU's matmul rate: Wan2.1-1.3B and FLUX.2-klein-4B, float32 and bf16.

(a) Peak: `F.linear` at each model's largest GEMM shapes (QKV/out projections, FFN up and down) at the
step's token count, best of --repeats, in GFLOP per CPU second; the peak of a dtype is the best shape's rate.
(b) Achieved: the matmul FLOPs of one transformer forward, counted analytically from the config (2*M*N*K per
projection, QK^T and PV of every attention, the embeddings and the head; `wan_flops` / `flux2_flops`,
checked against torch's FlopCounterMode by tests/integration/test_bench_cpu_efficiency.py), divided by the
forward's best CPU time (one thread by default) through vidloom's own transformers (vidloom/models/wan,
vidloom/families/flux2), random weights (PyTorch's default init: activations O(1), far from float32
denormals), the published transformer configs (/work/shared/published-configs) at a reduced depth.
Ratio = achieved / peak of the dtype.
The SDPA attention's own rate at the step's self-attention length is reported beside the peak (at a real
video's token count attention holds most of the FLOPs, so its kernel decides the ratio there).
`--profile` adds one profiled step per model and dtype: self CPU time by category (GEMM, attention, norms,
RoPE, elementwise, copies/casts). Writes bench/results/cpu_efficiency.json (load average at start and end).

    python bench/cpu_efficiency.py --profile
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import diffusers
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_epilogue import ADD_SHAPES, GELU_SHAPES, epilogues, fused_off_on  # noqa: E402
from report import environment, write_json  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vidloom.families.flux2 import blocks as flux2_blocks  # noqa: E402
from vidloom.families.flux2.transformer import (  # noqa: E402
    FLUX2_TRANSFORMER_NAME_MAP, Flux2Transformer, Flux2TransformerConfig,
)
from vidloom.layers.attention import attention  # noqa: E402
from vidloom.layers.rms_norm import RMSNorm  # noqa: E402
from vidloom.loading.precision import cast_module  # noqa: E402
from vidloom.loading.safetensors_io import load_weights  # noqa: E402
from vidloom.models.wan import transformer as wan_transformer  # noqa: E402
from vidloom.models.wan.transformer import WanTransformer  # noqa: E402
from vidloom.models.wan.transformer_config import WAN_TRANSFORMER_NAME_MAP, WanTransformerConfig  # noqa: E402

CONFIGS = Path("/work/shared/published-configs")
WAN_CONFIG = CONFIGS / "FastWan2.1-T2V-1.3B-Diffusers/transformer/config.json"  # Wan2.1-T2V-1.3B's transformer
FLUX2_CONFIG = CONFIGS / "FLUX.2-klein-4B/transformer/config.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::convolution",
                      "aten::_convolution", "aten::mkldnn_convolution", "aten::_mkl_linear",
                      "mkldnn::_linear_pointwise"})  # the last: layers.fused_linear's linear + GELU
COPY_OPS = frozenset({"aten::copy_", "aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous", "aten::cat",
                      "aten::stack", "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::view_as_real",
                      "aten::view_as_complex", "aten::type_as", "aten::resolve_conj"})


# ---------------------------------------------------------------------------
# FLOP counts (matmuls only: 2 * M * N * K each; elementwise work is not counted)
# ---------------------------------------------------------------------------


def _mm(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


def wan_flops(cfg: WanTransformerConfig, batch: int, grid: tuple[int, int, int], text_tokens: int,
              prompt_prepared: bool = False) -> dict[str, int]:
    """Matmul FLOPs of one Wan T2V forward, by category: diffusers' WanTransformer3DModel and vidloom's given the
    text embeddings; `prompt_prepared`: vidloom's given `prepare_prompt`'s keys/values (projected once per
    request, layers.prompt_kv), so no text embedding and no cross-attention K/V projection in the step."""
    d, s, lt = cfg.inner_dim, batch * grid[0] * grid[1] * grid[2], batch * text_tokens
    cross_kv = 0 if prompt_prepared else _mm(lt, d, d) * 2
    per_layer_proj = _mm(s, d, d) * 4 + _mm(s, d, d) * 2 + cross_kv  # self q,k,v,out; cross q,out; cross k,v
    per_layer_attn = 2 * _mm(s, grid[0] * grid[1] * grid[2], d) + 2 * _mm(s, text_tokens, d)  # QK^T + PV, self+cross
    patch = cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2]
    time = _mm(batch, cfg.freq_dim, d) + _mm(batch, d, d) + _mm(batch, d, 6 * d)  # embedding MLP, modulation
    text = 0 if prompt_prepared else _mm(lt, cfg.text_dim, d) + _mm(lt, d, d)
    embed_head = _mm(s, cfg.in_channels * patch, d) + time + text + _mm(s, d, cfg.out_channels * patch)
    return {"projections": cfg.num_layers * per_layer_proj, "attention": cfg.num_layers * per_layer_attn,
            "ffn": cfg.num_layers * (_mm(s, d, cfg.ffn_dim) + _mm(s, cfg.ffn_dim, d)), "embed_head": embed_head}


def flux2_flops(cfg: Flux2TransformerConfig, batch: int, image_tokens: int, text_tokens: int) -> dict[str, int]:
    """Matmul FLOPs of one Flux2Transformer forward (no guidance embedding), by category."""
    d, mlp = cfg.dim, cfg.mlp_dim
    n, lt, s = batch * image_tokens, batch * text_tokens, batch * (image_tokens + text_tokens)
    attn = 2 * _mm(s, image_tokens + text_tokens, d)  # QK^T + PV over the joint sequence
    double_proj = 4 * (_mm(n, d, d) + _mm(lt, d, d))
    double_ffn = _mm(n, d, 2 * mlp) + _mm(n, mlp, d) + _mm(lt, d, 2 * mlp) + _mm(lt, mlp, d)
    # The single block's fused input projection: its 3*dim columns are QKV, its 2*mlp columns the FFN's up.
    single_proj = _mm(s, d, 3 * d) + _mm(s, d, d)
    single_ffn = _mm(s, d, 2 * mlp) + _mm(s, mlp, d)
    timing = (_mm(batch, cfg.timestep_channels, d) + _mm(batch, d, d) + _mm(batch, d, 6 * d) * 2
              + _mm(batch, d, 3 * d) + _mm(batch, d, 2 * d))
    embed_head = timing + _mm(n, cfg.in_channels, d) + _mm(lt, cfg.text_dim, d) + _mm(n, d, cfg.out_channels)
    doubles, singles = cfg.num_double_layers, cfg.num_single_layers
    return {"projections": doubles * double_proj + singles * single_proj, "attention": (doubles + singles) * attn,
            "ffn": doubles * double_ffn + singles * single_ffn, "embed_head": embed_head}


def wan_gemms(cfg: WanTransformerConfig, tokens: int) -> dict[str, tuple[int, int, int]]:
    """The largest (M, K, N) GEMMs of a Wan block at `tokens` tokens."""
    d = cfg.inner_dim
    return {"qkv/out": (tokens, d, d), "ffn up": (tokens, d, cfg.ffn_dim), "ffn down": (tokens, cfg.ffn_dim, d)}


def flux2_gemms(cfg: Flux2TransformerConfig, tokens: int) -> dict[str, tuple[int, int, int]]:
    """The largest (M, K, N) GEMMs of Flux2's blocks at `tokens` joint tokens."""
    d, mlp = cfg.dim, cfg.mlp_dim
    return {"qkv/out": (tokens, d, d), "ffn up": (tokens, d, 2 * mlp), "ffn down": (tokens, mlp, d),
            "single qkv+mlp": (tokens, d, 3 * d + 2 * mlp), "single out": (tokens, d + mlp, d)}


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


def best_seconds(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Best CPU seconds and best wall seconds of `repeats` calls after one warm-up.

    CPU seconds (this process, all its threads) are what the rates use: on a machine shared with other jobs
    they leave out the time spent waiting for a core, which wall time counts."""
    fn()
    cpu, wall = [], []
    for _ in range(repeats):
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start_wall)
    return min(cpu), min(wall)


def matmul_rates(gemms: dict[str, tuple[int, int, int]], dtype: torch.dtype, repeats: int) -> dict[str, float]:
    """GFLOP per CPU second of `F.linear` (what nn.Linear runs) per (M, K, N) shape."""
    rates = {}
    gen = torch.Generator().manual_seed(0)
    for name, (m, k, n) in gemms.items():
        x = torch.randn(m, k, generator=gen).to(dtype)
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
        rates[name] = round(_mm(m, k, n) / best_seconds(lambda: F.linear(x, w), repeats)[0] / 1e9, 2)
    return rates


def attention_rate(heads: int, head_dim: int, tokens: int, dtype: torch.dtype, repeats: int) -> float:
    """GFLOP per CPU second (QK^T + PV) of vidloom's SDPA attention over `tokens` tokens (self-attention)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, tokens, heads, head_dim, generator=gen).to(dtype) for _ in range(3))
    flops = 2 * _mm(tokens, tokens, heads * head_dim)
    return round(flops / best_seconds(lambda: attention(q, k, v), repeats)[0] / 1e9, 2)


@dataclasses.dataclass
class Case:
    """One model at the bench's size: the diffusers reference saved to a folder and vidloom's model loaded from
    it (same random weights), their inputs, how each runs a step, FLOPs and GEMM shapes."""

    name: str
    save_reference: Callable[[Path], None]
    build: Callable[[Path], torch.nn.Module]  # vidloom's, through its loader from the saved folder
    reference: Callable[[Path, torch.dtype], torch.nn.Module]  # diffusers' from_pretrained(torch_dtype=...)
    inputs: Callable[[torch.dtype], tuple[Any, ...]]
    step: Callable[[torch.nn.Module, tuple[Any, ...]], Callable[[], Any]]  # after the per-request preparation
    reference_step: Callable[[torch.nn.Module, tuple[Any, ...]], Callable[[], Any]]
    keep_fp32: frozenset[str]
    flops: dict[str, int]  # what vidloom's step runs
    reference_flops: dict[str, int]  # what the reference's step runs
    gemms: dict[str, tuple[int, int, int]]
    heads: tuple[int, int, int]  # (heads, head_dim, self-attention tokens)
    size: dict[str, Any]


def _save(model_cls: Any, config: dict[str, Any]) -> Callable[[Path], None]:
    def save(folder: Path) -> None:
        torch.manual_seed(0)  # PyTorch's default init: activations O(1), far from float32 denormals
        model_cls.from_config(config).save_pretrained(str(folder))
    return save


def _loaded(model: torch.nn.Module, name_map: Any) -> Callable[[Path], torch.nn.Module]:
    def build(folder: Path) -> torch.nn.Module:
        load_weights(model, folder, name_map)
        return model.eval()
    return build


def _reference(model_cls: Any) -> Callable[[Path, torch.dtype], torch.nn.Module]:
    return lambda folder, dtype: model_cls.from_pretrained(str(folder), torch_dtype=dtype).eval()


def wan_case(layers: int, grid: tuple[int, int, int], text_tokens: int) -> Case:
    config = {**json.loads(WAN_CONFIG.read_text()), "num_layers": layers}
    cfg = WanTransformerConfig.from_diffusers(config)
    gen = torch.Generator().manual_seed(0)
    p = cfg.patch_size
    latents = torch.randn(1, cfg.in_channels, grid[0] * p[0], grid[1] * p[1], grid[2] * p[2], generator=gen)
    text = torch.randn(1, text_tokens, cfg.text_dim, generator=gen)
    tokens = grid[0] * grid[1] * grid[2]

    def inputs(dtype: torch.dtype) -> tuple[Any, ...]:
        return latents.to(dtype), torch.tensor([500.0]), text.to(dtype)

    def step(model: torch.nn.Module, args: tuple[Any, ...]) -> Callable[[], Any]:
        prompt = model.prepare_prompt(args[2])  # once per request and CFG branch, as the loop does
        return lambda: model(args[0], args[1], prompt)

    return Case("wan2.1-t2v-1.3b", _save(diffusers.WanTransformer3DModel, config),
                _loaded(WanTransformer(cfg, attention_fn=attention), WAN_TRANSFORMER_NAME_MAP),
                _reference(diffusers.WanTransformer3DModel), inputs, step,
                lambda ref, args: lambda: ref(*args, return_dict=False), WanTransformer.KEEP_FP32,
                wan_flops(cfg, 1, grid, text_tokens, prompt_prepared=True), wan_flops(cfg, 1, grid, text_tokens),
                wan_gemms(cfg, tokens), (cfg.num_attention_heads, cfg.attention_head_dim, tokens),
                {"layers": f"{layers} of 30", "grid": grid, "video_tokens": tokens, "text_tokens": text_tokens})


def flux2_case(doubles: int, singles: int, side: int, text_tokens: int) -> Case:
    config = {**json.loads(FLUX2_CONFIG.read_text()), "num_layers": doubles, "num_single_layers": singles}
    cfg = Flux2TransformerConfig.from_diffusers(config)
    gen = torch.Generator().manual_seed(0)
    img = torch.randn(1, side * side, cfg.in_channels, generator=gen)
    txt = torch.randn(1, text_tokens, cfg.text_dim, generator=gen)
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    zeros = torch.zeros(side * side, dtype=torch.long)
    img_ids = torch.stack([zeros, rows.flatten(), cols.flatten(), zeros], dim=-1)
    txt_ids = torch.stack([torch.zeros(text_tokens, dtype=torch.long)] * 3 + [torch.arange(text_tokens)], dim=-1)

    def inputs(dtype: torch.dtype) -> tuple[Any, ...]:
        return img.to(dtype), txt.to(dtype), torch.tensor([0.75]), img_ids, txt_ids

    def reference_step(ref: torch.nn.Module, args: tuple[Any, ...]) -> Callable[[], Any]:
        return lambda: ref(hidden_states=args[0], encoder_hidden_states=args[1], timestep=args[2], img_ids=args[3],
                           txt_ids=args[4], return_dict=False)

    flops = flux2_flops(cfg, 1, side * side, text_tokens)  # joint attention: no per-request preparation
    return Case("flux2-klein-4b", _save(diffusers.Flux2Transformer2DModel, config),
                _loaded(Flux2Transformer(cfg, attention_fn=attention), FLUX2_TRANSFORMER_NAME_MAP),
                _reference(diffusers.Flux2Transformer2DModel), inputs, lambda model, args: lambda: model(*args),
                reference_step, Flux2Transformer.KEEP_FP32, flops, flops,
                flux2_gemms(cfg, side * side + text_tokens), (cfg.num_heads, cfg.head_dim, side * side + text_tokens),
                {"double_blocks": f"{doubles} of 5", "single_blocks": f"{singles} of 20",
                 "image_tokens": side * side, "text_tokens": text_tokens})


# ---------------------------------------------------------------------------
# Profile: self CPU time by category
# ---------------------------------------------------------------------------


def _labelled(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(f"vl:{label}"):
            return fn(*args, **kwargs)
    return wrapper


@contextlib.contextmanager
def labels() -> Iterator[None]:
    """Marks the per-token math of both models so the profile can attribute its ops (restored on exit)."""
    patches = [
        (wan_transformer, "apply_rope", "rope"), (wan_transformer, "rope_freqs", "rope tables"),
        (wan_transformer, "modulate", "norms"), (wan_transformer, "_layer_norm_fp32", "norms"),
        (wan_transformer, "gated_residual", "elementwise"), (flux2_blocks, "qk_norm_rope", "qk norm + rope"),
        (flux2_blocks, "norm_modulate", "norms"), (flux2_blocks, "gated_add", "elementwise"),
        (flux2_blocks, "swiglu", "elementwise"), (Flux2Transformer, "rope", "rope tables"),
    ]
    with contextlib.ExitStack() as stack:
        for module, name, label in patches:
            stack.enter_context(mock.patch.object(module, name, _labelled(getattr(module, name), label)))
        stack.enter_context(mock.patch.object(RMSNorm, "forward", _labelled(RMSNorm.forward, "norms")))
        yield


def _category(event: Any) -> str:
    """A labelled region's, or the nearest enclosing SDPA / GEMM call's, or one by the op's own name."""
    parent = event
    while parent is not None:
        if parent.name.startswith("vl:"):
            return parent.name[3:]
        if "scaled_dot_product" in parent.name:
            return "attention"
        if parent.name in GEMM_OPS or parent.name in ("aten::linear", "aten::conv3d"):
            return "GEMM"
        parent = parent.cpu_parent
    if "norm" in event.name:
        return "norms"
    return "copies/casts" if event.name in COPY_OPS else "elementwise"


def profile_step(forward: Callable[[], Any]) -> dict[str, Any]:
    """Self CPU ms by category over one forward, and the top ops outside GEMM."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        forward()
    by_category: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    for event in prof.events():
        category = _category(event)
        by_category[category] += event.self_cpu_time_total / 1e3
        if category != "GEMM":
            by_op[f"{category}: {event.name}"] += event.self_cpu_time_total / 1e3
    total = sum(by_category.values())
    return {"self_cpu_ms": {k: round(v, 1) for k, v in sorted(by_category.items(), key=lambda kv: -kv[1])},
            "share": {k: round(v / total, 3) for k, v in sorted(by_category.items(), key=lambda kv: -kv[1])},
            "top_non_gemm_ms": {k: round(v, 1) for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])[:12]}}


# ---------------------------------------------------------------------------
# Run
# ---------------------------------------------------------------------------


def measure(case: Case, repeats: int, profile: bool, dtypes: list[str]) -> dict[str, Any]:
    """Per dtype: the GEMM peak, vidloom's step and the reference's step (same weights, inputs and dtype), and
    the ceiling on a same-FLOPs speed-up: the reference's step seconds over vidloom's FLOPs at the peak rate."""
    total, ref_total = sum(case.flops.values()), sum(case.reference_flops.values())
    out: dict[str, Any] = {"size": case.size, "flops": case.flops, "gflop_per_step": round(total / 1e9, 2),
                           "reference_flops": case.reference_flops, "reference_gflop_per_step": round(ref_total / 1e9, 2)}
    with tempfile.TemporaryDirectory(prefix="cpu-efficiency-") as tmp:
        folder = Path(tmp)
        case.save_reference(folder)
        model = case.build(folder)
        for dtype_name in dtypes:  # float32 first: the bf16 cast is in place
            dtype = DTYPES[dtype_name]
            model = cast_module(model, dtype, case.keep_fp32)
            args = case.inputs(dtype)
            rates = matmul_rates(case.gemms, dtype, repeats)
            with torch.inference_mode():
                step = case.step(model, args)
                seconds, wall = best_seconds(step, repeats)
                profiled = None
                if profile:
                    with labels():
                        profiled = profile_step(step)
                reference = case.reference(folder, dtype)
                ref_seconds, ref_wall = best_seconds(case.reference_step(reference, args), repeats)
                del reference
                fused = fused_off_on(step, repeats + 1) if dtype == torch.float32 else None
            peak = max(rates.values())
            achieved, ref_achieved = total / seconds / 1e9, ref_total / ref_seconds / 1e9
            at_peak = total / 1e9 / peak  # vidloom's step if every FLOP ran at the peak rate
            out[dtype_name] = {
                "matmul_gflops": rates, "peak_gflops": peak, "sdpa_gflops": attention_rate(*case.heads, dtype, repeats),
                "step_cpu_s": round(seconds, 3), "step_wall_s": round(wall, 3), "achieved_gflops": round(achieved, 2),
                "ratio": round(achieved / peak, 3), "reference_step_cpu_s": round(ref_seconds, 3),
                "reference_step_wall_s": round(ref_wall, 3), "reference_achieved_gflops": round(ref_achieved, 2),
                "reference_ratio": round(ref_achieved / peak, 3), "speedup": round(ref_seconds / seconds, 3),
                "step_at_peak_s": round(at_peak, 3), "speedup_ceiling": round(ref_seconds / at_peak, 3),
                "fused_ffn_off_on": fused, "profile": profiled}
            print(case.name, dtype_name, {k: out[dtype_name][k] for k in (
                "peak_gflops", "step_cpu_s", "ratio", "reference_step_cpu_s", "reference_ratio", "speedup",
                "speedup_ceiling")}, os.getloadavg(), flush=True)
    return out


def cpu() -> dict[str, Any]:
    """The CPU's model name, torch's kernel capability (AVX2 / AVX512) and whether it has native bf16 matmul:
    rates are only comparable between runs on the same kind of core."""
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return {"model": model, "capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": [f for f in ("avx512_bf16", "amx_bf16") if f in flags]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one: CPU seconds = core seconds)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--wan-layers", type=int, default=2)
    parser.add_argument("--wan-grid", default="1,16,32", help="patch grid f,h,w (1,16,32: one 256x512 frame)")
    parser.add_argument("--flux2-blocks", default="1,1", help="double,single blocks")
    parser.add_argument("--flux2-side", type=int, default=16, help="image tokens per side (16: 256x256)")
    parser.add_argument("--text-tokens", type=int, default=512, help="512: what both pipelines pad prompts to")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--epilogue-rounds", type=int, default=5, help="bench/gemm_epilogue.py's rounds (0: skip)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--output", default="cpu_efficiency.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    grid = tuple(int(v) for v in args.wan_grid.split(","))
    doubles, singles = (int(v) for v in args.flux2_blocks.split(","))
    cases = [wan_case(args.wan_layers, grid, args.text_tokens),  # type: ignore[arg-type]
             flux2_case(doubles, singles, args.flux2_side, args.text_tokens)]
    dtypes = args.dtypes.split(",")
    results = {case.name: measure(case, args.repeats, args.profile, dtypes) for case in cases}
    summary = {name: {d: {k: r[d][k] for k in ("ratio", "reference_ratio", "speedup", "speedup_ceiling")}
                      for d in dtypes} for name, r in results.items()}
    print(json.dumps(summary))
    epilogue = epilogues(GELU_SHAPES, ADD_SHAPES, args.epilogue_rounds) if args.epilogue_rounds else None
    write_json(args.output, {
        "what": "achieved matmul FLOP rate of one DiT forward / the best F.linear rate at the model's GEMM shapes "
                "(best CPU seconds of --repeats each), vidloom's and the diffusers reference's (same weights, inputs, "
                "dtype); FLOPs counted analytically for what each side runs; speedup_ceiling = reference step seconds "
                "/ (vidloom FLOPs / peak rate)",
        "environment": environment(), "cpu": cpu(), "torch_threads": torch.get_num_threads(),
        "loadavg_start": [round(v, 2) for v in load_start], "loadavg_end": [round(v, 2) for v in os.getloadavg()],
        "summary": summary, "models": results, "gemm_epilogue": epilogue,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
