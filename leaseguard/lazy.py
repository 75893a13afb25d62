"""Public names that load their module on first use (a module ``__getattr__``).

A Lambda cold start pays for every module a handler's imports load, so ``leaseguard`` and
``leaseguard.providers`` import nothing up front: a provider's module (and, when it is built, its
client library) loads only when that provider is asked for.
"""

TYPE_CHECKING = False  # a local constant, so that ``typing`` itself stays out of the import
if TYPE_CHECKING:
    from collections.abc import Callable


def module_getattr(
    package: str,
    exports: "dict[str, str]",
    namespace: "dict[str, object]",
    moved: "dict[str, str] | None" = None,
) -> "Callable[[str], object]":
    """A module ``__getattr__`` for ``package``: each name in ``exports`` loads its module
    (relative to ``package``) on first use, then stays in ``namespace`` as a plain attribute.
    A name in ``moved`` (deprecated here) still resolves from its module, with a
    ``DeprecationWarning`` naming that module at each use."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        deprecated = module is None and moved is not None and name in moved
        if deprecated:
            import warnings

            module = moved[name]  # type: ignore[index]
            warnings.warn(
                f"{package}.{name} is deprecated: import it from {package}.{module}",
                DeprecationWarning,
                stacklevel=2,
            )
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        from importlib import import_module

        value = getattr(import_module(f"{package}.{module}"), name)
        if not deprecated:  # resolved once; a deprecated name warns at every use
            namespace[name] = value
        return value

    return __getattr__
