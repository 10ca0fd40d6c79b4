"""From options to a run ready to train. May import cluster/, step/ and reporting/."""
