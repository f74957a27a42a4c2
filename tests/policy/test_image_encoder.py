"""Image observations: detection, the encoder's choice and its wire form (torch-free)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlserve.errors import ConfigError
from rlserve.policy import ModelSpec, NumpyPolicy
from rlserve.policy.encoder_choice import (
    NATURE_FILTERS,
    SMALL_FILTERS,
    channels_first,
    choose_encoder,
    image_leaves,
    network_input,
)
from rlserve.policy.image_encoder import EncoderLayer, ImageEncoder, ObservationEncoder


def _box(shape: tuple[int, ...], dtype: type = np.uint8) -> gym.spaces.Box:
    high = 255 if dtype == np.uint8 else 1.0
    return gym.spaces.Box(0, high, shape, dtype)


def test_channels_order_follows_the_smallest_side() -> None:
    assert not channels_first((84, 84, 4))
    assert channels_first((4, 84, 84))
    assert not channels_first((7, 7, 3))
    assert channels_first((3, 10, 10))


def test_auto_picks_nature_for_large_images_and_the_small_stack_for_grids() -> None:
    encoder = choose_encoder(_box((84, 84, 4)))
    assert encoder is not None and encoder.input_dim == 84 * 84 * 4
    (large,) = encoder.images
    assert [(x.size, x.kernel[0], x.stride[0]) for x in large.layers[:3]] == list(NATURE_FILTERS)
    assert large.layers[3].kind == "linear" and large.output_dim == 512
    assert large.divisor == 255.0 and not large.channels_first
    assert large.feature_maps()[-1] == (64, 7, 7)
    (grid,) = choose_encoder(_box((3, 7, 7), np.float32)).images  # type: ignore[union-attr]
    assert grid.channels_first and grid.divisor == 1.0
    assert [(x.size, x.kernel[0], x.stride[0]) for x in grid.layers] == list(SMALL_FILTERS)
    assert grid.output_dim == 64 * 4 * 4
    assert [layer.name for layer in grid.layers] == ["encoder.0.0", "encoder.0.2", "encoder.0.4"]
    assert [layer.name for layer in large.layers] == [f"encoder.0.{i}" for i in (0, 2, 4, 7)]


def test_vectors_and_tiny_boards_stay_mlp_and_mlp_turns_the_encoder_off() -> None:
    assert choose_encoder(gym.spaces.Box(-1, 1, (4,), np.float32)) is None
    board = gym.spaces.Box(0, 1, (3, 3, 2), np.int8)  # PettingZoo's tictactoe board
    assert choose_encoder(board) is None
    masked = gym.spaces.Dict({"observation": board, "action_mask": gym.spaces.MultiBinary(9)})
    assert choose_encoder(masked) is None
    connect_four = gym.spaces.Box(0, 1, (6, 7, 2), np.int8)
    (grid,) = choose_encoder(connect_four).images  # type: ignore[union-attr]
    assert grid.divisor == 1.0 and grid.feature_maps()[-1] == (64, 3, 4)
    assert choose_encoder(_box((8, 8, 3)), "mlp") is None
    with pytest.raises(ConfigError, match="need an image observation"):
        choose_encoder(gym.spaces.Box(-1, 1, (4,)), "nature")


def test_conv_filters_replace_the_stack() -> None:
    encoder = choose_encoder(_box((1, 4, 4)), conv_filters=[[2, 2, 2]])
    assert encoder is not None and encoder.output_dim == 2 * 2 * 2


def test_filters_that_shrink_the_image_to_nothing_are_one_clear_line() -> None:
    with pytest.raises(ConfigError) as caught:
        choose_encoder(_box((7, 7, 3)), conv_filters=[[16, 4, 2], [32, 4, 2]])
    message = str(caught.value)
    assert "\n" not in message
    assert "(7, 7, 3)" in message and "[[16, 4, 2], [32, 4, 2]]" in message
    assert "smaller kernels" in message


def test_a_dict_gets_one_encoder_per_image_and_passes_the_rest() -> None:
    space = gym.spaces.Dict(
        {
            "camera": _box((8, 8, 3)),
            "depth": _box((1, 6, 6), np.float32),
            "speed": gym.spaces.Box(-1, 1, (2,)),
            "tiny": _box((2, 2, 2)),  # under 4x4: passes to the MLP as it is
        }
    )
    encoder = choose_encoder(space)
    assert encoder is not None and encoder.input_dim == gym.spaces.flatdim(space)
    starts = {key: start for key, start in zip(space.spaces, _starts(space), strict=True)}
    assert [(i.start, i.shape) for i in encoder.images] == [
        (starts["camera"], (8, 8, 3)),
        (starts["depth"], (1, 6, 6)),
    ]
    assert [i.layers[0].name for i in encoder.images] == ["encoder.0.0", "encoder.1.0"]
    passed = 2 + 8  # speed and tiny
    assert encoder.output_dim == 64 * 5 * 5 + 64 * 3 * 3 + passed
    assert choose_encoder(space, "mlp") is None


def _starts(space: gym.spaces.Dict) -> list[int]:
    sizes = [gym.spaces.flatdim(part) for part in space.spaces.values()]
    return [sum(sizes[:k]) for k in range(len(sizes))]


def test_images_inside_tuples_and_beside_a_mask_are_found() -> None:
    image = _box((6, 6, 2))
    space = gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(3), "observations": image})
    assert network_input(space) is image
    nested = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Tuple((image,))))
    assert image_leaves(nested) == [(3, image)]


def _tiny_spec() -> ModelSpec:
    encoder = choose_encoder(_box((1, 4, 4), np.float32), conv_filters=[[2, 2, 2]])
    return ModelSpec(16, ("actor.0",), "relu", "categorical", 3, encoder=encoder)


def _image_wire(wire: dict) -> dict:  # type: ignore[type-arg]
    image: dict = wire["encoder"]["images"][0]  # type: ignore[type-arg]
    return image


def test_the_encoder_round_trips_on_the_wire() -> None:
    spec = _tiny_spec()
    wire = spec.to_wire()
    assert wire["encoder"] == {
        "input_dim": 16,
        "images": [
            {
                "kind": "conv",
                "start": 0,
                "shape": [1, 4, 4],
                "channels_first": True,
                "divisor": 1.0,
                "activation": "relu",
                "layers": [
                    {
                        "name": "encoder.0.0",
                        "kind": "conv",
                        "size": 2,
                        "kernel": [2, 2],
                        "stride": [2, 2],
                    }
                ],
            }
        ],
    }
    assert ModelSpec.from_wire(wire) == spec
    assert "encoder" not in ModelSpec(3, ("actor.0",), "tanh", "categorical", 2).to_wire()


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("kind", "transformer", "unknown encoder kind"),
        ("shape", [4, 4], "3 sides"),
        ("layers", [{"name": "e", "kind": "pool", "size": 2}], "unknown encoder layer kind"),
        ("shape", [1, 1, 16], "shrink"),
        ("start", 1, "past the input's 16"),
    ],
)
def test_a_malformed_encoder_is_refused(field: str, value: object, match: str) -> None:
    wire = _tiny_spec().to_wire()
    _image_wire(wire)[field] = value
    with pytest.raises(ConfigError, match=match):
        ModelSpec.from_wire(wire)


def test_an_encoder_of_the_wrong_size_or_with_normalisation_is_refused() -> None:
    encoder = _tiny_spec().encoder
    with pytest.raises(ConfigError, match="the first layer's input has 15"):
        ModelSpec(15, ("actor.0",), "relu", "categorical", 3, encoder=encoder)
    with pytest.raises(ConfigError, match="raw pixels"):
        ModelSpec(
            16,
            ("actor.0",),
            "relu",
            "categorical",
            3,
            obs_mean=(0.0,) * 16,
            obs_std=(1.0,) * 16,
            obs_clip=5.0,
            encoder=encoder,
        )


def test_weights_of_the_wrong_shape_are_refused() -> None:
    spec = _tiny_spec()
    weights = {
        "encoder.0.0.weight": np.zeros((2, 1, 3, 3), np.float32),
        "encoder.0.0.bias": np.zeros(2, np.float32),
        "actor.0.weight": np.zeros((3, 8), np.float32),
        "actor.0.bias": np.zeros(3, np.float32),
    }
    with pytest.raises(ConfigError, match=r"expected \[2, 1, 2, 2\]"):
        NumpyPolicy(spec, weights, 0)
    del weights["encoder.0.0.weight"]
    with pytest.raises(ConfigError, match="missing"):
        NumpyPolicy(spec, weights, 0)


def test_an_encoder_past_its_linear_layers_is_refused() -> None:
    linear = EncoderLayer("e.1", "linear", 4)
    conv = EncoderLayer("e.0", "conv", 2, (2, 2), (1, 1))
    with pytest.raises(ConfigError, match="before its linear"):
        ImageEncoder((4, 4, 1), False, 1.0, (linear, conv))


def test_overlapping_images_are_refused() -> None:
    conv = EncoderLayer("e.0", "conv", 2, (2, 2), (1, 1))
    first = ImageEncoder((4, 4, 1), False, 1.0, (conv,), 0)
    second = ImageEncoder((4, 4, 1), False, 1.0, (conv,), 8)
    with pytest.raises(ConfigError, match="not overlap"):
        ObservationEncoder(40, (first, second))


def test_an_image_too_large_for_int64_counts_its_values_exactly() -> None:
    # np.prod wraps in int64: 2**66 values would count as 0 and match a 0-wide input.
    encoder = ImageEncoder((2**22, 2**22, 2**22), False, 1.0, ())
    assert encoder.input_dim == 2**66
