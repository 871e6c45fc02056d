"""A sampling profiler for every Python process of a run, where py-spy cannot attach (no ptrace).

Put this folder first on PYTHONPATH and set STACK_SAMPLES=DIR: each process then samples the stacks
of all its threads every STACK_SAMPLE_MS (default 10) ms from a thread of its own and writes them to
DIR/<name>-<pid>.txt every few seconds and at exit, one "frame;frame;... count" line per stack
(py-spy's raw format). A sample also records whether the thread's CPU time moved since the last
one (its thread CPU clock): stacks of idle threads are marked with a leaf frame "<idle>", so they can be left out.
"""

import os

if os.environ.get("STACK_SAMPLES"):
    import atexit
    import collections
    import sys
    import threading
    import time

    def _start() -> None:
        out_dir = os.environ["STACK_SAMPLES"]
        interval = float(os.environ.get("STACK_SAMPLE_MS", "10")) / 1000
        counts: collections.Counter = collections.Counter()
        last_cpu: dict[int, int] = {}

        def thread_cpu(tid: int) -> int | None:
            try:
                return time.clock_gettime_ns(time.pthread_getcpuclockid(tid))
            except (OSError, OverflowError):
                return None

        def write() -> None:
            name = sys.argv[0].rsplit("/", 1)[-1] or "python"
            if "spawn_main" in " ".join(sys.argv) or name == "-c":
                name = "child"
            path = os.path.join(out_dir, f"{name}-{os.getpid()}.txt")
            with open(path + ".tmp", "w") as f:
                for stack, n in counts.items():
                    f.write(f"{stack} {n}\n")
            os.replace(path + ".tmp", path)

        def run() -> None:
            me = threading.get_ident()
            next_write = time.monotonic() + 5
            while True:
                time.sleep(interval)
                for tid, frame in sys._current_frames().items():
                    if tid == me:
                        continue
                    names = []
                    while frame is not None:
                        code = frame.f_code
                        names.append(f"{code.co_qualname} ({code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno})")
                        frame = frame.f_back
                    cpu = thread_cpu(tid)
                    busy = cpu is None or cpu != last_cpu.get(tid)
                    if cpu is not None:
                        last_cpu[tid] = cpu
                    stack = ";".join(reversed(names)) + ("" if busy else ";<idle>")
                    counts[stack] += 1
                if time.monotonic() > next_write:
                    write()
                    next_write = time.monotonic() + 5

        os.makedirs(out_dir, exist_ok=True)
        threading.Thread(target=run, name="stack-sampler", daemon=True).start()
        atexit.register(write)

    _start()
