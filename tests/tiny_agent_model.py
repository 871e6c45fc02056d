"""A tiny Qwen2 checkpoint that answers like a Qwen3 agent: it reasons, says a line, and calls a tool,
in Hermes' format, the same way every time; its chat template renders tools, tool calls and tool
results as Qwen3's does and pre-fills `<think>` in the generation prompt (an empty block instead with
`enable_thinking: false`), so the server's reasoning and tool-call parsing run end to end on a CPU.

How it is scripted: the layers' output projections are zero, so the logits depend on the last token
alone (a bigram model), and each token of REPLY (added to the tokenizer whole, so each has one id
and none repeats) has its own orthogonal embedding that the LM head maps to the next one. The prompt
ends in "\\n" after a pre-filled `<think>`, or in "\\n\\n" after an empty block, and each of those
starts the reply at its point: with reasoning, or at the line before the call.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from tiny_chat_model import CORPUS, SPECIAL_TOKENS

REASONING = ["I will check", " the weather."]
LINE = "Let me look."
CALL_ARGUMENTS = ['{"city": "', "Paris", '", "days": 3}']
# the reply, token by token, after the prompt's "\n"; "\n\n" follows the reasoning, as it follows
# the empty block of a prompt with thinking off. The tags come in two tokens each, so that a
# stream carries them split.
REPLY = [*REASONING, "</th", "ink>", "\n\n", LINE, "<tool_", "call>",
         '\n{"name": "get_weather", "arguments": ', *CALL_ARGUMENTS, "}\n", "</tool_call>"]
EOS = "<|im_end|>"
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}

TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions.\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\nFor each call, return <tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content %}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message.content }}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' + (tool_call.arguments | tojson)"
    " + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)


def make_tiny_agent_model(out_dir: Path, vocab_size: int = 384, seed: int = 0) -> Path:
    import torch
    import transformers
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in REPLY if t != "\n"])
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"])
    hf_tok.chat_template = TEMPLATE
    hf_tok.save_pretrained(out_dir)

    chain = [hf_tok.encode(t, add_special_tokens=False) for t in ["\n", *REPLY, EOS]]
    assert all(len(ids) == 1 for ids in chain), chain
    chain = [ids[0] for ids in chain]
    assert len(set(chain)) == len(chain)

    hidden = 64
    config = transformers.Qwen2Config(
        vocab_size=len(hf_tok), hidden_size=hidden, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=chain[-1],
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream stays the last token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        # orthonormal directions, scaled so the final RMSNorm leaves them as they are
        directions = torch.linalg.qr(torch.randn(hidden, hidden))[0].T[:len(chain)]
        model.model.embed_tokens.weight[chain] = directions * hidden**0.5
        model.lm_head.weight.zero_()
        for current, following in pairwise(chain):
            model.lm_head.weight[following] += 4.0 * directions[chain.index(current)]
    model.save_pretrained(out_dir)
    return out_dir
