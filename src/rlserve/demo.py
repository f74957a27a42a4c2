"""``rlserve demo cartpole``: a server and 4 client processes, each stepping its own CartPole.

The clients talk to the server only through :class:`~rlserve.PolicyClient`, exactly as an external
simulator would. The demo stops when the mean return of the last 100 episodes reaches the target,
prints one summary line and exits 0; past the step or time budget it says so and exits 1.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from typing import Any

from rlserve.client.local import LocalConfig
from rlserve.config import option
from rlserve.errors import ConfigError

DEMO_LOCAL = LocalConfig(
    batch_steps=256, batch_interval=0.5, max_buffered_steps=512, when_full="block"
)
"""Local-mode batching of the demo clients: these simulators can pause, so a small buffer that
blocks paces them to the learner instead of collecting experience it could not use."""


@dataclass
class DemoConfig:
    """Options of ``rlserve demo cartpole``."""

    seed: int = option(0, "Seed of the server, the learner and the clients' environments.")
    clients: int = option(4, "Client processes, each stepping its own CartPole-v1.")
    inference: str = option("remote", "remote: the server acts; local: clients act with numpy.")
    target_return: float = option(
        475.0, "Stop when the mean return of the last 100 episodes reaches this."
    )
    max_env_steps: int = option(300_000, "Give up (exit 1) after this many env steps.")
    time_limit: float = option(300.0, "Give up (exit 1) after this many seconds.")
    run_dir: str = option("runs", "Folder for the demo's run folder.")
    device: str = option("auto", "Torch device of the learner: auto, cpu or cuda.")
    progress: bool = option(True, "Show the progress line.")

    def __post_init__(self) -> None:
        if self.inference not in ("remote", "local"):
            raise ConfigError(f"--inference must be remote or local, got '{self.inference}'")


def cartpole_client(
    address: str, seed: int, stop: Any, token: str | None = None, inference: str = "remote"
) -> None:
    """Step CartPole-v1 with actions from the server until ``stop`` is set.

    This is the loop a user writes around their own simulator (see
    ``examples/cartpole_client.py``).
    """
    import signal

    import gymnasium as gym

    from rlserve import ConnectionLostError, PolicyClient

    # The demo stops its clients through ``stop``; Ctrl-C is for the server process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # These processes stand in for simulators on other machines; on a small shared machine the
    # server and its learner come first, or the learner falls behind and experience is wasted.
    os.nice(5)
    env = gym.make("CartPole-v1")
    try:
        client = PolicyClient(
            address,
            inference_mode=inference,
            token=token,
            client_name=f"cartpole-{seed}",
            local=DEMO_LOCAL if inference == "local" else None,
        )
    except ConnectionLostError:
        return
    obs, _ = env.reset(seed=seed)
    try:
        while not stop.is_set():
            episode_id = client.start_episode()
            done = False
            while not done and not stop.is_set():
                action = client.get_action(episode_id, obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                client.log_returns(episode_id, float(reward))
                done = terminated or truncated
                if done:
                    client.end_episode(episode_id, obs, truncated=truncated and not terminated)
            obs, _ = env.reset()
        client.close()
    except (ConnectionLostError, KeyboardInterrupt):
        pass


def run_demo(config: DemoConfig) -> int:
    """Run the demo; return the process exit code."""
    from rlserve.server.app import install_uvloop

    install_uvloop()
    return asyncio.run(_run(config))


async def _run(config: DemoConfig) -> int:
    import gymnasium as gym

    from rlserve.algorithms.ppo_config import PPOSettings
    from rlserve.config import to_table
    from rlserve.server.app import PolicyServer
    from rlserve.server.config import ServerConfig
    from rlserve.server.run_folder import RunFolder
    from rlserve.spaces import describe

    started = time.monotonic()
    env = gym.make("CartPole-v1")
    name = f"cartpole-seed{config.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    server_config = ServerConfig(
        port=0,
        http_port=0,
        seed=config.seed,
        run_dir=config.run_dir,
        name=name,
        metrics_interval=1.0,
        progress=config.progress,
    )
    ppo = to_table(PPOSettings(device=config.device, seed=config.seed))
    run = RunFolder.create(server_config.run_dir, name)
    run.save(
        {"server": to_table(server_config), "ppo": ppo},
        {
            "observation_space": describe(env.observation_space),
            "action_space": describe(env.action_space),
        },
    )
    server = PolicyServer.single(server_config, ppo, env.observation_space, env.action_space, run)
    await server.start()
    address = f"127.0.0.1:{server.port}"
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    clients = [
        ctx.Process(
            target=cartpole_client,
            args=(address, config.seed * 1000 + i, stop, None, config.inference),
            daemon=True,
        )
        for i in range(config.clients)
    ]
    for process in clients:
        process.start()
    stats = server.stats
    outcome = "budget"
    while True:
        await asyncio.sleep(0.05)
        if stats.episodes_completed >= 100 and stats.return_mean >= config.target_return:
            outcome = "solved"
            break
        if server.learner.failure is not None:
            outcome = "learner failed"
            break
        if not any(process.is_alive() for process in clients):
            outcome = "every client process exited"
            break
        if (
            stats.env_steps >= config.max_env_steps
            or time.monotonic() - started > config.time_limit
        ):
            break
    solved_steps, solved_seconds, solved_return = (
        stats.env_steps,
        time.monotonic() - started,
        stats.return_mean,
    )
    stop.set()
    loop = asyncio.get_running_loop()
    for process in clients:
        await loop.run_in_executor(None, process.join, 10)
        if process.is_alive():
            process.terminate()
    checkpoint = await server.close()
    print(
        f"{'solved' if outcome == 'solved' else 'NOT solved (' + outcome + ')'}: "
        f"env_steps={solved_steps} wall_seconds={solved_seconds:.1f} "
        f"mean_return_100={solved_return:.1f} inference={config.inference} "
        f"device={server.learner.device} "
        f"checkpoint={checkpoint}",
        flush=True,
    )
    return 0 if outcome == "solved" else 1
