"""The restart policy's counting and the death reasons, without processes."""

from __future__ import annotations

import pytest

from rlserve.processes.restarts import Failure, RestartPolicy, exit_reason


def test_a_child_is_given_up_after_max_restarts_plus_one_failures_in_a_row() -> None:
    policy = RestartPolicy(max_restarts=2)
    assert [policy.failed(1) for _ in range(3)] == [False, False, True]
    assert policy.in_a_row(1) == 3 and policy.in_a_row(0) == 0 and policy.failures == 3


def test_a_success_starts_the_count_again_and_the_lifetime_counters_stay() -> None:
    policy = RestartPolicy(max_restarts=1)
    policy.failed()
    policy.restarting()
    policy.succeeded()
    assert not policy.failed()
    assert (policy.in_a_row(), policy.failures, policy.restarts) == (1, 2, 1)


def test_without_a_limit_nothing_is_given_up() -> None:
    policy = RestartPolicy(max_restarts=None)
    assert not any(policy.failed() for _ in range(100))
    assert policy.in_a_row() == 100


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (3, "child exited with code 3"),
        (0, "child exited with code 0"),
        (-9, "child was killed by SIGKILL"),
        (-200, "child was killed by signal 200"),
        (None, "child closed its pipe"),
    ],
)
def test_exit_reasons(code: int | None, reason: str) -> None:
    assert exit_reason(code, "child") == reason


def test_details_go_on_a_line_of_their_own() -> None:
    assert Failure("boom", "Traceback").details_suffix == "\nTraceback"
    assert Failure("boom").details_suffix == ""
