"""Image observations end to end: a real server, remote and local clients, a conv policy.

The observation is a small uint8 image (channels-last); the server's learner trains a conv
encoder on it and publishes it in the model spec; a local client runs it with numpy. A wrong
image (shape or dtype) is refused and the episode carries on; filters that do not fit the image
are refused before the server listens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from e2e_support import small_ppo
from gymnasium import spaces

from rlserve import PolicyClient, SpaceError
from rlserve.client.local import LocalConfig
from rlserve.protocol.spaces import describe

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

IMAGE = spaces.Box(0, 255, (6, 6, 2), np.uint8)
ACTION_SPACE = spaces.Discrete(3)
SMALL_PPO = small_ppo("--ppo-conv-filters", "4,2,1", "8,2,2")
QUICK = LocalConfig(batch_steps=32, batch_interval=0.1)


def _spaces_file(tmp_path: Path) -> Path:
    path = tmp_path / "spaces.json"
    described = {"observation_space": describe(IMAGE), "action_space": describe(ACTION_SPACE)}
    path.write_text(json.dumps(described))
    return path


def _play(client: PolicyClient, seed: int, steps: int = 120) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(steps // 20):
        eid = client.start_episode()
        for _ in range(20):
            image = rng.integers(0, 256, IMAGE.shape).astype(np.uint8)
            action = int(client.get_action(eid, image))
            assert 0 <= action < 3
            client.log_returns(eid, float(action == int(image[0, 0, 0] > 127)))
        client.end_episode(eid, rng.integers(0, 256, IMAGE.shape).astype(np.uint8))


def _wrong_images_are_refused(client: PolicyClient) -> None:
    eid = client.start_episode()
    good = np.zeros(IMAGE.shape, np.uint8)
    client.get_action(eid, good)
    with pytest.raises(SpaceError):
        client.get_action(eid, np.zeros((6, 5, 2), np.uint8))
    with pytest.raises(SpaceError):
        client.get_action(eid, np.full(IMAGE.shape, 0.5, np.float32))
    client.get_action(eid, good)  # the episode carries on
    client.end_episode(eid, good)


def test_a_conv_policy_in_both_modes(launch_server: Any, tmp_path: Path) -> None:
    server = launch_server(
        *SMALL_PPO, "--seed", "3", spaces=("--spaces-file", str(_spaces_file(tmp_path)))
    )
    server.wait_for_weights(0)
    for mode, seed in (("remote", 1), ("local", 2)):
        local = QUICK if mode == "local" else None
        with PolicyClient(server.address, inference_mode=mode, local=local, timeout=30) as client:
            _play(client, seed)
            _wrong_images_are_refused(client)
            if mode == "local":
                spec = client.local.policy.spec  # type: ignore[union-attr]
                assert spec.encoder is not None
                (image,) = spec.encoder.images
                assert image.shape == (6, 6, 2) and image.divisor == 255.0
    metrics = server.wait_until(
        lambda m: m.get("learner/steps_trained", 0) > 0 and m["server/weights_version"] >= 1,
        what="an update trained on the image steps",
    )
    assert metrics["learner/fragments_excluded_invalid"] == 0


def test_filters_that_shrink_the_image_are_refused_before_listening(
    run_rlserve: Any, tmp_path: Path
) -> None:
    done = run_rlserve(
        "serve",
        "--spaces-file",
        str(_spaces_file(tmp_path)),
        "--ppo-conv-filters",
        "8,4,2",
        "16,4,2",
        "--run-dir",
        str(tmp_path / "runs"),
        "--port",
        "0",
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "shrink the (6, 6, 2) image to nothing" in done.stderr
    assert "Traceback" not in done.stderr and "listening" not in done.stdout
