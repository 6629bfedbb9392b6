"""The MuJoCo suite's tables and figure (benchmarks.suite): verdicts from intervals, published results statistic for
statistic, the default entry's own table, and contenders named as a reader names them."""

import json

import numpy as np
import pytest
import yaml

from benchmarks import reliable, report, suite
from sb3_npg.zoo import hyperparams_path

PNG_MAGIC = b"\x89PNG"
DEFAULT = yaml.safe_load(hyperparams_path("npg_trpo").read_text(encoding="utf-8"))["default"]


def _run(algo, env_id, seed, final, first=0.0, hyperparams=None):
    curve = [[500, first, 0.0], [1000, final, 0.0]]
    return {
        "algo": algo,
        "env_id": env_id,
        "seed": seed,
        "timesteps": 1000,
        "eval_freq": 500,
        "eval_episodes": 10,
        "final_return": final,
        "curve": curve,
        "hyperparams": hyperparams if hyperparams is not None else {},
        **dict.fromkeys(("wall_time", "steps_per_second", "time_collect_rollouts", "time_train", "time_evaluation"), 1.0),
    }


def _row(table, env_id):
    line = next(line for line in table.splitlines() if line.startswith(f"| {env_id} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


@pytest.mark.parametrize(
    ("ours", "theirs", "expected"),
    [
        ((5.0, 4.0, 6.0), (1.0, 0.0, 3.0), "ahead"),
        ((1.0, 0.0, 3.0), (5.0, 4.0, 6.0), "behind"),
        ((5.0, 2.0, 6.0), (4.0, 3.0, 7.0), "tied (at or above)"),
        ((4.0, 2.0, 6.0), (5.0, 3.0, 7.0), "tied (below)"),
        ((4.0, 3.0, 4.5), (4.0, 4.5, 7.0), "tied (at or above)"),  # touching intervals overlap
    ],
)
def test_verdict_says_ahead_only_where_the_intervals_are_apart(ours, theirs, expected):
    assert suite.verdict(reliable.Interval(*ours), reliable.Interval(*theirs)) == expected


def test_no_verdict_from_fewer_than_three_seeds_only_where_the_iqm_falls():
    apart = reliable.Interval(5.0, 5.0, 5.0), reliable.Interval(1.0, 1.0, 1.0)
    assert suite.verdict(*apart, seeds=2) == "at or above (fewer than 3 seeds: no verdict)"
    assert suite.verdict(*reversed(apart), seeds=1) == "below (fewer than 3 seeds: no verdict)"
    assert suite.verdict(*apart, seeds=3) == "ahead"


def test_suite_table_compares_intervals_counts_collapses_and_quotes_published_results_statistic_for_statistic(tmp_path):
    reference = tmp_path / "contrib.yml"
    reference.write_text("Hopper-v5:\n  n_steps: 1024\n  target_kl: 0.03\nAnt-v5:\n  n_steps: 1024\n", encoding="utf-8")
    tuned = {"n_steps": 1024, "target_kl": 0.03, "critic_fit": "lbfgs", "n_timesteps": 5}  # the budget: bookkeeping
    runs = [
        *(_run("npg_trpo", "Ant-v5", seed, final, 100.0, DEFAULT) for seed, final in enumerate((3000.0, 3100.0, 3200.0))),
        _run("npg_trpo", "Ant-v5", 3, 3300.0, 3400.0, DEFAULT),  # ends below its first evaluation: a collapse
        *(_run("trpo", "Ant-v5", seed, final) for seed, final in enumerate((500.0, 600.0, 700.0))),
        *(_run("npg_trpo", "Hopper-v5", seed, final, 10.0, tuned) for seed, final in enumerate((3000.0, 1000.0, 2000.0))),
        *(_run("trpo", "Hopper-v5", seed, final) for seed, final in enumerate((2500.0, 1500.0, 900.0))),
        _run("npg", "Hopper-v5", 0, 50.0),
    ]
    table = suite.suite_table(runs, reference)
    ant, hopper = _row(table, "Ant-v5"), _row(table, "Hopper-v5")
    assert ant[1].startswith("3150.0 [") and ant[1].endswith("(4)")  # the IQM of four: the middle two
    assert ant[3] == "ahead" and ant[4] == "3"
    assert ant[5] == (
        "RL Zoo 4982 (one run, v3): our mean 3150.0, below; "
        "Tianshou 2867 (max of the mean curve): ours 3150.0, above"  # the mean curve peaks at the last evaluation
    )
    assert ant[6] == "the default" and ant[7] == "-"
    assert hopper[3] == "tied (at or above)" and hopper[4] == "none"
    assert hopper[5] == "RL Zoo 3618 (one run, v3): our mean 2000.0, below"
    assert hopper[6] == "tuned: critic_fit"
    assert hopper[7] == "50.0 [50.0, 50.0] (1): below (fewer than 3 seeds: no verdict)"
    assert table.endswith(
        "sb3-npg TRPO's IQM is at or above sb3-contrib TRPO's on 2 of 2 tasks (ahead, the intervals apart, on 1; goal: "
        "every task of the suite). Seeds below their first evaluation: Ant-v5 3 (goal: none)."
    )
    assert "| Walker2d-v5 |" not in table, "a task without runs of both TRPOs has no row"


def test_the_mean_curve_peaks_where_the_seeds_mean_is_highest_not_at_each_seeds_own_peak():
    runs = [_run("npg_trpo", "Ant-v5", 0, 0.0, 100.0), _run("npg_trpo", "Ant-v5", 1, 100.0, 0.0)]
    assert suite.max_of_mean_curve(runs) == 50.0  # each seed peaks at 100, at different evaluations


def test_default_table_counts_the_new_tasks_where_the_default_reaches_sb3_contrib():
    runs = [
        *(_run("npg_trpo", "Reacher-v5", seed, -4.0 + seed / 10, hyperparams=DEFAULT) for seed in range(3)),
        *(_run("trpo", "Reacher-v5", seed, -5.0) for seed in range(3)),
        *(_run("npg_trpo", "Ant-v5", seed, 100.0, hyperparams=DEFAULT) for seed in range(3)),
        *(_run("npg_trpo", "Ant-v5", seed, 9000.0, hyperparams={**DEFAULT, "gamma": 0.98}) for seed in range(3)),
        *(_run("trpo", "Ant-v5", seed, 500.0) for seed in range(3)),
        *(_run("npg_trpo", "Hopper-v5", seed, 9000.0, hyperparams=DEFAULT) for seed in range(3)),  # not a new task
    ]
    table = suite.default_table(runs)
    assert _row(table, "Reacher-v5")[3] == "ahead"
    assert _row(table, "Ant-v5")[1].startswith("100.0 [100.0, 100.0] (3)")  # only the default's runs, not the tuned
    assert "| Hopper-v5 |" not in table
    assert table.endswith("The default's IQM is at or above sb3-contrib TRPO's on 1 of the 5 new tasks (goal: 4 of 5).")


def test_summary_table_names_contenders_for_readers_and_says_which_settings_ours_ran():
    runs = [
        _run("trpo", "Reacher-v5", 0, -5.0),
        _run("npg_trpo", "Reacher-v5", 0, -4.0, hyperparams=DEFAULT),
        _run("ppo", "CartPole-v1", 0, 500.0),
    ]
    lines = suite.summary_table(runs).splitlines()
    assert lines[0] == "| task | sb3-npg TRPO | sb3-contrib TRPO | SB3 PPO | sb3-npg TRPO settings |"
    assert lines[2] == "| Reacher-v5 | **-4.0** (1) | -5.0 (1) | - | default |"  # the suite before the others
    assert lines[3] == "| CartPole-v1 | - | - | **500.0** (1) | - |"


def test_an_interval_depends_on_its_own_scores_only():
    """The same cell in two tables (the IQM table, the suite's) must show one interval, whatever sits beside it."""
    draws = np.random.default_rng(1)
    mine, other = draws.normal(size=(10, 1)), draws.normal(size=(10, 1))  # few equal values: resampling shows
    alone = reliable.iqm_intervals({"a": mine})["a"]
    assert (
        reliable.iqm_intervals({"b": other, "a": mine})["a"] == alone == reliable.iqm_intervals({"a": mine, "b": other})["a"]
    )


def test_normalized_scores_put_the_random_policy_at_0_and_sb3_contribs_iqm_at_1(monkeypatch, tmp_path):
    monkeypatch.setattr(suite, "read_random_scores", lambda: {"Reacher-v5": -40.0, "Ant-v5": 0.0, "Hopper-v5": 0.0})
    runs = [
        *(_run("trpo", "Reacher-v5", seed, -4.0) for seed in range(3)),
        *(_run("npg_trpo", "Reacher-v5", seed, -22.0) for seed in range(3)),
        *(_run("trpo", "Ant-v5", seed, 1000.0) for seed in range(3)),
        *(_run("npg_trpo", "Ant-v5", seed, 2000.0) for seed in range(3)),
        *(_run("ppo", "Ant-v5", seed, 500.0) for seed in range(3)),  # no Reacher-v5 runs: not in "all tasks"
        _run("npg_trpo", "Hopper-v5", 0, 1.0),  # no sb3-contrib runs: not a task of the figure
    ]
    tasks, rows = suite.normalized_scores(runs)
    assert tasks == ["Ant-v5", "Reacher-v5"]
    assert rows["Reacher-v5"]["trpo"].point == pytest.approx(1.0)
    assert rows["Reacher-v5"]["npg_trpo"].point == pytest.approx(0.5)
    assert rows["Ant-v5"]["npg_trpo"].point == pytest.approx(2.0) and rows["Ant-v5"]["ppo"].point == pytest.approx(0.5)
    assert set(rows["all tasks"]) == {"npg_trpo", "trpo"}
    assert rows["all tasks"]["npg_trpo"].point == pytest.approx(1.25)
    path = suite.plot_normalized(runs, tmp_path / "normalized.png")
    assert path is not None and path.read_bytes()[:4] == PNG_MAGIC


def test_report_fills_every_marked_table_it_names(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    runs = [_run("trpo", "Reacher-v5", seed, -5.0) for seed in range(3)] + [
        _run("npg_trpo", "Reacher-v5", seed, -4.0, hyperparams=DEFAULT) for seed in range(3)
    ]
    (folder / "runs.jsonl").write_text("".join(f"{json.dumps(run)}\n" for run in runs), encoding="utf-8")
    doc = tmp_path / "README.md"
    doc.write_text("".join(f"<!-- compare:{name} -->\n<!-- /compare:{name} -->\n" for name in report.SECTIONS))
    report.update_docs([doc], folder)
    text = doc.read_text(encoding="utf-8")
    for name in report.SECTIONS:
        block = text.split(f"<!-- compare:{name} -->\n", 1)[1].split(f"<!-- /compare:{name} -->", 1)[0]
        assert block.startswith("| "), name
    assert "| Reacher-v5 | -4.0 [-4.0, -4.0] (3) | -5.0 [-5.0, -5.0] (3) | ahead |" in text


def test_task_cost_is_minutes_per_run_and_sb3_contribs_against_its_halfcheetah_run():
    runs = [
        {**_run("trpo", "HalfCheetah-v5", 0, 1.0), "wall_time": 600.0},
        {**_run("trpo", "Humanoid-v5", 0, 1.0), "wall_time": 1500.0},
        {**_run("trpo", "Humanoid-v5", 1, 1.0), "wall_time": 2100.0},
        {**_run("npg_trpo", "Humanoid-v5", 0, 1.0), "wall_time": 900.0},
    ]
    table = suite.task_cost_table(runs)
    assert _row(table, "HalfCheetah-v5") == ["HalfCheetah-v5", "-", "10.0 (1)", "1.0x"]
    assert _row(table, "Humanoid-v5") == ["Humanoid-v5", "15.0 (1)", "30.0 (2)", "3.0x"]
    assert "| Hopper-v5 |" not in table


def test_an_entry_built_on_the_default_is_told_by_what_it_changes_on_it(tmp_path):
    """An entry that changes one setting of the default is named by that change, not by its many differences from
    sb3-contrib's settings."""
    reference = tmp_path / "contrib.yml"
    reference.write_text("InvertedPendulum-v5:\n  n_steps: 1024\n", encoding="utf-8")
    built = {**DEFAULT, "normalize": "{'norm_obs': True, 'norm_reward': False}"}
    runs = [_run("npg_trpo", "InvertedPendulum-v5", seed, 1000.0, 0.0, built) for seed in range(3)]
    runs += [_run("trpo", "InvertedPendulum-v5", seed, 1000.0) for seed in range(3)]
    assert _row(suite.suite_table(runs, reference), "InvertedPendulum-v5")[6] == "the default with: normalize"
