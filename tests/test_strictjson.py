"""Issue 48.7: JSON from outside is read without the numbers JSON does not have (gpupool_hub/strictjson.py)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpupool_hub import strictjson
from gpupool_hub.notice import read_notice


@pytest.mark.parametrize("text", ['{"u": NaN}', "[Infinity]", "[-Infinity]", "[1e999]", '{"a": [{"b": -1e400}]}'])
def test_numbers_json_does_not_have_are_refused(text):
    with pytest.raises(strictjson.NonFiniteNumber):
        strictjson.loads(text)
    with pytest.raises(ValueError):  # every caller that handles bad JSON handles these too
        strictjson.loads(text.encode())


def test_ordinary_json_reads_as_json_does():
    assert strictjson.loads('{"a": [1, 2.5, -0.0, 1e300, "NaN", null, true]}') == {
        "a": [1, 2.5, -0.0, 1e300, "NaN", None, True]}
    assert strictjson.loads('{"x": 0.1}', parse_float=Decimal) == {"x": Decimal("0.1")}
    assert strictjson.loads("[" + "9" * 400 + "]") == [int("9" * 400)]  # integers are exact, never infinite


def test_a_notice_file_with_nan_is_no_notice(tmp_path):
    notice = tmp_path / "notice.json"
    notice.write_text('{"version": 1, "deadline": "2099-01-01T00:00:00Z", "seconds": NaN}')
    with pytest.warns(RuntimeWarning, match="is not a notice"):
        assert read_notice(notice) is None
