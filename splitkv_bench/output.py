"""What every subcommand shares for its results: a JSON file of every number and a Markdown file of
the tables, side by side (no torch)."""

from __future__ import annotations

import json
import os


def save_outputs(out_dir: str, stem: str, res: dict, lines: list | str, *, default=None) -> str:
    """``res`` as ``OUT_DIR/STEM.json`` (``default``: ``json.dump``'s, for values JSON has no type for)
    and ``lines`` (a list of lines, or the text) as ``OUT_DIR/STEM.md``, ending in one newline; the
    directory made if missing. Returns the Markdown text without its last newline."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        json.dump(res, f, indent=1, default=default)
    text = (lines if isinstance(lines, str) else "\n".join(lines)).rstrip("\n")
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write(text + "\n")
    return text
