"""``rlserve train``: train on a hosted environment with the Algorithm API.

The same run folder as ``rlserve serve`` (``config.toml``, ``spaces.json``, checkpoints,
TensorBoard events), the same progress line, ``--resume`` and ``rlserve export``. It stops when
the mean return of the last 100 episodes reaches ``--stop-return`` (exit 0), or at the step or
time budget (exit 1 when a target return was set and not reached, else 0). Ctrl-C ends the
iteration, saves, and names the run folder and the command that resumes it (exit 130).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlserve.cli.exit_codes import INTERRUPTED
from rlserve.config.fields import flag_of, option, with_flags
from rlserve.errors import ConfigError


@dataclass
class TrainConfig:
    """Options of ``rlserve train``."""

    env: str = option(
        "",
        "A registered env id (CartPole-v1), or module:Name or path/to/file.py:Name of an env "
        "class or creator.",
    )
    algo: str | None = option(
        None, "The learning algorithm: ppo (default), dqn (Discrete actions) or sac (Box)."
    )
    env_config: str = option("{}", "JSON object handed to the env's creator.")
    num_envs: int = option(8, "Copies of the environment, acted on in one forward pass.")
    env_runners: int = option(
        0, "Env-runner processes sampling in parallel, each with --num-envs copies (0: here)."
    )
    remote_envs: bool = option(False, "Step the copies in sub-processes, in parallel.")
    envs_per_process: int = option(1, "Copies per sub-process with --remote-envs.")
    seed: int = option(0, "Seed of the environments, the sampling and the learner.")
    stop_return: float | None = option(
        None, "Stop once the mean return of the last 100 episodes reaches this."
    )
    stop_steps: int = option(1_000_000, "Stop after this many env steps.")
    time_limit: float | None = option(None, "Stop after this many seconds.")
    run_dir: str = option("runs", "Folder of run folders.")
    name: str | None = option(None, "Name of the run folder (default: a timestamp).")
    resume: str | None = option(None, "Continue the run in this folder.")
    trust_code: bool = option(
        False,
        "With --resume: call the env creator function the folder names (a folder may come "
        "from anyone; an env class needs no trust).",
    )
    checkpoint_every: int = option(10, "Iterations between checkpoints.")
    iteration_steps: int = option(
        512,
        "Least env steps of a training iteration (one progress line and progress.csv row; "
        "--checkpoint-every counts iterations). An iteration samples whole rounds of the "
        "learner's batch (PPO: --ppo-train-batch-size, 2048 by default; DQN and SAC: "
        "--dqn-train-every, --sac-train-every, 64), each followed by the updates due, until it "
        "has this many, so a PPO iteration has at least one batch.",
    )
    progress: bool = option(True, "Show the progress line.")
    callbacks: str | None = option(
        None,
        "Callbacks class told of results, episodes and checkpoints, as module:Class (imported; "
        "e.g. rlserve.algorithm.tracking:WandbLoggerCallback); see docs/tracking.md.",
    )

    def __post_init__(self) -> None:
        from rlserve.learners.registry import algorithm

        algorithm(self.algo)  # an unknown name is refused with the list
        if not self.env and not self.resume:
            raise ConfigError("rlserve train needs --env ENV (e.g. CartPole-v1) or --resume RUN")
        for name, least in (
            ("num_envs", 1),
            ("env_runners", 0),
            ("envs_per_process", 1),
            ("iteration_steps", 1),
        ):
            if getattr(self, name) < least:
                raise ConfigError(f"{name} must be at least {least}, got {getattr(self, name)}")


RESUME_KEEPS = (
    "env",
    "env_config",
    "num_envs",
    "env_runners",
    "remote_envs",
    "envs_per_process",
    "seed",
    "run_dir",
    "name",
    "checkpoint_every",
    "iteration_steps",
)
"""The options a resumed run keeps from its folder (its stop conditions and --progress apply)."""


class _CtrlC:
    """Ctrl-C asks the training loop to stop after its iteration; a second one stops at once.

    Only on the main thread (the only one Python delivers signals to); elsewhere Ctrl-C is a
    plain :class:`KeyboardInterrupt`.
    """

    def __init__(self) -> None:
        self.asked = False
        self._previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._ask)

    def _ask(self, signum: int, frame: Any) -> None:
        self.asked = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def restore(self) -> None:
        """Put back the handler that was there before."""
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def check_resumable(folder: Path) -> None:
    """Refuse a folder ``rlserve train --resume`` cannot continue, naming the command that can.

    Raises:
        ConfigError: It is a run of ``rlserve serve`` (or ``rlserve demo``), or no run folder.
    """
    from rlserve.algorithm.checkpoint_state import STATE_FILE

    if (folder / STATE_FILE).exists():
        return
    if (folder / "experience").is_dir():
        raise ConfigError(
            f"{folder} is a run of 'rlserve serve' (external clients feed it), not of 'rlserve "
            f"train'; continue it with 'rlserve serve --resume {folder}'"
        )
    raise ConfigError(
        f"{folder} is not a run folder of 'rlserve train' (no {STATE_FILE}); pass the folder "
        "it trained in, e.g. runs/<name>"
    )


def run_training(config: TrainConfig, overrides: dict[str, Any]) -> int:
    """Train until a stop condition or Ctrl-C; return the exit code (:data:`INTERRUPTED`)."""
    from rlserve.algorithm.algorithm import Algorithm
    from rlserve.algorithm.config import config_for
    from rlserve.algorithm.saved_config import load_config
    from rlserve.cli.logs import log_to_run_folder
    from rlserve.env.locate import locate_env
    from rlserve.learners.registry import algorithm

    if config.resume:
        check_resumable(Path(config.resume))
        # The callbacks are not saved with the run: --callbacks names them again.
        folder = Path(config.resume)
        saved = load_config(folder, config.trust_code) if config.callbacks else None
        if saved is not None:
            saved.callbacks(config.callbacks)
        algo = Algorithm.from_checkpoint(config.resume, saved, trust_code=config.trust_code)
        if config.algo is not None and config.algo != algo.config.algo_name:
            algo.stop()
            raise ConfigError(
                f"--algo {config.algo}: the run in {config.resume} trains "
                f"{algo.config.algo_name}; a run keeps its algorithm (drop --algo)"
            )
        algo.use_run_folder(config.resume, progress=config.progress)
        print(
            f"rlserve: resuming {config.resume}: {algo.env_steps_sampled:,} env steps, "
            f"iteration {algo.iteration}",
            flush=True,
        )
    else:
        try:
            env_config = json.loads(config.env_config)
        except ValueError as exc:
            raise ConfigError(f"--env-config is not JSON: {exc}") from exc
        if not isinstance(env_config, dict):
            raise ConfigError("--env-config must be a JSON object, e.g. '{\"size\": 5}'")
        try:
            algo = (
                config_for(config.algo)
                .environment(locate_env(config.env), env_config=env_config)
                .env_runners(
                    num_env_runners=config.env_runners,
                    num_envs_per_env_runner=config.num_envs,
                    remote_worker_envs=config.remote_envs,
                    envs_per_process=config.envs_per_process,
                )
                .training(min_env_steps_per_iteration=config.iteration_steps, **overrides)
                .debugging(seed=config.seed)
                .callbacks([config.callbacks] if config.callbacks else [])
                .reporting(
                    run_dir=config.run_dir,
                    name=config.name,
                    progress=config.progress,
                    checkpoint_every=config.checkpoint_every,
                )
                .build()
            )
        except ConfigError as exc:
            # The algorithm's settings came from --ALGO-* flags: name those, not the fields.
            entry = algorithm(config.algo)
            names = [f.name for f in dataclasses.fields(entry.settings)]
            raise ConfigError(with_flags(str(exc), names, f"{entry.name}_")) from None
    started = time.monotonic()
    reached = False
    mean = float("nan")
    ctrl_c = _CtrlC()
    try:
        assert algo.run is not None
        log_to_run_folder(algo.run.path)
        print(f"rlserve: training in {algo.run.path}", flush=True)
        while not ctrl_c.asked:
            result = algo.train()
            mean = result["env_runners"]["episode_return_mean"]
            if config.stop_return is not None and mean >= config.stop_return:
                reached = True
                break
            if algo.env_steps_sampled >= config.stop_steps:
                break
            if config.time_limit is not None and time.monotonic() - started >= config.time_limit:
                break
    except KeyboardInterrupt:
        ctrl_c.asked = True
    finally:
        ctrl_c.restore()
        folder = algo.save()
        algo.stop()
    if ctrl_c.asked:
        print(
            f"rlserve: interrupted after {algo.env_steps_sampled:,} env steps; saved in "
            f"{folder}; continue with 'rlserve train --resume {folder}'",
            flush=True,
        )
        return INTERRUPTED
    elapsed = time.monotonic() - started
    shown = "n/a" if mean != mean else f"{mean:.1f}"
    if reached:
        print(
            f"solved: mean return {shown} over the last 100 episodes after "
            f"{algo.env_steps_sampled:,} env steps in {elapsed:.1f} s; checkpoint in {folder}"
        )
        return 0
    print(
        f"stopped after {algo.env_steps_sampled:,} env steps in {elapsed:.1f} s: mean return "
        f"{shown}; checkpoint in {folder}"
    )
    return 1 if config.stop_return is not None else 0


def add_train_parser(commands: Any) -> None:
    """Add ``rlserve train`` to the command's sub-parsers."""
    from rlserve.cli.serve_args import FullHelp, GroupedHelp
    from rlserve.config.fields import add_arguments
    from rlserve.learners.registry import ALGORITHMS

    train = commands.add_parser(
        "train",
        help="train a policy on a hosted environment (vectorised, optionally in sub-processes)",
        description="Train on a hosted environment; same run folder, metrics, checkpoints, "
        "--resume and export as 'rlserve serve'. Unset settings take the algorithm's defaults, "
        "the same as 'rlserve serve' (no algorithm has other defaults for hosted environments), "
        "and the learner's seed is --seed. Each algorithm's settings (--ppo-*, --dqn-*, "
        "--sac-*): rlserve train --help-all.",
        usage="rlserve train [--env ENV | --resume RUN] [options]",
        formatter_class=GroupedHelp,
    )
    add_arguments(train, TrainConfig)
    train.add_argument(
        "--help-all", action=FullHelp, help="show every flag, the algorithms' too, and exit"
    )
    for entry in ALGORITHMS.values():
        group = train.add_argument_group(f"{entry.name.upper()} (--algo {entry.name})")
        hidden = add_arguments(
            group,
            entry.settings,
            prefix=f"{entry.name}_",
            defaults=train_defaults(entry.name),
        )
        FullHelp.hide(hidden)


