"""Keys on the fleet: the ingress checks the key, the replica creates the job under the caller's owner, so another
owner's key finds it (and its image files) as it finds a missing one. In-process replicas behind the real
ingress (tests/helpers/fleet.py); test_fleet_ray_caller.py carries a forwarded request through Ray itself."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from tests.helpers.servers import BLOCKING_STEPS, create_video, wait_for_status
from vidloom.serving.api_keys import ApiKey
from vidloom.serving.config import ServeConfig

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
ALICE, BOB, ROOT = "sk-alice-fleet", "sk-bob-fleet", "sk-root-fleet"


@pytest.fixture(scope="module")
def fleet(demo_engine, postgres, tmp_path_factory) -> Iterator[object]:
    from tests.helpers.fleet import LocalFleet

    keys = (ApiKey(ALICE, "user", "alice"), ApiKey(BOB, "user", "bob"), ApiKey(ROOT, "admin", "ops"))
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("fleet-keys"), store=postgres.new_database(), port=0,
                         api_keys=keys, max_steps=BLOCKING_STEPS, graceful_shutdown_s=2, recovery_interval_s=0.5)
    running = LocalFleet([demo_engine], config)
    try:
        yield running
    finally:
        running.stop()


def _client(fleet, key: str) -> httpx.Client:
    return httpx.Client(base_url=fleet.url, timeout=60, headers={"Authorization": f"Bearer {key}"})


def test_a_job_made_through_the_fleet_belongs_to_its_callers_owner(fleet):
    with _client(fleet, ALICE) as alice, _client(fleet, BOB) as bob, _client(fleet, ROOT) as root:
        video = create_video(alice)
        assert fleet.cores[0].jobs.store.get(video["id"]).key_owner == "alice"  # the replica saw the caller
        missing = bob.get("/v1/videos/video_" + "0" * 32)
        for path in (f"/v1/videos/{video['id']}", f"/v1/videos/{video['id']}/content"):
            refused = bob.get(path)
            assert refused.status_code == 404 and refused.json()["error"]["code"] == missing.json()["error"]["code"]
        assert bob.get("/v1/videos").json()["data"] == []
        assert [v["id"] for v in alice.get("/v1/videos").json()["data"]] == [video["id"]]
        assert root.get(f"/v1/videos/{video['id']}").status_code == 200
        assert wait_for_status(alice, video["id"], {"completed"})["status"] == "completed"


def test_an_image_file_made_through_the_fleet_is_its_owners(fleet):
    with _client(fleet, ALICE) as alice, _client(fleet, BOB) as bob:
        made = alice.post("/v1/images/generations", json={"prompt": "a heron", "response_format": "url",
                                                          "size": "32x32", "num_inference_steps": 1})
        assert made.status_code == 200, made.text
        path = "/v1/images/files/" + made.json()["data"][0]["url"].rsplit("/", 1)[1]
        assert alice.get(path).status_code == 200
        assert bob.get(path).status_code == 404
