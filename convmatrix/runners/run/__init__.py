"""One run, executor-neutral: the controller and what it records into and reports
(``convmatrix.runners`` lists the roles)."""
