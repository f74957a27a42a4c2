"""Train every model kind briefly on a CUDA learner and check nothing stayed on the CPU.

CI has no GPU, so this is run by hand on a machine with one::

    python bench/cuda_smoke.py                   # every model kind, 8,000 env steps each
    python bench/cuda_smoke.py --steps 20000     # longer runs
    python bench/cuda_smoke.py --only ppo-lstm,ppo-conv
    python bench/cuda_smoke.py --device cpu      # the same run on the CPU, to compare

The model kinds: PPO, DQN and SAC with MLPs (CartPole-v1, Pendulum-v1), PPO with an LSTM
(StatelessCartPole), PPO, DQN and SAC with the conv encoder (``PixelColumn``: an image with one
lit column to name or to point at), PPO with observation normalisation, and PPO with legal-move
masks (PettingZoo's tictactoe_v3 against a random legal player, when pettingzoo is installed).

For each it builds a hosted Algorithm with ``.resources(device=...)``, trains for ``--steps``
env steps and prints the learner's device, the updates done, the mean return of the last
episodes and env steps per second. Then it walks the learner's modules, tensors, optimiser
states and random generators (normalisation statistics and return scalers included) and names
any that is not on the device. It exits non-zero when a learner is not on the device, a tensor
or generator was left elsewhere, an update failed or a return is not finite.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlserve import DQNConfig, PPOConfig, SACConfig
from rlserve.env import StatelessCartPole


class PixelColumn(gym.Env[np.ndarray, Any]):
    """A 12x12 uint8 image with one lit column, one step per episode.

    Discrete: name the half it is in (1 for right, pays 1). Continuous: point at it (the reward
    is minus the distance, in [-2, 0]).
    """

    def __init__(self, config: Any = None) -> None:
        self.continuous = bool((config or {}).get("continuous", False))
        self.observation_space = gym.spaces.Box(0, 255, (12, 12, 1), np.uint8)
        self.action_space: gym.Space[Any] = gym.spaces.Discrete(2)
        if self.continuous:
            self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.rng = np.random.default_rng(0)
        self.column = 0

    def _obs(self) -> np.ndarray:
        self.column = int(self.rng.integers(0, 12))
        image = np.zeros((12, 12, 1), np.uint8)
        image[:, self.column, 0] = 255
        return image

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        """A new image (``seed`` restarts the column stream)."""
        super().reset(seed=seed)
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        """The reward for ``action`` and the next image; every episode ends here."""
        if self.continuous:
            target = self.column / 5.5 - 1.0
            reward = -abs(float(np.asarray(action).reshape(-1)[0]) - target)
        else:
            reward = float(int(action) == int(self.column >= 6))
        return self._obs(), reward, True, False, {}


def _tictactoe(config: Any) -> gym.Env[Any, Any]:
    from pettingzoo.classic import tictactoe_v3

    from rlserve.env import VersusOpponent

    return VersusOpponent(tictactoe_v3.env())


def _configs(seed: int) -> dict[str, Callable[[], Any]]:
    """Each model kind's config, built on demand (tictactoe needs pettingzoo)."""
    column = {"continuous": True}
    return {
        "ppo": lambda: PPOConfig().environment("CartPole-v1"),
        "dqn": lambda: DQNConfig().environment("CartPole-v1"),
        "sac": lambda: SACConfig().environment("Pendulum-v1"),
        "ppo-lstm": lambda: (
            PPOConfig().environment(StatelessCartPole).training(use_lstm=True, max_seq_len=20)
        ),
        "ppo-conv": lambda: PPOConfig().environment(PixelColumn).training(train_batch_size=512),
        "dqn-conv": lambda: DQNConfig().environment(PixelColumn),
        "sac-conv": lambda: SACConfig().environment(PixelColumn, env_config=column),
        "ppo-norm": lambda: (
            PPOConfig().environment("Pendulum-v1").env_runners(observation_filter="MeanStdFilter")
        ),
        "ppo-mask": lambda: PPOConfig().environment(_tictactoe).training(train_batch_size=512),
    }


HOST_BY_DESIGN = {"_generator"}
"""Learner attributes that stay on the CPU on purpose: PPO's minibatch order and SAC's actor
noise come from a CPU generator so that a checkpoint's random stream resumes on any device (the
draws are moved: one permutation per epoch, one noise tensor per sample)."""


def off_device(learner: Any, device: torch.device) -> list[str]:
    """Names of the learner's torch state that is not on ``device``.

    Looked for: parameters, buffers, tensors, optimiser states and generators, in the learner's
    attributes (but for :data:`HOST_BY_DESIGN`) and, one level down, in rlserve objects. Host-side
    numpy arrays (the replay buffer, the normalisation statistics) are not torch state.
    """
    found: list[str] = []

    def check(name: str, where: torch.device) -> None:
        if where.type != device.type:
            found.append(f"{name} on {where}")

    def visit(name: str, value: Any, depth: int) -> None:
        if isinstance(value, torch.nn.Module):
            for part, tensor in [*value.named_parameters(), *value.named_buffers()]:
                check(f"{name}.{part}", tensor.device)
        elif isinstance(value, (torch.Tensor, torch.Generator)):
            check(name, value.device)
        elif isinstance(value, torch.optim.Optimizer):
            for index, state in enumerate(value.state.values()):
                for key, tensor in state.items():
                    # Adam keeps its step counter on the CPU unless capturable: by design.
                    if isinstance(tensor, torch.Tensor) and key != "step":
                        check(f"{name}.state[{index}].{key}", tensor.device)
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                visit(f"{name}[{index}]", item, depth)
        elif (
            depth < 2
            and type(value).__module__.startswith("rlserve")
            and hasattr(value, "__dict__")
        ):
            for key, item in vars(value).items():
                visit(f"{name}.{key}", item, depth + 1)

    for key, value in vars(learner).items():
        if key not in HOST_BY_DESIGN:
            visit(key, value, 0)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8000, help="env steps per model kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu, to compare")
    parser.add_argument("--only", help="comma-separated model kinds (default: all)")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2
    if args.device.startswith("cuda"):
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    configs = _configs(args.seed)
    names = args.only.split(",") if args.only else list(configs)
    failed = []
    for name in names:
        try:
            config = configs[name]().debugging(seed=args.seed).resources(device=args.device)
        except ImportError as error:
            print(f"{name}: skipped ({error})")
            continue
        started = time.perf_counter()
        with config.build() as algo:
            learner = algo.learners["default"]
            result: dict[str, Any] = {}
            while algo.env_steps_sampled < args.steps:
                result = algo.train()
            elapsed = time.perf_counter() - started
            device = torch.device(getattr(learner, "device", "cpu"))
            updates = int(learner.counters().get("updates", 0))
            elsewhere = off_device(learner, torch.device(args.device))
        mean = float(result["env_runners"]["episode_return_mean"])
        print(
            f"{name}: device {device}, {algo.env_steps_sampled} env steps, {updates} updates, "
            f"return mean {mean:.2f}, {algo.env_steps_sampled / elapsed:.0f} env steps/s"
            + (f"; NOT ON {args.device}: {', '.join(elsewhere)}" if elsewhere else "")
        )
        on_device = device.type == torch.device(args.device).type and not elsewhere
        if not on_device or updates == 0 or not math.isfinite(mean):
            failed.append(name)
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
