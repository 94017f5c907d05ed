"""What a request body may be: its declared length and its JSON, bounded before they are
trusted, every refusal an :class:`~kvtier.refengine.api.ApiError` (a 400) for the server to
answer instead of a traceback."""

from __future__ import annotations

import json

from kvtier.refengine.api import ApiError

MAX_BODY_BYTES = 8 << 20  # a prompt of token ids for the longest context is far below this
MAX_JSON_DEPTH = 64


def content_length(values: list[str]) -> int:
    """The body's length from the request's Content-Length headers (none: 0); a negative,
    non-numeric or conflicting value is a 400, before any of the body is read."""
    if not values:
        return 0
    if len(set(values)) > 1:
        raise ApiError(f"conflicting Content-Length headers {values}")
    text = values[0].strip()
    if not text.isascii() or not text.isdigit():
        raise ApiError(f"Content-Length must be a whole number of bytes >= 0, got {text!r}")
    return int(text)


def parse_json(data: bytes):
    """``json.loads`` with nesting bounded to MAX_JSON_DEPTH (checked before parsing when the
    body opens that many arrays or objects at all), errors as 400s."""
    if data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH and json_depth(data) > MAX_JSON_DEPTH:
        raise ApiError(f"body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(data)
    except RecursionError:
        raise ApiError(f"body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as error:  # JSONDecodeError, or bytes that are no Unicode
        raise ApiError(f"body is not JSON: {getattr(error, 'msg', error)}") from None


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in ``data``, ignoring brackets in strings."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_JSON_DEPTH:
                break  # deep enough to refuse
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest
