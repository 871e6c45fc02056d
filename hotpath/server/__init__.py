"""The OpenAI-compatible HTTP server: app.py (routes, auth, limits), serving.py (completions and chat),
chat_prompts.py (chat messages with their images and videos -> the engine's prompt), protocol.py
(request bodies, errors), metrics.py (/metrics), launch.py (`hotpath serve`)."""
