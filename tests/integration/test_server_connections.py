"""The connection cap against a real uvicorn: idle or slow clients never lock out /health, /metrics or new clients."""

from __future__ import annotations

import time

import httpx

from tests.helpers.servers import held_open, open_connections

PARTIAL_POST = (b"POST /v1/videos HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                b"content-length: 100\r\n\r\n{")  # a complete head, then a body that never finishes: busy


def test_idle_connections_past_the_cap_give_way_and_health_stays_up(start_server):
    server = start_server(max_connections=8, header_timeout_s=30.0)
    with open_connections(server.url, 40) as idle:  # five times the cap, none sending a byte
        started = time.monotonic()
        with httpx.Client(base_url=server.url, timeout=5) as client:
            assert client.get("/health").status_code == 200
            assert client.get("/metrics").status_code == 200
            assert client.get("/v1/videos").status_code == 200  # the API too: the idlers gave way
        assert time.monotonic() - started < 2.0
        time.sleep(0.2)
        still_open = sum(held_open(s) for s in idle)
        assert still_open <= 8, f"{still_open} idle connections held past max_connections=8"
        # The ones idle longest went first: the newest 7 are still open (the client's own connection took one place).
        assert all(held_open(s) for s in idle[-7:]), "a newer idle connection went before an older one"


def test_busy_connections_leave_a_reserve_for_probes(start_server):
    server = start_server(max_connections=2, probe_connections=2, header_timeout_s=30.0, body_timeout_s=30.0)
    with open_connections(server.url, 2, PARTIAL_POST) as busy:  # both in a request: nothing to evict
        time.sleep(0.2)
        with httpx.Client(base_url=server.url, timeout=5) as client:
            assert client.get("/health").status_code == 200
            refused = client.get("/v1/videos")
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_busy"
        assert "max_connections" in refused.json()["error"]["message"]
        assert refused.headers["retry-after"] == "1" and refused.headers["connection"] == "close"
        assert all(held_open(s) for s in busy)  # busy requests are never cut for a newcomer
    time.sleep(0.2)
    assert httpx.get(f"{server.url}/v1/videos").status_code == 200


def test_past_the_reserve_a_connection_gets_503_and_is_closed(start_server):
    server = start_server(max_connections=1, probe_connections=1, header_timeout_s=30.0, body_timeout_s=30.0)
    with open_connections(server.url, 1, PARTIAL_POST):
        time.sleep(0.1)
        reserve = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-length: 5\r\n\r\n"
        with open_connections(server.url, 1, reserve):
            time.sleep(0.2)  # the reserve connection's request is still sending its body: busy too
            with open_connections(server.url, 1) as (late,):
                late.settimeout(5)
                answer = b""
                while chunk := late.recv(4096):
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 503") and b"server_busy" in answer, answer


def test_health_port_serves_probes_only_apart_from_api_clients(start_server):
    server = start_server(max_connections=1, probe_connections=1, health_port=0, header_timeout_s=30.0,
                          body_timeout_s=30.0)
    with open_connections(server.url, 2, PARTIAL_POST):  # the API port's cap and its reserve, all busy
        time.sleep(0.2)
        with httpx.Client(base_url=server.health_url, timeout=5) as probe:
            assert probe.get("/health").json()["status"] == "ok"
            assert "vidloom_queue_depth" in probe.get("/metrics").text
            other = probe.get("/v1/videos")
        assert other.status_code == 404 and "/health and /metrics only" in other.json()["error"]["message"]


def test_vidloom_serve_health_port_flag_prints_and_serves_the_probe_listener(demo_cache, tmp_path):
    import re

    from tests.helpers.servers import ProcessServer

    server = ProcessServer(tmp_path / "data", demo_cache, tmp_path / "serve.log", "--health-port", "0")
    try:
        match = re.search(r"health and metrics also on (http://127\.0\.0\.1:\d+)", server.log_path.read_text())
        assert match, server.log_path.read_text()
        assert match.group(1) != server.url
        assert httpx.get(f"{match.group(1)}/health", timeout=5).json()["status"] == "ok"
        assert httpx.get(f"{match.group(1)}/v1/videos", timeout=5).status_code == 404
        assert httpx.get(f"{server.url}/v1/videos", timeout=5).status_code == 200
    finally:
        server.terminate()
