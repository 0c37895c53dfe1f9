"""The playground's server side over HTTP: the page and its headers, the card route it builds its form from."""

from __future__ import annotations

import httpx

from vidloom.serving.ui_routes import UI_FILES

KEY = "sk-test-0123456789"


def test_the_page_and_its_files_are_served_with_a_strict_csp(start_server):
    server = start_server(api_key=KEY)
    with httpx.Client(base_url=server.url, timeout=30) as anon:  # no key: the page asks for it itself
        page = anon.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "http" not in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        assert '<script src="/ui/app.js"' in page.text and "<script>" not in page.text  # nothing inline
        for path, (_, media_type) in UI_FILES.items():  # every file the page loads, without the key
            served = anon.get(path)
            assert served.status_code == 200 and served.headers["content-type"] == media_type, path
            assert "https://" not in served.text and "//cdn" not in served.text  # works offline
            if path.endswith(".js"):
                assert f'<script src="{path}"' in page.text, path
        assert anon.get("/v1/models/wan2.1-demo").status_code == 401  # the data stays behind the key
        assert anon.get("/ui/other.js").status_code == 401  # only the page's own files are open


def test_no_ui_serves_no_page(start_server):
    server = start_server(ui=False)
    assert httpx.get(f"{server.url}/").status_code == 404
    assert httpx.get(f"{server.url}/ui/app.js").status_code == 404


def test_model_details_carry_the_cards_capabilities(start_server):
    server = start_server(max_frames=64)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        listed = client.get("/v1/models").json()["data"][0]
        assert "capabilities" not in listed  # the list keeps the OpenAI shape
        details = client.get("/v1/models/wan2.1-demo").json()
        caps = details["capabilities"]
        assert details["id"] == "wan2.1-demo" and details["object"] == "model"
        assert caps["tasks"] == ["t2v", "v2v"] and caps["videos"] and not caps["images"] and not caps["chat"]
        assert not caps["streams_chunks"] and not caps["produces_audio"]
        assert not caps["speech"] and caps["voices"] == [] and caps["chat_inputs"] == []  # no voice, no chat
        assert caps["inputs"] == ["video", "strength"] and caps["required_inputs"] == []
        assert caps["limits"]["max_frames"] == 64 and caps["limits"]["max_steps"] >= 1
        defaults = caps["defaults"]
        assert set(defaults) >= {"size", "num_frames", "num_inference_steps", "guidance_scale", "fps"}
        # The defaults are a request the server accepts as they are.
        width, height = (int(v) for v in defaults["size"].split("x"))
        assert width % caps["size_multiple"] == 0 and (defaults["num_frames"] - 1) % caps["frame_multiple"] == 0
        sizes = {"size": defaults["size"], "num_frames": defaults["num_frames"]}
        accepted = client.post("/v1/videos", json={"prompt": "a cat", **sizes, "num_inference_steps": 1})
        assert accepted.status_code == 200, accepted.text
        missing = client.get("/v1/models/other-model")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_model_details_of_a_speaking_model_and_of_an_audio_model(tmp_path):
    from tests.helpers.servers import ThreadServer
    from vidloom.generator import VideoGenerator
    from vidloom.serving.config import ServeConfig

    for name in ("qwen-omni-demo", "stable-audio-demo"):
        engine = VideoGenerator.from_pretrained(name, device="cpu").engine
        with ThreadServer(engine, ServeConfig(data_dir=tmp_path / name, graceful_shutdown_s=2)) as server:
            caps = httpx.get(f"{server.url}/v1/models/{name}", timeout=30).json()["capabilities"]
        if name == "qwen-omni-demo":  # voices from the checkpoint's speaker table, inputs from its towers
            assert caps["speech"] and caps["voices"] == ["Chelsie", "Ethan"] and "mp3" in caps["speech_formats"]
            assert caps["chat"] and caps["chat_inputs"] == ["audio", "image", "text"] and not caps["audio"]
        else:  # the clip's rules, for a form of seconds and formats
            assert caps["audio"] and not caps["speech"] and caps["voices"] == []
            defaults = caps["defaults"]
            assert defaults["seconds"] == defaults["max_seconds"] == 1.024 and defaults["takes_start"]
            assert "wav" in defaults["output_formats"] and caps["inputs"] == ["init_audio", "seconds", "seconds_start"]


def test_vidloom_serve_shows_the_page_and_no_ui_hides_it(demo_cache, tmp_path):
    from tests.helpers.servers import ProcessServer

    for extra, status in (((), 200), (("--no-ui",), 404)):
        server = ProcessServer(tmp_path / "data", demo_cache, tmp_path / "serve.log", *extra)
        try:
            assert httpx.get(f"{server.url}/").status_code == status, extra
        finally:
            server.terminate()
