"""resolve_handler: which object in a handler module serves a node, and the errors when none (or many) do."""

from __future__ import annotations

import asyncio
import inspect
import textwrap
from pathlib import Path

import pytest

from pipeserve.errors import SpecError
from pipeserve.pipeline.handlers import Handler, HandlerContext, HandlerFactory, resolve_handler

FIELD = "model_load_meta.handler_module"


def write_module(base: Path, dotted: str, source: str) -> Path:
    path = base.joinpath(*dotted.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).lstrip(), encoding="utf-8")
    return path


def resolve(base: Path, target: str) -> HandlerFactory:
    return resolve_handler(target, base, file="pipeline.yaml", node="n1")


def resolve_error(base: Path, target: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        resolve(base, target)
    err = info.value
    assert (err.file, err.node, err.field) == ("pipeline.yaml", "n1", FIELD)
    assert str(err).startswith(f"pipeline.yaml: node 'n1': field '{FIELD}': ")
    return err


def test_seed_handler_resolves_and_runs(seed_dir):
    handler = resolve(seed_dir, "m1.dummy_python_model")()

    assert handler.predict({"value": 3}) == {"value": 3, "visited": ["m1"]}


def test_explicit_attribute_wins(tmp_path):
    write_module(
        tmp_path,
        "m.h",
        """
        class First:
            def predict(self, data):
                return "first"

        class Second:
            def predict(self, data):
                return "second"
        """,
    )

    assert resolve(tmp_path, "m.h:Second")().predict(None) == "second"


def test_explicit_attribute_that_is_a_function(tmp_path):
    write_module(tmp_path, "m.h", "def double(x):\n    return 2 * x\n")

    assert resolve(tmp_path, "m.h:double")().predict(21) == 42


def test_missing_explicit_attribute(tmp_path):
    path = write_module(tmp_path, "m.h", "def predict(x):\n    return x\n")

    err = resolve_error(tmp_path, "m.h:nope")

    assert "'nope'" in str(err)
    assert str(path) in str(err)


def test_explicit_attribute_that_is_not_a_handler(tmp_path):
    write_module(tmp_path, "m.h", "SETTING = 5\n")

    err = resolve_error(tmp_path, "m.h:SETTING")

    assert "neither a class" in str(err)


def test_handler_attribute_is_used_before_classes(tmp_path):
    write_module(
        tmp_path,
        "m.h",
        """
        class Model:
            def __init__(self, scale):
                self.scale = scale

            def predict(self, data):
                return data * self.scale

        handler = Model(10)
        """,
    )

    factory = resolve(tmp_path, "m.h")

    assert factory().predict(2) == 20
    assert factory() is factory()  # the module's own object, not a copy


def test_single_class_with_predict(tmp_path):
    write_module(
        tmp_path,
        "m.h",
        """
        import json

        class Helper:
            pass

        class Model:
            def predict(self, data):
                return json.dumps(data)
        """,
    )

    factory = resolve(tmp_path, "m.h")

    assert factory().predict([1]) == "[1]"
    assert factory() is not factory()  # a class: each load gets its own instance


def test_handler_subclass(tmp_path):
    write_module(
        tmp_path,
        "m.h",
        """
        from pipeserve import Handler

        class Upper(Handler):
            def load(self, context):
                self.suffix = context.params["suffix"]

            def predict(self, data):
                return data.upper() + self.suffix
        """,
    )

    handler = resolve(tmp_path, "m.h")()
    assert isinstance(handler, Handler)
    handler.load(HandlerContext(node="n1", base_dir=tmp_path, params={"suffix": "!"}))

    assert handler.predict("cat") == "CAT!"


def test_async_predict_is_kept_async(tmp_path):
    write_module(
        tmp_path,
        "m.h",
        """
        class Model:
            async def predict(self, data):
                return data + 1
        """,
    )

    handler = resolve(tmp_path, "m.h")()

    assert inspect.iscoroutinefunction(handler.predict)
    assert asyncio.run(handler.predict(1)) == 2


def test_imported_classes_do_not_count(tmp_path):
    write_module(
        tmp_path,
        "m.h",
        """
        from pipeserve import Handler
        from collections import OrderedDict

        def predict(data):
            return ("function", data)
        """,
    )

    assert resolve(tmp_path, "m.h")().predict(1) == ("function", 1)


def test_module_level_predict_function(tmp_path):
    write_module(tmp_path, "m.h", "def predict(data):\n    return data[::-1]\n")

    assert resolve(tmp_path, "m.h")().predict("abc") == "cba"


def test_several_classes_ask_to_name_one(tmp_path):
    write_module(
        tmp_path,
        "m.h",
        """
        from pipeserve import Handler

        class Alpha(Handler):
            def predict(self, data):
                return 1

        class Beta:
            def predict(self, data):
                return 2
        """,
    )

    err = resolve_error(tmp_path, "m.h")

    assert "Alpha" in str(err)
    assert "Beta" in str(err)
    assert "'m.h:ClassName'" in str(err)


def test_module_without_a_handler(tmp_path):
    path = write_module(tmp_path, "m.h", "VALUE = 1\n\nclass NotAHandler:\n    pass\n")

    err = resolve_error(tmp_path, "m.h")

    assert "defines no handler" in str(err)
    assert str(path) in str(err)


def test_module_that_raises_at_import_names_the_file(tmp_path):
    path = write_module(tmp_path, "m.broken", "VALUE = 1 / 0\n")

    err = resolve_error(tmp_path, "m.broken")

    assert str(path) in str(err)
    assert "ZeroDivisionError" in str(err)


def test_module_with_a_syntax_error(tmp_path):
    path = write_module(tmp_path, "m.broken", "def predict(data)\n    return data\n")

    err = resolve_error(tmp_path, "m.broken")

    assert str(path) in str(err)
    assert "SyntaxError" in str(err)


def test_module_that_failed_can_be_fixed_and_loaded(tmp_path):
    write_module(tmp_path, "m.h", "raise RuntimeError('not yet')\n")
    resolve_error(tmp_path, "m.h")

    write_module(tmp_path, "m.h", "def predict(data):\n    return 'fixed'\n")

    assert resolve(tmp_path, "m.h")().predict(None) == "fixed"


def test_module_not_found(tmp_path):
    err = resolve_error(tmp_path, "m9.no_such_module")

    assert "not found" in str(err)
    assert "'m9.no_such_module'" in str(err)


def test_not_a_dotted_name(tmp_path):
    err = resolve_error(tmp_path, "m1/handler.py")

    assert "m1/handler.py" in str(err)


def test_two_spec_dirs_with_the_same_module_path_do_not_share_it(tmp_path):
    source = """
        NAME = {name!r}

        class DummyPythonModel:
            def predict(self, data):
                return NAME
        """
    write_module(tmp_path / "one", "m1.dummy_python_model", source.format(name="one"))
    write_module(tmp_path / "two", "m1.dummy_python_model", source.format(name="two"))

    one = resolve(tmp_path / "one", "m1.dummy_python_model")
    two = resolve(tmp_path / "two", "m1.dummy_python_model")

    assert one().predict(None) == "one"
    assert two().predict(None) == "two"
    assert one is not two
    assert inspect.getmodule(one) is not inspect.getmodule(two)


def test_handler_base_predict_must_be_overridden():
    with pytest.raises(NotImplementedError, match="predict"):
        Handler().predict(1)
