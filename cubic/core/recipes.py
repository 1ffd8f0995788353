"""The FP8 recipes: one table of each recipe's format and scaling per GEMM role (no torch here).

It lives in ``cubic.core`` because every layer reads it: the Probe, Dispatch and the runtime
(``fp8``), the H100 model (``cost_models.gpu_gemm``), the run config and the CLI. ``fp8.recipes``
holds the arithmetic (quantize, the scaled GEMM) that this table drives.

A linear ``y = x @ w.T`` runs three GEMMs, written ``a @ b.T`` with R the reduced dimension:

- ``fwd``: ``x @ w.T`` (a = x ``[M, K]``, b = w ``[N, K]``);
- ``grad_input``: ``dy @ w`` (a = dy ``[M, N]``, b = w.T ``[K, N]``);
- ``grad_weight``: ``dy.T @ x`` (a = dy.T ``[N, M]``, b = x.T ``[K, M]``).

Each operand has a :class:`Cast`: its float8 format and scaling (``rowwise``: one scale per row of
the operand along R, torchao's "axiswise"), or high precision (not cast). The torchao recipes are
copied from torchao 0.18 ``Float8LinearConfig.from_recipe_name`` (``torchao/float8/config.py``),
and ``tests/test_fp8_torchao.py`` checks this table against it field by field:

- ``tensorwise``: e4m3 forward, e5m2 for the output gradient in both backward GEMMs, one scale
  per tensor, scales not rounded;
- ``rowwise``: e4m3 everywhere (gradients included), rowwise scales rounded down to powers of 2;
- ``rowwise_with_gw_hp``: forward rowwise e4m3; grad-input: the gradient rowwise e4m3 times the
  weight *tensorwise* e4m3; grad-weight in high precision; power-of-2 scales.

``block128`` and ``mx32`` are not torchao ``Float8Linear`` recipes (cubic's own, for the Probe's
comparison): e4m3 forward and e5m2 gradients, like ``tensorwise``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ROLES: tuple[str, ...] = ("fwd", "grad_input", "grad_weight")
# the tensors behind each role's operands (a, b), for tables
OPERANDS: dict[str, tuple[str, str]] = {"fwd": ("x", "w"), "grad_input": ("dy", "w"), "grad_weight": ("dy", "x")}
Format = Literal["e4m3", "e5m2"]
SCALINGS: tuple[str, ...] = ("tensorwise", "rowwise", "block128", "mx32")


@dataclass(frozen=True)
class Cast:
    """How one GEMM operand is cast: ``fmt`` None means high precision (the layer's own dtype)."""

    fmt: Format | None = None
    scaling: str | None = None

    @property
    def hp(self) -> bool:
        return self.fmt is None

    def __str__(self) -> str:
        return "hp" if self.hp else f"{self.fmt}/{self.scaling}"


HP = Cast()


@dataclass(frozen=True)
class Recipe:
    name: str
    fwd: tuple[Cast, Cast]
    grad_input: tuple[Cast, Cast]
    grad_weight: tuple[Cast, Cast]
    pow2_scales: bool  # scales rounded down to a power of two (torchao round_scales_to_power_of_2)
    torchao: str | None  # torchao Float8LinearRecipeName value, None: not a torchao Float8Linear recipe

    def role(self, role: str) -> tuple[Cast, Cast]:
        if role not in ROLES:
            raise ValueError(f"unknown GEMM role {role!r} (known: {', '.join(ROLES)})")
        return getattr(self, role)

    def fp8_roles(self) -> tuple[str, ...]:
        """The GEMMs that run in FP8 (the others run in high precision)."""
        return tuple(r for r in ROLES if not self.role(r)[0].hp)

    def describe(self) -> str:
        """One line: each role's operand casts, e.g. ``fwd x e4m3/rowwise, w e4m3/rowwise; ...``."""
        parts = []
        for r in ROLES:
            (a, b), (na, nb) = self.role(r), OPERANDS[r]
            parts.append(f"{r} hp" if a.hp and b.hp else f"{r} {na} {a}, {nb} {b}")
        return "; ".join(parts) + ("; power-of-2 scales" if self.pow2_scales else "")


def _c(fmt: Format, scaling: str) -> Cast:
    return Cast(fmt, scaling)


def _uniform(name: str, scaling: str, *, pow2: bool, torchao: str | None) -> Recipe:
    """e4m3 forward, e5m2 output gradient (Micikevicius et al. 2022), one scaling throughout."""
    fwd = (_c("e4m3", scaling), _c("e4m3", scaling))
    grad = (_c("e5m2", scaling), _c("e4m3", scaling))
    return Recipe(name, fwd, grad, grad, pow2, torchao)


_ROW = _c("e4m3", "rowwise")
RECIPES: dict[str, Recipe] = {r.name: r for r in (
    _uniform("tensorwise", "tensorwise", pow2=False, torchao="tensorwise"),
    Recipe("rowwise", (_ROW, _ROW), (_ROW, _ROW), (_ROW, _ROW), True, "rowwise"),
    Recipe("rowwise_with_gw_hp", (_ROW, _ROW), (_ROW, _c("e4m3", "tensorwise")), (HP, HP), True,
           "rowwise_with_gw_hp"),
    _uniform("block128", "block128", pow2=False, torchao=None),
    # MX scales are powers of two by construction (OCP MX v1.0), computed by their own rule
    _uniform("mx32", "mx32", pow2=False, torchao=None),
)}
FP8_RECIPES: tuple[str, ...] = tuple(RECIPES)
TORCHAO_RECIPES: tuple[str, ...] = tuple(n for n, r in RECIPES.items() if r.torchao)
HIGH_PRECISION: tuple[str, ...] = ("fp32", "bf16")
ALL_RECIPES: tuple[str, ...] = HIGH_PRECISION + FP8_RECIPES


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown FP8 recipe {name!r} (known: {', '.join(FP8_RECIPES)})")
    return RECIPES[name]


def role_precision(name: str, role: str) -> tuple[str, str | None]:
    """``(precision, scaling)`` of one GEMM of a recipe, for cost models: ``("bf16", None)`` for a
    high-precision GEMM, else ``("fp8", <the scaling of its a operand>)``."""
    a, b = recipe(name).role(role)
    if a.hp and b.hp:
        return "bf16", None
    return "fp8", a.scaling


RECIPE_SETS: dict[str, tuple[str, ...]] = {"all": FP8_RECIPES, "torchao": TORCHAO_RECIPES}


def recipe_set(spec: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The FP8 recipes a placement may use: ``"torchao"`` (the ones torchao's Float8Linear runs, for a
    placement exported with ``cubic fp8 export --format torchao``), ``"all"``, or names (a sequence
    or comma-separated). ValueError names an unknown one."""
    if isinstance(spec, str):
        if spec in RECIPE_SETS:
            return RECIPE_SETS[spec]
        spec = [s.strip() for s in spec.split(",") if s.strip()]
    names = tuple(dict.fromkeys(spec))
    bad = [r for r in names if r not in RECIPES]
    if bad or not names:
        what = f"unknown FP8 recipe {bad[0]!r}" if bad else "no FP8 recipe given"
        raise ValueError(f"{what} (known: {', '.join(RECIPE_SETS)}, or names from {', '.join(FP8_RECIPES)})")
    return names
