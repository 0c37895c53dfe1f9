"""Cosmos3 world-model session: per-chunk latency (actions in -> frames out) vs one pipeline call per chunk.

One process, one random-weight checkpoint with the action pathway written by diffusers (MID below, or the
tests' tiny config with --tiny), three ways to roll the same forward_dynamics chunks out:

- python: `gen.open_session(...)`, then `session.step(actions)` per chunk (the prompt prefixes stay resident
  in the cache manager between chunks, kv_session_ttl_s set);
- websocket: the same session behind a real server (uvicorn in a thread, POST /v1/sessions, then one JSON
  message per chunk on /v1/sessions/{id}/ws, timed until the chunk's last JPEG frame has arrived);
- pipeline: `Cosmos3OmniPipeline(action=CosmosActionCondition(...))` once per chunk with the conditioning a
  session gives chunk k (image: the last uint8 frame of chunk k - 1, seed: seed + k, the same prompt, negative
  prompt and actions), frames out as uint8.

The three step in lockstep, the order rotating every chunk, so a busy neighbour slows them alike; each chunk
records the 1-minute load average and the busy fraction of the CPUs just before it. Chunk 0 of a session pays
the prompt prefill, the later ones reuse it, so the summary splits chunk 0 from the steady chunks (median).
Frames: the WebSocket's JPEGs are compared with the Python session's, the pipeline's with the session's
(each continues from its own last frame, so a one-level difference can grow over chunks: reported, not a test).

    OMP_NUM_THREADS=1 python bench/world_session.py [--chunks 5] [--steps 4] [--tiny]
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import world_bench as wb  # noqa: I001 (first: it puts the repository root on sys.path)
from report import print_table  # noqa: E402
from tests.helpers.cosmos3_action_checkpoints import COSMOS3_ACTION_A, write_tiny_cosmos3_action  # noqa: E402

# cosmos3_prefix.py's mid-size transformer with the action pathway (pusht padded into action_dim 10).
MID = dataclasses.replace(COSMOS3_ACTION_A, name="cosmos3-action-mid", transformer=dict(
    hidden_size=256, head_dim=32, num_attention_heads=8, num_key_value_heads=4, intermediate_size=768,
    num_hidden_layers=6, rope_theta=5000000.0, rope_axes_dim=(6, 5, 5), latent_channel=4, patch_latent_dim=16,
    rms_norm_eps=1e-6, action_gen=True, action_dim=10, num_embodiment_domains=8))
PROMPT = "the arm pushes the red block to the left"
NEGATIVE = "blurry"
DOMAIN, WIDTH = "pusht", 2
TIER, GUIDANCE, SEED = 256, 3.0, 11
PATHS = ("python", "websocket", "pipeline")
# (frame size, chunk_size) per scale: mid is the default tier's smallest canvas; tiny is the tests' setting.
SIZES = {"mid": ((192, 256), 8), "tiny": ((48, 64), 4)}


def _checkpoint(tiny: bool, cache: Path) -> Path:
    spec = COSMOS3_ACTION_A if tiny else MID
    return wb.cached_checkpoint(cache, spec.name, "model_index.json",
                                lambda folder: write_tiny_cosmos3_action(folder, spec))


def _first(size: tuple[int, int]) -> Any:
    return wb.first_frame(*size, seed=5)


def _drives(chunks: int, chunk: int) -> list[np.ndarray]:
    """A controller's pushes: a different [chunk, 2] action block every chunk."""
    rng = np.random.default_rng(3)
    return [rng.uniform(-1, 1, (chunk, WIDTH)).astype(np.float32) for _ in range(chunks)]


class PythonPath:
    def __init__(self, generator: Any, image: Any, chunk: int, steps: int) -> None:
        from vidloom import ActionInput

        block = ActionInput(mode="forward_dynamics", domain_name=DOMAIN, chunk_size=chunk, resolution_tier=TIER)
        self.session = generator.open_session(PROMPT, image=image, action=block, negative_prompt=NEGATIVE,
                                              num_inference_steps=steps, guidance_scale=GUIDANCE, seed=SEED)

    def step(self, actions: np.ndarray) -> np.ndarray:
        return self.session.step(actions).frames

    def close(self) -> None:
        self.session.close()


