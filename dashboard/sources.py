"""Where the dashboard reads from: command-line arguments after ``--``, else environment.

``kvtier dashboard`` passes ``--segments DIR`` (and optionally ``--whatif DIR``,
``--recommendation DIR``, ``--rollouts DIR``, ``--live-curves DIR``) to the Streamlit script;
tests set ``KVTIER_DASHBOARD_SEGMENTS`` and friends instead. The other folders default to
siblings of the segment folder (``kvtier-out/segments`` -> ``kvtier-out/whatif``,
``kvtier-out/recommendation``, ``kvtier-out/rollouts``), the live curves to the folder the
collectors write them in, ``kvtier-out/segments/live_curves``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ENV_SEGMENTS = "KVTIER_DASHBOARD_SEGMENTS"
ENV_WHATIF = "KVTIER_DASHBOARD_WHATIF"
ENV_RECOMMENDATION = "KVTIER_DASHBOARD_RECOMMENDATION"
ENV_ROLLOUTS = "KVTIER_DASHBOARD_ROLLOUTS"
ENV_LIVE_CURVES = "KVTIER_DASHBOARD_LIVE_CURVES"
DEFAULT_SEGMENTS = "kvtier-out/segments"


@dataclass(frozen=True)
class DashboardConfig:
    segments: Path
    whatif: Path
    recommendation: Path
    rollouts: Path  # recorded rollouts: the budget each act was held to
    live_curves: Path | None = None  # the collectors' curve files (default: in the segments)

    def __post_init__(self) -> None:
        if self.live_curves is None:
            object.__setattr__(self, "live_curves", self.segments / "live_curves")
        for name in ("segments", "whatif", "recommendation", "rollouts", "live_curves"):
            if not isinstance(getattr(self, name), Path):
                raise ValueError(f"DashboardConfig.{name} must be a Path, got {getattr(self, name)!r}")

    @classmethod
    def from_sources(cls, argv: Sequence[str], environ: Mapping[str, str]) -> DashboardConfig:
        given = _options(argv, ("--segments", "--whatif", "--recommendation", "--rollouts",
                                "--live-curves"))
        segments = Path(given.get("--segments") or environ.get(ENV_SEGMENTS) or DEFAULT_SEGMENTS)
        whatif = given.get("--whatif") or environ.get(ENV_WHATIF)
        recommendation = given.get("--recommendation") or environ.get(ENV_RECOMMENDATION)
        rollouts = given.get("--rollouts") or environ.get(ENV_ROLLOUTS)
        live = given.get("--live-curves") or environ.get(ENV_LIVE_CURVES)
        return cls(segments,
                   Path(whatif) if whatif else segments.parent / "whatif",
                   Path(recommendation) if recommendation else segments.parent / "recommendation",
                   Path(rollouts) if rollouts else segments.parent / "rollouts",
                   Path(live) if live else None)


def _options(argv: Sequence[str], names: tuple[str, ...]) -> dict[str, str]:
    """``--name VALUE`` and ``--name=VALUE`` pairs for ``names``; everything else is Streamlit's."""
    found, items = {}, list(argv)
    for i, item in enumerate(items):
        name, _, value = item.partition("=")
        if name in names:
            found[name] = value if value else (items[i + 1] if i + 1 < len(items) else "")
    return found
