"""PPO with the conv encoder on MiniGrid's DoorKey-5x5 (7x7x3 partial view), against SB3's PPO.

Run: ``PYTHONPATH=src .venv/bin/python bench/minigrid_doorkey.py`` (needs the ``bench`` extra:
``pip install -e '.[bench]'``; ``--seeds 0`` for one seed of each, ``--steps N`` for another
budget, ``--contenders rlserve`` for one side, ``--set KEY=VALUE`` for a PPO setting,
``--view raw`` for the ids as float32, see below).

Target (issue 23): the mean return of the last 100 training episodes >= 0.9 within 300,000 env
steps. DoorKey's reward is ``1 - 0.9 * steps / 250`` on reaching the goal (after picking up the
key and opening the door), 0 when the 250 steps run out.

Both sides train on ``ImgObsWrapper(gym.make("MiniGrid-DoorKey-5x5-v0"))``, one env copy: the
agent's 7x7x3 view as a ``uint8`` ``Box(0, 255)`` whose values are small ids (object 0-10,
colour 0-5, door state 0-2). Both divide it by 255 inside the model, each by its own default
(rlserve's encoder divides every uint8 image; SB3's ``CnnPolicy`` has ``normalize_images``
on), so the network sees values in [0, 0.04]:

- **rlserve**: hosted PPO (``PPOConfig().environment(creator)``), its defaults: the automatic
  small conv stack (16, 32, 64 filters of 2x2, stride 1, ReLU: 64x4x4) shared by actor and
  critic, then the (64, 64) tanh MLP of each; 2048 steps per update, minibatches of 64, 10
  epochs, lr 3e-4, no entropy bonus. ``torch_threads=1`` and ``device="cpu"`` only keep it on
  one core.
- **sb3**: ``PPO("CnnPolicy", ...)``, its defaults (the same schedule), with the small CNN of
  MiniGrid's documentation and rl-starter-files in place of NatureCNN (which needs 36x36 and
  up): 16 filters 2x2, max-pool 2x2, 32 2x2, 64 2x2 (ReLU after each conv), flattened, then a
  linear layer of 128 with ReLU (``features_dim=128``); then SB3's (64, 64) tanh MLP for each
  of actor and critic, features shared. One torch thread.

Episodes: rlserve's from the ``on_episode_end`` callback (exact env steps with one env copy),
SB3's from its Monitor wrapper. Per run: the mean return of the last 100 episodes ended by the
budget, the env step at which the last-100 mean first reached 0.9, wall seconds (building,
training; Python start-up excluded) and env steps/s. Each run is a sub-process of this script,
one at a time, alternating contenders per seed; medians over the seeds.

``--view raw`` gives both sides the same view as a float32 ``Box(0, 10)``, channels-first
(3, 7, 7), so neither divides it (a float image passes as it is; the ids reach the first
convolution as 0-10, as in rl-starter-files): it shows whether dividing the small ids by 255
costs anything.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

from _suite_contenders import Recorder

ENV_ID = "MiniGrid-DoorKey-5x5-v0"
STEPS = 300_000
TARGET = 0.9
SETTINGS: list[str] = []
"""PPO settings over rlserve's defaults for the default run (none: the defaults reach it)."""


def make_env(view: str = "uint8") -> Any:
    """DoorKey-5x5 with MiniGrid's ImgObsWrapper: the 7x7x3 partial view alone.

    ``view`` ``raw``: the view as float32 ``Box(0, 10)``, channels-first (see the module doc).
    """
    import gymnasium as gym
    import minigrid  # noqa: F401  (registers the MiniGrid envs)
    import numpy as np
    from minigrid.wrappers import ImgObsWrapper

    env = ImgObsWrapper(gym.make(ENV_ID))
    if view == "uint8":
        return env
    space = gym.spaces.Box(0.0, 10.0, (3, 7, 7), np.float32)
    return gym.wrappers.TransformObservation(
        env, lambda obs: np.transpose(obs, (2, 0, 1)).astype(np.float32), space
    )


