"""Probes: retrieval, enhanced-retrieval and retrieval-reasoning head scores; layer retention."""
