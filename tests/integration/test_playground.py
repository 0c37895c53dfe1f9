"""The playground's server side over HTTP: the page and its headers, the card route it builds its form from."""

from __future__ import annotations

import httpx

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
        assert anon.get("/ui/app.js").headers["content-type"].startswith("text/javascript")
        assert anon.get("/ui/app.css").headers["content-type"].startswith("text/css")
        for text in (page.text, anon.get("/ui/app.js").text, anon.get("/ui/app.css").text):
            assert "https://" not in text and "//cdn" not in text  # works offline: nothing from elsewhere
        assert anon.get("/v1/models/wan2.1-demo").status_code == 401  # the data stays behind the key
        assert anon.get("/ui/other.js").status_code == 401  # only the three files are open


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


def test_vidloom_serve_shows_the_page_and_no_ui_hides_it(demo_cache, tmp_path):
    from tests.helpers.servers import ProcessServer

    for extra, status in (((), 200), (("--no-ui",), 404)):
        server = ProcessServer(tmp_path / "data", demo_cache, tmp_path / "serve.log", *extra)
        try:
            assert httpx.get(f"{server.url}/").status_code == status, extra
        finally:
            server.terminate()