def parse_settings(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as PPO settings (values are Python literals, else text)."""
    settings: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise SystemExit(f"--set takes KEY=VALUE, got {item!r}")
        try:
            settings[key.strip()] = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            settings[key.strip()] = text.strip()
    return settings


def run_rlserve(seed: int, steps: int, settings: dict[str, Any], view: str) -> dict[str, Any]:
    """Hosted rlserve PPO (its defaults and ``settings``); the run's record."""
    from rlserve import PPOConfig

    recorder = Recorder(steps, TARGET)
    pending: list[tuple[int, float]] = []
    lengths: dict[str, int] = defaultdict(int)

    def on_episode_end(*, episode: Any, **_: Any) -> None:
        if episode.training_enabled:
            lengths[episode.source] += episode.length
            pending.append((lengths[episode.source], episode.episode_return))

    started = time.monotonic()
    config = (
        PPOConfig()
        .environment(lambda _config: make_env(view))
        .training(torch_threads=1, device="cpu", **settings)
        .debugging(seed=seed)
        .callbacks(on_episode_end=on_episode_end, fail_fast=True)
    )
    with config.build() as algo:
        while algo.env_steps_sampled < steps:
            algo.train()
            for summed, episode_return in pending:
                recorder.episode(summed * max(1, len(lengths)), episode_return)
            pending.clear()
        done = algo.env_steps_sampled
    return recorder.result(done, time.monotonic() - started)


def run_sb3(seed: int, steps: int, view: str) -> dict[str, Any]:
    """SB3 PPO with the small MiniGrid CNN (see the module doc); the run's record."""
    import torch
    from gymnasium import spaces
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from torch import nn

    class SmallGridCNN(BaseFeaturesExtractor):
        """16 2x2, max-pool 2x2, 32 2x2, 64 2x2, then a linear layer (channels-first input)."""

        def __init__(self, observation_space: spaces.Box, features_dim: int = 128) -> None:
            super().__init__(observation_space, features_dim)
            convs = nn.Sequential(
                nn.Conv2d(observation_space.shape[0], 16, 2),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 2),
                nn.ReLU(),
                nn.Conv2d(32, 64, 2),
                nn.ReLU(),
                nn.Flatten(),
            )
            with torch.no_grad():
                size = convs(torch.zeros(1, *observation_space.shape)).shape[1]
            self.net = nn.Sequential(convs, nn.Linear(size, features_dim), nn.ReLU())

        def forward(self, observations: torch.Tensor) -> torch.Tensor:
            return self.net(observations)

    recorder = Recorder(steps, TARGET)

    class Episodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    recorder.episode(self.num_timesteps, float(info["episode"]["r"]))
            return True

    started = time.monotonic()
    env = make_vec_env(lambda: make_env(view), n_envs=1, seed=seed)
    model = PPO(
        "CnnPolicy",
        env,
        policy_kwargs={
            "features_extractor_class": SmallGridCNN,
            "features_extractor_kwargs": {"features_dim": 128},
        },
        seed=seed,
        device="cpu",
        verbose=0,
    )
    model.learn(steps, callback=Episodes())
    env.close()
    return recorder.result(model.num_timesteps, time.monotonic() - started)


def child(
    contender: str, seed: int, steps: int, settings: dict[str, Any], view: str
) -> dict[str, Any]:
    """One run in this process, with one torch thread."""
    import torch

    torch.set_num_threads(1)
    rlserve = contender == "rlserve"
    result = run_rlserve(seed, steps, settings, view) if rlserve else run_sb3(seed, steps, view)
    result.pop("curve")
    return {"contender": contender, "seed": seed, **result}


def _line(result: dict[str, Any]) -> str:
    reached = result["steps_to_threshold"]
    return (
        f"{result['contender']} seed {result['seed']}: last-100 mean "
        f"{result['final_mean']:.3f} at {result['steps']:,} steps ({result['episodes']:,} "
        f"episodes); >= {TARGET} first at {f'{reached:,}' if reached else 'never'}; "
        f"{result['seconds']:.0f} s, {result['steps_per_s']:.0f} steps/s"
    )


def main() -> None:
    """Run every seed of each contender, alternating, one at a time; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--contenders", nargs="+", choices=["rlserve", "sb3"], default=["rlserve", "sb3"]
    )
    parser.add_argument("--steps", type=int, default=STEPS, help="env step budget per run")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an rlserve PPO setting, e.g. --set ent_coef=0.01",
    )
    parser.add_argument(
        "--view",
        choices=["uint8", "raw"],
        default="uint8",
        help="uint8: the wrapper's view; raw: as float32 ids, not divided (see the doc)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    items = args.set if args.child else SETTINGS + args.set
    if args.child:
        settings = parse_settings(items)
        result = child(args.contenders[0], args.seeds[0], args.steps, settings, args.view)
        print(json.dumps(result))
        return
    print(
        f"PPO on {ENV_ID} (ImgObsWrapper, view {args.view}), {args.steps:,} env steps; rlserve "
        f"settings over the defaults: {parse_settings(items) or 'none'}",
        flush=True,
    )
    results: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for seed in args.seeds:
        for contender in args.contenders:
            command = [sys.executable, __file__, "--child", "--seeds", str(seed)]
            command += ["--contenders", contender, "--steps", str(args.steps)]
            command += ["--view", args.view]
            command += [f"--set={item}" for item in items]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            results[contender].append(result)
            print(_line(result), flush=True)
    for contender, runs in results.items():
        reached = [r["steps_to_threshold"] for r in runs if r["steps_to_threshold"]]
        print(
            f"{contender}: median last-100 mean "
            f"{statistics.median(r['final_mean'] for r in runs):.3f}; reached {TARGET} in "
            f"{len(reached)}/{len(runs)} runs (median step of those "
            f"{f'{statistics.median(reached):,.0f}' if reached else '-'}); median "
            f"{statistics.median(r['seconds'] for r in runs):.0f} s, "
            f"{statistics.median(r['steps_per_s'] for r in runs):.0f} steps/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
