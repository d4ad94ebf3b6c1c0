"""vLLM general plugin (entry point group ``vllm.general_plugins``, name ``kvtier``; pyproject.toml).

vLLM runs every general plugin once in each of its processes (API server, engine core, workers) before it builds
the KV connector. ``register()`` adds ``KVTierSpec`` to vLLM's ``OffloadingSpecFactory`` by name, so that
``"kv_connector_extra_config": {"spec_name": "KVTierSpec", ...}`` works without ``spec_module_path`` (the explicit
``"spec_module_path": "kvtier.vllm"`` keeps working: the factory only consults the module path for names it does
not know). The registration is lazy: ``kvtier.vllm`` (and the vLLM version check in it) is imported only when a
server is configured with the spec, so installing kvtier never affects a vLLM that does not use it.
``VLLM_PLUGINS`` (a comma-separated allow-list of plugin names) must include ``kvtier`` when it is set.
"""

from __future__ import annotations

import logging

SPEC_NAME = "KVTierSpec"
SPEC_MODULE = "kvtier.vllm"

_log = logging.getLogger("vllm.kvtier")


def register() -> None:
    """Registers KVTierSpec with vLLM's offloading spec factory; idempotent, never raises (vLLM calls plugins
    without a guard, so an exception here would stop every vLLM start on this Python)."""
    try:
        from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    except Exception as e:  # a vLLM without the offloading API: nothing to register into
        _log.debug("kvtier: vLLM has no OffloadingSpecFactory (%s); KVTierSpec not registered", e)
        return
    try:
        registry = getattr(OffloadingSpecFactory, "_registry", None)
        if isinstance(registry, dict) and SPEC_NAME in registry:
            return
        OffloadingSpecFactory.register_spec(SPEC_NAME, SPEC_MODULE, SPEC_NAME)
    except Exception as e:
        _log.warning("kvtier: could not register %s with vLLM (%s); use \"spec_module_path\": %r", SPEC_NAME, e,
                     SPEC_MODULE)
