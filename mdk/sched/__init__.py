"""Warmup LR schedulers (``conf/scheduler/*.yaml`` targets ``mdk.sched.schedules.<Class>``).

``lr(it) = warmup_factor(it) * main_lr(t(it))``, the main clock running from iteration 0
(``warmup.mode: mdk``) or starting after warmup (``gti``); see :mod:`mdk.sched.base`.
"""
