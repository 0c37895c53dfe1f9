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
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import environment, write_json  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vidloom.families.flux2 import blocks as flux2_blocks  # noqa: E402
from vidloom.families.flux2.transformer import Flux2Transformer, Flux2TransformerConfig  # noqa: E402
from vidloom.layers.attention import attention  # noqa: E402
from vidloom.layers.rms_norm import RMSNorm  # noqa: E402
from vidloom.loading.precision import cast_module  # noqa: E402
from vidloom.models.wan import transformer as wan_transformer  # noqa: E402
from vidloom.models.wan.transformer import WanTransformer  # noqa: E402
from vidloom.models.wan.transformer_config import WanTransformerConfig  # noqa: E402

CONFIGS = Path("/work/shared/published-configs")
WAN_CONFIG = CONFIGS / "FastWan2.1-T2V-1.3B-Diffusers/transformer/config.json"  # Wan2.1-T2V-1.3B's transformer
FLUX2_CONFIG = CONFIGS / "FLUX.2-klein-4B/transformer/config.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::convolution",
                      "aten::_convolution", "aten::mkldnn_convolution", "aten::_mkl_linear"})
COPY_OPS = frozenset({"aten::copy_", "aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous", "aten::cat",
                      "aten::stack", "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::view_as_real",
                      "aten::view_as_complex", "aten::type_as", "aten::resolve_conj"})


# ---------------------------------------------------------------------------
# FLOP counts (matmuls only: 2 * M * N * K each; elementwise work is not counted)
# ---------------------------------------------------------------------------


def _mm(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


def wan_flops(cfg: WanTransformerConfig, batch: int, grid: tuple[int, int, int], text_tokens: int) -> dict[str, int]:
    """Matmul FLOPs of one WanTransformer forward (T2V), by category."""
    d, s, lt = cfg.inner_dim, batch * grid[0] * grid[1] * grid[2], batch * text_tokens
    per_layer_proj = _mm(s, d, d) * 4 + _mm(s, d, d) * 2 + _mm(lt, d, d) * 2  # self q,k,v,out; cross q,out; cross k,v
    per_layer_attn = 2 * _mm(s, grid[0] * grid[1] * grid[2], d) + 2 * _mm(s, text_tokens, d)  # QK^T + PV, self+cross
    patch = cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2]
    time = _mm(batch, cfg.freq_dim, d) + _mm(batch, d, d) + _mm(batch, d, 6 * d)  # embedding MLP, modulation
    text = _mm(lt, cfg.text_dim, d) + _mm(lt, d, d)
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
    """One model at the bench's size: how to build it, its inputs, FLOPs and GEMM shapes."""

    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[torch.dtype], tuple[Any, ...]]
    keep_fp32: frozenset[str]
    flops: dict[str, int]
    gemms: dict[str, tuple[int, int, int]]
    heads: tuple[int, int, int]  # (heads, head_dim, self-attention tokens)
    size: dict[str, Any]


def wan_case(layers: int, grid: tuple[int, int, int], text_tokens: int) -> Case:
    cfg = dataclasses.replace(WanTransformerConfig.from_diffusers(json.loads(WAN_CONFIG.read_text())),
                              num_layers=layers)
    gen = torch.Generator().manual_seed(0)
    p = cfg.patch_size
    latents = torch.randn(1, cfg.in_channels, grid[0] * p[0], grid[1] * p[1], grid[2] * p[2], generator=gen)
    text = torch.randn(1, text_tokens, cfg.text_dim, generator=gen)
    tokens = grid[0] * grid[1] * grid[2]

    def inputs(dtype: torch.dtype) -> tuple[Any, ...]:
        return latents.to(dtype), torch.tensor([500.0]), text.to(dtype)

    return Case("wan2.1-t2v-1.3b", lambda: WanTransformer(cfg, attention_fn=attention), inputs,
                WanTransformer.KEEP_FP32, wan_flops(cfg, 1, grid, text_tokens), wan_gemms(cfg, tokens),
                (cfg.num_attention_heads, cfg.attention_head_dim, tokens),
                {"layers": f"{layers} of 30", "grid": grid, "video_tokens": tokens, "text_tokens": text_tokens})


