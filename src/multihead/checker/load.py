"""Load the learner's class from its own file and build it, without touching the file.

The file is imported with ``importlib`` under a private module name, with ``sys.dont_write_bytecode``
set so that no ``__pycache__`` appears next to it. The class is built with the learner's ``--init``
keyword arguments, or else from its constructor's parameter names (``d_model``, ``hidden_size``,
``num_hiddens``, ``heads``, ``dim_in``, ``context_length``...), which covers the common signatures.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import json
import sys
from pathlib import Path

from torch import nn

from multihead.convert.projections import HEAD_COUNT_NAMES as HEAD_NAMES

EMBED, HEADS, LENGTH = 16, 4, 16  # sizes used when the learner gives none
LONGEST_PROBE = 6  # the longest probe sequence for modules with a context length (see probes.py)

# constructor parameter name -> the value to pass when the learner gives no --init
QUERY_SIZE_NAMES = ("query_size", "dim_in", "d_in", "in_dim", "input_dim")  # the query input's width
KEY_SIZE_NAMES = ("key_size", "kdim")
VALUE_SIZE_NAMES = ("value_size", "vdim")
EMBED_NAMES = ("d_model", "hidden_size", "embed_dim", "num_hiddens", "dim", "d_embed", "n_embd", "emb_dim",
               "embed_size", "hidden_dim", "model_dim", "embedding_dim", "dim_out", "d_out", "d", "width",
               "features", "n_embed", "embedding_size", "size", "hidden", "n_hidden", "d_hidden", "emb", "embed")
_SIZE_NAMES = QUERY_SIZE_NAMES + KEY_SIZE_NAMES + VALUE_SIZE_NAMES + EMBED_NAMES
LENGTH_NAMES = ("context_length", "block_size", "max_len", "seq_len", "max_seq_len", "n_ctx",
                 "max_length", "max_seq_length", "context_size", "max_positions", "seq_length")
_DROPOUT_HINTS = ("dropout", "drop", "p_attn", "attn_pdrop")
DEFAULTS = {**{n: EMBED for n in _SIZE_NAMES}, **{n: HEADS for n in HEAD_NAMES},
            **{n: LENGTH for n in LENGTH_NAMES}}


class LoadError(Exception):
    """The learner's file, class or constructor could not be used (the checker exits with 2).

    ``str(error)`` is the English message; ``error.text(lang)`` the message in ``lang``.
    """

    def __init__(self, english: str, chinese: str | None = None):
        super().__init__(english)
        self.chinese = chinese or english

    def text(self, lang: str) -> str:
        return self.chinese if lang == "zh" else str(self)


def split_target(target: str) -> tuple[Path, str]:
    """``"path/to/file.py:ClassName"`` -> (path, class name)."""
    path, sep, name = target.rpartition(":")
    if not sep or not path or not name:
        raise LoadError(f"expected FILE.py:ClassName, got {target!r}",
                        f"应写成 文件.py:类名，实际是 {target!r}")
    return Path(path), name


def import_file(path: Path):
    """Import a Python file as a fresh module, writing no bytecode next to it."""
    if not path.is_file():
        raise LoadError(f"no such file: {path}", f"找不到文件：{path}")
    module_name = f"_multihead_check_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"cannot import {path}: not a Python source file", f"无法导入 {path}：不是 Python 源文件")
    module = importlib.util.module_from_spec(spec)
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)  # the learner's own helper modules next to the file
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:  # the learner's file fails: report it, never a traceback
        sys.modules.pop(module_name, None)
        why = f"{type(error).__name__}: {error}"
        raise LoadError(f"importing {path} failed: {why}", f"导入 {path} 时出错：{why}") from error
    finally:
        sys.dont_write_bytecode = saved
        sys.path.remove(folder)
    return module


def load_class(target: str) -> type:
    """The nn.Module subclass named by ``"file.py:ClassName"``."""
    path, name = split_target(target)
    module = import_file(path)
    cls = getattr(module, name, None)
    if cls is None:
        classes = [n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, nn.Module)
                   and v.__module__ == module.__name__]
        hint = difflib.get_close_matches(name, classes, n=1)
        defined = ", ".join(classes) or "-"
        raise LoadError(f"class {name!r} not found in {path}; it defines: {defined}"
                        + (f" (did you mean {hint[0]!r}?)" if hint else ""),
                        f"{path} 里没有类 {name!r}；文件中定义的有：{defined}"
                        + (f"（是不是 {hint[0]!r}？）" if hint else ""))
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise LoadError(f"{name!r} in {path} is not an nn.Module subclass",
                        f"{path} 里的 {name!r} 不是 nn.Module 的子类")
    return cls


def parse_init(text: str | None) -> dict:
    """The --init JSON object of keyword arguments."""
    if text is None:
        return {}
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as error:
        example = '{"d_model": 16, "num_heads": 4}'
        raise LoadError(f"--init is not valid JSON ({error.msg}); expected e.g. '{example}', got {text!r}",
                        f"--init 不是合法的 JSON（{error.msg}）；应类似 '{example}'，实际是 {text!r}") from error
    if not isinstance(kwargs, dict):
        raise LoadError(f"--init must be a JSON object of keyword arguments, got {text!r}",
                        f"--init 必须是由关键字参数组成的 JSON 对象，实际是 {text!r}")
    return kwargs


def guess_init(cls: type, given: dict) -> dict:
    """Keyword arguments for ``cls``: the given ones, then defaults by parameter name, dropout 0."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return dict(given)
    kwargs = dict(given)
    missing = []
    for name, param in list(params.items())[1:]:
        if name in kwargs or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if any(hint in name.lower() for hint in _DROPOUT_HINTS) and "num" not in name.lower():
            kwargs[name] = 0.0  # dropout off, whatever the default
        elif param.default is not param.empty:
            continue
        elif name in DEFAULTS:
            kwargs[name] = DEFAULTS[name]
        else:
            missing.append(name)
    short = {n: v for n, v in kwargs.items() if n in LENGTH_NAMES and isinstance(v, int) and v < LONGEST_PROBE}
    if short:
        name, value = next(iter(short.items()))
        raise LoadError(f"{name}={value} is shorter than the sequences the checker tries "
                        f"({LONGEST_PROBE} tokens); pass {name} >= {LONGEST_PROBE} with --init",
                        f"{name}={value} 比检查器使用的序列（{LONGEST_PROBE} 个词）短；"
                        f"请用 --init 传入 {name} >= {LONGEST_PROBE}")
    if missing:
        example = "--init '{" + ", ".join(f'"{m}": ...' for m in missing) + "}'"
        raise LoadError(f"cannot guess {cls.__name__}'s constructor argument(s) {', '.join(missing)}; "
                        f"pass them with --init, e.g. {example}",
                        f"无法猜出 {cls.__name__} 的构造参数 {', '.join(missing)}；请用 --init 传入，例如 {example}")
    return kwargs


def build(cls: type, init: dict | None = None) -> tuple[nn.Module, dict]:
    """An instance of ``cls`` and the keyword arguments it was built with."""
    kwargs = guess_init(cls, init or {})
    try:
        return cls(**kwargs), kwargs
    except Exception as error:
        why = f"{type(error).__name__}: {error}"
        raise LoadError(f"{cls.__name__}(**{kwargs}) failed: {why}",
                        f"构造 {cls.__name__}(**{kwargs}) 时出错：{why}") from error


def misspelled_forward(cls: type) -> str | None:
    """The method meant as ``forward`` when the class has none of its own (``farward``...), or None."""
    if getattr(cls, "forward", None) is not nn.Module.forward:
        return None
    names = [n for klass in cls.__mro__ if klass not in (nn.Module, object)
             for n, v in vars(klass).items() if callable(v) and not n.startswith("__")]
    close = difflib.get_close_matches("forward", [n.lower() for n in names], n=1, cutoff=0.6)
    if not close:
        return None
    return next(n for n in names if n.lower() == close[0])
