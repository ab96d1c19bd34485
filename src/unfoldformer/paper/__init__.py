"""The paper's experiments (THEORY §7): figures 1–6, the reproduction run and its report.

One module per figure (`fig1_apollonius`, `fig23_alternating`, `fig4_kappa`,
`fig56_energy_curves`): `compute(...)` returns numbers without file I/O, `summary(result)` the
JSON-ready headline numbers, `plot(result, path)` writes the PNG. `reproduce.run_reproduction`
runs the figures of a `settings.ReproduceSettings` and writes every output; `report` renders
`report.md`.
"""
