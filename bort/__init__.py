"""Bort / DBort optimizers and constraint metrics."""
