"""Command-line entry points; the only modules that define absl flags."""
