"""The GPU check's plan: configurations, the Wan2.1-1.3B FLOP count, and time estimates for one H200.

Pure Python (no torch import) so `bench/gpu_check.sh --dry-run` can print the plan anywhere.
The estimates are what the one-shot device slot is budgeted with; the real run compares
them with what it measures.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

# -- the workload: Wan2.1-T2V-1.3B at 480x832, 81 frames, CFG on, bf16 ----------------------

# Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json (the published architecture).
WAN_1_3B: dict[str, Any] = dict(
    patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024,
)
HEIGHT, WIDTH, NUM_FRAMES = 480, 832, 81
TEXT_TOKENS = 512  # Wan pads every prompt to 512 tokens
VAE_TEMPORAL, VAE_SPATIAL = 4, 8  # Wan2.1 VAE compression
FULL_STEPS = 50  # the reference run; the check times TIMED_STEPS and extrapolates
WARMUP_STEPS = 1  # a 1-step request first: cuBLAS/cuDNN init, autotuning, compilation, capture
TIMED_STEPS = 4  # per-step time is the median of the 3 intervals between the 4 step ends
GUIDANCE = 5.0

BUDGET_S = 480.0  # the whole script (tests + checkpoint + every configuration) on one H200
PEAK_BF16_FLOPS = {  # dense bf16 tensor-core peak, NVIDIA datasheets (SXM parts)
    "H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12,
}
ESTIMATE_GPU = "H200"

# Fixed costs on the H200 host, estimated (no measurement yet; the real run records the actual ones).
CHECKPOINT_WRITE_S = 45.0  # random 1.3B DiT + Wan VAE + small UMT5 built on the GPU, saved as bf16
GPU_TESTS_S = 60.0  # tests/gpu on the demo model
PROCESS_START_S = 12.0  # a fresh worker process: imports, CUDA context
LOAD_S = 10.0  # 2.7 GB checkpoint from page cache to the GPU
COMPILE_S = 90.0  # inductor compile of one WanBlock shape (dynamic=False), cold cache


def tokens(height: int = HEIGHT, width: int = WIDTH, num_frames: int = NUM_FRAMES, config: dict[str, Any] = WAN_1_3B,
           vae_temporal: int = VAE_TEMPORAL, vae_spatial: int = VAE_SPATIAL) -> int:
    """Video tokens after the VAE and 1x2x2 patchify: 21 x 30 x 52 = 32,760 at 480x832x81."""
    p_t, p_h, p_w = config["patch_size"]
    latent_frames = (num_frames - 1) // vae_temporal + 1
    return (latent_frames // p_t) * (height // vae_spatial // p_h) * (width // vae_spatial // p_w)


def forward_flops(seq: int | None = None, text: int = TEXT_TOKENS, config: dict[str, Any] = WAN_1_3B) -> float:
    """Matmul FLOPs of one DiT forward (2 per multiply-add; elementwise work not counted).

    Per block, with S video tokens, T text tokens, width D, FFN width F:
      self-attention  q,k,v,o projections 4 * 2*S*D*D  +  QK^T and PV  2 * 2*S*S*D
      cross-attention q,o projections     2 * 2*S*D*D  +  k,v of text  2 * 2*T*D*D  +  QK^T, PV  2 * 2*S*T*D
      feed-forward    up and down         2 * 2*S*D*F
    plus, once: patch embedding 2*S*(C*p)*D, text embedding 2*T*(4096*D + D*D), output head 2*S*D*(C*p).
    """
    s = seq if seq is not None else tokens(config=config)
    d = config["num_attention_heads"] * config["attention_head_dim"]
    f, t, layers = config["ffn_dim"], text, config["num_layers"]
    patch = config["in_channels"] * 4
    block = 8 * s * d * d + 4 * s * s * d + 4 * s * d * d + 4 * t * d * d + 4 * s * t * d + 4 * s * d * f
    once = 2 * s * patch * d + 2 * t * (config["text_dim"] * d + d * d) + 2 * s * d * patch
    return float(layers * block + once)


def step_flops() -> float:
    """One denoise step with CFG on: two forwards (cond and uncond)."""
    return 2 * forward_flops()


# -- configurations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuConfig:
    """One measured configuration."""

    name: str
    engine: str
    """"diffusers" (WanPipeline, the reference) or "vidloom"."""
    deploy: tuple[tuple[str, Any], ...] = ()
    """vidloom DeployConfig fields."""
    needs: str | None = None
    """Importable module this row needs (flash_attn, sageattention)."""
    mfu: float = 0.40
    """Assumed model FLOP utilisation on the H200 for the estimate (vs the bf16 peak)."""
    setup_s: float = 0.0
    """Extra one-off seconds beyond start + load (compilation, graph capture)."""
    cached_share: float = 1.0
    """A step-cache row's cached step as a share of a full step (its Fn + Bn blocks of all); the warm-up step and
    the first timed step run whole, the other timed steps are cached."""

    def estimate_s(self, peak: float = PEAK_BF16_FLOPS[ESTIMATE_GPU]) -> float:
        step = step_flops() / (peak * self.mfu)
        steps = WARMUP_STEPS + 1 + (TIMED_STEPS - 1) * self.cached_share
        return PROCESS_START_S + LOAD_S + self.setup_s + steps * step


# Assumed MFUs: SDPA (flash backend) eager ~40% is what DiT inference reaches at this length
# (attention is ~70% of the FLOPs and runs near peak; the rest loses to elementwise work);
# flash-attn is slightly ahead; SageAttention quantizes QK to 8 bits; FP8 only speeds the
# linears (~30% of FLOPs); compile fuses the elementwise work; graphs only remove launch gaps.
CONFIGS: tuple[GpuConfig, ...] = (
    GpuConfig("diffusers", "diffusers", mfu=0.38),
    GpuConfig("vidloom sdpa", "vidloom"),
    GpuConfig("vidloom flash", "vidloom", (("attention_backend", "flash"),), needs="flash_attn", mfu=0.42),
    GpuConfig("vidloom sage", "vidloom", (("attention_backend", "sage"),), needs="sageattention", mfu=0.55),
    GpuConfig("vidloom fp8", "vidloom", (("fp8_weights", True),), mfu=0.44),
    # Capture: two eager warm-up runs of the step body on a side stream, then the captured run.
    GpuConfig("vidloom cuda-graphs", "vidloom", (("cuda_graphs", True),), mfu=0.41, setup_s=3 * 1.45),
    GpuConfig("vidloom compile", "vidloom", (("compile", True),), mfu=0.46, setup_s=COMPILE_S),
)
# Step caches (docs/acceleration.md): warm-up 1 and threshold 1e9 (always below it), so timed steps 2-4 are cached
# and the median step is a cached step's cost (front/back blocks, TaylorSeer's forecast, the change measure's
# host sync); the latents' difference from diffusers is what caching every step costs on random weights.
# `balanced` (the preset a user would pick: F4B1 + TaylorSeer 1) runs by default, so the first lent device measures
# a cached step; the other three are opt-in (GPU_CHECK_STEP_CACHE=1): the budget does not hold them all.
STEP_CACHE_CONFIGS: tuple[GpuConfig, ...] = (
    GpuConfig("vidloom fbcache", "vidloom", (("step_cache", "fbcache"), ("step_cache_threshold", 1e9)),
              cached_share=1 / WAN_1_3B["num_layers"]),
    GpuConfig("vidloom dbcache-f1b0-taylorseer2", "vidloom",
              (("step_cache", "dbcache"), ("step_cache_fn", 1), ("step_cache_warmup", 1), ("step_cache_taylorseer", 2),
               ("step_cache_threshold", 1e9)), cached_share=1 / WAN_1_3B["num_layers"]),
    GpuConfig("vidloom balanced", "vidloom",
              (("step_cache", "balanced"), ("step_cache_warmup", 1), ("step_cache_threshold", 1e9)),
              cached_share=5 / WAN_1_3B["num_layers"]),
    GpuConfig("vidloom quality", "vidloom",
              (("step_cache", "quality"), ("step_cache_warmup", 1), ("step_cache_threshold", 1e9))),
)
DEFAULT_STEP_CACHE = "vidloom balanced"
"""The step-cache row every run includes (the others need GPU_CHECK_STEP_CACHE=1)."""
CONFIGS = (*CONFIGS, *STEP_CACHE_CONFIGS)
REFERENCE = "diffusers"


# -- other families: their denoiser alone at its published size, random weights --------------------------
# No checkpoint is written (minutes each at these sizes): the DiT is built on the GPU from its published
# configuration and timed forward by forward, a CFG pair per step as one batch of 2.

# Wan-AI/Wan2.2-TI2V-5B (the Wan team's config: dim 3072 = 24 heads x 128, FFN 14336, 30 layers, 48 latent
# channels, VAE stride 4x16x16), at its native 704x1280, 121 frames.
WAN22_TI2V_5B: dict[str, Any] = dict(WAN_1_3B, num_attention_heads=24, attention_head_dim=128, in_channels=48,
                                     out_channels=48, ffn_dim=14336)


@dataclass(frozen=True)
class DitRow:
    """One family's denoiser timed alone: s/step (CFG pair batched), peak memory, MFU."""

    name: str
    transformer: dict[str, Any]
    """The published diffusers transformer config."""
    height: int
    width: int
    num_frames: int
    vae_temporal: int
    vae_spatial: int
    mfu: float = 0.40

    def tokens(self) -> int:
        return tokens(self.height, self.width, self.num_frames, self.transformer, self.vae_temporal, self.vae_spatial)

    def step_flops(self) -> float:
        return 2 * forward_flops(self.tokens(), config=self.transformer)

    def estimate_s(self, peak: float = PEAK_BF16_FLOPS[ESTIMATE_GPU]) -> float:
        build_s = 5.0  # random init of a few billion parameters on the GPU
        return PROCESS_START_S + build_s + (WARMUP_STEPS + TIMED_STEPS) * self.step_flops() / (peak * self.mfu)


