"""Small display filters for the pages."""

from __future__ import annotations

from django import template
from django.utils import timezone
from django.utils.timesince import timesince, timeuntil

register = template.Library()


@register.filter
def mib(value) -> str:
    """MiB → '16 GiB', '512 MiB'."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return ""
    if value >= 1024:
        return f"{value / 1024:.1f}".removesuffix(".0") + " GiB"
    return f"{value:.0f} MiB"


@register.filter
def seconds(value) -> str:
    """Seconds → '2 h 5 min', '45 s'."""
    try:
        value = int(value)
    except (TypeError, ValueError):
        return ""
    days, rest = divmod(value, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "", f"{minutes} min" if minutes else ""]
    text = " ".join(p for p in parts if p)
    return text or f"{secs} s"


@register.filter
def gpu_hours(value) -> str:
    """GPU-hours as every page shows them: up to three decimals, trailing zeros dropped, and a
    use too small for those as '< 0.001', never 0. The usage page read "0.00 / 0.02 h" while the
    Teams page said "you: 0.003 h" of the same use (manager trial 15, F21)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "–"
    if 0 < value < 0.0005:
        return "< 0.001"
    return f"{value:.3f}".rstrip("0").rstrip(".")


@register.filter
def metric(value) -> str:
    """A metric to three decimals; empty when missing."""
    try:
        return f"{float(value):.3f}"
    except (TypeError, ValueError):
        return "–"


@register.filter
def get(mapping, key):
    return mapping.get(key) if hasattr(mapping, "get") else None


@register.filter
def ahead(moment) -> bool:
    """Whether a moment is still to come. An estimated start that has passed while the job waits
    reads "any moment", not "in 0 minutes" (nor, in yoloq, "likely 2 s ago to 10 s"; a new-user trial)."""
    return bool(moment) and moment > timezone.now()


@register.filter
def ago(moment) -> str:
    """'5 minutes ago', 'just now' under a minute: Django's ``timesince`` says '0 minutes' (trial 16, G14)."""
    if not moment:
        return ""
    if (timezone.now() - moment).total_seconds() < 60:
        return "just now"
    return f"{timesince(moment)} ago"


@register.filter
def until(moment) -> str:
    """How long until a moment still to come: '5 minutes', 'under a minute' (``timeuntil`` says
    '0 minutes' for the last minute; trial 16, G14). Callers check :func:`ahead` first."""
    if not moment:
        return ""
    if (moment - timezone.now()).total_seconds() < 60:
        return "under a minute"
    return timeuntil(moment)


# Priority factor → its name for people (docs/scheduling.md, "Priority").
FACTOR_NAMES = {"fairshare": "fair-share", "age": "age", "size": "size", "class": "class"}


@register.filter
def priority_help(factors) -> str:
    """What a waiting job's priority score is, for its tooltip, with the job's factors when given.

    The page showed the bare score ("medium 23985.333", a new-user trial): a weighted sum only
    the scheduler compares. ``static/portal/job.js`` rebuilds the same text as the factors change.
    """
    text = ("The scheduler starts waiting jobs in order of this score, highest first. It adds up weighted "
            "factors from 0 to 1: fair-share (higher when your team and you have used less lately), age "
            "(time waited), size (smaller jobs score higher) and class.")
    if factors:
        # In the documented order, not the stored one (PostgreSQL's jsonb orders keys by length).
        ordered = [k for k in FACTOR_NAMES if k in factors] + [k for k in factors if k not in FACTOR_NAMES]
        text += " This job: " + " · ".join(f"{FACTOR_NAMES.get(k, k)} {float(factors[k]):.2f}" for k in ordered) + "."
    return text
