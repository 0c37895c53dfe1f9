"""Job persistence across server lifetimes: opening the store, recovering jobs of servers that died, and the
request parameters stored with a job (enough to run it again)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np

from vidloom.core.request import GenerationRequest
from vidloom.core.session import VideoSession
from vidloom.serving.config import ServeConfig
from vidloom.serving.job_backends import open_job_store
from vidloom.serving.job_store import STORE_ERRORS, JobStore, StoreError, full_disk_error

log = logging.getLogger("vidloom.serving.jobs")

# Jobs unfinished when a server stops (gracefully, or found at the next start after a crash).
SERVER_RESTART = ("server_restart", "the server stopped before this job finished; submit it again")


def open_store(config: ServeConfig) -> JobStore:
    """Open the job store and recover it after dead servers (raises StoreError on a bad or unreachable database)."""
    store = open_job_store(config.store, config.data_dir)
    try:
        recover_lost_jobs(store, config, tidy=True)
    except (*STORE_ERRORS, OSError) as exc:  # the first writes of a start: a full disk shows here too
        store.close()
        error = full_disk_error(f"job store in {config.data_dir}", config.data_dir, exc)
        raise error or StoreError(f"job store in {config.data_dir}: recovery after the last run failed "
                                  f"({exc})") from None
    return store


def recover_lost_jobs(store: JobStore, config: ServeConfig, *, tidy: bool = False) -> None:
    """Fail or re-queue (config.lost_jobs) the active jobs of servers that died."""
    done = store.recover(now(), *SERVER_RESTART, requeue=config.lost_jobs == "requeue",
                         max_requeues=config.max_requeues, tidy=tidy)
    if done.failed:
        log.warning("marked %d job(s) left unfinished by a server that stopped as failed (server_restart)",
                    done.failed)
    if done.requeued:
        log.warning("re-queued %d job(s) left unfinished by a server that stopped", done.requeued)


def request_params(request: GenerationRequest) -> dict[str, Any]:
    """The resolved request as stored with the job: with the job's prompt, enough to run it again, seed included.

    The prompt is left out: the job stores it once, as its `prompt`, not a second time here.
    """
    media = ("image", "last_image", "video", "init_audio")  # not stored; noted as given
    params = {f.name: getattr(request, f.name) for f in dataclasses.fields(request)
              if f.name not in media and f.name not in ("request_id", "prompt", "options")}
    params["task"] = request.task.value
    params.update({name: True for name in media if getattr(request, name) is not None})
    options = dict(request.options)
    if isinstance(options.get("extend_from"), VideoSession):
        options["extend_from"] = options["extend_from"].session_id  # the source video's id
    if options.get("action") is not None:  # the family's resolved block says how it is stored (no media)
        options["action"] = options["action"].params()
    # Camera blocks (SANA-WM) as JSON: the action string (the validated block keeps it) and plain lists.
    if options.get("camera") is not None:
        options["camera"] = getattr(options["camera"], "action", options["camera"])
    for name in ("c2w", "intrinsics"):
        if options.get(name) is not None:
            options[name] = np.asarray(options[name], dtype=float).tolist()
    params.update(options)
    return params


def now() -> int:
    return int(time.time())
