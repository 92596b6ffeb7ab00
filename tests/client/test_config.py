import pytest

from fusion_shim.config import Config, ConfigError


def test_defaults():
    c = Config.load(env={})
    assert c.policy == "auto" and c.worker is None and c.timeout == 60.0 and not c.strict


def test_precedence_env_then_arguments():
    env = {"FUSION_SHIM_POLICY": "remote", "FUSION_SHIM_TIMEOUT": "5"}
    assert Config.load(env=env).policy == "remote"
    c = Config.load(env=env, policy="local")
    assert c.policy == "local" and c.timeout == 5.0


@pytest.mark.parametrize("env, listed", [
    ({"FUSION_SHIM_POLICY": "fast"}, "auto, local, remote"),
    ({"FUSION_SHIM_DEVICE": "tpu"}, "auto, cpu, cuda or cuda:N"),
    ({"FUSION_SHIM_QUIET": "maybe"}, "1, 0, true, false"),
    ({"FUSION_SHIM_TIMEOUT": "-1"}, "must be > 0"),
    ({"FUSION_SHIM_TIMEOUT": "soon"}, "positive number"),
    ({"FUSION_SHIM_WORKER": "http://x"}, "inproc://, ipc://, tcp://"),
    ({"FUSION_SHIM_POLCY": "local"}, "FUSION_SHIM_POLICY"),
])
def test_invalid_values_list_the_valid_ones(env, listed):
    with pytest.raises(ConfigError) as err:
        Config.load(env=env)
    assert listed in str(err.value)


def test_invalid_argument_value():
    with pytest.raises(ConfigError, match="auto, local, remote"):
        Config.load(env={}, policy="sometimes")


def test_to_env_round_trip():
    c = Config.load(env={}, policy="remote", timeout=3.0, strict=True)
    assert Config.load(env=c.to_env()) == c


def test_frozen():
    with pytest.raises(Exception):
        Config().policy = "local"


def test_a_config_is_a_value_replace_makes_a_changed_copy_and_it_pickles():
    import copy
    import pickle

    c = Config.load(env={}, policy="remote", workers=["inproc://a", "inproc://b"])
    d = c.replace(timeout=2.0)
    assert (d.timeout, d.policy, d.workers, c.timeout) == (2.0, "remote", ("inproc://a", "inproc://b"), 60.0)
    assert d != c and d.replace(timeout=60.0) == c and hash(d.replace(timeout=60.0)) == hash(c)
    assert pickle.loads(pickle.dumps(c)) == c and copy.deepcopy(c) == c
    assert len({c, c.replace()}) == 1
    with pytest.raises(AttributeError, match="frozen"):
        del c.policy
    with pytest.raises(TypeError, match="no field 'polcy'"):
        c.replace(polcy="local")
    assert "policy='remote'" in repr(c)
