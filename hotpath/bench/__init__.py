"""Benchmarks: serve.py (`hotpath bench serve`, load on an OpenAI-compatible server), datasets.py
(the prompt sets), plot.py (latency vs throughput)."""
