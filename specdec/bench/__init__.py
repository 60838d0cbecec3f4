"""Benchmarks of specdec decoding methods: timed runs over prompt sets, then tables and plots.

``run_bench`` takes loaded models and ``Method`` objects; ``main_bench`` takes a ``BenchConfig`` or a plain dict.
"""

from specdec.bench.harness import BenchConfig, Method, load_prompts, main_bench, methods_from_specs, run_bench, zoo_dir
from specdec.bench.report import aggregate, format_table, load_rows, plot_summary, write_report

__all__ = [
    "BenchConfig",
    "Method",
    "aggregate",
    "format_table",
    "load_prompts",
    "load_rows",
    "main_bench",
    "methods_from_specs",
    "plot_summary",
    "run_bench",
    "write_report",
    "zoo_dir",
]
