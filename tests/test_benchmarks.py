"""The benchmark scripts whose numbers the README quotes: they run, agree on what they compare, and resume."""

import ast
import itertools
import json
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import sb3_contrib
import torch
import yaml
from gymnasium import spaces

from benchmarks import bench_fisher, bench_learn
from benchmarks.common import (
    REPOSITORY,
    UPDATE_CONFIGS,
    build_model,
    contrib_kl_scale,
    default_hyperparams,
    fill_rollout,
    hyperparams_entry,
    portable_path,
    read_jsonl,
)
from benchmarks.lockstep import lockstep, table
from benchmarks.zoo_verify import PUBLISHED_TRPO
from sb3_npg import TRPO
from sb3_npg.common.natural_gradient import get_flat_params
from sb3_npg.zoo import hyperparams_path


def test_bench_fisher_contenders_compute_the_same_product():
    config = {**UPDATE_CONFIGS["Pendulum-v1"], "hyperparams": {**UPDATE_CONFIGS["Pendulum-v1"]["hyperparams"], "n_steps": 64}}
    model = build_model(TRPO, config, seed=0)
    fill_rollout(model)
    observations = next(model.rollout_buffer.get(batch_size=None)).observations
    vector = torch.randn(sum(p.numel() for p in model.actor_parameters), generator=torch.Generator().manual_seed(0))
    products = {name: build(model, observations)(vector) for name, build in bench_fisher.CONTENDERS.items()}
    scale = float(products["autograd"].abs().max())  # float32 products of 64 samples: compared to sqrt(eps) of their scale
    for name, product in products.items():
        assert torch.allclose(product, products["autograd"], rtol=1e-4, atol=1e-4 * scale), name
    every_fifth = bench_fisher.CONTENDERS["analytic"](model, observations[::5])(vector)
    sliced = bench_fisher.analytic_sliced(model, model.policy.get_distribution(observations), 5)(vector)
    assert torch.allclose(sliced, every_fifth, rtol=1e-4, atol=1e-4 * float(every_fifth.abs().max()))


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