DIT_ROWS: tuple[DitRow, ...] = (
    DitRow("wan2.2-ti2v-5b dit", WAN22_TI2V_5B, 704, 1280, 121, vae_temporal=4, vae_spatial=16),
)


@dataclass(frozen=True)
class LoraRow(DitRow):
    """A denoiser timed with LoRA adapters (random, on every attention and FFN linear of every block): per step,
    0 adapters, then each count in `counts` fused and applied at run time (vidloom.lora.apply.LoRALinear)."""

    rank: int = 16
    counts: tuple[int, ...] = (1, 4)
    timed: int = 2
    """Timed forwards per setting, after one warm one."""

    def settings(self) -> list[tuple[str, int]]:
        # Fused first: the run-time settings wrap the linears, and a fused step should not pay for the wrapper.
        return [("base", 0)] + [(mode, n) for mode in ("fused", "run-time") for n in self.counts]

    def estimate_s(self, peak: float = PEAK_BF16_FLOPS[ESTIMATE_GPU]) -> float:
        build_s, fuse_s = 5.0, 2.0 * len(self.counts)
        forwards = len(self.settings()) * (1 + self.timed)
        return PROCESS_START_S + build_s + fuse_s + forwards * self.step_flops() / (peak * self.mfu)


# LoRA: Wan2.1-1.3B at its published config, 33 frames (shrunk from 81 to fit the budget next to the other
# families' rows); rank-16 adapters (the common size for style LoRAs), 4 of them fused and at run time.
LORA_ROWS: tuple[LoraRow, ...] = (
    LoraRow("wan2.1-1.3b lora 0/4", WAN_1_3B, HEIGHT, WIDTH, 33, vae_temporal=VAE_TEMPORAL,
            vae_spatial=VAE_SPATIAL, counts=(4,), timed=1),
)


