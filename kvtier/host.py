"""This host's memory headroom for a CPU tier, measured now by the headroom probe.

``recommend`` and ``push`` use it when they are not told a number (``--host-headroom-bytes``
or ``--headroom-json``): a CPU tier is never sized or pushed above the memory of the host it
runs on by default. ``root`` is where ``/proc`` and ``/sys`` are (tests give a fake tree).
"""

from __future__ import annotations


def measured_host_limit(root: str = "/"):
    """A :class:`kvtier.policy.recommend.headroom.HostLimit` from the probe's defaults (10% of the
    bound, at least 1 GiB, kept free), or ``None`` if this host's memory cannot be read."""
    from kvtier.policy.recommend.headroom import HostLimit
    from kvtier.probes.active.headroom import HeadroomConfig, measure_headroom

    try:
        headroom = measure_headroom(HeadroomConfig(root=root))
    except (OSError, ValueError):  # no /proc/meminfo (not Linux): the caller says unchecked
        return None
    return HostLimit(headroom.available_bytes, headroom.margin_bytes + headroom.reserve_bytes,
                     f"this host, measured now by the headroom probe (limited by "
                     f"{headroom.limited_by}; margin {headroom.margin_bytes} bytes kept free)")
