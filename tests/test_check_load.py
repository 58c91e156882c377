"""Loading the learner's file and building the class: never touching the file, clear errors (exit 2)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import edited_zoo_file
from multihead.checker import check
from multihead.checker.loading.learner_file import (
    LoadError,
    guess_init,
    load_class,
    load_target,
    misspelled_forward,
    parse_init,
    split_target,
)

ZOO = Path(__file__).parent / "check_zoo"


def test_learner_file_is_never_modified(tmp_path):
    learner = tmp_path / "my_attention.py"
    shutil.copy(ZOO / "weights_times_keys.py", learner)
    before = (learner.read_bytes(), learner.stat().st_mtime_ns)
    report = check(f"{learner}:Attention")
    assert report.bug == "keys-used-as-values"
    assert (learner.read_bytes(), learner.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_attention.py"]  # no __pycache__


def test_checking_an_instance_leaves_it_as_it_was():
    from multihead.textbook import SplitHeads

    module = SplitHeads(8, 8, 6, 0.1, 2).train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    assert check(module).passed
    assert module.training and module.Wq.weight.dtype == torch.float32
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())


@pytest.mark.parametrize("source, target, words", [
    ("import torch\nclass A(:\n", "A", ["importing", "SyntaxError"]),
    ("import no_such_package_xyz\n", "A", ["importing", "ModuleNotFoundError"]),
    ("from torch import nn\nclass Attention(nn.Module):\n    pass\n", "Atention", ["not found", "did you mean 'Attention'"]),
    ("VALUE = 3\n", "VALUE", ["neither an nn.Module subclass nor a function"]),
    ("from torch import nn\nclass A(nn.Module):\n    def __init__(self, weird_knob):\n        super().__init__()\n",
     "A", ["weird_knob", "--init"]),
    ("from torch import nn\nclass A(nn.Module):\n    def __init__(self, d_model, num_heads):\n        raise ValueError('no')\n",
     "A", ["failed", "ValueError: no"]),
])
def test_unusable_targets_exit_with_2_and_say_why(tmp_path, source, target, words):
    learner = tmp_path / "learner.py"
    learner.write_text(source)
    report = check(f"{learner}:{target}")
    assert report.verdict == "error" and report.exit_code == 2
    for word in words:
        assert word in report.reason, report.reason


def test_missing_file_and_bad_target_and_bad_init():
    assert "no such file" in check("nowhere/attn.py:A").reason
    with pytest.raises(LoadError, match="FILE.py:ClassName"):
        split_target("attn.py")
    with pytest.raises(LoadError, match="not valid JSON"):
        parse_init("{d_model: 4}")
    with pytest.raises(LoadError, match="JSON object"):
        parse_init("[16, 4]")
    report = check(str(ZOO / "ok_lazy.py:LazyAttention"), init="{oops")
    assert report.exit_code == 2 and "--init" in report.reason


@pytest.mark.parametrize("options, words", [
    ({"init": [16, 4]}, "init must be a dict of keyword arguments or its JSON text, got list"),
    ({"call": {"heads": 4}}, "--call expects text like 'heads=4,layout=seq', got dict"),
])
def test_options_of_the_wrong_type_are_reported(options, words):
    from multihead.textbook import SplitHeads

    report = check(SplitHeads, **options)
    assert report.exit_code == 2 and words in report.reason


def test_init_keywords_are_used():
    report = check(str(ZOO / "ok_lazy.py:LazyAttention"), init='{"embed_dim": 24, "num_heads": 3}')
    assert report.passed and "3 heads of size 8" in report.convention_lines()


@pytest.mark.parametrize("params, expected", [
    ("d_model, num_heads", {"d_model": 16, "num_heads": 4}),
    ("hidden_size, num_heads", {"hidden_size": 16, "num_heads": 4}),
    ("heads, d_model, dropout_prob=0.1, bias=True", {"heads": 4, "d_model": 16, "dropout_prob": 0.0}),
    ("key_size, query_size, value_size, num_hiddens, num_heads, dropout, bias=False",
     {"key_size": 16, "query_size": 16, "value_size": 16, "num_hiddens": 16, "num_heads": 4, "dropout": 0.0}),
    ("dim_in, dim_out, context_length, dropout_rate, num_heads, qkv_bias=False",
     {"dim_in": 16, "dim_out": 16, "context_length": 64, "dropout_rate": 0.0, "num_heads": 4}),
])
def test_common_signatures_are_guessed(params, expected):
    namespace = {}
    exec(f"class C:\n    def __init__(self, {params}):\n        pass\n", namespace)
    assert guess_init(namespace["C"], {}) == expected


def test_given_keywords_win_over_guesses():
    class C(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()

    assert guess_init(C, {"num_heads": 2}) == {"num_heads": 2, "d_model": 16}


def test_misspelled_forward_is_found_only_when_forward_is_missing():
    class Typo(nn.Module):
        def foward(self, x):
            return x

    class Fine(nn.Module):
        def forward(self, x):
            return x

        def farward(self, x):
            return x

    class Unrelated(nn.Module):
        def compute(self, x):
            return x

    assert misspelled_forward(Typo) == "foward"
    assert misspelled_forward(Fine) is None
    assert misspelled_forward(Unrelated) is None


def test_random_state_and_thread_count_are_restored():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    threads = torch.get_num_threads()
    check(str(ZOO / "ok_lazy.py:LazyAttention"))
    assert torch.equal(torch.rand(3), expected)
    assert torch.get_num_threads() == threads


def test_learner_helpers_next_to_the_file_are_importable_and_left_alone(tmp_path):
    (tmp_path / "my_helpers.py").write_text("def split(t, h):\n    b, n, e = t.shape\n"
                                            "    return t.view(b, n, h, e // h).transpose(1, 2)\n")
    edited_zoo_file(tmp_path, "ok_lazy.py", ("import torch\n", "import torch\nimport my_helpers\n"), name="attn.py")
    assert check(f"{tmp_path / 'attn.py'}:LazyAttention").passed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attn.py", "my_helpers.py"]
    assert str(tmp_path) not in __import__("sys").path


def test_a_file_that_exits_on_import_is_reported(tmp_path):
    (tmp_path / "quits.py").write_text("import sys\nsys.exit(3)\n")
    report = check(f"{tmp_path / 'quits.py'}:A")
    assert report.exit_code == 2 and "SystemExit" in report.reason


def test_an_instance_that_cannot_be_copied_is_reported():
    from multihead.textbook import SplitHeads

    module = SplitHeads(8, 8, 6, 0.0, 2)
    module.stream = (i for i in range(3))  # generators cannot be deep-copied
    report = check(module)
    assert report.exit_code == 2 and "cannot copy" in report.reason


def test_a_context_length_shorter_than_the_probes_is_refused_clearly():
    from multihead.textbook import SplitHeads

    report = check(SplitHeads, init={"dim_in": 3, "dim_out": 4, "context_length": 5, "dropout_rate": 0.0,
                                     "num_heads": 2})
    assert report.exit_code == 2 and "context_length=5" in report.reason and ">= 6" in report.reason


def test_could_not_run_messages_are_translated():
    report = check("nowhere/attn.py:A", lang="zh")
    assert report.reason == "找不到文件：nowhere/attn.py"
    assert str(report).startswith("错误：无法检查 nowhere/attn.py:A")
    error = LoadError("english", "中文")
    assert (str(error), error.text("en"), error.text("zh")) == ("english", "english", "中文")


def test_load_target_gives_what_the_file_defines_as_written():
    fn = load_target(str(ZOO / "ok_sparse_gather.py:sparse_attention"))
    assert callable(fn) and not isinstance(fn, type) and fn.__name__ == "sparse_attention"
    cls = load_target(str(ZOO / "weights_times_keys.py:Attention"))
    assert issubclass(cls, nn.Module) and cls.__name__ == "Attention"
    assert issubclass(load_class(str(ZOO / "ok_function_sdpa_style.py:scaled_dot_product_attention")), nn.Module)
