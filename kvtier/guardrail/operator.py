"""An operator's pause or resume, over the collector's HTTP port (``POST /guardrail``), and the
guardrail's state (``GET /guardrail``): what ``kvtier guardrail`` sends and reads.

A command is JSON (``action``: pause or resume, ``instance``, ``directions``: loads and/or
stores, ``tier``: cpu, cold or absent for the instance's newest, ``issued_s``, ``nonce``) with
its HMAC-SHA256 under the control channel's shared token in the ``X-Kvtier-Mac`` header: the
token never travels, a command signed otherwise is refused (403), and one issued more than
:data:`MAX_AGE_S` from the collector's clock, or seen before, is refused too (409).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Callable

from kvtier.collector.control import DIRECTIONS, TIERS

MAC_HEADER = "x-kvtier-mac"
MAX_AGE_S = 60.0


@dataclass(frozen=True)
class OperatorCommand:
    """One operator command (see module doc)."""

    action: str
    instance: str
    directions: tuple[str, ...]
    tier: str | None
    issued_s: float
    nonce: str

    def __post_init__(self) -> None:
        if self.action not in ("pause", "resume"):
            raise ValueError(f"action must be pause or resume, got {self.action!r}")
        if not isinstance(self.instance, str) or not self.instance:
            raise ValueError(f"instance must be a non-empty string, got {self.instance!r}")
        if not self.directions or any(d not in DIRECTIONS for d in self.directions):
            raise ValueError(f"directions must be some of {', '.join(DIRECTIONS)}, got {self.directions!r}")
        if self.tier is not None and self.tier not in TIERS:
            raise ValueError(f"tier must be one of {', '.join(TIERS)}, got {self.tier!r}")

    def signed(self, token: bytes) -> tuple[bytes, str]:
        """The body and its MAC (hex) to send."""
        body = json.dumps({"action": self.action, "instance": self.instance,
                           "directions": list(self.directions), "tier": self.tier,
                           "issued_s": self.issued_s, "nonce": self.nonce}).encode()
        return body, hmac.new(token, body, hashlib.sha256).hexdigest()


class OperatorDesk:
    """The ``/guardrail`` route of a collector whose guardrail is ``guardrail``; ``token``
    (``None``: no channel) authenticates commands."""

    def __init__(self, guardrail, token: bytes | None, *, clock: Callable[[], float] = time.time):
        self.guardrail, self._token, self._clock = guardrail, token, clock
        self._nonces: dict[str, float] = {}

    def __call__(self, method: str, body: bytes, headers: dict) -> tuple[int, dict]:
        if method == "GET":
            return 200, self.guardrail.status()
        if method != "POST":
            return 405, {"error": "GET the state, or POST a signed command"}
        if self._token is None:
            return 409, {"error": "this collector has no control channel: start it with "
                                  "--guardrail-token-file"}
        mac = headers.get(MAC_HEADER, "")
        expected = hmac.new(self._token, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(mac, expected):
            return 403, {"error": "the command's MAC does not match the collector's token"}
        try:
            command = OperatorCommand(**_fields(json.loads(body)))
        except (ValueError, TypeError) as error:
            return 400, {"error": f"not a guardrail command: {error}"}
        refused = self._fresh(command)
        if refused:
            return 409, {"error": refused}
        try:
            move = self.guardrail.operate(command.instance, command.action, command.directions,
                                          command.tier)
        except KeyError:
            known = ", ".join(self.guardrail.instances()) or "none yet"
            return 404, {"error": f"no instance {command.instance!r} has sent requests "
                                  f"(known: {known})"}
        except ValueError as error:
            return 409, {"error": str(error)}
        return 200, {"moved": move.action, "instance": command.instance,
                     "tier_config": move.tier_config_id, "command": move.command}

    def _fresh(self, command: OperatorCommand) -> str | None:
        now = self._clock()
        self._nonces = {n: t for n, t in self._nonces.items() if now - t <= 2 * MAX_AGE_S}
        if abs(now - command.issued_s) > MAX_AGE_S:
            return f"the command was issued {now - command.issued_s:+.0f} s from now; send it again"
        if command.nonce in self._nonces:
            return "this command was already received"
        self._nonces[command.nonce] = now
        return None


def _fields(data) -> dict:
    if not isinstance(data, dict):
        raise ValueError("a JSON object is expected")
    return {"action": data.get("action"), "instance": data.get("instance"),
            "directions": tuple(data.get("directions") or ()), "tier": data.get("tier"),
            "issued_s": float(data.get("issued_s")), "nonce": str(data.get("nonce"))}
