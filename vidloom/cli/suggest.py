""""Did you mean" for a flag the parser does not know: close spellings of the command's own flags, and
the names people bring from diffusers' pipeline arguments."""

from __future__ import annotations

import difflib

# diffusers' keyword (as a flag) -> ours, for names too far apart for difflib.
ALIASES = {
    "--num-frames": "--frames",
    "--num-inference-steps": "--steps",
    "--guidance-scale": "--guidance",
    "--guidance-scale-2": "--guidance-2",
    "--audio-end-in-s": "--seconds",
    "--audio-start-in-s": "--seconds-start",
    "--max-new-tokens": "--max-tokens",
}


def suggest_flag(given: str, options: set[str]) -> str | None:
    """The flag of `options` the user most likely meant by `given` ("--num_frames=5" -> "--frames")."""
    if not given.startswith("--"):
        return None
    name = given.split("=", 1)[0].replace("_", "-").lower()
    if name in options:
        return name
    alias = ALIASES.get(name)
    if alias in options:
        return alias
    close = difflib.get_close_matches(name, sorted(o for o in options if o.startswith("--")), n=1, cutoff=0.75)
    return close[0] if close else None


def unrecognized(extras: list[str], options: set[str]) -> str:
    """argparse's "unrecognized arguments" line, with a hint for each flag it can place."""
    hints = [(given.split("=", 1)[0], hint) for given in extras if (hint := suggest_flag(given, options))]
    line = f"unrecognized arguments: {' '.join(extras)}"
    if len(hints) == 1:
        return f"{line} (did you mean {hints[0][1]}?)"
    named = ", ".join(f"{hint} for {given}" for given, hint in hints)
    return f"{line} (did you mean {named}?)" if hints else line