# The other families' denoisers alone at their published configurations (random weights). Each process
# builds the model on the GPU, counts the FLOPs one forward executes (torch's FlopCounterMode: matmuls and
# attention), then times forwards; MFU comes from that count. The plan's estimates use the dense
# approximation below (2 x block parameters x tokens + 4 x layers x tokens x keys x width) per forward.
# Sizes are shrunk (frames, resolution) so every row fits the 480 s budget; each row says what it runs.

# Flux.2 [klein] 4B (black-forest-labs/FLUX.2-klein-4B transformer/config.json: 5 double + 20 single
# blocks, 24 heads x 128, Qwen3-4B text (3 layers x 2560 = 7680), 128 latent channels; distilled: no CFG).
FLUX2_KLEIN_4B: dict[str, Any] = dict(
    patch_size=1, in_channels=128, num_layers=5, num_single_layers=20, attention_head_dim=128,
    num_attention_heads=24, joint_attention_dim=7680, timestep_guidance_channels=256, mlp_ratio=3.0,
    axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=False,
)
# LTX-2 (19B; diffusers LTX2VideoTransformer3DModel's defaults are the released config: 48 layers, video
# 32 heads x 128, audio 32 heads x 64, caption channels 3840). Empty: take those defaults.
LTX2_19B: dict[str, Any] = {}
# AnyFlow-FAR (diffusers AnyFlowFARTransformer3DModel's defaults: the Wan2.1-14B layout, 40 layers, 40 heads
# x 128, FFN 13824, chunks (1, 3, 3, 3, 3, 3, 3, 2) of latent frames over 81 frames).
FAR_14B: dict[str, Any] = {}
# Cosmos3 Omni (diffusers Cosmos3OmniTransformer's defaults: hidden 4096, 36 layers, 32 query / 8 KV heads
# x 128, FFN 12288, 48 latent channels, 2x2 latent patches).
COSMOS3_OMNI: dict[str, Any] = {}


