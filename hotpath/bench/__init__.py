"""Benchmarks: latency against the roofline (latency.py) and serving load (serve.py)."""
