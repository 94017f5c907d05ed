"""The dashboard's pages. Each is ``render(ctx: PageContext)``; ``PAGES`` maps the slug used
in ``?page=`` to its title and renderer, in sidebar order."""

from kvtier.dashboard.views import fleet_curves, latency, overview, recommendation, reuse, whatif
from kvtier.dashboard.views.base import PageContext, explain_no_data

PAGES = {
    "overview": ("Hit quality", overview.render),
    "latency": ("Latency by tier", latency.render),
    "reuse": ("Reuse", reuse.render),
    "whatif": ("What-if", whatif.render),
    "live": ("Live curves", fleet_curves.render),
    "recommendation": ("Recommendation", recommendation.render),
}

__all__ = ["PAGES", "PageContext", "explain_no_data"]
