"""What an update logs: every key to TensorBoard, CSV and JSON; to stdout only what a user reads per update."""

import csv

import pytest
import torch
from stable_baselines3.common.logger import configure

from sb3_npg.common.algorithm import NOT_ON_STDOUT
from tests.test_algorithms import filled, logged

TINY = {"n_steps": 128, "batch_size": 64, "policy_kwargs": {"net_arch": [16]}, "seed": 0, "device": "cpu"}
#: Rows a user reads per update (SB3's PPO prints about 15, rollout/ and time/ included).
READ_PER_UPDATE = {"entropy", "explained_variance", "kl_divergence", "learning_rate", "n_updates", "value_loss"}


def _train_rows(printed):
    """The ``train/`` keys of the last table printed to stdout."""
    lines = printed.splitlines()
    start = max(index for index, line in enumerate(lines) if line.startswith("| train/"))
    rows = []
    for line in lines[start + 1 :]:
        if not line.startswith("|    "):  # the next section, or the table's end
            break
        rows.append(line.strip("|").split("|")[0].strip())
    return rows


def _trained(algo, tmp_path, capsys, **kwargs):
    model = algo("MlpPolicy", "Pendulum-v1", **{**TINY, **kwargs})
    model.set_logger(configure(str(tmp_path), ["stdout", "csv"]))
    capsys.readouterr()
    model.learn(2 * TINY["n_steps"])
    with open(tmp_path / "progress.csv", encoding="utf-8") as file:
        header = next(csv.reader(file))
    return model, _train_rows(capsys.readouterr().out), header


def test_stdout_shows_what_a_user_reads_and_every_format_else_gets_every_key(algo, tmp_path, capsys):
    model, printed, header = _trained(algo, tmp_path, capsys)
    assert READ_PER_UPDATE <= set(printed)
    assert not any(row.startswith("events/") or row in NOT_ON_STDOUT for row in printed), printed
    assert len(printed) <= 12, printed
    expected = {f"train/events/{event}" for event in model.counted_events} | {f"train/{key}" for key in NOT_ON_STDOUT}
    if algo.__name__ == "NPG":
        expected.discard("train/line_search_last_kl")  # NPG takes the full step: it has no line search to log
    # ACKTR's own keys (tests/test_acktr.py):
    expected -= {"train/kfac_curvature", "train/kl_divergence_over_clip", "train/step_size", "train/value_step_size"}
    assert expected <= set(header)


@pytest.mark.parametrize("algo_name", ["NPG", "TRPO"])
def test_an_event_that_happened_is_printed(algo_name, tmp_path, capsys):
    import sb3_npg

    _, printed, _ = _trained(getattr(sb3_npg, algo_name), tmp_path, capsys, cg_max_steps=1)  # CG stops at its cap
    assert "events/cg_max_steps_reached" in printed


#: Critic epochs of an update: a logged loss summed over them, not averaged, would read this many times too large.
CRITIC_EPOCHS = 3


def test_value_loss_is_the_mean_over_every_epochs_minibatches_not_their_sum(algo):
    """``train/value_loss`` of the minibatch fit is the loss averaged over every minibatch of every epoch by samples:
    with a learning rate too small to move the critic, the rollout's mean squared error whatever the epochs."""
    model = filled(algo, learning_rate=1e-12, n_critic_updates=CRITIC_EPOCHS)
    buffer = model.rollout_buffer
    observations = torch.as_tensor(buffer.observations.reshape(-1, *buffer.obs_shape))
    with torch.no_grad():
        values = model.policy.predict_values(observations).flatten().double()
    expected = float(torch.mean((values - torch.as_tensor(buffer.returns.flatten()).double()) ** 2))
    model.train()
    # float32 minibatch means over 256 samples (at most 256 relative roundings), the critic moved by ~1e-12.
    n_samples = model.n_steps * model.n_envs
    assert logged(model, "value_loss") == pytest.approx(expected, rel=n_samples * torch.finfo(torch.float32).eps)
