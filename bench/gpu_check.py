"""The one-shot GPU check's benchmark driver (run by bench/gpu_check.sh; see README "GPU check").

    python bench/gpu_check.py --dry-run [--out DIR]      environment + plan + estimated total (any machine)
    python bench/gpu_check.py --check-env [--out DIR]    environment only; exit 2 if the real run cannot start
    python bench/gpu_check.py [--out DIR] [--started EPOCH] [--tests-rc N]   the real run (CUDA)

The real run writes the random-weight Wan2.1-1.3B checkpoint once, then runs every
configuration of bench/gpu_plan.py in its own process, diffusers first (the reference
latents), then the Wan2.2 TI2V-5B DiT and the FAR, Flux2, LTX-2 and Cosmos3 denoisers alone at
their published sizes (bench/gpu_family_workers.py), skipping rows whose package is missing or
whose estimate no longer fits the budget, and writes everything to DIR/gpu_check.json after each row.
Where two GPUs or more are visible, every generation family's two-GPU row (bench/parallel_families.py: one
process, then --sp 2) runs first, as only such a machine can measure it; on one GPU those rows are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
for path in (str(ROOT), str(BENCH)):
    if path not in sys.path:
        sys.path.insert(0, path)

from gpu_plan import (  # noqa: E402
    BUDGET_S, CONFIGS, DEFAULT_STEP_CACHE, DIT_ROWS, ESTIMATE_GPU, FAMILY_ROWS, FULL_STEPS, LORA_ROWS, PARALLEL_ROWS,
    PEAK_BF16_FLOPS, REFERENCE, STEP_CACHE_CONFIGS, TIMED_STEPS,
    forward_flops, module_available, plan_lines, step_flops,
)

DEFAULT_OUT = ROOT / "bench" / "results" / "gpu"
WORKER_TIMEOUT_S = 300.0  # one configuration at most; compile is the slow one
MIN_WORKER_S = 20.0  # a row with less budget left than this is skipped, not started
STDERR_LINES = 40  # of a failed row's output, kept in the JSON (a CUDA traceback is long)


def environment() -> dict[str, Any]:
    """What the run needs, found or not; no installs."""
    env: dict[str, Any] = {"python": platform.python_version(), "cpu_count": os.cpu_count()}
    for package in ("torch", "diffusers", "transformers", "flash-attn", "sageattention", "vidloom"):
        try:
            env[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            env[package] = None
    try:
        import torch
    except ImportError:
        env["cuda"] = None
        return env
    env["torch_cuda"] = torch.version.cuda
    env["cuda"] = torch.cuda.is_available()
    env["gpu_count"] = torch.cuda.device_count() if env["cuda"] else 0
    if env["cuda"]:
        env["gpu"] = torch.cuda.get_device_name()
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    env["disk_free_gib"] = round(shutil.disk_usage(tempfile.gettempdir()).free / 2**30, 1)
    return env


def problems(env: dict[str, Any]) -> list[str]:
    """Why the real run cannot start here (empty: it can)."""
    found = []
    if env.get("torch") is None:
        found.append("torch is not installed (README: install the CUDA build of PyTorch, then pip install -e .)")
    elif not env.get("cuda"):
        found.append(f"torch {env['torch']} sees no CUDA device (a CPU build, or no GPU)")
    if env.get("diffusers") is None or env.get("transformers") is None:
        found.append("diffusers and transformers are needed (pip install -e .; on the lent GPU image, "
                     "`bench/gpu_check.sh --prepare` here first and carry .whl)")
    if env.get("disk_free_gib", 0) < 10:
        found.append(f"{env.get('disk_free_gib')} GiB free in {tempfile.gettempdir()}; the checkpoint needs ~4 GiB")
    return found


def skipped_configs(env: dict[str, Any]) -> dict[str, str]:
    """Rows that cannot run here, and why (before any budget decision)."""
    skipped = {}
    for config in CONFIGS:
        if config.needs and not module_available(config.needs):
            skipped[config.name] = f"{config.needs} is not installed"
    if os.environ.get("GPU_CHECK_LORA") != "1":  # the default plan fills the budget without it
        for row in LORA_ROWS:
            skipped[row.name] = "opt-in (GPU_CHECK_LORA=1; then give it the time of another row)"
    if os.environ.get("GPU_CHECK_STEP_CACHE") != "1":
        for config in STEP_CACHE_CONFIGS:
            if config.name != DEFAULT_STEP_CACHE:
                skipped[config.name] = "opt-in (GPU_CHECK_STEP_CACHE=1; then give them the time of other rows)"
    for row in PARALLEL_ROWS:
        if env.get("gpu_count", 0) < row.gpus:
            skipped[row.name] = f"needs {row.gpus} GPUs ({env.get('gpu_count', 0)} visible)"
    return skipped


def print_environment(env: dict[str, Any]) -> None:
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))


def dry_run(out: Path) -> int:
    env = environment()
    print_environment(env)
    for problem in problems(env):
        print(f"note: the real run would stop here: {problem}")
    writable = os.access(out if out.exists() else out.parent, os.W_OK)
    print(f"results folder: {out} ({'writable' if writable else 'NOT writable'})")
    skipped = skipped_configs(env)
    lines, total = plan_lines(skipped)
    print("\n".join(lines))
    print(f"estimated total: {round(total)} s")
    return 0


def _peak_flops(env: dict[str, Any]) -> tuple[float | None, str]:
    for name, peak in PEAK_BF16_FLOPS.items():
        if name in (env.get("gpu") or ""):
            return peak, name
    return None, "unknown GPU: no datasheet peak, MFU not computed"


def _spawn(name: str, checkpoint: Path | None, latents: Path | None,
           timeout_s: float = WORKER_TIMEOUT_S) -> dict[str, Any]:
    """Run one row in its own process for at most `timeout_s` (capped by the caller at the budget left);
    a DiT row (no checkpoint) times its denoiser alone."""
    command = [sys.executable, str(Path(__file__)), "--worker", name]
    if checkpoint is not None and latents is not None:
        command += ["--checkpoint", str(checkpoint), "--latents", str(latents)]
    proc = _run(command, timeout_s)
    if isinstance(proc, dict):
        return proc
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1].removeprefix("RESULT ")) if lines else _failed(proc)


def _run(command: list[str], timeout_s: float) -> subprocess.CompletedProcess[str] | dict[str, Any]:
    """`command` with this checkout and bench/ importable, for at most `timeout_s`: the finished process if it
    exited 0, else the row's error."""
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(BENCH), os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=environ)
    except subprocess.TimeoutExpired as exc:
        return {"error": f"timed out after {timeout_s:.0f} s", "output_tail": _tail(exc.stderr or exc.stdout)}
    return proc if proc.returncode == 0 else _failed(proc)


