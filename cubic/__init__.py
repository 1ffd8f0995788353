"""cubic: sharding plans, FP8 placement and co-design search for recommendation-model training."""
__version__ = "0.1.0"
