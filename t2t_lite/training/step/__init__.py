"""The compiled train step and what runs inside it, per replica. May import cluster/."""
