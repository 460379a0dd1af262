"""Post-processing: class probabilities → semantic masks and instance ids, on the CPU or a GPU.

- `instances` (algorithm + CPU path), `semantic` (CPU path), `morphology` (CPU building blocks),
  `gpu` (the same algorithm in torch, CPU or CUDA tensors), `spec` (the exact shared quantities);
- `native`: one class decoded on another grid than the model's (a crop's annotation grid), `annotation`: where
  each (crop, label) is annotated;
- `hierarchy`: options that make predictions obey the class relations (a group contains its atoms; atoms
  exclude each other), edits of the probabilities before decoding;
- `params`: per-class parameters and their JSON file; `tune`: grid search on validation crops against
  the challenge metric; `apply`: a probability store → a segmentation store (on the annotation grids by default).

Example:
    >>> from cellseg.postprocess import InstanceParams, segment_instances
    >>> ids = segment_instances(prob, boundary, voxel_size_nm=(8, 8, 8),
    ...                         params=InstanceParams(seed_distance_nm=16.0))  # doctest: +SKIP
"""

from cellseg.postprocess.apply import postprocess_store, segment_class
from cellseg.postprocess.instances import segment_instances
from cellseg.postprocess.params import InstanceParams, ParamSet, SemanticParams
from cellseg.postprocess.semantic import segment_semantic

__all__ = ["InstanceParams", "ParamSet", "SemanticParams", "postprocess_store", "segment_class",
           "segment_instances", "segment_semantic"]
