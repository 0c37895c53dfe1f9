"""Wan2.2 on random mid-size checkpoints: TI2V (T2V and I2V) vidloom vs diffusers, and A14B two-expert
denoising with and without the idle-expert placement (peak accelerator memory on CUDA, peak RSS on CPU).

Each (case, engine) is a fresh subprocess, so peak RSS is its own; each process loads the model, then
times one full generation (text encoding, denoising, VAE encode/decode). The frames of vidloom and
diffusers are compared (max abs difference) so a fast wrong answer cannot pass as a win.

    python bench/wan22.py [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from checkpoints import cached
from report import environment, print_table, write_json

from tests.helpers.wan22_checkpoints import write_tiny_a14b, write_tiny_ti2v
from tests.helpers.wan_checkpoints import TinyWan
from tests.helpers.wan_i2v_checkpoints import make_image

PROMPT = "a red fox jumps over a frozen river"
SEED = 42
TEXT = {"d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4,
        "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
        "feed_forward_proj": "gated-gelu", "dropout_rate": 0.0}
DIT = dict(patch_size=(1, 2, 2), num_attention_heads=8, attention_head_dim=64, text_dim=64, freq_dim=256,
           ffn_dim=1536, num_layers=10, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
           rope_max_seq_len=1024)
# TI2V-5B's VAE layout (48 latent channels, residual stages, 2x2 patching) at a smaller width.
TI2V_MID = TinyWan(
    name="ti2v-mid", transformer=dict(DIT, in_channels=48, out_channels=48), text_encoder=TEXT,
    vae=dict(base_dim=32, decoder_base_dim=48, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
             temperal_downsample=[False, True, True], dropout=0.0, is_residual=True, patch_size=2,
             in_channels=12, out_channels=12, scale_factor_spatial=16, scale_factor_temporal=4),
)
A14B_MID = TinyWan(
    name="a14b-mid", transformer=dict(DIT, in_channels=16, out_channels=16), text_encoder=TEXT,
    vae=dict(base_dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
             temperal_downsample=[False, True, True], dropout=0.0),
)
CASES = {
    "ti2v-t2v": dict(ckpt="ti2v-mid", image=False, engines=("diffusers", "vidloom")),
    "ti2v-i2v": dict(ckpt="ti2v-mid", image=True, engines=("diffusers", "vidloom")),
    "a14b": dict(ckpt="a14b-mid", image=False, engines=("diffusers", "vidloom", "vidloom+offload_idle_expert")),
}
REQUEST = dict(height=256, width=256, num_frames=9, steps=8, guidance=5.0, guidance_2=3.0, shift=5.0)


def ensure(name: str) -> Path:
    if name == "ti2v-mid":
        return cached(name, lambda folder: write_tiny_ti2v(folder, TI2V_MID))
    return cached(name, lambda folder: write_tiny_a14b(folder, A14B_MID, boundary_ratio=0.875))


def run_one(folder: Path, engine: str, image: bool, out: Path) -> dict[str, Any]:
    """In the child process: load, generate once (timed), save frames, report time and memory."""
    import torch

    picture = make_image(300, 220, seed=1) if image else None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    if engine == "diffusers":
        from diffusers import WanImageToVideoPipeline, WanPipeline

        pipe = WanPipeline.from_pretrained(str(folder), dtype=torch.float32).to(device)
        pipe.scheduler = pipe.scheduler.__class__.from_config(pipe.scheduler.config, flow_shift=REQUEST["shift"])
        kwargs: dict[str, Any] = {}
        if image:
            pipe = WanImageToVideoPipeline(tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae,
                                           scheduler=pipe.scheduler, transformer=pipe.transformer,
                                           image_encoder=None, image_processor=None, expand_timesteps=True)
            kwargs["image"] = picture
        if getattr(pipe, "transformer_2", None) is not None:
            kwargs["guidance_scale_2"] = REQUEST["guidance_2"]
        pipe.set_progress_bar_config(disable=True)
        loaded = time.perf_counter()
        frames = pipe(prompt=PROMPT, height=REQUEST["height"], width=REQUEST["width"],
                      num_frames=REQUEST["num_frames"], num_inference_steps=REQUEST["steps"],
                      guidance_scale=REQUEST["guidance"], generator=torch.Generator("cpu").manual_seed(SEED),
                      output_type="np", **kwargs).frames[0]
    else:
        from vidloom.core.deploy import DeployConfig
        from vidloom.core.request import GenerationRequest
        from vidloom.generator import VideoGenerator

        deploy = DeployConfig(offload_idle_expert=engine.endswith("offload_idle_expert"))
        gen = VideoGenerator.from_pretrained(folder, device=device, dtype=torch.float32, deploy=deploy)
        two = "guidance_scale_2" in gen.card.inputs
        loaded = time.perf_counter()
        frames = gen.engine.run(GenerationRequest(
            prompt=PROMPT, negative_prompt="", image=picture, height=REQUEST["height"], width=REQUEST["width"],
            num_frames=REQUEST["num_frames"], num_inference_steps=REQUEST["steps"],
            guidance_scale=REQUEST["guidance"], guidance_scale_2=REQUEST["guidance_2"] if two else None,
            flow_shift=REQUEST["shift"], seed=SEED))["video"]
        frames = frames.astype(np.float32) / 255 if frames.dtype == np.uint8 else frames
    done = time.perf_counter()
    np.save(out, np.asarray(frames, dtype=np.float32))
    peak_gpu = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return {"load_s": loaded - started, "generate_s": done - loaded,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "peak_gpu_mb":
            None if peak_gpu is None else peak_gpu / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--child", nargs=4, metavar=("FOLDER", "ENGINE", "IMAGE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        folder, engine, image, out = args.child
        print(json.dumps(run_one(Path(folder), engine, image == "1", Path(out))))
        return
    results: dict[str, Any] = {"request": REQUEST, "cases": {}}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case, spec in CASES.items():
            folder = ensure(spec["ckpt"])
            per_engine: dict[str, Any] = {}
            frames: dict[str, np.ndarray] = {}
            for engine in spec["engines"]:
                runs = []
                for i in range(args.runs):
                    out = Path(tmp) / f"{case}-{engine}-{i}.npy"
                    proc = subprocess.run([sys.executable, __file__, "--child", str(folder), engine,
                                           "1" if spec["image"] else "0", str(out)],
                                          capture_output=True, text=True, check=True)
                    runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
                frames[engine] = np.load(Path(tmp) / f"{case}-{engine}-0.npy")
                per_engine[engine] = {
                    "generate_s": statistics.median(r["generate_s"] for r in runs),
                    "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                    "peak_gpu_mb": runs[0]["peak_gpu_mb"],
                    "max_abs_diff_vs_diffusers": float(np.abs(frames[engine] - frames["diffusers"]).max()),
                    "runs": runs,
                }
            ref = per_engine["diffusers"]
            for engine, data in per_engine.items():
                data["time_ratio"] = data["generate_s"] / ref["generate_s"]
                data["rss_ratio"] = data["peak_rss_mb"] / ref["peak_rss_mb"]
                rows.append([case, engine, f"{data['generate_s']:.2f}", f"{data['time_ratio']:.2f}",
                             f"{data['peak_rss_mb']:.0f}", f"{data['rss_ratio']:.2f}",
                             f"{data['max_abs_diff_vs_diffusers']:.1e}"])
            results["cases"][case] = per_engine
    print_table(["case", "engine", "generate s", "x diffusers", "peak RSS MB", "x diffusers", "max diff"], rows)
    results["environment"] = environment()
    write_json("wan22.json", results)


if __name__ == "__main__":
    main()
