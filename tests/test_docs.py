"""The documentation site (docs/): it builds without a warning, and every Python example on its pages and in the
README runs.

Examples run as written, in a temporary folder, with every ``learn()`` capped at a few hundred steps (``n_steps`` and
every other option stay as the page gives them, so each still collects one rollout and makes one update).
"""

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

from benchmarks.common import free_port
from sb3_npg import ACKTR, NPG, TRPO

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: The most steps any ``learn()`` of an example takes here.
STEP_BUDGET = 256
#: A fenced block opened by exactly ```python (shell commands are ```bash and do not run).
PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def _python_blocks():
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        if "_build" in page.parts:
            continue
        text = page.read_text(encoding="utf-8")
        for match in PYTHON_BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            yield pytest.param(page, line, match.group(1), id=f"{page.relative_to(ROOT)}:{line}")


BLOCKS = list(_python_blocks())


def test_docs_have_python_examples():
    assert len(BLOCKS) >= 8, "the pages lost their examples (or the block pattern no longer finds them)"


def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx.cmd.build", reason="sphinx is not installed (pip install -e '.[docs]')")
    pytest.importorskip("myst_parser", reason="myst-parser is not installed (pip install -e '.[docs]')")
    pytest.importorskip("furo", reason="furo is not installed (pip install -e '.[docs]')")
    # In a process of its own: autodoc_preserve_defaults rewrites the documented functions' defaults in place, which
    # would change inspect.signature(NPG) for every later test of this worker.
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q", str(DOCS), str(tmp_path)]
    assert subprocess.run(command, check=False).returncode == 0
    api = (tmp_path / "api.html").read_text(encoding="utf-8")
    for algo in (NPG, TRPO, ACKTR):
        shown = _signature_on_page(api, f"sb3_npg.{algo.__name__}")
        expected = {name: p.default for name, p in inspect.signature(algo).parameters.items()}
        assert [name for name, _ in shown] == list(expected), f"the API page's signature of {algo.__name__}"
        assert [name for name, default in shown if default is not None] == [
            name for name, default in expected.items() if default is not inspect.Parameter.empty
        ], f"the API page shows no default for some of {algo.__name__}'s parameters"


def _signature_on_page(html: str, object_id: str) -> list[tuple[str, str | None]]:
    """The parameters (name, default as shown or ``None``) of the signature Sphinx rendered for ``object_id``."""
    start = html.index(f'id="{object_id}"')
    signature = html[start : html.index("</dt>", start)]
    parameters = []
    for rendered in re.findall(r'<em class="sig-param">(.*?)</em>', signature, flags=re.DOTALL):
        name = re.search(r'<span class="pre">(\w+)</span>', rendered)
        default = re.search(r'<span class="default_value"><span class="pre">(.*?)</span>', rendered)
        if name is not None:
            parameters.append((name.group(1), default.group(1) if default else None))
    return parameters


@pytest.fixture
def capped_learn(monkeypatch):
    """Every ``learn()`` (ours, sb3-contrib's, SB3's) trains for at most ``STEP_BUDGET`` steps."""
    learn = OnPolicyAlgorithm.learn

    def capped(self, total_timesteps, *args, **kwargs):
        return learn(self, min(total_timesteps, STEP_BUDGET), *args, **kwargs)

    monkeypatch.setattr(OnPolicyAlgorithm, "learn", capped)


@pytest.fixture
def single_rank(monkeypatch):
    """A one-process ``torchrun`` environment, for the examples with ``distributed=True``."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "LOCAL_RANK": "0"}
    for name, value in {**env, "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize(("page", "line", "code"), BLOCKS)
def test_docs_python_example_runs(page, line, code, tmp_path, monkeypatch, capped_learn, request):
    if "distributed=True" in code:
        request.getfixturevalue("single_rank")
    monkeypatch.chdir(tmp_path)  # examples save models and write logs in the working directory
    exec(compile(code, f"{page}:{line}", "exec"), {"__name__": "__docs__"})
