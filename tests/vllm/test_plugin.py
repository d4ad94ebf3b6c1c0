"""kvtier's vLLM plugin (entry point `kvtier` in `vllm.general_plugins`, python/kvtier/vllm_plugin.py): after
`pip install .`, vLLM's own plugin loader makes "spec_name": "KVTierSpec" and "kv_connector": "KVTierConnector"
resolve without module paths (the e2e servers are configured so, tests/vllm/server.py), and the explicit forms keep
resolving to the same classes."""

import importlib.metadata as md

import kvtier.vllm as kv
from kvtier import vllm_plugin
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.plugins import load_general_plugins
from vllm.v1.kv_offload.factory import OffloadingSpecFactory


def test_entry_point_is_installed():
    eps = [ep for ep in md.entry_points(group="vllm.general_plugins") if ep.name == "kvtier"]
    assert len(eps) == 1, "kvtier's vllm.general_plugins entry point is not installed (pip install . in this venv)"
    assert eps[0].value == "kvtier.vllm_plugin:register"
    assert eps[0].load() is vllm_plugin.register


def test_spec_name_alone_resolves_after_vllms_plugin_loader():
    load_general_plugins()  # what vLLM runs in the API server, engine core and worker processes
    assert OffloadingSpecFactory.get_spec_cls({"spec_name": "KVTierSpec"}) is kv.KVTierSpec
    # the explicit form resolves to the same class
    cls = OffloadingSpecFactory.get_spec_cls({"spec_name": "KVTierSpec", "spec_module_path": "kvtier.vllm"})
    assert cls is kv.KVTierSpec
    assert KVConnectorFactory._registry["KVTierConnector"]() is kv.KVTierConnector


def test_register_is_idempotent():
    vllm_plugin.register()
    vllm_plugin.register()  # vLLM may run plugins more than once per process; a second register must not raise
    assert OffloadingSpecFactory.get_spec_cls({"spec_name": "KVTierSpec"}) is kv.KVTierSpec
