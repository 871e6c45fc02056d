"""Inclusive and self shares of the functions in a stack file (sitecustomize.py's or py-spy's raw
format), busy samples only: python benchmarks/stack_sampler/report.py FILE [TOP]"""

import collections
import re
import sys


def main() -> None:
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
    inclusive: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    busy = idle = 0
    for line in open(path):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        if frames[-1] == "<idle>":
            idle += int(n)
            continue
        busy += int(n)
        names = [re.sub(r":\d+\)$", ")", f) for f in frames]  # a function, not a line
        for name in set(names):
            inclusive[name] += int(n)
        own[names[-1]] += int(n)
    print(f"{busy} busy samples, {idle} idle")
    for title, counter in (("inclusive", inclusive), ("self", own)):
        print(f"--- {title}")
        for name, n in counter.most_common(top):
            print(f"{100 * n / max(busy, 1):5.1f}% {name}")


if __name__ == "__main__":
    main()
