"""Speed measured as ratios side by side in one run (never as timed assertions in tests)."""
