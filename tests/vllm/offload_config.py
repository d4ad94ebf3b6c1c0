"""vLLM's offloading config dataclasses built the same way on every supported release (docs/vllm-version.md).

Releases add required fields (0.28: OffloadingParallelConfig.data_parallel_size/data_parallel_rank_local; 0.30:
OffloadingGroupConfig.group_id); `build` fills those a caller leaves out with the value a single-engine,
single-group vLLM gives them, and refuses any other missing field."""

import dataclasses

# field -> the value build_offloading_config gives it for one engine (no data parallelism) and one KV-cache group
# (0.30+: the group's index in the KVCacheConfig).
DEFAULTS = {"data_parallel_size": 1, "data_parallel_rank_local": None, "group_id": 0}


def build(cls, **kw):
    for f in dataclasses.fields(cls):
        if f.name in kw or f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        if f.name not in DEFAULTS:
            raise TypeError(f"{cls.__name__}.{f.name} is required by this vLLM and unknown to offload_config.py")
        kw[f.name] = DEFAULTS[f.name]
    return cls(**kw)
