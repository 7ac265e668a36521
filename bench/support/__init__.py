"""Pieces the benchmark scripts share: CPU hogs beside the system under test, the jitter
error of a tap against the engine's emission times."""
