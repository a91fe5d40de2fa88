"""What every traced graph shares: the opset and a tracer that keeps its warnings to itself."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

# Opset 17: LayerNormalization as one op, and what every provider ortinf targets implements.
OPSET = 17


@contextlib.contextmanager
def quiet_tracing() -> Iterator[None]:
    """Silences the tracer's warnings: export verification checks the graph, not the warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
