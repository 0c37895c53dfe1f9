"""Mutation testing on demand (not in CI: minutes of CPU): break the glue on purpose, see what the tests miss.

Each mutant changes one site of one target file: a comparison or arithmetic operator swapped, a
boolean operator swapped, an `if` negated, a keyword argument dropped from a call, an assignment
dropped, a dict entry dropped, a True/False flipped. The mutant runs the target's tests (TARGETS)
in a scratch copy of the repository; a mutant whose tests all pass "survives" and is reported.

    python tools/mutate.py                       # every target, 20-minute budget
    python tools/mutate.py --target vidloom/serving/params.py --budget-s 300
    python tools/mutate.py --list                # the mutants, without running anything

Heavy libraries are imported once here and every mutant runs in a forked child, so a mutant
costs its tests' time, not an interpreter start. Survivors are worth a look, not all a fix:
some are equivalent (the change cannot be observed) or cosmetic (progress bars, log text).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# target file -> tests that should kill its mutants, fastest first (pytest stops at the first failure).
TARGETS: dict[str, tuple[str, ...]] = {
    "vidloom/runtime/step_cache.py": (
        "tests/unit/runtime/test_teacache.py", "tests/unit/runtime/test_step_cache.py",
        "tests/integration/test_acceleration.py",
    ),
    "vidloom/serving/params.py": ("tests/unit/serving/test_params.py", "tests/unit/serving/test_params_limits.py",
                                  "tests/integration/test_equivalence_request.py"),
    "vidloom/cli/deploy_args.py": ("tests/integration/test_cli.py::test_deploy_flags_build_the_deploy_config",
                               "tests/integration/test_equivalence_deploy.py"),
    "vidloom/media/video.py": ("tests/unit/media", "tests/integration/test_generator.py::test_save_writes_a_playable_mp4"),
    "vidloom/core/request.py": ("tests/unit/core/test_request.py", "tests/unit/serving/test_params.py"),
    "vidloom/cli/commands.py": ("tests/integration/test_equivalence_request.py", "tests/integration/test_equivalence_deploy.py",
                       "tests/integration/test_cli.py"),
}
# Keyword arguments whose loss only changes text a person reads (help, progress bars): not mutated.
COSMETIC_KWARGS = frozenset({"help", "metavar", "description", "desc", "unit", "file", "flush", "prog"})
PRELOAD = ("torch", "numpy", "av", "fastapi", "uvicorn", "httpx", "pydantic", "openai", "safetensors",
           "tokenizers", "transformers", "diffusers", "tqdm", "pytest")

_SWAPS: dict[type, type] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
    ast.And: ast.Or, ast.Or: ast.And,
}


@dataclass(frozen=True)
class Mutant:
    target: str
    index: int  # which site of the target, in walk order
    line: int
    kind: str
    detail: str

    @property
    def name(self) -> str:
        return f"{self.target}:{self.line}:{self.kind}:{self.detail}"


class _Mutator(ast.NodeTransformer):
    """Walks a module; collects every site, or applies the change at site `apply` only."""

    def __init__(self, apply: int | None = None) -> None:
        self.apply = apply
        self.sites: list[tuple[int, str, str]] = []
        self._in_function = 0

    def _site(self, node: ast.AST, kind: str, detail: str) -> bool:
        self.sites.append((getattr(node, "lineno", 0), kind, detail))
        return len(self.sites) - 1 == self.apply

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self._in_function += 1
        node.body = [self.visit(statement) for statement in node.body]  # not decorators or defaults
        self._in_function -= 1
        return node

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        node.body = [self.visit(statement) for statement in node.body]  # not decorators (frozen=True...)
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        for i, op in enumerate(node.ops):
            swap = _SWAPS.get(type(op))
            if swap and self._site(node, "compare", f"{type(op).__name__}->{swap.__name__}"):
                node.ops[i] = swap()
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        swap = _SWAPS.get(type(node.op))
        if swap and not _is_string_format(node) and self._site(node, "binop", f"{type(node.op).__name__}->{swap.__name__}"):
            node.op = swap()
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        swap = _SWAPS[type(node.op)]
        if self._site(node, "boolop", f"{type(node.op).__name__}->{swap.__name__}"):
            node.op = swap()
        return node

    def visit_If(self, node: ast.If) -> ast.AST:
        test = ast.unparse(node.test)
        if "TYPE_CHECKING" in test or "__name__" in test:  # import guards and the script entry point
            return node
        self.generic_visit(node)
        if self._in_function and self._site(node, "negate-if", ast.unparse(node.test)[:40]):
            node.test = ast.UnaryOp(ast.Not(), node.test)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        for keyword in list(node.keywords):
            if keyword.arg not in (None, *COSMETIC_KWARGS) and self._site(node, "drop-kwarg", f"{_callee(node)}({keyword.arg}=)"):
                node.keywords.remove(keyword)
        return node

    def visit_Dict(self, node: ast.Dict) -> ast.AST:
        self.generic_visit(node)
        for i, key in enumerate(list(node.keys)):
            if isinstance(key, ast.Constant) and self._site(node, "drop-dict-entry", repr(key.value)[:30]):
                del node.keys[i], node.values[i]
                break
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, bool) and self._site(node, "flip-bool", f"{node.value}->{not node.value}"):
            return ast.copy_location(ast.Constant(not node.value), node)
        return node

    def _drop_statement(self, node: ast.stmt, what: str) -> ast.AST:
        self.generic_visit(node)
        if self._in_function and self._site(node, "drop-assign", what[:40]):
            return ast.copy_location(ast.Pass(), node)
        return node

    def visit_Assign(self, node: ast.Assign) -> ast.AST:
        return self._drop_statement(node, ast.unparse(node.targets[0]))

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST:
        return self._drop_statement(node, ast.unparse(node.target) + " op=")

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        return node if node.value is None else self._drop_statement(node, ast.unparse(node.target))


def _callee(node: ast.Call) -> str:
    return ast.unparse(node.func)[-30:]


def _is_string_format(node: ast.BinOp) -> bool:
    return isinstance(node.op, ast.Mod) or any(isinstance(side, ast.JoinedStr) for side in (node.left, node.right))


def mutants(target: str) -> list[Mutant]:
    tree = ast.parse((REPO / target).read_text())
    collector = _Mutator()
    collector.visit(tree)
    return [Mutant(target, i, line, kind, detail) for i, (line, kind, detail) in enumerate(collector.sites)]


def mutated_source(mutant: Mutant) -> str:
    tree = ast.parse((REPO / mutant.target).read_text())
    _Mutator(apply=mutant.index).visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree))


def _scratch_copy() -> Path:
    """The working tree (tracked and untracked, not ignored) copied to a temp folder."""
    scratch = Path(tempfile.mkdtemp(prefix="vidloom-mutate-"))
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in files:
        source = REPO / name
        if source.is_file():
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, scratch / name)
    return scratch


def _run_tests(scratch: Path, tests: tuple[str, ...], timeout_s: float) -> str:
    """'passed', 'failed' or 'timeout', running pytest in a forked child inside `scratch`."""
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.setpgid(0, 0)
            os.chdir(scratch)
            sys.path.insert(0, str(scratch))
            os.environ["PYTHONPATH"] = str(scratch)
            # No bytecode caches: a mutant written in the same second as another of the same size
            # would otherwise import the other's stale .pyc (its mtime and size match).
            sys.dont_write_bytecode = True
            os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import pytest

            code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", *tests])
        except BaseException:
            code = 99
        os._exit(int(code))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return "passed" if os.waitstatus_to_exitcode(status) == 0 else "failed"
        time.sleep(0.05)
    os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "timeout"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", action="append", choices=sorted(TARGETS), help="repeatable; default: all")
    parser.add_argument("--budget-s", type=float, default=1200.0, help="stop starting mutants after this long")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per-mutant limit (a timeout counts as killed)")
    parser.add_argument("--kinds", default="", help="comma-separated mutation kinds to keep (default: all)")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="keep mutants whose name contains TEXT (repeatable), e.g. params.py:98:")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args(argv)
    kinds = set(filter(None, args.kinds.split(",")))
    todo = [m for t in (args.target or TARGETS) for m in mutants(t)
            if (not kinds or m.kind in kinds) and (not args.only or any(text in m.name for text in args.only))]
    if args.list:
        for m in todo:
            print(m.name)
        print(f"{len(todo)} mutants")
        return 0
    for module in PRELOAD:  # once, before forking; never vidloom (each child imports the mutated copy)
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    scratch = _scratch_copy()
    started, results = time.monotonic(), []
    try:
        for target in dict.fromkeys(m.target for m in todo):
            if _run_tests(scratch, TARGETS[target], args.timeout_s) != "passed":
                print(f"baseline: {target}'s tests fail unmutated; skipping it", flush=True)
                todo = [m for m in todo if m.target != target]
        for mutant in todo:
            if time.monotonic() - started > args.budget_s:
                results.append((mutant, "not run (budget)"))
                continue
            path = scratch / mutant.target
            original = path.read_text()
            path.write_text(mutated_source(mutant))
            try:
                t0 = time.monotonic()
                outcome = _run_tests(scratch, TARGETS[mutant.target], args.timeout_s)
            finally:
                path.write_text(original)
            verdict = "SURVIVED" if outcome == "passed" else f"killed ({outcome})"
            results.append((mutant, verdict))
            print(f"{verdict:<17} {time.monotonic() - t0:5.1f}s  {mutant.name}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _report(results, args.json)
    return 0


def _report(results: list[tuple[Mutant, str]], json_path: Path | None) -> None:
    survivors = [m for m, verdict in results if verdict == "SURVIVED"]
    ran = [r for r in results if not r[1].startswith("not run")]
    print(f"\n{len(ran)} mutants run, {len(ran) - len(survivors)} killed, {len(survivors)} survived, "
          f"{len(results) - len(ran)} not run (budget)")
    for m in survivors:
        source = (REPO / m.target).read_text().splitlines()[m.line - 1].strip()
        print(f"  survivor {m.name}\n      {source}")
    if json_path is not None:
        json_path.write_text(json.dumps([{**asdict(m), "verdict": v} for m, v in results], indent=1))


if __name__ == "__main__":
    sys.exit(main())
