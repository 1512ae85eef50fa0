"""One case, run and judged: what ``execute.run_case`` needs and nothing of the run around it
(``convmatrix.runners`` lists the roles)."""
