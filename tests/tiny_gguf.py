"""A tiny random Qwen2 GGUF whose linear layers use every GGUF type hotpath keeps quantized, with
the projections of one fused layer in different types (layer 0's attn_v in Q8_0 beside attn_q /
attn_k in Q5_0, as llama.cpp's Q4_K_M mixes them), and its converted model directory."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hotpath.ops.gguf.reference import random_blocks

HIDDEN, INTER, HEADS, KV_HEADS, VOCAB = 256, 256, 4, 2, 128
LAYER_TYPES = [
    {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q4_1",
     "ffn_gate": "Q4_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K"},
    {"attn_q": "Q4_0", "attn_k": "Q4_0", "attn_v": "Q4_0", "attn_output": "Q5_1",
     "ffn_gate": "Q5_K", "ffn_up": "Q5_K", "ffn_down": "Q8_0"},
]
OUTPUT_TYPE = "Q8_0"  # the untied LM head
EMBED_TYPE = "Q5_0"  # the embedding, as in Qwen2.5-Coder-0.5B's Q4_K_M file


def write_tiny_gguf(path: Path, seed: int = 0, tied: bool = False) -> None:
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(len(LAYER_TYPES))

    def f32(name: str, *shape: int, scale: float = 0.1, offset: float = 0.0) -> None:
        writer.add_tensor(name, (offset + scale * rng.standard_normal(shape)).astype(np.float32))

    def quant(name: str, qtype: str, rows: int, cols: int) -> None:
        writer.add_tensor(name, random_blocks(qtype, rows, cols, rng),
                          raw_dtype=gguf.GGMLQuantizationType[qtype])

    head_dim = HIDDEN // HEADS
    quant("token_embd.weight", EMBED_TYPE, VOCAB, HIDDEN)
    for i, types in enumerate(LAYER_TYPES):
        p = f"blk.{i}."
        f32(p + "attn_norm.weight", HIDDEN, offset=1.0)
        f32(p + "ffn_norm.weight", HIDDEN, offset=1.0)
        shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (KV_HEADS * head_dim, HIDDEN),
                  "attn_v": (KV_HEADS * head_dim, HIDDEN), "attn_output": (HIDDEN, HIDDEN),
                  "ffn_gate": (INTER, HIDDEN), "ffn_up": (INTER, HIDDEN), "ffn_down": (HIDDEN, INTER)}
        for proj, (rows, cols) in shapes.items():
            quant(f"{p}{proj}.weight", types[proj], rows, cols)
            if proj in ("attn_q", "attn_k", "attn_v"):
                f32(f"{p}{proj}.bias", rows)
    f32("output_norm.weight", HIDDEN, offset=1.0)
    if not tied:  # a tied model's LM head is its embedding
        quant("output.weight", OUTPUT_TYPE, VOCAB, HIDDEN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def qwen2_config(tied: bool = False) -> dict:
    from transformers import Qwen2Config

    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER,
        num_hidden_layers=len(LAYER_TYPES), num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        max_position_embeddings=1024, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2,
    ).to_dict()
    config["architectures"] = ["Qwen2ForCausalLM"]
    return config


def make_tiny_gguf_dir(tmp: Path, monkeypatch, tied: bool = False) -> Path:
    """The tiny GGUF converted as hotpath converts any GGUF (config.json from qwen2_config in place
    of transformers' GGUF parsing, which needs a tokenizer in the file), cached under `tmp`."""
    from hotpath.loader import gguf as gguf_loader

    def config_only(gguf_path: Path, out: Path) -> None:
        (out / "config.json").write_text(json.dumps(qwen2_config(tied)))

    monkeypatch.setattr(gguf_loader, "_write_config_and_tokenizer", config_only)
    path = tmp / f"tiny-qwen2{'-tied' if tied else ''}.gguf"
    write_tiny_gguf(path, tied=tied)
    return gguf_loader.gguf_to_hf_dir(path, cache_dir=tmp / "cache")
