"""Ray's ``ray.data.preprocessors``: fit statistics on a dataset, then transform datasets or
batches with them (``from dataflow.preprocessors import StandardScaler``).

Modules: ``dataflow.preprocessor`` (the base class) → ``_columnwise`` (columns in, output
columns out) → ``_stats`` (value counts, in the same aggregation pass as other statistics) →
``utils`` (Ray's default tokenizer and ``simple_hash``) → ``scaler``, ``imputer``, ``encoder``,
``normalizer``, ``concatenator``, ``discretizer``, ``transformer`` (``PowerTransformer``),
``tokenizer``, ``vectorizer``, ``hasher`` (``FeatureHasher``), ``chain``.

Differences from Ray 2.60:

- ``transform_batch`` returns the kind of batch it was given (pandas, pyarrow or a dict of
  numpy arrays); Ray returns the kind its preprocessor prefers (a dict in can give a pyarrow
  Table or a pandas DataFrame out).
- ``Concatenator``'s column is a ``fixed_size_list`` of the values, where Ray's is its tensor
  extension type (the same values).
- ``serialize()`` is always the pickle + base64 string (Ray's legacy format), never Ray's
  CloudPickle bytes; ``deserialize`` reads it back.
- ``FeatureHasher``'s column is a ``fixed_size_list`` too.
- ``HashingVectorizer`` and ``CountVectorizer``: a missing document's row is null and the other
  rows stay ``list<int64>``; Ray turns the counts of that batch into floats.
- ``PowerTransformer`` computes in float64, so an integer column with a negative integer power
  gives values where Ray raises numpy's "Integers to negative integer powers" error.
- Not provided: ``TorchVisionPreprocessor``.
"""

from dataflow.preprocessor import Preprocessor, PreprocessorNotFittedException
from dataflow.preprocessors.chain import Chain
from dataflow.preprocessors.concatenator import Concatenator
from dataflow.preprocessors.discretizer import CustomKBinsDiscretizer, UniformKBinsDiscretizer
from dataflow.preprocessors.encoder import Categorizer, LabelEncoder, MultiHotEncoder, OneHotEncoder, OrdinalEncoder
from dataflow.preprocessors.hasher import FeatureHasher
from dataflow.preprocessors.imputer import SimpleImputer
from dataflow.preprocessors.normalizer import Normalizer
from dataflow.preprocessors.scaler import MaxAbsScaler, MinMaxScaler, RobustScaler, StandardScaler
from dataflow.preprocessors.tokenizer import Tokenizer
from dataflow.preprocessors.transformer import PowerTransformer
from dataflow.preprocessors.vectorizer import CountVectorizer, HashingVectorizer
from dataflow.ray_api import RAY_PREPROCESSORS_API, module_getattr

__all__ = [
    "Categorizer",
    "Chain",
    "Concatenator",
    "CountVectorizer",
    "CustomKBinsDiscretizer",
    "FeatureHasher",
    "HashingVectorizer",
    "LabelEncoder",
    "MaxAbsScaler",
    "MinMaxScaler",
    "MultiHotEncoder",
    "Normalizer",
    "OneHotEncoder",
    "OrdinalEncoder",
    "PowerTransformer",
    "Preprocessor",
    "PreprocessorNotFittedException",
    "RobustScaler",
    "SimpleImputer",
    "StandardScaler",
    "Tokenizer",
    "UniformKBinsDiscretizer",
]

# a Ray preprocessor this package lacks (``TorchVisionPreprocessor``) says so
__getattr__ = module_getattr("dataflow.preprocessors", "ray.data.preprocessors", RAY_PREPROCESSORS_API)
