"""The benchmark scripts whose numbers the README quotes: they run, agree on what they compare, and resume."""

import json

import pytest
import torch

from benchmarks import bench_fisher, bench_learn
from benchmarks.bench_update import CONFIGS, _build, _fill
from sb3_npg import TRPO


def test_bench_fisher_contenders_compute_the_same_product():
    config = {**CONFIGS["Pendulum-v1"], "hyperparams": {**CONFIGS["Pendulum-v1"]["hyperparams"], "n_steps": 64}}
    model = _build(TRPO, config, seed=0)
    _fill(model)
    observations = next(model.rollout_buffer.get(batch_size=None)).observations
    vector = torch.randn(sum(p.numel() for p in model._actor_params), generator=torch.Generator().manual_seed(0))
    products = {name: build(model, observations)(vector) for name, build in bench_fisher.CONTENDERS.items()}
    for name, product in products.items():
        assert torch.allclose(product, products["autograd"], rtol=1e-4, atol=1e-6), name


def test_bench_learn_table_and_resume(tmp_path, monkeypatch):
    monkeypatch.setitem(
        bench_learn.LEARNING_CONFIGS,
        "CartPole-v1",
        {**bench_learn.LEARNING_CONFIGS["CartPole-v1"], "budget": 512, "hyperparams": {"n_steps": 128, "batch_size": 64}},
    )
    out = tmp_path / "learn.jsonl"
    contenders = [bench_learn.REFERENCE, "sb3_npg.TRPO+fast"]
    results = bench_learn.run_all([0, 1], ["CartPole-v1"], contenders, out)
    assert len(results) == 4 and all(r["timesteps"] >= 512 for r in results)
    table = bench_learn.markdown_table(results)
    assert "| CartPole-v1 | sb3_npg.TRPO+fast |" in table and "| CartPole-v1 | sb3_contrib.TRPO |" in table
    calls = []
    monkeypatch.setattr(bench_learn, "run", lambda *args: calls.append(args) or pytest.fail("finished run repeated"))
    assert len(bench_learn.run_all([0, 1], ["CartPole-v1"], contenders, out)) == 4
    assert not calls
    assert "meta" in json.loads(out.read_text().splitlines()[0])
