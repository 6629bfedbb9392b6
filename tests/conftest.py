import pytest
import torch

from sb3_npg import NPG, TRPO

# Tests run in parallel workers on a 2-core machine: one torch thread each avoids oversubscription.
torch.set_num_threads(1)

ALGOS = [NPG, TRPO]


@pytest.fixture(params=ALGOS, ids=lambda algo: algo.__name__)
def algo(request):
    return request.param
