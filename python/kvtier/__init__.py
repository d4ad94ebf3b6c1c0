"""kvtier Python package (vLLM integration helpers)."""
