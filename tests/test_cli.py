"""The `hotpath` command as a user runs it: a subprocess, real arguments, real stdin."""

import argparse
import subprocess
import sys

import pytest

from hotpath import LLM, SamplingParams


def hotpath(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hotpath.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=300)


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


def test_bad_flag_value_is_a_clear_error(tiny_chat_model):
    r = hotpath("generate", "hi", "--model", str(tiny_chat_model), "--device", "cpu", "--top-p", "1.5")
    assert r.returncode == 2
    assert "top_p" in r.stderr and "Traceback" not in r.stderr
    r = hotpath("generate", "hi", "--model", "/no/such/model", "--device", "cpu")
    assert r.returncode == 2 and "/no/such/model" in r.stderr and "Traceback" not in r.stderr


def test_every_flag_has_help():
    from hotpath.cli import build_parser

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, path + [name])
            elif action.option_strings or action.dest != "help":
                yield path, action

    checked = 0
    for path, action in walk(build_parser(), ["hotpath"]):
        if action.dest == "help":
            continue
        assert action.help, f"{' '.join(path)} {action.option_strings or action.dest} has no help"
        checked += 1
    assert checked > 60
    assert hotpath("bench", "latency", "--help").returncode == 0
