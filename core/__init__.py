"""core: the foundation every other package stands on: errors, atomic files, the run lock, config loading."""
