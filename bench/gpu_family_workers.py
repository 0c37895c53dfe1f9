"""The GPU check's other-family rows: one denoiser built at its published size with random weights, timed
forward by forward (bench/gpu_plan.py FAMILY_ROWS; run by `gpu_check.py --worker NAME`).

Each builder returns (model, a step function running one denoise step's forwards: the CFG pair batched
where the model takes a batch, two forwards where it runs one sample at a time). The first step warms up,
the second runs under torch's FlopCounterMode (the FLOPs it executes give MFU), the rest are timed.
Tests run the same code on tiny configs on CPU in float32.
"""

from __future__ import annotations

from typing import Any, Callable

from gpu_plan import FamilyRow

Step = Callable[[], Any]


def _random_(model: Any, seed: int) -> Any:
    """Fill every parameter with small random values (materialize leaves memory uninitialised)."""
    import torch

    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def _flux2(row: FamilyRow, device: Any, dtype: Any) -> tuple[Any, Step, dict[str, Any]]:
    import torch

    from vidloom.loading.precision import materialize
    from vidloom.families.flux2.transformer import Flux2Transformer, Flux2TransformerConfig

    config = Flux2TransformerConfig.from_diffusers(row.transformer)
    model = _random_(materialize(lambda: Flux2Transformer(config), device, dtype, Flux2Transformer.KEEP_FP32), 0)
    h, w, length = row.shape["height"] // 16, row.shape["width"] // 16, row.shape["text_tokens"]  # VAE 8x, 2x2
    img = torch.randn(1, h * w, config.in_channels, device=device, dtype=dtype)
    txt = torch.randn(1, length, config.text_dim, device=device, dtype=dtype)
    ids = torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w), torch.arange(1)).to(device)
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(length)).to(device)
    t = torch.full((1,), 0.5, device=device)
    return model, lambda: model(img, txt, t, ids, txt_ids), {"tokens": h * w, "text_tokens": length}


def _ltx2(row: FamilyRow, device: Any, dtype: Any) -> tuple[Any, Step, dict[str, Any]]:
    import torch

    from vidloom.loading.precision import materialize
    from vidloom.models.ltx2.rope import audio_positions, video_positions
    from vidloom.models.ltx2.transformer import LTX2Positions, LTX2Transformer, LTX2TransformerConfig

    config = LTX2TransformerConfig.from_diffusers(row.transformer)
    model = _random_(materialize(lambda: LTX2Transformer(config), device, dtype), 0)
    s = row.shape
    t_scale, spatial = config.vae_scale_factors[0], config.vae_scale_factors[1]
    frames, h, w = (s["num_frames"] - 1) // t_scale + 1, s["height"] // spatial, s["width"] // spatial
    # Audio latent frames for the clip's duration (mel frames per second / the audio VAE's time stride).
    audio = round(s["num_frames"] / s["fps"] * config.audio_sampling_rate / config.audio_hop_length
                  / config.audio_scale_factor)
    batch, length = 2, s["text_tokens"]
    video = torch.randn(batch, frames * h * w, config.in_channels, device=device, dtype=dtype)
    aud = torch.randn(batch, audio, config.audio_in_channels, device=device, dtype=dtype)
    text = torch.randn(batch, length, config.caption_channels, device=device, dtype=dtype)
    mask = torch.ones(batch, length, device=device)
    t = torch.full((batch,), 500.0, device=device)
    positions = LTX2Positions(
        video_positions(batch, frames, h, w, patch_t=1, patch=1, scale=config.vae_scale_factors,
                        causal_offset=config.causal_offset, fps=s["fps"], device=device),
        audio_positions(batch, audio, patch_t=1, scale=config.audio_scale_factor, causal_offset=config.causal_offset,
                        hop_length=config.audio_hop_length, sample_rate=config.audio_sampling_rate, device=device))
    step = lambda: model(video, aud, text, text, mask, t, t, t, positions)  # noqa: E731
    return model, step, {"tokens": frames * h * w, "audio_tokens": audio, "text_tokens": length}


