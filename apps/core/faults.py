"""Fault injection for the tests: a process that dies, or code that raises, at a named point.

``YOLOPORTAL_FAULT=<point>`` ends the process there without a word (SIGKILL-like: nothing
after it runs, an open transaction is never committed); ``<point>@N`` the N-th time it gets
there; ``<point>:raise`` raises there instead (a bug of ours). Unset in any real installation:
then :func:`fault_point` does nothing.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)
_hits: dict[str, int] = {}


def fault_point(point: str) -> None:
    wanted = os.environ.get("YOLOPORTAL_FAULT", "")
    if wanted == f"{point}:raise":
        raise RuntimeError(f"fault injection: raised at {point}")
    name, _, nth = wanted.partition("@")
    if name != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] >= int(nth or 1):
        log.error("fault injection: exiting at %s (time %d)", point, _hits[point])
        os._exit(17)
