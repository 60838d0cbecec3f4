"""Benchmarks of specdec decoding methods: warm, timed runs over prompt sets, then tables and plots.

``run_bench`` takes loaded models and ``Method`` objects; ``main_bench`` takes a ``BenchConfig`` or a plain dict;
``graph_floor_ms`` times one CUDA-graph-captured target forward (the floor of any token-by-token loop).
"""

from specdec.bench.config import DEFAULT_METHODS, BenchConfig, main_bench, methods_from_specs
from specdec.bench.floor import graph_floor_ms, median_ms
from specdec.bench.harness import Method, run_bench
from specdec.bench.report import aggregate, format_header, format_table, load_rows, plot_summary, write_report
from specdec.loading import load_prompts, zoo_dir

__all__ = [
    "DEFAULT_METHODS",
    "BenchConfig",
    "Method",
    "aggregate",
    "format_header",
    "format_table",
    "graph_floor_ms",
    "load_prompts",
    "load_rows",
    "main_bench",
    "median_ms",
    "methods_from_specs",
    "plot_summary",
    "run_bench",
    "write_report",
    "zoo_dir",
]
