from sb3_npg.common.clip import clip_grad_norm_

__all__ = ["clip_grad_norm_"]
