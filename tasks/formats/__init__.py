"""Dataset rows -> validated swebench 5.x rows: the loaders, per-dataset adapters, test specs and eval scripts."""