def dense_forward_flops(params: float, tokens: int, keys: int, layers: int, width: int) -> float:
    """Approximate matmul FLOPs of one forward: every block weight meets every token once, plus QK^T and PV."""
    return 2 * params * tokens + 4 * layers * tokens * keys * width


@dataclass(frozen=True)
class FamilyRow:
    """One more family's denoiser timed alone (bench/gpu_family_workers.py)."""

    name: str
    family: str
    """far | flux2 | ltx2 | cosmos3: which builder runs it."""
    transformer: dict[str, Any]
    """Published config (diffusers keys; empty: the class defaults, which are the released model's)."""
    shape: dict[str, Any]
    """The workload the forward runs (pixels, frames, text tokens...), family-specific keys."""
    forward_tflop: float
    """Estimated TFLOP of one forward (dense_forward_flops) for the plan; the run counts the real ones."""
    forwards_per_step: int = 2
    """CFG pair (2, batched where the model takes a batch) or distilled (1)."""
    mfu: float = 0.40
    build_s: float = 10.0
    """Random init of the published size on the GPU."""
    timed: int = 3
    """Timed forwards-per-step after one warm-up (and one counted) step."""

    def step_tflop(self) -> float:
        return self.forward_tflop * self.forwards_per_step

    def estimate_s(self, peak: float = PEAK_BF16_FLOPS[ESTIMATE_GPU]) -> float:
        step = self.step_tflop() * 1e12 / (peak * self.mfu)
        return PROCESS_START_S + self.build_s + (WARMUP_STEPS + 1 + self.timed) * step


FAMILY_ROWS: tuple[FamilyRow, ...] = (
    # One 1024x1024 image: 64x64 = 4096 image tokens + 512 text; ~3.9B parameters in the blocks.
    FamilyRow("flux2-klein-4b dit", "flux2", FLUX2_KLEIN_4B, dict(height=1024, width=1024, text_tokens=512),
              dense_forward_flops(3.9e9, 4608, 4608, 25, 3072) / 1e12, forwards_per_step=1, build_s=5.0),
    # 512x768, 49 frames (shrunk from 121 to fit): 7 x 16 x 24 = 2688 video tokens, ~50 audio tokens,
    # 1024 text tokens; ~19B parameters, most in the video stream.
    FamilyRow("ltx2-19b dit", "ltx2", LTX2_19B, dict(height=512, width=768, num_frames=49, fps=24.0,
                                                   text_tokens=1024),
              dense_forward_flops(19e9, 2688, 2688, 48, 4096) / 1e12, build_s=15.0),
    # The last chunk (2 latent frames) of an 81-frame 480x832 rollout, its 19 latent frames of context
    # prefilled in the KV cache (older chunks at the 4x4 compressed patch size, the newest at full size):
    # one cached step, ~14B parameters.
    FamilyRow("far-14b chunk step", "far", FAR_14B, dict(height=480, width=832, num_frames=81, text_tokens=512),
              dense_forward_flops(14e9, 2 * 1560, 12 * 1560, 40, 5120) / 1e12, build_s=12.0),
    # 480x832, 41 frames (shrunk from 81): Wan2.2 VAE 4x16x16, 2x2 patches -> 11 x 15 x 26 = 4290 tokens
    # against a 512-token text prefix; ~7B generation-pathway parameters (the prefix is prefilled once).
    FamilyRow("cosmos3-omni dit", "cosmos3", COSMOS3_OMNI, dict(height=480, width=832, num_frames=41, fps=24.0,
                                                               text_tokens=512),
              dense_forward_flops(7e9, 4290, 4802, 36, 4096) / 1e12, build_s=12.0),
)



