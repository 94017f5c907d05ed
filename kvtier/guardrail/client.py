"""The command line's side of the collector's ``/guardrail`` page: read the state, send an
operator's signed command (:mod:`kvtier.guardrail.operator`), print the state for a person."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

from kvtier.errors import KvtierError, failure
from kvtier.guardrail.operator import MAC_HEADER, OperatorCommand


class GuardrailClient:
    """A collector's guardrail at ``base`` (``http://HOST:PORT``)."""

    def __init__(self, base: str, timeout_s: float = 10.0):
        self.url, self.timeout_s = base + "/guardrail", timeout_s

    def status(self) -> dict:
        return self._call(urllib.request.Request(self.url))

    def command(self, token: bytes, action: str, instance: str, directions: tuple[str, ...],
                tier: str | None) -> dict:
        try:
            command = OperatorCommand(action, instance, directions, tier, time.time(),
                                      uuid.uuid4().hex)
        except ValueError as error:
            raise KvtierError(str(error)) from None
        body, mac = command.signed(token)
        return self._call(urllib.request.Request(
            self.url, body, {"Content-Type": "application/json", MAC_HEADER: mac}, method="POST"))

    def _call(self, request) -> dict:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as error:
            try:
                said = json.loads(error.read()).get("error")
            except (ValueError, AttributeError):
                said = None
            if error.code == 404 and said is None:
                raise failure(f"{self.url}: not found; is this a kvtier collector with its "
                              "guardrail on (--guardrail observe or act)?") from None
            raise KvtierError(f"the collector refused: {said or error}",
                              2 if error.code in (400, 403, 404, 409) else 1) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise failure(f"cannot reach the collector at {self.url} ({reason}); is `kvtier "
                          "collect` running, and is --collector its --metrics-port?") from None


def print_status(status: dict, moves: int = 10) -> None:
    budget = status["budget"]
    print(f"guardrail {status['mode']}: p99 TTFT <= {budget['ttft_p99_s']:g} s, ITL <= "
          f"{budget['itl_p99_s']:g} s over {budget['window_s']} s windows, sustained "
          f"{budget['sustained_s']} s; hold {status['hold_s']:g} s; control channel "
          f"{', '.join(status['channel']) if status['channel'] else 'closed (no token)'}")
    if not status["instances"]:
        print("no instance has sent requests yet")
    for instance in status["instances"]:
        _instance(instance, moves)


def _instance(instance: dict, moves: int) -> None:
    rule = instance["rule"]
    paused = ", ".join(f"{d} from {t}" for d, t in instance["paused"]) or "nothing"
    ran = ", ".join(f"{d} from {t}" for d, t in instance["engine_paused"]) or "nothing"
    print(f"\n{instance['instance']} ({instance['engine']}, {instance['configured'] or 'no tier configuration yet'}): "
          f"{instance['requests']} requests")
    print(f"  holds paused: {paused}{' (operator)' if instance['operator_hold'] else ''}; "
          f"the engines' newest request ran with paused: {ran}")
    print(f"  window p99: TTFT {_s(rule['ttft_p99_s'])}, ITL {_s(rule['itl_p99_s'])}"
          + (f"; over budget since {_clock(rule['breaching_since_s'])}" if rule["breaching_since_s"] else ""))
    if instance["fallbacks"]:
        print("  recomputed instead of loaded: " + ", ".join(
            f"{n} requests ({instance['fallback_tokens'].get(r, 0)} tokens) {r}"
            for r, n in sorted(instance["fallbacks"].items())))
    for move in instance["moves"][-moves:]:
        seen = "" if move["ttft_p99_s"] is None else f", TTFT p99 {move['ttft_p99_s']:.3f} s"
        print(f"  {_clock(move['time_s'])}  {move['actor']:<8} {move['action']:<6} "
              f"{move['direction']} {move['tier']}  ({move['reason']}{seen}"
              f"{', ' + move['mode'] if move['mode'] else ''})")


def _s(value) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _clock(time_s: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(time_s))
