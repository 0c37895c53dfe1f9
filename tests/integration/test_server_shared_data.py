"""Servers on one machine: two sharing a data folder list only their own jobs; Ctrl-C stops one quietly (#39)."""

from __future__ import annotations

import httpx

from tests.helpers.servers import create_video, wait_for_status


def test_servers_sharing_a_folder_list_their_own_jobs(start_server, tmp_path):
    data_dir = tmp_path / "shared"
    first = start_server(data_dir=data_dir)
    other = start_server(data_dir=data_dir, served_model_name="other-demo")
    with httpx.Client(base_url=first.url, timeout=30) as a, httpx.Client(base_url=other.url, timeout=30) as b:
        mine = create_video(a)["id"]
        theirs = create_video(b)["id"]
        for client, job in ((a, mine), (b, theirs)):
            wait_for_status(client, job, {"completed"})
        listed_a = [v["id"] for v in a.get("/v1/videos").json()["data"]]
        listed_b = b.get("/v1/videos").json()["data"]
    assert listed_a == [mine]
    assert [v["id"] for v in listed_b] == [theirs] and listed_b[0]["model"] == "other-demo"


def test_ctrl_c_stops_an_idle_server_without_a_cancelled_line(demo_cache, tmp_path):
    """Ctrl-C is how a running server stops: uvicorn's shutdown lines, exit 0, no stray `cancelled` (#39)."""
    import signal

    from tests.helpers.servers import ProcessServer

    server = ProcessServer(tmp_path / "data", demo_cache, tmp_path / "serve.log")
    server.proc.send_signal(signal.SIGINT)
    code = server.proc.wait(60)
    server._log.close()
    log = (tmp_path / "serve.log").read_text()
    assert code == 0, log
    assert "Application shutdown complete" in log and "cancelled" not in log
