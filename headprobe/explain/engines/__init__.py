"""Per-engine arithmetic."""
