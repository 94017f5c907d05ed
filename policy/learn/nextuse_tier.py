"""A CPU tier that evicts the blocks whose conversation comes back last (learned next use).

Blocks are grouped by the request that last used them (their *owner*); a whole group comes
back when the owner's chain sends its next request, so the tier ranks groups and evicts the
worst group's deepest block first (a prefix without its tail still serves; a tail without its
prefix serves nothing). Ranked first, before any group: *dead* blocks — the owner's chain has
moved on without them (a later request of the chain did not re-send them), or the block is
its prompt's last and such blocks are rarely re-sent (:attr:`Readout.last_block_dead`).

A group's rank comes from :class:`~kvtier.policy.learn.nextuse.NextUseModel` at the time of the
eviction, by :class:`~kvtier.policy.learn.nextuse.Readout`: ``next_use`` (the ``q``-quantile of the
time left until the chain's next request: Belady's order, estimated) or ``reuse_within`` (the
chance the chain comes back within ``horizon_s``). A finished request's view (its gap table,
continue probability and gap scale) and a running one's arrival scale are fixed, so they are
computed for every request at once; the groups are re-ranked when the clock has moved since
the last eviction.

The order runs in the learned kernels (``NextUseOrder``, a tier of the replay core's
protocol): per block a few integers, per request a few floats. It reads the replayed
requests' :class:`~kvtier.policy.learn.signal_table.SignalTable` by request index, so a tier
is built for one replay of those requests.
"""

from __future__ import annotations

import numpy as np

from kvtier.policy.learn.nextuse import NextUseModel, Readout
from kvtier.policy.learn.signal_table import SignalTable
from kvtier.policy.learn.kernels import kernels


class NextUseTier:
    """The learned next-use order as a CPU tier (exclusive flows), for one replay of the
    requests ``signals`` describes."""

    name = "learned-next-use"
    reads_info = False

    def __init__(self, capacity_blocks: int | None, model: NextUseModel, readout: Readout,
                 signals: SignalTable) -> None:
        self.capacity_blocks = capacity_blocks
        self.model = model
        self.readout = readout
        self.signals = signals

    def compiled_tier(self, interner):
        """The kernels' order, with request signals of its own (bound to the flow)."""
        return compiled_order(self.capacity_blocks, self.model, self.readout,
                              compiled_signals(self.signals, self.model))


def compiled_signals(signals: SignalTable, model: NextUseModel):
    """The kernels' ``RequestSignals``: the table's times and successors, and the model's view
    of every request (what a tier would compute of it when it first ranks it)."""
    tables = _tables(model)
    index = {id(t): i for i, t in enumerate(tables)}
    finished, p, scale = model.finished_views(signals.rows)
    return kernels().RequestSignals(signals.arrival_s, signals.finish_s, signals.successor,
                                 signals.blocks, [index[id(t)] for t in finished], p, scale,
                                 model.arrival_scales(signals.rows))


def compiled_order(capacity_blocks: int | None, model: NextUseModel, readout: Readout,
                   request_signals):
    """The kernels' ``NextUseOrder`` over ``request_signals`` (shared when several orders read
    the same requests)."""
    return kernels().NextUseOrder(capacity_blocks, request_signals, gap_tables(model),
                          0 if readout.kind == "next_use" else 1, readout.q, readout.horizon_s,
                          readout.last_block_dead)


def _tables(model: NextUseModel) -> list:
    """Every gap table the model holds: its finish classes', then its running grid's."""
    return [*model.classes.values(), *model.running.tables]


def gap_tables(model: NextUseModel):
    """The model's gap tables as the kernels' ``GapTables``."""
    tables = _tables(model)
    width = max((len(t.quantiles) for t in tables), default=0)
    quantiles = np.zeros((len(tables), width))
    for i, t in enumerate(tables):
        quantiles[i, :len(t.quantiles)] = t.quantiles
    first_running = len(model.classes)
    return kernels().GapTables(quantiles, [len(t.quantiles) for t in tables],
                            [t.never_fraction for t in tables], model.running.elapsed,
                            [first_running + k for k in range(len(model.running.tables))])
