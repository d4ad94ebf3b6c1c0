"""Bad input (SPEC V4): every kvtier_* key of kv_connector_extra_config with invalid values, and the engine's
Python options dict (kvtier._kvtier.Engine). Each is refused at startup with a message naming the key and what is
accepted. A new key without a row here fails test_every_key_has_bad_values."""

import os

import pytest

import kvtier.vllm as kv

# key -> invalid values (each must raise ValueError naming the key)
BAD = {
    "kvtier_root": ["relative/path", "/nonexistent/kvtier-root", 7, ""],
    "kvtier_pool_bytes": ["lots", -1, 0, "12 parsecs", True, 1.5e3],
    "kvtier_demand_reserve_slots": [-1, "x", 1 << 21, 2.5],
    "kvtier_io_mode": ["fast", 1, ""],
    "kvtier_backend": ["aio", None],
    "kvtier_io_depth": [0, 5000, "deep", -3],
    "kvtier_op_timeout_ms": [0, -1, "soon", 10**10],
    "kvtier_disk_budget_bytes": [-5, "half", [1]],
    "kvtier_high_watermark": [1.5, -0.1, "high"],
    "kvtier_low_watermark": [2, -1, "low"],
    "kvtier_dir_mode": ["0640", 0o10750, "rwx", True, "999", "0o7777", "0777", "02770"],
    "kvtier_negative_cache_ms": [-1, 10**9, "never"],
    "kvtier_shared_negative_cache_ms": [-1, 10**9, "never"],
    "kvtier_touch_interval_s": [-1, 1 << 40, "hourly"],
    "kvtier_reactors": [-1, 65, "many", 2.5],
    "kvtier_max_writes_at_disk": [-1, 1025, "half", 1.5],
    "kvtier_write_piece_bytes": [-1, "big", "2GiB", 1.5],
    "kvtier_fsync": ["maybe", 2, None],
    "kvtier_allow_insecure_root": ["sure", 3],
    "kvtier_checksum_secret": ["short", 12345, "file:/nonexistent/kvtier.key"],
    "kvtier_trace_path": [5, ["a"]],
    "kvtier_model_tag": [1, None],
    "kvtier_revision": [2.0, {}],
    "kvtier_copy_threads": [0, 65, "many"],
    "kvtier_cuda_copy_mode": ["dma", 1, ""],
    "kvtier_load_order": ["fifo", 1, ""],
    "kvtier_load_queue_mib": [0, -1, "big", 1.5, (1 << 20) + 1],
    "kvtier_attach_timeout_s": [0, -1, "long", 1e9],
    "kvtier_stats_interval_s": [-1, "often", 1e12],
    "kvtier_dram_policy": ["fifo", 3],
    "kvtier_dram_max_slots": [-1, 1 << 21, "all"],
    "kvtier_preload_max_inflight": [-1, "some", 1 << 21],
    "kvtier_thresholds_path": [5, ["t.json"]],
}


def test_every_key_has_bad_values():
    missing = sorted(set(kv.KVTIER_KEYS) - set(BAD))
    assert not missing, f"add invalid values for {missing} to BAD"


@pytest.mark.parametrize("key,value", [(k, v) for k, vs in BAD.items() for v in vs])
def test_bad_value_is_refused_naming_the_key(tmp_path, key, value):
    extra = {"kvtier_root": str(tmp_path)}
    extra[key] = value
    with pytest.raises(ValueError, match=key):
        kv.parse_config(extra)


def test_watermarks_in_the_wrong_order_are_refused(tmp_path):
    with pytest.raises(ValueError, match="kvtier_low_watermark"):
        kv.parse_config({"kvtier_root": str(tmp_path), "kvtier_low_watermark": 0.9, "kvtier_high_watermark": 0.5})


def test_unknown_and_misspelt_keys_are_refused_with_a_hint(tmp_path):
    with pytest.raises(ValueError, match="did you mean 'kvtier_checksum_secret'"):
        kv.parse_config({"kvtier_root": str(tmp_path), "checksum_secret": "0123456789abcdef"})
    with pytest.raises(ValueError, match="unknown kv_connector_extra_config key 'kvtier_secret'"):
        kv.parse_config({"kvtier_root": str(tmp_path), "kvtier_secret": "x"})


def test_good_security_values_are_accepted(tmp_path):
    key = tmp_path / "k3.key"
    key.write_text("0123456789abcdef0123\n")
    os.chmod(key, 0o600)
    cfg = kv.parse_config({"kvtier_root": str(tmp_path), "kvtier_checksum_secret": f"file:{key}",
                           "kvtier_allow_insecure_root": "true", "kvtier_dir_mode": "0770"})
    assert cfg["kvtier_checksum_secret"] == f"file:{key}"
    assert cfg["kvtier_allow_insecure_root"] is True
    assert cfg["kvtier_dir_mode"] == 0o770


