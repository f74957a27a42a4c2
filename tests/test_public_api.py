"""The public surface of ``rlserve`` and its promise not to import torch."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

import rlserve
from rlserve import errors

EXPECTED_ALL = {
    "AlgorithmConfig",
    "AuthenticationError",
    "CapacityError",
    "ClientClosedError",
    "ConfigError",
    "ConnectionLostError",
    "DQNConfig",
    "EpisodeError",
    "EpisodeLostError",
    "PPOConfig",
    "SACConfig",
    "LocalConfig",
    "PolicyClient",
    "ProtocolError",
    "RLServeError",
    "RequestTimeoutError",
    "ServerError",
    "SpaceError",
    "TLSError",
    "VersionMismatchError",
    "__version__",
}


def test_all_is_the_expected_surface() -> None:
    assert set(rlserve.__all__) == EXPECTED_ALL
    assert len(rlserve.__all__) == len(set(rlserve.__all__))


def test_all_names_exist() -> None:
    for name in rlserve.__all__:
        assert hasattr(rlserve, name), name


def test_no_public_name_outside_all() -> None:
    # Everything public that is not a subpackage must be listed in __all__.
    public = {
        name
        for name in vars(rlserve)
        if not name.startswith("_") and not isinstance(getattr(rlserve, name), types.ModuleType)
    }
    assert public == EXPECTED_ALL - {"__version__"}


def test_version_matches_the_distribution() -> None:
    from importlib.metadata import version

    assert rlserve.__version__ == version("rlserve")


NOT_ERRORS = {
    "AlgorithmConfig",
    "DQNConfig",
    "LocalConfig",
    "PPOConfig",
    "PolicyClient",
    "SACConfig",
    "__version__",
}


@pytest.mark.parametrize("name", sorted(EXPECTED_ALL - NOT_ERRORS))
def test_exported_errors_are_the_errors_module_classes(name: str) -> None:
    cls = getattr(rlserve, name)
    assert cls is getattr(errors, name)
    assert issubclass(cls, rlserve.RLServeError)


def test_client_errors_map_from_codes() -> None:
    assert isinstance(errors.error_for_code("episode_error", "m", 3), rlserve.EpisodeError)
    assert isinstance(errors.error_for_code("capacity", "m"), rlserve.CapacityError)
    assert isinstance(errors.error_for_code("unauthorized", "m"), rlserve.AuthenticationError)
    assert isinstance(errors.error_for_code("bad_value", "m"), rlserve.SpaceError)
    err = errors.error_for_code("something_new", "m", 9)
    assert type(err) is rlserve.ServerError
    assert err.code == "something_new"
    assert err.request_id == 9


_NO_TORCH = """
import sys
{imports}
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
assert not loaded, loaded
print("ok")
"""


@pytest.mark.parametrize(
    "imports",
    [
        "import rlserve\nfrom rlserve import PolicyClient",
        "import rlserve.protocol.spaces, rlserve.policy, rlserve.protocol.fragment",
        "import rlserve.protocol.codec, rlserve.protocol.framing, rlserve.protocol.messages",
    ],
    ids=["client", "spaces-policy-samples", "protocol"],
)
def test_import_does_not_load_torch(imports: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _NO_TORCH.format(imports=imports)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_no_torch_check_can_fail() -> None:
    # Guard against a check that passes vacuously: importing torch must trip it.
    result = subprocess.run(
        [sys.executable, "-c", _NO_TORCH.format(imports="import rlserve.learners.ppo")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "torch" in result.stderr


def test_the_serving_process_never_imports_torch() -> None:
    # Only the learner process trains; the serving side (CLI, server, demo) stays torch-free,
    # which keeps its memory small and its start fast.
    code = (
        "import sys, rlserve.cli.commands, rlserve.cli.demo, rlserve.server.app, "
        "rlserve.learners.ppo_config;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_module_paths_before_the_layered_layout_still_import() -> None:
    # Paths the README of 0.1 showed (and every other moved module) keep working, each as
    # another name of the one module, with a DeprecationWarning naming the new path.
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import rlserve.cli.demo, rlserve.server.policies\n"
        "try:\n"
        "    import rlserve.demo\n"
        "except DeprecationWarning as e:\n"
        "    print(e)\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "import rlserve.demo, rlserve.samples\n"
        "from rlserve.algorithms.ppo_config import PPOSettings\n"
        "from rlserve.learners.ppo_config import PPOSettings as New\n"
        "from rlserve.protocol.fragment import Fragment\n"
        "print(rlserve.demo is rlserve.cli.demo, rlserve.demo.TASKS is rlserve.cli.demo.TASKS)\n"
        "print(PPOSettings is New, rlserve.samples.Fragment is Fragment)\n"
        "print(rlserve.cli.demo.__spec__.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "rlserve.demo is now rlserve.cli.demo: import it from there",
        "True True",
        "True True",
        "rlserve.cli.demo",
    ]
