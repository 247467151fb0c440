"""Paternoster's benchmarks, importable as ``paternoster.bench``.

``paternoster bench serve`` / ``paternoster bench capacity`` drive an
OpenAI-compatible endpoint; ``bench/offline.py`` and ``bench/step_overhead.py``
run as scripts; results land in docs/benchmarks.md.
"""
