"""FP8 placement for recommendation models (LoKA design: Probe, Mods, Dispatch).

- :mod:`fp8.recipes`: the arithmetic of the recipe table :data:`cubic.core.recipes.RECIPES`
  (torchao's recipes: format and scaling per GEMM role; block128, mx32), quantization as torchao
  casts, ``role_matmul`` (``torch._scaled_mm`` where it runs), SQNR.
- :mod:`fp8.kernels`: the kernel registry and ``Fp8Linear`` (drop-in ``nn.Linear``, FP8 autograd).
- :mod:`fp8.triton_kernels`: the Triton fused row-wise cast (optional extra ``[triton]``).
- :mod:`fp8.probe`: ``Probe`` - online per-site statistics and per-recipe error with intervals.
- :mod:`fp8.dispatch`: ``Dispatcher`` - fastest acceptable kernel per site, cached.
- :mod:`fp8.mods`: model transforms that make sites FP8-friendly; a placement's per-site Mods.
- :mod:`fp8.placement`: the ``Placement`` document (JSON, ``version`` 1); per-site verdicts.
- :mod:`fp8.torchao_export`: a placement as a module a torchao job imports (``apply(model)``).
- :mod:`fp8.recommend`: ``probe_workload`` and ``recommend`` (workload -> placement).
- :mod:`fp8.runtime`: ``apply_fp8(model, fp8_choice, workload)`` - what the runner calls.
- :mod:`fp8.quality`: end-to-end NE/loss comparison against full precision.
- :mod:`cubic.cli.fp8`: ``cubic fp8 probe|model|check|kernels|export``.
The H100 time model is :mod:`cost_models.gpu_gemm`.
"""