class _ReachEnv(gym.Env):
    """A 3-dimensional Box action: reward for matching the first three observations."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), dtype=np.float32)
    action_space = spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)
    EPISODE_LENGTH = 50

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        self.observation = self.observation_space.sample()
        return self.observation, {}

    def step(self, action):
        reward = -float(np.sum((action - self.observation[:3]) ** 2))
        self.steps += 1
        self.observation = self.observation_space.sample()
        return self.observation, reward, False, self.steps >= self.EPISODE_LENGTH, {}


def test_contrib_kl_scale_reproduces_sb3_contrib_step_on_a_multi_dimensional_box():
    """The README's translation: multiply target_kl and cg_damping by d, and our step equals sb3-contrib's."""
    assert contrib_kl_scale({"cg_damping": 0.2}, 2) == {"cg_damping": 0.4, "target_kl": 0.02}
    hyperparams = {"n_steps": 256, "n_critic_updates": 0, "cg_max_steps": 50, "policy_kwargs": {"net_arch": [16]}}
    config = {"env_id": _ReachEnv, "n_envs": 1, "normalize": False, "hyperparams": hyperparams}
    contrib = build_model(sb3_contrib.TRPO, config, seed=0)
    fill_rollout(contrib)
    ours = build_model(TRPO, {**config, "hyperparams": contrib_kl_scale(hyperparams, action_dims=3)}, seed=0)
    ours.rollout_buffer = contrib.rollout_buffer
    ours.policy.load_state_dict(contrib.policy.state_dict())
    start = get_flat_params(ours.actor_parameters)
    contrib.train()
    ours.train()
    contrib_actor = [param for name, param in contrib.policy.named_parameters() if "value" not in name]
    ours_step, contrib_step = get_flat_params(ours.actor_parameters) - start, get_flat_params(contrib_actor) - start
    assert ours.logger.name_to_value["train/step_fraction"] == 1.0
    assert torch.linalg.vector_norm(ours_step - contrib_step) < 1e-3 * torch.linalg.vector_norm(contrib_step)


def test_zoo_verify_reads_budgets_from_the_shipped_file_and_from_a_one_entry_candidate(tmp_path):
    from benchmarks.zoo_verify import budget

    assert budget("npg", "LunarLander-v3") == 200_000
    assert budget("npg_trpo", "NoSuchEnv-v0") == 1_000_000  # the file's default entry
    candidate = tmp_path / "candidate.yml"
    candidate.write_text("Acrobot-v1:\n  n_timesteps: 5000\n", encoding="utf-8")
    assert budget("npg", "Acrobot-v1", candidate) == 5000
    assert budget("trpo", "MountainCarContinuous-v0") == 50_000  # sb3-contrib's TRPO: the RL Zoo's own trpo.yml


def test_zoo_verify_tables_mark_the_entries_that_reach_the_published_result(tmp_path):
    from benchmarks.zoo_verify import candidates_table, markdown_table

    rows = [
        {"algo": "npg", "env_id": "CartPole-v1", "seed": seed, "budget": 100_000, "final_return_mean": value}
        for seed, value in enumerate([500.0, 500.0, 499.0])
    ] + [{"algo": "npg_trpo", "env_id": "CartPole-v1", "seed": 0, "budget": 100_000, "final_return_mean": 500.0}]
    table = markdown_table(rows).splitlines()
    assert table[2] == "| npg | CartPole-v1 | 100,000 | 4 | 500.0 / 500.0 / 499.0 | 499.7 | 500 | no |"
    assert table[3] == "| npg_trpo | CartPole-v1 | 100,000 | 4 | 500.0 | 500.0 | 500 | yes |"
    header = "# A candidate tried for npg on CartPole-v1: half the KL radius\n"
    (tmp_path / "smaller_kl.yml").write_text(header, encoding="utf-8")
    results = tmp_path / "smaller_kl.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in rows[:3]), encoding="utf-8")
    candidates = candidates_table([results], candidates_dir=tmp_path).splitlines()
    expected = "| `smaller_kl` | half the KL radius | npg | CartPole-v1 | 500.0 / 500.0 / 499.0 | 499.7 | 500 | no |"
    assert candidates[2] == expected


def test_zoo_verify_reruns_a_legacy_record_on_the_shared_schedule_and_tables_the_rerun():
    """Records without ``eval_freq`` were evaluated 4 times per run: ``make bench-zoo`` runs them again on the schedule
    of the comparison matrix (so one run has one final return in both tables), and the table shows the newer run."""
    from benchmarks.compare import DEFAULT_EVALUATIONS
    from benchmarks.zoo_verify import EVALUATIONS, latest_runs, markdown_table

    assert EVALUATIONS == DEFAULT_EVALUATIONS
    legacy = {"algo": "npg", "env_id": "Pendulum-v1", "seed": 0, "budget": 100_000, "final_return_mean": -119.4}
    rerun = legacy | {"eval_freq": 100_000 // EVALUATIONS, "final_return_mean": -217.9}
    assert latest_runs([legacy, rerun]) == [rerun]
    assert markdown_table([legacy, rerun]).splitlines()[2].startswith("| npg | Pendulum-v1 | 100,000 | 10 | -217.9 |")


@pytest.mark.parametrize("algo", ["npg", "npg_trpo"])
def test_shipped_zoo_comments_state_the_verified_runs_and_every_required_entry_reaches_the_reference(algo):
    """The comment above each verified entry quotes zoo_verify.jsonl (seeds 0, 1, 2), and the five environments the
    RL Zoo issue requires are verified at or above the published sb3-contrib TRPO result."""
    from benchmarks.zoo_verify import latest_runs

    runs = latest_runs(read_jsonl(Path(__file__).parents[1] / "benchmarks" / "results" / "zoo_verify.jsonl"))
    lines = hyperparams_path(algo).read_text(encoding="utf-8").splitlines()
    verified = {}
    for comment, entry in itertools.pairwise(lines):
        match = re.match(r"# (?:tuned \(.*\) and )?verified\. .*seeds 0/1/2: ([-\d. /]+), mean", comment)
        if match:
            verified[entry.rstrip(":")] = [float(value) for value in match.group(1).split(" / ")]
    for env_id, quoted in verified.items():
        seeds = sorted((r for r in runs if r["algo"] == algo and r["env_id"] == env_id), key=lambda r: r["seed"])[:3]
        assert [round(r["final_return_mean"], 1) for r in seeds] == quoted, env_id
    for env_id in ("CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCarContinuous-v0", "LunarLander-v3"):
        assert env_id in verified
        assert np.mean(verified[env_id]) >= PUBLISHED_TRPO[env_id], env_id


#: A MuJoCo entry chosen by screening: its changes, the seeds, each seed's final return, the folder of those runs.
SCREENED_COMMENT = re.compile(
    r"# screened(?: with npg_trpo)? \((?P<changes>.*)\) at (?:1M|100k) steps, seeds (?P<seeds>[\d/]+): "
    r"(?P<finals>[-\d. /]+), mean (?P<mean>[-\d.]+) "
    r"\(.*; (?P<folder>benchmarks/results/compare_candidates/[\w.-]+)\)"
)


@pytest.mark.parametrize("algo", ["npg", "npg_trpo", "acktr"])
def test_screened_zoo_entries_quote_the_runs_of_exactly_their_settings(algo):
    """The comment above each screened MuJoCo entry quotes the final returns of runs whose recorded settings are the
    entry's own, on the screening seeds (never the reported 0-9)."""
    root = Path(__file__).parents[1]
    path = hyperparams_path(algo)
    lines = path.read_text(encoding="utf-8").splitlines()
    screened = 0
    for comment, entry in itertools.pairwise(lines):
        if not comment.startswith("# screened"):
            continue
        match = SCREENED_COMMENT.match(comment)
        assert match, f"a screened entry's comment the test cannot read: {comment[:80]}"
        env_id, screened = entry.rstrip(":"), screened + 1
        seeds = [int(seed) for seed in match["seeds"].split("/")]
        assert min(seeds) >= 100, "screening seeds are never the reported 0-9"
        settings = hyperparams_entry(path, env_id)
        runs = {
            run["seed"]: run
            for run in read_jsonl(root / match["folder"] / "runs.jsonl")
            if run["env_id"] == env_id and run["hyperparams"] == settings
        }
        quoted = [float(value) for value in match["finals"].split(" / ")]
        assert [round(runs[seed]["final_return"], 1) for seed in seeds] == quoted, env_id
        mean = np.mean([runs[seed]["final_return"] for seed in seeds])
        assert float(match["mean"]) == round(mean, 1), f"{env_id}: the mean of the quoted runs"
    assert screened >= 2, "the MuJoCo entries chosen by screening"


