"""VAE decode, vidloom vs diffusers, per family: same random weights (real published widths), same latents.

Per family and round, in alternating order: vidloom float32, vidloom at its CPU default (bfloat16 on CPUs
with native bf16 matmul, channels-last), diffusers float32 `vae.decode`. Seconds are the best of the rounds;
PSNR is each output against diffusers float32 on [0, 1] pixels. The load average is recorded per run, and process
CPU seconds next to wall seconds (on a shared machine the CPU seconds of a one-thread run move least).

    python bench/vae_decode.py [--families wan2.1,wan2.2,flux2] [--rounds 2] [--size small]
    OMP_NUM_THREADS=1 python bench/vae_decode.py --families wan2.2-ti2v-mid --rounds 3  # the TI2V bench checkpoint
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RESULTS, environment  # noqa: E402

# Latent shapes per size: small fits a shared 2-core CPU; mid is 480x832 x 17 frames (Wan) / 1024^2 (Flux2).
SIZES = {
    "small": {"wan2.1": (1, 16, 2, 16, 24), "wan2.2": (1, 48, 2, 8, 12), "flux2": (1, 128, 16, 16),
              "ltx2": (1, 32, 4, 8, 8), "wan2.2-ti2v-mid": (1, 48, 3, 16, 16),
              "wan2.1-mid": (1, 16, 3, 32, 32)},
    "mid": {"wan2.1": (1, 16, 5, 60, 104), "wan2.2": (1, 48, 5, 30, 52), "flux2": (1, 128, 64, 64),
            "ltx2": (1, 32, 4, 16, 16), "wan2.2-ti2v-mid": (1, 48, 3, 16, 16),
              "wan2.1-mid": (1, 16, 3, 32, 32)},
}
Decode = Callable[[torch.Tensor], torch.Tensor]


def _wan(config_kwargs: dict[str, Any]) -> tuple[Callable[[torch.dtype], Decode], Decode]:
    from diffusers import AutoencoderKLWan

    from vidloom.models.wan.vae import WAN_VAE_NAME_MAP, WanVAE, WanVAEConfig

    config = WanVAEConfig(**config_kwargs)
    torch.manual_seed(0)
    ref = AutoencoderKLWan.from_config(config.to_diffusers()).eval()
    state = {WAN_VAE_NAME_MAP.to_module(k): v for k, v in ref.state_dict().items()}

    def ours(dtype: torch.dtype) -> Decode:
        vae = WanVAE(config)
        vae.load_state_dict(state)
        vae = vae.to(dtype).eval()
        return lambda z: vae.decode(z.to(dtype)).float()

    return ours, lambda z: ref.decode(z).sample.clamp(-1, 1)


def _wan_checkpoint(name: str) -> tuple[Callable[[torch.dtype], Decode], Decode]:
    """The Wan VAE of bench/family_bench.py's checkpoint `name` (its real latent shape: SIZES), both sides from it."""
    from diffusers import AutoencoderKLWan
    from family_bench import FAMILIES as CHECKPOINTS

    from vidloom.loading.component_file import load_component
    from vidloom.loading.diffusers_dir import DiffusersDir
    from vidloom.models.wan.original_layout import wan_vae_layouts
    from vidloom.models.wan.vae import WAN_VAE_NAME_MAP, WanVAE, WanVAEConfig

    folder = DiffusersDir.open(CHECKPOINTS[name].checkpoint())
    config = folder.parse_component("vae", WanVAEConfig.from_diffusers)
    ref = AutoencoderKLWan.from_pretrained(str(folder.component_dir("vae"))).eval()

    def ours(dtype: torch.dtype) -> Decode:
        vae = WanVAE(config)
        load_component(vae, folder.component_dir("vae"), WAN_VAE_NAME_MAP, None, wan_vae_layouts(config))
        vae = vae.to(dtype).eval()
        return lambda z: vae.decode(z.to(dtype)).float()

    return ours, lambda z: ref.decode(z).sample.clamp(-1, 1)


def _flux2() -> tuple[Callable[[torch.dtype], Decode], Decode]:
    from diffusers import AutoencoderKLFlux2

    from vidloom.families.flux2.vae import FLUX2_VAE_NAME_MAP, Flux2VAE, Flux2VAEConfig

    torch.manual_seed(0)
    ref = AutoencoderKLFlux2().eval()  # the published FLUX.2 VAE config is the class default
    config = Flux2VAEConfig.from_diffusers(dict(ref.config))
    state = {FLUX2_VAE_NAME_MAP.to_module(k): v for k, v in ref.state_dict().items()}
    mean = ref.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(ref.bn.running_var.view(1, -1, 1, 1) + ref.config.batch_norm_eps)

    def ours(dtype: torch.dtype) -> Decode:
        vae = Flux2VAE(config)
        vae.load_state_dict(state)
        vae = vae.to(dtype).eval()
        return lambda z: vae.decode(z.to(dtype)).float().clamp(-1, 1)

    def reference(z: torch.Tensor) -> torch.Tensor:
        from vidloom.families.flux2.vae import unpatchify

        return ref.decode(unpatchify(z * std + mean)).sample.clamp(-1, 1)

    return ours, reference