class WebSocketPath:
    """A session opened over HTTP and driven over a real WebSocket; a chunk ends with its last frame received."""

    def __init__(self, server: Any, image: Any, chunk: int, steps: int) -> None:
        import httpx
        from websockets.sync.client import connect

        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        body = {"prompt": PROMPT, "negative_prompt": NEGATIVE, "mode": "forward_dynamics", "domain_name": DOMAIN,
                "chunk_size": chunk, "resolution_tier": TIER, "num_inference_steps": steps,
                "guidance_scale": GUIDANCE, "seed": SEED,
                "input_reference": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()}
        opened = httpx.post(f"{server.url}/v1/sessions", json=body, timeout=60)
        opened.raise_for_status()
        self._socket = connect(server.url.replace("http://", "ws://") + f"/v1/sessions/{opened.json()['id']}/ws",
                               open_timeout=30, max_size=None)
        self.ws = self._socket.__enter__()
        assert json.loads(self.ws.recv(timeout=30))["type"] == "session"

    def step(self, actions: np.ndarray) -> np.ndarray:
        from PIL import Image

        self.ws.send(json.dumps({"actions": actions.tolist()}))
        header = json.loads(self.ws.recv(timeout=600))
        if header.get("type") != "chunk":
            raise RuntimeError(f"the session answered {header}")
        frames = [self.ws.recv(timeout=60) for _ in range(header["frames"])]
        return np.stack([np.asarray(Image.open(io.BytesIO(f)).convert("RGB")) for f in frames])

    def close(self) -> None:
        self._socket.__exit__(None, None, None)


class PipelinePath:
    """Cosmos3OmniPipeline once per chunk, conditioned as the session conditions chunk k."""

    def __init__(self, folder: Path, image: Any, chunk: int, steps: int) -> None:
        from diffusers import Cosmos3OmniPipeline

        self.pipe = Cosmos3OmniPipeline.from_pretrained(folder, enable_safety_checker=False)
        self.pipe.set_progress_bar_config(disable=True)
        self.image, self.chunk, self.steps, self.index = image, chunk, steps, 0

    def step(self, actions: np.ndarray) -> np.ndarray:
        import torch
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
        from PIL import Image

        condition = CosmosActionCondition(mode="forward_dynamics", chunk_size=self.chunk, domain_name=DOMAIN,
                                          resolution_tier=TIER, raw_actions=torch.from_numpy(actions),
                                          image=self.image)
        out = self.pipe(PROMPT, negative_prompt=NEGATIVE, action=condition, num_inference_steps=self.steps,
                        guidance_scale=GUIDANCE, generator=torch.Generator("cpu").manual_seed(SEED + self.index),
                        output_type="np", enable_safety_check=False)
        frames = (np.clip(np.asarray(out.video), 0, 1) * 255).round().astype(np.uint8)
        self.image, self.index = Image.fromarray(frames[-1]), self.index + 1
        return frames

    def close(self) -> None:
        pass


def run(folder: Path, chunks: int, steps: int, size: tuple[int, int], chunk: int, max_wait: float) -> dict[str, Any]:
    from tests.helpers.servers import ThreadServer
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator
    from vidloom.serving.config import ServeConfig

    generator = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(kv_session_ttl_s=600))
    image, drives = _first(size), _drives(chunks, chunk)
    with tempfile.TemporaryDirectory() as data, ThreadServer(generator.engine, ServeConfig(
            data_dir=Path(data), graceful_shutdown_s=2)) as server:
        # Warm-up: one 1-step chunk on each path (first-call allocations, lazy imports), not timed.
        for warm in (PythonPath(generator, image, chunk, 1), WebSocketPath(server, image, chunk, 1),
                     PipelinePath(folder, image, chunk, 1)):
            warm.step(drives[0])
            warm.close()
        paths = {"python": PythonPath(generator, image, chunk, steps),
                 "websocket": WebSocketPath(server, image, chunk, steps),
                 "pipeline": PipelinePath(folder, image, chunk, steps)}
        rows, frames = [], {name: [] for name in PATHS}
        for k in range(chunks):
            order = PATHS[k % 3:] + PATHS[:k % 3]
            for name in order:
                machine = wb.before_run(max_wait)
                wall0, cpu0 = wb.clock()
                frames[name].append(paths[name].step(drives[k]))
                wall1, cpu1 = wb.clock()
                rows.append({"chunk": k, "path": name, "wall_s": round(wall1 - wall0, 4),
                             "cpu_s": round(cpu1 - cpu0, 4), **machine})
                print(f"chunk {k} {name:>9}: {rows[-1]['wall_s']:.3f} s (load {machine['loadavg_1m']:.2f})",
                      file=sys.stderr, flush=True)
        for path in paths.values():
            path.close()
    return {"rows": rows, "frames": _frame_diffs(frames), "dtype": str(generator.engine.instance.dtype)}


