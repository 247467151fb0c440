"""OpenAI-compatible HTTP server (FastAPI): /v1/completions, /v1/chat/completions,
/v1/models, /health."""
