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

from multihead.checker.loading.config import GuessedConfig, class_defaults
from multihead.checker.loading.load_error import LoadError
from multihead.checker.targets.functions import function_class, is_function_target
from multihead.checker.loading.constructor_args import (
    EMBED_NAMES,
    LENGTH_NAMES,
    QUERY_SIZE_NAMES,
    SWITCH_ON,
    guess_value,
    is_config_name,
    is_dropout,
    is_head_count_name,
    is_head_size_name,
    short_tried_text,
    tried_text,
)

LONGEST_PROBE = 6  # the longest probe sequence for modules with a context length (see probes.py)


def split_target(target: str) -> tuple[Path, str]:
    """``"path/to/file.py:ClassName"`` (or ``:function``) -> (path, name)."""
    path, sep, name = target.rpartition(":")
    if not sep or not path or not name:
        raise LoadError(f"expected FILE.py:ClassName or FILE.py:function, got {target!r}",
                        f"应写成 文件.py:类名 或 文件.py:函数名，实际是 {target!r}")
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
    """The nn.Module subclass named by ``"file.py:ClassName"``, or a plain attention function
    (``"file.py:function"``) wrapped as one (``functions.function_class``)."""
    cls = load_target(target)
    return function_class(cls) if is_function_target(cls) else cls


def load_target(target: str):
    """What ``"file.py:Name"`` names, as written: an nn.Module subclass or a plain function."""
    path, name = split_target(target)
    module = import_file(path)
    cls = getattr(module, name, None)
    if is_function_target(cls):
        return cls
    if cls is None:
        classes = [n for n, v in vars(module).items() if (isinstance(v, type) and issubclass(v, nn.Module)
                   or is_function_target(v)) and v.__module__ == module.__name__]
        hint = difflib.get_close_matches(name, classes, n=1)
        defined = ", ".join(classes) or "-"
        raise LoadError(f"class or function {name!r} not found in {path}; it defines: {defined}"
                        + (f" (did you mean {hint[0]!r}?)" if hint else ""),
                        f"{path} 里没有类或函数 {name!r}；文件中定义的有：{defined}"
                        + (f"（是不是 {hint[0]!r}？）" if hint else ""))
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise LoadError(f"{name!r} in {path} is neither an nn.Module subclass nor a function",
                        f"{path} 里的 {name!r} 既不是 nn.Module 的子类，也不是函数")
    return cls


def parse_init(text: str | None) -> dict:
    """The --init JSON object of keyword arguments."""
    if text is None:
        return {}
    return json_object(text, "--init", '{"d_model": 16, "num_heads": 4}', "keyword arguments", "关键字参数")


def parse_config(text) -> dict | None:
    """The --config JSON object (or a dict), or None when no config is given."""
    if text is None or isinstance(text, dict):
        return text
    if not isinstance(text, str):
        raise LoadError(f"config must be a dict of attributes or its JSON text, got {type(text).__name__}",
                        f"config 必须是属性组成的 dict 或其 JSON 文本，实际是 {type(text).__name__}")
    return json_object(text, "--config", '{"n_embd": 16, "n_head": 4}', "attributes", "属性")


def json_object(text: str, option: str, example: str, what: str, what_zh: str) -> dict:
    """`text` parsed as a JSON object for `option`; LoadError (EN/ZH) saying what was expected otherwise."""
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise LoadError(f"{option} is not valid JSON ({error.msg}); expected e.g. '{example}', got {text!r}",
                        f"{option} 不是合法的 JSON（{error.msg}）；应类似 '{example}'，实际是 {text!r}") from error
    if not isinstance(values, dict):
        raise LoadError(f"{option} must be a JSON object of {what}, got {text!r}",
                        f"{option} 必须是由{what_zh}组成的 JSON 对象，实际是 {text!r}")
    return values


