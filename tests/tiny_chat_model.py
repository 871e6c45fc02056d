"""A tiny random Qwen2 checkpoint with a real (trained, byte-level BPE) tokenizer and a ChatML chat
template, written in a second or two with no download, so server tests run on a CPU in CI."""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Hello, world! How are you today? I am fine, thank you.",
    "Paged attention stores the key value cache in fixed size blocks.",
    "for i in range(10):\n    print(i * i)\n",
    "Continuous batching admits new requests at every engine step.",
]


def make_tiny_chat_model(out_dir: Path, vocab_size: int = 512, seed: int = 0) -> Path:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    hf_tok.chat_template = CHATML
    hf_tok.save_pretrained(out_dir)

    eos = hf_tok.convert_tokens_to_ids("<|im_end|>")
    config = transformers.Qwen2Config(
        vocab_size=len(hf_tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # larger logits than the default init, so greedy ties are unlikely
        model.lm_head.weight.normal_(0.0, 0.5)
    model.save_pretrained(out_dir)
    return out_dir