def flux2_case(doubles: int, singles: int, side: int, text_tokens: int) -> Case:
    cfg = dataclasses.replace(Flux2TransformerConfig.from_diffusers(json.loads(FLUX2_CONFIG.read_text())),
                              num_double_layers=doubles, num_single_layers=singles)
    gen = torch.Generator().manual_seed(0)
    img = torch.randn(1, side * side, cfg.in_channels, generator=gen)
    txt = torch.randn(1, text_tokens, cfg.text_dim, generator=gen)
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    zeros = torch.zeros(side * side, dtype=torch.long)
    img_ids = torch.stack([zeros, rows.flatten(), cols.flatten(), zeros], dim=-1)
    txt_ids = torch.stack([torch.zeros(text_tokens, dtype=torch.long)] * 3 + [torch.arange(text_tokens)], dim=-1)

    def inputs(dtype: torch.dtype) -> tuple[Any, ...]:
        return img.to(dtype), txt.to(dtype), torch.tensor([0.75]), img_ids, txt_ids

    return Case("flux2-klein-4b", lambda: Flux2Transformer(cfg, attention_fn=attention), inputs,
                Flux2Transformer.KEEP_FP32, flux2_flops(cfg, 1, side * side, text_tokens),
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


def measure(case: Case, repeats: int, profile: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    model = case.build().eval()
    total = sum(case.flops.values())
    out: dict[str, Any] = {"size": case.size, "flops": case.flops, "gflop_per_step": round(total / 1e9, 2)}
    for dtype_name, dtype in DTYPES.items():  # float32 first: the bf16 cast is in place
        model = cast_module(model, dtype, case.keep_fp32)
        args = case.inputs(dtype)
        rates = matmul_rates(case.gemms, dtype, repeats)
        with torch.inference_mode():
            seconds, wall = best_seconds(lambda: model(*args), repeats)
            profiled = None
            if profile:
                with labels():
                    profiled = profile_step(lambda: model(*args))
        achieved = total / seconds / 1e9
        peak = max(rates.values())
        out[dtype_name] = {"matmul_gflops": rates, "peak_gflops": peak,
                           "sdpa_gflops": attention_rate(*case.heads, dtype, repeats), "step_cpu_s": round(seconds, 3),
                           "step_wall_s": round(wall, 3),
                           "achieved_gflops": round(achieved, 2), "ratio": round(achieved / peak, 3),
                           "profile": profiled}
        print(case.name, dtype_name, {k: out[dtype_name][k] for k in ("peak_gflops", "step_cpu_s", "achieved_gflops",
                                                                      "ratio")}, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one: CPU seconds = core seconds)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--wan-layers", type=int, default=2)
    parser.add_argument("--wan-grid", default="1,16,32", help="patch grid f,h,w (1,16,32: one 256x512 frame)")
    parser.add_argument("--flux2-blocks", default="1,1", help="double,single blocks")
    parser.add_argument("--flux2-side", type=int, default=16, help="image tokens per side (16: 256x256)")
    parser.add_argument("--text-tokens", type=int, default=256)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--output", default="cpu_efficiency.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    grid = tuple(int(v) for v in args.wan_grid.split(","))
    doubles, singles = (int(v) for v in args.flux2_blocks.split(","))
    cases = [wan_case(args.wan_layers, grid, args.text_tokens),  # type: ignore[arg-type]
             flux2_case(doubles, singles, args.flux2_side, args.text_tokens)]
    results = {case.name: measure(case, args.repeats, args.profile) for case in cases}
    summary = {name: {d: r[d]["ratio"] for d in DTYPES} for name, r in results.items()}
    print(json.dumps(summary))
    write_json(args.output, {
        "what": "achieved matmul FLOP rate of one DiT forward / the best F.linear rate at the model's GEMM shapes "
                "(best CPU seconds of --repeats each); FLOPs counted analytically",
        "environment": environment(), "torch_threads": torch.get_num_threads(),
        "loadavg_start": [round(v, 2) for v in load_start], "loadavg_end": [round(v, 2) for v in os.getloadavg()],
        "ratios": summary, "models": results,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
