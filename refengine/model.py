"""A tiny decoder-only transformer with random weights from a seed.

Pre-norm blocks (LayerNorm -> causal self-attention -> LayerNorm -> MLP), learned absolute
position embeddings, a separate output head. The forward pass takes the new tokens and the KV of
every earlier position (gathered from cache blocks) and returns logits plus the new tokens'
K and V, which the caller writes back into blocks. A position's K/V depends only on the
tokens up to it, so cached blocks are exactly reusable.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from kvtier.refengine.config import EngineConfig


class _Layer(nn.Module):
    def __init__(self, config: EngineConfig):
        super().__init__()
        hidden = config.hidden_size
        self.heads, self.head_dim = config.heads, config.head_dim
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x, past_k, past_v):
        """x: [n, hidden]; past_k/v: [p, heads, head_dim]. Returns x, new k, new v ([n, H, D])."""
        n = x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).view(n, 3, self.heads, self.head_dim).unbind(1)
        keys, values = torch.cat([past_k, k]), torch.cat([past_v, v])
        p = past_k.shape[0]
        # new token i (position p+i) sees positions 0..p+i
        mask = torch.ones(n, p + n, dtype=torch.bool, device=x.device).tril(diagonal=p)
        attn = F.scaled_dot_product_attention(q.transpose(0, 1), keys.transpose(0, 1),
                                              values.transpose(0, 1), attn_mask=mask)
        x = x + self.out(attn.transpose(0, 1).reshape(n, -1))
        return x + self.mlp(self.norm2(x)), k, v

    def decode(self, x, past_k, past_v, visible):
        """One new token for each of B sequences. x: [B, hidden]; past_k/v: [B, P, H, D]
        padded; visible: [B, P + 1] bool (a sequence's own past, and the new token)."""
        b = x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).view(b, 3, self.heads, self.head_dim).unbind(1)
        keys = torch.cat([past_k, k[:, None]], dim=1).transpose(1, 2)  # [B, H, P+1, D]
        values = torch.cat([past_v, v[:, None]], dim=1).transpose(1, 2)
        attn = F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=visible[:, None, None])
        x = x + self.out(attn.reshape(b, -1))
        return x + self.mlp(self.norm2(x)), k, v


class TinyDecoder(nn.Module):
    """The reference model. Weights are drawn from ``config.seed`` with a private generator."""

    def __init__(self, config: EngineConfig, device, dtype):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.embed = nn.Embedding(config.vocab_size, hidden)
        self.pos = nn.Embedding(config.max_positions, hidden)
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, config.vocab_size, bias=False)
        self._init_weights(config.seed)
        self.to(device=device, dtype=dtype).eval()

    def _init_weights(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        for name, param in self.named_parameters():
            with torch.no_grad():
                if name.endswith("bias"):
                    param.zero_()
                elif "norm" in name:
                    param.fill_(1.0)
                else:  # unit-variance embeddings, fan-in scaled projections
                    std = 1.0 if name.startswith(("embed", "pos")) else 1 / math.sqrt(param.shape[-1])
                    param.copy_(torch.randn(param.shape, generator=generator) * std)

    @torch.inference_mode()
    def forward(self, token_ids, start_position: int, past_k, past_v):
        """Run ``token_ids`` ([n]) at positions ``start_position...``.

        ``past_k``/``past_v``: [layers, start_position, heads, head_dim]. Returns
        ``(logits of the last token [vocab], new_k, new_v)`` with new_k/v [layers, n, H, D].
        """
        n = token_ids.shape[0]
        if start_position + n > self.config.max_positions:
            raise ValueError(f"sequence of {start_position + n} tokens exceeds "
                             f"max_positions={self.config.max_positions}")
        positions = torch.arange(start_position, start_position + n, device=token_ids.device)
        x = self.embed(token_ids) + self.pos(positions)
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, past_k[i], past_v[i])
            new_k.append(k)
            new_v.append(v)
        logits = self.head(self.norm(x[-1]))
        return logits, torch.stack(new_k), torch.stack(new_v)

    @torch.inference_mode()
    def decode(self, token_ids, positions, past_k, past_v, lengths):
        """Decode one token for each of B sequences at once (continuous batching).

        ``token_ids``, ``positions``, ``lengths``: [B] (a sequence's past length equals its
        position); ``past_k``/``past_v``: [layers, B, P, heads, head_dim], padded to the longest.
        Returns ``(logits [B, vocab], new_k, new_v)`` with new_k/v [layers, B, H, D].
        """
        if int(positions.max()) >= self.config.max_positions:
            raise ValueError(f"position {int(positions.max())} exceeds max_positions={self.config.max_positions}")
        x = self.embed(token_ids) + self.pos(positions)
        span = torch.arange(past_k.shape[2] + 1, device=token_ids.device)
        visible = (span[None, :] < lengths[:, None]) | (span[None, :] == past_k.shape[2])
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            x, k, v = layer.decode(x, past_k[i], past_v[i], visible)
            new_k.append(k)
            new_v.append(v)
        return self.head(self.norm(x)), torch.stack(new_k), torch.stack(new_v)
