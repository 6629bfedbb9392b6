# Every target works from a fresh clone on a machine with only Python: it creates .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is installed before the project by scripts/install_torch.sh: on Linux without an NVIDIA GPU the CPU build, from
# PyTorch's CPU wheel index (pip's default index when that one does not answer within 5 s); otherwise pip's default
# index (the CUDA build on Linux x86_64 with a GPU). TORCH_PIP_ARGS, when set (even empty), replaces that choice and
# goes to pip as-is, e.g.: make test TORCH_SPEC="torch==2.9.1" TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# Parallel test workers (pytest-xdist); 0 runs in-process.
TEST_WORKERS ?= 2

.PHONY: bench-mujoco bench-report demo docs test test-slow test-sb3 test-sb3-contrib lint format type package bench bench-learning bench-update bench-fisher bench-solvers bench-learn bench-zoo clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
ifeq ($(origin TORCH_PIP_ARGS),undefined)
	sh scripts/install_torch.sh $(BIN)/python "$(TORCH_SPEC)"
else
	$(BIN)/python -m pip install $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
endif

$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e ".[$*]"
	touch $@

demo: $(VENV)/.installed-progress
	$(BIN)/python examples/demo.py

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m slow $(PYTEST_ARGS)

# sb3-contrib's own tests that use TRPO, with sb3_contrib.TRPO replaced by ours (the drop-in promise). The tests come
# from sb3-contrib's source distribution on PyPI, downloaded once into .cache/.
SB3_CONTRIB_VERSION ?= 2.9.2
SB3_CONTRIB_SRC := .cache/sb3_contrib-$(SB3_CONTRIB_VERSION)

# A source distribution from PyPI, unpacked once: .cache/<name>-<version>/tests (the name with underscores).
.cache/%/tests: | $(BIN)/python
	mkdir -p .cache
	$(BIN)/python -m pip download --no-deps --no-binary :all: "$(subst -,==,$*)" -d .cache
	tar -xzf .cache/$*.tar.gz -C .cache

test-sb3-contrib: $(VENV)/.installed-test $(SB3_CONTRIB_SRC)/tests
	PYTHONPATH=. $(BIN)/python -m pytest -p tests.external.sb3_contrib_plugin -c /dev/null --rootdir $(SB3_CONTRIB_SRC) \
		-n $(TEST_WORKERS) -k "trpo or TRPO" $(SB3_CONTRIB_SRC)/tests $(PYTEST_ARGS)

# Stable-Baselines3's own tests with NPG and TRPO added wherever they parametrize over PPO or A2C (with A2C's settings),
# from SB3's source distribution on PyPI, downloaded once into .cache/. Only the added cases run.
SB3_VERSION ?= 2.9.2
SB3_SRC := .cache/stable_baselines3-$(SB3_VERSION)

test-sb3: $(VENV)/.installed-test $(SB3_SRC)/tests
	PYTHONPATH=. $(BIN)/python -m pytest -p tests.external.sb3_plugin -c /dev/null --rootdir $(SB3_SRC) \
		-n $(TEST_WORKERS) -k "NPG or TRPO" --ignore=$(SB3_SRC)/tests/test_utils.py $(SB3_SRC)/tests $(PYTEST_ARGS)

# The documentation site (docs/), warnings as errors; open docs/_build/html/index.html.
docs: $(VENV)/.installed-docs
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.installed-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

type: $(VENV)/.installed-dev
	$(BIN)/mypy

