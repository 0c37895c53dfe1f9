"""GGUF transformer memory: resident weight bytes and peak RSS of loading (and one forward) vs bf16 safetensors.

A mid-size Wan2.1 transformer (the 1.3B model's widths: 12 heads x 128, ffn 8960, text 4096; --layers of its 30)
gets random weights, written once as a bf16 diffusers safetensors folder and as one GGUF file per quant type
(Q8_0 and the 32-value formats through gguf's quantizer, K-quants as valid random blocks: memory does not depend
on the values). Each measurement is a fresh process that loads the transformer the way a component override does
(vidloom.loading.component_file for the file; the folder reader for bf16), then runs one small forward in
bfloat16. It reports the bytes held by parameters and buffers, the RSS before loading (Python + torch), VmHWM
after the load and during the forward (VmHWM is reset in between), and the RSS after the forward. A GGUF file is
memory-mapped: its pages become resident when the forward first reads them, so the load alone looks free and
the peak of load + forward is the comparable number. Results: bench/results/gguf_memory.json (with the load average).

    python bench/gguf_memory.py [--layers 4] [--types Q8_0,Q6_K,Q5_K,Q4_K,Q4_0,Q3_K,Q2_K]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.report import environment  # noqa: E402

MID = dict(patch_size=[1, 2, 2], num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
           text_dim=4096, freq_dim=256, ffn_dim=8960, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
           eps=1e-6, rope_max_seq_len=1024)
TYPES = ("Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q4_0", "Q3_K", "Q2_K")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _config(layers: int) -> Any:
    from vidloom.models.wan.transformer_config import WanTransformerConfig

    return WanTransformerConfig.from_diffusers({**MID, "num_layers": layers})


def write_files(folder: Path, layers: int, types: tuple[str, ...]) -> None:
    """The bf16 folder (config + safetensors) and one GGUF per type, in diffusers key names."""
    from safetensors.torch import save_file

    from tests.helpers.gguf_files import write_gguf
    from vidloom.models.wan.transformer import WanTransformer
    from vidloom.models.wan.transformer_config import WAN_TRANSFORMER_NAME_MAP

    with torch.device("meta"):
        shapes = {k: v.shape for k, v in WanTransformer(_config(layers)).state_dict().items()}
    g = torch.Generator().manual_seed(0)
    state = {WAN_TRANSFORMER_NAME_MAP.to_checkpoint(k): torch.randn(s, generator=g) * 0.02 for k, s in shapes.items()}
    component = folder / "transformer"
    component.mkdir(parents=True)
    (component / "config.json").write_text(json.dumps({"_class_name": "WanTransformer3DModel", **MID,
                                                       "num_layers": layers}))
    save_file({k: v.bfloat16() for k, v in state.items()}, str(component / "diffusion_pytorch_model.safetensors"))
    for qtype in types:
        write_gguf(folder / f"{qtype}.gguf", state, qtype)


def measure(folder: Path, kind: str) -> dict[str, Any]:
    """In a fresh process: load the transformer from `kind` ("bf16" or a quant type), then one forward."""
    from vidloom.loading.component_file import load_component
    from vidloom.loading.precision import materialize
    from vidloom.models.wan.transformer import WanTransformer
    from vidloom.models.wan.transformer_config import WAN_TRANSFORMER_NAME_MAP

    torch.set_num_threads(1)
    config = _config(json.loads((folder / "transformer" / "config.json").read_text())["num_layers"])
    before = _status_kib("VmRSS")
    start = time.perf_counter()
    transformer = materialize(lambda: WanTransformer(config), torch.device("cpu"), torch.bfloat16,
                              WanTransformer.KEEP_FP32)
    file = None if kind == "bf16" else folder / f"{kind}.gguf"
    load_component(transformer, folder / "transformer", WAN_TRANSFORMER_NAME_MAP, file)
    load_s = time.perf_counter() - start
    peak_load = _status_kib("VmHWM")
    rss_loaded = _status_kib("VmRSS")
    tensors = {t.data_ptr(): t.numel() * t.element_size()
               for t in (*transformer.parameters(), *transformer.buffers())}
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM restarts from the current RSS: the forward's own peak
    forward_base = _status_kib("VmRSS")
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 16, 1, 16, 16, generator=g, dtype=torch.bfloat16)
    text = torch.randn(1, 16, 4096, generator=g, dtype=torch.bfloat16)
    start = time.perf_counter()
    with torch.no_grad():
        out = transformer(latents, torch.tensor([500.0]), text)
    return {"kind": kind, "resident_weight_bytes": sum(tensors.values()), "rss_before_load_kib": before,
            "rss_after_load_kib": rss_loaded, "peak_rss_load_kib": peak_load,
            "peak_rss_forward_kib": _status_kib("VmHWM"), "forward_base_kib": forward_base,
            "rss_after_forward_kib": _status_kib("VmRSS"), "load_s": round(load_s, 2),
            "forward_s": round(time.perf_counter() - start, 2), "output_finite": bool(out.isfinite().all())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--child", nargs=2, metavar=("FOLDER", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(Path(args.child[0]), args.child[1])))
        return
    types = tuple(args.types.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_files(folder, args.layers, types)
        runs = []
        for kind in ("bf16", *types):
            done = subprocess.run([sys.executable, __file__, "--child", str(folder), kind],
                                  capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{kind}: the measuring process failed:\n{done.stderr[-3000:]}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(runs[-1], flush=True)
    bf16 = next(r for r in runs if r["kind"] == "bf16")
    for run in runs:
        run["weights_vs_bf16"] = round(run["resident_weight_bytes"] / bf16["resident_weight_bytes"], 3)
        start = run["rss_before_load_kib"]
        run["load_peak_above_start_mib"] = round((run["peak_rss_load_kib"] - start) / 1024, 1)
        # The file's pages become resident as the forward first reads them: the peak of load + forward is the number.
        peak = max(run["peak_rss_load_kib"], run["peak_rss_forward_kib"])
        run["peak_above_start_mib"] = round((peak - start) / 1024, 1)
        run["peak_vs_bf16"] = round((peak - start) / (max(bf16["peak_rss_load_kib"], bf16["peak_rss_forward_kib"]) - bf16["rss_before_load_kib"]), 3)
        run["resident_after_forward_mib"] = round((run["rss_after_forward_kib"] - start) / 1024, 1)
    result = {"config": {**MID, "num_layers": args.layers}, "environment": environment(), "runs": runs}
    out = ROOT / "bench" / "results" / "gguf_memory.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
