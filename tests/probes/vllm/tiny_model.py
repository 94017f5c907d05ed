"""Builds the real-engine tests' model, with no download: a random-weight Llama (2 layers,
hidden 128, 4 heads of 32, vocabulary 2,048) and a byte-level BPE tokenizer trained here with
the ``tokenizers`` library on generated words. About 6 s, 1.7 MB.

Runs in the vLLM environment (it has torch, transformers and tokenizers):
``python tiny_model.py OUT_DIR``. Not a test module.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

VOCAB_SIZE = 2048


def build(out: Path, seed: int = 0) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(6000)]
    corpus = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(3000)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         head_dim=32, max_position_embeddings=4096, bos_token_id=0,
                         eos_token_id=1, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