def test_step_kl_reads_one_kl_per_update_and_trpo_never_exceeds_its_target():
    from benchmarks.step_kl import N_ENVS, ZOO_CARTPOLE, step_kls

    updates = 4
    kls = step_kls(TRPO, seed=0, timesteps=updates * N_ENVS * ZOO_CARTPOLE["n_steps"])
    assert 0 < len(kls) <= updates
    assert (kls <= TRPO("MlpPolicy", "CartPole-v1").target_kl).all()


def test_lockstep_our_trpo_update_follows_sb3_contribs_over_consecutive_updates():
    """Pendulum's entries are the same in both files: on the same states and rollouts the actor steps agree (up to
    float32 rounding and the KL direction), the line searches take the same fractions, and the table has a row each."""
    records = lockstep("Pendulum-v1", seed=0, updates=3)
    assert len(records) == 3
    assert all(record["step_difference"] < 1e-3 for record in records)
    assert all(record["same_fraction"] == 1.0 for record in records)
    assert all(record["ours_std"] == pytest.approx(record["theirs_std"], rel=1e-4) for record in records)
    assert table(records, block=2).count("\n| ") == 2


def test_bench_distributed_estimate_adds_ring_all_reduce_costs_to_the_measured_compute():
    from benchmarks.bench_distributed import estimate

    row = {
        "processes": 2,
        "samples_per_update": 1024,
        "collect_seconds_per_update": 1.0,
        "train_seconds_per_update": 0.5,
        "collective_seconds_per_update": 0.1,
        "collectives_per_update": 10,
        "payload_bytes_per_update": 1_000_000,
    }
    guess = estimate(row, machines=8, latency=1e-4, bandwidth=1e9)
    communication = 10 * 14 * 1e-4 + 14 / 8 * 1e-3
    assert guess["communication"] == pytest.approx(communication)
    assert guess["seconds"] == pytest.approx(1.4 + communication)
    assert guess["samples_per_second"] == pytest.approx(8 * 512 / (1.4 + communication))


def test_results_record_hyperparameter_files_without_machine_paths(tmp_path):
    assert portable_path(default_hyperparams("npg")) == "sb3_npg/zoo/hyperparams/npg.yml"
    assert portable_path(REPOSITORY / "benchmarks" / "zoo_candidates" / "x.yml") == "benchmarks/zoo_candidates/x.yml"
    assert portable_path(default_hyperparams("trpo")) == "rl_zoo3/hyperparams/trpo.yml"  # an installed package's file
    assert portable_path(tmp_path / "mine.yml") == "mine.yml"
    runs = read_jsonl(Path(__file__).parent.parent / "benchmarks" / "results" / "compare" / "runs.jsonl")
    assert runs and all(not Path(run["conf"]).is_absolute() for run in runs)


