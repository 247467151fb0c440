"""Ways in: the ``paternoster`` CLI, the OpenAI HTTP server, the engine client
(ZeroMQ to the engine process) and the offline ``LLM`` API."""
