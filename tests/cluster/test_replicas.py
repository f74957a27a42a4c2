"""The driver's other front-ends without a cluster: their commands, and the learner's name kept
in the run folder for a resumed driver (``rlserve.cluster.replicas``)."""

from __future__ import annotations

from pathlib import Path

from rlserve.cluster.front_ends import front_end_nodes
from rlserve.cluster.replicas import STATE_FILE, Replicas, launcher_name, saved_learner_name


def _commands(argv: list[str], run: Path) -> tuple[list[str], list[str]]:
    replicas = Replicas(None, "127.0.0.2:6379", ["127.0.0.3"], argv, "rlserve-learner-x")
    return replicas._commands("127.0.0.3", run)


def test_a_new_drivers_front_ends_start_from_its_flags(tmp_path: Path) -> None:
    argv = ["serve", "--spaces-from", "CartPole-v1", "--port", "9", "--replicas", "2"]
    first, again = _commands([*argv, "--ray", "127.0.0.2:6379"], tmp_path)
    assert first[first.index("--spaces-from") + 1] == "CartPole-v1"
    assert "--spaces-from" not in again and "--replicas" not in first + again
    assert first[first.index("--front-end-of") + 1] == "rlserve-learner-x"
    assert first[first.index("--host") + 1] == "127.0.0.3"
    # Their configuration comes back from folders the run wrote: its mapping function is trusted.
    assert "--trust-code" in first and "--trust-code" in again


def test_a_resumed_drivers_new_front_end_starts_from_the_run_folder(tmp_path: Path) -> None:
    argv = ["serve", "--resume", str(tmp_path), "--port", "9", "--ray", "a:1", "--replicas", "2"]
    first, again = _commands(argv, tmp_path)
    assert "--resume" not in first + again
    assert first[first.index("--config-from-run") + 1] == str(tmp_path)
    assert first[first.index("--run-dir") + 1] == str(tmp_path / "front_ends")
    assert "--config-from-run" not in again


def test_the_learner_name_is_read_back_and_names_each_launcher(tmp_path: Path) -> None:
    assert saved_learner_name(tmp_path) is None
    (tmp_path / STATE_FILE).write_text('{"learner_name": "rlserve-learner-abc"}')
    assert saved_learner_name(tmp_path) == "rlserve-learner-abc"
    assert launcher_name("rlserve-learner-abc", "127.0.0.3") == (
        "rlserve-learner-abc-front-end-127.0.0.3"
    )
    (tmp_path / STATE_FILE).write_text("not json")
    assert saved_learner_name(tmp_path) is None


class _Nodes:
    """What ``front_end_nodes`` reads of a cluster: its nodes (the live ones, and a dead one)."""

    def nodes(self) -> list[dict[str, object]]:
        ips = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
        return [{"NodeManagerAddress": ip, "Alive": ip != "127.0.0.5"} for ip in ips]


def test_nodes_where_front_ends_still_run_are_picked_first() -> None:
    assert front_end_nodes(_Nodes(), 2, "127.0.0.2") == ["127.0.0.2", "127.0.0.3"]
    kept = ["127.0.0.4", "127.0.0.5"]
    assert front_end_nodes(_Nodes(), 2, "127.0.0.2", prefer=kept) == ["127.0.0.2", "127.0.0.4"]