def train_defaults(algo: str) -> dict[str, Any]:
    """The defaults of ``algo``'s settings that ``rlserve train`` applies unlike the server.

    The hosted defaults (:data:`~rlserve.algorithm.training_settings.HOSTED_DEFAULTS`, empty
    for every algorithm today), and the seed of ``--seed``; shown in ``rlserve train --help``.
    """
    from rlserve.algorithm.training_settings import HOSTED_DEFAULTS

    return {**HOSTED_DEFAULTS.get(algo, {}), "seed": "that of --seed"}


def train_command(args: argparse.Namespace) -> int:
    """Run ``rlserve train`` from parsed arguments."""
    from rlserve.cli.serve_args import refuse_unused_algorithm_flags
    from rlserve.config.fields import build
    from rlserve.learners.registry import algorithm

    config = build(TrainConfig, None, args)
    entry = algorithm(config.algo)
    refuse_unused_algorithm_flags(args, [entry.name])
    overrides = {
        f.name: getattr(args, f"{entry.name}_{f.name}")
        for f in dataclasses.fields(entry.settings)
        if getattr(args, f"{entry.name}_{f.name}", None) is not None
    }
    if config.resume:
        ignored = [flag_of(n) for n in RESUME_KEEPS if getattr(args, n, None) is not None]
        ignored += [flag_of(n, f"{entry.name}_") for n in overrides]
        if ignored:
            raise ConfigError(
                f"{', '.join(ignored)}: a resumed run keeps its environment and settings "
                f"(saved in {config.resume}); drop them, or start a new run with --env and a "
                "new --name (only --stop-return, --stop-steps, --time-limit, --progress and "
                "--callbacks apply to a resumed run)"
            )
    return run_training(config, overrides)
