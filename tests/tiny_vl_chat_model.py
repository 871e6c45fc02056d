"""A tiny random Qwen3-VL checkpoint with a real byte-level BPE tokenizer that has Qwen's vision
special tokens, a Qwen3-VL-style chat template and preprocessing configs for small images and
videos: image-text chat (offline and served) on a CPU in a few seconds, with no download.

    path = make_tiny_vl_chat_model(tmp_path)
    LLM(str(path)).chat([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}},
        {"type": "text", "text": "What is in the picture?"}]}])

The HF model with the same weights, for parity tests:
transformers.Qwen3VLForConditionalGeneration.from_pretrained(path) (fp32; well under a second).
"""

from __future__ import annotations

import json
from pathlib import Path

from tiny_chat_model import CORPUS, SPECIAL_TOKENS
from tiny_models import TINY_CONFIGS

VISION_TOKENS = {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
                 "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>"}

# Qwen3-VL's template, cut to what the tests need: string or part-list content, images and videos
# (transformers' {"type": "image"} parts and OpenAI's / vLLM's image_url / video_url parts) as the
# vision placeholders the processor expands
CHAT_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part.type in ('image', 'image_url') -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part.type in ('video', 'video_url') -%}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif part.type == 'text' -%}{{ part.text }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message.role + '\\n' }}{{ render(message.content) }}{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# images of 4 to 64 visual tokens; videos of 4 to 8 frames, 4 to 128 tokens in all
PREPROCESSOR = {"size": {"shortest_edge": 4 * 1024, "longest_edge": 64 * 1024}, "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5]}
VIDEO_PREPROCESSOR = {**PREPROCESSOR, "size": {"shortest_edge": 4 * 1024, "longest_edge": 256 * 1024},
                      "fps": 2, "min_frames": 4, "max_frames": 8}


def make_tiny_vl_chat_model(out_dir: Path, seed: int = 0) -> Path:
    """Writes the checkpoint to out_dir and returns out_dir. The vision token ids in config.json
    are the tokenizer's; the vocabulary is the tokenizer's (about 500 tokens)."""
    import torch
    import transformers

    tokenizer = _tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)

    kwargs = TINY_CONFIGS["qwen3vl"][1]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = {key: tokenizer.convert_tokens_to_ids(token) for key, token in VISION_TOKENS.items()}
    text_config = {**kwargs["text_config"], "vocab_size": len(tokenizer), "bos_token_id": None,
                   "eos_token_id": eos, "max_position_embeddings": 1024}
    config = transformers.Qwen3VLConfig(text_config=text_config, vision_config=kwargs["vision_config"], **ids)
    torch.manual_seed(seed)
    model = transformers.Qwen3VLForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):  # not the default 1 / 0: stricter parity
                p.add_(torch.randn_like(p) * 0.1)
        model.lm_head.weight.normal_(0.0, 0.5)  # larger logits, so greedy ties are unlikely
    model.save_pretrained(out_dir)
    (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    (out_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    (out_dir / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PREPROCESSOR))
    return out_dir


def _tokenizer():
    """tiny_chat_model.py's byte-level BPE with the vision tokens as special tokens, trained also on
    the timestamp text Qwen3-VL writes before each video frame ("<1.5 seconds>")."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = SPECIAL_TOKENS + list(VISION_TOKENS.values())
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    timestamps = " ".join(f"<{t / 2:.1f} seconds>" for t in range(40))
    tok.train_from_iterator((CORPUS + [timestamps, "What is in the picture? Describe the video."]) * 20, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=specials[1:],
    )
