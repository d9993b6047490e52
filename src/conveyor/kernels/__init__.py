"""Kernels: parse signatures, build ahead of time, cache binaries on disk."""
