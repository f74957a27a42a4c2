"""PPO on PettingZoo's tictactoe_v3 against a random legal opponent, with and without the mask.

Run: ``PYTHONPATH=src .venv/bin/python bench/tictactoe.py`` (``--seeds 0`` for one seed,
``--steps N`` for another budget, ``--modes mask`` for the masked runs only).

Target (issue 23): the learning player wins or draws >= 95% of 500 games against a uniformly
random legal opponent within 200,000 agent steps, with 0 illegal moves at any point of
training; the same task without the mask shows why it matters.

The game is :class:`rlserve.env.VersusOpponent` over ``tictactoe_v3.env()``: a single-agent
env whose ``step`` plays the learner's move and then the opponent's (a uniformly random legal
move), so an agent step is one of the learner's moves. The learner moves first in every other
game (its seat alternates with each reset). Win +1, draw 0, loss -1.

* ``mask``: the observation is ``Dict(action_mask, observation)``: rlserve masks illegal moves.
* ``nomask``: the observation is the 3x3x2 board alone; an illegal move ends the game as a
  loss (-1). The board shows which squares are taken, so the legal moves can be learned, but
  only by losing games to illegal moves first.

Hosted PPO (``PPOConfig().environment(...)``, one env copy) with its defaults but one
setting, ``train_batch_size=512`` (default 2048): a game lasts 3 to 5 agent steps, so 512
steps are still about 150 games per update, and the budget then buys 392 updates instead of
98 (the same 31,000 gradient steps, each on data from a policy four times newer). With the
defaults alone (``--defaults``) 2 seeds of 3 reached 95% at 200,000 steps and the third
94.0% (docs/benchmarks.md). ``torch_threads=1`` and ``device="cpu"`` do not change what it
learns, only that the run shares the machine politely. Illegal moves are counted by
the env copies from the moves actually taken (the runners step them in this process).

Every ``--eval-every`` agent steps (a curve, greedy), and at the end, 500 evaluation games
(250 in each seat) on a separate env copy, greedy (``explore=False``) and sampled
(``explore=True``); the budget's figures are those at the end of training. Each seed runs
in a sub-process of this script, one at a time; wall seconds cover building and training
(evaluation excluded).
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import subprocess
import sys
import time
from typing import Any

STEPS = 200_000
GAMES = 500
EVAL_EVERY = 25_000
TARGET = 0.95
SETTINGS = ["train_batch_size=512"]
"""The one PPO setting over the defaults (``--defaults`` drops it): see the module doc."""


def make_game(mask: bool) -> Any:
    """A tictactoe game against a uniformly random legal opponent (see the module doc)."""
    from pettingzoo.classic import tictactoe_v3

    from rlserve.env import VersusOpponent

    return VersusOpponent(tictactoe_v3.env(), mask=mask)


def evaluate(algo: Any, mask: bool, seed: int, explore: bool) -> dict[str, float]:
    """Win, draw and loss rates and illegal moves of ``GAMES`` games, half in each seat."""
    env = make_game(mask)
    wins = draws = losses = 0
    for game in range(GAMES):
        obs, _ = env.reset(seed=seed + game)
        done, reward = False, 0.0
        while not done:
            action = algo.compute_single_action(obs, explore=explore)
            obs, reward, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
        wins += reward > 0
        draws += reward == 0
        losses += reward < 0
    return {
        "win": wins / GAMES,
        "draw": draws / GAMES,
        "loss": losses / GAMES,
        "illegal": env.illegal_moves,
    }


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


def child(
    seed: int, mask: bool, steps: int, eval_every: int, settings: dict[str, Any]
) -> dict[str, Any]:
    """Train one seed in one mode; the figures at each evaluation and at the end."""
    from rlserve import PPOConfig

    envs: list[Any] = []

    def creator(config: Any) -> Any:
        envs.append(make_game(mask))
        return envs[-1]

    curve: list[dict[str, Any]] = []
    started = time.monotonic()
    evaluating = 0.0
    config = (
        PPOConfig()
        .environment(creator)
        .training(torch_threads=1, device="cpu", **settings)
        .debugging(seed=seed)
    )
    with config.build() as algo:
        while algo.env_steps_sampled < steps:
            algo.train()
            if algo.env_steps_sampled >= eval_every * (len(curve) + 1) or (
                algo.env_steps_sampled >= steps
            ):
                began = time.monotonic()
                greedy = evaluate(algo, mask, 1_000_000 * (seed + 1), explore=False)
                evaluating += time.monotonic() - began
                curve.append(
                    {
                        "steps": algo.env_steps_sampled,
                        "win_or_draw": round(greedy["win"] + greedy["draw"], 3),
                        "illegal_so_far": sum(env.illegal_moves for env in envs),
                    }
                )
        seconds = time.monotonic() - started - evaluating
        greedy = evaluate(algo, mask, 2_000_000 * (seed + 1), explore=False)
        sampled = evaluate(algo, mask, 3_000_000 * (seed + 1), explore=True)
        games = sum(env.games for env in envs)
        first = next((p["steps"] for p in curve if p["win_or_draw"] >= TARGET), None)
        return {
            "seed": seed,
            "mask": mask,
            "steps": algo.env_steps_sampled,
            "seconds": round(seconds, 1),
            "training_games": games,
            "illegal_training": sum(env.illegal_moves for env in envs),
            "env_copies": len(envs),
            "greedy": greedy,
            "sampled": sampled,
            "first_reached": first,
            "curve": curve,
        }


def _rates(figures: dict[str, float]) -> str:
    return (
        f"win {figures['win']:.1%} draw {figures['draw']:.1%} loss {figures['loss']:.1%} "
        f"(win+draw {figures['win'] + figures['draw']:.1%}, illegal {figures['illegal']})"
    )


def main() -> None:
    """Run every seed of every mode one at a time (each in a sub-process); print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--modes", nargs="+", choices=["mask", "nomask"], default=["mask", "nomask"]
    )
    parser.add_argument("--steps", type=int, default=STEPS, help="agent step budget per run")
    parser.add_argument("--eval-every", type=int, default=EVAL_EVERY)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a PPO setting (PPOSettings field), e.g. --set train_batch_size=512",
    )
    parser.add_argument(
        "--defaults", action="store_true", help=f"PPO's defaults alone, without {SETTINGS}"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    items = args.set if args.child or args.defaults else SETTINGS + args.set
    settings = parse_settings(items)
    if args.child:
        mask = args.modes[0] == "mask"
        result = child(args.seeds[0], mask, args.steps, args.eval_every, settings)
        print(json.dumps(result))
        return
    print(
        f"PPO (hosted) on tictactoe_v3 vs a uniformly random legal opponent; "
        f"{args.steps:,} agent steps; {GAMES} evaluation games (half as first player); "
        f"settings over the defaults: {settings or 'none'}"
    )
    for mode in args.modes:
        results = []
        for seed in args.seeds:
            command = [sys.executable, __file__, "--child", "--seeds", str(seed)]
            command += ["--modes", mode, "--steps", str(args.steps)]
            command += ["--eval-every", str(args.eval_every)]
            command += [f"--set={item}" for item in items]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            results.append(result)
            curve = ", ".join(
                f"{p['steps'] // 1000}k: {p['win_or_draw']:.1%}/{p['illegal_so_far']}"
                for p in result["curve"]
            )
            print(
                f"{mode} seed {seed}: {result['steps']:,} agent steps, "
                f"{result['training_games']:,} training games, "
                f"{result['illegal_training']:,} illegal moves in training, "
                f"{result['seconds']} s\n  greedy:  {_rates(result['greedy'])}\n"
                f"  sampled: {_rates(result['sampled'])}\n"
                f"  greedy win+draw / illegal moves so far: {curve}\n"
                f"  first evaluation >= {TARGET:.0%}: {result['first_reached']}",
                flush=True,
            )
        greedy = [r["greedy"]["win"] + r["greedy"]["draw"] for r in results]
        met = sum(
            g >= TARGET and r["illegal_training"] == 0 for g, r in zip(greedy, results, strict=True)
        )
        sampled = [r["sampled"]["win"] + r["sampled"]["draw"] for r in results]
        print(
            f"{mode}: median greedy win+draw {statistics.median(greedy):.1%} "
            f"(min {min(greedy):.1%}), median sampled {statistics.median(sampled):.1%}; "
            f"median greedy win {statistics.median(r['greedy']['win'] for r in results):.1%}; "
            f"illegal moves in training: {[r['illegal_training'] for r in results]}; "
            f"median wall {statistics.median(r['seconds'] for r in results):.1f} s; "
            f"target (>= {TARGET:.0%} greedy, 0 illegal) met by "
            f"{met}/{len(results)} seeds",
            flush=True,
        )


if __name__ == "__main__":
    main()
