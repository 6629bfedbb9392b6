import math

import pytest
import torch

from sb3_npg.common import clip_grad_norm_
from sb3_npg.common.clip import CLIP_EPS, clip_grad_norm_on_device_


def _on_device(parameters_or_tensors, max_norm):
    return float(clip_grad_norm_on_device_(parameters_or_tensors, max_norm))


@pytest.fixture(params=[clip_grad_norm_, _on_device], ids=["host", "on_device"])
def clip(request):
    """The clip, and its variant that decides on the gradients' device: the same rule, so the same results."""
    return request.param


def _params_with_grads(*grads):
    params = []
    for grad in grads:
        param = torch.nn.Parameter(torch.zeros_like(grad))
        param.grad = grad.clone()
        params.append(param)
    return params


def test_below_cap_is_untouched_and_norm_returned(clip):
    params = _params_with_grads(torch.tensor([3.0]), torch.tensor([4.0]))
    norm = clip(params, max_norm=10.0)
    assert norm == pytest.approx(5.0)
    assert params[0].grad.item() == 3.0 and params[1].grad.item() == 4.0


def test_above_cap_scales_all_to_the_cap_keeping_direction(clip):
    params = _params_with_grads(torch.tensor([3.0, 0.0]), torch.tensor([[4.0]]))
    norm = clip(params, max_norm=1.0)
    assert norm == pytest.approx(5.0)
    joint = torch.cat([p.grad.flatten() for p in params])
    assert torch.linalg.vector_norm(joint).item() == pytest.approx(1.0 * 5.0 / (5.0 + CLIP_EPS))
    assert torch.allclose(joint / torch.linalg.vector_norm(joint), torch.tensor([0.6, 0.0, 0.8]))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_norm_leaves_gradients_untouched(bad, clip):
    params = _params_with_grads(torch.tensor([bad, 1.0]), torch.tensor([100.0]))
    norm = clip(params, max_norm=1.0)
    assert not math.isfinite(norm)
    assert params[0].grad[1].item() == 1.0 and params[1].grad.item() == 100.0


@pytest.mark.parametrize("max_norm", [0.0, -1.0, None])
def test_non_positive_or_missing_cap_disables_clipping(max_norm, clip):
    params = _params_with_grads(torch.tensor([30.0, 40.0]))
    assert clip(params, max_norm) == pytest.approx(50.0)
    assert torch.equal(params[0].grad, torch.tensor([30.0, 40.0]))


def test_parameters_without_gradient_count_zero_and_plain_tensors_are_clipped_in_place(clip):
    without = torch.nn.Parameter(torch.ones(3))
    grad = torch.tensor([6.0, 8.0])
    assert clip([without, grad], max_norm=5.0) == pytest.approx(10.0)
    assert without.grad is None
    # portable: a norm of two float32 terms and one scaling: a few ulps
    assert torch.linalg.vector_norm(grad).item() == pytest.approx(5.0, rel=1e-5)
    assert clip([without], max_norm=1.0) == 0.0
