"""cost_models."""
