"""Ray's multi-line actor errors made one line naming the root error (no Ray needed)."""

from __future__ import annotations

from rlserve.cluster.failures import actor_failure


class ActorDiedError(Exception):
    """Stands for Ray's exception of that name: only its text matters here."""


def test_a_creation_failure_names_the_missing_module_and_the_fix() -> None:
    text = (
        "The actor died because of an error raised in its creation task, "
        "\x1b[36mray::WorkerActor.__init__()\x1b[39m (pid=1, ip=127.0.0.2)\n"
        "  At least one of the input arguments for this task could not be computed:\n"
        "ray.exceptions.RaySystemError: System error: No module named 'my_envs'\n"
        "traceback: Traceback (most recent call last):\n"
        "          ^^^^^^^^^^\n"
        "ModuleNotFoundError: No module named 'my_envs'"
    )
    line = actor_failure(ActorDiedError(text))
    assert "\n" not in line and "\x1b" not in line
    assert line.startswith("ActorDiedError: The actor died because of an error raised")
    assert "(ModuleNotFoundError: No module named 'my_envs')" in line
    assert "py_modules" in line


def test_a_plain_death_is_its_first_line() -> None:
    line = actor_failure(ActorDiedError("The actor died unexpectedly.\n\tmore detail"))
    assert line == "ActorDiedError: The actor died unexpectedly."
