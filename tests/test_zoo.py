"""RL Zoo integration: registration, the command-line wrapper (train, enjoy, optimize) and the Optuna samplers."""

import importlib.metadata
import inspect
import json
import os
import subprocess
import warnings
import sys
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import optuna
import pytest
import yaml
import sb3_contrib
from rl_zoo3 import hyperparams_opt, utils
from rl_zoo3.exp_manager import ExperimentManager
from stable_baselines3.common.utils import LinearSchedule

from sb3_npg import NPG, TRPO
from sb3_npg.zoo import ZOO_ALGOS, hyperparams_path, register
from sb3_npg.zoo.cli import SCRIPTS, SUMMARIES, USAGE_ERROR, main, through_this_cli, with_default_config
from sb3_npg.zoo.registry import _converting_target_kl, zoo_target_kl
from sb3_npg.common.value_targets import NormalizedValueHead
from sb3_npg.zoo.samplers import SAMPLERS

ZOO_NAMES = list(ZOO_ALGOS)
#: Few steps and a tiny network, through the Zoo's own override flag.
TINY_PARAMS = ["-params", "n_steps:64", "policy_kwargs:dict(net_arch=[16])"]


@pytest.fixture(autouse=True)
def registered():
    """Every test sees our algorithms in the Zoo, whatever ran before it in this worker."""
    register()


def test_register_is_idempotent_and_leaves_sb3_contrib_trpo_alone():
    register()
    preprocess = ExperimentManager._preprocess_hyperparams
    snapshot = (dict(utils.ALGOS), dict(hyperparams_opt.HYPERPARAMS_SAMPLER), dict(hyperparams_opt.HYPERPARAMS_CONVERTER))
    register()
    assert (
        dict(utils.ALGOS),
        dict(hyperparams_opt.HYPERPARAMS_SAMPLER),
        dict(hyperparams_opt.HYPERPARAMS_CONVERTER),
    ) == snapshot
    assert ExperimentManager._preprocess_hyperparams is preprocess  # wrapped once, for target_kl schedules
    assert utils.ALGOS["npg"] is NPG and utils.ALGOS["npg_trpo"] is TRPO
    assert utils.ALGOS["trpo"] is sb3_contrib.TRPO
    assert hyperparams_opt.HYPERPARAMS_SAMPLER["trpo"] is hyperparams_opt.sample_trpo_params
    for name in ZOO_NAMES:
        assert hyperparams_opt.HYPERPARAMS_SAMPLER[name] is SAMPLERS[name]


def test_default_config_is_ours_for_our_names_only():
    for name in ZOO_NAMES:
        assert with_default_config(["--algo", name, "--env", "X"])[-2:] == ["--conf-file", str(hyperparams_path(name))]
        assert with_default_config([f"--algo={name}"])[-1] == str(hyperparams_path(name))
        assert hyperparams_path(name).is_file()
        mine = ["--algo", name, "-conf", "mine.yml"]
        assert with_default_config(mine) == mine
    for other in (["--algo", "trpo"], ["--algo", "ppo"], []):
        assert with_default_config(other) == other
    with pytest.raises(ValueError, match="not an sb3-npg algorithm"):
        hyperparams_path("trpo")


#: Action dimensions (1 for a Discrete space) of the environments in the sb3-contrib settings file that need MuJoCo or
#: Box2D to build: the test suite installs neither, so only classic-control environments are built.
ACTION_DIMS_OF_PHYSICS_ENVS = {
    "Ant-v5": 8,
    "HalfCheetah-v5": 6,
    "Hopper-v5": 3,
    "Walker2d-v5": 6,
    "Humanoid-v5": 17,
    "Swimmer-v5": 2,
    "BipedalWalker-v3": 4,
    "BipedalWalkerHardcore-v3": 4,
    "LunarLander-v3": 1,
    "LunarLanderContinuous-v3": 2,
}


def _action_dims(env_id):
    if env_id in ACTION_DIMS_OF_PHYSICS_ENVS:
        return ACTION_DIMS_OF_PHYSICS_ENVS[env_id]
    entry_point = str(gym.spec(env_id).entry_point)
    assert entry_point.startswith("gymnasium.envs.classic_control"), f"add {env_id} to ACTION_DIMS_OF_PHYSICS_ENVS"
    space = gym.make(env_id).action_space
    return int(space.shape[0]) if isinstance(space, gym.spaces.Box) else 1


