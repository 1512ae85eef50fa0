"""Kernels this project ships: the framework path ``torch`` (``framework``), the seed's MLU
design ``tiled`` (``tiled``) and the tile planner it and ``convmatrix plan`` use (``planner``,
free of torch)."""
