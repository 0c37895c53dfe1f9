"""Fused LoRA mode over HTTP on a Flux2 Klein server: adapters fused at start, requests naming others refused
(400 naming loras), the load/unload routes refused (409 naming fuse_loras), the card key and --fuse-loras flag."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers.lora_files import LoRASpec, write_lora
from tests.helpers.servers import ThreadServer
from vidloom.serving.config import ServeConfig

BODY = {"prompt": "a paper boat", "size": "32x48", "num_inference_steps": 2, "seed": 4}
SPEC = LoRASpec(rank=4, alpha=8, targets=("to_q", "to_k", "to_v", "to_qkv_mlp_proj"), seed=22)


def _image(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(response.json()["data"][0]["b64_json"]))).convert("RGB"))


def test_a_fused_server_runs_its_set_and_refuses_changes(flux2_distilled_dir, tmp_path):
    from vidloom.generator import VideoGenerator

    lora = write_lora(flux2_distilled_dir, "Flux2KleinPipeline", SPEC, tmp_path)
    gen = VideoGenerator.from_pretrained(flux2_distilled_dir, device="cpu", fuse_loras={"ink": (lora, 0.7)})
    config = ServeConfig(data_dir=tmp_path / "data", graceful_shutdown_s=2, loras=(f"ink={lora}:0.7",),
                         fuse_loras=True)
    with ThreadServer(gen.engine, config) as running, httpx.Client(base_url=running.url, timeout=60) as client:
        assert client.get("/v1/loras").json() == {"object": "list", "data": [], "max_loras": None,
                                                  "fused": [{"name": "ink", "file": lora.name, "scale": 0.7}]}
        for refused in (client.post("/v1/loras", json={"name": "x", "path": str(lora)}), client.delete("/v1/loras/ink")):
            assert refused.status_code == 409 and refused.json()["error"]["param"] == "fuse_loras", refused.text
        fused = _image(client.post("/v1/images/generations", json=BODY))
        expected = gen.generate(BODY["prompt"], height=48, width=32, num_inference_steps=2, seed=4).frames[0]
        assert np.array_equal(fused, expected)
        same = client.post("/v1/images/generations", json={**BODY, "loras": [{"name": "ink", "scale": 0.7}]})
        assert np.array_equal(_image(same), fused), "naming the fused set itself runs it"
        other = client.post("/v1/images/generations", json={**BODY, "loras": [{"name": "ink", "scale": 0.2}]})
        assert other.status_code == 400 and other.json()["error"]["param"] == "loras", other.text
    base = VideoGenerator.from_pretrained(flux2_distilled_dir, device="cpu")
    plain = base.generate(BODY["prompt"], height=48, width=32, num_inference_steps=2, seed=4).frames[0]
    assert np.abs(fused.astype(int) - plain).max() > 10, "the fused adapter changed nothing"


def test_fuse_loras_flag_card_key_and_scales(flux2_distilled_dir, tmp_path):
    from vidloom.cli import build_parser
    from vidloom.serving.serve_flags import effective_config, typed_flags

    argv = ["serve", str(flux2_distilled_dir), "--lora", "ink=./ink.safetensors:0.5", "--lora", "b=./b", "--fuse-loras"]
    config = effective_config(build_parser().parse_args(argv), typed_flags(build_parser(), argv))
    assert config.fuse_loras and config.lora_entries == [("ink", "ink.safetensors", 0.5), ("b", "b", 1.0)]
    card = tmp_path / "card.yaml"
    card.write_text("fuse_loras: true\nloras: ['ink=./ink.safetensors:0.5']\n")
    argv = ["serve", str(flux2_distilled_dir), "--config", str(card)]
    assert effective_config(build_parser().parse_args(argv), typed_flags(build_parser(), argv)).fuse_loras
    # Without fuse_loras a run-time adapter's scale comes from each request: the entry is a path as written.
    assert ServeConfig(loras=("ink=./ink:0.5",)).lora_entries == [("ink", "./ink:0.5", 1.0)]
    with pytest.raises(ValueError, match="fuse_loras: needs adapters"):
        ServeConfig(fuse_loras=True)
    with pytest.raises(ValueError, match="loras: .*finite"):
        ServeConfig(loras=("ink=./ink:nan",), fuse_loras=True)

    from tests.helpers.servers import ProcessServer

    lora = write_lora(flux2_distilled_dir, "Flux2KleinPipeline", SPEC, tmp_path)
    server = ProcessServer(tmp_path / "data", tmp_path / "cache", tmp_path / "serve.log", "--model",
                           str(flux2_distilled_dir), "--device", "cpu", "--lora", f"ink={lora}:0.7", "--fuse-loras")
    try:
        listed = httpx.get(f"{server.url}/v1/loras").json()
        assert listed["fused"] == [{"name": "ink", "file": lora.name, "scale": 0.7}] and listed["data"] == []
        assert httpx.post(f"{server.url}/v1/images/generations", timeout=120, json=BODY).status_code == 200
    finally:
        server.terminate()
