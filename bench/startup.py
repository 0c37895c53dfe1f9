"""What a fresh `vidloom` process pays before and after its work: `--help`, `models`, and a cached demo's
`generate` (its --timings phases, its own wall-time line, and the parent's clock, which adds the teardown).

Each run is a new process, as a user's command is. The demo is written into the cache by one unmeasured run
first, so every measured run is the cached case. The load average is recorded with each run: on a shared
machine wall times swing with it, the phases' CPU seconds much less. `--root` runs another source tree (an
older commit exported with `git archive`) under the same conditions, for a before/after; a tree without
`--timings` gives the wall-time line and the parent's clock only. `--importtime` adds one `python -X importtime`
run of the generate command: the top-level imports that cost the most, cumulative. `--bytecode` lets the runs
cache compiled bytecode (in a temp PYTHONPYCACHEPREFIX, written by the unmeasured first run), as an installed
package's .pyc files do: where PYTHONDONTWRITEBYTECODE is set, a source tree on PYTHONPATH is otherwise compiled
again by every run (vidloom's own ~170 modules on the generate path: 0.3-0.5 s on a 2-core machine). `--floor`
adds, beside each run, bare interpreters that import the libraries the demo's generate uses, stage by stage (torch,
transformers, the text encoder's classes, and their `from_pretrained` of the demo's encoder and tokenizer), each
ending as generate does (`os._exit`, no teardown): the part of the gap that no vidloom code is in; and "own", the
last stage followed by generate in the same process, whose phases after start-up are vidloom's own share.

    python bench/startup.py [--model wan2.1-demo] [--runs 3] [--root DIR] [--importtime] [--bytecode] [--floor]
                            [--out FILE.json]

Prints one JSON object: the runs, their medians, and `gap_s` = the parent's wall time minus the reported
generation time, the figure issue #36 asks to bring within 3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TINY = ("--height", "32", "--width", "48", "--frames", "5", "--steps", "2", "--seed", "1")
WALL = re.compile(r"wall time ([\d.]+)s from process start \(load ([\d.]+)s, generation ([\d.]+)s\)")
TIMING = re.compile(r"^timing (.+?) ([\d.]+)s(?: ([\d.]+)s cpu)?$", re.MULTILINE)
IMPORT = re.compile(r"^import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)$", re.MULTILINE)
# The floor's stages: each program is the ones before it plus its own line, run alone in a fresh interpreter.
FLOOR = (
    ("interpreter", "pass"),
    ("torch", "import torch"),
    ("transformers", "import transformers"),
    ("encoder classes", "from transformers import AutoTokenizer, {encoder}"),
    ("encoder load", "AutoTokenizer.from_pretrained({tokenizer!r}); {encoder}.from_pretrained({text_encoder!r})"),
)


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _vidloom(root: Path, args: list[str], env: dict[str, str], extra: tuple[str, ...] = (),
             cpu: list[float] | None = None) -> tuple[float, str, str]:
    """Run `python [extra] -m vidloom.cli args` from `root`; (parent's wall seconds, stdout, stderr). `cpu` gets
    the child's CPU seconds (user + system, all threads): under load they move much less than wall time."""
    cpu_before = _children_cpu()
    started = time.monotonic()
    done = subprocess.run([sys.executable, *extra, "-m", "vidloom.cli", *args], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(root)}, cwd=env["VIDLOOM_BENCH_DIR"], timeout=600)
    wall = time.monotonic() - started
    if cpu is not None:
        cpu.append(_children_cpu() - cpu_before)
    if done.returncode != 0:
        raise SystemExit(f"vidloom {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, done.stdout, done.stderr


def _generate_args(model: str, timings: bool) -> list[str]:
    return ["generate", "--model", model, "--prompt", "a cat", "-o", "out.mp4", *TINY, *(["--timings"] if timings else [])]


def _one_run(root: Path, model: str, timings: bool, env: dict[str, str]) -> dict[str, Any]:
    row: dict[str, Any] = {"load_avg_1m": os.getloadavg()[0]}
    row["help_s"] = round(_vidloom(root, ["--help"], env)[0], 3)
    row["models_s"] = round(_vidloom(root, ["models"], env)[0], 3)
    cpu: list[float] = []
    wall, out, err = _vidloom(root, _generate_args(model, timings), env, cpu=cpu)
    reported = WALL.search(out)
    assert reported is not None, out
    row["generate_s"] = round(wall, 3)
    row["generate_cpu_s"] = round(cpu[0], 3)
    row["reported"] = dict(zip(("wall_s", "load_s", "generation_s"), (float(v) for v in reported.groups())))
    row["gap_s"] = round(wall - row["reported"]["generation_s"], 3)
    phases = {name: {"wall_s": float(w), **({"cpu_s": float(c)} if c else {})} for name, w, c in TIMING.findall(err)}
    if phases:
        row["phases"] = phases
        row["teardown_s"] = round(wall - phases["total"]["wall_s"], 3)  # after the last line: exit, plus the fork
    return row


def floor_programs(cache: Path) -> list[tuple[str, str]]:
    """(stage, program) for the cached demo in `cache` (its model_index.json names the text encoder's class)."""
    folders = sorted(cache.glob("*/model_index.json"))
    if len(folders) != 1:
        raise SystemExit(f"--floor needs a cache holding one demo; {cache} holds {len(folders)}")
    folder = folders[0].parent
    library, encoder = json.loads(folders[0].read_text())["text_encoder"]
    if library != "transformers":
        raise SystemExit(f"--floor: {folder.name}'s text encoder comes from {library}, not transformers")
    names = {"encoder": encoder, "tokenizer": str(folder / "tokenizer"), "text_encoder": str(folder / "text_encoder")}
    lines = [line.format(**names) for _, line in FLOOR]
    return [(stage, "; ".join([*lines[:index + 1], "import os", "os._exit(0)"]))
            for index, (stage, _) in enumerate(FLOOR)]


def own_program(programs: list[tuple[str, str]], model: str) -> str:
    """The floor's last stage, ftfy and av (the prompt cleaner and the writer), then `generate --timings` in the same
    process: its phases after start-up are vidloom's own work and imports, whatever the load does to the libraries'."""
    body = programs[-1][1].removesuffix("; import os; os._exit(0)")
    return (f"{body}; import ftfy, av, os, sys; from vidloom.cli import main; "
            f"code = main({_generate_args(model, True)!r}); sys.stderr.flush(); os._exit(code)")


def floor_run(root: Path, model: str, programs: list[tuple[str, str]], env: dict[str, str]) -> dict[str, Any]:
    """Each stage's program in a fresh interpreter: its wall and CPU seconds (cumulative, not per stage); "own":
    the phases (CPU seconds, wall for a part without its own) of `own_program`, vidloom from `root`."""
    row: dict[str, Any] = {}
    for stage, program in programs:
        cpu_before = _children_cpu()
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", program], check=True, env=env, cwd=env["VIDLOOM_BENCH_DIR"],
                       capture_output=True, timeout=600)
        row[stage] = {"wall_s": round(time.monotonic() - started, 3), "cpu_s": round(_children_cpu() - cpu_before, 3)}
    done = subprocess.run([sys.executable, "-c", own_program(programs, model)], check=True, capture_output=True,
                          text=True, env={**env, "PYTHONPATH": str(root)}, cwd=env["VIDLOOM_BENCH_DIR"], timeout=600)
    row["own"] = {name: float(cpu or wall) for name, wall, cpu in TIMING.findall(done.stderr)}
    return row


