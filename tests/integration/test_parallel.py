"""Several processes on CPU (gloo): sp=2, cfg=2 and sp x cfg match one process; failures end in bounded time.

Sizes are chosen so everything divides by 2: tiny-a has 2 heads, and 32x48 with 5 frames
is a 2x2x3 patch grid (12 tokens). Workers get one CPU thread each (2 cores, 2 ranks).
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing import forkserver
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from tests.helpers.servers import ThreadServer, create_video, wait_for_status
from tests.helpers.wan_checkpoints import TINY_A, TINY_B, write_tiny_wan
from vidloom.core.errors import Cancelled, InvalidRequest, WorkerFailed
from vidloom.core.output import ProgressEvent
from vidloom.core.parallel import ParallelPlan
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.media.frames import to_uint8
from vidloom.media.video import read_video
from vidloom.runtime.async_engine import AsyncEngine
from vidloom.runtime.engine import CancellationToken
from vidloom.runtime.parallel.worker import PoolOptions
from vidloom.serving.config import ServeConfig

# fp32 on CPU. The all-to-all and all-gather copy values exactly; a rank's matmuls see fewer
# rows (sp) and every rank runs one thread instead of two, so only summation order inside
# kernels can change. Observed: 0 on these configs (<= 5e-7 on the DiT output in the unit
# tests). 1e-5 on the decoded float video would still catch one misplaced token or head.
FP32_TOL = 1e-5
SMALL = dict(prompt="a red fox in the snow", height=32, width=48, num_frames=5, num_inference_steps=3, seed=7)
# Short enough that a wedged collective fails a test quickly; the lockstep check is on throughout.
OPTIONS = PoolOptions(collective_timeout_s=30, check_lockstep=True)
GUIDED = GenerationRequest(**{**SMALL, "guidance_scale": 5.0})


@pytest.fixture(scope="module")
def tiny_a(tmp_path_factory) -> Path:
    return write_tiny_wan(tmp_path_factory.mktemp("tiny-a"), TINY_A)


@pytest.fixture(scope="module")
def tiny_b(tmp_path_factory) -> Path:
    return write_tiny_wan(tmp_path_factory.mktemp("tiny-b"), TINY_B)


@pytest.fixture(scope="module")
def reference_a(tiny_a) -> dict:
    """One process, the default path: the video every plan must reproduce."""
    return VideoGenerator.from_pretrained(tiny_a, device="cpu").engine.run(GenerationRequest(**SMALL))


@pytest.fixture(scope="module")
def reference_b(tiny_b) -> dict:
    """One process on tiny-b with guidance (both branches): what cfg=2 and sp=2's ring attention must reproduce."""
    return VideoGenerator.from_pretrained(tiny_b, device="cpu").engine.run(GUIDED)


@pytest.fixture(scope="module")
def sp2(tiny_a) -> Iterator[VideoGenerator]:
    with VideoGenerator.from_pretrained(tiny_a, device="cpu", parallel=ParallelPlan(sp=2), pool_options=OPTIONS) as gen:
        yield gen
        pids = gen.engine.transport.pids
    assert not _alive(pids)  # close() joined every worker


def _alive(pids: list[int]) -> set[int]:
    """Which of these worker pids are still running children of this process."""
    return set(pids) & {p.pid for p in multiprocessing.active_children()}


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    return float(np.abs(a - b).max())


def test_sp2_matches_one_process_and_relays_progress(sp2, reference_a):
    events: list = []
    out = sp2.engine.run(GenerationRequest(**SMALL), on_event=events.append)
    assert _max_diff(out["video"], reference_a["video"]) <= FP32_TOL
    assert out["request"].seed == 7 and out["elapsed_s"] > 0
    progress = [(e.phase, e.step, e.total) for e in events if isinstance(e, ProgressEvent)]
    assert progress == [("denoise", 1, 3), ("denoise", 2, 3), ("denoise", 3, 3), ("decode", 1, 2), ("decode", 2, 2)]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_ranks_fork_from_a_forkserver_that_imported_torch_and_ran_nothing(sp2):
    """Ranks skip the torch import; the server they fork from never ran an op (no OpenMP pool or CUDA to inherit)."""
    server = forkserver._forkserver._forkserver_pid
    assert server is not None
    for pid in sp2.engine.transport.pids:
        assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(server)
    assert "libtorch_cpu" in Path(f"/proc/{server}/maps").read_text()
    # One thread: no OpenMP (or CUDA) threads that a fork would copy broken; OpenBLAS stops its own at each fork.
    assert len(list(Path(f"/proc/{server}/task").iterdir())) == 1


def test_sp2_rejects_an_unsplittable_request_at_submit_and_stays_usable(sp2):
    with pytest.raises(InvalidRequest, match="num_frames: .* 27 video tokens"):
        sp2.generate("x", height=48, width=48, num_frames=9)
    token = CancellationToken()
    seen: list = []

    def cancel_at_step_2(event):
        seen.append(event)
        if isinstance(event, ProgressEvent) and event.phase == "denoise" and event.step == 2:
            token.cancel()

    with pytest.raises(Cancelled):
        sp2.engine.run(GenerationRequest(**{**SMALL, "num_inference_steps": 6}), on_event=cancel_at_step_2, cancel=token)
    # Rank 0 reports each step as it finishes; the ranks stop at the next boundary (within one step).
    denoised = [e.step for e in seen if isinstance(e, ProgressEvent) and e.phase == "denoise"]
    assert denoised == list(range(1, denoised[-1] + 1)) and 2 <= denoised[-1] <= 3
    assert not any(e.phase == "decode" for e in seen if isinstance(e, ProgressEvent))
    assert not sp2.engine.broken  # a cancel ends the request on every rank, not the pool