def _failed(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    tail = _tail(proc.stderr or proc.stdout)
    return {"error": f"exit {proc.returncode}: " + (tail[-1] if tail else "no output"), "output_tail": tail}


def _tail(text: str | bytes | None) -> list[str]:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "").strip().splitlines()[-STDERR_LINES:]


def _score(rows: dict[str, dict[str, Any]], latents: dict[str, Path], env: dict[str, Any]) -> dict[str, Any]:
    """Adds the 50-step extrapolation, MFU and the difference from diffusers' latents to each row."""
    import torch

    peak, peak_name = _peak_flops(env)
    reference = torch.load(latents[REFERENCE]) if REFERENCE in latents else None
    for name, row in rows.items():
        if "s_per_step" not in row:
            continue
        row["denoise_50_steps_s"] = round(row["s_per_step"] * FULL_STEPS, 1)
        row["mfu"] = round(step_flops() / row["s_per_step"] / peak, 3) if peak else None
        if reference is not None and name in latents:
            diff = (torch.load(latents[name]) - reference).abs()
            row["max_abs_diff_vs_diffusers"] = float(diff.max())
            row["max_rel_diff_vs_diffusers"] = float(diff.max() / reference.abs().max())
    return {"gpu": peak_name, "bf16_peak_tflops": peak / 1e12 if peak else None}


