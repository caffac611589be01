import pickle
from pathlib import Path

import pytest
from pydantic import ValidationError

from raydelay.config import (
    Config,
    S3StorageConfig,
    config_from_dict,
    config_to_dict,
    load_config,
)
from raydelay.errors import InvalidArgument

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_defaults_match_the_design_table():
    c = Config()
    assert c.storage.kind == "local"
    assert c.storage.local.root == "./.raydelay/data"
    assert c.delayed.tracker == "bucket"
    assert c.delayed.tick_time_ms == 10
    assert c.delayed.strict is True
    assert c.delayed.min_index_count_per_bucket == 50_000
    assert c.delayed.max_indexes_per_segment == 5_000
    assert c.delayed.max_time_step_per_segment_ms == 300_000
    assert c.delayed.max_num_buckets == 64
    assert c.delayed.max_delay_ms == 0
    assert c.topic.max_entries_per_ledger == 50_000
    assert c.topic.group_commit_ms == 0
    assert c.topic.max_message_bytes == 5 * 1024 * 1024
    assert c.subscription.ack_timeout_s is None


def test_shipped_default_toml_equals_the_embedded_default():
    assert load_config(ROOT / "configs" / "default.toml", env={}) == Config()


def test_shipped_s3_toml_selects_s3_without_credentials():
    c = load_config(ROOT / "configs" / "s3.toml", env={})
    assert c.storage.kind == "s3"
    assert c.storage.s3.bucket
    text = (ROOT / "configs" / "s3.toml").read_text().lower()
    assert "secret" not in text.replace("are not read", "")
    assert not {"access_key", "secret_key"} & set(type(c.storage.s3).model_fields)


def test_no_path_gives_the_embedded_default():
    assert load_config(env={}) == Config()


def test_a_file_overrides_single_values_and_keeps_the_rest(tmp_path):
    c = load_config(write(tmp_path, "[delayed]\ntick_time_ms = 3\nstrict = false\n"), env={})
    assert c.delayed.tick_time_ms == 3 and c.delayed.strict is False
    assert c.delayed.max_num_buckets == 64


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(InvalidArgument, match=r"delayed\.tick_ms: unknown config key"):
        load_config(write(tmp_path, "[delayed]\ntick_ms = 3\n"), env={})


def test_unknown_section_is_named(tmp_path):
    with pytest.raises(InvalidArgument, match=r"^nope: unknown config key"):
        load_config(write(tmp_path, "[nope]\nx = 1\n"), env={})


def test_wrong_type_is_named(tmp_path):
    with pytest.raises(InvalidArgument, match=r"delayed\.tick_time_ms: expected int, got str"):
        load_config(write(tmp_path, '[delayed]\ntick_time_ms = "ten"\n'), env={})
    with pytest.raises(InvalidArgument, match=r"delayed\.strict: expected bool, got int"):
        load_config(write(tmp_path, "[delayed]\nstrict = 1\n"), env={})
    with pytest.raises(InvalidArgument, match=r"storage\.local: expected a table"):
        load_config(write(tmp_path, '[storage]\nlocal = "x"\n'), env={})


def test_out_of_range_values_are_named(tmp_path):
    with pytest.raises(InvalidArgument, match=r"delayed\.tick_time_ms: must be > 0"):
        load_config(write(tmp_path, "[delayed]\ntick_time_ms = 0\n"), env={})
    with pytest.raises(InvalidArgument, match=r"storage\.kind: must be one of"):
        load_config(write(tmp_path, '[storage]\nkind = "ftp"\n'), env={})
    with pytest.raises(InvalidArgument, match=r"storage\.s3\.bucket: required"):
        load_config(write(tmp_path, '[storage]\nkind = "s3"\n'), env={})


def test_hosts_per_node_is_one_per_cpu_or_a_sane_count(tmp_path):
    # (each host is a whole process: 10**12 of them would hang the coordinator's choice)
    for key in ("hosts_per_node", "subscription_hosts_per_node"):
        for bad in (0, -2, 65, 10**12):
            with pytest.raises(InvalidArgument, match=rf"placement\.{key}: must be 1\.\.64"):
                load_config(write(tmp_path, f"[placement]\n{key} = {bad}\n"), env={})
        for good in (-1, 1, 64):
            got = load_config(write(tmp_path, f"[placement]\n{key} = {good}\n"), env={})
            assert getattr(got.placement, key) == good


