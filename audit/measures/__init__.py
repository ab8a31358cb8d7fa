"""Measures the checks are built from: map similarity, heatmaps, bootstrap statistics."""
from audit.measures.heatmaps import ReferenceMaps, heatmaps
from audit.measures.similarity import hog_features, hog_similarity, normalize_map, reduce_map, spearman, ssim
from audit.measures.statistics import bootstrap_ci, summarize

__all__ = ["ReferenceMaps", "bootstrap_ci", "heatmaps", "hog_features", "hog_similarity", "normalize_map",
           "reduce_map", "spearman", "ssim", "summarize"]
