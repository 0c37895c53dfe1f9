"""Abusive clients for the newer surfaces (#40): speech, spoken chat with media, sessions over WebSocket and
LoRA admin, each mix against a `vidloom serve` subprocess of a tiny model of its kind, with an RSS budget.

    .venv/bin/python bench/serve_abuse_surfaces.py --seconds 20           # every mix, 20 s each
    .venv/bin/python bench/serve_abuse_surfaces.py --mix sessions --seconds 5

Mixes (a `user` key unless said; bench/serve_abuse.py holds the video routes' abusers):
- speech (tiny Qwen2.5-Omni): /v1/audio/speech past 4,096 characters, an unknown voice, a voice object without
  `id`, a lone surrogate, and a short valid request;
- audio_chat (same server): a WAV labelled mp3, twenty 29 s MP3 parts (the issue's 1.41 GB chat: refused from
  their headers, past max_chat_media_bytes), a 600x2 image, a spoken answer to a short valid WAV;
- lora_admin (same server, --lora-dir): load and unload with the user key (403), then with the admin key a
  path outside the folders, `..`, a name with `/`, a 100,000-character name;
- sessions (tiny Cosmos3 action): open a session, send hostile WebSocket messages (an empty or lone-surrogate
  field name, a 400-digit action, not JSON, binary), each answered with an error, then a valid chunk must run.

Every answer is counted by status. A 5xx, a dead session or a failed /health probe (polled every 0.1 s) fails
the run. The server's RSS is read after one warm-up round of its mixes and after the abuse: the abuse may add
at most RSS_BUDGET_MIB (the issue's run saw +1.41 GB from one chat of 20 MP3 parts before admission existed).
"""

from __future__ import annotations

import argparse
import base64
import functools
import io
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from bench/: the tiny checkpoints live with the tests
    sys.path.insert(0, str(ROOT))

from serve_load import _healthy, _machine, _rss_mib  # noqa: E402  (bench/ is the script directory)

RESULTS = Path(__file__).parent / "results" / "serve_abuse_surfaces.json"
RSS_BUDGET_MIB = 200  # what a mix may add to the warmed server's resident memory
ADMIN, USER = "sk-bench-admin", "sk-bench-user"
MIXES = ("speech", "audio_chat", "lora_admin", "sessions")
SESSION_BODY = {"prompt": "push the block", "domain_name": "pusht", "chunk_size": 4, "resolution_tier": 256,
                "num_inference_steps": 2, "seed": 1}
HOSTILE_MESSAGES = ('{"": 1}', '{"\\ud800": [[1]]}', '{"actions": [[1' + "0" * 400 + ', 0.0]]}', "not json",
                    '{"actions": "left"}')


def _wav(seconds: float) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(16000)
        out.writeframes(b"\0\0" * int(16000 * seconds))
    return buf.getvalue()


@functools.cache
def _mp3_29s() -> bytes:
    """29 s of MP3 at 8 kbit/s (29 KB): twenty of them in one chat decode to 37 MB, past max_chat_media_bytes."""
    from tests.helpers.audio_containers import encoded_audio

    return encoded_audio("mp3", 29.0, bit_rate=8000)


