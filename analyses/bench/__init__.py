"""The benchmarks behind `workbench benchmark` (analyses/cli/benchmark.py): task generation rate,
training throughput and FLOP/s (throughput.py), exact vs TransformerLens vs attribution patching
(patching.py, also `python -m analyses.bench.patching`), and the cost of snapshots (snapshots.py)."""
