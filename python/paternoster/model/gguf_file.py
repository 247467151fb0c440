"""A GGUF file as read here: which types its tensors may have, split models'
files, and one parse of each file's header per process (gguf-py's reader over
a copy-on-write memory map of the file).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import torch

#: GGUF tensor types kept quantized, by our format name.
QUANTIZED_TYPES = {t: t.lower() for t in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL",
                                          "MXFP4", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")}
#: GGUF tensor types loaded dense.
DENSE_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
#: GGUF tensor types dequantized at load (to bfloat16): no kernel keeps them.
DEQUANTIZED_TYPES = ("Q2_K", "Q3_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
                     "IQ3_S", "TQ1_0", "TQ2_0", "NVFP4")


def is_gguf(path: str | Path) -> bool:
    """True for a path naming a ``.gguf`` file (a directory so named is not one)."""
    return str(path).lower().endswith(".gguf") and not Path(path).is_dir()


def gguf_architecture(path: str | Path) -> str:
    """The file's ``general.architecture``.

    Raises:
        ValueError: not a readable GGUF file, or the key is missing.
    """
    return file_architecture(gguf_reader(gguf_shards(path)[0]), path)


def file_architecture(reader, path: str | Path) -> str:
    """``general.architecture`` of a parsed file (:func:`gguf_reader`).

    Raises:
        ValueError: the key is missing (naming ``path``).
    """
    field = reader.fields.get("general.architecture")
    if field is None:
        raise ValueError(f"{path}: no general.architecture in the GGUF metadata")
    return bytes(field.parts[field.data[0]]).decode()


_SHARD_NAME = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def gguf_shards(path: str | Path) -> list[Path]:
    """The files of a model: ``[path]``, or for the first file of a split
    model (``name-00001-of-00003.gguf``, llama.cpp's ``gguf-split`` naming)
    all of its files in order; the first holds the metadata.

    Raises:
        ValueError: a split model's other file was given (naming the first),
            or one of its files is missing (naming it).
    """
    p = Path(path)
    m = _SHARD_NAME.match(p.name)
    if m is None:
        return [p]
    no, count = int(m["no"]), int(m["count"])
    shards = [p.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    if no != 1:
        raise ValueError(f"{path}: file {no} of a split model; serve its first file, "
                         f"{shards[0].name}")
    for shard in shards:
        if not shard.is_file():
            raise ValueError(f"{path}: {shard.name}, file of this split model, is missing")
    return shards


def float_field(reader, key: str) -> float | None:
    """The first value of metadata ``key`` as a float, None when absent."""
    field = reader.fields.get(key)
    return None if field is None else float(field.parts[field.data[0]][0])


def int_field(reader, key: str) -> int | None:
    """The first value of metadata ``key`` as an int, None when absent."""
    field = reader.fields.get(key)
    return None if field is None else int(field.parts[field.data[0]][0])


def gguf_reader(path: str | Path):
    """The file's parsed header and tensor list (one parse per file per
    process while the file is unchanged: a vocabulary of 150k strings takes
    seconds to parse), whatever spelling of the path names it.

    Raises:
        ValueError: no such file, or not a readable GGUF file (naming it and
            the reader's reason: a truncated file, a tensor type this gguf
            package does not know).
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{path}: no such GGUF file")
    stat = p.stat()
    try:
        return _cached_reader(str(p.resolve()), stat.st_size, stat.st_mtime_ns)
    except Exception as e:  # noqa: BLE001 - the reader fails in many ways on a cut file
        reason = f"{type(e).__name__}: {e}"
        if "GGMLQuantizationType" in str(e):
            raise ValueError(f"{path}: a tensor type this gguf package does not know "
                             f"({reason}); supported: "
                             f"{', '.join([*QUANTIZED_TYPES, *DENSE_TYPES, *DEQUANTIZED_TYPES])}"
                             ) from e
        raise ValueError(f"{path}: not a readable GGUF file, truncated or corrupt? "
                         f"({reason})") from e


@functools.lru_cache(maxsize=1)
def _fast_reader_class():
    """gguf-py's reader over a plain ndarray view of its memory map: the same
    parse, ~4x faster (slicing a ``numpy.memmap`` runs Python-level
    ``__array_finalize__`` for each of the millions of small reads a
    vocabulary takes: 2.7 s -> 0.7 s for SmolLM2's 49k-token file). Built on
    the class in its own module, which :func:`_transformers_reuses_our_parse`
    never replaces."""
    from gguf.gguf_reader import GGUFReader

    class _Reader(GGUFReader):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, value) -> None:
            self._plain = value.view(np.ndarray)  # keeps the map alive (its base)

    return _Reader


@functools.lru_cache(maxsize=2)
def _cached_reader(resolved: str, size: int, mtime_ns: int):
    # Copy-on-write: writable arrays for torch, pages shared with the page
    # cache until written (we never write them).
    return _fast_reader_class()(resolved, "c")
