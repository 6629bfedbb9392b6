"""K-FAC for ``nn.Conv2d`` (``sb3_npg/common/kfac_layers.py``): patches against the weight's order, the factors' sum
over locations, and exactness where a convolution is a linear layer."""

import torch
from torch import nn
from torch.distributions import Normal, kl_divergence

from sb3_npg.common.kfac import KroneckerFactors, expected_output_factors, kfac_fisher_product, update_factors
from sb3_npg.common.kfac_layers import expanded_inputs, factor_sizes, layer_parameters, output_factor, record_layers
from sb3_npg.common.natural_gradient import fisher_vector_product

DTYPE = torch.float64
CHANNELS, OUT, SIDE, KERNEL = 2, 3, 5, 3
LOG_STD = (-0.4, 0.2, 0.7)


def _conv(kernel: int | tuple[int, int], seed: int, **options) -> nn.Conv2d:
    torch.manual_seed(seed)
    return nn.Conv2d(CHANNELS, OUT, kernel, **options).to(DTYPE)


def _images(n: int, seed: int, side: int = SIDE) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return 0.3 + torch.randn(n, CHANNELS, side, side, generator=generator, dtype=DTYPE)


def test_the_weight_gradient_is_the_sum_over_locations_of_output_gradients_times_patches():
    """Pins the patches' order (F.unfold's, channel-major) to ``weight.view(out, -1)``'s, and the bias column."""
    conv = _conv(KERNEL, 0, stride=2, padding=1)
    images = _images(4, 1)
    output = conv(images)
    signal = torch.randn(output.shape, generator=torch.Generator().manual_seed(2), dtype=DTYPE)
    weight_grad, bias_grad = torch.autograd.grad((signal * output).sum(), [conv.weight, conv.bias])
    rows = expanded_inputs(conv, images)  # (n * T, C * k * k + 1)
    gradients = signal.permute(0, 2, 3, 1).reshape(-1, OUT)  # (n * T, out), the same (sample, location) order
    expected = torch.cat([weight_grad.view(OUT, -1), bias_grad.view(-1, 1)], dim=1)
    # portable: float64 (DTYPE): sums of products over a few hundred patches
    torch.testing.assert_close(gradients.T @ rows, expected, rtol=1e-12, atol=1e-12)
    assert factor_sizes(conv) == (CHANNELS * KERNEL * KERNEL + 1, OUT)


def test_the_output_factor_sums_over_locations_and_averages_over_samples():
    gradients = torch.randn(3, OUT, 4, 2, generator=torch.Generator().manual_seed(3), dtype=DTYPE)
    expected = (
        sum(torch.outer(gradients[n, :, h, w], gradients[n, :, h, w]) for n in range(3) for h in range(4) for w in range(2))
        / 3
    )
    # portable: float64 (DTYPE): sums of products over a few hundred patches
    torch.testing.assert_close(output_factor(gradients), expected, rtol=1e-12, atol=0.0)


def _gaussian_kfac_and_fisher(conv: nn.Conv2d, images: torch.Tensor):
    """K-FAC of a Gaussian policy whose mean is ``conv``'s outputs summed over locations, and its exact Fisher."""
    std = torch.tensor(LOG_STD, dtype=DTYPE).exp()
    with record_layers([conv]) as records:
        mean = conv(images).sum(dim=(2, 3))
    output = expected_output_factors([mean], [std.pow(-2).expand_as(mean)], [records[conv]])
    factors = [KroneckerFactors()]
    update_factors(factors, [conv], records, output, decay=0.0)
    kl = kl_divergence(Normal(mean.detach(), std), Normal(mean, std)).sum(-1).mean()
    return factors, fisher_vector_product(kl, layer_parameters([conv]), damping=0.0)


def _largest_relative_error(conv: nn.Conv2d, images: torch.Tensor) -> float:
    factors, exact = _gaussian_kfac_and_fisher(conv, images)
    size = sum(param.numel() for param in layer_parameters([conv]))
    vectors = torch.randn(5, size, generator=torch.Generator().manual_seed(4), dtype=DTYPE)
    return max(float((kfac_fisher_product(factors, [conv], v) - exact(v)).norm() / exact(v).norm()) for v in vectors)


def test_kfac_is_the_fisher_of_a_convolution_with_one_location_and_not_of_one_with_many():
    """A kernel as large as the image is a linear layer: its factors are exact; with several locations they are the
    paper's approximation (which assumes uncorrelated locations) and differ."""
    assert _largest_relative_error(_conv(SIDE, 5), _images(32, 6)) < 1e-12
    assert _largest_relative_error(_conv(KERNEL, 5), _images(32, 6)) > 0.05
