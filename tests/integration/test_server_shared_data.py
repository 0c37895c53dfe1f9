"""Two servers sharing one data folder: each lists only its own model's jobs (#39)."""

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
