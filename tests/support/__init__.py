"""Helpers shared by tests and benches (not tests themselves): fakes, generated task repos, data builders,
vLLM's CPU test models (``vllm_testmodel``), a headless browser for the HTML reports (``browser``)."""
