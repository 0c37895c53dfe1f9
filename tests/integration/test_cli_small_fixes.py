"""Small things a newcomer trips on, through the CLI as a user runs it (in this process: tests/helpers/cli_runs.py):
`-o`, "1 frame", and `vidloom chat` saying why a reply is blank instead of printing a bare newline."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.cli_runs import run_cli as _run
from vidloom.generator import VideoGenerator


def test_dash_o_writes_the_output_and_one_frame_is_singular(demo_cache: Path, tmp_path: Path):
    out = tmp_path / "still.png"
    proc = _run(["generate", "--prompt", "a cat", "-o", str(out), "--frames", "1", "--steps", "1",
                 "--height", "32", "--width", "48", "--seed", "3"], demo_cache)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file()
    [wrote] = [line for line in proc.stdout.splitlines() if line.startswith("wrote ")]
    assert f"wrote {out.resolve()}  (image 48x32, seed 3" in wrote, wrote  # one frame in an image file (#39)


def test_dash_o_errors_name_the_flag(demo_cache: Path, tmp_path: Path):
    proc = _run(["generate", "--prompt", "a cat", "-o", str(tmp_path / "clip.avi")], demo_cache)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: --output: ") and "clip.avi" in proc.stderr, proc.stderr


def test_chat_says_why_a_reply_is_blank(cosmos3_dir: Path):
    """A stop string that is the reply's first character leaves nothing to print: the blank line gets a note."""
    generator = VideoGenerator.from_pretrained(cosmos3_dir, device="cpu")
    first = generator.chat([{"role": "user", "content": "hello"}], max_tokens=4, temperature=0).text
    assert first.strip(), "the tiny model's greedy reply is expected to have visible text"
    stop = first.strip()[0]
    proc = _run(["chat", "--model", str(cosmos3_dir), "--device", "cpu", "--temperature", "0", "--max-tokens", "4",
                 "--stop", stop], stdin="hello\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == first[:first.index(stop)].strip()
    assert "[empty reply: its " in proc.stderr and "decode to no visible text" in proc.stderr, proc.stderr
    visible = _run(["chat", "--model", str(cosmos3_dir), "--device", "cpu", "--temperature", "0", "--max-tokens", "4"],
                   stdin="hello\n")
    assert visible.returncode == 0 and visible.stdout == f"{first}\n"
    assert "empty reply" not in visible.stderr and "[reply cut at 4 tokens: --max-tokens]" in visible.stderr


def test_chat_on_the_demo_prints_its_noise_note(tmp_path: Path):
    proc = _run(["chat", "--model", "cosmos3-demo", "--device", "cpu", "--temperature", "0", "--max-tokens", "1"],
                tmp_path / "cache", stdin="hi\n")
    assert proc.returncode == 0, proc.stderr
    assert "note: cosmos3-demo has RANDOM weights" in proc.stderr  # its replies are noise by design
    assert "[reply cut at 1 token: --max-tokens]" in proc.stderr  # singular
