"""How the ranks of a run start, meet and log (spawn, torchrun/SLURM join, rendezvous, logs)."""
