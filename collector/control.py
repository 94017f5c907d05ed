"""The control channel's messages: what kvtier's collector tells its connector inside an engine
("pause loads from tier T", "pause stores to tier T", "resume"), and how the connector knows
the message is genuine. Standard library only: both ends import it, one of them inside an
engine process.

A message is the whole state the engine should run, never a change: the tiers whose loads
or stores are paused (empty: the engine's configured tiers), whether the per-request
load-or-recompute is on (``act``) and the link costs it prices loads with. The sender repeats
it every heartbeat; that repetition is also the engine's lease (``collector/control_receiver.py``).

Two ZMQ frames: the body (JSON, at most :data:`MAX_MESSAGE_BYTES`) and its HMAC-SHA256 under
the token both ends share. The token never travels; a message without the right MAC is
dropped. ``epoch`` (the sender's start, milliseconds) and ``sequence`` only grow, and
``issued_s`` must be close to the receiver's clock, so a recorded message cannot be played
again. ``instance`` names the serving instance (``kvtier_instance``) the state is for.

:func:`tier_config_label` is the tier configuration a paused engine stamps on its requests:
its configured one, and ``;paused=`` the paused directions and tiers
(``gpu+cpu:8388608;paused=loads:cpu``), so phases compare in the store.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from dataclasses import dataclass, field

FORMAT = "kvtier.control/1"
DEFAULT_CONTROL_ENDPOINT = "tcp://127.0.0.1:5571"
MAX_MESSAGE_BYTES = 4096
DIRECTIONS = ("loads", "stores")
TIERS = ("cpu", "cold")  # the offloading tiers, by the schema's Tier labels
PAUSED_MARK = ";paused="
MIN_TOKEN_BYTES = 16
# why a receiver dropped a message: the labels of kvtier_guardrail_rejected_messages_total
REJECT_REASONS = ("oversized", "malformed", "unauthorised", "stale", "rate")


class ControlError(ValueError):
    """A message that is dropped; ``reason`` is one of :data:`REJECT_REASONS`."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class LinkCosts:
    """What the per-request load-or-recompute prices with (calibrated, seconds): a load job's
    fixed cost, each byte's transfer, and recomputing one prompt token."""

    load_s_per_job: float
    load_s_per_byte: float
    recompute_s_per_token: float

    def __post_init__(self) -> None:
        for name in ("load_s_per_job", "load_s_per_byte", "recompute_s_per_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def load_wait_s(self, jobs: int, nbytes: int) -> float:
        """The expected wait for a load with ``jobs`` jobs and ``nbytes`` bytes ahead of its
        end (its own included)."""
        return jobs * self.load_s_per_job + nbytes * self.load_s_per_byte

    def recompute_s(self, tokens: int) -> float:
        return tokens * self.recompute_s_per_token


@dataclass(frozen=True)
class Command:
    """The state one instance's engines should run (see module doc)."""

    instance: str
    epoch: int
    sequence: int
    issued_s: float
    paused: frozenset[tuple[str, str]] = field(default_factory=frozenset)  # (direction, tier)
    act: bool = False
    costs: LinkCosts | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.instance, str) or not self.instance:
            raise ValueError(f"instance must be a non-empty string, got {self.instance!r}")
        for name in ("epoch", "sequence"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
                raise ValueError(f"{name} must be an int in 0..2**63-1, got {value!r}")
        if not isinstance(self.issued_s, (int, float)) or not math.isfinite(self.issued_s):
            raise ValueError(f"issued_s must be a finite number, got {self.issued_s!r}")
        for pause in self.paused:
            if not (isinstance(pause, tuple) and len(pause) == 2 and pause[0] in DIRECTIONS
                    and pause[1] in TIERS):
                raise ValueError(f"paused entries are (direction, tier) with direction in "
                                 f"{DIRECTIONS} and tier in {TIERS}, got {pause!r}")
        if not isinstance(self.act, bool):
            raise ValueError(f"act must be a bool, got {self.act!r}")

    @property
    def position(self) -> tuple[int, int]:
        return self.epoch, self.sequence


def check_token(token: bytes) -> bytes:
    """The shared token, refused when shorter than :data:`MIN_TOKEN_BYTES` bytes."""
    if not isinstance(token, (bytes, bytearray)) or len(token) < MIN_TOKEN_BYTES:
        raise ValueError(f"the control token must hold at least {MIN_TOKEN_BYTES} bytes "
                         "(e.g. `openssl rand -hex 32`)")
    return bytes(token)


def encode(command: Command, token: bytes) -> list[bytes]:
    """The two frames of ``command``, signed with ``token``."""
    body = {"format": FORMAT, "instance": command.instance, "epoch": command.epoch,
            "sequence": command.sequence, "issued_s": command.issued_s,
            "paused": sorted(list(p) for p in command.paused), "act": command.act}
    if command.costs is not None:
        body["costs"] = {"load_s_per_job": command.costs.load_s_per_job,
                         "load_s_per_byte": command.costs.load_s_per_byte,
                         "recompute_s_per_token": command.costs.recompute_s_per_token}
    data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    return [data, hmac.new(token, data, hashlib.sha256).digest()]


def decode(frames, token: bytes) -> Command:
    """The command in ``frames``; :class:`ControlError` naming why it is dropped. The size is
    checked before anything else, the MAC before the body is parsed."""
    if sum(len(f) for f in frames) > MAX_MESSAGE_BYTES + 64:
        raise ControlError("oversized", f"above {MAX_MESSAGE_BYTES} bytes")
    if len(frames) != 2:
        raise ControlError("malformed", f"expected 2 frames (body, mac), got {len(frames)}")
    body, mac = bytes(frames[0]), bytes(frames[1])
    if not hmac.compare_digest(mac, hmac.new(token, body, hashlib.sha256).digest()):
        raise ControlError("unauthorised", "the MAC does not match the shared token")
    try:
        data = json.loads(body)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} message")
        costs = data.get("costs")
        return Command(data["instance"], data["epoch"], data["sequence"], data["issued_s"],
                       frozenset(tuple(p) for p in data.get("paused") or () if isinstance(p, list)),
                       data.get("act", False), None if costs is None else LinkCosts(**costs))
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as error:
        raise ControlError("malformed", str(error) or type(error).__name__) from None


