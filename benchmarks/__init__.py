"""Speed and memory benchmarks with JSON output; run each as `python -m benchmarks.NAME` from the
repository root (`step_timing` and `profiling` are the helpers the CLIs share)."""