def importtime(root: Path, model: str, env: dict[str, str], top: int = 12) -> list[tuple[str, float]]:
    """The costliest imports of one generate run, the top two levels of the import tree (cumulative ms)."""
    _, _, err = _vidloom(root, _generate_args(model, False), env, ("-X", "importtime"))
    rows = [(name, int(us) / 1000) for us, indent, name in IMPORT.findall(err) if len(indent) <= 2]
    return sorted(rows, key=lambda row: -row[1])[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="wan2.1-demo")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--root", type=Path, default=ROOT, help="source tree to run (default: this one)")
    parser.add_argument("--cache", type=Path, default=None, help="demo cache (default: a new temp folder)")
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument("--bytecode", action="store_true",
                        help="cache bytecode as an installed package does (see above)")
    parser.add_argument("--floor", action="store_true",
                        help="also time bare interpreters importing and loading the demo's libraries (see above)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "VIDLOOM_CACHE": str(args.cache or Path(work) / "cache"), "HF_HUB_OFFLINE": "1",
               "VIDLOOM_BENCH_DIR": work}
        if args.bytecode:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(Path(work) / "pycache")
        timings = "--timings" in _vidloom(args.root, ["generate", "--help"], env)[1]
        _vidloom(args.root, _generate_args(args.model, False), env)  # writes the demo: every run after is cached
        programs = floor_programs(Path(env["VIDLOOM_CACHE"])) if args.floor else []
        runs = []
        for _ in range(args.runs):  # interleaved: a floor run beside each generate, under the same load
            runs.append(_one_run(args.root, args.model, timings, env))
            if programs:
                runs[-1]["floor"] = floor_run(args.root, args.model, programs, env)
        result: dict[str, Any] = {"model": args.model, "root": str(args.root), "args": list(TINY),
                                  "cpu_count": os.cpu_count(), "bytecode": "PYTHONDONTWRITEBYTECODE" not in env,
                                  "runs": runs}
        keys = ("load_avg_1m", "help_s", "models_s", "generate_s", "generate_cpu_s", "gap_s", "teardown_s")
        result["median"] = {key: round(statistics.median(run[key] for run in runs), 3)
                            for key in keys if all(key in run for run in runs)}
        result["median"]["generation_s"] = statistics.median(run["reported"]["generation_s"] for run in runs)
        if programs:
            result["median"]["floor"] = {stage: {key: statistics.median(run["floor"][stage][key] for run in runs)
                                                 for key in ("wall_s", "cpu_s")} for stage, _ in programs}
            result["median"]["own"] = {phase: statistics.median(run["floor"]["own"][phase] for run in runs)
                                       for phase in runs[0]["floor"]["own"]}
        if args.importtime:
            result["importtime_ms"] = importtime(args.root, args.model, env)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
