"""The prepared GPU check: its dry run (also run by CI) and its benchmark code on a tiny CPU workload."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from gpu_plan import BUDGET_S, CONFIGS, DIT_ROWS, FAMILY_ROWS, LORA_ROWS, forward_flops, tokens  # noqa: E402


def test_dry_run_prints_the_plan_and_an_estimated_total_within_budget(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "gpu")}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    match = re.fullmatch(r"estimated total: (\d+) s", lines[-1])
    assert match, lines[-1]
    assert 0 < int(match.group(1)) <= BUDGET_S
    assert lines[0].startswith("environment: ")
    for config in (*CONFIGS, *DIT_ROWS, *LORA_ROWS, *FAMILY_ROWS):  # every row is planned or skipped with a reason
        assert any(line.strip().startswith(config.name) for line in lines), config.name
    assert not (tmp_path / "gpu").exists(), "a dry run writes nothing"
    # The first lent device measures a step cache: the default row is planned, not skipped.
    from gpu_plan import DEFAULT_STEP_CACHE

    assert any(line.strip().startswith(DEFAULT_STEP_CACHE) and "MFU" in line for line in lines), DEFAULT_STEP_CACHE
    # Every family has a row: Wan2.1 (the configurations), Wan2.2 TI2V, FAR, Flux2, LTX-2, Cosmos3.
    planned = "\n".join(lines)
    for family in ("wan2.2-ti2v", "far-", "flux2-", "ltx2-", "cosmos3-"):
        assert f"  {family}" in planned, family


def test_flop_count_of_the_real_workload():
    # 21 latent frames x 30 x 52 patches; the per-forward count is dominated by 30 x 4 S^2 D of attention.
    assert tokens() == 32760
    s, d = 32760, 1536
    attention = 30 * 4 * s * s * d
    assert 0.65 < attention / forward_flops() < 0.75
    assert 280e12 < forward_flops() < 290e12


def _tiny_workload():
    from gpu_workers import Workload

    return Workload(
        transformer=dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
                         out_channels=4, text_dim=32, freq_dim=16, ffn_dim=32, num_layers=2,
                         cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=256),
        vae=dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
                 temperal_downsample=[False, True, True], dropout=0.0),
        text_encoder=dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                          relative_attention_max_distance=32, feed_forward_proj="gated-gelu", dropout_rate=0.0),
        height=32, width=48, num_frames=5, device="cpu", dtype="float32",
    )


@pytest.mark.parametrize("names", [("diffusers", "vidloom sdpa", "vidloom fp8")])
def test_benchmark_workers_on_a_tiny_cpu_workload_give_comparable_latents(tmp_path, names):
    # The same worker code the H200 runs, on a tiny random checkpoint in float32 on CPU, so the
    # program trimming, step timing and latent comparison are checked before the one-shot slot.
    from gpu_workers import run_worker, write_checkpoint

    import torch

    tiny = _tiny_workload()
    checkpoint = write_checkpoint(tmp_path / "ckpt", tiny)
    results, latents = {}, {}
    for name in names:
        latents[name] = tmp_path / f"{name}.pt"
        results[name] = run_worker(name, checkpoint, latents[name], tiny)
    for name, row in results.items():
        assert row["finite"] and row["s_per_step"] > 0 and len(row["step_intervals_s"]) == 3, (name, row)
    reference = torch.load(latents["diffusers"])
    assert reference.shape == (1, 4, 2, 4, 6)
    # Same weights, seed and 4 UniPC steps in fp32: the parity bound of the generation tests.
    assert (torch.load(latents["vidloom sdpa"]) - reference).abs().max() <= 1e-4
    fp8_diff = (torch.load(latents["vidloom fp8"]) - reference).abs().max()
    assert 0 < fp8_diff < 0.5 * reference.abs().max()  # quantized weights: close, not equal


def test_step_cache_rows_cache_the_timed_steps_on_a_tiny_cpu_workload(tmp_path):
    # An opt-in step-cache row (a preset with TaylorSeer; the tiny Wan has 2 blocks, so it runs as F1B0): caching
    # every step after the first moves the latents away from the plain path's. Every row's options are checked.
    from gpu_plan import STEP_CACHE_CONFIGS
    from gpu_workers import run_worker, write_checkpoint

    import torch

    from vidloom.core.deploy import DeployConfig
    from vidloom.runtime.step_cache import deployed_policy

    assert all(deployed_policy(DeployConfig(**dict(config.deploy))) for config in STEP_CACHE_CONFIGS)
    tiny = _tiny_workload()
    checkpoint = write_checkpoint(tmp_path / "ckpt", tiny)
    assert run_worker("vidloom sdpa", checkpoint, tmp_path / "plain.pt", tiny)["finite"]
    row = run_worker("vidloom balanced", checkpoint, tmp_path / "cached.pt", tiny)
    assert row["finite"] and len(row["step_intervals_s"]) == 3, row
    assert not torch.equal(torch.load(tmp_path / "cached.pt"), torch.load(tmp_path / "plain.pt"))


def test_dit_rows_plan_every_family_row_and_time_a_tiny_denoiser_on_cpu():
    # The same DiT-alone worker the H200 runs for the other families, on a tiny config on CPU in float32.
    import dataclasses

    from gpu_plan import DIT_ROWS, WAN22_TI2V_5B, forward_flops, tokens
    from gpu_workers import run_dit_worker

    assert tokens(704, 1280, 121, WAN22_TI2V_5B, 4, 16) == 31 * 22 * 40
    assert 500e12 < forward_flops(31 * 22 * 40, config=WAN22_TI2V_5B) < 530e12
    tiny = dataclasses.replace(
        DIT_ROWS[0], transformer=dict(WAN22_TI2V_5B, num_attention_heads=2, attention_head_dim=16, ffn_dim=32,
                                      num_layers=2, text_dim=32, freq_dim=16),
        height=64, width=64, num_frames=5)
    row = run_dit_worker(tiny, device="cpu", dtype="float32")
    assert row["finite"] and row["s_per_step"] > 0 and len(row["step_intervals_s"]) == 4, row  # 4 timed forwards
    assert row["tokens"] == 2 * 2 * 2


def test_lora_row_times_every_adapter_setting_of_a_tiny_denoiser_on_cpu():
    # The LoRA row the H200 runs (Wan2.1-1.3B, rank 16, 0/1/4 adapters run-time vs fused) on a tiny config;
    # the plan's row runs 0/4 with one timed forward (opt-in: GPU_CHECK_LORA=1).
    import dataclasses

    from gpu_lora_worker import run_lora_worker
    from gpu_plan import WAN_1_3B

    tiny = dataclasses.replace(
        LORA_ROWS[0], transformer=dict(WAN_1_3B, num_attention_heads=2, attention_head_dim=16, ffn_dim=32,
                                       num_layers=2, text_dim=32, freq_dim=16), height=64, width=64, num_frames=5,
        rank=4, counts=(1, 4), timed=2)
    row = run_lora_worker(tiny, device="cpu", dtype="float32")
    assert set(row["settings"]) == {"base 0", "fused 1", "fused 4", "run-time 1", "run-time 4"}, row
    for name, setting in row["settings"].items():
        assert setting["finite"] and setting["s_per_step"] > 0 and len(setting["step_intervals_s"]) == 2, name
    assert row["settings"]["fused 4"]["fuse_s"] >= 0 and row["vs_base"]["base 0"] == 1.0
# Tiny configs of each family's published layout: the same builders and timing the H200 runs, on CPU.
TINY_FAMILIES = {
    "flux2": (dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=24, timestep_guidance_channels=32, mlp_ratio=3.0,
                   axes_dims_rope=(4, 4, 4, 4), guidance_embeds=False), dict(height=64, width=64, text_tokens=8)),
    "ltx2": (dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
                  audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=2, audio_attention_head_dim=8,
                  audio_cross_attention_dim=16, num_layers=2, caption_channels=24),
             dict(height=64, width=64, num_frames=9, fps=24.0, text_tokens=8)),
    "far": (dict(patch_size=(1, 2, 2), compressed_patch_size=(1, 4, 4), full_chunk_limit=2, num_attention_heads=2,
                 attention_head_dim=16, in_channels=4, out_channels=4, text_dim=24, freq_dim=16, ffn_dim=32,
                 num_layers=2, cross_attn_norm=True, rope_max_seq_len=256, gate_value=0.25, deltatime_type="r",
                 chunk_partition=(1, 2, 2, 2)), dict(height=64, width=64, num_frames=25, text_tokens=8)),
    "cosmos3": (dict(hidden_size=32, head_dim=8, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                     num_hidden_layers=2, rope_theta=10000.0, rope_axes_dim=(2, 1, 1), latent_channel=4,
                     patch_latent_dim=16, rms_norm_eps=1e-6, vocab_size=100),
                dict(height=64, width=64, num_frames=9, fps=24.0, text_tokens=8)),
}


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_family_rows_time_a_tiny_denoiser_of_each_family_on_cpu(family):
    import dataclasses

    from gpu_family_workers import run_family_worker

    (row,) = [r for r in FAMILY_ROWS if r.family == family]
    config, shape = TINY_FAMILIES[family]
    result = run_family_worker(dataclasses.replace(row, transformer=config, shape=shape), device="cpu",
                               dtype="float32")
    assert result["finite"] and result["s_per_step"] > 0 and len(result["step_intervals_s"]) == row.timed, result
    assert result["flops_per_step"] > 0 and result["parameters"] > 0  # counted, so MFU can be computed
    assert result["workload"]["tokens"] > 0
    assert row.estimate_s() > 0 and row.step_tflop() > 0
