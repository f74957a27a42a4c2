"""docs/protocol.md section 12 is what the server sends today (scripts/protocol_examples.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "protocol_examples.py"
sys.path.insert(0, str(SCRIPT.parent))

import protocol_examples  # noqa: E402


@pytest.mark.timeout(180)
def test_generated_examples_match_a_live_server():
    """Runs the generator in check mode against two real servers; prints the diff on failure."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=ROOT,
    )
    assert result.returncode == 0, (
        "docs/protocol.md or docs/protocol-vectors/ differ from what the server sends today; "
        "regenerate with: .venv/bin/python scripts/protocol_examples.py\n"
        + result.stdout[-20000:]
        + result.stderr[-5000:]
    )


def test_splice_replaces_only_between_markers():
    doc = (
        "prose\n<!-- generated:a -->\nold\n<!-- /generated -->\nmore prose "
        "<!-- generated:b -->x<!-- /generated --> end\n"
    )
    out = protocol_examples.splice(doc, {"a": "new\nlines", "b": "y"})
    assert out == (
        "prose\n<!-- generated:a -->\nnew\nlines\n<!-- /generated -->\nmore prose "
        "<!-- generated:b -->y<!-- /generated --> end\n"
    )


def test_splice_refuses_unknown_and_orphan_blocks():
    with pytest.raises(KeyError, match="not generated"):
        protocol_examples.splice("<!-- generated:zz -->\n<!-- /generated -->", {})
    with pytest.raises(KeyError, match="without a marker"):
        protocol_examples.splice("no markers", {"a": "x"})


def test_every_marker_in_the_doc_is_closed():
    text = (ROOT / "docs" / "protocol.md").read_text()
    opened = text.count("<!-- generated:")
    assert opened > 40
    assert opened == text.count("<!-- /generated -->")
    assert opened == len(protocol_examples.MARKER.findall(text))


def test_numbers_within_tolerance_keep_a_block_as_committed():
    """Last digits that differ between CPUs do not count; anything else does."""
    same = protocol_examples.same_within_tolerance
    old = "the logits\n`[0.0008278705645352602, 0.0001813415001379326]`, choice `1` (`48 87 31 bf`)"
    assert same(old, old.replace("0.0001813415001379326", "0.0001813415583455935"))
    assert not same(old, old.replace("0.0001813415001379326", "0.0001913415001379326"))
    assert not same(old, old.replace("`1`", "`0`"))  # integers are exact
    assert not same(old, old.replace("48 87", "49 87"))  # so are bytes
    assert not same(old, old.replace("choice", "action"))
    assert not same("OpenBLAS 0.3.31", "OpenBLAS 0.3.30")  # not a number


def _weights_reply(arrays):
    return {"type": "weights", "id": 2, "version": 0, "model": {"obs_dim": 2}, "arrays": arrays}


def test_weights_within_tolerance_are_shown_as_committed():
    import numpy as np

    from rlserve.protocol.codec import encode_json

    committed = {"w": np.array([[0.25, -0.0041], [0.5, 1e-7]], np.float32)}
    moved = {"w": committed["w"] + np.float32(1.5e-6)}  # as between two MKL code paths
    norm = protocol_examples.Normaliser(committed=protocol_examples.Committed(committed))
    assert norm.weights(_weights_reply(moved))["arrays"] is committed
    far = {"w": committed["w"] + np.float32(1e-4)}
    assert norm.weights(_weights_reply(far))["arrays"] is far
    other = {"w": committed["w"][:1]}
    assert norm.weights(_weights_reply(other))["arrays"] is other
    assert norm.weights({"type": "pong", "id": 1}) == {"type": "pong", "id": 1}
    # The HTTP form: the JSON the server writes, with the committed numbers.
    text = encode_json(_weights_reply(moved)).decode()
    assert norm.weights_json(text) == encode_json(_weights_reply(committed)).decode()
    assert norm.weights_json(text.replace(",", ", ")) == text.replace(",", ", ")  # not ours


def test_a_log_probability_within_tolerance_is_shown_as_committed():
    import numpy as np

    committed = protocol_examples.Committed(logp=np.float32(-0.6934704780578613))
    assert committed.log_probability(np.float32(-0.69347054)) == committed.logp
    assert committed.log_probability(np.float32(-0.6935)) == np.float32(-0.6935)
    assert protocol_examples.Committed().log_probability(np.float32(-1.5)) == np.float32(-1.5)
