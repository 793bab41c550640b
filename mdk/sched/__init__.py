"""Warmup LR schedulers (``conf/scheduler/*.yaml`` targets ``mdk.sched.schedules.<Class>``).

Composition rule (see :mod:`mdk.sched.base` and docs/schedulers.md):
``lr(it) = warmup_factor(it) * main_lr(t(it))`` where the main schedule's clock ``t`` runs from
iteration 0, so warmup iterations count toward step_size / milestones / T_max / T_0
(``warmup.mode: mdk``, the default). ``warmup.mode: gti`` is the GTI MDK's rule instead: warmup
ramps toward the base lr and the main schedule starts after it.
"""
