"""The one global-norm gradient clip shared by every call site (critic updates of NPG and TRPO)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

#: Added to the norm in the scale ``max_norm / (norm + CLIP_EPS)`` so the result never divides by zero.
CLIP_EPS = 1e-6


def _gradients(parameters_or_tensors: torch.Tensor | Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The gradient tensors to clip: ``.grad`` of parameters (skipping those without one), plain tensors as they are."""
    if isinstance(parameters_or_tensors, torch.Tensor):
        parameters_or_tensors = [parameters_or_tensors]
    gradients = []
    for tensor in parameters_or_tensors:
        if isinstance(tensor, torch.nn.Parameter) or tensor.requires_grad:
            if tensor.grad is not None:
                gradients.append(tensor.grad)
        else:
            gradients.append(tensor)
    return gradients


def clip_grad_norm_(parameters_or_tensors: torch.Tensor | Iterable[torch.Tensor], max_norm: float | None) -> float:
    """
    Clip gradients by their joint (global) L2 norm, in place, and return that norm before clipping.

    The norm is ``sqrt(sum_p ||g_p||^2)`` over every gradient present; parameters without a gradient count zero.
    When it exceeds ``max_norm``, every gradient is multiplied by ``max_norm / (norm + 1e-6)``, which keeps the
    direction of the joint gradient. A non-finite norm, or a ``max_norm`` that is ``None`` or ``<= 0``, leaves
    the gradients untouched (unlike :func:`torch.nn.utils.clip_grad_norm_`, which would scale them by NaN).

    :param parameters_or_tensors: parameters (their ``.grad`` is clipped) or gradient tensors (clipped themselves)
    :param max_norm: the cap on the global norm; ``None`` or ``<= 0`` disables clipping
    :return: the global norm before clipping (``0.0`` when there is no gradient)
    """
    gradients = _gradients(parameters_or_tensors)
    if not gradients:
        return 0.0
    detached = [grad.detach() for grad in gradients]
    # The per-tensor norms in one multi-tensor kernel, then the norm of those: no copy of the gradients.
    total_norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(detached, 2.0)), 2.0))
    if max_norm is not None and max_norm > 0 and math.isfinite(total_norm) and total_norm > max_norm:
        torch._foreach_mul_(detached, max_norm / (total_norm + CLIP_EPS))
    return total_norm
