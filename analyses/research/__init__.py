"""Research scripts: one question each, run as `python -m analyses.research.NAME ...`, their
findings and commands recorded in analyses/RESULTS.md. They compose tasks/, models/ and interp/;
nothing else imports them."""
