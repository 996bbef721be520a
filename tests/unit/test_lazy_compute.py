import pyarrow as pa
import pyarrow.compute
import pytest

from dataflow.lazy_compute import pc


def test_functions_and_types_are_pyarrow_computes():
    assert pc.add(pa.array([1, 2]), 1).to_pylist() == [2, 3]
    assert pc.add is pyarrow.compute.add  # found once, then an attribute of the stand-in
    assert "add" in vars(pc)
    assert isinstance(pc.field("x"), pc.Expression)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_function"):
        pc.no_such_function
