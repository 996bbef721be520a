"""Ray's ``ray.data.exceptions`` names: a UDF's failure is a ``UserCodeException`` (here the
``UserCodeError`` that is also the UDF's own exception class), an engine fault a
``SystemException``. ``dataflow.errors`` has the rest."""

from __future__ import annotations

from engine.errors import EngineError, UserCodeError

UserCodeException = UserCodeError
RayDataUserCodeException = UserCodeError
SystemException = EngineError

__all__ = ["RayDataUserCodeException", "SystemException", "UserCodeException"]
