"""The return of a uniformly random policy per environment: the zero of the normalized scores in ``benchmarks.report``.

    .venv/bin/python -m benchmarks.random_scores [--envs HalfCheetah-v5,Hopper-v5] [--episodes 100] [--out FILE]

Each environment (gymnasium's own, with its time limit, no wrappers) plays ``--episodes`` episodes with actions drawn
uniformly from its action space (seeded); the mean episode return is written to ``benchmarks/results/random_scores.json``
as ``{env id: mean return}``. A normalized score is then ``(return - random) / (reference - random)``, with the RL Zoo's
published sb3-contrib TRPO result as the reference: 0 is the random policy, 1 the published result.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import gymnasium as gym

from benchmarks.common import PUBLISHED_TRPO, REPOSITORY

RANDOM_SCORES_FILE = REPOSITORY / "benchmarks" / "results" / "random_scores.json"
DEFAULT_EPISODES = 100


def random_return(env_id: str, episodes: int, seed: int = 0) -> float:
    """Mean return of ``episodes`` episodes of uniformly random actions."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return statistics.mean(returns)


def read_random_scores(path: Path = RANDOM_SCORES_FILE) -> dict[str, float]:
    """The measured random returns (none when the file does not exist)."""
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default=",".join(PUBLISHED_TRPO), help="comma-separated environment ids")
    parser.add_argument("--episodes", type=int, default=DEFAULT_EPISODES)
    parser.add_argument("--out", type=Path, default=RANDOM_SCORES_FILE)
    args = parser.parse_args()
    scores = read_random_scores(args.out)
    for env_id in args.envs.split(","):
        scores[env_id] = random_return(env_id, args.episodes)
        print(f"{env_id}: {scores[env_id]:.1f}", flush=True)
    args.out.write_text(json.dumps(scores, indent=2, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
