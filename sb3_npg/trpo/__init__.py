from sb3_npg.trpo.trpo import TRPO
from sb3_npg.trpo.policies import CnnPolicy, MlpPolicy, MultiInputPolicy

__all__ = ["TRPO", "CnnPolicy", "MlpPolicy", "MultiInputPolicy"]
