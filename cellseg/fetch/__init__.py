"""`cellseg fetch`: download real CellMap crops, only the EM chunks around them, resumably.

- `select`: which crops (ids, classes, datasets, splits) and at which voxel sizes;
- `fetch_plan`: which arrays, levels and chunks a selection needs (the same level rule as the official toolbox);
- `size`: how many bytes that is, probed before anything is downloaded (`--dry-run`);
- `download`: the resumable, parallel download into a data root in the CellMap layout.
"""
