#!/usr/bin/env bash
# One-shot GPU check (README "GPU check", docs/performance-cpu.md): tests/gpu in full, then the real-size
# Wan2.1-1.3B benchmark.
#   bench/gpu_check.sh --prepare  here, with PyPI: the wheels the GPU image lacks, for Python 3.12, into .whl/
#   bench/gpu_check.sh            on the CUDA machine: installs .whl/*.whl (if any) into a private folder
#                                 with no index, then runs offline (HF_HUB_OFFLINE=1)
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
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # the GPU machine has no network: never wait on the Hub
STARTED=$(date +%s)

# The lent GPU image (Python 3.12, its own CUDA torch and transformers) has no diffusers, which the
# reference rows, the checkpoint writer and tests/gpu's fixtures need; PyAV, fastapi and ftfy are not needed
# (vidloom imports them on first use). diffusers is pure Python: its wheel and importlib_metadata's (~6.5 MiB,
# within the device tool's 64 MiB) are all that travels; versions match this checkout's environment.
WHEELS="${WHEELS:-.whl}"
if [ "${1:-}" = "--prepare" ]; then
    version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
    mkdir -p "$WHEELS"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEELS" "diffusers==$(version diffusers)" "importlib_metadata==$(version importlib_metadata)" || exit 1
    size=$(du -sk "$WHEELS" | cut -f1)
    ls -1 "$WHEELS"
    echo "$WHEELS: $((size / 1024)) MiB (the device tool carries 64 MiB in all)"
    [ "$size" -lt $((48 * 1024)) ] || { echo "$WHEELS is too large to carry" >&2; exit 1; }
    exit 0
fi

if [ "${1:-}" = "--dry-run" ]; then
    exec "$PY" bench/gpu_check.py --dry-run --out "$OUT"
fi
mkdir -p "$OUT"
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    SITE="${TMPDIR:-/tmp}/vidloom-gpu-site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl || { echo "could not install $WHEELS/*.whl" >&2; exit 2; }
    export PYTHONPATH="$PYTHONPATH:$SITE"  # holds only what the image lacks (diffusers, importlib_metadata)
fi
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
