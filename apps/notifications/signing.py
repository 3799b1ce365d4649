"""Signed webhook bodies: HMAC-SHA256 over "<timestamp>.<exact body bytes>" with the channel's secret.

A receiver recomputes the HMAC over the raw body it received (before parsing it), compares
in constant time, and refuses timestamps older than a few minutes (replays).
Headers: ``X-Yoloportal-Timestamp: <unix seconds>``,
``X-Yoloportal-Signature: sha256=<hex>``, ``X-Yoloportal-Delivery: <delivery id>``.
"""

from __future__ import annotations

import hashlib
import hmac
import time

TOLERANCE_S = 300


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify(secret: str, *, timestamp: str, body: bytes, signature: str, now: float | None = None) -> bool:
    try:
        stamp = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs((now if now is not None else time.time()) - stamp) > TOLERANCE_S:
        return False
    return hmac.compare_digest(sign(secret, stamp, body), signature or "")
