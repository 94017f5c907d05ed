"""A model folder for Dynamo's mocker, built with the standard library: a Llama
``config.json`` (the mocker reads the geometry, never weights) and a word-level
``tokenizer.json`` (Hugging Face's format, read by Dynamo's Rust tokenizer) over generated
words, so prompts made of :data:`WORDS` are one token per word."""

from __future__ import annotations

import json
import random
from pathlib import Path

SPECIAL = ("<s>", "</s>", "<unk>")


def _words(count: int, seed: int = 0) -> tuple[str, ...]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: dict[str, None] = {}
    while len(words) < count:
        words["".join(rng.choice(letters) for _ in range(rng.randint(3, 7)))] = None
    return tuple(words)


WORDS = _words(2045)


def build(out: Path) -> Path:
    """Write ``config.json``, ``tokenizer.json`` and ``tokenizer_config.json`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    vocab = {token: i for i, token in enumerate((*SPECIAL, *WORDS))}
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "vocab_size": len(vocab), "hidden_size": 128, "intermediate_size": 256,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
              "head_dim": 32, "max_position_embeddings": 4096, "bos_token_id": 0,
              "eos_token_id": 1, "torch_dtype": "float16", "tie_word_embeddings": False}
    added = [{"id": i, "content": token, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for i, token in enumerate(SPECIAL)]
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
                 "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
                 "post_processor": None, "decoder": None,
                 "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
    tokenizer_config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                        "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast",
                        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}
    for name, value in (("config.json", config), ("tokenizer.json", tokenizer),
                        ("tokenizer_config.json", tokenizer_config)):
        (out / name).write_text(json.dumps(value))
    return out
