"""_importer: 'module:attr' strings, and handler modules loaded by path under a name unique to their folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pipeserve._importer import ImportFromStringError, import_from_string, import_handler_module


@pytest.mark.parametrize("target", ["json:dumps", "json.dumps"])
def test_import_from_string(target):
    assert import_from_string(target) is json.dumps


@pytest.mark.parametrize("target", ["json", ":dumps", "json:", ""])
def test_import_from_string_rejects_malformed_targets(target):
    with pytest.raises(ImportFromStringError, match="import string"):
        import_from_string(target)


def test_import_from_string_unknown_module():
    with pytest.raises(ImportFromStringError, match="no_such_module_xyz"):
        import_from_string("no_such_module_xyz:thing")


def test_import_from_string_unknown_attribute():
    with pytest.raises(ImportFromStringError, match="'nope'"):
        import_from_string("json:nope")


def test_import_error_is_an_import_error():
    assert issubclass(ImportFromStringError, ImportError)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_handler_module_by_path(tmp_path):
    write(tmp_path / "m1" / "model.py", "VALUE = 'from file'\n")

    module = import_handler_module("m1.model", tmp_path)

    assert module.VALUE == "from file"
    assert Path(module.__file__ or "") == tmp_path / "m1" / "model.py"


def test_handler_package_by_path(tmp_path):
    write(tmp_path / "pkg" / "__init__.py", "VALUE = 'package'\n")

    assert import_handler_module("pkg", tmp_path).VALUE == "package"


def test_handler_module_is_imported_once_per_folder(tmp_path):
    write(tmp_path / "m1" / "model.py", "import itertools\nCOUNTER = itertools.count()\n")

    first = import_handler_module("m1.model", tmp_path)
    second = import_handler_module("m1.model", tmp_path)

    assert first is second


def test_handler_module_name_does_not_shadow_real_modules(tmp_path):
    write(tmp_path / "json.py", "HIJACKED = True\n")

    module = import_handler_module("json", tmp_path)

    assert module.HIJACKED is True
    assert sys.modules["json"] is json  # the installed json is untouched
    assert not hasattr(json, "HIJACKED")


def test_installed_module_when_no_file_under_base_dir(tmp_path):
    assert import_handler_module("json", tmp_path) is json


def test_same_relative_name_in_two_folders_gives_two_modules(tmp_path):
    write(tmp_path / "a" / "m1" / "model.py", "VALUE = 'a'\n")
    write(tmp_path / "b" / "m1" / "model.py", "VALUE = 'b'\n")

    a = import_handler_module("m1.model", tmp_path / "a")
    b = import_handler_module("m1.model", tmp_path / "b")

    assert (a.VALUE, b.VALUE) == ("a", "b")
    assert a.__name__ != b.__name__


def test_module_that_raises_is_not_left_half_imported(tmp_path):
    write(tmp_path / "m1" / "model.py", "raise ValueError('bad config')\n")

    with pytest.raises(ImportFromStringError, match="bad config") as info:
        import_handler_module("m1.model", tmp_path)

    path = str(tmp_path / "m1" / "model.py")
    assert path in str(info.value)
    assert not [name for name, mod in list(sys.modules.items()) if getattr(mod, "__file__", None) == path]


def test_not_found_lists_where_it_looked(tmp_path):
    with pytest.raises(ImportFromStringError) as info:
        import_handler_module("m1.absent", tmp_path)

    assert str(tmp_path / "m1" / "absent.py") in str(info.value)


@pytest.mark.parametrize("dotted", ["m1/model", "m1..model", "1m.model", "m1.model.py/x"])
def test_rejects_names_that_are_not_dotted_identifiers(tmp_path, dotted):
    with pytest.raises(ImportFromStringError, match="not a dotted module name"):
        import_handler_module(dotted, tmp_path)
