"""The `hotpath` command as a user runs it: a subprocess, real arguments, real stdin."""

import argparse
import codecs
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from hotpath import LLM, SamplingParams, __version__


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
            elif action.dest not in ("help", "version"):
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


def test_version():
    r = hotpath("--version")
    assert r.returncode == 0 and r.stdout == f"hotpath {__version__}\n", r.stdout + r.stderr
    assert __version__ == "0.1.0"


def test_generate_dash_reads_the_prompt_from_stdin(tiny_chat_model, offline):
    """`hotpath generate -` answers stdin's text (less its trailing newlines, as "$(cat)" gives)."""
    r = hotpath("generate", "-", "--model", str(tiny_chat_model), "--device", "cpu",
                "--max-model-len", "256", "--max-tokens", "12", stdin="Hello, world!\n")
    assert r.returncode == 0, r.stderr
    want = offline.chat([{"role": "user", "content": "Hello, world!"}],
                        SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    assert r.stdout == want[0].outputs[0].text + "\n"
    assert "stdin" in hotpath("generate", "--help").stdout


def test_generate_dash_with_empty_stdin_is_a_clear_error():
    r = hotpath("generate", "-", "--model", "/no/such/model", stdin="\n")
    assert r.returncode == 2 and "stdin was empty" in r.stderr and "Traceback" not in r.stderr


class _Output:
    """A pipe read on a thread as it fills, so a test can wait for text to appear."""

    def __init__(self, pipe) -> None:
        self.text = ""
        self._pipe = pipe
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")()  # a character may span two reads
        while chunk := os.read(self._pipe.fileno(), 4096):
            self.text += decoder.decode(chunk)

    def wait_for(self, check, what: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not check(self.text):
            assert time.monotonic() < deadline, f"no {what} in {timeout} s: {self.text!r}"
            time.sleep(0.01)


def test_ctrl_c_stops_a_chat_reply_and_keeps_the_conversation(tiny_chat_model, offline):
    """Ctrl-C during a reply aborts that request, says [stopped] and keeps what was shown of the
    reply in the conversation (the next turn's reply is the one to that history); Ctrl-C at the
    prompt then quits with status 0. No traceback either time."""
    # the tiny model's replies run to the context limit: ~90 steps of the first in which to stop it,
    # and a second reply of the few tokens left (max_tokens is far off)
    first_q, second_q, max_model_len = "Tell me a story.", "How are you today?", 112
    proc = subprocess.Popen(
        [sys.executable, "-m", "hotpath.cli", "chat", "--model", str(tiny_chat_model), "--device", "cpu",
         "--max-model-len", str(max_model_len), "--max-tokens", "200"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # Ctrl-C's usual disposition, whatever the test runner's own is
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        out, err = _Output(proc.stdout), _Output(proc.stderr)
        out.wait_for(lambda t: t == "> ", "prompt")
        proc.stdin.write(f"{first_q}\n".encode())
        proc.stdin.flush()
        out.wait_for(lambda t: len(t) > len("> ") + 3, "reply")
        proc.send_signal(signal.SIGINT)  # mid-reply
        out.wait_for(lambda t: t.endswith("\n> "), "prompt after the first reply")
        err.wait_for(lambda t: "[stopped" in t, "notice after the first reply")
        assert "[stopped]\n" in err.text, err.text  # not "[stopped at the context limit...]": cut
        partial = out.text[len("> "):-len("\n> ")]
        proc.stdin.write(f"{second_q}\n".encode())
        proc.stdin.flush()
        out.wait_for(lambda t: t.count("\n> ") == 2, "prompt after the second reply")
        proc.send_signal(signal.SIGINT)  # at the prompt: quits
        assert proc.wait(60) == 0, err.text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err.text and err.text.count("[stopped]") == 1, err.text

    # what was shown is the start of the model's reply: each of its tokens gave at least a byte
    p = SamplingParams(temperature=0, max_tokens=len(partial.encode()) + 1)
    longer = offline.chat([{"role": "user", "content": first_q}], p, use_tqdm=False)[0].outputs[0].text
    assert partial and longer.startswith(partial) and len(partial) < len(longer), (partial, longer)
    history = [{"role": "user", "content": first_q}, {"role": "assistant", "content": partial},
               {"role": "user", "content": second_q}]
    room = max_model_len - len(offline.apply_chat_template(history))  # what the context left
    second = offline.chat(history, SamplingParams(temperature=0, max_tokens=room),
                          use_tqdm=False)[0].outputs[0].text
    assert out.text == f"> {partial}\n> {second}\n> "
