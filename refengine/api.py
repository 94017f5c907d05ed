"""The OpenAI completions API shapes: request parsing, a byte tokenizer, response bodies.

Prompts are text (UTF-8 bytes are the token ids, so text needs ``vocab_size >= 256``) or a
list of token ids. Responses carry ``usage.prompt_tokens_details.cached_tokens`` (OpenAI's
field) and a ``kvtier`` object with the tokens each tier served, which the load probe reads.
Decoding is always greedy; ``temperature`` and other sampling fields are accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_TOKENS_DEFAULT = 16


class ApiError(Exception):
    """A bad request: answered with ``status`` and an OpenAI-style error body."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": "invalid_request_error", "code": self.status}}


@dataclass(frozen=True)
class CompletionRequest:
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    model: str


def encode_text(text: str, vocab_size: int) -> list[int]:
    if vocab_size < 256:
        raise ApiError(f"text prompts need vocab_size >= 256 (got {vocab_size}); send token ids")
    return list(text.encode("utf-8"))


def decode_ids(token_ids: list[int]) -> str:
    """Ids below 256 are bytes; larger ids render as ``<id>``."""
    out, pending = [], bytearray()
    for token in token_ids:
        if token < 256:
            pending.append(token)
            continue
        out.append(pending.decode("utf-8", errors="replace"))
        pending.clear()
        out.append(f"<{token}>")
    out.append(pending.decode("utf-8", errors="replace"))
    return "".join(out)


def parse_completion(body, vocab_size: int, model_name: str) -> CompletionRequest:
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        ids = encode_text(prompt, vocab_size)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    else:
        raise ApiError("prompt must be a string or a list of token ids (one prompt per request)")
    if not ids:
        raise ApiError("prompt is empty")
    max_tokens = body.get("max_tokens", MAX_TOKENS_DEFAULT)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ApiError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
    model = body.get("model", model_name)
    if model != model_name:
        raise ApiError(f"model {model!r} not served; this engine serves {model_name!r}", 404)
    options = body.get("stream_options") or {}
    return CompletionRequest(ids, max_tokens, bool(body.get("stream", False)),
                             bool(options.get("include_usage", False)), model_name)


def usage(seq) -> dict:
    cached = seq.served.gpu + seq.served.cpu + seq.served.cold
    return {"prompt_tokens": seq.prompt_len, "completion_tokens": len(seq.output),
            "total_tokens": seq.prompt_len + len(seq.output),
            "prompt_tokens_details": {"cached_tokens": cached}}


def tier_tokens(seq) -> dict:
    served = seq.served
    return {"gpu_hit_tokens": served.gpu, "cpu_promotion_tokens": served.cpu,
            "cold_promotion_tokens": served.cold,
            "recomputed_tokens": seq.prompt_len - served.gpu - served.cpu - served.cold,
            "tier_config_id": seq.tier_config_id}


def completion_body(seq, model: str, created_s: int) -> dict:
    return {"id": seq.request_id, "object": "text_completion", "created": created_s, "model": model,
            "choices": [{"index": 0, "text": decode_ids(seq.output), "token_ids": list(seq.output),
                         "logprobs": None, "finish_reason": "length"}],
            "usage": usage(seq), "kvtier": tier_tokens(seq)}


def chunk_body(request_id: str, model: str, created_s: int, token_ids: list[int],
               finish_reason: str | None = None) -> dict:
    return {"id": request_id, "object": "text_completion", "created": created_s, "model": model,
            "choices": [{"index": 0, "text": decode_ids(token_ids), "token_ids": token_ids,
                         "logprobs": None, "finish_reason": finish_reason}]}