def test_collect_phases_times_every_phase_of_our_loop_and_leaves_sb3s_loop_untouched():
    from benchmarks import collect_phases
    from sb3_npg.common import rollouts

    sampler = rollouts.action_sampler
    config = {"env_id": "CartPole-v1", "n_envs": 1, "normalize": False, "n_steps": 32}
    row = collect_phases.bench_config("CartPole-v1", config, reps=1)
    assert rollouts.action_sampler is sampler, "the sampler's timing wrapper was left installed"
    timed = {phase: row["us_per_step"][phase] for phase in collect_phases.PHASES if phase != "rest of the loop"}
    assert all(value > 0 for value in timed.values()), timed  # each wrapper saw its phase
    assert sum(timed.values()) < row["us_per_step"]["ours"]
    assert 0 < row["ours_without_sampling_over_sb3"] < row["ours_over_sb3"]
    table = collect_phases.markdown_table([row]).splitlines()
    assert len(table[0].split(" | ")) == len(table[2].split(" | ")), "a header per column"
    assert table[2].endswith(f"| {row['ours_over_sb3']:.2f} | {row['ours_without_sampling_over_sb3']:.2f} |")


def test_screen_pairs_candidates_by_seed_and_averages_only_the_seeds_every_candidate_finished(tmp_path):
    from benchmarks import screen

    def write(name, runs):
        (tmp_path / name).mkdir()
        lines = [json.dumps({"env_id": env_id, "seed": seed, "final_return": final, "curve": [[1, best, 0.0]]})
                 for env_id, seed, final, best in runs]  # fmt: skip
        (tmp_path / name / "runs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")

    write("shipped", [("Hopper-v5", 100, 1000.0, 3000.0), ("Hopper-v5", 101, 2000.0, 2500.0), ("Walker2d-v5", 100, 9.0, 9.0)])
    write("fast", [("Hopper-v5", 100, 3000.0, 3500.0)])  # seed 101 not finished
    table = screen.results([tmp_path / "shipped", tmp_path / "fast"])
    assert "| Hopper-v5 | 101 | 2000.0 (2500.0) | - |" in screen.seeds_table(table)
    assert screen.shared_means_table(table).splitlines()[2] == "| Hopper-v5 | 100 | 1000.0 | 3000.0 |"
    assert screen.own_means_table(table).splitlines()[2:] == [
        "| Hopper-v5 | 1500.0 (2) | 3000.0 (1) |",
        "| Walker2d-v5 | 9.0 (1) | - |",
    ]
    # Only the seeds asked for: the comparison as it stood before seed 101 was added.
    only_100 = screen.results([tmp_path / "shipped", tmp_path / "fast"], seeds={100})
    assert screen.own_means_table(only_100).splitlines()[2] == "| Hopper-v5 | 1000.0 (1) | 3000.0 (1) |"


#: The tag of YAML's ``<<`` merge key, which shipped files use to share one set of defaults between entries.
MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice in one mapping, where PyYAML keeps the last silently."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        keys = [self.construct_object(key, deep=True) for key, _ in node.value if key.tag != MERGE_TAG]
        repeated = sorted({str(key) for key in keys if keys.count(key) > 1})
        if repeated:
            raise yaml.constructor.ConstructorError(None, None, f"keys given twice: {repeated}", node.start_mark)
        return super().construct_mapping(node, deep=deep)


ZOO_FILES = sorted((REPOSITORY / "benchmarks" / "zoo_candidates").glob("*.yml")) + sorted(
    hyperparams_path("npg").parent.glob("*.yml")
)


@pytest.mark.parametrize("path", ZOO_FILES, ids=lambda path: path.name)
def test_every_zoo_file_gives_each_environment_once_and_as_a_mapping_of_settings(path):
    """A line pasted into a candidate's header (a second ``HalfCheetah-v5:`` once) still loads, since PyYAML keeps the
    last of two equal keys: the file would then say one thing and run another, unnoticed."""
    entries = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    assert entries
    assert all(isinstance(settings, dict) for settings in entries.values())


FULL_STEP_TASKS = ("Acrobot-v1", "LunarLanderContinuous-v3", "Walker2d-v5")


