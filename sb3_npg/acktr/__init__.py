from sb3_npg.acktr.acktr import ACKTR
from sb3_npg.acktr.policies import CnnPolicy, MlpPolicy, MultiInputPolicy
from sb3_npg.acktr.sb2 import sb2_acktr_kwargs

__all__ = ["ACKTR", "CnnPolicy", "MlpPolicy", "MultiInputPolicy", "sb2_acktr_kwargs"]
