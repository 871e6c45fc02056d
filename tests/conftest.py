import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tiny_models.py, tiny_chat_model.py


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """name -> (checkpoint dir, HF model); each tiny checkpoint is written once per session.
    `vocab_size` (default make_tiny_model's 512) gives the checkpoint of that vocabulary."""
    from tiny_models import make_tiny_model

    cache = {}

    def get(name: str, vocab_size: int | None = None):
        if (name, vocab_size) not in cache:
            out = tmp_path_factory.mktemp(name if vocab_size is None else f"{name}-vocab{vocab_size}")
            kwargs = {} if vocab_size is None else {"vocab_size": vocab_size}
            cache[name, vocab_size] = (out, make_tiny_model(name, out, **kwargs))
        return cache[name, vocab_size]

    return get


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory) -> Path:
    """A tiny random Qwen2 checkpoint with a real BPE tokenizer and a ChatML template."""
    from tiny_chat_model import make_tiny_chat_model

    return make_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture(scope="session")
def hf_gguf_models():
    """name -> transformers' own model of a real GGUF (`hotpath.assets` name; fp32, eval), the
    reference of tests/loader/test_gguf.py and tests/models/test_real_gguf.py. Loaded once a
    session: transformers parses and dequantizes the GGUF in Python (about a minute for the 0.5B
    model on a 2-core machine). `pop(name)` hands a model back (its last user)."""
    import torch
    from transformers import AutoModelForCausalLM

    from hotpath.assets import fetch_model

    cache = {}

    class Models:
        def get(self, name: str):
            if name not in cache:
                gguf = fetch_model(name)
                cache[name] = AutoModelForCausalLM.from_pretrained(
                    str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
            return cache[name]

        def pop(self, name: str) -> None:
            cache.pop(name, None)

    return Models()


# ---- pytest-xdist: the suite runs on two workers (pyproject.toml's addopts: -n 2 --dist loadgroup) ---

def xdist_worker(config) -> bool:
    """Whether this process is a pytest-xdist worker (its tests are a share of the session's)."""
    return hasattr(config, "workerinput")


def pytest_configure(config):
    """Each worker's torch gets its share of the cores: two workers each running two intra-op
    threads on two cores oversubscribe them, and an OpenMP region then waits on a descheduled
    thread. Subprocesses the tests start (servers, engine processes, gloo ranks) keep their own."""
    if xdist_worker(config):
        import os

        import torch

        workers = int(config.workerinput.get("workercount", 1))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_finish(session):
    """Triton's interpreter without its language patching repeated at every @triton.jit helper call
    (tests/triton_interpreter.py): after collection, when the conftests that set TRITON_INTERPRET
    have run, so importing triton here defines nothing before it is set."""
    from triton_interpreter import skip_repeated_patching

    skip_repeated_patching()


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(session, config, items):
    """Under --dist loadgroup a test is a unit of work of its own, unless it is in a group:
    tests that share a costly fixture wider than a test run on one worker, which sets it up once.

    - the tests of transformers' real GGUF models (hf_gguf_models: a minute or more a model to
      dequantize in Python) are one group;
    - a module's tests that use a module- or class-scoped fixture are one group (the module's);
    - tests/ops/conftest.py puts the tests that wait on the compile children in a group of their own.

    xdist 3.8 marks a grouped test by appending "@group" to `item._nodeid`, which pytest 9.2's
    items no longer read (their node id is `item._id`): the groups were lost, and every test was
    scheduled on its own. The groups are given here, after every other implementation of this
    hook (xdist's and the -k / -m deselection included), on whichever attribute holds the id."""
    result = yield
    if not (xdist_worker(config) and config.getvalue("loadgroup")):
        return result
    from _pytest.nodeid import coerce_node_id

    for item in items:
        if item.get_closest_marker("xdist_group"):
            pass
        elif "hf_gguf_models" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("hf_gguf_models"))
        elif any(d.scope in ("module", "class", "package")
                 for fds in getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).values()
                 for d in fds):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):
            if hasattr(item, "_id"):  # pytest 9.2 and later
                item._id = coerce_node_id(item.nodeid + suffix)
            else:
                item._nodeid = item.nodeid + suffix
    return result
