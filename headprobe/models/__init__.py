"""Models: aliases, loading, identity."""
