"""Refusing, before anything starts, a resource request that no node of the cluster can meet.

Ray waits forever for an actor whose resources no node has; rlserve checks the live nodes first
and names the resource and the fix instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlserve.errors import ConfigError

__all__ = ["check_resources", "free_resources_note", "unready_actor_note"]

_FLAG = {"CPU": "--num-cpus=N", "GPU": "--num-gpus=N"}

_SETTING = {"CPU": "num_cpus_per_{what}", "GPU": "num_gpus_per_{what}"}
"""The setting that asks for a built-in resource (the others: ``custom_resources_per_*``)."""


def check_resources(
    ray: Any, need: Mapping[str, float], what: str = "env runner", setting: str | None = None
) -> None:
    """Raise unless some live node of the cluster has all of ``need`` for one ``what``.

    Args:
        ray: The ``ray`` module, initialised.
        need: Resource name -> amount one worker asks for (0: not asked).
        what: The worker, for the message.
        setting: The setting or flag that asked for them, for the message (None: the
            Algorithm API's ``*_per_<what>`` names).

    Raises:
        ConfigError: No node has enough of a resource (or of all of them together).
    """
    wanted = {name: float(amount) for name, amount in need.items() if amount > 0}
    nodes = [dict(node.get("Resources", {})) for node in ray.nodes() if node.get("Alive")]
    if any(all(node.get(k, 0.0) >= v for k, v in wanted.items()) for node in nodes):
        return
    for name, amount in wanted.items():
        most = max((node.get(name, 0.0) for node in nodes), default=0.0)
        if most < amount:
            asked = setting or _SETTING.get(name, "custom_resources_per_{what}").format(
                what=what.replace(" ", "_")
            )
            flag = _FLAG.get(name, f"--resources='{{\"{name}\": N}}'")
            raise ConfigError(
                f"no node of the Ray cluster has {name}={amount:g} for one {what} ({asked}; "
                f"the most any node has is {most:g}): start a node with it (ray start "
                f"--address=HEAD {flag}) or ask for less"
            )
    raise ConfigError(
        f"no node of the Ray cluster has all of {wanted} for one {what}: start a node with "
        "them all (ray start --address=HEAD ...) or ask for less"
    )


def free_resources_note(ray: Any, need: Mapping[str, float]) -> str:
    """What of ``need`` the cluster has free now, out of its total ("GPU 0 of 1 free").

    For the warning about an actor that Ray has not placed yet: the resources exist (checked
    at the start), so something else holds them (another job's actors, a lost actor not yet
    released).
    """
    free, total = ray.available_resources(), ray.cluster_resources()
    parts = [
        f"{name} {float(free.get(name, 0.0)):g} of {float(total.get(name, 0.0)):g} free"
        for name, amount in need.items()
        if amount > 0
    ]
    return ", ".join(parts) or "nothing asked for"


def unready_actor_note(
    what: str, waited: float, node: str | None, need: Mapping[str, float], free: str = ""
) -> str:
    """Why an actor that has not said ready after ``waited`` s may still wait (a warning).

    Args:
        what: The actor, for the message ("the learner actor").
        waited: Seconds since it was asked for.
        node: Where it started: it greeted, so Ray placed it and it is loading. None: not
            heard from yet (queued by Ray, or its process still starting).
        need: What it asks for (named when it was not heard from).
        free: What of ``need`` the cluster has free (:func:`free_resources_note`).
    """
    if node is not None:
        return (
            f"{what} is not ready after {waited:.0f} s: it started on {node} and is still "
            "loading (its checkpoints, the experience log; slow on a loaded machine)"
        )
    asked = {k: v for k, v in need.items() if v > 0}
    return (
        f"{what} is not ready after {waited:.0f} s; it asks for {asked} ({free}): Ray starts "
        "it once a node has them free (stop what holds them, or start a node with them), or "
        "its process is still starting"
    )
