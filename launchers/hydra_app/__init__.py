"""The command line around Hydra: entry, one-line errors, callbacks, submitit launchers."""
