"""Calibration for AWQ and GPTQ: token batches from a prompt set, the source model in HF
transformers, and its decoder layers run one at a time on the captured inputs of the first.

The model is read tensor by tensor into an HF model built from the config (GGUF-converted
directories too); its decoder layers are then run in turn: each layer's inputs are the previous
layer's outputs with the previous layers already quantized, as AWQ and GPTQ both do."""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from hotpath.loader.gguf import weights_dir
from hotpath.loader.safetensors import iterate_safetensors

CALIBRATION_SETS = ("humaneval", "sharegpt", "random")
# the families whose decoder layers hold self_attn.{q,k,v,o}_proj and mlp.{gate,up,down}_proj
DENSE_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def calibration_tokens(source: Path, calibration: str, num_samples: int, seq_len: int,
                       vocab_size: int, seed: int = 0) -> torch.Tensor:  # [num_samples, seq_len]
    """`calibration`: a prompt set (humaneval, sharegpt; fetched on first use), `random` token ids
    (tests), or the path of a text file. Texts are tokenized, joined and cut into samples."""
    if num_samples < 1 or seq_len < 1:
        raise ValueError(f"num_samples and seq_len must be >= 1, got {num_samples} and {seq_len}")
    g = torch.Generator().manual_seed(seed)
    if calibration == "random":
        return torch.randint(0, vocab_size, (num_samples, seq_len), generator=g)
    from transformers import AutoTokenizer

    texts = _texts(calibration)
    random.Random(seed).shuffle(texts)
    tokenizer = AutoTokenizer.from_pretrained(source)
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text)["input_ids"])
        if len(ids) >= num_samples * seq_len:
            break
    if len(ids) < num_samples * seq_len:
        raise ValueError(f"calibration text {calibration!r} has {len(ids)} tokens, fewer than "
                         f"num_samples x seq_len = {num_samples * seq_len}")
    return torch.tensor(ids[:num_samples * seq_len]).view(num_samples, seq_len)


def _texts(calibration: str) -> list[str]:
    if calibration in ("humaneval", "sharegpt"):
        from hotpath.bench.datasets import _sharegpt_first_turns, fetch_dataset

        path = fetch_dataset(calibration)
        if calibration == "sharegpt":
            return _sharegpt_first_turns(path)
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(line)["prompt"] for line in f if line.strip()]
    path = Path(calibration)
    if not path.is_file():
        raise ValueError(f"calibration must be one of {', '.join(CALIBRATION_SETS)} or a text file; "
                         f"{calibration!r} is neither")
    text = path.read_text(encoding="utf-8", errors="replace")
    return [text[i:i + 20000] for i in range(0, len(text), 20000)]


def load_hf_model(source: Path, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """The source checkpoint in an HF transformers model (read one tensor at a time)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source)
    arch = (getattr(config, "architectures", None) or ["?"])[0]
    if arch not in DENSE_ARCHITECTURES:
        raise ValueError(f"awq and gptq quantize dense models ({', '.join(DENSE_ARCHITECTURES)}); "
                         f"{source} is {arch}")
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    params = model.state_dict()
    for name, tensor in iterate_safetensors(weights_dir(source, dtype), desc="reading the model"):
        if name not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no place in the HF model")
        params[name].copy_(tensor)
    return model


class _Captured(Exception):
    pass


class LayerRunner:
    """Runs the decoder layers one at a time over the calibration samples, in chunks of
    `chunk` samples: `run(i)` gives layer i's outputs for the current inputs; `advance`
    makes them the next layer's inputs."""

    def __init__(self, model: nn.Module, tokens: torch.Tensor, chunk: int = 8) -> None:
        self.layers = model.model.layers
        device = next(model.parameters()).device
        self.inputs: list[torch.Tensor] = []  # per chunk, [chunk, seq_len, hidden]
        self.kwargs: list[dict[str, Any]] = []  # per chunk: masks, position embeddings

        def capture(module: nn.Module, args: tuple, kwargs: dict) -> None:
            kwargs = dict(kwargs)
            hidden = args[0] if args else kwargs.pop("hidden_states")
            self.inputs.append(hidden)
            self.kwargs.append(kwargs)
            raise _Captured

        handle = self.layers[0].register_forward_pre_hook(capture, with_kwargs=True)
        try:
            with torch.no_grad():
                for start in range(0, tokens.shape[0], chunk):
                    try:
                        model(tokens[start:start + chunk].to(device), use_cache=False)
                    except _Captured:
                        pass
        finally:
            handle.remove()

    @torch.no_grad()
    def run(self, index: int, hooks: dict[nn.Module, Callable[[torch.Tensor], None]] | None = None
            ) -> list[torch.Tensor]:
        """Layer `index` over every chunk; each hooked module's 2D input goes to its hook."""
        handles = [m.register_forward_hook(lambda mod, args, out, f=f: f(args[0].reshape(-1, args[0].shape[-1])))
                   for m, f in (hooks or {}).items()]
        try:
            outputs = []
            for hidden, kwargs in zip(self.inputs, self.kwargs):
                out = self.layers[index](hidden, **kwargs)
                outputs.append(out[0] if isinstance(out, tuple) else out)
            return outputs
        finally:
            for h in handles:
                h.remove()

    def advance(self, outputs: list[torch.Tensor]) -> None:
        self.inputs = outputs
