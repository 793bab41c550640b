"""Warmup LR schedulers (``conf/scheduler/*.yaml`` targets ``mdk.sched.schedules.<Class>``;
the rule: docs/schedulers.md)."""
