"""The executor of a worker process per rank (tensor parallelism, or one rank in a process of its own).

The engine spawns this node's workers (across nodes, each other node runs `hotpath worker` with
its --node-rank, whose workers connect the same way) and listens for them on the control channel
(executor/channel.py: loopback for one node). Each step's plan is encoded once and written to every
worker's connection: no rank relays another's plan and no collective waits on the engine, so a
dead engine is an end-of-file to each worker and a dead worker is one to the engine. Every rank
runs the plan and samples the same tokens; only rank 0 answers collect and propose.

A worker that dies, or fails, stops the job: the engine notices within a second (its connection
closes, or its process is gone), stops the other workers, and raises with the worker's error.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, replace
from typing import Any

from hotpath.args import EngineArgs
from hotpath.executor.channel import Channel, ChannelError, connect, encode, job_secret
from hotpath.executor.worker import WorkerInfo
from hotpath.resolve import Resolved
from hotpath.runner.plan import SampledToken, StepPlan, from_wire, to_wire, tokens_from_wire, tokens_to_wire
from hotpath.structured.bitmask import TokenMask, mask_from_wire, mask_to_wire

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # loading a large model (its kernels compiled on first use) takes a while
POLL_S = 0.5


class WorkerError(RuntimeError):
    """A worker process died or failed; the executor has stopped every worker."""


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ports(args: EngineArgs) -> tuple[int, int]:
    """(torch.distributed's rendezvous port, the control channel's): master_port and the next,
    or free ports on one node."""
    if args.master_port is not None:
        return args.master_port, args.master_port + 1
    if args.nnodes > 1:
        raise ValueError("serving across nodes needs --master-port (every node must know it)")
    return free_port(args.master_addr), free_port(args.master_addr)


def spawn_workers(args: EngineArgs, secret: bytes, dist_port: int, control_port: int) -> list[subprocess.Popen]:
    """Starts this node's workers, ranks node_rank * per_node ... + per_node - 1, each a fresh
    interpreter running this module (not a fork, and not multiprocessing's spawn, which would run
    the user's script again in each), its settings on stdin (the secret stays out of `ps`)."""
    per_node = args.tensor_parallel_size // args.nnodes
    procs = []
    for local_rank in range(per_node):
        rank = args.node_rank * per_node + local_rank
        env = dict(os.environ, **({} if rank == 0 else {"TQDM_DISABLE": "1"}))  # one rank's progress bars
        p = subprocess.Popen([sys.executable, "-m", "hotpath.executor.multiproc"], stdin=subprocess.PIPE, env=env)
        p.name = f"worker rank {rank}"
        setup = dict(args=asdict(args), rank=rank, local_rank=local_rank, dist_port=dist_port,
                     control_port=control_port, secret=secret.hex())
        p.stdin.write(json.dumps(setup).encode())
        p.stdin.close()
        procs.append(p)
    return procs


class MultiprocExecutor:
    def __init__(self, resolved: Resolved) -> None:
        args = resolved.args
        self.size = args.tensor_parallel_size
        self.secret = job_secret(args.nnodes)
        dist_port, control_port = ports(args)
        self._listener = socket.create_server((args.master_addr, control_port))
        self.procs = spawn_workers(args, self.secret, dist_port, control_port)
        self.channels: list[Channel | None] = [None] * self.size
        self._dead = False
        self._closed = False
        self._next_step = 0
        atexit.register(self.shutdown)
        try:
            self.info = self._start()
        except BaseException:
            self.shutdown()
            raise

    def _start(self) -> WorkerInfo:
        """Accepts every rank's connection (refusing peers without the secret), then waits for
        each to load its shard; returns rank 0's WorkerInfo."""
        deadline = time.monotonic() + START_TIMEOUT_S
        self._listener.settimeout(POLL_S)
        while any(c is None for c in self.channels):
            self._check_processes()
            if time.monotonic() > deadline:
                raise WorkerError(f"workers did not connect within {START_TIMEOUT_S:.0f} s")
            try:
                sock, peer = self._listener.accept()
            except TimeoutError:
                continue
            sock.settimeout(10.0)  # a peer gets this long to present itself
            chan = Channel(sock, self.secret, "engine")
            try:
                hello = chan.recv()
                rank = hello["rank"]
                if not isinstance(rank, int) or not 0 <= rank < self.size or self.channels[rank] is not None:
                    raise ChannelError(f"bad rank {rank!r}")
            except (ChannelError, OSError, KeyError, TypeError, ValueError) as e:
                logger.warning("control channel: refused a connection from %s: %s", peer, e)
                chan.close()
                continue
            sock.settimeout(None)
            self.channels[rank] = chan
        self._listener.close()  # every rank is here: nobody else may connect
        infos = [WorkerInfo(**m["ready"]) for m in self._gather(range(self.size), deadline).values()]
        # each rank sized its caches from its own free memory: the engine hands out what all have
        return replace(infos[0], num_blocks=min(i.num_blocks for i in infos),
                       num_state_slots=min(i.num_state_slots for i in infos),
                       num_snapshots=min(i.num_snapshots for i in infos))

    # ---- the executor's calls -----------------------------------------------------------
    def launch(self, plan: StepPlan) -> int:
        self._broadcast({"op": "launch", "plan": to_wire(plan)})
        self._next_step += 1  # the workers number their steps the same way
        return self._next_step - 1

    def sample(self, step_id: int, mask: TokenMask) -> None:
        self._broadcast({"op": "sample", "step": step_id, "mask": mask_to_wire(mask)})

    def collect(self, step_id: int, gone: list[int]) -> dict[int, list[SampledToken]]:
        self._broadcast({"op": "collect", "step": step_id, "gone": gone})
        return tokens_from_wire(self._gather([0])[0]["tokens"])

    def propose(self, plan: StepPlan) -> dict[int, tuple[list[int], int]]:
        self._broadcast({"op": "propose", "plan": to_wire(plan)})
        return {int(k): (v[0], v[1]) for k, v in self._gather([0])[0]["drafts"].items()}

    def shutdown(self) -> None:
        """Asks every worker to stop, then makes sure each process is gone."""
        if self._closed:
            return
        self._closed = True
        for chan in self.channels:
            if chan is not None:
                try:
                    chan.send({"op": "shutdown"})
                except OSError:
                    pass
        deadline = time.monotonic() + 5.0
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5.0)
        for chan in self.channels:
            if chan is not None:
                chan.close()
        self._listener.close()
        atexit.unregister(self.shutdown)

    # ---- plumbing -----------------------------------------------------------------------
    def _broadcast(self, message: dict[str, Any]) -> None:
        if self._dead:
            raise WorkerError("the workers were stopped after an earlier failure")
        payload = encode(message)
        for rank, chan in enumerate(self.channels):
            try:
                chan.send_encoded(payload)
            except OSError as e:
                self._fail(f"worker rank {rank} is gone ({e})")

    def _gather(self, ranks, deadline: float | None = None) -> dict[int, dict[str, Any]]:
        """The next message of each of `ranks`, watching every rank for an error or an end meanwhile."""
        waiting, got = set(ranks), {}
        while waiting:
            ready, _, _ = select.select([c for c in self.channels if c is not None], [], [], POLL_S)
            for chan in ready:
                r = self.channels.index(chan)
                try:
                    message = chan.recv()
                except (ChannelError, OSError) as e:
                    self._fail(f"worker rank {r} stopped: {self._exit(r) or e}")
                if "error" in message:  # the exception's own line first, then where it came from
                    trace = message["error"].rstrip()
                    self._fail(f"worker rank {r} failed: {trace.splitlines()[-1]}\n{trace}")
                if r not in waiting:
                    self._fail(f"worker rank {r} sent {sorted(message)} unasked")
                waiting.discard(r)
                got[r] = message
            self._check_processes()
            if deadline is not None and time.monotonic() > deadline:
                self._fail(f"worker ranks {sorted(waiting)} did not answer within {START_TIMEOUT_S:.0f} s")
        return got

    def _check_processes(self) -> None:
        for p in self.procs:
            if p.poll() is not None:
                self._fail(f"{p.name} died ({_exit_description(p.returncode)})")

    def _exit(self, rank: int) -> str | None:
        per_node = len(self.procs)
        p = self.procs[rank] if rank < per_node else None
        if p is None:
            return None
        try:
            return f"its process {_exit_description(p.wait(1.0))}"
        except subprocess.TimeoutExpired:
            return None

    def _fail(self, reason: str) -> None:
        self._dead = True
        self.shutdown()
        raise WorkerError(reason)


