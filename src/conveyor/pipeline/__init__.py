"""The streaming pipeline: plan, staging, engine, sources and sinks."""
