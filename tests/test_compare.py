"""The comparison matrix (benchmarks.compare) and its report (benchmarks.report) on a tiny budget."""

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import compare, reliable, report

TINY_CONF = """CartPole-v1:
  n_envs: 1
  n_timesteps: 100000
  policy: MlpPolicy
  n_steps: 64
  policy_kwargs: "dict(net_arch=[16])"
"""
BUDGET = 256
EVAL_FREQ = 128
PNG_MAGIC = b"\x89PNG"
#: How long the screen-batch test waits for its four tiny runs (they take seconds).
SCREEN_BATCH_PATIENCE_S = 300


def _args(tmp_path, seeds):
    conf = tmp_path / "tiny.yml"
    conf.write_text(TINY_CONF, encoding="utf-8")
    matrix = ["--algos", "npg_trpo,trpo", "--envs", "CartPole-v1", "--seeds", seeds, "--timesteps", str(BUDGET)]
    evaluation = ["--eval-freq", str(EVAL_FREQ), "--eval-episodes", "2"]
    confs = ["--conf", f"npg_trpo={conf}", "--conf", f"trpo={conf}"]
    return compare.parser().parse_args([*matrix, *evaluation, "--workers", "2", "--out", str(tmp_path / "out"), *confs])


def _lines(path):
    return path.read_text(encoding="utf-8").splitlines()


def test_matrix_records_every_run_resumes_and_reports_a_table_and_a_plot(tmp_path):
    args = _args(tmp_path, "0,1")
    compare.run_matrix(compare.plan(args), args.out, args.workers)
    runs_file = args.out / compare.RUNS_FILE
    first = _lines(runs_file)
    runs = [json.loads(line) for line in first]
    assert sorted((r["algo"], r["seed"]) for r in runs) == [("npg_trpo", 0), ("npg_trpo", 1), ("trpo", 0), ("trpo", 1)]
    for run in runs:
        assert run["hyperparams"]["n_steps"] == 64  # the user's file reached the Zoo
        assert run["conf"] == "tiny.yml"  # no path of the machine that ran it
        assert run["steps"] >= BUDGET and run["timesteps"] == BUDGET
        assert [step for step, _, _ in run["curve"]] == [EVAL_FREQ, 2 * EVAL_FREQ]
        assert run["final_return"] == run["curve"][-1][1]
        assert run["time_train"] > 0 and run["time_collect_rollouts"] > 0 and run["time_evaluation"] > 0
        assert run["wall_time"] > run["time_train"] + run["time_collect_rollouts"]
        assert {"stable_baselines3", "torch", "sb3_contrib", "rl_zoo3"} <= {name.replace("-", "_") for name in run["versions"]}

    # Resume: a third seed runs only its two new cells; the finished lines stay as they were.
    args = _args(tmp_path, "0,1,2")
    compare.run_matrix(compare.plan(args), args.out, args.workers)
    lines = _lines(runs_file)
    assert lines[:4] == first and len(lines) == 6
    assert sorted(json.loads(line)["seed"] for line in lines[4:]) == [2, 2]

    markdown = report.write_report(args.out).read_text(encoding="utf-8")
    rows = [line for line in markdown.splitlines() if line.startswith("| CartPole-v1 | 256 |")]
    assert len(rows) == 1 and rows[0].count("(3)") == 2 and rows[0].count("**") == 2 and rows[0].endswith("| 500 |")
    assert (
        sum(
            line.startswith(("| CartPole-v1 | sb3-npg TRPO | 3 |", "| CartPole-v1 | sb3-contrib TRPO | 3 |"))
            for line in markdown.splitlines()
        )
        == 2
    )
    assert (args.out / "CartPole-v1.png").read_bytes()[:4] == PNG_MAGIC


def test_version_mismatches_name_each_result_package_the_folder_ran_with_another_version():
    records = [
        {"versions": {"stable_baselines3": "2.9.2", "mujoco": "4.0.0", "pip": "24.0"}},
        {"versions": {"stable-baselines3": "2.9.2", "mujoco": "4.0.0"}},
    ]
    installed = {"stable-baselines3": "2.9.2", "mujoco": "4.0.1", "pip": "25.0"}
    assert compare.version_mismatches(records, installed) == ["mujoco 4.0.0 -> 4.0.1"]  # pip cannot change a result
    assert compare.version_mismatches(records, {**installed, "mujoco": "4.0.0"}) == []
    mixed = [*records, {"versions": {"mujoco": "4.0.1"}}]
    assert compare.version_mismatches(mixed, installed) == ["mujoco 4.0.0, 4.0.1 -> 4.0.1"]
    assert compare.version_mismatches(records, {"stable_baselines3": "2.9.2"}) == ["mujoco 4.0.0 -> not installed"]


