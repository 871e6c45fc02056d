"""The `hotpath` command: generate, chat, fetch (serve and bench register themselves here too)."""

from __future__ import annotations

import argparse
import itertools
import logging
import sys

from hotpath.engine.args import EngineArgs

_request_ids = itertools.count()


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=512, help="most tokens to generate per reply")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature; 0 = greedy (the default)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass, in (0, 1]")
    g.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens; 0 = all")
    g.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens less likely than min_p times the most likely one")
    g.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 1 discourages tokens already in the prompt or output")
    g.add_argument("--sampling-seed", type=int, default=None,
                   help="per-request seed: the same seed gives the same output")


def _sampling_params(ns: argparse.Namespace):
    from hotpath.sampling_params import SamplingParams

    return SamplingParams(
        max_tokens=ns.max_tokens, temperature=ns.temperature, top_p=ns.top_p, top_k=ns.top_k,
        min_p=ns.min_p, repetition_penalty=ns.repetition_penalty, seed=ns.sampling_seed,
    )


def _build_llm(ns: argparse.Namespace):
    from hotpath.llm import LLM

    return LLM(**vars(EngineArgs.from_cli_args(ns)))


def _stream(llm, prompt_token_ids: list[int], params) -> str:
    """Runs one request, printing its text as it is generated; returns the whole text."""
    engine = llm.engine
    request_id = f"cli-{next(_request_ids)}"
    engine.add_request(request_id, {"prompt_token_ids": prompt_token_ids}, params)
    printed = 0
    text = ""
    while engine.has_unfinished_requests():
        for out in engine.step():
            text = out.outputs[0].text
            sys.stdout.write(text[printed:])
            sys.stdout.flush()
            printed = len(text)
    sys.stdout.write("\n")
    return text


def cmd_generate(ns: argparse.Namespace) -> int:
    llm = _build_llm(ns)
    params = _sampling_params(ns)
    tok = llm.get_tokenizer()
    if not ns.raw and tok.chat_template:
        ids = llm.apply_chat_template([{"role": "user", "content": ns.prompt}])
    else:
        ids = tok.encode(ns.prompt)
    _stream(llm, ids, params)
    return 0


def cmd_chat(ns: argparse.Namespace) -> int:
    llm = _build_llm(ns)
    params = _sampling_params(ns)
    if not llm.get_tokenizer().chat_template:
        print("this model has no chat template; use `hotpath generate --raw`", file=sys.stderr)
        return 2
    messages: list[dict] = []
    if ns.system:
        messages.append({"role": "system", "content": ns.system})
    print("hotpath chat: type a message, /reset to start over, Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if not line.strip():
            continue
        if line.strip() == "/reset":
            messages = messages[:1] if ns.system else []
            continue
        messages.append({"role": "user", "content": line})
        reply = _stream(llm, llm.apply_chat_template(messages), params)
        messages.append({"role": "assistant", "content": reply})


def cmd_fetch(ns: argparse.Namespace) -> int:
    from hotpath.assets import fetch_model

    path = fetch_model(ns.name)
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from hotpath.assets import DEFAULT_MODEL, KNOWN_MODELS

    parser = argparse.ArgumentParser(
        prog="hotpath", description="Serve and run Qwen and Llama models fast."
    )
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="generate a reply to one prompt, streaming it")
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--raw", action="store_true",
                   help="send the prompt as is, without the model's chat template")
    EngineArgs.add_cli_args(p)
    _add_sampling_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="interactive multi-turn chat in the terminal")
    p.add_argument("--system", default=None, help="system prompt")
    EngineArgs.add_cli_args(p)
    _add_sampling_args(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("fetch", help="download a known model into the cache and print its path")
    p.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=sorted(KNOWN_MODELS),
                   help=f"which model (default {DEFAULT_MODEL})")
    p.set_defaults(func=cmd_fetch)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return ns.func(ns)
    except (ValueError, FileNotFoundError) as e:
        print(f"hotpath: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
