"""Natural policy gradient (NPG) and TRPO for Stable-Baselines3."""

from pathlib import Path

from sb3_npg.common.base import FAST_SETTINGS
from sb3_npg.npg import NPG
from sb3_npg.trpo import TRPO

__version__ = (Path(__file__).parent / "version.txt").read_text(encoding="utf-8").strip()

__all__ = ["FAST_SETTINGS", "NPG", "TRPO", "__version__"]
