"""The multi-process executor's failure handling and its control channel: a worker killed in the
middle of generation gives a clear error within seconds and leaves no process behind; a peer
without the job's secret is refused; two nodes' workers (simulated on loopback) serve as one."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from hotpath import LLM, SamplingParams
from hotpath.executor.channel import Channel, ChannelError
from hotpath.executor.multiproc import WorkerError, free_port
from tiny_models import make_tiny_model

PROMPTS = [[5, 17, 33, 9, 100, 7], [3, 4, 5, 6, 7, 8, 9, 10, 11], [200, 201]]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
SETTINGS = dict(skip_tokenizer_init=True, device="cpu", max_model_len=128)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    make_tiny_model("qwen3-gqa8-untied-hd", path)
    llm = LLM(str(path), **SETTINGS)
    want = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY,
                                                          use_tqdm=False)]
    return path, want


@pytest.mark.parametrize("victim", [0, 1])
def test_a_worker_killed_mid_generation_stops_the_engine_cleanly(model, victim):
    path, _ = model
    llm = LLM(str(path), tensor_parallel_size=2, **SETTINGS)
    engine = llm.engine
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), {"prompt_token_ids": p}, SamplingParams(max_tokens=100, ignore_eos=True))
    for _ in range(3):
        engine.step()
    procs = engine.executor.procs
    procs[victim].kill()
    start = time.monotonic()
    with pytest.raises(WorkerError, match=f"rank {victim}|worker rank"):
        for _ in range(1000):
            engine.step()
    assert time.monotonic() - start < 10
    assert all(p.poll() is not None for p in procs)  # every worker reaped
    with pytest.raises(WorkerError, match="stopped"):
        engine.step()


def test_control_channel_refuses_a_peer_without_the_secret(model, monkeypatch):
    """A forged hello (signed with another secret) during start-up is dropped without effect;
    the workers then join and the engine serves; after start-up the port takes no one."""
    path, want = model
    monkeypatch.setenv("HOTPATH_CLUSTER_SECRET", "the-jobs-secret")
    port = free_port("127.0.0.1")
    refused = []

    def forge() -> None:
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", port + 1), timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        Channel(sock, b"a guess", "worker").send({"rank": 0})
        sock.settimeout(30)
        refused.append(sock.recv(1) == b"")  # closed by the engine, nothing said back
        sock.close()

    thread = threading.Thread(target=forge)
    thread.start()
    llm = LLM(str(path), tensor_parallel_size=2, master_port=port, **SETTINGS)
    thread.join(30)
    assert refused == [True]
    got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY,
                                                        use_tqdm=False)]
    assert got == want
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port + 1), timeout=1)
    llm.engine.shutdown()


def test_channel_refuses_forged_and_replayed_frames():
    a, b = socket.socketpair()
    Channel(a, b"s", "engine").send({"op": "launch"})
    frame = b.recv(1 << 16)  # the frame as it crossed the wire
    c, d = socket.socketpair()
    worker = Channel(d, b"s", "worker")
    c.sendall(frame)
    assert worker.recv() == {"op": "launch"}
    c.sendall(frame)  # the same frame again: its number is stale
    with pytest.raises(ChannelError, match="secret"):
        worker.recv()
    g, h = socket.socketpair()
    payload = b'{"op":"shutdown"}'
    g.sendall(struct.pack(">I32s", len(payload), b"\0" * 32) + payload)  # no valid signature
    with pytest.raises(ChannelError, match="secret"):
        Channel(h, b"s", "worker").recv()
    # nor does a frame the worker itself signed pass as the engine's
    e, f = socket.socketpair()
    Channel(e, b"s", "worker").send({"op": "shutdown"})
    with pytest.raises(ChannelError, match="secret"):
        Channel(f, b"s", "worker").recv()


def test_two_nodes_on_loopback(model, monkeypatch, tmp_path):
    """tp = 2 over two 'nodes': node 1's `hotpath worker` and node 0's engine rendezvous at
    master_addr / master_port with the shared secret; greedy output equals one rank's."""
    path, want = model
    monkeypatch.setenv("HOTPATH_CLUSTER_SECRET", "two-node-secret")
    port = free_port("127.0.0.1")
    flags = ["--model", str(path), "--device", "cpu", "--skip-tokenizer-init", "--max-model-len", "128",
             "-tp", "2", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    node1 = subprocess.Popen([sys.executable, "-m", "hotpath.cli", "worker", *flags, "--node-rank", "1"])
    try:
        llm = LLM(str(path), tensor_parallel_size=2, nnodes=2, node_rank=0, master_port=port, **SETTINGS)
        got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY,
                                                            use_tqdm=False)]
        assert got == want
        llm.engine.shutdown()
        assert node1.wait(30) == 0  # its workers stopped with the engine
    finally:
        node1.kill()
