"""Natural policy gradient (NPG) and TRPO for Stable-Baselines3."""

from sb3_npg.common.persistence import PACKAGE_VERSION

from sb3_npg.common.base import FAST_SETTINGS
from sb3_npg.npg import NPG
from sb3_npg.trpo import TRPO

__version__ = PACKAGE_VERSION

__all__ = ["FAST_SETTINGS", "NPG", "TRPO", "__version__"]
