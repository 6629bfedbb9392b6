"""The package's version, read from ``version.txt`` (which the packaging metadata reads too)."""

from pathlib import Path

__version__ = (Path(__file__).parent / "version.txt").read_text(encoding="utf-8").strip()