def _ltx2() -> tuple[Callable[[torch.dtype], Decode], Decode]:
    """LTX-2's video VAE as bench/family_bench.py's ltx2-mid checkpoint has it (its latents: 25 frames of 256^2)."""
    from diffusers import AutoencoderKLLTX2Video
    from family_bench import FAMILIES as CHECKPOINTS

    from vidloom.layers.memory_format import use_channels_last
    from vidloom.models.ltx2.checkpoint import load_video_vae

    folder = CHECKPOINTS["ltx2-mid"].checkpoint() / "vae"
    ref = AutoencoderKLLTX2Video.from_pretrained(str(folder)).eval()
    timestep = torch.tensor([0.05]) if ref.config.timestep_conditioning else None

    def ours(dtype: torch.dtype) -> Decode:
        vae = load_video_vae(folder, dtype=dtype)
        if dtype == torch.bfloat16:
            use_channels_last(vae)  # as the fast path loads it (vidloom/families/ltx2/load.py)
        step = None if timestep is None else timestep.to(dtype)
        return lambda z: (torch.manual_seed(0), vae.decode(z.to(dtype), step))[1].float().clamp(-1, 1)

    def reference(z: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(0)  # the decoder's noise injection, where the config enables it
        return ref.decode(z, timestep).sample.clamp(-1, 1)

    return ours, reference


FAMILIES: dict[str, Callable[[], tuple[Callable[[torch.dtype], Decode], Decode]]] = {
    "wan2.1": lambda: _wan({}),
    "wan2.2": lambda: _wan(dict(base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=(1, 2, 4, 4),
                                num_res_blocks=2, is_residual=True, patch_size=2, in_channels=12, out_channels=12,
                                latents_mean=(0.0,) * 48, latents_std=(1.0,) * 48)),
    "flux2": _flux2,
    "ltx2": _ltx2,
    "wan2.2-ti2v-mid": lambda: _wan_checkpoint("wan2.2-ti2v-mid"),
    "wan2.1-mid": lambda: _wan_checkpoint("wan2.1-mid"),
}


def psnr(ours: torch.Tensor, reference: torch.Tensor) -> float:
    mse = float(((ours.float() - reference.float()) * 0.5).pow(2).mean())  # [-1, 1] -> [0, 1] pixels
    return float("inf") if mse == 0 else 10.0 * float(torch.log10(torch.tensor(1.0 / mse)))


def run_family(name: str, latents_shape: tuple[int, ...], rounds: int, default: torch.dtype) -> dict[str, Any]:
    ours, reference = FAMILIES[name]()
    z = torch.randn(latents_shape, generator=torch.Generator().manual_seed(1))
    settings = {"vidloom float32": ours(torch.float32), f"vidloom default ({str(default)[6:]})": ours(default),
                "diffusers float32": reference}
    times: dict[str, list[float]] = {key: [] for key in settings}
    cpu: dict[str, list[float]] = {key: [] for key in settings}  # process CPU seconds: steadier under load
    loads: list[float] = []
    outputs: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for r in range(rounds):
            order = list(settings) if r % 2 == 0 else list(reversed(settings))  # A,B,C then C,B,A
            for key in order:
                loads.append(round(os.getloadavg()[0], 2))
                start, start_cpu = time.perf_counter(), time.process_time()
                outputs[key] = settings[key](z)
                times[key].append(round(time.perf_counter() - start, 3))
                cpu[key].append(round(time.process_time() - start_cpu, 3))
    ref_out = outputs["diffusers float32"]
    diffusers_s, diffusers_cpu = min(times["diffusers float32"]), min(cpu["diffusers float32"])
    rows = {key: {"seconds": times[key], "best_s": min(times[key]),
                  "vs_diffusers": round(diffusers_s / min(times[key]), 2),
                  "cpu_seconds": cpu[key], "cpu_vs_diffusers": round(diffusers_cpu / min(cpu[key]), 2),
                  "psnr_vs_diffusers_fp32_db": round(psnr(outputs[key], ref_out), 1)} for key in settings}
    return {"latents": list(latents_shape), "rounds": rounds, "threads": torch.get_num_threads(),
            "loadavg_per_run": loads, "settings": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--out", default=str(RESULTS / "vae_decode.json"))
    args = parser.parse_args()
    from vidloom.loading.precision import cpu_default_dtype

    default = cpu_default_dtype()
    report: dict[str, Any] = {"environment": environment(), "size": args.size, "families": {}}
    for name in args.families.split(","):
        if name not in FAMILIES:
            raise SystemExit(f"--families: unknown {name!r}; known: {', '.join(FAMILIES)}")
        report["families"][name] = run_family(name, SIZES[args.size][name], args.rounds, default)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")  # after each family: partial runs keep rows
        for key, row in report["families"][name]["settings"].items():
            print(f"{name:8s} {key:28s} best {row['best_s']:8.2f} s  x{row['vs_diffusers']:.2f} vs diffusers  "
                  f"(CPU x{row['cpu_vs_diffusers']:.2f})  PSNR {row['psnr_vs_diffusers_fp32_db']} dB", flush=True)
    report["environment"]["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