def _rounded(value):
    return round(value, 12) if isinstance(value, float) else value


def test_sb3_contrib_settings_file_is_the_rl_zoos_trpo_file_translated_to_our_kl_and_nothing_else():
    """Each entry is rl_zoo3's trpo.yml entry (its -v4 one for -v5) with target_kl and cg_damping times the action
    dimensions, the same file for both names; the shipped files stay our own."""
    from benchmarks.common import contrib_kl_scale, default_hyperparams, hyperparams_entry

    contrib = hyperparams_path("npg_trpo", sb3_contrib_settings=True)
    assert contrib == hyperparams_path("npg", sb3_contrib_settings=True) != hyperparams_path("npg_trpo")
    ours = yaml.safe_load(contrib.read_text(encoding="utf-8"))
    assert {"CartPole-v1", "Pendulum-v1", "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Swimmer-v5"} <= set(ours)
    for env_id in set(ours) - {"default"}:
        zoo = hyperparams_entry(default_hyperparams("trpo"), env_id)
        translated = contrib_kl_scale(zoo, _action_dims(env_id))
        assert contrib_kl_scale(ours[env_id], 1) == {key: _rounded(value) for key, value in translated.items()}, env_id


@pytest.mark.parametrize("name", ["fly", "trian", "Train", "-v"])
def test_unknown_sub_command_exits_2_naming_it_and_the_choices(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--algo", "npg"])
    assert exit_info.value.code == USAGE_ERROR
    err = capsys.readouterr().err
    assert "usage: sb3-npg-zoo" in err
    assert f"sb3-npg-zoo: unknown sub-command {name!r} (choose from {', '.join(SCRIPTS)})" in err


def test_no_sub_command_exits_2_with_usage(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == USAGE_ERROR
    assert "usage: sb3-npg-zoo" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_is_plain_text_listing_every_sub_command(flag, capsys):
    main([flag])  # returns: exit status 0
    out = capsys.readouterr().out
    assert out.startswith("usage: sb3-npg-zoo")
    assert "``" not in out and ":func:" not in out  # not the module's reStructuredText
    lines = out.splitlines()
    for name, summary in SUMMARIES.items():
        assert sum(line.split()[:1] == [name] for line in lines) == 1, name  # one line per sub-command
        assert f"{name}  " in out and summary in out


def test_every_sub_command_has_a_summary():
    assert list(SUMMARIES) == list(SCRIPTS)


@pytest.mark.parametrize(("args", "code"), [(["--help"], 0), (["-h"], 0), ([], USAGE_ERROR), (["trian"], USAGE_ERROR)])
def test_exit_status_of_the_module_entry_point(args, code):
    completed = subprocess.run([sys.executable, "-m", "sb3_npg.zoo", *args], capture_output=True, text=True, check=False)
    assert completed.returncode == code
    assert "usage: sb3-npg-zoo" in (completed.stdout if code == 0 else completed.stderr)


def test_record_training_records_through_this_cli():
    rest = ["--env", "CartPole-v1", "--algo", "npg", "--no-render"]
    assert through_this_cli(["python", "-m", "rl_zoo3.record_video", *rest]) == [
        sys.executable,
        "-m",
        "sb3_npg.zoo",
        "record_video",
        *rest,
    ]
    other = ["ffmpeg", "-i", "video.mp4"]
    assert through_this_cli(other) == other


def test_record_training_runs_record_video_with_our_algorithms_registered(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    main(["train", "--algo", "npg", "--env", "CartPole-v1", "-n", "128", "-f", str(logs), "--seed", "0", *TINY_PARAMS])
    calls = []

    def record(command, *args, **kwargs):
        calls.append(command)
        return 0

    monkeypatch.setattr(subprocess, "call", record)
    monkeypatch.setattr("os.system", lambda command: 0)  # the Zoo joins the videos with the system's ffmpeg
    main(["record_training", "--algo", "npg", "--env", "CartPole-v1", "-f", str(logs), "-n", "10"])
    assert calls and all(command[:4] == [sys.executable, "-m", "sb3_npg.zoo", "record_video"] for command in calls)
    assert subprocess.call is record  # put back after the run


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("algo", ZOO_NAMES)
def test_train_then_enjoy(algo, env_id, tmp_path):
    logs = tmp_path / "logs"
    main(["train", "--algo", algo, "--env", env_id, "-n", "256", "-f", str(logs), "--seed", "0", *TINY_PARAMS])
    run = logs / algo / f"{env_id}_1"
    saved = ZOO_ALGOS[algo].load(run / f"{env_id}.zip")
    assert isinstance(saved, ZOO_ALGOS[algo]) and saved.num_timesteps >= 256
    assert saved.n_steps == 64  # the Zoo's -params override reached our constructor
    config = (run / env_id / "config.yml").read_text()
    assert "n_critic_updates" in config  # hyperparameters came from our shipped file
    main(["enjoy", "--algo", algo, "--env", env_id, "-f", str(logs), "--no-render", "-n", "50"])


@pytest.mark.parametrize("algo", ZOO_NAMES)
def test_optimize_two_trials_with_a_storage(algo, tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    args = ["train", "--algo", algo, "--env", "CartPole-v1", "-n", "256", "-f", str(tmp_path / "logs"), "--seed", "0"]
    options = ["-optimize", "--n-trials", "2", "--n-jobs", "1", "--n-evaluations", "1", "--eval-episodes", "1"]
    main([*args, *options, "--sampler", "random", "--storage", storage, "--study-name", "tiny"])
    study = optuna.load_study(study_name="tiny", storage=storage)
    assert len(study.trials) == 2
    assert {trial.state for trial in study.trials} <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}


@pytest.mark.parametrize(("env_id", "n_actions"), [("CartPole-v1", 0), ("Pendulum-v1", 1), ("MountainCarContinuous-v0", 1)])
@pytest.mark.parametrize("algo", ZOO_NAMES)
def test_samplers_give_valid_constructor_arguments(algo, env_id, n_actions):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    env = gym.make(env_id)
    for _ in range(50):
        trial = study.ask()
        hyperparams = SAMPLERS[algo](trial, n_actions, 1, {})
        # The converter the Zoo uses for a stored trial gives back the same arguments.
        assert hyperparams_opt.HYPERPARAMS_CONVERTER[algo](trial.params) == hyperparams
        # batch_size only matters to the minibatch critic fit, which warns when one batch is the whole rollout.
        default_batch_size = inspect.signature(ZOO_ALGOS[algo]).parameters["batch_size"].default
        uneven = (
            hyperparams["critic_fit"] == "minibatch"
            and hyperparams.get("batch_size", default_batch_size) > hyperparams["n_steps"]
        )
        with pytest.warns(UserWarning) if uneven else _no_warning():
            model = ZOO_ALGOS[algo]("MlpPolicy", env, device="cpu", **hyperparams)
        assert model.target_kl == hyperparams.get("target_kl", hyperparams.get("kfac_clip"))
        assert isinstance(model.policy.value_net, NormalizedValueHead) == hyperparams["normalize_value_targets"]
        study.tell(trial, 0.0)


class _no_warning:
    """The opposite of ``pytest.warns(UserWarning)`` for the batch-size warning: fails if the block gives one."""

    def __enter__(self):
        self._catcher = warnings.catch_warnings(record=True)
        self.records = self._catcher.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._catcher.__exit__(*exc)
        batch_warnings = [str(record.message) for record in self.records if "batch_size" in str(record.message)]
        assert not batch_warnings, batch_warnings
        return False


def test_console_script_entry_point():
    scripts = {entry.name: entry.value for entry in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts["sb3-npg-zoo"] == "sb3_npg.zoo.cli:main"


def test_record_video_of_a_trained_model(tmp_path):
    logs, videos = tmp_path / "logs", tmp_path / "videos"
    main(["train", "--algo", "npg", "--env", "CartPole-v1", "-n", "128", "-f", str(logs), "--seed", "0", *TINY_PARAMS])
    main(["record_video", "--algo", "npg", "--env", "CartPole-v1", "-f", str(logs), "-n", "20", "-o", str(videos)])
    assert [path.suffix for path in videos.iterdir()] == [".mp4"]


def test_fast_settings_through_the_zoos_params_flag_as_the_docs_quote_it(tmp_path):
    """The RL Zoo page's recipe: the Zoo evaluates each -params value as Python, so 'lbfgs' keeps its own quotes
    (the shell's ``critic_fit:"'lbfgs'"`` passes ``critic_fit:'lbfgs'``)."""
    from sb3_npg import FAST_SETTINGS

    logs = tmp_path / "logs"
    fast = ["fisher_sub_sampling_factor:5", "critic_fit:'lbfgs'", "n_critic_updates:10"]
    main(["train", "--algo", "npg_trpo", "--env", "Pendulum-v1", "-n", "128", "-f", str(logs), *TINY_PARAMS, *fast])
    saved = TRPO.load(logs / "npg_trpo" / "Pendulum-v1_1" / "Pendulum-v1.zip")
    assert {key: getattr(saved, key) for key in FAST_SETTINGS} == dict(FAST_SETTINGS)


# ------------------------------------------------------------------ target_kl schedules in hyperparameter files

#: A Pendulum entry of four updates whose KL radius is a Zoo schedule string.
SCHEDULED_TARGET_KL_FILE = """\
Pendulum-v1:
  n_timesteps: 256
  policy: 'MlpPolicy'
  n_steps: 64
  batch_size: 64
  {radius}: lin_0.03
  policy_kwargs: "dict(net_arch=[16])"
"""
#: The option each of our algorithms takes its KL radius from (ACKTR's is its clip).
KL_RADIUS = {"npg": "target_kl", "npg_trpo": "target_kl", "acktr": "kfac_clip"}


@pytest.mark.parametrize("algo", ZOO_NAMES)
def test_a_hyperparameter_file_with_a_target_kl_schedule_string_trains(algo, tmp_path):
    conf, logs = tmp_path / "scheduled.yml", tmp_path / "logs"
    conf.write_text(SCHEDULED_TARGET_KL_FILE.format(radius=KL_RADIUS[algo]))
    main(["train", "--algo", algo, "--env", "Pendulum-v1", "-f", str(logs), "--seed", "0", "-conf", str(conf)])
    saved = ZOO_ALGOS[algo].load(logs / algo / "Pendulum-v1_1" / "Pendulum-v1.zip")
    assert saved.num_timesteps == 256 and saved._current_progress_remaining == 0.0
    # From 0.03 at the first update to a tenth of it at the last one (the Zoo's own lin_ schedules reach 0 there).
    assert isinstance(saved.target_kl, LinearSchedule)
    assert [saved.target_kl_schedule(p) for p in (1.0, 0.5, 0.0)] == pytest.approx([0.03, 0.0165, 0.003])


@pytest.mark.parametrize(
    ("value", "ends"), [("lin_0.03", (0.03, 0.003)), ("lin_3e-2", (0.03, 0.003)), ("lin_0.03_0.01", (0.03, 0.01))]
)
def test_zoo_target_kl_strings_are_linear_schedules_from_start_to_end(value, ends):
    schedule = zoo_target_kl(value)
    assert isinstance(schedule, LinearSchedule)
    assert (schedule(1.0), schedule(0.0), schedule(-0.1)) == pytest.approx((*ends, ends[1]))


@pytest.mark.parametrize(
    "value", ["0.03", "exp_0.03", "lin_", "lin_x", "lin_0", "lin_0.03_0", "lin_0.03_-1", "lin_1_2_3", "lin_nan"]
)
def test_zoo_target_kl_refuses_other_strings_naming_the_option(value):
    with pytest.raises(ValueError, match=f"Invalid value for target_kl: {value!r}"):
        zoo_target_kl(value)


@pytest.mark.parametrize("sb3_contrib_settings", [False, True])
@pytest.mark.parametrize("algo", ZOO_NAMES)
def test_every_shipped_target_kl_is_a_radius_or_a_schedule_of_positive_radii(algo, sb3_contrib_settings):
    """A typo in a shipped entry (``lin_0.06_0,02``) would fail only when a user trains that environment."""
    entries = yaml.safe_load(hyperparams_path(algo, sb3_contrib_settings).read_text(encoding="utf-8"))
    scheduled = 0
    for env_id, entry in entries.items():
        target_kl = zoo_target_kl(entry.get(KL_RADIUS[algo], 0.01))
        if isinstance(target_kl, LinearSchedule):
            scheduled += 1
            target_kl = min(target_kl(1.0), target_kl(0.0))
        assert isinstance(target_kl, float) and target_kl > 0, env_id
    assert scheduled >= (0 if sb3_contrib_settings or algo == "acktr" else 1), "our files ship a schedule (Walker2d-v5)"


def test_only_our_algorithms_target_kl_strings_are_converted():
    assert zoo_target_kl(0.02) == 0.02  # numbers (and schedules from Python configs) pass unchanged
    preprocess = _converting_target_kl(lambda manager, hyperparams: hyperparams)
    hyperparams = {"target_kl": "lin_0.03", "kfac_clip": "lin_0.02", "n_steps": 64}
    for name in ZOO_NAMES:
        converted = preprocess(SimpleNamespace(algo=name), hyperparams)
        assert isinstance(converted["target_kl"], LinearSchedule) and isinstance(converted["kfac_clip"], LinearSchedule)
    assert preprocess(SimpleNamespace(algo="trpo"), hyperparams) == hyperparams  # sb3-contrib's TRPO: untouched
    assert hyperparams["target_kl"] == "lin_0.03"  # the Zoo's dict (saved to config.yml) keeps the string


def _monitor_log(run: Path) -> None:
    """The ``Monitor`` file ``plot_train`` reads: 20 episodes of a CartPole-v1 run."""
    run.mkdir(parents=True)
    header = "#" + json.dumps({"t_start": 1700000000.0, "env_id": "CartPole-v1"})
    rows = [f"{10.0 + i},{10 + i},{0.01 * i:.2f}" for i in range(20)]
    (run / "0.monitor.csv").write_text("\n".join([header, "r,l,t", *rows]) + "\n")


def _evaluations(run: Path) -> None:
    """The ``evaluations.npz`` ``all_plots`` reads: 3 evaluations of 5 episodes."""
    run.mkdir(parents=True)
    results = np.arange(15, dtype=float).reshape(3, 5)
    np.savez(run / "evaluations.npz", timesteps=np.array([100, 200, 300]), results=results, ep_lengths=results)


@pytest.mark.parametrize(
    ("script", "args", "make_log", "figure"),
    [
        ("plot_train", ["--algo", "npg", "--env", "CartPole-v1", "-w", "5"], _monitor_log, "training-episodic-reward"),
        ("all_plots", ["-a", "npg", "-e", "CartPole-v1"], _evaluations, "results-cartpole-v1"),
    ],
)
def test_plots_without_a_display_are_saved_as_png_files_named_on_stdout(script, args, make_log, figure, tmp_path):
    """Issue 35: the Zoo's ``plt.show()`` shows nothing without a display; the figure goes to a file instead."""
    make_log(tmp_path / "logs" / "npg" / "CartPole-v1_1")
    out = tmp_path / "out"
    out.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in {"DISPLAY", "WAYLAND_DISPLAY"}}
    completed = subprocess.run(
        [sys.executable, "-m", "sb3_npg.zoo", script, *args, "-f", str(tmp_path / "logs")],
        env={**env, "MPLBACKEND": "Agg"},
        cwd=out,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    png = out / f"{script}-{figure}.png"
    assert [path.name for path in out.iterdir()] == [png.name]
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and png.stat().st_size > 1000
    assert f"saved {png}" in completed.stdout


def test_help_and_the_readme_name_every_algorithm_we_register(capsys):
    main(["--help"])
    out = capsys.readouterr().out
    assert "(npg, npg_trpo, acktr)" in out and "for npg, npg_trpo and acktr, train" in out
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    zoo_section = readme.split("## RL Zoo", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{name}`" in zoo_section for name in ZOO_ALGOS), zoo_section