def real_run(out: Path, started: float, tests_rc: int | None) -> int:
    env = environment()
    print_environment(env)
    if found := problems(env):
        print("cannot run: " + "; ".join(found))
        return 2
    from gpu_workers import write_checkpoint

    out.mkdir(parents=True, exist_ok=True)
    skipped = skipped_configs(env)
    rows: dict[str, dict[str, Any]] = {}
    report: dict[str, Any] = {
        "environment": env, "tests_gpu_exit_status": tests_rc, "timed_steps": TIMED_STEPS,
        "flops_per_step": step_flops(), "flops_per_forward": forward_flops(),
        "flop_formula": "per block 8SD^2 + 4S^2D + 4SD^2 + 4TD^2 + 4STD + 4SDF (x30) + embeddings; "
                        "x2 forwards per step (CFG); bench/gpu_plan.py:forward_flops",
        "text_encoder": "small random UMT5 (2 layers, width 4096) over an offline-trained tokenizer",
        "estimates_for": ESTIMATE_GPU, "configs": rows, "skipped": skipped,
    }
    _write(out, report, started)  # from here on a JSON exists, whatever fails next
    failed = False
    try:
        with tempfile.TemporaryDirectory(prefix="vidloom-gpu-check-") as tmp:
            t0 = time.time()
            try:
                checkpoint = write_checkpoint(Path(tmp) / "wan2.1-1.3b-random")
            except Exception as exc:  # noqa: BLE001 - recorded in the JSON; no row can run without it
                report["checkpoint_error"] = f"{type(exc).__name__}: {exc}"
                print(f"checkpoint write failed: {report['checkpoint_error']}", flush=True)
                return 1
            report["checkpoint_write_s"] = round(time.time() - t0, 1)
            print(f"checkpoint written in {report['checkpoint_write_s']} s", flush=True)
            _write(out, report, started)
            failed = _run_rows(rows, skipped, checkpoint, Path(tmp), env, report, out, started)
    finally:
        for name, why in skipped.items():
            print(f"skipped {name}: {why}")
        _write(out, report, started)
        print(f"wrote {out / 'gpu_check.json'} after {report['total_s']} s")
    return 1 if failed else 0


def _run_rows(rows: dict[str, dict[str, Any]], skipped: dict[str, str], checkpoint: Path, tmp: Path,
              env: dict[str, Any], report: dict[str, Any], out: Path, started: float) -> bool:
    """Every row in its own process, within the budget; the JSON rewritten after each. True if one failed."""
    latents: dict[str, Path] = {}
    # Only a machine with several GPUs can measure the parallel rows: there they come first.
    _run_parallel_rows(rows, skipped, report, out, started)
    for config in CONFIGS:
        left = _time_left(config, skipped, started)
        if left is None:
            continue
        path = tmp / f"{config.name.replace(' ', '_')}.pt"
        # A slow row is stopped when the budget runs out, so the script ends within the device's command limit.
        row = _spawn(config.name, checkpoint, path, timeout_s=min(WORKER_TIMEOUT_S, left))
        row["estimate_s"] = round(config.estimate_s(), 1)
        rows[config.name] = row
        if "error" not in row:
            latents[config.name] = path
        print(f"  {config.name}: {row.get('s_per_step', row.get('error'))} s/step "
              f"({row.get('worker_s', '?')} s in all)", flush=True)
        try:
            report["mfu_peak"] = _score(rows, latents, env)
        except Exception as exc:  # noqa: BLE001 - a scoring bug must not cost the measurements
            report["scoring_error"] = f"{type(exc).__name__}: {exc}"
        _write(out, report, started)  # after every row: a cut-short slot still leaves results
    peak, _ = _peak_flops(env)
    # DiT and LoRA rows: FLOPs per step from the shape; FAR, Flux2, LTX-2 and Cosmos3 denoisers: counted in the run.
    _run_alone((*DIT_ROWS, *LORA_ROWS), lambda dit, row: dit.step_flops(), rows, skipped, peak, report, out, started)
    _run_alone(FAMILY_ROWS, lambda fam, row: row.get("flops_per_step"), rows, skipped, peak, report, out, started)
    return any("error" in r for r in rows.values())


