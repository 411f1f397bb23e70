"""Reproduction and measurement scripts; run each as `python -m scripts.NAME` from the repository
root (demo.sh is a shell script)."""
