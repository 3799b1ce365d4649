"""Fault injection for the tests: a process that dies, or code that raises, at a named point.

``YOLOPORTAL_FAULT=<point>`` ends the process there without a word (SIGKILL-like: nothing
after it runs, an open transaction is never committed); ``<point>:raise`` raises there
instead. Unset in any real installation: then :func:`fault_point` does nothing.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def fault_point(point: str) -> None:
    wanted = os.environ.get("YOLOPORTAL_FAULT", "")
    if wanted == point:
        log.error("fault injection: exiting at %s", point)
        os._exit(17)
    if wanted == f"{point}:raise":
        raise RuntimeError(f"fault injection: raised at {point}")
