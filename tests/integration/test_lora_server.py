"""LoRA over HTTP on a Flux2 Klein server: /v1/loras load/list/delete behind the key, `loras` on image requests,
/v1/models listing adapters, errors naming the parameter."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers.lora_files import LoRASpec, write_lora
from tests.helpers.servers import ThreadServer
from vidloom.serving.config import ServeConfig
from vidloom.serving.errors import echo

KEY = "sk-lora-test"
BODY = {"prompt": "a paper boat", "size": "32x48", "num_inference_steps": 2, "seed": 4}
SPEC = LoRASpec(rank=4, alpha=8, targets=("to_q", "to_k", "to_v", "to_qkv_mlp_proj"), seed=21)


@pytest.fixture(scope="module")
def served(flux2_distilled_dir, tmp_path_factory):
    from vidloom.generator import VideoGenerator

    gen = VideoGenerator.from_pretrained(flux2_distilled_dir, device="cpu", max_loras=1)
    lora = write_lora(flux2_distilled_dir, "Flux2KleinPipeline", SPEC, tmp_path_factory.mktemp("loras"))
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("lora-data"), graceful_shutdown_s=2, api_key=KEY,
                         lora_dirs=(lora.parent,), max_lora_rank=8, max_lora_file_bytes=lora.stat().st_size + 4096)
    with ThreadServer(gen.engine, config) as running:
        with httpx.Client(base_url=running.url, timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as client:
            yield gen, lora, client, running.url


def _image(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    data = base64.b64decode(response.json()["data"][0]["b64_json"])
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_load_choose_list_and_delete_an_adapter(served):
    gen, lora, client, url = served
    assert client.get("/v1/loras").json()["data"] == []
    assert httpx.post(f"{url}/v1/loras", json={"name": "boat", "path": lora.name}).status_code == 401  # no key
    loaded = client.post("/v1/loras", json={"name": "boat", "path": lora.name})
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["name"] == "boat" and loaded.json()["layers"] > 0
    assert client.get("/v1/loras").json()["data"] == [{"name": "boat", "file": lora.name}]
    models = client.get("/v1/models").json()["data"]
    assert [m["id"] for m in models] == [gen.card.model_id, "boat"] and models[1]["parent"] == gen.card.model_id

    base = _image(client.post("/v1/images/generations", json=BODY))
    styled = _image(client.post("/v1/images/generations", json={**BODY, "loras": [{"name": "boat", "scale": 0.8}]}))
    expected = gen.generate(BODY["prompt"], height=48, width=32, num_inference_steps=2, seed=4,
                            loras={"boat": 0.8}).frames[0]
    assert np.array_equal(styled, expected), "the HTTP request must run what the Python API runs"
    assert np.abs(styled.astype(int) - base).max() > 10
    assert np.array_equal(_image(client.post("/v1/images/generations", json=BODY)), base), "adapters leaked"

    # max_loras is 1: loading another evicts the idle least recently used one.
    assert client.post("/v1/loras", json={"name": "other", "path": lora.name}).status_code == 200
    assert client.get("/v1/loras").json()["data"] == [{"name": "other", "file": lora.name}]
    assert client.delete("/v1/loras/other").json() == {"name": "other", "deleted": True}
    assert client.delete("/v1/loras/other").status_code == 404
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [gen.card.model_id]


def test_bad_lora_input_names_the_parameter(served, tmp_path):
    _, _, client, _ = served
    unknown = client.post("/v1/images/generations", json={**BODY, "loras": [{"name": "nope"}]})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "loras[0].name"
    extra = client.post("/v1/images/generations", json={**BODY, "loras": [{"name": "x", "weight": 1}]})
    assert extra.status_code == 400 and "loras" in extra.json()["error"]["param"]
    missing = client.post("/v1/loras", json={"name": "m", "path": "none.safetensors"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "path"
    assert client.get("/v1/loras").json()["data"] == []


def test_serve_flags_and_card_load_adapters_at_start(flux2_distilled_dir, tmp_path):
    from tests.helpers.servers import ProcessServer
    from vidloom.cli import build_parser
    from vidloom.serving.config import ServeConfig
    from vidloom.serving.serve_flags import effective_config, typed_flags

    lora = write_lora(flux2_distilled_dir, "Flux2KleinPipeline", SPEC, tmp_path)
    argv = ["serve", str(flux2_distilled_dir), "--lora", f"ink={lora}", "--max-loras", "3"]
    config = effective_config(build_parser().parse_args(argv), typed_flags(build_parser(), argv))
    assert config.lora_files == [("ink", str(lora))] and config.max_loras == 3
    with pytest.raises(ValueError, match=r"loras: 'ink' is not NAME=PATH"):
        ServeConfig(loras=("ink",))
    with pytest.raises(ValueError, match="max_loras"):
        ServeConfig(loras=("a=x", "b=y"), max_loras=1)

    server = ProcessServer(tmp_path / "data", tmp_path / "cache", tmp_path / "serve.log", "--model",
                           str(flux2_distilled_dir), "--device", "cpu", "--lora", f"ink={lora}")
    try:
        assert httpx.get(f"{server.url}/v1/loras").json() == {"object": "list", "data": [{"name": "ink",
                                                              "file": lora.name}], "fused": [], "max_loras": 4}
        styled = httpx.post(f"{server.url}/v1/images/generations", timeout=120,
                            json={**BODY, "loras": [{"name": "ink", "scale": 0.5}]})
        assert styled.status_code == 200, styled.text
    finally:
        server.terminate()


def test_multipart_image_edits_take_loras_as_json_text(served):
    gen, lora, client, _ = served
    picture = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(picture, "PNG")
    files = {"image": ("ref.png", picture.getvalue(), "image/png")}
    form = {key: str(value) for key, value in BODY.items()}

    def edit(**extra):
        return client.post("/v1/images/edits", data={**form, **extra}, files=files)

    client.post("/v1/loras", json={"name": "boat", "path": lora.name}).raise_for_status()
    try:
        base = _image(edit())
        styled = _image(edit(loras='[{"name": "boat", "scale": 0.8}]'))
        assert np.abs(styled.astype(int) - base).max() > 10, "the edit's adapters changed nothing"
        unknown = edit(loras='[{"name": "nope"}]')
        assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "loras[0].name"
        garbled = edit(loras="boat:0.8")
        assert garbled.status_code == 400 and garbled.json()["error"]["param"] == "loras"
        # `into` reaches the registry: a one-transformer Flux2 has no other component to load into.
        elsewhere = client.post("/v1/loras", json={"name": "x", "path": lora.name, "into": "transformer_2"})
        assert elsewhere.status_code == 400 and elsewhere.json()["error"]["param"] == "into"
    finally:
        client.delete("/v1/loras/boat")


def test_files_outside_the_lora_folders_answer_as_missing_ones(served, tmp_path):
    _, lora, client, _ = served
    folder = lora.parent
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(lora.read_bytes())  # a real adapter, but not in a LoRA folder
    (folder / "escape.safetensors").symlink_to(outside)
    (folder / "loop.safetensors").symlink_to(folder / "loop.safetensors")

    def answer(path: str) -> tuple[int, str, str]:
        response = client.post("/v1/loras", json={"name": "probe", "path": path})
        error = response.json()["error"]
        return response.status_code, error["code"], error["message"].replace(echo(path), "PATH")

    missing = answer("none.safetensors")
    assert missing[:2] == (400, "lora_file_not_found")
    for path in (str(outside), f"../{tmp_path.name}/outside.safetensors", "escape.safetensors", "/etc/shadow",
                 "/etc/passwd", "/proc/self/environ", "..", ".", "loop.safetensors", "/" * 1000,
                 str(lora)[:-1]):
        assert answer(path) == missing, path
    assert client.get("/v1/loras").json()["data"] == []
    assert client.post("/v1/loras", json={"name": "abs", "path": str(lora)}).status_code == 200  # inside: fine
    client.delete("/v1/loras/abs").raise_for_status()


def test_names_ranks_sizes_and_values_are_checked_at_load(served):
    import torch
    from safetensors.torch import save_file

    _, lora, client, _ = served
    for name in ("a/b", "x" * 100_000, "", "../x", "sp ace", "\udcff"):
        body = json.dumps({"name": name, "path": lora.name})  # ASCII escapes: a lone surrogate travels too
        refused = client.post("/v1/loras", content=body, headers={"Content-Type": "application/json"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "name", name
        assert len(refused.text) < 1000
    folder = lora.parent
    save_file({"transformer.x.lora_A.weight": torch.ones(9, 4), "transformer.x.lora_B.weight": torch.ones(4, 9)},
              str(folder / "wide.safetensors"))
    save_file({"transformer.x.lora_A.weight": torch.full((4, 4), float("nan")),
               "transformer.x.lora_B.weight": torch.ones(4, 4)}, str(folder / "nan.safetensors"))
    (folder / "big.safetensors").write_bytes(b"\0" * (lora.stat().st_size + 8192))
    for path, words in (("wide.safetensors", "max_lora_rank=8"), ("nan.safetensors", "finite"),
                        ("big.safetensors", "max_lora_file_bytes=")):
        refused = client.post("/v1/loras", json={"name": "bad", "path": path})
        assert refused.status_code == 400, refused.text
        message = refused.json()["error"]["message"]
        assert words in message and str(folder) not in message, message
    assert client.get("/v1/loras").json()["data"] == []
