"""The CPU fast path's dtype choice: bfloat16 only where the CPU multiplies it natively, float32 on request."""

from __future__ import annotations

import pytest
import torch

from vidloom.core.errors import DeployError
from vidloom.loading import precision
from vidloom.loading.precision import (
    vae_dtype,
    CPU_DTYPE_ENV, cpu_default_dtype, cpu_flags, cpu_has_native_bf16, default_compute_dtype,
)

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("flags, capability, expected", [
    ({"avx512f", "amx_bf16", "amx_tile"}, "AVX512", True),  # Sapphire Rapids and later
    ({"avx512f", "avx512_bf16"}, "AVX512", True),  # Cooper Lake, Zen 4
    ({"avx512f", "avx512_bf16"}, "AVX2", False),  # ATEN_CPU_CAPABILITY forced down: bf16 would be emulated
    ({"avx2", "fma"}, "AVX2", False),  # no bf16 unit
    ({"avx512f"}, "AVX512", False),  # Skylake-X: AVX512 without BF16
    ({"fp", "asimd", "bf16", "sve"}, "SVE256", True),  # Arm Neoverse V1 / Graviton3
    ({"fp", "asimd"}, "DEFAULT", False),
    (set(), "AVX512", False),  # no /proc/cpuinfo
])
def test_native_bf16_needs_the_flag_and_a_dispatch_that_uses_it(flags, capability, expected):
    assert cpu_has_native_bf16(frozenset(flags), capability) is expected


def test_cpu_flags_read_the_first_cpu_and_survive_a_missing_file(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512_bf16 amx_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(str(info)) == {"fpu", "avx512_bf16", "amx_bf16"}
    assert cpu_flags(str(tmp_path / "absent")) == frozenset()


@pytest.mark.cpu_fast_path
@pytest.mark.parametrize("native, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_cpu_default_follows_the_probe(monkeypatch, native, expected):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    assert cpu_default_dtype() is expected
    assert default_compute_dtype("float32", CPU, None) is expected  # a demo card's float32 is its CUDA precision


@pytest.mark.cpu_fast_path
def test_an_explicit_dtype_and_the_environment_override_the_probe(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert default_compute_dtype("bfloat16", CPU, torch.float32) is torch.float32  # dtype= / --dtype / deploy card
    monkeypatch.setenv(CPU_DTYPE_ENV, "float32")
    assert default_compute_dtype("bfloat16", CPU, None) is torch.float32
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setenv(CPU_DTYPE_ENV, "bfloat16")
    assert default_compute_dtype("float32", CPU, None) is torch.bfloat16


@pytest.mark.cpu_fast_path
def test_a_bad_environment_value_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(CPU_DTYPE_ENV, "float16")
    with pytest.raises(DeployError, match=CPU_DTYPE_ENV):
        cpu_default_dtype()


def test_cuda_keeps_the_card_precision_whatever_the_cpu(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert default_compute_dtype("float32", CUDA, None) is torch.float32
    assert default_compute_dtype("bfloat16", CUDA, None) is torch.bfloat16


def test_the_suite_pins_float32_for_comparisons():
    # tests/conftest.py: parity and equivalence tests compare float32 against float32 references.
    assert cpu_default_dtype() is torch.float32


def test_a_gated_vae_follows_the_compute_dtype_on_cpu_and_keeps_the_card_dtype_on_cuda():
    cpu = torch.device("cpu")
    assert vae_dtype("float32", cpu, torch.bfloat16) is torch.bfloat16  # the fast path
    assert vae_dtype("float32", cpu, torch.float32) is torch.float32  # --dtype float32: exact parity
    assert vae_dtype("float32", CUDA, torch.bfloat16) is torch.float32
    assert vae_dtype(None, CUDA, torch.bfloat16) is torch.float32
    assert vae_dtype("bfloat16", CUDA, torch.float32) is torch.bfloat16