def guess_init(cls: type, given: dict, config: dict | None = None) -> dict:
    """Keyword arguments for ``cls``: the given ones, then guesses by parameter name, dropout 0; a config
    parameter (``config``, ``cfg``...) gets a ``GuessedConfig`` holding ``config`` (the --config values)."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return dict(given)
    kwargs = dict(given)
    missing, config_param = [], None
    for name, param in list(params.items())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if is_config_name(name, param.annotation) and (config is not None or param.default is param.empty):
            config_param = config_param or name
            if isinstance(kwargs.get(name), dict) or name not in kwargs:
                kwargs[name] = GuessedConfig({**(config or {}), **kwargs.get(name, {})},
                                             class_defaults(param.annotation, cls))
        elif name in kwargs:
            continue
        elif is_dropout(name):
            kwargs[name] = 0.0  # dropout off, whatever the default
        elif name in SWITCH_ON and param.default is False:
            kwargs[name] = True  # the scale switch on: a model built from the class passes it (GPT-2)
        elif param.default is not param.empty:
            continue
        elif guess_value(name)[0]:
            kwargs[name] = guess_value(name)[1]
        else:
            missing.append(name)
    if config is not None and config_param is None:
        if len(missing) != 1:
            raise LoadError(f"--config was given but {cls.__name__}'s constructor has no config parameter",
                            f"给了 --config，但 {cls.__name__} 的构造函数没有 config 参数")
        kwargs[missing.pop()] = GuessedConfig(config)
    _refuse_short_lengths(kwargs)
    if missing:
        example = "--init '{" + ", ".join(f'"{m}": ...' for m in missing) + "}'"
        raise LoadError(f"pass {example}: {cls.__name__}'s constructor argument(s) {', '.join(missing)} cannot be "
                        f"guessed (names it guesses: {short_tried_text()})",
                        f"请用 {example} 传入：{cls.__name__} 的构造参数 {', '.join(missing)} 猜不出来"
                        f"（能猜出的名字：{short_tried_text('zh')}）")
    return kwargs


def switched_on(cls: type, given: dict, kwargs: dict) -> list[str]:
    """The scale switches (``scale=False`` by default, as in GPT-2's Attention) that guess_init turned on."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return []
    return [n for n in SWITCH_ON if n in params and n not in given and params[n].default is False and kwargs.get(n)]


def _refuse_short_lengths(kwargs: dict) -> None:
    """A context length shorter than the probes cannot be checked: say which value to pass instead."""
    lengths = {n: v for n, v in size_values(kwargs).items() if n in LENGTH_NAMES}
    short = {n: v for n, v in lengths.items() if isinstance(v, int) and v < LONGEST_PROBE}
    if short:
        name, value = next(iter(short.items()))
        raise LoadError(f"{name}={value} is shorter than the sequences the checker tries "
                        f"({LONGEST_PROBE} tokens); pass {name} >= {LONGEST_PROBE} with --init",
                        f"{name}={value} 比检查器使用的序列（{LONGEST_PROBE} 个词）短；"
                        f"请用 --init 传入 {name} >= {LONGEST_PROBE}")


def size_values(kwargs: dict) -> dict:
    """The constructor's named values, config attributes included (name -> value)."""
    found = {}
    for name, value in kwargs.items():
        if isinstance(value, GuessedConfig):
            found.update(value.values())
        else:
            found[name] = value
    return found


def named_values(cls: type, kwargs: dict) -> dict:
    """The constructor's named values: its parameters' defaults, overridden by the arguments it was built with
    (config attributes included), e.g. to read rope_theta=1e6 or window_size=4 left at their defaults."""
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        params = []
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    return {**defaults, **size_values(kwargs)}


def with_head_count(kwargs: dict, heads: int) -> dict | None:
    """The constructor arguments changed to ``heads`` heads (head sizes follow the width), or None when
    the head count is not among them (then the module cannot be rebuilt that way)."""
    values = size_values(kwargs)
    width = next((values[n] for n in QUERY_SIZE_NAMES + EMBED_NAMES if isinstance(values.get(n), int)), None)
    if not any(is_head_count_name(n) for n in values) or not width or width % heads:
        return None
    changes = {n: heads for n in values if is_head_count_name(n)}
    changes.update({n: width // heads for n in values if is_head_size_name(n)})
    rebuilt = {}
    for name, value in kwargs.items():
        if isinstance(value, GuessedConfig):
            rebuilt[name] = value.with_values(**{n: v for n, v in changes.items() if n in value.values()})
        else:
            rebuilt[name] = changes.get(name, value)
    return rebuilt


def build(cls: type, init: dict | None = None, config: dict | None = None) -> tuple[nn.Module, dict]:
    """An instance of ``cls`` and the keyword arguments it was built with."""
    kwargs = guess_init(cls, init or {}, config)
    try:
        return cls(**kwargs), kwargs
    except Exception as error:
        unknown = [n for v in kwargs.values() if isinstance(v, GuessedConfig) for n in v.unknown()]
        if unknown and isinstance(error, AttributeError):
            example = "--config '{" + ", ".join(f'"{n}": ...' for n in unknown) + "}'"
            raise LoadError(f"{cls.__name__}'s constructor reads config.{unknown[0]}, which the checker cannot "
                            f"guess; pass it with {example} (names it recognises: {tried_text()})",
                            f"{cls.__name__} 的构造函数读取了 config.{unknown[0]}，检查器猜不出它；请用 {example} 传入"
                            f"（能识别的名字：{tried_text('zh')}）") from error
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
