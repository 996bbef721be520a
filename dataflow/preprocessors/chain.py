"""``Chain`` (Ray's ``ray.data.preprocessors.chain``): preprocessors applied in sequence."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dataflow.preprocessor import Batch, Preprocessor

if TYPE_CHECKING:
    from dataflow.dataset import Dataset


class Chain(Preprocessor):
    """Apply ``preprocessors`` in order. ``fit`` fits each on what the ones before it output;
    the chain is FITTED when all its fittable members are, PARTIALLY_FITTED when some are."""

    def __init__(self, *preprocessors: Preprocessor) -> None:
        super().__init__()
        self._preprocessors = preprocessors

    @property
    def preprocessors(self) -> tuple[Preprocessor, ...]:
        """The members, in order."""
        return self._preprocessors

    def fit_status(self) -> Preprocessor.FitStatus:
        """From the members' statuses, as Ray's."""
        statuses = [p.fit_status() for p in self._preprocessors]
        fittable = [s for s in statuses if s != Preprocessor.FitStatus.NOT_FITTABLE]
        fitted = [s for s in fittable if s == Preprocessor.FitStatus.FITTED]
        if not fittable:
            return Preprocessor.FitStatus.NOT_FITTABLE
        if len(fitted) == len(fittable):
            return Preprocessor.FitStatus.FITTED
        return Preprocessor.FitStatus.PARTIALLY_FITTED if fitted else Preprocessor.FitStatus.NOT_FITTED

    def fit(self, ds: Dataset) -> Preprocessor:
        """Fit each member on the output of the ones before it."""
        if self.fit_status() == Preprocessor.FitStatus.NOT_FITTABLE:
            return self
        for preprocessor in self._preprocessors[:-1]:
            ds = preprocessor.fit_transform(ds)
        self._preprocessors[-1].fit(ds)
        return self

    def fit_transform(self, ds: Dataset, **transform_options: Any) -> Dataset:
        """Fit and transform with each member in turn; ``transform_num_cpus`` and the other
        options of ``Preprocessor.fit_transform`` go to every member's transform (Ray's
        ``Chain.fit_transform`` takes none)."""
        for preprocessor in self._preprocessors:
            ds = preprocessor.fit_transform(ds, **transform_options)
        return ds

    def _transform(self, ds: Dataset, **options: Any) -> Dataset:
        for preprocessor in self._preprocessors:
            ds = preprocessor.transform(ds, **options)
        return ds

    def _transform_batch(self, data: Batch) -> Batch:
        for preprocessor in self._preprocessors:
            data = preprocessor.transform_batch(data)
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(p) for p in self._preprocessors)})"
