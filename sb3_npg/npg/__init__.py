from sb3_npg.npg.npg import NPG
from sb3_npg.npg.policies import CnnPolicy, MlpPolicy, MultiInputPolicy

__all__ = ["NPG", "CnnPolicy", "MlpPolicy", "MultiInputPolicy"]
