"""What the host measures and records about a run. May import cluster/ and step/."""