def _far(row: FamilyRow, device: Any, dtype: Any) -> tuple[Any, Step, dict[str, Any]]:
    import torch

    from vidloom.loading.precision import materialize
    from vidloom.families.wan_causal.config import FarTransformerConfig
    from vidloom.families.wan_causal.layout import ChunkLayout
    from vidloom.families.wan_causal.transformer import FarTransformer
    from vidloom.families.wan_causal.loop import chunk_partition

    config = FarTransformerConfig.from_diffusers(row.transformer)
    model = _random_(materialize(lambda: FarTransformer(config), device, dtype, FarTransformer.KEEP_FP32), 0)
    s, wan = row.shape, config.wan
    latent_frames, hw = (s["num_frames"] - 1) // 4 + 1, (s["height"] // 8, s["width"] // 8)
    partition = chunk_partition(latent_frames, tuple(config.chunk_partition))
    last = len(partition) - 1
    layouts = [ChunkLayout.for_chunk(partition, k, hw, config) for k in range(len(partition))]
    layout, batch = layouts[last], 2
    latents = torch.randn(batch, wan.in_channels, layout.total_frames, *hw, device=device, dtype=dtype)
    with torch.inference_mode():
        text = model.embed_text(torch.randn(batch, s["text_tokens"], wan.text_dim, device=device, dtype=dtype))
        cache = model.new_cache(layouts, batch, device, dtype)
        model.prefill(latents[:, :, : layout.context_frames], text, layout, cache)  # once per chunk, not timed
    t = torch.full((batch,), 0.5, dtype=torch.float64, device=device)
    r = torch.zeros(batch, dtype=torch.float64, device=device)
    chunk = latents[:, :, layout.context_frames:]
    step = lambda: model.step(chunk, t, r, text, layout, cache)  # noqa: E731
    full = layout.full_grid[0] * layout.full_grid[1]
    return model, step, {"tokens": chunk.shape[2] * full, "partition": list(partition),
                         "context_frames": layout.context_frames}


def _cosmos3(row: FamilyRow, device: Any, dtype: Any) -> tuple[Any, Step, dict[str, Any]]:
    import torch

    from vidloom.loading.precision import materialize
    from vidloom.families.cosmos3.config import Cosmos3TextConfig
    from vidloom.families.cosmos3.gen_config import Cosmos3GenConfig
    from vidloom.families.cosmos3.generation import Cosmos3Generator
    from vidloom.families.cosmos3.layout import GenLayout, text_prefix_positions
    from vidloom.families.cosmos3.transformer import Cosmos3Transformer
    from vidloom.families.cosmos3.gen_load import KEEP_FP32

    config = Cosmos3GenConfig.from_transformer_config(row.transformer)
    text_config = Cosmos3TextConfig.from_transformer_config(row.transformer)
    backbone = _random_(materialize(lambda: Cosmos3Transformer(text_config), device, dtype), 0)
    generator = _random_(materialize(lambda: Cosmos3Generator(config), device, dtype, KEEP_FP32), 1)
    s = row.shape
    shape = (config.latent_channel, (s["num_frames"] - 1) // 4 + 1, s["height"] // 16, s["width"] // 16)
    latents = torch.randn(1, *shape, device=device, dtype=dtype)  # one request: a batch of one
    prefixes = []  # the prompt and the negative prompt: CFG runs one forward against each
    with torch.inference_mode():
        for seed in (0, 1):
            ids = torch.randint(0, text_config.vocab_size, (s["text_tokens"],),
                                generator=torch.Generator().manual_seed(seed)).to(device)
            prefix = torch.empty(generator.prefix_shape(len(ids)), device=device, dtype=dtype)
            generator.prefill(backbone, ids, text_prefix_positions(len(ids), config).to(device), prefix)
            prefixes.append(prefix[None])
    layout = GenLayout.build(config, shape, s["text_tokens"], s["fps"], 4)
    timestep = torch.tensor([500], device=device)

    def step() -> Any:
        return [generator(backbone, prefix, layout, latents, timestep)[0] for prefix in prefixes]

    p = config.latent_patch_size
    tokens = shape[1] * -(-shape[2] // p) * -(-shape[3] // p)
    return generator, step, {"tokens": tokens, "text_tokens": s["text_tokens"]}


BUILDERS = {"flux2": _flux2, "ltx2": _ltx2, "far": _far, "cosmos3": _cosmos3}


def run_family_worker(row: FamilyRow, device: str = "cuda", dtype: str = "bfloat16") -> dict[str, Any]:
    """Build `row`'s denoiser, warm up one step, count one step's FLOPs, time `row.timed` steps."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from gpu_workers import _peak_gib, _reset_peak, _step_summary, _sync_clock

    torch.manual_seed(0)
    where, compute = torch.device(device), getattr(torch, dtype)
    t0 = _sync_clock()
    model, step, workload = BUILDERS[row.family](row, where, compute)
    t1 = _sync_clock()
    with torch.inference_mode():
        step()  # warm-up: kernel selection, allocator
        counter = FlopCounterMode(display=False)
        with counter:
            step()
        flops = float(counter.get_total_flops())
        _reset_peak()
        ends = [_sync_clock()]
        for _ in range(row.timed):
            out = step()
            ends.append(_sync_clock())
    outputs = out if isinstance(out, (list, tuple)) else [out]
    finite = all(bool(torch.isfinite(o).all()) for o in outputs if isinstance(o, torch.Tensor))
    params = sum(p.numel() for p in model.parameters())
    return {**_step_summary(ends), "build_s": round(t1 - t0, 2), "peak_memory_gib": _peak_gib(),
            "flops_per_step": flops, "parameters": params, "workload": workload, "finite": finite,
            "timed_steps": row.timed}
