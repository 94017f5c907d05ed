"""After a push, the promise watched live: the collector runs ``kvtier recommend --check``'s
check (:func:`kvtier.policy.recommend.promises.check_promises`) on its own store every
refresh, for the tier configuration the ``--recommendation`` it exports would run, and says
whether each promise holds.

The verdict goes where ``recommend --check`` puts it, ``recommendation.check.json`` beside the
recommendation (with ``watched_s``: when the collector last checked), so the collector's
``kvtier_recommendation_info`` carries it and the dashboard's recommendation page shows it;
and it is exported per promise (``kvtier_promise_holds``: 1 held, 0 not; absent until there
are enough requests to judge; ``kvtier_promise_value`` by ``kind``: predicted, low, high,
measured; ``kvtier_promise_requests`` and ``_requests_needed``).

An ingest observer of the collector service (``refresh()`` on the service's thread); it
reads the store the service writes (:meth:`PromiseWatch.start`), as ``--check --store`` does.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Callable

from kvtier.collector.exports.prometheus import Sample

log = logging.getLogger(__name__)


class PromiseWatch:
    """The live check of the recommendation at ``path`` (see module doc)."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time):
        self.path, self._clock = Path(path), clock
        self._store = None
        self.result = None  # the last PromiseCheck
        self.problem: str | None = None  # why there is none

    def start(self, store) -> None:
        """Read requests from ``store`` (the service's) from now on."""
        self._store = store

    def observe(self, batch) -> None:
        """The check reads the store itself: nothing to keep per batch."""

    def flush(self) -> None:
        """Nothing held back."""

    def export(self, folder) -> None:
        """The verdict is written beside the recommendation at each refresh."""

    def refresh(self) -> None:
        if self._store is None or not self.path.is_file():
            return
        try:
            result = self._check()
        except (OSError, ValueError, KeyError) as error:
            if self.problem != str(error):
                log.warning("promise watch on %s: %s", self.path, error)
            self.problem, self.result = str(error), None
            return
        self.problem, self.result = None, result
        self._keep(result)

    def _check(self):
        from kvtier.collector.reader import StoreReader
        from kvtier.policy.recommend.promises import check_promises
        from kvtier.policy.recommend.recommendation import from_json

        doc = json.loads(self.path.read_text())
        rec = from_json(doc)
        engine = doc.get("engine") or ("vllm" if rec.for_engine("vllm") is not None else None)
        config = pushed_tier_config(rec, engine)
        records = list(StoreReader(self._store, tier_config_id=config).requests())
        served = rec.evidence.served_tier_config
        before = (list(StoreReader(self._store, tier_config_id=served).requests())
                  if served and served != config else [])
        return check_promises(rec, engine, records, config, served=before)

    def _keep(self, result) -> None:
        """``recommend --check``'s file, replaced in one rename."""
        from kvtier.collector import json_text
        from kvtier.collector.exports.recommendation import CHECK_FILE
        from kvtier.verbs.recommend_check import _as_json  # the one form of a verdict

        path = self.path.with_name(CHECK_FILE)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            json_text.write(partial, {**_as_json(result), "watched_s": self._clock()})
            os.replace(partial, path)
        except OSError as error:
            log.warning("promise watch: %s not written: %s", path, error.strerror or error)

    def samples(self):
        result = self.result
        if result is None:
            return
        labels = {"tier_config": result.tier_config}
        yield Sample("kvtier_promise_requests", "Requests under the pushed tier configuration",
                     result.requests, labels)
        yield Sample("kvtier_promise_requests_needed", "Requests the check waits for before it "
                     "judges", result.needed, labels)
        for promise in result.promises:
            metric = {**labels, "metric": promise.metric}
            for kind in ("predicted", "low", "high", "measured"):
                value = getattr(promise, kind)
                if value is not None:
                    yield Sample("kvtier_promise_value", "A promise's prediction, its interval "
                                 "and the measurement", value, {**metric, "kind": kind})
            if result.enough and promise.held is not None:
                yield Sample("kvtier_promise_holds", "1 while the measurement is inside the "
                             "promised interval, 0 when it is not", float(promise.held), metric)


def pushed_tier_config(rec, engine: str | None) -> str:
    """The tier configuration kvtier's vLLM connector stamps on the requests of an engine
    running the recommendation's settings (as ``recommend --check`` derives it);
    ``ValueError`` for another engine (its requests carry no configuration kvtier can
    derive)."""
    if engine != "vllm":
        raise ValueError(f"the promise is watched for vLLM's settings only, not {engine!r}")
    from kvtier.policy.writers.vllm import transfer_config
    from kvtier.probes.vllm.hook_settings import offload_tier_config

    settings = rec.for_engine(engine) or rec.settings
    config = offload_tier_config(transfer_config(settings)["kv_connector_extra_config"])
    if config is None:
        raise ValueError("the recommendation's vLLM settings have no CPU tier to watch")
    return config
