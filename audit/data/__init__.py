"""Data sets: readers for the on-disk formats, lookup and verified download, the embedded sample."""
from audit.data.datasets import DATASETS, SOURCES, SPLITS, balanced_sample, embedded_sample, load_dataset, locate

__all__ = ["DATASETS", "SOURCES", "SPLITS", "balanced_sample", "embedded_sample", "load_dataset", "locate"]
