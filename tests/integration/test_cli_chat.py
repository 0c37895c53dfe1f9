"""`vidloom chat` as a user runs it: a conversation read from piped stdin (in this process: tests/helpers/cli_runs.py)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.cli_runs import CliRun, run_cli
from vidloom.generator import VideoGenerator


def _run(args: list[str], stdin: str, cache: Path | None = None) -> CliRun:
    return run_cli(["chat", *args], cache, stdin)


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
    out = _run(["--model", "wan2.1-demo", "--device", "cpu"], "hi\n", demo_cache)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("error: --model: ")
    assert "does not support chat" in out.stderr