def test_resuming_a_folder_made_with_other_versions_warns_and_still_runs(tmp_path):
    args = _args(tmp_path, "0")
    finished, todo = compare.plan(args)
    args.out.mkdir()
    record = {**dataclasses.asdict(finished), "hyperparams": finished.hyperparams, "versions": {"torch": "0.0.1"}}
    (args.out / compare.RUNS_FILE).write_text(json.dumps(record) + "\n", encoding="utf-8")
    with pytest.warns(UserWarning, match=r"other package versions \(torch 0\.0\.1 -> "):
        runs = compare.run_matrix([finished, todo], args.out, workers=1)
    assert [run["algo"] for run in runs] == [finished.algo, todo.algo]  # only the new cell ran


def test_versions_table_marks_a_package_the_runs_mix():
    runs = [
        {"versions": {"torch": "2.13.0+cpu", "mujoco": "4.0.0", "pip": "24.0"}},
        {"versions": {"torch": "2.13.0+cpu", "mujoco": "4.0.1"}},
        {"versions": {"torch": "2.13.0+cpu", "mujoco": "4.0.0"}},
    ]
    lines = report.versions_table(runs).splitlines()
    assert "| torch | 2.13.0+cpu (3) |" in lines
    assert "| mujoco | **mixed**: 4.0.0 (2), 4.0.1 (1) |" in lines
    assert not any("pip" in line for line in lines)


def test_a_run_with_other_settings_or_another_evaluation_schedule_is_not_skipped(tmp_path):
    args = _args(tmp_path, "0")
    finished = {compare.run_key({**dataclasses.asdict(job), "hyperparams": job.hyperparams}) for job in compare.plan(args)}
    assert all(job.key in finished for job in compare.plan(args)), "the same runs are skipped"
    args.eval_freq = EVAL_FREQ // 2
    assert not any(job.key in finished for job in compare.plan(args)), "another evaluation schedule"
    args.eval_freq = EVAL_FREQ
    (tmp_path / "tiny.yml").write_text(TINY_CONF.replace("n_steps: 64", "n_steps: 32"), encoding="utf-8")
    assert not any(job.key in finished for job in compare.plan(args)), "the same file with other settings"


def _run(algo, seed, final, curve):
    return {
        "algo": algo,
        "env_id": "Pendulum-v1",
        "seed": seed,
        "timesteps": 1000,
        "final_return": final,
        "curve": curve,
        "wall_time": 2.0,
        "steps_per_second": 500.0,
        "time_collect_rollouts": 1.0,
        "time_train": 0.5,
        "time_evaluation": 0.5,
    }


def test_returns_table_bolds_the_best_mean_and_curves_keep_the_steps_every_seed_has():
    runs = [
        _run("ppo", 0, -200.0, [[500, -900.0, 0.0], [1000, -200.0, 0.0]]),
        _run("ppo", 1, -300.0, [[500, -700.0, 0.0], [1000, -300.0, 0.0]]),
        _run("npg", 0, -150.0, [[500, -400.0, 0.0], [1000, -150.0, 0.0]]),
        _run("npg", 1, -160.0, [[500, -600.0, 0.0], [1000, -160.0, 0.0], [1500, -100.0, 0.0]]),
    ]
    row = report.returns_table(runs).splitlines()[2]
    assert row == "| Pendulum-v1 | 1,000 | **-155.0 +- 7.1 (2)** | -250.0 +- 70.7 (2) | -175 |"  # npg before ppo
    steps, curves = report.common_curves([r for r in runs if r["algo"] == "npg"])
    assert steps.tolist() == [500, 1000]
    assert curves.tolist() == [[-400.0, -150.0], [-600.0, -160.0]]
    assert "| Pendulum-v1 | sb3-npg NPG | 2 | 2.0 | 500 | 1.0 | 0.5 | 0.5 | 33% |" in report.cost_table(runs)


def test_plan_refuses_an_environment_without_hyperparameters_before_any_run(tmp_path):
    conf = tmp_path / "cartpole_only.yml"
    conf.write_text(TINY_CONF, encoding="utf-8")
    args = compare.parser().parse_args(["--algos", "npg", "--envs", "Pendulum-v1", "--conf", f"npg={conf}"])
    with pytest.raises(ValueError, match="no hyperparameters for Pendulum-v1"):
        compare.plan(args)


def test_plan_uses_each_environments_zoo_budget_and_the_v4_entry_for_v5():
    args = compare.parser().parse_args(["--algos", "ppo", "--envs", "MountainCarContinuous-v0,Hopper-v5", "--seeds", "0"])
    jobs = compare.plan(args)
    assert [(job.env_id, job.timesteps, job.eval_freq) for job in jobs] == [
        ("MountainCarContinuous-v0", 50_000, 5_000),
        ("Hopper-v5", 1_000_000, 100_000),
    ]
    assert compare.hyperparams_entry(compare.Path(jobs[1].conf), "Hopper-v5")["normalize"] is True


