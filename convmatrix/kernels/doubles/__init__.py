"""Test doubles: kernels wrong on purpose, to prove the harness catches them, and stand-ins for
libraries this machine lacks. Seeded bugs (``seeded``, measured by ``convmatrix adequacy``),
precision defects (``defects``), slowed kernels for the timing detector (``slowed``),
in-project implementations of the vLLM and torch_mlu_ops APIs (``vllm_standin``,
``mlu_standin``), and the adapters over them (``standins``) so the adapters' translations run
on a CPU."""
