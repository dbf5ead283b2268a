"""Dtype-generic data structs: one field list, one ``@wp.struct`` per scalar type.

A Warp struct's fields have concrete types, so a data struct cannot serve float32 and float64 problems at once.
:func:`dtype_struct` declares the fields once with ``wp.Float`` standing for the problem's scalar type (alone,
in ``wp.types.vector(n, wp.Float)`` / ``wp.types.matrix((r, c), wp.Float)``, or as an array's dtype) and builds,
on first use and cached, the ``@wp.struct`` of each scalar type. The energy then takes ``data: Any``: the toolkit
annotates it with the concrete struct when it instantiates the energy for a problem, and float literals in the
energy already take the problem's scalar type, so the energy is written once::

    @dtype_struct
    class SpringData:
        rest: wp.array(dtype=wp.Float)  # per edge [m]
        stiffness: wp.Float  # [N/m]

    @wp.func
    def spring(e: int, xa: Any, xb: Any, data: Any):
        return 0.5 * data.stiffness * ad.sq(ad.length(xa - xb) - data.rest[e])

    data = SpringData(wp.float32, rest=rest, stiffness=2.0)  # an instance of the float32 @wp.struct
    SpringData.of(wp.float32)  # the float32 @wp.struct itself (e.g. as an array dtype)

For an infinite return value of the problem's type, write ``type(data.some_scalar_field)(wp.inf)``.
"""

from __future__ import annotations

import warp as wp

__all__ = ["DtypeStruct", "dtype_struct"]

_SCALARS = {wp.float16: "h", wp.float32: "f", wp.float64: "d"}


def _concrete(t, dtype):
    """``t`` with ``wp.Float`` replaced by ``dtype`` (named Warp types where they exist: ``wp.vec3d``, ...)."""
    if t is wp.Float:
        return dtype
    if isinstance(t, wp.array):
        return wp.array(dtype=_concrete(t.dtype, dtype), ndim=t.ndim)
    if getattr(t, "_wp_scalar_type_", None) is wp.Float:
        suffix = _SCALARS[dtype]
        if wp.types.type_is_vector(t):
            return getattr(wp, f"vec{t._length_}{suffix}", None) or wp.types.vector(t._length_, dtype)
        if wp.types.type_is_matrix(t):
            rows, cols = t._shape_
            return getattr(wp, f"mat{rows}{cols}{suffix}", None) or wp.types.matrix(t._shape_, dtype)
    return t


class DtypeStruct:
    """A data struct declared once over ``wp.Float``; see the module docstring.

    Calling it with a scalar type gives an instance of that type's ``@wp.struct`` (fields optionally set by
    keyword); :meth:`of` gives the ``@wp.struct`` itself.
    """

    def __init__(self, template: type):
        self.template = template
        self.fields = dict(template.__annotations__)
        self.__name__ = template.__name__
        self.__qualname__ = template.__qualname__
        self.__module__ = template.__module__
        self.__doc__ = template.__doc__
        self._structs: dict = {}

    def of(self, dtype):
        """The ``@wp.struct`` whose ``wp.Float`` fields are ``dtype`` (built once per dtype).

        Args:
            dtype: ``wp.float32`` or ``wp.float64`` (``wp.float16`` too).

        Raises:
            TypeError: for any other dtype.
        """
        if dtype not in _SCALARS:
            raise TypeError(f"{self.__name__}: dtype must be wp.float16, wp.float32 or wp.float64, got {dtype!r}")
        struct = self._structs.get(dtype)
        if struct is None:
            name = f"{self.__qualname__}_{dtype.__name__}"
            cls = type(
                name.rsplit(".", 1)[-1],
                (),
                {
                    "__annotations__": {k: _concrete(t, dtype) for k, t in self.fields.items()},
                    "__module__": self.__module__,
                    "__qualname__": name,
                    "__doc__": self.__doc__,
                },
            )
            struct = self._structs[dtype] = wp.struct(cls)
        return struct

    def __call__(self, dtype, **fields):
        """An instance of :meth:`of` ``(dtype)`` with the given fields set (the others zero).

        Raises:
            TypeError: for an unknown dtype or a field the struct does not declare.
        """
        unknown = sorted(set(fields) - set(self.fields))
        if unknown:
            raise TypeError(f"{self.__name__} has no field(s) {', '.join(unknown)}; its fields: {', '.join(self.fields)}")
        data = self.of(dtype)()
        for name, value in fields.items():
            setattr(data, name, value)
        return data

    def __repr__(self):
        return f"<dtype_struct {self.__module__}.{self.__qualname__}>"


def dtype_struct(template: type) -> DtypeStruct:
    """Class decorator: declare a data struct once over ``wp.Float`` (see the module docstring).

    Args:
        template: a class whose annotations are the fields, ``wp.Float`` standing for the scalar type.

    Returns:
        The :class:`DtypeStruct`: ``Data(wp.float32, field=value, ...)`` makes an instance, ``Data.of(dtype)``
        gives the ``@wp.struct``.
    """
    return DtypeStruct(template)
