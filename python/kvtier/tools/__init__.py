"""kvtier's tools around vLLM (they talk to it over HTTP; none imports vLLM or torch unless asked to):

* ``launcher``: starting and stopping vLLM's API server, the one used everywhere: the vLLM tests
  (tests/vllm/server.py, the README's commands in tests/vllm/test_readme.py, the two-host run), ``calibrate``, the
  benchmarks (bench/h200/headline.py; bench/tier/acceptance.py through tests/vllm/server.py) and, through
  ``python -m kvtier.tools.launcher serve``, scripts/demo.sh and scripts/vllm_smoke.sh;
* ``client``: the HTTP client of a vLLM server and the parsing of its /metrics;
* ``longdoc``: the long-document TTFT benchmark (``python -m kvtier.tools.longdoc``, also ``python -m
  kvtier.bench_longdoc``);
* ``calibrate``: the break-even frontier and the thresholds file (``kvtier calibrate``, docs/calibration.md);
* ``replay``: a request trace replayed against a server (``kvtier replay``).
"""
