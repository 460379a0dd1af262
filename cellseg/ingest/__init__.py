"""`cellseg import`: bring your own EM (and labels) into the CellMap layout that the whole pipeline reads.

- `readers`: TIFF stacks and files, .npy, HDF5 (optional h5py) and zarr, read lazily in (z, y, x);
- `intensity`: the explicit uint8 conversion (a stated percentile window onto 1..255; 0 = no data);
- `labels`: per-class masks/ids and mapped integer volumes → CellMap class arrays (+ `all`);
- `pyramid`: OME-NGFF pyramids that halve the fine axes until isotropic, then all axes;
- `split`: the labelled box cut into training | gap | validation crops along one axis;
- `imported_root`, `configs`: the zarr groups, manifests, `datasplit.csv`, `data.yaml` and `train_*.yaml`;
- `importer`: `import_volume`, the checked, atomic driver.
"""
