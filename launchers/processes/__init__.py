"""How the ranks of a run start (torch's elastic agent), meet (one join path) and log."""
