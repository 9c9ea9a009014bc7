"""What every subcommand shares for its results: a JSON file of every number and a Markdown file of
the tables, side by side (no torch)."""

from __future__ import annotations

import json
import os


def save_outputs(out_dir: str, stem: str, res: dict, lines: list) -> str:
    """``res`` as ``OUT_DIR/STEM.json`` and ``lines`` as ``OUT_DIR/STEM.md`` (the directory made if
    missing); returns the Markdown text."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        json.dump(res, f, indent=1)
    text = "\n".join(lines)
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write(text + "\n")
    return text