@pytest.mark.parametrize("env_id", FULL_STEP_TASKS)
def test_matrix_npg_and_trpo_draw_the_same_curve_where_docs_say_every_full_step_was_accepted(env_id):
    """docs/guide/algorithms.md and benchmarks/README.md name these tasks: with equal settings, NPG's full steps are
    TRPO's accepted steps, so the matrix's current runs of both must agree evaluation for evaluation on every shared
    seed."""
    from benchmarks.report import current_runs

    runs = current_runs(read_jsonl(REPOSITORY / "benchmarks" / "results" / "compare" / "runs.jsonl"))
    by_seed = {
        algo: {run["seed"]: run for run in runs if run["algo"] == algo and run["env_id"] == env_id}
        for algo in ("npg", "npg_trpo")
    }
    shared = sorted(by_seed["npg"].keys() & by_seed["npg_trpo"].keys())
    assert shared, f"{env_id}: no seed run by both"
    for seed in shared:
        npg, trpo = by_seed["npg"][seed], by_seed["npg_trpo"][seed]
        assert npg["hyperparams"] == trpo["hyperparams"], f"{env_id} seed {seed}: settings differ"
        assert npg["curve"] == trpo["curve"], f"{env_id} seed {seed}"
    assert env_id in (REPOSITORY / "docs" / "guide" / "algorithms.md").read_text(encoding="utf-8")


#: The protocol's reported seeds per algorithm of ours (benchmarks/README.md, ``make bench-mujoco``).
REPORTED_MUJOCO_SEEDS = {"npg_trpo": list(range(10)), "npg": list(range(5))}


@pytest.mark.parametrize("algo", sorted(REPORTED_MUJOCO_SEEDS))
def test_matrix_mujoco_rows_are_runs_of_the_shipped_entries_on_every_reported_seed(algo):
    """The README's goals table reports "our shipped settings": each MuJoCo cell's current runs must have run exactly
    the shipped file's entry on the protocol's seeds, so an entry changed without its rerun, or a partial rerun, fails."""
    from benchmarks.reliable import TASK_GROUPS
    from benchmarks.report import current_runs

    runs = current_runs(read_jsonl(REPOSITORY / "benchmarks" / "results" / "compare" / "runs.jsonl"))
    for env_id in TASK_GROUPS["MuJoCo"]:
        cell = [run for run in runs if run["algo"] == algo and run["env_id"] == env_id]
        assert sorted(run["seed"] for run in cell) == REPORTED_MUJOCO_SEEDS[algo], env_id
        shipped = hyperparams_entry(hyperparams_path(algo), env_id)
        assert [run["hyperparams"] for run in cell] == [shipped] * len(cell), f"{env_id}: not the shipped entry"


@pytest.mark.parametrize("algo", sorted(REPORTED_MUJOCO_SEEDS))
def test_matrix_rows_of_the_new_mujoco_tasks_are_runs_of_the_shipped_entries(algo):
    """Every current run of ours on a new task must have run the shipped entry (the default, or a task's own entry once
    it has one): a changed entry needs its reruns. Its seeds: ``test_the_new_mujoco_tasks_hold_the_suites_seeds``."""
    from benchmarks.report import current_runs

    runs = current_runs(read_jsonl(REPOSITORY / "benchmarks" / "results" / "compare" / "runs.jsonl"))
    for env_id in NEW_MUJOCO_TASKS:
        shipped = hyperparams_entry(hyperparams_path(algo), env_id)
        cell = [run["hyperparams"] for run in runs if run["algo"] == algo and run["env_id"] == env_id]
        assert cell == [shipped] * len(cell), f"{env_id}: not the shipped entry"


def test_a_mujoco_task_a_zoo_file_does_not_list_gets_its_mujoco_defaults(tmp_path):
    """What the RL Zoo means for such a task (sb3-contrib's TRPO on Reacher-v5, say); other tasks still need an entry."""
    conf = tmp_path / "algo.yml"
    conf.write_text(
        "default: &base\n  policy: MlpPolicy\nAnt-v4: &mujoco-defaults\n  <<: *base\n  normalize: true\n"
        "Swimmer-v4:\n  <<: *mujoco-defaults\n  gamma: 0.9999\n",
        encoding="utf-8",
    )
    mujoco_defaults = {"policy": "MlpPolicy", "normalize": True}
    assert hyperparams_entry(conf, "Reacher-v5") == mujoco_defaults
    assert hyperparams_entry(conf, "InvertedDoublePendulum-v5") == mujoco_defaults
    assert hyperparams_entry(conf, "Swimmer-v5")["gamma"] == 0.9999  # a listed task keeps its own entry
    with pytest.raises(ValueError, match="no hyperparameters for CartPole-v1"):
        hyperparams_entry(conf, "CartPole-v1")
    conf.write_text("Ant-v4:\n  policy: MlpPolicy\n", encoding="utf-8")  # no anchor and no default: no fallback
    with pytest.raises(ValueError, match="no hyperparameters for Reacher-v5"):
        hyperparams_entry(conf, "Reacher-v5")
    conf.write_text("default:\n  normalize: true\nAnt-v4:\n  policy: MlpPolicy\n", encoding="utf-8")  # ours: the default
    assert hyperparams_entry(conf, "Reacher-v5") == {"normalize": True}
    with pytest.raises(ValueError, match="no hyperparameters for CartPole-v1"):
        hyperparams_entry(conf, "CartPole-v1")


