"""Child-process entry point of :class:`cubic.runners.local.LocalRunner` (not a user command).

``python -m cubic.runners._child FD PARENT_PID``: reads the request (JSON) from stdin, writes JSON lines
``{"type": "progress", ...}`` and one ``{"type": "result", ...}`` to file descriptor FD.
Every exception becomes a failed Result; only a signal or a hard crash leaves without one.
"""

from __future__ import annotations

import json
import os
import sys
import time


def die_with_parent(parent_pid: int | None = None) -> None:
    """Linux: the kernel sends SIGKILL to this child when its parent dies, so no orphan trains on."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the parent's timeout still bounds the run
        return
    if parent_pid is None and len(sys.argv) > 2:
        parent_pid = int(sys.argv[2])
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the parent died before prctl took effect


def _interrupt_on_term() -> None:
    """SIGTERM raises KeyboardInterrupt("SIGTERM") like SIGINT does, so that both end the run as
    ``killed`` (transient) with a result, instead of a silent death or an ``error``.

    SIGINT is set explicitly too: a process started in the background by a shell without job
    control (``cmd &`` in a script) ignores SIGINT, Python then installs no handler, and its
    children would inherit the ignore: an interrupt sent to the run would do nothing."""
    import signal

    def on_term(signum, _frame):  # noqa: ANN001
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def main() -> None:
    _interrupt_on_term()
    die_with_parent()
    out = os.fdopen(int(sys.argv[1]), "w", buffering=1)

    def send(msg: dict) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

    from cubic.core.result import Result

    header: dict = {}
    lingers = False
    try:
        request = json.loads(sys.stdin.read())
        # heavy imports first, so that the memory limit covers the run and not the libraries
        import torch

        from cubic.core.config import Config
        from cubic.core.models import fbgemm_available
        from cubic.runners.base import proc_status_bytes, result_header
        from cubic.runners.local import Fault, faults_allowed, train_and_measure
        from cubic.core.spec import Workload

        workload = Workload.model_validate(request["workload"])
        config = Config.model_validate(request["config"])
        header = result_header(workload, config)
        if config.kernels.embedding != "torch":
            fbgemm_available()  # imports fbgemm_gpu now, outside the memory limit
        if request.get("threads"):
            torch.set_num_threads(int(request["threads"]))
        limit = request.get("memory_limit_bytes")
        if limit:
            import resource

            cap = (proc_status_bytes("VmSize") or 0) + int(limit)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        fault = Fault.model_validate(request["fault"]) if request.get("fault") else None
        lingers = fault is not None and fault.kind == "linger" and faults_allowed()
        result = train_and_measure(
            workload, config, steps=request["steps"], warmup=request["warmup"], device=request["device"],
            eval_every=request.get("eval_every"), fault=fault, versions_info=request.get("versions"),
            progress=lambda done, total: send({"type": "progress", "done": done, "total": total}),
        )
    except BaseException as e:  # noqa: BLE001 -- every failure is reported as data
        from cubic.runners.base import classify_exception

        from cubic.runners.memory import explain_oom

        # an allocator's bare assert told as an out-of-memory, with the sizes (when the run got that far)
        kind, reason = explain_oom(*classify_exception(e), locals().get("workload"), locals().get("config"))
        # which signal: SIGINT (Ctrl-C reaches the whole process group: the caller stops too) or SIGTERM
        extra = {"interrupted": str(e) or "SIGINT"} if isinstance(e, KeyboardInterrupt) else {}
        result = Result.failed(kind, reason, extra=extra, **header)
    send({"type": "result", "result": result.model_dump(mode="json")})
    out.close()
    while lingers:  # test fault: a child that hangs on its way out (the parent must not wait forever)
        time.sleep(1.0)
    exit_without_teardown(0)


def exit_without_teardown(code: int) -> None:
    """Exit once the result is delivered, skipping the interpreter's and C++ static destructors: a
    teardown with torch, FBGEMM/gloo and OpenMP threads loaded can abort ("terminate called without
    an active exception") or hang, more so after an interrupt, and a finished run would read as
    crashed or keep its parent waiting. Also ends the TorchRec ranks."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
