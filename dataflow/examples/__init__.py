"""Runnable examples: ``python -m dataflow.examples.quickstart``."""
