"""The OpenAI-compatible HTTP server: app.py (routes, auth, limits), serving.py (completions and chat),
protocol.py (request bodies, errors), metrics.py (/metrics), launch.py (`hotpath serve`)."""
