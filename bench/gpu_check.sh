#!/usr/bin/env bash
# One-shot GPU check (README "GPU check"): tests/gpu in full, then the real-size Wan2.1-1.3B benchmark.
#   bench/gpu_check.sh            on a CUDA machine set up as the README says (installs nothing)
#   bench/gpu_check.sh --dry-run  anywhere: environment, plan, "estimated total: N s"
# Results: $OUT (default bench/results/gpu/): gpu_check.json, gpu_tests.xml, gpu_tests.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results/gpu}"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
STARTED=$(date +%s)

if [ "${1:-}" = "--dry-run" ]; then
    exec "$PY" bench/gpu_check.py --dry-run --out "$OUT"
fi
mkdir -p "$OUT"
"$PY" bench/gpu_check.py --check-env --out "$OUT" || exit 2

echo "== tests/gpu"
timeout 240 "$PY" -m pytest -q -rs tests/gpu --junitxml "$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.log"
TESTS_RC=${PIPESTATUS[0]}
echo "tests/gpu exit status: $TESTS_RC"

echo "== benchmark (budget: the whole script within 480 s)"
"$PY" bench/gpu_check.py --out "$OUT" --started "$STARTED" --tests-rc "$TESTS_RC"
BENCH_RC=$?
echo "gpu_check: tests/gpu exit $TESTS_RC, benchmark exit $BENCH_RC, $(( $(date +%s) - STARTED )) s"
[ "$TESTS_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
