"""verl: reinforcement-learning post-training for large language models (HybridFlow design)."""

__version__ = "0.1.0"
