from sb3_npg.common.checks import NonFiniteParametersError
from sb3_npg.common.clip import clip_grad_norm_, grad_norm
from sb3_npg.common.distributed import DistributedError

__all__ = ["DistributedError", "NonFiniteParametersError", "clip_grad_norm_", "grad_norm"]
