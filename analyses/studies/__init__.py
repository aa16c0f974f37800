"""Study modules: each exposes `STUDIES` (see analyses/runners/study.py); `workbench study --list` shows them."""
