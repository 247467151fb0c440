"""Paternoster: an LLM serving engine (continuous batching, paged KV cache).

Offline use::

    from paternoster import LLM, SamplingParams
    llm = LLM()  # the embedded default model
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8))
    print(out[0].outputs[0].text)

``LLM`` is imported lazily so that importing the package (e.g. in the HTTP
frontend) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paternoster.outputs import CompletionOutput, RequestOutput
from paternoster.sampling_params import SamplingParams

if TYPE_CHECKING:
    from paternoster.entrypoints.llm import LLM

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]


def __getattr__(name: str) -> Any:
    """Lazy attribute: ``paternoster.LLM`` imports the offline API on first use."""
    if name == "LLM":
        from paternoster.entrypoints.llm import LLM

        return LLM
    raise AttributeError(f"module 'paternoster' has no attribute {name!r}")
