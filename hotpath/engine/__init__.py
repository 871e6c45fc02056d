"""The engine: requests, scheduling, the KV cache manager and the step loop."""
