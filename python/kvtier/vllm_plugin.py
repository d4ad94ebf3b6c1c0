"""vLLM general plugin (entry point group ``vllm.general_plugins``, name ``kvtier``; pyproject.toml).

vLLM runs every general plugin once in each of its processes (API server, engine core, workers) before it builds
the KV connector. ``register()`` adds ``KVTierSpec`` to vLLM's ``OffloadingSpecFactory`` and ``KVTierConnector`` to
its ``KVConnectorFactory`` by name, so that ``"kv_connector": "KVTierConnector"`` and
``"kv_connector_extra_config": {"spec_name": "KVTierSpec", ...}`` work without ``kv_connector_module_path`` and
``spec_module_path`` (the explicit ``"kvtier.vllm"`` keeps working: the factories consult a module path only for
names they do not know), and ``KVTierTier`` to the ``SecondaryTierFactory`` of vLLM's tiering, so that a
``secondary_tiers`` entry ``{"type": "KVTierTier", ...}`` works without ``module_path`` (and, on releases whose
tiering takes no out-of-tree tier, reaches kvtier's clear error instead of vLLM's "Unknown secondary tier type").
The registration is lazy: ``kvtier.vllm`` (and the vLLM version check in it) is imported
only when a server is configured with kvtier, so installing kvtier never affects a vLLM that does not use it.
``VLLM_PLUGINS`` (a comma-separated allow-list of plugin names) must include ``kvtier`` when it is set.
"""

from __future__ import annotations

import importlib
import logging

SPEC_NAME = "KVTierSpec"
CONNECTOR_NAME = "KVTierConnector"
TIER_NAME = "KVTierTier"
MODULE = "kvtier.vllm"
TIER_MODULE = "kvtier.vllm.tier"

_log = logging.getLogger("vllm.kvtier")


def _register(factory: type, method: str, name: str, module: str) -> None:
    registry = getattr(factory, "_registry", None)
    if isinstance(registry, dict) and name in registry:
        return  # registered already (vLLM may run a plugin more than once per process)
    getattr(factory, method)(name, module, name)


def register() -> None:
    """Registers KVTierSpec, KVTierConnector and KVTierTier with vLLM; idempotent, never raises (vLLM calls plugins
    without a guard, so an exception here would stop every vLLM start on this Python)."""
    for where, method, name, module in (
            ("vllm.v1.kv_offload.factory:OffloadingSpecFactory", "register_spec", SPEC_NAME, MODULE),
            ("vllm.distributed.kv_transfer.kv_connector.factory:KVConnectorFactory", "register_connector",
             CONNECTOR_NAME, MODULE),
            ("vllm.v1.kv_offload.tiering.factory:SecondaryTierFactory", "register_tier", TIER_NAME, TIER_MODULE)):
        try:
            mod, cls = where.split(":")
            factory = getattr(importlib.import_module(mod), cls)
            _register(factory, method, name, module)
        except Exception as e:  # noqa: BLE001 - a vLLM without this factory, or another incompatibility
            _log.warning("kvtier: could not register %s with vLLM (%s); name its module explicitly (%r)", name, e,
                         module)