def _frame_diffs(frames: dict[str, list[np.ndarray]]) -> dict[str, list[float]]:
    """Per chunk: max uint8 difference of the pipeline's frames and mean of the JPEG's, vs the Python session."""
    def diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.abs(a.astype(int) - b.astype(int))

    return {
        "pipeline_vs_python_max_levels": [int(diff(p, s).max()) for p, s in zip(frames["pipeline"], frames["python"])],
        "websocket_jpeg_vs_python_mean_levels": [round(float(diff(w, s).mean()), 2)
                                                 for w, s in zip(frames["websocket"], frames["python"])],
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Chunk 0 and the median steady chunk per path, and the pipeline's time over each session path's."""
    out: dict[str, Any] = {}
    for name in PATHS:
        mine = [r for r in rows if r["path"] == name]
        steady = [r for r in mine if r["chunk"] > 0] or mine
        out[name] = {"first_chunk_s": mine[0]["wall_s"],
                     "steady_chunk_s": round(statistics.median(r["wall_s"] for r in steady), 4),
                     "steady_chunk_cpu_s": round(statistics.median(r["cpu_s"] for r in steady), 4)}
    for name in ("python", "websocket"):
        for key in ("first_chunk_s", "steady_chunk_s", "steady_chunk_cpu_s"):
            out[f"pipeline_over_{name}_{key.removesuffix('_s')}"] = round(out["pipeline"][key] / out[name][key], 2)
    out["websocket_over_python_steady_chunk"] = round(out["websocket"]["steady_chunk_s"]
                                                      / out["python"]["steady_chunk_s"], 2)
    out["loadavg_1m_mean"] = round(statistics.mean(r["loadavg_1m"] for r in rows), 2)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = wb.parser(__doc__, max_wait=3.0, per="chunk")
    parser.add_argument("--chunks", type=int, default=5, help="chunks per path (the first pays the prefill)")
    parser.add_argument("--steps", type=int, default=4, help="denoise steps per chunk")
    parser.add_argument("--dtype", choices=("float32", "default"), default="float32",
                        help="vidloom's CPU dtype: float32 (the pipeline's, frames comparable) or the runtime's "
                             "default (bfloat16 on a CPU with native bf16)")
    args = parser.parse_args(argv)
    scale = "tiny" if args.tiny else "mid"
    wb.one_thread(float32=args.dtype == "float32")
    size, chunk = SIZES[scale]
    folder = _checkpoint(args.tiny, args.cache)
    started, env = wb.start()
    result = run(folder, args.chunks, args.steps, size, chunk, wb.max_wait_of(args, 3.0))
    summary = summarize(result["rows"])
    print_table(["path", "chunk 0 s", "steady chunk s (median)", "steady CPU s"],
                [[n, f"{summary[n]['first_chunk_s']:.3f}", f"{summary[n]['steady_chunk_s']:.3f}",
                  f"{summary[n]['steady_chunk_cpu_s']:.3f}"] for n in PATHS])
    print(json.dumps({k: v for k, v in summary.items() if k not in PATHS}, indent=1))
    config = {"scale": scale, "model": (COSMOS3_ACTION_A if args.tiny else MID).transformer,
              "frame_size": list(size), "chunk_size": chunk, "chunks": args.chunks, "steps": args.steps,
              "guidance": GUIDANCE, "resolution_tier": TIER, "domain": DOMAIN, "torch_threads": 1,
              "vidloom_dtype": result["dtype"], "pipeline_dtype": "float32", "websocket_format": "jpeg"}
    return wb.save(args.out or f"world_session-{scale}-cpu.json",
                   "Cosmos3 forward_dynamics chunks: Python session, WebSocket session, Cosmos3OmniPipeline per chunk",
                   config, env, summary, result, started)


if __name__ == "__main__":
    main()
