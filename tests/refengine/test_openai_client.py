"""The reference engine's HTTP API against the official ``openai`` Python client: what the
client library sends and parses, not only what kvtier's own load probe does."""

from __future__ import annotations

import openai
import pytest

from kvtier.refengine.server import MODEL_NAME, EngineServer, ServerSettings
from tests.refengine.conftest import prompt, tiny_config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def client():
    server = EngineServer(tiny_config(gpu_blocks=40), ServerSettings(port=0)).start()
    try:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    finally:
        server.stop()


def test_a_completion_with_token_ids_and_the_clients_extra_fields(client):
    reply = client.completions.create(
        model=MODEL_NAME, prompt=prompt(1), max_tokens=4, temperature=0,
        extra_body={"kv_transfer_params": {"kvtier": {"session_id": "s-1"}}},
        extra_headers={"X-Request-Id": "client-1"})
    (choice,) = reply.choices
    assert reply.model == MODEL_NAME and choice.finish_reason == "length"
    assert reply.usage.prompt_tokens == 13 and reply.usage.completion_tokens == 4


def test_a_stream_parses_chunk_by_chunk_with_usage(client):
    chunks = list(client.completions.create(
        model=MODEL_NAME, prompt=prompt(2), max_tokens=3, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    with_choices = [c for c in chunks if c.choices]
    tokens = [c for c in with_choices if c.choices[0].finish_reason is None]
    assert len(tokens) == 3 and with_choices[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 3


def test_an_unknown_model_is_the_clients_not_found_error(client):
    with pytest.raises(openai.NotFoundError, match="not served"):
        client.completions.create(model="other", prompt=prompt(3), max_tokens=2)
