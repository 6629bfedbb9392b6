"""Each example runs end to end on a tiny budget and returns what it printed."""

import importlib.util
import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The quick start's budget here (8 updates of 512 steps) and the return it must reach: an untrained deterministic
#: policy balances for about 10 steps and a random one for about 22; 8 working updates reach about 300.
QUICKSTART_STEPS = 4096
LEARNED_RETURN = 150


@pytest.mark.parametrize("algo", ["npg", "trpo"])
def test_quickstart_learns_saves_loads_and_evaluates(algo, capsys):
    mean = _load("quickstart").main(["--timesteps", str(QUICKSTART_STEPS), "--algo", algo])
    assert f"after {QUICKSTART_STEPS} steps" in capsys.readouterr().out  # the loaded model kept its step count
    assert mean >= LEARNED_RETURN  # the loaded model is the trained one, and training worked


def test_continuous_control_writes_tensorboard_logs(tmp_path):
    best = _load("continuous_control").main(["--timesteps", "4096", "--logdir", str(tmp_path)])
    assert math.isfinite(best), "the EvalCallback never evaluated"
    (events,) = tmp_path.rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events.parent))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"train/kl_divergence", "train/cg_iterations", "train/line_search_last_kl", "eval/mean_reward"} <= tags


def test_compare_contrib_prints_three_rows(capsys):
    rows = _load("compare_contrib").main(["--timesteps", "1024"])
    assert [row[0] for row in rows] == ["sb3_npg.NPG", "sb3_npg.TRPO", "sb3_contrib.TRPO"]
    assert "sb3_contrib.TRPO" in capsys.readouterr().out


def test_demo_saves_both_models_and_prints_the_table(tmp_path, capsys):
    rows = _load("demo").main(["--timesteps", "1024", "--out", str(tmp_path), "--no-progress-bar"])
    assert [row[0] for row in rows] == ["NPG", "TRPO"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["npg_CartPole-v1.zip", "trpo_CartPole-v1.zip"]
    printed = capsys.readouterr().out
    assert "| NPG       | its defaults " in printed and "| TRPO      | its defaults " in printed
    assert "NPG's and TRPO's rows are identical" in printed or "TRPO's line search shortened or refused" in printed


def test_demo_says_why_trpos_row_is_npgs_only_when_every_step_was_full():
    note = _load("demo").trpo_rows_note
    assert note([1.0, 1.0, 1.0]).startswith("NPG's and TRPO's rows are identical") and "all 3 updates" in note([1.0] * 3)
    assert "identical" not in note([1.0, 0.5, 1.0]) and "1 of 3" in note([1.0, 0.5, 1.0])
    assert "identical" not in note([0.0]) and "identical" not in note([])
