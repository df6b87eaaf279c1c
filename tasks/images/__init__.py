"""Task images: built offline and cached, present on every node before the first container, history scrub policy."""