#: The suite's seeds per contender on the new tasks (benchmarks/README.md, ``make bench-mujoco``); a contender joins
#: once all its seeds have landed (runs land over sessions).
NEW_TASK_SEEDS = {"npg_trpo": list(range(5)), "trpo": list(range(5)), "npg": list(range(3)), "ppo": list(range(3))}

#: The new tasks where both TRPOs' intervals overlapped at 5 seeds and each took seeds up to 10 (the protocol's rule).
TEN_SEED_TASKS = {"InvertedDoublePendulum-v5", "Reacher-v5"}


def protocol_seeds(algo: str, env_id: str) -> list[int]:
    """The seeds the protocol gives a contender on a new task."""
    if algo in ("npg_trpo", "trpo") and env_id in TEN_SEED_TASKS:
        return list(range(10))
    return NEW_TASK_SEEDS[algo]


#: The seeds of the default's own column on the new tasks.
DEFAULT_COLUMN_SEEDS = list(range(3))


@pytest.mark.parametrize("algo", sorted(NEW_TASK_SEEDS))
def test_the_new_mujoco_tasks_hold_the_suites_seeds(algo):
    """Every new task's current runs of a contender are exactly the protocol's seeds, so a lost or an extra run fails."""
    from benchmarks.report import current_runs

    runs = current_runs(read_jsonl(REPOSITORY / "benchmarks" / "results" / "compare" / "runs.jsonl"))
    for env_id in NEW_MUJOCO_TASKS:
        seeds = sorted(run["seed"] for run in runs if run["algo"] == algo and run["env_id"] == env_id)
        assert seeds == protocol_seeds(algo, env_id), env_id


def test_the_defaults_column_holds_its_seeds_on_every_new_task():
    """The report's column of the default alone (3 seeds) is complete, also where a task has since taken an entry."""
    from benchmarks.suite import default_runs

    runs = default_runs(read_jsonl(REPOSITORY / "benchmarks" / "results" / "compare" / "runs.jsonl"))
    for env_id in NEW_MUJOCO_TASKS:
        seeds = {run["seed"] for run in runs if run["env_id"] == env_id}
        assert seeds >= set(DEFAULT_COLUMN_SEEDS), env_id


@pytest.mark.parametrize("algo", ["npg", "npg_trpo"])
def test_a_new_mujoco_task_gets_our_default_entry_as_in_the_rl_zoo(algo):
    """Our files have no ``&mujoco-defaults`` anchor, so the harness gives an unlisted task what ``rl_zoo3`` gives it."""
    entries = yaml.safe_load(hyperparams_path(algo).read_text(encoding="utf-8"))
    unlisted = [env_id for env_id in NEW_MUJOCO_TASKS if env_id not in entries]
    assert "Reacher-v5" in unlisted
    for env_id in unlisted:
        assert hyperparams_entry(hyperparams_path(algo), env_id) == entries["default"], env_id


#: The MuJoCo tasks of the suite first run with the default (a task may since have an entry built on it).
NEW_MUJOCO_TASKS = ("Ant-v5", "Humanoid-v5", "InvertedPendulum-v5", "InvertedDoublePendulum-v5", "Reacher-v5")

#: The default entry's comment: the tasks and seeds it was screened on, the mean final return on each, the runs' folder.
DEFAULT_COMMENT = re.compile(
    r"# default screened at 1M steps on (?P<envs>[\w./-]+), seeds (?P<seeds>[\d/]+): means (?P<means>[-\d. /]+) "
    r"\(.*; (?P<folder>benchmarks/results/compare_candidates/[\w.-]+)\)"
)


