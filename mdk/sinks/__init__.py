"""Metric sinks (TensorBoard, wandb, or none): the null sink and its interface (base.py), one
module per sink, the logger group's schema and checks (config.py) and the builder (build.py)."""