def test_env_overrides_are_typed_by_the_field():
    env = {
        "RAYDELAY_DELAYED__TICK_TIME_MS": "25",
        "RAYDELAY_DELAYED__STRICT": "false",
        "RAYDELAY_STORAGE__LOCAL__ROOT": "/tmp/rd",
        "RAYDELAY_SUBSCRIPTION__ACK_TIMEOUT_S": "2.5",
        "RAYDELAY_CONFIG": "ignored: not a value override",
        "UNRELATED": "x",
    }
    c = load_config(env=env)
    assert c.delayed.tick_time_ms == 25
    assert c.delayed.strict is False
    assert c.storage.local.root == "/tmp/rd"
    assert c.subscription.ack_timeout_s == 2.5


def test_env_wins_over_the_file(tmp_path):
    path = write(tmp_path, "[delayed]\ntick_time_ms = 3\n")
    c = load_config(path, env={"RAYDELAY_DELAYED__TICK_TIME_MS": "7"})
    assert c.delayed.tick_time_ms == 7


def test_env_none_clears_an_optional_value(tmp_path):
    path = write(tmp_path, "[subscription]\nack_timeout_s = 30.0\n")
    assert (
        load_config(
            path, env={"RAYDELAY_SUBSCRIPTION__ACK_TIMEOUT_S": "none"}
        ).subscription.ack_timeout_s
        is None
    )


def test_bad_env_values_are_named():
    with pytest.raises(
        InvalidArgument,
        match=r"delayed\.tick_time_ms: RAYDELAY_DELAYED__TICK_TIME_MS='x' is not a valid int",
    ):
        load_config(env={"RAYDELAY_DELAYED__TICK_TIME_MS": "x"})
    with pytest.raises(InvalidArgument, match=r"unknown config key 'delayed\.nope'"):
        load_config(env={"RAYDELAY_DELAYED__NOPE": "1"})
    with pytest.raises(InvalidArgument, match=r"not a valid bool"):
        load_config(env={"RAYDELAY_DELAYED__STRICT": "maybe"})


def test_missing_or_broken_file_is_a_clear_error(tmp_path):
    with pytest.raises(InvalidArgument, match="file not found"):
        load_config(tmp_path / "absent.toml", env={})
    with pytest.raises(InvalidArgument, match="not valid TOML"):
        load_config(write(tmp_path, "[delayed\n"), env={})


def test_configs_are_frozen():
    with pytest.raises(ValidationError, match="frozen"):
        Config().delayed.tick_time_ms = 5  # type: ignore[misc]