# The sdist and the wheel as pip builds them (isolated, with the setuptools of [build-system]), checked by twine.
# tests/test_packaging.py does the same in `make test`.
DIST_DIR ?= dist
package: $(VENV)/.installed-dev
	rm -rf $(DIST_DIR)
	$(BIN)/python -m build --outdir $(DIST_DIR) .
	$(BIN)/twine check --strict $(DIST_DIR)/*

# The comparison matrix (resumes an interrupted run), then its tables and plots: the published results.
BENCH_ALGOS ?= npg,npg_trpo,trpo,ppo,a2c
BENCH_ENVS ?= CartPole-v1,Acrobot-v1,Pendulum-v1,MountainCarContinuous-v0,LunarLanderContinuous-v3,HalfCheetah-v5,Hopper-v5,Walker2d-v5,Swimmer-v5
BENCH_SEEDS ?= 0,1,2
BENCH_OUT ?= benchmarks/results/compare
bench: $(VENV)/.installed-all
	$(BIN)/python -m benchmarks.compare --algos $(BENCH_ALGOS) --envs $(BENCH_ENVS) --seeds $(BENCH_SEEDS) --workers 2 --out $(BENCH_OUT)
	$(MAKE) bench-report

# Every table and figure of the README, benchmarks/README.md and the docs from the recorded runs (no training): the
# comparison's tables and figures, and the page of tuning candidates.
bench-report: $(VENV)/.installed-all
	$(BIN)/python -m benchmarks.report $(BENCH_OUT) --update-docs README.md benchmarks/README.md --figures docs/_static
	$(BIN)/python -m benchmarks.candidates benchmarks/results/compare_candidates \
		--decisions benchmarks/zoo_candidates/decisions.yml --out docs/candidates.md

# The MuJoCo protocol of benchmarks/README.md ("The MuJoCo protocol"): 1M steps, an evaluation every 50k steps. On the
# four tuned tasks seeds 0-9 for both TRPOs and ACKTR, 0-4 for NPG, 0-2 for PPO and A2C; on the five new tasks seeds 0-4
# for both TRPOs, 0-2 for NPG and PPO; in that order, resuming where it stopped.
MUJOCO_ENVS ?= HalfCheetah-v5,Hopper-v5,Walker2d-v5,Swimmer-v5
MUJOCO_NEW_ENVS ?= Ant-v5,Humanoid-v5,InvertedPendulum-v5,InvertedDoublePendulum-v5,Reacher-v5
MUJOCO_SCHEDULE = --timesteps 1000000 --eval-freq 50000 --workers 2 --out $(BENCH_OUT)
MUJOCO_PROTOCOL = --envs $(MUJOCO_ENVS) $(MUJOCO_SCHEDULE)
MUJOCO_NEW_PROTOCOL = --envs $(MUJOCO_NEW_ENVS) $(MUJOCO_SCHEDULE)
# The MuJoCo release the recorded matrix ran with (a fresh venv would take a newer one; compare warns on a mix).
MUJOCO_SPEC ?= mujoco==4.0.0
bench-mujoco: $(VENV)/.installed-all
	$(BIN)/python -m pip install "$(MUJOCO_SPEC)"
	$(BIN)/python -m benchmarks.compare --algos npg_trpo,trpo,acktr --seeds 0,1,2,3,4,5,6,7,8,9 $(MUJOCO_PROTOCOL)
	$(BIN)/python -m benchmarks.compare --algos npg --seeds 0,1,2,3,4 $(MUJOCO_PROTOCOL)
	$(BIN)/python -m benchmarks.compare --algos ppo,a2c --seeds 0,1,2 $(MUJOCO_PROTOCOL)
	$(BIN)/python -m benchmarks.compare --algos npg_trpo,trpo --seeds 0,1,2,3,4 $(MUJOCO_NEW_PROTOCOL)
	$(BIN)/python -m benchmarks.compare --algos npg,ppo --seeds 0,1,2 $(MUJOCO_NEW_PROTOCOL)
	$(MAKE) bench-report

# Learning check over 3 seeds: the "Does it learn?" table of docs/benchmarks.md comes from this file.
bench-learning: $(VENV)/.installed-test
	$(BIN)/python -m benchmarks.learning --seeds 0,1,2 --out benchmarks/results/learning.jsonl

# Update time of one train() next to sb3-contrib's TRPO on shared rollouts (needs the mujoco extra for MuJoCo configs).
bench-update: $(VENV)/.installed-benchmarks
	$(BIN)/python -m benchmarks.bench_update --out benchmarks/results/bench_update.json

# The Fisher-vector product implementations side by side.
bench-fisher: $(VENV)/.installed-benchmarks
	$(BIN)/python -m benchmarks.bench_fisher --out benchmarks/results/bench_fisher.json

# K-FAC (alone, and as conjugate gradient's preconditioner) against plain conjugate gradient.
bench-solvers: $(VENV)/.installed-benchmarks
	$(BIN)/python -m benchmarks.bench_solvers --out benchmarks/results/bench_solvers.json

# End to end against sb3-contrib's TRPO: wall time and final return over 5 seeds (resumes an interrupted run).
bench-learn: $(VENV)/.installed-benchmarks
	$(BIN)/python -m benchmarks.bench_learn --seeds 0,1,2,3,4 --out benchmarks/results/bench_learn.jsonl

# The RL Zoo hyperparameter files, verified with the Zoo's own evaluation over 3 seeds (resumes an interrupted run).
bench-zoo: $(VENV)/.installed-all
	$(BIN)/python -m benchmarks.zoo_verify --workers 2 --out benchmarks/results/zoo_verify.jsonl

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache .cache
