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
