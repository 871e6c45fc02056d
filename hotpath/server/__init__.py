"""The OpenAI-compatible HTTP server: app.py (routes, auth, limits), serving.py (completions and chat),
chat_prompts.py (chat messages with their images and videos -> the engine's prompt), protocol.py
(request bodies, errors), tool_choice.py (a request's tools and tool_choice), chat_output.py (a chat
reply -> reasoning_content, content, tool_calls, through reasoning.py and tool_parsers/),
metrics.py (/metrics), launch.py (`hotpath serve`)."""
