"""cellseg: train, ensemble and score organelle-segmentation models for the CellMap Segmentation Challenge.

Axes are always (z, y, x); physical sizes are in nanometres (nm).
"""

__version__ = "0.1.0"