@dataclass(frozen=True)
class ParallelRow:
    """One family on one GPU and on two (bench/parallel_families.py: `1` then `sp2`, fresh pools, the
    side-by-side report's mid-size checkpoint at bf16). Runs only where two GPUs are visible."""

    name: str
    family: str
    """A bench/family_bench.py FAMILIES name."""
    plans: str = "1,sp2"
    gpus: int = 2
    checkpoint_s: float = 20.0
    """Writing the mid-size random checkpoint (diffusers, on the CPU)."""

    def estimate_s(self, peak: float = PEAK_BF16_FLOPS[ESTIMATE_GPU]) -> float:
        # Each plan: a pool's start (a process per rank, CUDA contexts), the load, a warm-up and one timed
        # request; the mid-size request itself is milliseconds of GPU work.
        return self.checkpoint_s + len(self.plans.split(",")) * (PROCESS_START_S + LOAD_S)


PARALLEL_ROWS: tuple[ParallelRow, ...] = tuple(
    ParallelRow(f"{family} 2-gpu", family)
    for family in ("wan2.1-mid", "wan2.2-ti2v-mid", "far-mid", "flux2-klein-mid", "ltx2-mid", "cosmos3-mid",
                   "hunyuan15-mid", "helios-mid", "qwen-image-mid")
)
"""Every generation family's two-GPU row (bench/parallel_families.py GENERATION)."""

def module_available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def plan_lines(skipped: dict[str, str]) -> tuple[list[str], float]:
    """The printed plan and its estimated total seconds (skipped rows cost nothing). A row whose estimate no longer
    fits in the budget is marked skipped, as the real run skips it (gpu_check._time_left), in the order it runs."""
    peak = PEAK_BF16_FLOPS[ESTIMATE_GPU]
    step = step_flops()
    lines = [
        f"workload: Wan2.1-1.3B architecture, random weights, {HEIGHT}x{WIDTH}x{NUM_FRAMES} "
        f"({tokens()} tokens), CFG {GUIDANCE}, bf16, UniPC; per configuration a {WARMUP_STEPS}-step warm-up "
        f"request, then {TIMED_STEPS} timed steps (a {FULL_STEPS}-step run is extrapolated)",
        f"FLOPs per denoise step: {step / 1e12:.1f} TFLOP (2 forwards x {forward_flops() / 1e12:.1f}; "
        "formula in bench/gpu_plan.py:forward_flops)",
        f"estimates on one {ESTIMATE_GPU} at {peak / 1e12:.0f} TFLOP/s bf16 peak x the assumed MFU below",
        f"  checkpoint write (random weights, no download)      {CHECKPOINT_WRITE_S:6.0f} s",
        f"  tests/gpu (all of it)                               {GPU_TESTS_S:6.0f} s",
    ]
    total = CHECKPOINT_WRITE_S + GPU_TESTS_S

    def plan(name: str, seconds: float, detail: str, note: str = "") -> None:
        nonlocal total
        if name in skipped:
            lines.append(f"  {name:<26} skipped: {skipped[name]}")
        elif total + seconds > BUDGET_S:
            lines.append(f"  {name:<26} skipped: budget ({total:.0f} s planned + {seconds:.0f} s > {BUDGET_S:.0f} s)")
        else:
            lines.append(f"  {name:<26} {detail}  {seconds:6.0f} s" + (f"  ({note})" if note else ""))
            total += seconds

    for row in PARALLEL_ROWS:  # the real run starts with them (only a machine with several GPUs runs them)
        plan(row.name, row.estimate_s(peak), f"plans {row.plans} on {row.gpus} GPUs")
    for config in CONFIGS:
        plan(config.name, config.estimate_s(peak), f"MFU {config.mfu:.0%}  {step / (peak * config.mfu):5.2f} s/step")
    for row in (*DIT_ROWS, *LORA_ROWS):
        what = (f"DiT alone; {', '.join(f'{m} {n}' for m, n in row.settings())} rank-{row.rank} adapters"
                if isinstance(row, LoraRow) else "DiT alone")
        plan(row.name, row.estimate_s(peak), f"MFU {row.mfu:.0%}  {row.step_flops() / (peak * row.mfu):5.2f} s/step",
             f"{row.tokens()} tokens, {row.step_flops() / 1e12:.0f} TFLOP/step, {what}")
    for fam in FAMILY_ROWS:
        plan(fam.name, fam.estimate_s(peak),
             f"MFU {fam.mfu:.0%}  {fam.step_tflop() * 1e12 / (peak * fam.mfu):5.2f} s/step",
             f"~{fam.step_tflop():.0f} TFLOP/step, {fam.forwards_per_step} forward(s), DiT alone")
    return lines, total
