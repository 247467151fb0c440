"""The request pipeline between the protocols and the engine.

Everything from "a prompt and parameters" to "a stream of deltas" lives here,
once: tokenization and chat templates (:mod:`.processor`, :mod:`.chat`), one
validation of every limit (:class:`~.processor.InputProcessor`), admission
into a bounded waiting queue (:mod:`.admission`), fan-out of ``n`` choices,
detokenization and stop strings (:mod:`.output_processor`,
:mod:`.detokenizer`) and request metrics (:class:`~.generation.Generation`);
:class:`~.pipeline.Frontend` strings them together. Below it, the
:class:`~.engine_client.EngineClient` joins the engine link (:mod:`.link`),
engine supervision (:mod:`.supervisor`) and admission. The OpenAI HTTP server
and the ZeroMQ client protocol in :mod:`paternoster.entrypoints` only map
their wire formats onto :class:`~.pipeline.Frontend`.
"""