def _png(width: int, height: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (90, 40, 10)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class SurfaceMix:
    """One mix's rounds against `url`; `counts` holds "<case>:<status>" tallies, `failures` what must not happen."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []

    def _client(self, key: str = USER) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, headers={"Authorization": f"Bearer {key}"})

    def _count(self, case: str, response: httpx.Response) -> None:
        self.counts[f"{case}:{response.status_code}"] += 1
        if response.status_code >= 500:
            self.failures.append(f"{case}: {response.status_code} {response.text[:200]}")

    def speech(self) -> None:
        base = {"model": self.model, "voice": "Chelsie", "response_format": "pcm", "seed": 1}
        cases = {"too_long": {"input": "x" * 4097}, "unknown_voice": {"input": "hi", "voice": "Nobody"},
                 "voice_without_id": {"input": "hi", "voice": {"name": "Chelsie"}},
                 "surrogate": {"input": "hi \ud800"}, "valid": {"input": "hello there"}}
        with self._client() as http:
            for case, fields in cases.items():
                body = json.dumps({**base, **fields})  # a lone surrogate goes out as its \\u escape
                self._count(f"speech:{case}", http.post("/v1/audio/speech", content=body,
                                                        headers={"content-type": "application/json"}))

    def audio_chat(self) -> None:
        def chat(part: dict, spoken: bool = False) -> dict:
            body = {"model": self.model, "max_tokens": 4, "seed": 1,
                    "messages": [{"role": "user", "content": [part, {"type": "text", "text": "what is this?"}]}]}
            return {**body, "modalities": ["text", "audio"], "audio": {"voice": "Chelsie", "format": "wav"}} \
                if spoken else body

        def audio(data: bytes, fmt: str) -> dict:
            return {"type": "input_audio", "input_audio": {"data": _b64(data), "format": fmt}}

        short = _wav(0.5)
        cases = {"wav_labelled_mp3": chat(audio(short, "mp3")),
                 "mp3_20x29s_over_media_bytes": {**chat(audio(short, "wav")), "messages": [{"role": "user", "content": [
                     audio(_mp3_29s(), "mp3") for _ in range(20)]}]},
                 "image_600x2": chat({"type": "image_url", "image_url": {"url": _png(600, 2)}}),
                 "spoken_valid": chat(audio(short, "wav"), spoken=True)}
        with self._client() as http:
            for case, body in cases.items():
                self._count(f"audio_chat:{case}", http.post("/v1/chat/completions", json=body))

    def lora_admin(self) -> None:
        with self._client() as user, self._client(ADMIN) as admin:
            self._count("lora:user_load", user.post("/v1/loras", json={"name": "x", "path": "x.safetensors"}))
            self._count("lora:user_unload", user.delete("/v1/loras/x"))
            for case, body in {"outside": {"name": "x", "path": "/etc/passwd"},
                               "dotdot": {"name": "x", "path": "../../etc/passwd"},
                               "slash_name": {"name": "a/b", "path": "x.safetensors"},
                               "long_name": {"name": "n" * 100_000, "path": "x.safetensors"}}.items():
                self._count(f"lora:admin_{case}", admin.post("/v1/loras", json=body))

    def sessions(self) -> None:
        from websockets.sync.client import connect

        with self._client() as http:
            opened = http.post("/v1/sessions", json={**SESSION_BODY, "input_reference": _png(64, 48)})
            self._count("session:open", opened)
            if opened.status_code != 200:
                return
            url = self.url.replace("http://", "ws://") + f"/v1/sessions/{opened.json()['id']}/ws"
            with connect(url, open_timeout=10, additional_headers={"Authorization": f"Bearer {USER}"}) as ws:
                ws.recv(timeout=10)  # the session's description
                for text in (*HOSTILE_MESSAGES, b"\x00\x01"):
                    ws.send(text)
                    reply = json.loads(ws.recv(timeout=30))
                    self.counts[f"session:hostile_{reply['type']}"] += 1
                ws.send(json.dumps({"actions": [[0.5, 0.5]]}))
                header = json.loads(ws.recv(timeout=120))
                if header.get("type") != "chunk":
                    self.failures.append(f"session: no chunk after the hostile messages: {header}")
                    return
                for _ in range(header["frames"]):
                    ws.recv(timeout=30)
                self.counts["session:usable_after"] += 1
            http.delete(f"/v1/sessions/{opened.json()['id']}")


@contextmanager
def _server(model: Path, keys: Path, lora_dir: Path, data_dir: Path) -> Iterator[tuple[str, int]]:
    """A `vidloom serve` subprocess of `model` with an admin and a user key: (its URL, its pid)."""
    log = data_dir.parent / f"{model.name}.log"
    cmd = [sys.executable, "-m", "vidloom.cli", "serve", "--model", str(model), "--port", "0", "--device", "cpu",
           "--data-dir", str(data_dir), "--api-keys-file", str(keys), "--lora-dir", str(lora_dir)]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            match = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())
            if match and _healthy(match.group(1)):
                yield match.group(1), proc.pid
                return
            time.sleep(0.2)
        raise RuntimeError(f"server did not start:\n{log.read_text()[-2000:]}")
    finally:
        proc.terminate()
        proc.wait(60)


def _probe_health(url: str, stop: threading.Event, out: list[float], failures: list[str]) -> None:
    with httpx.Client(base_url=url, timeout=10) as http:
        while not stop.wait(0.1):
            started = time.perf_counter()
            try:
                http.get("/health").raise_for_status()
            except httpx.HTTPError as exc:
                failures.append(f"/health: {type(exc).__name__}")
                continue
            out.append(time.perf_counter() - started)


def run_mixes(url: str, pid: int, mixes: list[str], seconds: float) -> dict:
    """A warm-up round of each mix, the RSS then, rounds until `seconds` pass, the RSS after."""
    with httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
    mix = SurfaceMix(url, model)
    rounds: list[Callable[[], None]] = [getattr(mix, name) for name in mixes]
    for work in rounds:
        work()
    rss = {"warm_mib": _rss_mib(pid), "warm_peak_mib": _rss_mib(pid, "VmHWM")}
    health: list[float] = []
    stop = threading.Event()
    prober = threading.Thread(target=_probe_health, args=(url, stop, health, mix.failures))
    prober.start()
    started, passes = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        for work in rounds:
            work()
        passes += 1
    stop.set()
    prober.join()
    rss.update(after_mib=_rss_mib(pid), peak_mib=_rss_mib(pid, "VmHWM"))
    grown = round(rss["after_mib"] - rss["warm_mib"], 1) if rss["after_mib"] and rss["warm_mib"] else None
    rss.update(grown_mib=grown, budget_mib=RSS_BUDGET_MIB, within_budget=grown is not None and grown <= RSS_BUDGET_MIB)
    if not rss["within_budget"]:
        mix.failures.append(f"RSS grew {grown} MiB, over the {RSS_BUDGET_MIB} MiB budget")
    return {"mixes": mixes, "passes": passes, "wall_s": round(time.monotonic() - started, 1),
            "counts": dict(sorted(mix.counts.items())), "failures": mix.failures, "rss": rss,
            "health_s": {"probes": len(health), "max": round(max(health), 4) if health else None}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mix", action="append", choices=MIXES, help="repeatable; default: every mix")
    p.add_argument("--seconds", type=float, default=20.0, help="abuse time per server after its warm-up round")
    args = p.parse_args()
    from tests.helpers.cosmos3_action_checkpoints import write_tiny_cosmos3_action
    from tests.helpers.qwen_omni_checkpoints import write_tiny_omni

    chosen = args.mix or list(MIXES)
    servers = [(write_tiny_omni, [m for m in chosen if m != "sessions"]),
               (write_tiny_cosmos3_action, [m for m in chosen if m == "sessions"])]
    runs = []
    with tempfile.TemporaryDirectory(prefix="vidloom-abuse-") as tmp:
        keys = Path(tmp) / "keys.txt"
        keys.write_text(f"{ADMIN} admin ops\n{USER} user bench\n")
        (Path(tmp) / "loras").mkdir()
        for write, mixes in servers:
            if not mixes:
                continue
            model = write(Path(tmp) / write.__name__.removeprefix("write_"))
            with _server(model, keys, Path(tmp) / "loras", Path(tmp) / f"data-{model.name}") as (url, pid):
                runs.append(run_mixes(url, pid, mixes, args.seconds))
            print(json.dumps(runs[-1], indent=2), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"config": vars(args), "machine": _machine(), "runs": runs}, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    if any(run["failures"] for run in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
