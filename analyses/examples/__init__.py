"""Examples for `workbench analyze-model` (docs/outside-models.md): model factories and their
prompt pairs files."""
