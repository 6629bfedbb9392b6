"""Pieces the benchmark scripts share: their common command-line options and reading results back."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: The first line of a results file may describe the machine instead of holding a result.
META_KEY = "meta"


def configs_parser(description: str | None, configs: Iterable[str]) -> argparse.ArgumentParser:
    """The options of the per-configuration timing scripts: ``--configs``, ``--reps`` and ``--out``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(configs), help="comma-separated names of CONFIGS")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--out", type=Path)
    return parser


def read_jsonl(path: Path | None) -> list[dict[str, Any]]:
    """The results of a JSON-lines file (none when it does not exist), without its machine description."""
    if path is None or not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [row for row in rows if META_KEY not in row]
