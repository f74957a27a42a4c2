"""The seed's SimpleCorridor example, run as written (only its imports and ray.init() changed).

It hands float64 observations to a float32 Box (RLlib accepts that, so must we) and, with the
default settings, must reach the corridor's optimum: 5 steps right, return 4 * -0.1 + 1 = 0.6.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "simple_corridor.py"


def _results(stdout: str) -> list[dict[str, Any]]:
    """The printed result dicts (Python reprs; nan is not a literal, so it is quoted first)."""
    results = []
    for line in stdout.splitlines():
        if line.startswith("{'training_iteration'"):
            text = re.sub(r"\bnan\b", "'nan'", line)
            results.append(ast.literal_eval(text))
    return results


def test_example_is_the_seed_with_only_its_imports_changed() -> None:
    text = EXAMPLE.read_text()
    assert "from rlserve import PPOConfig" in text
    assert "import ray" not in text and "ray.init" not in text
    assert "if __name__" not in text
    assert (
        'config = PPOConfig().environment(SimpleCorridor, env_config={"corridor_length": 5})'
        in text
    )
    assert "return np.array([self.cur_pos]), {}" in text  # float64 for a float32 Box


@pytest.mark.timeout(300)
def test_simple_corridor_example_reaches_the_optimum() -> None:
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = _results(proc.stdout)
    assert [r["training_iteration"] for r in results] == [1, 2, 3], proc.stdout[-2000:]
    last = results[-1]["env_runners"]
    assert last["episode_return_mean"] >= 0.55
    assert last["episode_return_max"] <= 0.6 + 1e-9  # 0.6 is the optimum
    assert last["episodes_failed"] == 0
