"""The runners: the sweep engine (sweep.py: cells trained resumably, locally or on Ray through
ray_backend.py; lifeline.py makes workers die with their sweep) and the study runner (study.py),
which trains a study's cells through the sweep engine. The studies themselves are in
analyses/studies/."""