def test_async_engine_drives_the_pool(sp2, reference_a):
    engine = AsyncEngine(sp2.engine)
    try:
        video = engine.submit(GenerationRequest(**SMALL)).wait(timeout=120)
    finally:
        engine.close()
    assert video.metadata["seed"] == 7 and video.metadata["model"] == sp2.card.model_id
    assert np.array_equal(video.frames, to_uint8(reference_a["video"]))


def test_http_server_serves_from_the_pool(sp2, tmp_path):
    with ThreadServer(sp2.engine, ServeConfig(data_dir=tmp_path, graceful_shutdown_s=2)) as server:  # type: ignore[arg-type]
        with httpx.Client(base_url=server.url, timeout=30) as client:
            done = wait_for_status(client, create_video(client)["id"], {"completed", "failed"})
            assert done["status"] == "completed", done
            bad = client.post("/v1/videos", json={"prompt": "x", "size": "48x48", "num_frames": 9})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "num_frames"


def test_killed_worker_fails_the_request_quickly_then_the_pool_restarts(sp2, reference_a):
    pids = sp2.engine.transport.pids
    victim = pids[1]

    def kill_rank1_after_first_step(event):
        if isinstance(event, ProgressEvent) and event.phase == "denoise" and event.step == 1:
            os.kill(victim, signal.SIGKILL)

    started = time.perf_counter()
    with pytest.raises(WorkerFailed, match=r"rank 1: worker process \d+ was killed by SIGKILL") as err:
        sp2.engine.run(GenerationRequest(**SMALL), on_event=kill_rank1_after_first_step)
    assert err.value.rank == 1 and time.perf_counter() - started < 30
    assert sp2.engine.broken and not _alive(pids)  # survivors were stopped too
    out = sp2.engine.run(GenerationRequest(**SMALL))  # restarts automatically (weights load again)
    assert victim not in sp2.engine.transport.pids
    assert _max_diff(out["video"], reference_a["video"]) <= FP32_TOL


@pytest.fixture(scope="module")
def cfg2(tiny_b) -> Iterator[VideoGenerator]:
    # A short collective timeout, so the stalled-rank test below fails within seconds.
    options = PoolOptions(collective_timeout_s=5, check_lockstep=True)
    with VideoGenerator.from_pretrained(tiny_b, device="cpu", parallel=ParallelPlan(cfg=2), pool_options=options) as gen:
        yield gen
        pids = gen.engine.transport.pids
    assert not _alive(pids)


def test_cfg2_matches_one_process(cfg2, reference_b):
    assert _max_diff(cfg2.engine.run(GUIDED)["video"], reference_b["video"]) <= FP32_TOL
    with pytest.raises(InvalidRequest, match="guidance_scale"):
        cfg2.generate("x", guidance_scale=1.0, height=32, width=48, num_frames=5)


def test_a_stalled_rank_times_out_the_collective_and_fails_the_request(cfg2):
    pids = cfg2.engine.transport.pids
    victim = pids[1]
    os.kill(victim, signal.SIGSTOP)  # alive, but it never joins the next collective
    started = time.perf_counter()
    with pytest.raises(WorkerFailed, match=r"rank 1: stopped responding \(rank 0 reported: .*") as err:
        cfg2.engine.run(GenerationRequest(**SMALL))
    assert err.value.rank == 1 and time.perf_counter() - started < 30
    assert cfg2.engine.broken and not _alive(pids)  # the stopped one was killed


def test_sp2_over_three_heads_runs_ring_attention_and_matches_one_process(tiny_b, reference_b, caplog):
    """tiny-b's 3 heads do not split over 2 ranks: keys and values go around the ring (gloo send/recv)."""
    with caplog.at_level("INFO", logger="vidloom.runtime.parallel.launch"):
        with VideoGenerator.from_pretrained(tiny_b, device="cpu", parallel=ParallelPlan(sp=2),
                                            pool_options=OPTIONS) as gen:
            out = gen.engine.run(GUIDED)
    assert "does not divide the model's 3 attention heads: self-attention runs as ring attention" in caplog.text
    assert _max_diff(out["video"], reference_b["video"]) <= FP32_TOL


@pytest.mark.slow
def test_sp2_x_cfg2_on_four_processes(tiny_a, reference_a):
    plan = ParallelPlan(sp=2, cfg=2)
    with VideoGenerator.from_pretrained(tiny_a, device="cpu", parallel=plan, pool_options=OPTIONS) as gen:
        out = gen.engine.run(GenerationRequest(**SMALL))
    assert _max_diff(out["video"], reference_a["video"]) <= FP32_TOL


def test_torchrun_generate_writes_the_same_image_from_rank_0(tiny_a, tmp_path):
    single = VideoGenerator.from_pretrained(tiny_a, device="cpu").generate(**{**SMALL, "num_frames": 1})
    out = tmp_path / "rank0.png"
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [
        str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "vidloom.cli", "generate",
        "--model", str(tiny_a), "--sp", "2", "--device", "cpu", "--prompt", SMALL["prompt"],
        "--height", "32", "--width", "48", "--frames", "1", "--steps", "3", "--seed", "7", "--output", str(out),
    ]
    env = {**os.environ, "VIDLOOM_PARALLEL_DEBUG": "1"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own group, so a timeout kills every rank
    try:
        log, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, log
    assert log.count("wrote ") == 1  # rank 0 writes; rank 1 only followed
    # PNG is lossless; a float difference within FP32_TOL can still round one pixel to the next level.
    assert np.abs(read_video(out)[0].astype(int) - single.frames).max() <= 1