def _run_parallel_rows(rows: dict[str, dict[str, Any]], skipped: dict[str, str], report: dict[str, Any],
                       out: Path, started: float) -> None:
    """The two-GPU rows (skipped on a one-GPU machine), within what is left of the budget."""
    for spec in PARALLEL_ROWS:
        left = _time_left(spec, skipped, started)
        if left is not None:
            rows[spec.name] = _run_parallel(spec, out, min(WORKER_TIMEOUT_S, left))
            print(f"  {spec.name}: {rows[spec.name].get('error') or 'done'}", flush=True)
            _write(out, report, started)


def _run_parallel(spec: Any, out: Path, timeout_s: float) -> dict[str, Any]:
    """bench/parallel_families.py on one family's plans (each a fresh pool of its GPUs); its JSON's rows."""
    path = out / f"parallel-{spec.family}.json"
    command = [sys.executable, str(BENCH / "parallel_families.py"), "--families", spec.family, "--plans", spec.plans,
               "--device", "cuda", "--runs", "1", "--quiet-wait", "5", "--json", str(path.resolve())]
    proc = _run(command, timeout_s)
    if isinstance(proc, dict):
        return proc
    if not path.exists():
        return _failed(proc)
    return {"estimate_s": round(spec.estimate_s(), 1), **json.loads(path.read_text())["families"][spec.family]}


def _time_left(spec: Any, skipped: dict[str, str], started: float) -> float | None:
    """Seconds of the budget left for `spec`'s row; None when it is skipped (already, or now: its estimate
    does not fit in what is left)."""
    if spec.name in skipped:
        return None
    elapsed, estimate = time.time() - started, spec.estimate_s()
    left = BUDGET_S - elapsed
    if estimate > left or left < MIN_WORKER_S:
        skipped[spec.name] = f"budget: {elapsed:.0f} s used + {estimate:.0f} s estimated > {BUDGET_S:.0f} s"
        return None
    return left


def _run_alone(specs: tuple[Any, ...], flops: Callable[[Any, dict[str, Any]], float | None],
               rows: dict[str, dict[str, Any]], skipped: dict[str, str], peak: float | None,
               report: dict[str, Any], out: Path, started: float) -> None:
    """Rows that need no checkpoint, each in its own process within what is left of the budget; a row's MFU
    from `flops(spec, row)` per step (None: not known) over the device's peak."""
    for spec in specs:
        left = _time_left(spec, skipped, started)
        if left is None:
            continue
        row = _spawn(spec.name, None, None, timeout_s=min(WORKER_TIMEOUT_S, left))
        row["estimate_s"] = round(spec.estimate_s(), 1)
        per_step = flops(spec, row) if "s_per_step" in row else None
        if per_step and peak:
            row["mfu"] = round(per_step / row["s_per_step"] / peak, 3)
        rows[spec.name] = row
        print(f"  {spec.name}: {row.get('s_per_step', row.get('error'))} s/step", flush=True)
        _write(out, report, started)


def _write(out: Path, report: dict[str, Any], started: float) -> None:
    report["total_s"] = round(time.time() - started, 1)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or DEFAULT_OUT))
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--check-env", action="store_true")
    parser.add_argument("--started", type=float, default=None, help="epoch seconds the whole check began")
    parser.add_argument("--tests-rc", type=int, default=None, help="exit status of the tests/gpu run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--latents", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        from gpu_workers import print_result, run_dit_worker, run_worker

        dits = {row.name: row for row in DIT_ROWS}
        loras = {row.name: row for row in LORA_ROWS}
        families = {row.name: row for row in FAMILY_ROWS}
        if args.worker in loras:
            from gpu_lora_worker import run_lora_worker

            print_result(run_lora_worker(loras[args.worker]))
        elif args.worker in dits:
            print_result(run_dit_worker(dits[args.worker]))
        elif args.worker in families:
            from gpu_family_workers import run_family_worker

            print_result(run_family_worker(families[args.worker]))
        else:
            print_result(run_worker(args.worker, args.checkpoint, args.latents))
        return 0
    if args.dry_run:
        return dry_run(args.out)
    if args.check_env:
        env = environment()
        print_environment(env)
        found = problems(env)
        for problem in found:
            print(f"cannot run: {problem}")
        return 2 if found else 0
    return real_run(args.out, args.started or time.time(), args.tests_rc)


if __name__ == "__main__":
    sys.exit(main())
