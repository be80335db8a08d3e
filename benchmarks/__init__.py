"""Scripts that measure kvserve, run from the repository root as ``python -m benchmarks.<name>``;
``benchmarks.common`` holds what they share. Results and their index: benchmarks/results/."""