@pytest.mark.parametrize("algo", ["npg", "npg_trpo"])
def test_the_default_is_for_continuous_control_and_quotes_its_screen(algo):
    """The default normalizes and reads its trust region per action dimension, so it carries to a task of any action
    size; its comment quotes the mean final return of runs of exactly its settings on the tuned tasks; and no tuned entry
    inherits the per-dimension reading with its own target_kl and cg_damping (given for the whole action): an entry that
    reads them per dimension starts its trust region where the default's starts and damps as it does."""
    root = Path(__file__).parents[1]
    lines = hyperparams_path(algo).read_text(encoding="utf-8").splitlines()
    comment = lines[next(index for index, line in enumerate(lines) if line.startswith("default:")) - 1]
    match = DEFAULT_COMMENT.match(comment)
    assert match, f"the default's comment the test cannot read: {comment[:80]}"
    entries = yaml.safe_load("\n".join(lines))
    default = entries["default"]
    assert default["normalize"] and default["kl_per_action_dimension"]
    runs = [run for run in read_jsonl(root / match["folder"] / "runs.jsonl") if run["hyperparams"] == default]
    seeds = [int(seed) for seed in match["seeds"].split("/")]
    assert min(seeds) >= 100, "screening seeds are never the reported 0-9"
    for env_id, quoted in zip(match["envs"].split("/"), match["means"].split(" / "), strict=True):
        finals = {run["seed"]: run["final_return"] for run in runs if run["env_id"] == env_id}
        assert float(quoted) == round(np.mean([finals[seed] for seed in seeds]), 1), env_id
    per_dimension = [entry for entry in entries.values() if entry.get("kl_per_action_dimension")]

    def start(target_kl):  # a number, or a lin_ schedule's first radius
        return str(target_kl).removeprefix("lin_").split("_")[0]

    sizes = [(start(entry["target_kl"]), entry["cg_damping"]) for entry in per_dimension]
    assert sizes == [(start(default["target_kl"]), default["cg_damping"])] * len(per_dimension), "per dimension"


def test_a_candidate_record_holds_its_changes_seeds_mean_and_decision(tmp_path):
    from benchmarks.candidates import all_candidates, candidates_page

    shipped = hyperparams_entry(hyperparams_path("npg_trpo"), "Hopper-v5")
    settings = {**shipped, "target_kl": 0.1}
    settings.pop("critic_fit")
    folder = tmp_path / "hopper_wide"
    folder.mkdir()
    cell = {"algo": "npg_trpo", "env_id": "Hopper-v5", "timesteps": 1000, "hyperparams": settings}
    curve = [[500, 40.0, 0.0], [1000, 30.0, 0.0]]
    runs = [{**cell, "seed": seed, "final_return": value, "curve": curve} for seed, value in ((101, 30.0), (100, 10.0))]
    (folder / "runs.jsonl").write_text("".join(json.dumps(run) + "\n" for run in runs), encoding="utf-8")
    (record,) = all_candidates(tmp_path, {"hopper_wide": {"decision": "lost", "why": "too wide"}})
    assert record.changes == "critic_fit dropped, target_kl=0.1"
    assert list(record.finals) == [100, 101] and record.mean == 20.0
    page = candidates_page([record])
    assert "## npg_trpo, Hopper-v5" in page
    finals = "100: 10.0 (40.0) / 101: 30.0 (40.0)"
    row = f"| hopper_wide | 1,000 | critic_fit dropped, target_kl=0.1 | {finals} | 20.0 | lost: too wide |"
    assert row in page


def test_every_decision_names_a_candidate_folder():
    from benchmarks.candidates import read_decisions

    decisions = read_decisions(REPOSITORY / "benchmarks" / "zoo_candidates" / "decisions.yml")
    folders = {path.name for path in (REPOSITORY / "benchmarks" / "results" / "compare_candidates").iterdir()}
    assert decisions and set(decisions) <= folders
    assert {entry["decision"] for entry in decisions.values()} <= {"shipped", "lost", "tied", "superseded", "reference"}
    assert all(entry["why"] != "-" for entry in decisions.values())


def test_every_number_a_decision_quotes_is_one_of_the_candidates_runs():
    """A reason's returns are typed by hand: each must be a final, best or mean that the runs give (or a setting)."""
    from benchmarks.candidates import all_candidates, candidates_page, read_decisions

    root = REPOSITORY / "benchmarks" / "results" / "compare_candidates"
    number = re.compile(r"(?<![\d.])-?\d+\.\d(?!\d)")
    measured = set(number.findall(candidates_page(all_candidates(root, {}))))  # the runs alone, no decision text
    decisions = read_decisions(REPOSITORY / "benchmarks" / "zoo_candidates" / "decisions.yml")
    quoted = {(name, value) for name, entry in decisions.items() for value in number.findall(entry["why"])}
    assert quoted
    missing = sorted((name, value) for name, value in quoted if value not in measured)
    assert not missing, missing


