"""What torch.onnx and its graph optimiser print during an export that tells a user nothing.

:func:`quiet_exporter` hides those known-harmless notes for the length of one export, each by
its logger and message, so every other warning and error still shows.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

EXPORTER_LOGGER = "torch.onnx._internal.exporter._registration"
"""The logger of torch.onnx's operator registry: it notes each torchvision operator it skips
when torchvision (which rlserve does not use) is not installed."""

DEDUPLICATION_LOGGER = "onnx_ir.passes.common.initializer_deduplication"
"""The logger of the optimiser's pass that merges equal constants (onnx_ir, run by
``torch.onnx.export``)."""


class _SkipGraphOutputNote(logging.Filter):
    """Drops the deduplication pass's note that a constant is also a graph output.

    A Gaussian policy's ``log_std`` output is a constant of the graph, which the pass must
    leave alone; its other notes (an initializer without a value: an invalid model) still show.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            str(record.msg).startswith("Skipped deduplication of initializer")
            and "is a graph input or output" in str(record.msg)
        )


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Hide torch.onnx's known-harmless notes for the length of one export.

    Its registry's torchvision notes, the optimiser's note about a constant output
    (:class:`_SkipGraphOutputNote`), a FutureWarning of torch's own pytree code (``LeafSpec``)
    and the note that two inputs share the batch axis; every other warning still shows.
    """
    registry = logging.getLogger(EXPORTER_LOGGER)
    level = registry.level
    registry.setLevel(logging.ERROR)
    deduplication = logging.getLogger(DEDUPLICATION_LOGGER)
    note = _SkipGraphOutputNote()
    deduplication.addFilter(note)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore",
                message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                category=FutureWarning,
            )
            # A policy with memory ties its two inputs' batch axes to one dimension, as meant.
            warnings.filterwarnings(
                "ignore", message=r"# The axis name: batch will not be used", category=UserWarning
            )
            yield
    finally:
        deduplication.removeFilter(note)
        registry.setLevel(level)
