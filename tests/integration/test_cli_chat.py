"""`vidloom chat` as a user runs it: a subprocess reading a conversation from piped stdin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vidloom.generator import VideoGenerator

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], stdin: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env_extra}
    return subprocess.run([sys.executable, "-m", "vidloom.cli", "chat", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=120, cwd=ROOT)


def test_piped_conversation_keeps_history(cosmos3_dir: Path):
    out = _run(["--model", str(cosmos3_dir), "--device", "cpu", "--temperature", "0", "--max-tokens", "6",
                "--system", "you are a helpful assistant"], "hello world\n\ntell me a story\n/exit\nnever read\n")
    assert out.returncode == 0, out.stderr
    generator = VideoGenerator.from_pretrained(cosmos3_dir, device="cpu")
    history = [{"role": "system", "content": "you are a helpful assistant"}, {"role": "user", "content": "hello world"}]
    first = generator.chat(history, max_tokens=6, temperature=0)
    history += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "tell me a story"}]
    second = generator.chat(history, max_tokens=6, temperature=0)
    assert out.stdout == f"{first.text}\n{second.text}\n"  # blank line skipped, nothing after /exit
    assert "[reply cut at 6 tokens" in out.stderr or first.finish_reason == "stop"


def test_model_without_chat_is_one_error_line(demo_cache: Path):
    out = _run(["--model", "wan2.1-demo", "--device", "cpu"], "hi\n", VIDLOOM_CACHE=str(demo_cache))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("error: --model: ")
    assert "does not support chat" in out.stderr
