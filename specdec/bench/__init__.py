"""Benchmarks of specdec decoding methods: warm, timed runs over prompt sets, then tables and plots.

``python -m specdec bench [+experiment=NAME] [key=value ...]`` is the entry point (``docs/bench.md``);
``main_bench`` takes a ``BenchConfig`` or a plain dict of its fields; ``run_bench`` takes loaded models and
``Method`` objects; ``graph_floor_ms`` times one CUDA-graph-captured target forward (the floor of any
token-by-token loop); ``compare_runs`` compares the tokens of two finished runs.
"""

from specdec.bench.config import (
    DEFAULT_METHODS,
    BenchConfig,
    check_compile_setting,
    check_method_specs,
    default_out_dir,
    main_bench,
    methods_from_specs,
    print_summary,
)
from specdec.bench.floor import bandwidth_floor, graph_floor_ms, median_ms
from specdec.bench.harness import Method, run_bench
from specdec.bench.report import (
    aggregate,
    compare_runs,
    format_header,
    format_notes,
    format_table,
    load_rows,
    method_colors,
    plot_summary,
    series_label,
    write_report,
)
from specdec.loading import load_prompts, zoo_dir

__all__ = [
    "DEFAULT_METHODS",
    "BenchConfig",
    "Method",
    "aggregate",
    "bandwidth_floor",
    "check_compile_setting",
    "check_method_specs",
    "compare_runs",
    "default_out_dir",
    "format_header",
    "format_notes",
    "format_table",
    "graph_floor_ms",
    "load_prompts",
    "load_rows",
    "main_bench",
    "median_ms",
    "method_colors",
    "methods_from_specs",
    "plot_summary",
    "print_summary",
    "run_bench",
    "series_label",
    "write_report",
    "zoo_dir",
]
