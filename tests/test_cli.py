"""The `hotpath` command as a user runs it: a subprocess, real arguments, real stdin."""

import argparse
import os
import subprocess
import sys

import pytest

from hotpath import LLM, SamplingParams


def hotpath(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    # wide enough that argparse wraps no help line: tests look for phrases in it
    env = {**os.environ, "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "hotpath.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def offline(tiny_chat_model):
    return LLM(str(tiny_chat_model), device="cpu", max_model_len=256)


def test_generate_streams_the_chat_answer(tiny_chat_model, offline):
    r = hotpath("generate", "Hello, world!", "--model", str(tiny_chat_model), "--device", "cpu",
                "--max-model-len", "256", "--max-tokens", "12")
    assert r.returncode == 0, r.stderr
    want = offline.chat([{"role": "user", "content": "Hello, world!"}],
                        SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    assert r.stdout == want[0].outputs[0].text + "\n"


# the tiny model's reply to this prompt ends with EOS after 24 tokens
ENDS_AFTER_24 = "for i in range(10):\n    print(i * i)\n"


@pytest.mark.parametrize("max_tokens, finish", [(12, "length"), (40, "stop")])
def test_generate_says_when_max_tokens_cut_the_reply(tiny_chat_model, offline, max_tokens, finish):
    r = hotpath("generate", ENDS_AFTER_24, "--model", str(tiny_chat_model), "--device", "cpu",
                "--max-model-len", "256", "--max-tokens", str(max_tokens))
    assert r.returncode == 0, r.stderr
    want = offline.chat([{"role": "user", "content": ENDS_AFTER_24}],
                        SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)[0].outputs[0]
    assert want.finish_reason == finish and r.stdout == want.text + "\n"
    notice = f"[stopped at max_tokens={max_tokens}; raise --max-tokens for more]"
    assert (notice in r.stderr) == (finish == "length"), r.stderr
    assert "context limit" not in r.stderr


def test_generate_says_when_the_context_limit_cut_the_reply(tiny_chat_model):
    # the 34-token prompt leaves room for 14 of the reply's 24 tokens
    r = hotpath("generate", ENDS_AFTER_24, "--model", str(tiny_chat_model), "--device", "cpu",
                "--max-model-len", "48", "--max-tokens", "40")
    assert r.returncode == 0, r.stderr
    assert "[stopped at the context limit, max_model_len=48; raise --max-model-len for more]" in r.stderr
    assert "max_tokens=" not in r.stderr


def test_generate_raw_skips_the_template(tiny_chat_model, offline):
    r = hotpath("generate", "def add(a, b):", "--raw", "--model", str(tiny_chat_model),
                "--device", "cpu", "--max-model-len", "256", "--max-tokens", "8")
    assert r.returncode == 0, r.stderr
    want = offline.generate("def add(a, b):", SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert r.stdout == want[0].outputs[0].text + "\n"


def test_chat_is_multi_turn(tiny_chat_model, offline):
    r = hotpath("chat", "--model", str(tiny_chat_model), "--device", "cpu", "--max-model-len", "256",
                "--max-tokens", "6", stdin="Hello!\nHow are you today?\n")
    assert r.returncode == 0, r.stderr
    p = SamplingParams(temperature=0, max_tokens=6)
    first = offline.chat([{"role": "user", "content": "Hello!"}], p, use_tqdm=False)[0].outputs[0].text
    second = offline.chat([{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": first},
                           {"role": "user", "content": "How are you today?"}], p, use_tqdm=False)
    assert r.stdout.replace("> ", "") == first + "\n" + second[0].outputs[0].text + "\n"


def test_chat_reset_and_exit(tiny_chat_model, offline):
    """/reset starts over (the same question gets the first answer again) and says so; /exit
    quits before the next line."""
    r = hotpath("chat", "--model", str(tiny_chat_model), "--device", "cpu", "--max-model-len", "256",
                "--max-tokens", "6", stdin="Hello!\n/reset\nHello!\n/exit\nHow are you today?\n")
    assert r.returncode == 0, r.stderr
    first = offline.chat([{"role": "user", "content": "Hello!"}], SamplingParams(temperature=0, max_tokens=6),
                         use_tqdm=False)[0].outputs[0].text
    assert r.stdout.replace("> ", "") == first + "\n" + first + "\n"
    assert r.stderr.count("[conversation reset]") == 1


def test_chat_help_says_how_to_quit_and_reset():
    r = hotpath("chat", "--help")
    assert r.returncode == 0
    assert all(word in r.stdout for word in ("/reset", "/exit", "Ctrl-D")), r.stdout


@pytest.mark.parametrize("argv", [["--help"], ["generate", "--help"], ["chat", "--help"],
                                  ["serve", "--help"], ["fetch", "--help"]])
def test_help_imports_nothing_heavy(argv):
    """--help must not import torch, transformers or the engine, which take seconds: each
    command imports them when it runs (only the bench commands' parsers need torch)."""
    heavy = ["torch", "transformers", "hotpath.llm", "hotpath.engine.engine", "hotpath.server.app"]
    code = ("import contextlib, io, sys\n"
            "from hotpath.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            f"    main({argv!r})\n"
            f"print([m for m in {heavy!r} if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_bad_flag_value_is_a_clear_error(tiny_chat_model):
    r = hotpath("generate", "hi", "--model", str(tiny_chat_model), "--device", "cpu", "--top-p", "1.5")
    assert r.returncode == 2
    assert "top_p" in r.stderr and "Traceback" not in r.stderr
    r = hotpath("generate", "hi", "--model", "/no/such/model", "--device", "cpu")
    assert r.returncode == 2 and "/no/such/model" in r.stderr and "Traceback" not in r.stderr


def test_every_flag_has_help_with_its_default():
    from hotpath.cli import build_parser

    def walk(parser, path):
        parser.format_help()  # every help string formats (a stray % would raise)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, path + [name])
            elif action.dest != "help":
                yield parser, path, action

    checked = 0
    for parser, path, action in walk(build_parser(), ["hotpath"]):
        name = f"{' '.join(path)} {action.option_strings or action.dest}"
        assert action.help, f"{name} has no help"
        if action.option_strings:  # a flag: its help, as --help prints it, states the default
            assert "default" in parser._get_formatter()._get_help_string(action), f"{name}: no default"
        checked += 1
    assert checked > 60
    assert hotpath("bench", "latency", "--help").returncode == 0
