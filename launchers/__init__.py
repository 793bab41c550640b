"""How runs start, outside the library: processes/ (ranks start, meet, log), hydra_app/ (the
command line around Hydra), reports/ (what a run and a sweep print); at the top the tools
bootstrap.py (first-use installer and plugin path, standard library only) and align.py
(``python -m launchers.align``)."""
