"""The convmatrix pytest plugin (registered under ``pytest11``); filled in by the runners."""
