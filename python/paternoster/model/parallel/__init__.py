"""Tensor parallelism (Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053):
one model's matrices split over the ranks of a ``torch.distributed`` group
(gloo on CPU, NCCL on GPUs).

- :mod:`.group`: :class:`TPGroup`, the rank, the group size and the two
  collectives the model needs (all-reduce, all-gather).
- :mod:`.shard`: which slice of a full checkpoint tensor a rank holds.
- :mod:`.layers`: column/row-parallel linear layers, the vocab-parallel
  embedding and LM head.
- :mod:`.tp_model`: the Llama/Qwen2/Qwen3 decoder over a group, one
  all-reduce closing each attention and each MLP sub-block.
"""

from paternoster.model.parallel.group import TPGroup
from paternoster.model.parallel.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
)

__all__ = ["ColumnParallelLinear", "ParallelLMHead", "RowParallelLinear", "TPGroup",
           "VocabParallelEmbedding"]
