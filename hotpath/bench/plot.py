"""Latency against throughput for a sweep of load levels: one PNG, two panels (TTFT, TPOT)."""

from __future__ import annotations

from pathlib import Path


def plot_sweep(summaries: list[dict], path: str | Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    throughput = [s["output_throughput"] for s in summaries]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, name in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        for pct, style in (("p50", "o-"), ("p99", "s--")):
            ax.plot(throughput, [s[key][pct] for s in summaries], style, label=f"{name} {pct}")
        for s, x in zip(summaries, throughput):
            ax.annotate(f"c={s['max_concurrency']}", (x, s[key]["p50"]), textcoords="offset points",
                        xytext=(4, 6), fontsize=8)
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
