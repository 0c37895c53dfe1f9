"""MediaPool: upload work runs on its own threads, at most workers + queue calls at once, refused past that."""

from __future__ import annotations

import asyncio
import threading

import pytest

from vidloom.runtime.async_engine import EngineBusy
from vidloom.serving.media_pool import MediaPool


def test_calls_run_off_the_event_loop_thread():
    pool = MediaPool(workers=2, queue=0)

    async def main() -> str:
        return await pool.run(lambda: threading.current_thread().name)

    try:
        assert asyncio.run(main()).startswith("vidloom-media")
    finally:
        pool.close()


def test_a_full_pool_refuses_at_once_and_recovers():
    pool = MediaPool(workers=1, queue=1)
    release = threading.Event()

    async def main() -> None:
        running = [asyncio.ensure_future(pool.run(release.wait, 10)) for _ in range(2)]  # one runs, one waits
        await asyncio.sleep(0.05)
        assert pool.pending == 2
        with pytest.raises(EngineBusy, match="media_workers=1, media_queue=1") as err:
            await pool.run(lambda: None)
        assert err.value.retry_after_s >= 1
        release.set()
        assert await asyncio.gather(*running) == [True, True]
        assert pool.pending == 0
        assert await pool.run(lambda x: x + 1, 1) == 2

    try:
        asyncio.run(main())
    finally:
        release.set()
        pool.close()


def test_errors_pass_through_and_free_the_place():
    pool = MediaPool(workers=1, queue=0)

    def fail() -> None:
        raise ValueError("bad upload")

    async def main() -> None:
        with pytest.raises(ValueError, match="bad upload"):
            await pool.run(fail)
        assert pool.pending == 0

    try:
        asyncio.run(main())
    finally:
        pool.close()


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="workers >= 1"):
        MediaPool(workers=0, queue=1)