def test_every_config_key_is_in_the_docs_table():
    from raydelay.config import config_to_dict

    def keys(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from keys(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    table = (ROOT / "docs" / "configuration.md").read_text()
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")]
    documented = set()
    for row in rows:  # "storage.s3.bucket / prefix" documents two keys
        head, *more = [part.strip() for part in row.split("/")]
        documented.add(head)
        documented.update(head.rsplit(".", 1)[0] + "." + m for m in more)
    missing = sorted(set(keys(config_to_dict(Config()))) - documented)
    assert not missing, f"keys missing from docs/configuration.md's table: {missing}"


def test_shipped_cluster_yaml_is_a_ray_up_config_with_java_and_raydelay():
    yaml = pytest.importorskip("yaml")
    cluster = yaml.safe_load((ROOT / "configs" / "cluster.yaml").read_text())
    assert cluster["head_node_type"] in cluster["available_node_types"]
    setup = " ".join(cluster["setup_commands"])
    assert "openjdk-17" in setup and "pip install" in setup
    assert "configs/s3.toml" in " ".join(cluster["head_start_ray_commands"])
    assert "secret" not in (ROOT / "configs" / "cluster.yaml").read_text().lower()


def test_a_local_store_is_refused_on_several_nodes_unless_shared():
    from raydelay.config import config_from_dict, store_refusal

    local = config_from_dict({"storage": {"kind": "local"}}).storage
    shared = config_from_dict({"storage": {"local": {"shared": True}}}).storage
    s3 = config_from_dict({"storage": {"kind": "s3", "s3": {"bucket": "b"}}}).storage
    assert store_refusal(local, 1) is None
    why = store_refusal(local, 3)
    assert why is not None and "3 nodes" in why and "storage.local.shared" in why
    assert store_refusal(shared, 3) is None
    assert store_refusal(s3, 3) is None


def test_a_wrong_type_in_a_nested_table_names_the_full_key(tmp_path):
    # Given a nested int written as text, and an int where a table belongs
    text = '[storage.s3]\nmax_attempts = "3"\n'
    # Then each is refused naming its key, from a file, from a dict and when built directly
    with pytest.raises(InvalidArgument, match=r"^storage\.s3\.max_attempts: expected int, got str"):
        load_config(write(tmp_path, text), env={})
    with pytest.raises(
        InvalidArgument, match=r"^storage\.s3\.max_attempts: expected int, got bool"
    ):
        config_from_dict({"storage": {"s3": {"max_attempts": True}}})
    with pytest.raises(InvalidArgument, match=r"^storage\.s3: expected a table, got int"):
        config_from_dict({"storage": {"s3": 3}})
    with pytest.raises(InvalidArgument, match=r"^storage\.s3\.max_attempts: must be > 0, got 0$"):
        S3StorageConfig(max_attempts=0)


def test_an_unknown_nested_key_is_refused_from_a_file_a_dict_and_the_environment(tmp_path):
    with pytest.raises(InvalidArgument, match=r"^storage\.s3\.access_key: unknown config key"):
        load_config(write(tmp_path, '[storage.s3]\naccess_key = "x"\n'), env={})
    with pytest.raises(InvalidArgument, match=r"^topic\.ledger_size: unknown config key"):
        config_from_dict({"topic": {"ledger_size": 1}})
    with pytest.raises(
        InvalidArgument,
        match=r"^RAYDELAY_STORAGE__S3__ACCESS_KEY: unknown config key 'storage\.s3\.access_key'",
    ):
        load_config(env={"RAYDELAY_STORAGE__S3__ACCESS_KEY": "x"})
    with pytest.raises(InvalidArgument, match=r"^RAYDELAY_NOPE__X: unknown config key 'nope'"):
        load_config(env={"RAYDELAY_NOPE__X": "1"})


def test_env_overrides_a_nested_int_and_completes_the_files_table(tmp_path):
    # Given a file that selects S3 without a bucket, and the bucket and attempts in the env
    path = write(tmp_path, '[storage]\nkind = "s3"\n[storage.s3]\nmax_attempts = 5\n')
    env = {"RAYDELAY_STORAGE__S3__BUCKET": "b", "RAYDELAY_STORAGE__S3__MAX_ATTEMPTS": "7"}
    # When it is loaded
    c = load_config(path, env=env)
    # Then the environment's values are typed and win, and the file's kind stays
    assert c.storage.kind == "s3" and c.storage.s3.bucket == "b"
    assert c.storage.s3.max_attempts == 7 and isinstance(c.storage.s3.max_attempts, int)


def test_a_bad_env_value_names_the_key_and_the_variable():
    with pytest.raises(
        InvalidArgument,
        match=r"^storage\.s3\.max_attempts: "
        r"RAYDELAY_STORAGE__S3__MAX_ATTEMPTS='three' is not a valid int$",
    ):
        load_config(env={"RAYDELAY_STORAGE__S3__MAX_ATTEMPTS": "three"})
    with pytest.raises(
        InvalidArgument,
        match=r"^storage\.s3\.max_attempts: must be > 0, got 0 "
        r"\(from RAYDELAY_STORAGE__S3__MAX_ATTEMPTS\)$",
    ):
        load_config(env={"RAYDELAY_STORAGE__S3__MAX_ATTEMPTS": "0"})
    with pytest.raises(
        InvalidArgument, match=r"^RAYDELAY_DELAYED__STRICT__X: delayed\.strict is not a table"
    ):
        load_config(env={"RAYDELAY_DELAYED__STRICT__X": "1"})


def test_a_config_pickles_and_survives_its_dict_form():
    c = load_config(
        env={"RAYDELAY_DELAYED__MAX_NUM_BUCKETS": "-1", "RAYDELAY_SUBSCRIPTION__ACK_TIMEOUT_S": "2"}
    )
    assert pickle.loads(pickle.dumps(c)) == c
    assert config_from_dict(config_to_dict(c)) == c
    assert c.subscription.ack_timeout_s == 2.0 and c.delayed.max_num_buckets == -1


def test_config_and_config_from_dict_never_read_the_environment(monkeypatch):
    monkeypatch.setenv("RAYDELAY_DELAYED__TICK_TIME_MS", "99")
    assert Config().delayed.tick_time_ms == 10
    assert config_from_dict({}).delayed.tick_time_ms == 10
    assert load_config().delayed.tick_time_ms == 99
