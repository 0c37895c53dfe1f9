"""A checkpoint folder carrying a harmless config key loads through `vidloom serve`, which reports the key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx

from tests.helpers.servers import ProcessServer
from vidloom.families.flux2.vae import FLUX2_VAE_POLICY


def test_served_model_lists_the_harmless_keys_its_load_accepted(flux2_distilled_dir: Path, tmp_path: Path):
    # FLUX.2-klein's published vae/config.json carries force_upcast (diffusers 0.36's fp16 hint).
    folder = tmp_path / "klein"
    shutil.copytree(flux2_distilled_dir, folder)
    vae_config = folder / "vae" / "config.json"
    vae_config.write_text(json.dumps({**json.loads(vae_config.read_text()), "force_upcast": True}))

    server = ProcessServer(tmp_path / "data", tmp_path / "cache", tmp_path / "serve.log", str(folder))
    try:
        models = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
        assert len(models) == 1
        details = httpx.get(f"{server.url}/v1/models/{models[0]['id']}", timeout=30).json()
    finally:
        assert server.terminate() in (0, -15)
    accepted = details["accepted_config_keys"]
    # Beside it, the tiny folder's diffusers-written configs carry other harmless keys (VAE sample_size, ...).
    assert f"force_upcast=True in {vae_config}: {FLUX2_VAE_POLICY.harmless['force_upcast']}" in accepted
    assert all(f" in {folder}/" in line for line in accepted), accepted
