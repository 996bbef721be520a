"""Ray Data's public names, in one place: which of them dataflow provides is computed, not listed.

``Dataset.__getattr__`` and ``DataIterator.__getattr__`` ask ``attribute_error`` for the error of
a name they lack: a name of Ray Data 2.60's API gets one saying dataflow does not provide it (so
a pipeline ported from Ray fails with a message that says why), any other name the usual one.
``missing`` says which of Ray's names a class lacks right now; the README's list is made with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

RAY_DATASET_API: tuple[str, ...] = (
    # the public methods and properties of ray.data.Dataset / MaterializedDataset in Ray 2.60
    "add_column", "aggregate", "columns", "context", "copy", "count", "deserialize_lineage",
    "drop_columns", "explain", "filter", "flat_map", "get_dataset_id", "get_internal_block_refs",
    "get_stats_summary", "groupby", "has_serializable_lineage", "input_files",
    "iter_batches", "iter_internal_ref_bundles", "iter_jax_batches", "iter_rows", "iter_tf_batches",
    "iter_torch_batches", "iterator", "join", "limit", "map", "map_batches", "map_batches_internal",
    "materialize", "max", "mean", "min", "mix", "name", "num_blocks", "random_sample",
    "random_shuffle", "randomize_block_order", "rename_columns", "repartition", "schema",
    "select_columns", "serialize_lineage", "set_name", "show", "size_bytes", "sort", "split",
    "split_at_indices", "split_proportionately", "stats", "std", "streaming_split",
    "streaming_train_test_split", "sum", "summary", "take", "take_all", "take_batch", "to_arrow_refs",
    "to_daft", "to_dask", "to_mars", "to_modin", "to_numpy_refs", "to_pandas", "to_pandas_refs",
    "to_random_access_dataset", "to_spark", "to_tf", "train_test_split", "union", "unique",
    "with_column", "with_columns", "write_bigquery", "write_clickhouse", "write_csv", "write_datasink",
    "write_delta", "write_iceberg", "write_images", "write_json", "write_kafka", "write_lance",
    "write_mongo", "write_numpy", "write_orc", "write_parquet", "write_snowflake", "write_sql",
    "write_tfrecords", "write_turbopuffer", "write_webdataset", "zip",
)  # fmt: skip

RAY_DATA_ITERATOR_API: tuple[str, ...] = (
    # the public methods of ray.data.DataIterator in Ray 2.60
    "get_context", "iter_batches", "iter_jax_batches", "iter_rows", "iter_tf_batches",
    "iter_torch_batches", "materialize", "schema", "stats", "to_tf", "to_torch",
)  # fmt: skip


RAY_DATA_MODULE_API: tuple[str, ...] = (
    # ray.data.__all__ in Ray 2.60, and the two readers it exports outside __all__
    "ActorPoolStrategy", "BlockBasedFileDatasink", "Catalog", "CatalogAccessMode",
    "ClickHouseTableSettings", "DataContext", "DataIterator", "DatabricksUnityCatalog", "Dataset",
    "DatasetContext", "DatasetIterator", "DatasetSummary", "Datasink", "Datasource",
    "ExecutionOptions", "ExecutionResources", "FileShuffleConfig", "KafkaAuthConfig",
    "MixStoppingCondition", "NodeIdStr", "Preprocessor", "RandomSeedConfig", "ReadTask",
    "ReaderFormat", "ResolvedSource", "RowBasedFileDatasink", "SaveMode", "Schema", "SinkMode",
    "TaskPoolStrategy", "from_arrow", "from_arrow_refs", "from_blocks", "from_daft", "from_dask",
    "from_huggingface", "from_items", "from_mars", "from_modin", "from_numpy", "from_numpy_refs",
    "from_pandas", "from_pandas_refs", "from_spark", "from_tf", "from_torch",
    "list_stats_summaries", "range", "range_tensor", "read_audio", "read_avro", "read_bigquery",
    "read_binary_files", "read_clickhouse", "read_csv", "read_databricks_tables", "read_datasource",
    "read_delta", "read_delta_sharing_tables", "read_hudi", "read_iceberg", "read_images",
    "read_json", "read_kafka", "read_lance", "read_lerobot", "read_mcap", "read_mongo",
    "read_numpy", "read_orc", "read_parquet", "read_snowflake", "read_sql", "read_text",
    "read_tfrecords", "read_unity_catalog", "read_videos", "read_webdataset", "read_zarr",
)  # fmt: skip

RAY_EXPRESSIONS_API: tuple[str, ...] = (
    # ray.data.expressions.__all__ in Ray 2.60, its private namespace classes left out
    "AliasExpr", "BinaryExpr", "ColumnExpr", "DownloadExpr", "Expr", "LiteralExpr",
    "MonotonicallyIncreasingIdExpr", "Operation", "RandomExpr", "StarExpr", "UDFExpr", "UUIDExpr",
    "UnaryExpr", "UnnestExpr", "col", "download", "lit", "monotonically_increasing_id",
    "pyarrow_udf", "random", "star", "udf", "unnest", "uuid",
)  # fmt: skip


RAY_DATASOURCE_API: tuple[str, ...] = (
    # ray.data.datasource.__all__ in Ray 2.60, its private names left out
    "BaseFileMetadataProvider", "BlockBasedFileDatasink", "Connection", "Datasink", "Datasource",
    "DefaultFileMetadataProvider", "DeltaSharingDatasource", "DummyOutputDatasink",
    "FileBasedDatasource", "FileMetadataProvider", "FileShuffleConfig", "FilenameProvider",
    "LeRobotDatasource", "MCAPDatasource", "PartitionStyle", "Partitioning", "PathPartitionFilter",
    "PathPartitionParser", "RandomIntRowDatasource", "ReadTask", "Reader", "RowBasedFileDatasink",
    "SaveMode", "TimeRange", "TurbopufferDatasink", "WriteResult", "WriteReturnType",
)  # fmt: skip


def missing(cls: type, names: Iterable[str]) -> list[str]:
    """The names of ``names`` that ``cls`` does not have, in their order."""
    return [name for name in names if not hasattr(cls, name)]


def attribute_error(obj: object, name: str, ray_names: tuple[str, ...]) -> AttributeError:
    """The error for ``obj.name`` when ``obj`` has no such attribute."""
    kind = type(obj).__name__
    if name in ray_names:
        msg = (
            f"{kind}.{name} is a Ray Data API that dataflow does not provide; the README's "
            "'Ray Data APIs not provided' lists them all"
        )
    else:
        msg = f"{kind!r} object has no attribute {name!r}"
    return AttributeError(msg, name=name, obj=obj)


def module_attribute_error(module: str, name: str, ray_module: str, ray_names: tuple[str, ...]) -> AttributeError:
    """The error for ``module.name`` when the module has no such attribute."""
    if name in ray_names:
        msg = (
            f"{ray_module}.{name} is a Ray Data API that dataflow does not provide ({module} has no "
            f"{name!r}); the README's 'Ray Data APIs not provided' lists them all"
        )
    else:
        msg = f"module {module!r} has no attribute {name!r}"
    return AttributeError(msg, name=name)


RAY_PREPROCESSORS_API: tuple[str, ...] = (
    # ray.data.preprocessors.__all__ in Ray 2.60
    "Categorizer", "Chain", "Concatenator", "CountVectorizer", "CustomKBinsDiscretizer",
    "FeatureHasher", "HashingVectorizer", "LabelEncoder", "MaxAbsScaler", "MinMaxScaler",
    "MultiHotEncoder", "Normalizer", "OneHotEncoder", "OrdinalEncoder", "PowerTransformer",
    "RobustScaler", "SimpleImputer", "StandardScaler", "Tokenizer", "TorchVisionPreprocessor",
    "UniformKBinsDiscretizer",
)  # fmt: skip


def module_getattr(module: str, ray_module: str, ray_names: tuple[str, ...]) -> Callable[[str], Any]:
    """A module's ``__getattr__``: a name of ``ray_module`` it lacks says so."""

    def __getattr__(name: str) -> Any:
        raise module_attribute_error(module, name, ray_module, ray_names)

    return __getattr__


def refuse_catalog(method: str, catalog: Any) -> None:
    """Ray's ``catalog=`` (a ``ray.data.Catalog`` such as ``DatabricksUnityCatalog``): None, its
    default, is accepted; a catalog is refused saying why, as dataflow has none."""
    if catalog is not None:
        msg = (f"{method}(catalog=...): dataflow does not provide Ray Data's catalogs (Catalog, "
               "DatabricksUnityCatalog); pass the table's path (and filesystem= or storage_options= "
               "for its credentials) instead")
        raise TypeError(msg)
