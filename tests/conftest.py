"""Shared fixtures: tiny reference checkpoints and an isolated vidloom cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.ltx2_checkpoints import CONFIGS as LTX2_CONFIGS, write_tiny_ltx2
from tests.helpers.flux2_checkpoints import CONFIGS as FLUX2_CONFIGS, TINY_DISTILLED, write_tiny_flux2
from tests.helpers.wan_checkpoints import CONFIGS, TinyWan, write_tiny_wan


@pytest.fixture(scope="session", params=CONFIGS, ids=lambda spec: spec.name)
def tiny_wan_dir(request, tmp_path_factory) -> Path:
    """A diffusers-written WanPipeline folder for each tiny config."""
    spec: TinyWan = request.param
    return write_tiny_wan(tmp_path_factory.mktemp(spec.name), spec)


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> Path:
    """A cache dir holding the built-in demo checkpoint (written once per session)."""
    from vidloom.families.wan.demo import ensure_demo_checkpoint

    cache = tmp_path_factory.mktemp("vidloom-cache")
    ensure_demo_checkpoint(cache)
    return cache


@pytest.fixture(scope="session")
def wan_demo_checkpoint(demo_cache) -> Path:
    """The Wan demo's folder in `demo_cache` (other tests add other demos' folders to that cache)."""
    from vidloom.families.wan.demo import ensure_demo_checkpoint

    return ensure_demo_checkpoint(demo_cache)


@pytest.fixture(autouse=True)
def _isolated_cache(monkeypatch, tmp_path_factory):
    # Never write into the developer's real ~/.cache from tests.
    monkeypatch.setenv("VIDLOOM_CACHE", str(tmp_path_factory.getbasetemp() / "default-cache"))


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module of tiny float32 parity runs (`pytest.mark.usefixtures`), restored after.
    Their ops are too small to gain from a second thread and lose to its synchronisation, badly once the two
    cores are shared: measured, test_lora_helios 13 CPU s / 49 s wall on one thread vs 86 CPU s / 247 s on two
    (2 cores, load 5-7). Results are compared with a reference run in the same process, so on the same thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_configure(config):
    # Every comparison in this suite (parity with diffusers/transformers, equivalence between our own paths,
    # golden values) means float32 on CPU, the dtype the references run in; on a CPU with native bf16 the
    # runtime's default is bfloat16 (vidloom.loading.precision). So the whole session, its module- and
    # session-scoped fixtures and its subprocesses included, pins float32; tests of the fast path itself opt
    # out with @pytest.mark.cpu_fast_path (below).
    from vidloom.loading.precision import CPU_DTYPE_ENV

    os.environ[CPU_DTYPE_ENV] = "float32"


@pytest.fixture(autouse=True)
def _cpu_fast_path_opt_out(request, monkeypatch):
    if request.node.get_closest_marker("cpu_fast_path") is not None:
        from vidloom.loading.precision import CPU_DTYPE_ENV

        monkeypatch.delenv(CPU_DTYPE_ENV, raising=False)  # the runtime's own default for this test only


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server for the session (.ci/run installs the Debian packages; sets VIDLOOM_REQUIRE_POSTGRES)."""
    import os

    from tests.helpers.postgres import PostgresServer, postgres_bin

    bin_dir = postgres_bin()
    if bin_dir is None:
        if os.environ.get("VIDLOOM_REQUIRE_POSTGRES"):
            pytest.fail("PostgreSQL is required here (VIDLOOM_REQUIRE_POSTGRES) but /usr/lib/postgresql/*/bin "
                        "has no initdb: apt-get install postgresql")
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql)")
    server = PostgresServer(bin_dir)
    yield server
    server.stop()


@pytest.fixture(scope="session", params=FLUX2_CONFIGS, ids=lambda spec: spec.name)
def tiny_flux2_dir(request, tmp_path_factory) -> Path:
    """A diffusers-written Flux2KleinPipeline folder for each tiny config (distilled, base)."""
    return write_tiny_flux2(tmp_path_factory.mktemp(request.param.name), request.param)


@pytest.fixture(scope="session")
def flux2_distilled_dir(tmp_path_factory) -> Path:
    """The step-distilled tiny Flux2 Klein folder alone (server and batching tests)."""
    return write_tiny_flux2(tmp_path_factory.mktemp("klein-distilled-only"), TINY_DISTILLED)


@pytest.fixture(scope="session", params=["cosmos3-a", "cosmos3-b"])
def tiny_cosmos3_dir(request, tmp_path_factory) -> Path:
    """A diffusers-written Cosmos3OmniPipeline folder for each tiny config."""
    from tests.helpers.cosmos3_checkpoints import COSMOS3_CONFIGS, write_tiny_cosmos3

    spec = next(s for s in COSMOS3_CONFIGS if s.name == request.param)
    return write_tiny_cosmos3(tmp_path_factory.mktemp(spec.name), spec)


@pytest.fixture(scope="session")
def cosmos3_dir(tmp_path_factory) -> Path:
    """One tiny Cosmos3OmniPipeline folder (config A), shared by the chat tests."""
    from tests.helpers.cosmos3_checkpoints import COSMOS3_A, write_tiny_cosmos3

    return write_tiny_cosmos3(tmp_path_factory.mktemp("cosmos3") / "tiny-cosmos3", COSMOS3_A)


@pytest.fixture(scope="session", params=["cosmos3-action-a", "cosmos3-action-b"])
def tiny_cosmos3_action_dir(request, tmp_path_factory) -> Path:
    """A Cosmos3OmniPipeline folder whose transformer has the action pathway, for each tiny action config."""
    from tests.helpers.cosmos3_action_checkpoints import COSMOS3_ACTION_CONFIGS, write_tiny_cosmos3_action

    spec = next(s for s in COSMOS3_ACTION_CONFIGS if s.name == request.param)
    return write_tiny_cosmos3_action(tmp_path_factory.mktemp(spec.name), spec)


@pytest.fixture(scope="session")
def cosmos3_action_dir(tmp_path_factory) -> Path:
    """One tiny Cosmos3 folder with the action pathway (config A), for validation and serving tests."""
    from tests.helpers.cosmos3_action_checkpoints import write_tiny_cosmos3_action

    return write_tiny_cosmos3_action(tmp_path_factory.mktemp("cosmos3-action") / "tiny-cosmos3-action")
@pytest.fixture(scope="session", params=LTX2_CONFIGS, ids=lambda spec: spec.name)
def tiny_ltx2_dir(request, tmp_path_factory) -> Path:
    """A diffusers-written LTX2Pipeline folder (with a latent_upsampler/ folder) for each tiny config."""
    return write_tiny_ltx2(tmp_path_factory.mktemp(request.param.name), request.param, upsampler=True)


@pytest.fixture(scope="session")
def ltx2_dir(tmp_path_factory) -> Path:
    """The first tiny LTX-2 folder alone (CLI, server and error tests)."""
    return write_tiny_ltx2(tmp_path_factory.mktemp("ltx2-only"), LTX2_CONFIGS[0], upsampler=True)