def _exit_description(code: int | None) -> str:
    if code is None:
        return "still running"
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def run_node(args: EngineArgs) -> int:
    """`hotpath worker`: this node's workers of a job whose engine runs on node 0; returns when
    they stop (the engine shut down or went away), 1 if one failed."""
    from hotpath.resolve import resolve

    if args.nnodes < 2 or args.node_rank == 0:
        raise ValueError("hotpath worker runs the workers of node 1 or more (--nnodes > 1, --node-rank >= 1); "
                         "node 0 runs the engine itself")
    resolve(args)  # the same checks, and errors, as the engine's
    dist_port, control_port = ports(args)
    procs = spawn_workers(args, job_secret(args.nnodes), dist_port, control_port)
    codes = [p.wait() for p in procs]
    return 1 if any(codes) else 0


# ---- the worker process -------------------------------------------------------------------------
def run_worker(args: dict[str, Any], rank: int, local_rank: int, dist_port: int, control_port: int,
               secret: str) -> None:
    """A worker process: joins the job, builds its rank's shard, then runs what the engine sends
    until it says stop or goes away."""
    import torch

    from hotpath.distributed.init import destroy_distributed, init_distributed
    from hotpath.executor.worker import Worker
    from hotpath.resolve import resolve

    engine_args = EngineArgs(**args)
    host = engine_args.master_addr
    try:
        chan = connect(host, control_port, bytes.fromhex(secret), timeout=60.0)
    except OSError:
        return  # the engine is gone
    chan.send({"rank": rank})
    parallel = None
    try:
        resolved = resolve(engine_args)
        cuda = resolved.device.type == "cuda"
        if cuda:
            resolved.device = torch.device("cuda", local_rank)
            torch.cuda.set_device(resolved.device)
        parallel = init_distributed(rank, engine_args.tensor_parallel_size, init_method=f"tcp://{host}:{dist_port}",
                                    backend="nccl" if cuda else "gloo", local_rank=local_rank if cuda else None)
        parallel = replace(parallel, expert_parallel=engine_args.enable_expert_parallel)
        worker = Worker(resolved, parallel)
        chan.send({"ready": asdict(worker.info())})
        _serve(worker, chan, rank)
    except ChannelError:
        pass  # the engine closed the channel: nothing to report to
    except BaseException:
        try:
            chan.send({"error": traceback.format_exc()})
        except OSError:
            pass
        os._exit(1)
    finally:
        destroy_distributed(parallel)
        chan.close()


def _serve(worker, chan: Channel, rank: int) -> None:
    while True:
        message = chan.recv()
        op = message["op"]
        if op == "launch":
            worker.launch(from_wire(message["plan"]))
        elif op == "sample":
            worker.sample(message["step"], mask_from_wire(message["mask"]))
        elif op == "collect":
            tokens = worker.collect(message["step"], message["gone"])
            if rank == 0:
                chan.send({"tokens": tokens_to_wire(tokens)})
        elif op == "propose":
            drafts = worker.propose(from_wire(message["plan"]))
            if rank == 0:
                chan.send({"drafts": {str(k): v for k, v in drafts.items()}})
        elif op == "shutdown":
            return
        else:
            raise ValueError(f"unknown op {op!r}")


if __name__ == "__main__":
    run_worker(**json.loads(sys.stdin.read()))