def _engine_options(root):
    return {"root": str(root), "model": "m", "revision": "r", "kv_dtype": "bfloat16", "tokens_per_chunk": 16,
            "blocks_per_chunk": 1, "block_bytes": 4096, "pool_bytes": 1 << 20}


# Python options dict of the extension: option -> (bad value, exception type)
BAD_ENGINE = [
    ("allow_insecure_root", "yes", TypeError),
    ("checksum_secret", 42, TypeError),
    ("checksum_secret", "short", ValueError),
    ("checksum_secret", b"short-bytes", ValueError),
    ("dir_mode", 0o640, ValueError),
    ("io_depth", 0, ValueError),
    ("backend", "aio", ValueError),
    ("io_mode", "fast", ValueError),
    ("high_watermark", "x", TypeError),
    ("pool_bytes", -1, (TypeError, ValueError, OverflowError)),
    ("no_such_option", 1, ValueError),
]


@pytest.mark.parametrize("name,value,exc", BAD_ENGINE)
def test_engine_options_dict_refuses_bad_values_naming_them(tmp_path, name, value, exc):
    ext = pytest.importorskip("kvtier._kvtier")
    opts = _engine_options(tmp_path)
    opts[name] = value
    with pytest.raises(exc) as info:
        ext.Engine(opts)
    assert name in str(info.value) or "checksum_secret" in str(info.value), str(info.value)


def test_engine_refuses_a_world_writable_root_unless_allowed(tmp_path):
    ext = pytest.importorskip("kvtier._kvtier")
    root = tmp_path / "open"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(Exception, match="allow_insecure_root"):
        ext.Engine(_engine_options(root))
    opts = _engine_options(root)
    opts["allow_insecure_root"] = True
    ext.Engine(opts)


# ------------------------------------------------------------------------------------------ one options schema
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_engine_keys_are_the_schema_rows_offered_to_vllm():
    """The kvtier_* keys of engine options are exactly the schema's rows with a vllm_key, with its default and range:
    a key added, removed or changed in src/engine/options.cc shows up here without a second table to edit."""
    ext = pytest.importorskip("kvtier._kvtier")
    rows = {r["vllm_key"]: r for r in ext.option_schema() if r["vllm_key"] is not None}
    engine_keys = {name[len("kvtier_"):]: key for name, key in kv.KVTIER_KEYS.items() if key.engine_key}
    assert engine_keys.keys() == rows.keys()
    for k, key in engine_keys.items():
        r = rows[k]
        assert key.engine_key == r["name"]
        assert (key.lo, key.hi) == (r["min"], r["max"]), k
        assert key.default == (None if r["name"] == "root" else r["default"]), k
    assert not set(kv.config.ADAPTER_KEYS) & set(rows), "an adapter key shadows an engine option"


def test_doc_table_is_the_generated_one():
    with open(os.path.join(REPO, "docs", "vllm-integration.md")) as f:
        in_doc = kv.config.doc_table(f.read())
    assert in_doc is not None, "docs/vllm-integration.md lost its generated-table markers"
    assert in_doc == kv.config.options_table(), (
        "docs/vllm-integration.md's key table differs from the schema: run "
        "python -m kvtier.vllm.config --update docs/vllm-integration.md")


def test_every_key_a_user_may_leave_out_says_why_its_default():
    """docs/vllm-integration.md, "Why these defaults", names every kvtier key that has a default: a new option's
    default comes with its reason."""
    with open(os.path.join(REPO, "docs", "vllm-integration.md")) as f:
        text = f.read()
    assert "### Why these defaults" in text
    why = text.split("### Why these defaults", 1)[1].split("\n## ", 1)[0]
    missing = [name for name, key in kv.KVTIER_KEYS.items() if key.default is not None and f"`{name}`" not in why]
    assert not missing, f"docs/vllm-integration.md, 'Why these defaults', does not say why the default of: {missing}"


def test_engine_options_of_a_spec_pass_the_engines_checks(tmp_path):
    """What KVTierSpec.engine_options() hands the engine is accepted by the engine's own option checks."""
    ext = pytest.importorskip("kvtier._kvtier")
    cfg = kv.parse_config({"kvtier_root": str(tmp_path), "kvtier_pool_bytes": "2GiB", "kvtier_dir_mode": "0770",
                           "kvtier_fsync": "true", "kvtier_io_depth": 64})
    engine = {key.engine_key: cfg[name] for name, key in kv.KVTIER_KEYS.items() if key.engine_key}
    ext.check_options(engine)
    assert engine["pool_bytes"] == 2 << 30 and engine["dir_mode"] == 0o770 and engine["fsync_on_publish"] is True
