"""A Ray Data name dataflow lacks says so; other unknown names fail as usual. Nothing executes."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import pytest

import dataflow
from dataflow import ray_api
from dataflow.dataset import Dataset, MaterializedDataset
from dataflow.iterator import DataIterator


def test_the_name_lists_are_sorted_and_unique():
    for names in (ray_api.RAY_DATASET_API, ray_api.RAY_DATA_ITERATOR_API):
        assert list(names) == sorted(set(names))


def test_the_split_family_and_small_api_are_provided():
    provided = {"split", "split_at_indices", "split_proportionately", "train_test_split",
                "streaming_train_test_split", "size_bytes", "input_files", "name", "set_name", "copy",
                "num_blocks"}
    assert provided <= set(ray_api.RAY_DATASET_API)
    assert not provided & set(ray_api.missing(Dataset, ray_api.RAY_DATASET_API))
    assert not {"stats", "schema", "materialize", "to_torch"} & set(
        ray_api.missing(DataIterator, ray_api.RAY_DATA_ITERATOR_API)
    )


@pytest.mark.parametrize("name", ray_api.missing(Dataset, ray_api.RAY_DATASET_API))
def test_a_ray_name_dataflow_lacks_says_so(name):
    ds = dataflow.range(10)
    with pytest.raises(AttributeError, match="is a Ray Data API that dataflow does not provide") as info:
        getattr(ds, name)
    assert f"Dataset.{name} " in str(info.value)
    assert info.value.name == name and info.value.obj is ds
    assert not hasattr(ds, name)


def test_every_ray_iterator_name_is_provided():
    """(So no DataIterator name can take the "not provided" path; Dataset's test covers it.)"""
    assert ray_api.missing(DataIterator, ray_api.RAY_DATA_ITERATOR_API) == []


def test_other_names_fail_as_usual():
    ds = dataflow.range(10)
    with pytest.raises(AttributeError, match=r"^'Dataset' object has no attribute 'mapp'$"):
        ds.mapp
    with pytest.raises(AttributeError, match=r"^'DataIterator' object has no attribute 'iter_batch'$"):
        ds.iterator().iter_batch
    assert getattr(ds, "_not_there", None) is None


def test_materialized_dataset_gets_the_same_answer():
    name = next(iter(ray_api.missing(MaterializedDataset, ray_api.RAY_DATASET_API)), None)
    if name is None:
        pytest.skip("dataflow provides every Ray Data Dataset name")
    ds = MaterializedDataset.__new__(MaterializedDataset)  # no blocks needed to look a name up
    with pytest.raises(AttributeError, match=r"MaterializedDataset\.\w+ is a Ray Data API"):
        getattr(ds, name)


def test_datasets_still_copy_and_pickle():
    ds = dataflow.range(10).map(lambda r: r)
    ds.set_name("x")
    assert copy.copy(ds).name == "x"
    assert pickle.loads(pickle.dumps(dataflow.range(5))).name is None
    twin = Dataset.copy(ds)
    assert twin._plan is ds._plan and twin.name == "x"
    with pytest.raises(TypeError, match="copy"):
        Dataset.copy(ds, _as=MaterializedDataset)


def test_the_module_lists_are_sorted_and_unique():
    for names in (ray_api.RAY_DATA_MODULE_API, ray_api.RAY_EXPRESSIONS_API, ray_api.RAY_DATASOURCE_API):
        assert list(names) == sorted(set(names))


@pytest.mark.parametrize("name", [n for n in ray_api.RAY_DATA_MODULE_API if not hasattr(dataflow, n)])
def test_a_ray_module_name_dataflow_lacks_says_so(name):
    with pytest.raises(AttributeError, match=f"ray.data.{name} is a Ray Data API that dataflow does not provide"):
        getattr(dataflow, name)


def test_module_names_dataflow_has_and_does_not():
    import dataflow.expressions as expressions

    assert dataflow.DatasetIterator is dataflow.DataIterator and dataflow.DatasetContext is dataflow.DataContext
    assert {"range_tensor", "from_blocks", "DatasetSummary", "read_parquet"} <= set(dir(dataflow))
    # loaded with dataflow, as ray.data.datatype with ray.data (a fresh process: here others import it)
    fresh = subprocess.run([sys.executable, "-c", "import dataflow; dataflow.datatype.DataType"], capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr
    with pytest.raises(AttributeError, match=r"^module 'dataflow' has no attribute 'raed_parquet'$"):
        dataflow.raed_parquet
    with pytest.raises(AttributeError, match=r"ray\.data\.expressions\.star is a Ray Data API"):
        expressions.star
    with pytest.raises(AttributeError, match=r"^module 'dataflow.expressions' has no attribute 'coll'$"):
        expressions.coll


def test_rays_datasource_partitioning_module_path_imports():
    """``from ray.data.datasource.partitioning import PathPartitionFilter`` ports by its import;
    the names of that module dataflow lacks say so."""
    from dataflow.datasource import partitioning
    from dataflow.datasource.partitioning import PathPartitionFilter, PathPartitionParser

    assert PathPartitionFilter is dataflow.datasource.PathPartitionFilter
    assert PathPartitionParser is dataflow.datasource.PathPartitionParser
    assert partitioning.Partitioning("dir", field_names=["class"]).style == "dir"
    with pytest.raises(AttributeError, match=r"^module 'dataflow.datasource.partitioning' has no attribute 'Parser'$"):
        partitioning.Parser


def test_a_ray_preprocessor_dataflow_lacks_says_so():
    import dataflow.preprocessors as preprocessors

    assert preprocessors.StandardScaler.__module__ == "dataflow.preprocessors.scaler"
    with pytest.raises(
        AttributeError,
        match=r"ray\.data\.preprocessors\.TorchVisionPreprocessor is a Ray Data API that dataflow does not provide",
    ):
        preprocessors.TorchVisionPreprocessor
    with pytest.raises(AttributeError, match=r"^module 'dataflow.preprocessors' has no attribute 'Scaler'$"):
        preprocessors.Scaler



def test_rays_submodules_and_their_names_after_import_dataflow_alone():
    """``ray.data.datasource.Partitioning(...)`` works after ``import ray.data``; the same line
    with ``dataflow`` raised AttributeError until the submodule was imported by name."""
    script = """
import dataflow
assert dataflow.datasource.Partitioning("hive").style == "hive"
assert dataflow.block.BlockAccessor and dataflow.block.DataBatch
from dataflow.exceptions import RayDataUserCodeException, SystemException, UserCodeException
from dataflow.grouped_data import GroupedData, GroupedDataset
from dataflow.datasource.filename_provider import FilenameProvider
from dataflow.datasource.datasource import Datasource, ReadTask
from dataflow.datasource.datasink import Datasink, WriteResult
from dataflow.context import ShuffleStrategy
assert FilenameProvider is dataflow.FilenameProvider and Datasource is dataflow.Datasource
assert GroupedDataset is GroupedData and type(dataflow.range(3).groupby("id")) is GroupedData
try:
    dataflow.range(3).map(lambda r: 1 / 0).take_all()
except UserCodeException as err:
    assert isinstance(err, ZeroDivisionError) and isinstance(err, RayDataUserCodeException)
ctx = dataflow.DataContext.get_current()
ctx.shuffle_strategy = ShuffleStrategy.HASH_SHUFFLE
assert ctx.shuffle_strategy == "hash_shuffle"
dataflow.configure_logging()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
    with pytest.raises(AttributeError, match=r"^module 'dataflow' has no attribute 'nope'$"):
        dataflow.nope
