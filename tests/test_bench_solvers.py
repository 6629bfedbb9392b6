"""benchmarks/bench_solvers.py on a tiny configuration: the result's structure and what must hold of it."""

from __future__ import annotations

import math

from benchmarks import bench_solvers

TINY = {
    "env_id": "CartPole-v1",
    "n_envs": 1,
    "normalize": False,
    "hyperparams": {"n_steps": 64, "batch_size": 64, "n_critic_updates": 2, "policy_kwargs": {"net_arch": [8]}},
}
TOLERANCES = (1e-2, 1e-4)


def test_bench_solvers_core_reaches_the_residuals_it_reports(monkeypatch):
    monkeypatch.setattr(bench_solvers, "TOLERANCES", TOLERANCES)
    monkeypatch.setattr(bench_solvers, "MAX_STEPS", 200)
    result = bench_solvers.bench_config("tiny", TINY, reps=1, warm_up_updates=1)
    assert result["samples"] == 64
    assert list(result["policies"]) == ["initial", "after 1 updates"]
    for row in result["policies"].values():
        assert row["parameters"] > 0 and row["fisher_samples"] == 64
        solves = row["solves"]
        assert {(solve["solver"], solve["tolerance"]) for solve in solves} == {
            (solver, tol) for solver in ("cg", "kfac_preconditioned_cg") for tol in TOLERANCES
        }
        for solve in solves:
            assert solve["products"] > 0 and solve["median_ms"] > 0
            assert solve["converged"] and solve["residual"] <= solve["tolerance"]
            # The recursive residual is the true one up to float32 drift.
            assert solve["true_residual"] <= 10 * solve["tolerance"]
            assert -1.0 <= solve["cosine_to_cg"] <= 1.0 + 1e-9
            if solve["tolerance"] == min(TOLERANCES):  # both solvers near the solution: the same direction
                assert solve["cosine_to_cg"] > 0.99
        assert -1.0 <= row["kfac"]["cosine_to_cg"] <= 1.0 + 1e-9
        assert row["kfac"]["residual"] >= 0.0 and row["kfac_setup_ms"] > 0 and row["kfac_apply_ms"] > 0
        assert row["cg_own_settings"]["products"] > 0
        assert set(row["train"]) == set(bench_solvers.SOLVERS)
        assert row["train"]["cg"]["median_ratio"] == 1.0
        assert all(math.isfinite(timing["median_ms"]) for timing in row["train"].values())
    assert "| tiny | initial |" in bench_solvers.markdown_table([result])


def test_zoo_config_reads_our_shipped_entries():
    config = bench_solvers.zoo_config("HalfCheetah-v5")
    assert config["normalize"] and config["n_envs"] == 2
    assert config["hyperparams"]["policy_kwargs"]["net_arch"] == {"pi": [256, 256], "vf": [256, 256]}
    assert "n_timesteps" not in config["hyperparams"] and "policy" not in config["hyperparams"]