def tier_config_label(configured: str | None, paused) -> str | None:
    """The tier configuration an engine with ``paused`` (direction, tier) pairs stamps on its
    requests (see module doc); ``configured`` unchanged when nothing is paused."""
    if not paused or configured is None:
        return configured
    return configured + PAUSED_MARK + ",".join(f"{d}:{t}" for d, t in sorted(paused))


def configured_part(tier_config: str) -> str:
    """The configured tier configuration of a label :func:`tier_config_label` made."""
    return tier_config.split(PAUSED_MARK, 1)[0]


def paused_part(tier_config: str) -> frozenset[tuple[str, str]]:
    """The (direction, tier) pairs a label names as paused (none for a configured one)."""
    _, mark, paused = tier_config.partition(PAUSED_MARK)
    pairs = (item.split(":", 1) for item in paused.split(",") if ":" in item) if mark else ()
    return frozenset((d, t) for d, t in pairs if d in DIRECTIONS and t in TIERS)


def newest_tier(tier_config: str) -> str | None:
    """The newest offloading tier of a configuration in the rollout's form
    (``gpu+cpu:<bytes>``: ``cpu``; ``gpu+cpu+file:<bytes>``: ``cold``); ``None`` without one."""
    tiers = configured_part(tier_config).split(":", 1)[0].split("+")
    if len(tiers) < 2 or tiers[0] != "gpu":
        return None
    return "cpu" if tiers[-1] == "cpu" else "cold"
