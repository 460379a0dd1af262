"""Whole-volume prediction (`cellseg predict-volume`): a dataset's EM predicted block by block on the daisy
scheduler into one multiscale store (store.py), with instances stitched across blocks."""
