"""Task specs (one folder per task), loaders, synthetic data generators and dataset converters.

Depends on ``schemas`` only.
"""
