"""Memory: the device pool and pinned host memory."""
