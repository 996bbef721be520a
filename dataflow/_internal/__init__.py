"""The few names of Ray Data's private ``ray.data._internal`` that its own documentation's
examples import (a custom aggregation's ``is_null``, a custom datasource's
``DelegatingBlockBuilder``), so that those examples run with their imports changed. The rest of
Ray's internals are not provided."""