def test_the_guides_python_default_is_the_shipped_default():
    """docs/guide/hyperparameters.md spells the default out in Python for a user without the Zoo: it must stay it."""
    guide = (REPOSITORY / "docs" / "guide" / "hyperparameters.md").read_text(encoding="utf-8")
    default = yaml.safe_load(hyperparams_path("npg_trpo").read_text(encoding="utf-8"))["default"]
    start, end = (float(value) for value in default["target_kl"].removeprefix("lin_").split("_"))
    assert f"target_kl=LinearSchedule({start}, {end}, end_fraction=1.0)" in guide
    assert f"policy_kwargs={default['policy_kwargs']}" in guide
    assert f"n_envs={default['n_envs']}" in guide and f"gamma={default['gamma']})" in guide  # VecNormalize's
    options = set(default) - {"target_kl", "policy_kwargs", "n_envs", "n_timesteps", "policy", "normalize"}
    for name in options:
        given = re.search(rf"^    {name}=([^,]+),", guide, re.MULTILINE)
        assert given is not None and ast.literal_eval(given.group(1)) == pytest.approx(default[name]), name


def test_the_acktr_defaults_matrix_runs_the_constructor_and_baselines_and_tables_cost_against_trpo(tmp_path):
    """``benchmarks/acktr_defaults.py``: ``acktr_new`` is what ``ACKTR("MlpPolicy", env)`` runs, ``acktr_old``
    baselines' settings, and the table's ratio is each configuration's time per sample over TRPO's on the same seeds."""
    import inspect

    from benchmarks.acktr_defaults import configurations, markdown_table, plan
    from sb3_npg import ACKTR
    from sb3_npg.acktr import BASELINES_ATARI_SETTINGS

    configs = configurations()
    parameters = inspect.signature(ACKTR).parameters
    assert configs["acktr_new"] == ("acktr", {name: parameters[name].default for name in BASELINES_ATARI_SETTINGS})
    assert configs["acktr_old"] == ("acktr", BASELINES_ATARI_SETTINGS) and configs["trpo"] == ("trpo", {})
    jobs = plan(tmp_path, configs, {"CartPole-v1": (1000, 475.0)}, (0,))
    assert [(job.algo, job.hyperparams.get("n_steps")) for job in jobs] == [("acktr", 20), ("acktr", 1024), ("npg_trpo", None)]
    cell = {"env_id": "CartPole-v1", "timesteps": 1000}
    runs = [
        {**cell, "conf": "x/acktr_new.yml", "seed": 0, "final_return": 500.0, "steps_per_second": 1e4},
        {**cell, "conf": "x/acktr_new.yml", "seed": 1, "final_return": 400.0, "steps_per_second": 5e3},
        {**cell, "conf": "x/trpo.yml", "seed": 0, "final_return": 500.0, "steps_per_second": 5e3},
        {**cell, "conf": "x/trpo.yml", "seed": 1, "final_return": 500.0, "steps_per_second": 5e3},
    ]
    rows = markdown_table(runs, {"CartPole-v1": (1000, 475.0)}).splitlines()
    # acktr_new: 100 and 200 us per sample (mean 150, min 100) against TRPO's 200 and 200
    assert (
        rows[2]
        == "| CartPole-v1 (1,000, 475) | acktr_new | 0: 500.0 / 1: 400.0 | 450.0 | 1 of 2 | 150 / 100 | 0.75x / 0.50x |"
    )


def test_the_masking_benchmark_table_has_each_seed_the_mean_and_the_iqm(tmp_path):
    import json

    from benchmarks import masking

    rows = [
        {
            "configuration": "MaskableTRPO",
            "task": "InvalidActionEnvDiscrete",
            "seed": seed,
            "return": value,
            "return_std": 0.0,
            "train_seconds": 1.0,
            "timesteps": 10,
        }
        for seed, value in enumerate([10.0, 20.0, 30.0, 40.0, 1000.0])
    ]
    (tmp_path / "runs.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    (line,) = [line for line in masking.table(tmp_path).splitlines() if "MaskableTRPO" in line]
    assert "0: 10.0 / 1: 20.0" in line and "| 220.0 |" in line  # the mean, pulled up by the outlier
    assert "| 30.0 [" in line  # the IQM of 5 runs: the mean of the middle ones, 20, 30, 40
    assert set(masking.CONFIGURATIONS) >= {"MaskablePPO", "MaskableTRPO", "MaskableNPG", "MaskableACKTR"}