def test_update_docs_refreshes_only_the_marked_tables(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    runs = [_run("npg", 0, -150.0, [[1000, -150.0, 1.0]]), _run("trpo", 0, -200.0, [[1000, -200.0, 1.0]])]
    (folder / compare.RUNS_FILE).write_text("".join(json.dumps(run) + "\n" for run in runs), encoding="utf-8")
    doc = tmp_path / "README.md"
    doc.write_text(
        "intro\n<!-- compare:RETURNS -->\nold table\n<!-- /compare:RETURNS -->\n"
        "<!-- compare:SEEDS -->\n<!-- /compare:SEEDS -->\noutro\n",
        encoding="utf-8",
    )
    untouched = tmp_path / "OTHER.md"
    untouched.write_text("no markers\n", encoding="utf-8")
    report.update_docs([doc, untouched], folder)
    text = doc.read_text(encoding="utf-8")
    assert "old table" not in text and text.startswith("intro\n<!-- compare:RETURNS -->\n| environment |")
    assert "| Pendulum-v1 | 1,000 | **-150.0 +- 0.0 (1)** | -200.0 +- 0.0 (1) |" in text and text.endswith("outro\n")
    assert "| Pendulum-v1 | sb3-contrib TRPO | 0: -200.0 | -200.0 |" in text  # the per-seed table, named for readers
    assert untouched.read_text(encoding="utf-8") == "no markers\n"


def test_iqm_table_gives_the_interquartile_mean_of_the_seeds_inside_its_bootstrap_interval():
    finals = [10.0, 20.0, 30.0, 40.0, 1000.0, -1000.0, 25.0, 35.0]  # IQM: the mean of the middle four
    runs = [_run("npg", seed, final, [[1000, final, 0.0]]) for seed, final in enumerate(finals)]
    cell = report.iqm_table(runs).splitlines()[2].split(" | ")[1].rstrip(" |")
    numbers = cell.split(" (")[0].replace("[", "").replace("]", "").replace(",", "")
    point, low, high = (float(value) for value in numbers.split())
    assert point == pytest.approx((20.0 + 25.0 + 30.0 + 35.0) / 4, abs=0.05)
    assert low < point < high and high - low < 2000, "an interval that ignores the outliers' trimming"
    assert cell.endswith("(8)")


def test_aggregate_normalizes_by_the_random_and_the_published_score_over_the_seeds_every_task_has():
    tasks = ("A-v0", "B-v0")
    runs = [
        {"algo": "npg", "env_id": "A-v0", "seed": 0, "final_return": 10.0},
        {"algo": "npg", "env_id": "A-v0", "seed": 1, "final_return": 20.0},
        {"algo": "npg", "env_id": "B-v0", "seed": 1, "final_return": 5.0},  # seed 0 missing on B: seed 1 only
        {"algo": "ppo", "env_id": "A-v0", "seed": 0, "final_return": 10.0},  # no run on B: not aggregated
    ]
    scores = reliable.group_scores(runs, tasks, {"A-v0": 0.0, "B-v0": -5.0}, {"A-v0": 40.0, "B-v0": 15.0})
    assert list(scores) == ["npg"]
    assert scores["npg"].tolist() == [[0.5, 0.5]]


def test_current_runs_keeps_each_cells_latest_protocol():
    old = {**_run("npg", 0, 1.0, []), "eval_freq": 100, "hyperparams": {"n_steps": 64}}
    new = [{**_run("npg", seed, 2.0, []), "eval_freq": 50, "hyperparams": {"n_steps": 64}} for seed in (0, 1)]
    other = {**_run("ppo", 0, 3.0, []), "eval_freq": 100, "hyperparams": {"n_steps": 8}}
    assert report.current_runs([old, *new, other]) == [*new, other]


def test_iqm_curve_is_rliables_iqm_at_each_evaluation_inside_its_band():
    from rliable import metrics

    curves = np.array([[0.0, 10.0, 50.0], [1.0, 12.0, 40.0], [2.0, 14.0, -900.0], [3.0, 16.0, 45.0], [4.0, 90.0, 48.0]])
    iqm, low, high = reliable.iqm_curve(curves)
    assert iqm == pytest.approx([metrics.aggregate_iqm(curves[:, [step]]) for step in range(3)])
    assert (low <= iqm).all() and (iqm <= high).all()


def test_report_command_refreshes_the_docs_and_copies_the_figures(tmp_path, capsys):
    folder, figures = tmp_path / "results", tmp_path / "static"
    folder.mkdir()
    figures.mkdir()
    runs = [_run("npg", seed, -150.0 - seed, [[500, -400.0, 0.0], [1000, -150.0 - seed, 0.0]]) for seed in (0, 1)]
    (folder / compare.RUNS_FILE).write_text("".join(json.dumps(run) + "\n" for run in runs), encoding="utf-8")
    doc = tmp_path / "README.md"
    doc.write_text("<!-- compare:IQM -->\n<!-- /compare:IQM -->\n", encoding="utf-8")
    report.main([str(folder), "--update-docs", str(doc), "--figures", str(figures)])
    assert "# Final return" in capsys.readouterr().out
    assert (figures / "Pendulum-v1.png").read_bytes() == (folder / "Pendulum-v1.png").read_bytes()
    assert "| Pendulum-v1 | -150.5 [" in doc.read_text(encoding="utf-8")


def test_screen_batch_runs_each_candidate_detached_and_copies_its_runs(tmp_path):
    """``benchmarks/screen_batch.sh`` starts one detached matrix per batch line with the budget and schedule given,
    each writes its exit status when it ends, and ``wait`` copies each ``runs.jsonl`` out under the folder's name."""
    repository = Path(__file__).parents[1]
    conf = tmp_path / "tiny.yml"
    conf.write_text(TINY_CONF, encoding="utf-8")
    folders = {"npg_trpo": tmp_path / "a", "npg": tmp_path / "b"}
    lines = ["# ALGO ENV CANDIDATE_FILE OUT_FOLDER", "  # an indented comment", ""]
    lines += [f"{algo} CartPole-v1 {conf} {folder}" for algo, folder in folders.items()]
    batch = tmp_path / "batch.txt"
    batch.write_text("\n".join(lines) + "\n", encoding="utf-8")
    copies = tmp_path / "copies"
    copies.mkdir()
    script = repository / "benchmarks" / "screen_batch.sh"
    env = os.environ | {"PYTHON": sys.executable, "EVAL_FREQ": str(EVAL_FREQ), "POLL_SECONDS": "1"}
    try:
        subprocess.run([script, "start", batch, "0,1", str(BUDGET)], cwd=repository, env=env, check=True)
        waited = subprocess.run(
            [script, "wait", batch, str(SCREEN_BATCH_PATIENCE_S), copies], cwd=repository, env=env, capture_output=True
        )
    finally:
        for folder in folders.values():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                os.killpg(int((folder / "screen_batch.pid").read_text()), signal.SIGKILL)
    assert waited.returncode == 0, waited.stdout.decode()
    assert "still running: \n" in waited.stdout.decode()
    for algo, folder in folders.items():
        assert (folder / "screen_batch.rc").read_text().strip() == "0"
        runs = [json.loads(line) for line in _lines(copies / f"{folder.name}.jsonl")]
        assert sorted(run["seed"] for run in runs) == [0, 1]
        assert {run["algo"] for run in runs} == {algo} and all(run["hyperparams"]["n_steps"] == 64 for run in runs)
        assert all(run["timesteps"] == BUDGET and run["eval_freq"] == EVAL_FREQ for run in runs)


def test_bootstrap_intervals_are_the_same_whatever_numpys_global_generator_did_before():
    """rliable resamples with NumPy's global generator: a report's two tables of the same runs must agree."""
    rng = np.random.default_rng(3)
    scores = {"npg": rng.normal(1.0, 0.3, size=(5, 4)), "trpo": rng.normal(0.9, 0.4, size=(10, 4))}
    first = reliable.iqm_intervals(scores)
    np.random.seed(12345)
    np.random.random(1000)
    assert reliable.iqm_intervals(scores) == first
    state = np.random.get_state()[1].copy()
    reliable.performance_profiles(scores)
    assert (np.random.get_state()[1] == state).all(), "the caller's global generator was left reseeded"


def test_group_curves_draw_each_task_of_a_group_with_runs_in_the_groups_order(tmp_path, monkeypatch):
    curve = [[500, 1.0, 0.0], [1000, 2.0, 0.0]]
    runs = [
        {**_run(algo, seed, 2.0, curve), "env_id": env_id}
        for env_id in ("Swimmer-v5", "HalfCheetah-v5", "Pendulum-v1", "Unlisted-v0")
        for algo in ("npg", "trpo")
        for seed in (0, 1)
    ]
    drawn = []
    draw = report._draw_env

    def record(axes, env_id, rows):
        drawn.append((env_id, len(rows)))
        draw(axes, env_id, rows)

    monkeypatch.setattr(report, "_draw_env", record)
    paths = report.plot_group_curves(runs, tmp_path)
    assert paths == [tmp_path / "curves_MuJoCo.png", tmp_path / "curves_classic_control.png"]
    assert all(path.read_bytes()[:4] == PNG_MAGIC for path in paths)
    # the group's order (HalfCheetah before Swimmer), only tasks with runs, each with all of its runs
    assert drawn == [("HalfCheetah-v5", 4), ("Swimmer-v5", 4), ("Pendulum-v1", 4)]
