"""Where the dashboard reads from: command-line arguments after ``--``, else environment.

``kvtier dashboard`` passes ``--segments DIR`` (and optionally ``--whatif DIR``,
``--recommendation DIR``) to the Streamlit script; tests set ``KVTIER_DASHBOARD_SEGMENTS``
and friends instead. The what-if and recommendation folders default to siblings of the
segment folder (``kvtier-out/segments`` -> ``kvtier-out/whatif``, ``kvtier-out/recommendation``).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ENV_SEGMENTS = "KVTIER_DASHBOARD_SEGMENTS"
ENV_WHATIF = "KVTIER_DASHBOARD_WHATIF"
ENV_RECOMMENDATION = "KVTIER_DASHBOARD_RECOMMENDATION"
DEFAULT_SEGMENTS = "kvtier-out/segments"


@dataclass(frozen=True)
class DashboardConfig:
    segments: Path
    whatif: Path
    recommendation: Path

    def __post_init__(self) -> None:
        for name in ("segments", "whatif", "recommendation"):
            if not isinstance(getattr(self, name), Path):
                raise ValueError(f"DashboardConfig.{name} must be a Path, got {getattr(self, name)!r}")

    @classmethod
    def from_sources(cls, argv: Sequence[str], environ: Mapping[str, str]) -> DashboardConfig:
        parser = argparse.ArgumentParser(add_help=False)
        parser.add_argument("--segments", default=environ.get(ENV_SEGMENTS, DEFAULT_SEGMENTS))
        parser.add_argument("--whatif", default=environ.get(ENV_WHATIF))
        parser.add_argument("--recommendation", default=environ.get(ENV_RECOMMENDATION))
        args, _ = parser.parse_known_args(list(argv))
        segments = Path(args.segments)
        return cls(segments,
                   Path(args.whatif) if args.whatif else segments.parent / "whatif",
                   Path(args.recommendation) if args.recommendation else segments.parent / "recommendation")
