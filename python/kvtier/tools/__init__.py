"""kvtier's tools around vLLM (they talk to it over HTTP; none imports vLLM or torch unless asked to):

* ``launcher``: starting and stopping vLLM's API server (the tests, calibration, the benchmarks, the demo);
* ``client``: the HTTP client of a vLLM server and the parsing of its /metrics;
* ``longdoc``: the long-document TTFT benchmark (``python -m kvtier.tools.longdoc``, also ``python -m
  kvtier.bench_longdoc``);
* ``calibrate``: the break-even frontier and the thresholds file (``kvtier calibrate``, docs/calibration.md);
* ``replay``: a request trace replayed against a server (``kvtier replay``).
"""
