"""One request through the three ways in: `vidloom generate`, VideoGenerator, and `vidloom serve` + HTTP.

Each path runs its real code (argparse, DeployConfig building, the server's body parsing and
job manager) in this process, so the equivalence tests are fast. Spies only record: the
VideoOutput a path produced (CLI: `VideoOutput.save`; server: the job manager's file write)
and the DeployConfig of the engine it loaded; every call goes through to the real function.
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest

from tests.helpers.servers import wait_healthy
from vidloom import cli
from vidloom.core.deploy import DeployConfig
from vidloom.core.output import VideoOutput
from vidloom.generator import VideoGenerator
from vidloom.serving import server as server_module
from vidloom.serving.jobs import JobManager

VOLATILE = ("request_id", "elapsed_s")  # differ between any two runs by design


def request_forms(prompt: str, seed: int) -> tuple[dict[str, Any], list[str], dict[str, Any], dict[str, Any]]:
    """One small request (48x32, 5 frames, 2 steps) as each way in spells it: VideoGenerator keywords, `vidloom
    generate` flags, the OpenAI body's fields, and the extension fields the OpenAI body carries beside them."""
    kwargs = {"prompt": prompt, "height": 32, "width": 48, "num_frames": 5, "num_inference_steps": 2, "seed": seed}
    cli_args = ["--prompt", prompt, "--height", "32", "--width", "48", "--frames", "5", "--steps", "2",
                "--seed", str(seed)]
    openai_body = {"prompt": prompt, "size": "48x32"}
    return kwargs, cli_args, openai_body, {"num_frames": 5, "num_inference_steps": 2, "seed": seed}


@dataclass
class Outcome:
    """What one path produced: the engine's deployment and the finished video (or the error it printed)."""

    deploy: DeployConfig | None = None
    output: VideoOutput | None = None
    error: str | None = None
    parameters: dict[str, Any] | None = None  # the server's stored resolved request (server path only)

    def comparable(self) -> dict[str, Any]:
        """The resolved request as the run reports it, minus what differs per run."""
        assert self.output is not None, self.error
        return {k: v for k, v in self.output.metadata.items() if k not in VOLATILE}


@dataclass
class Spies:
    """Records what the real code produced; installed for the duration of a `spies()` block."""

    deploys: list[DeployConfig] = field(default_factory=list)
    saved: list[VideoOutput] = field(default_factory=list)
    written: dict[str, VideoOutput] = field(default_factory=dict)
    servers: list[Any] = field(default_factory=list)
    sockets: list[Any] = field(default_factory=list)


@contextmanager
def spies() -> Iterator[Spies]:
    record = Spies()
    real_load = VideoGenerator.from_pretrained.__func__  # type: ignore[attr-defined]
    real_run, real_write = VideoGenerator.run, JobManager._write_files
    real_uvicorn, real_bind = server_module.uvicorn_server, server_module.bind

    def load(cls, *args, **kwargs):
        generator = real_load(cls, *args, **kwargs)
        record.deploys.append(generator.engine.instance.deploy)
        return generator

    def run(self, *args, **kwargs):  # what the CLI writes (it saves through media.output.write_output)
        record.saved.append(real_run(self, *args, **kwargs))
        return record.saved[-1]

    def write(self, job_id, output):
        record.written[job_id] = output
        return real_write(self, job_id, output)

    def uvicorn(*args, **kwargs):
        record.servers.append(real_uvicorn(*args, **kwargs))
        return record.servers[-1]

    def bind(*args, **kwargs):
        record.sockets.append(real_bind(*args, **kwargs))
        return record.sockets[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(VideoGenerator, "from_pretrained", classmethod(load))
        mp.setattr(VideoGenerator, "run", run)
        mp.setattr(JobManager, "_write_files", write)
        mp.setattr(server_module, "uvicorn_server", uvicorn)
        mp.setattr(server_module, "bind", bind)
        yield record


def run_cli(argv: list[str], out: Path, capsys: pytest.CaptureFixture) -> Outcome:
    """`vidloom generate ARGV --output OUT` in this process."""
    with spies() as seen:
        code = cli.main(["generate", "--device", "cpu", "--output", str(out), *argv])
    err = capsys.readouterr().err
    if code != 0:
        return Outcome(seen.deploys[-1] if seen.deploys else None, error=_error_line(err))
    assert len(seen.saved) == 1 and out.exists()
    return Outcome(seen.deploys[-1], seen.saved[-1])


def run_api(cache: Path, deploy: DeployConfig, **kwargs: Any) -> Outcome:
    """VideoGenerator.from_pretrained(deploy=...).generate(**kwargs)."""
    from vidloom.core.errors import VidloomError

    try:
        with VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=cache, deploy=deploy) as gen:
            return Outcome(gen.engine.instance.deploy, gen.generate(**kwargs))
    except VidloomError as exc:
        return Outcome(error=f"error: {exc}")


class CliServer:
    """`vidloom serve --port 0 FLAGS` running in a thread of this process, with its spies."""

    def __init__(self, flags: list[str], data_dir: Path) -> None:
        self._stack = ExitStack()
        self.seen = self._stack.enter_context(spies())
        self.code: int | None = None
        argv = ["serve", "--device", "cpu", "--port", "0", "--data-dir", str(data_dir), *flags]
        self._thread = threading.Thread(target=self._main, args=(argv,), daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self.seen.servers and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.url = None
        if self.seen.servers:
            self.url = f"http://127.0.0.1:{self.seen.sockets[-1].getsockname()[1]}"
            wait_healthy(self.url)

    def _main(self, argv: list[str]) -> None:
        self.code = cli.main(argv)

    def run(self, openai_fields: dict[str, Any], extensions: dict[str, Any]) -> Outcome:
        """Create a video with the official client (`extensions` as extra JSON fields) and wait for it."""
        import openai

        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="test", max_retries=0)
        video = client.videos.create(**openai_fields, extra_body=extensions)
        with httpx.Client(base_url=self.url, timeout=30) as http:
            deadline = time.monotonic() + 60
            while (body := http.get(f"/v1/videos/{video.id}").json())["status"] not in ("completed", "failed"):
                assert time.monotonic() < deadline, body
                time.sleep(0.01)
        assert body["status"] == "completed", body
        deploy = self.seen.deploys[-1]
        # The object stores the prompt once, as its own `prompt`; the rest of the request is `parameters`.
        stored = {**body["parameters"], "prompt": body["prompt"]}
        return Outcome(deploy, self.seen.written[video.id], parameters=stored)

    def stop(self) -> None:
        for running in self.seen.servers:
            running.should_exit = True
        self._thread.join(30)
        self._stack.close()
        assert not self._thread.is_alive(), "server thread did not stop"


def _error_line(stderr: str) -> str | None:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    return lines[-1] if lines else None


def assert_same_outcome(a: Outcome, b: Outcome, what: str, same_deploy: bool = True) -> None:
    assert a.error == b.error, f"{what}: errors differ"
    if a.error is not None:
        return
    if same_deploy:
        assert a.deploy == b.deploy, f"{what}: the engines were deployed differently"
    assert a.comparable() == b.comparable(), f"{what}: resolved requests differ"
    assert a.output.fps == b.output.fps
    assert np.array_equal(a.output.frames, b.output.frames), f"{what}: frames differ"
    assert a.output.sample_rate == b.output.sample_rate, f"{what}: audio sample rates differ"
    assert (a.output.audio is None) == (b.output.audio is None), f"{what}: one path has audio, the other none"
    if a.output.audio is not None:
        assert np.array_equal(a.output.audio, b.output.audio), f"{what}: audio differs"
