"""Building the learner's class: names guessed, config objects (given with --config or guessed by
attribute name), the names tried when guessing fails, and rebuilding with another head count."""
from __future__ import annotations

import copy

import pytest
from torch import nn

from multihead.checker import check
from multihead.checker.loading.config import GuessedConfig
from multihead.checker.loading.learner_file import LoadError, build, guess_init, parse_config, size_values, with_head_count
from multihead.checker.loading.constructor_args import guess_value, is_config_name
from multihead.cli import main
from zoo_mutants import target_path


@pytest.mark.parametrize("params, expected", [
    ("hid_dim, n_heads, dropout, device", {"hid_dim": 16, "n_heads": 4, "dropout": 0.0, "device": "cpu"}),
    ("query_dim, heads", {"query_dim": 16, "heads": 4}),
    ("n_state, n_head", {"n_state": 16, "n_head": 4}),
    ("n_head, d_model, d_k, d_v", {"n_head": 4, "d_model": 16, "d_k": 4, "d_v": 4}),
    ("hidden_size, num_attention_heads", {"hidden_size": 16, "num_attention_heads": 4}),
    ("n_embd, n_head, block_size", {"n_embd": 16, "n_head": 4, "block_size": 64}),
    ("dim, heads, dim_head", {"dim": 16, "heads": 4, "dim_head": 4}),
    ("num_heads, head_size, n_embd, block_size", {"num_heads": 4, "head_size": 4, "n_embd": 16, "block_size": 64}),
    ("embed_size, heads", {"embed_size": 16, "heads": 4}),
])
def test_constructor_names_people_use_are_guessed(params, expected):
    namespace = {}
    exec(f"class C:\n    def __init__(self, {params}):\n        pass\n", namespace)
    assert guess_init(namespace["C"], {}) == expected


def test_a_name_that_cannot_be_guessed_lists_the_names_tried():
    class Odd(nn.Module):
        def __init__(self, flavour_of_things, n_heads):
            super().__init__()

    with pytest.raises(LoadError) as raised:
        guess_init(Odd, {})
    message = str(raised.value)
    assert message.startswith("pass --init '{\"flavour_of_things\": ...}'")  # the hint first, on one short line
    assert len(message) < 320 and "d_model" in message and "num_heads" in message


def test_guess_value_by_name():
    assert guess_value("attn_pdrop") == (True, 0.0) and guess_value("layer_norm_epsilon") == (True, 1e-5)
    assert guess_value("bias") == (True, True) and guess_value("output_attentions") == (True, False)
    assert guess_value("n_embd") == (True, 16) and guess_value("vocabulary") == (False, None)
    assert is_config_name("config") and is_config_name("model_cfg") and is_config_name("x", "GPT2Config")
    assert not is_config_name("d_model")


def test_guessed_config_answers_records_and_refuses():
    config = GuessedConfig({"n_embd": 24})
    assert (config.n_embd, config.n_head, config.attn_pdrop) == (24, 4, 0.0)
    assert getattr(config, "rotary", "absent") == "absent" and not hasattr(config, "vocabulary")
    assert config.values() == {"n_embd": 24, "n_head": 4, "attn_pdrop": 0.0}
    assert config.unknown() == ["rotary", "vocabulary"]
    config.extra = 3
    assert config.extra == 3 and "extra=3" in repr(config)
    nested = GuessedConfig({"attn": {"n_head": 2}})
    assert nested.attn.n_head == 2
    copied = copy.deepcopy(config)
    assert copied.values() == config.values() and copied is not config
    assert config.with_values(n_head=2).n_head == 2 and config.n_head == 4


def test_parse_config():
    assert parse_config(None) is None and parse_config({"a": 1}) == {"a": 1}
    assert parse_config('{"n_head": 2}') == {"n_head": 2}
    for bad, words in [("{n_head: 2}", "not valid JSON"), ("[1]", "JSON object"), (3, "dict of attributes")]:
        with pytest.raises(LoadError, match=words):
            parse_config(bad)


def test_config_constructor_gets_a_config_object():
    class Configured(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.proj = nn.Linear(config.n_embd, config.n_embd)

    module, kwargs = build(Configured, {}, {"n_embd": 8})
    assert module.proj.in_features == 8 and isinstance(kwargs["config"], GuessedConfig)
    assert size_values(kwargs) == {"n_embd": 8}
    module, _ = build(Configured, {"config": {"n_embd": 12}})  # a dict given with --init becomes one too
    assert module.proj.in_features == 12


def test_config_attribute_that_cannot_be_guessed_is_named():
    class NeedsVocab(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.table = nn.Embedding(config.vocab_entries, config.n_embd)

    with pytest.raises(LoadError, match=r"reads config.vocab_entries.*--config '\{\"vocab_entries\": \.\.\.\}'"):
        build(NeedsVocab)


def test_config_given_to_a_constructor_without_one_is_refused():
    class Plain(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()

    with pytest.raises(LoadError, match="no config parameter"):
        build(Plain, {}, {"n_embd": 8})


def test_rebuilding_with_another_head_count():
    assert with_head_count({"d_model": 16, "num_heads": 4, "d_k": 4}, 2) == {"d_model": 16, "num_heads": 2, "d_k": 8}
    rebuilt = with_head_count({"config": GuessedConfig({"n_embd": 16, "n_head": 4})}, 8)
    assert rebuilt["config"].n_head == 8 and rebuilt["config"].n_embd == 16
    assert with_head_count({"d_model": 16}, 2) is None  # no head count among the arguments
    assert with_head_count({"d_model": 16, "num_heads": 4}, 3) is None  # 16 does not split in 3


def test_cli_config_option(capsys):
    code = main(["check", target_path("ok_nanogpt_flash.py:FlashCausalSelfAttention"),
                 "--config", '{"n_embd": 24, "n_head": 3, "bias": false}'])
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert code == 0 and "PASS" in out and "3 heads of size 8" in out
    code = main(["check", target_path("ok_nanogpt_flash.py:FlashCausalSelfAttention"), "--config", "{oops"])
    assert code == 2 and "--config is not valid JSON" in " ".join(capsys.readouterr().out.split())


def test_check_accepts_config_as_dict_or_text():
    target = target_path("ok_mingpt_config.py:CausalSelfAttention")
    as_dict = check(target, config={"n_embd": 12, "n_head": 2})
    as_text = check(target, config='{"n_embd": 12, "n_head": 2}')
    assert as_dict.passed and as_text.passed
    assert as_dict.convention_lines() == as_text.convention_lines()
    assert "2 heads of size 6" in as_text.convention_lines()


@pytest.mark.parametrize("name, value", [("head_count", 4), ("nb_heads", 4), ("dim_per_head", 4), ("model_dim", 16),
                                         ("d_hid", 16), ("context_len", 64), ("flavour", None)])
def test_names_not_listed_are_read_by_their_words(name, value):
    assert guess_value(name) == ((True, value) if value is not None else (False, None))


def test_head_count_and_head_size_names_by_their_words():
    from multihead.checker.loading.constructor_args import is_head_count_name, is_head_size_name

    assert is_head_count_name("head_count") and is_head_count_name("n_heads") and not is_head_count_name("d_k")
    assert is_head_size_name("dim_per_head") and is_head_size_name("d_k") and not is_head_size_name("head_count")
    assert with_head_count({"head_count": 4, "model_dim": 16, "dim_per_head": 4}, 2) == \
        {"head_count": 2, "model_dim": 16, "dim_per_head": 8}
