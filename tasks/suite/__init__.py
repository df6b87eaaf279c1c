"""Sources and generator of the bundled task suite (see README.md)."""
