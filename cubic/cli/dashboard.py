"""``cubic campaign dashboard NAME``: optuna-dashboard served on a campaign's storage, until Ctrl-C."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve optuna-dashboard on the campaign's storage (loopback unless --host), until Ctrl-C."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    import optuna

    from cubic.codesign.storage import load_meta
    from cubic.core.store import redact_url

    try:
        import optuna_dashboard
    except ImportError:
        print("cubic: optuna-dashboard is not installed (pip install 'cubic[dashboard]', or `make`)", file=sys.stderr)
        return 2
    from cubic.cli.common import default_storage

    storage = args.storage or default_storage()
    load_meta(storage, args.name)  # no such campaign: one line naming it, exit 2
    study_id = optuna.load_study(study_name=args.name, storage=storage)._study_id

    class Quiet(WSGIRequestHandler):
        def log_message(self, *a):  # the dashboard polls: no line per request
            pass

    httpd = _serve(args.host, args.port, optuna_dashboard.wsgi(storage), Quiet, make_server)
    url = f"http://{args.host}:{httpd.server_port}/dashboard/studies/{study_id}"
    # Ctrl-C stops it even when started with SIGINT ignored (a shell's background job, nohup: Python
    # then leaves SIGINT ignored); SIGTERM is cubic.cli.app.main's, as for every command
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.default_int_handler)
    # requests are served on a thread of their own: a Ctrl-C landing inside a request on the main
    # thread is swallowed by wsgiref's error handler (it answers 500 and serves on), so the main
    # thread only waits, where the interrupt always lands, and then stops the loop
    server = threading.Thread(target=httpd.serve_forever, name="dashboard", daemon=True)
    server.start()
    try:  # the line inside: a Ctrl-C sent as soon as it is read must land here too
        print(f"optuna-dashboard for campaign {args.name!r} on {redact_url(storage)}: {url}  (Ctrl-C stops it)",
              flush=True)
        while server.is_alive():
            server.join(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.shutdown()  # returns once serve_forever has left its loop (at once if it already has)
        httpd.server_close()
    return 0


def _serve(host: str, port: int, app, handler, make_server):
    """The server, or one line naming the flag: an address that does not resolve or is not this
    machine's names --host, a port in use or not allowed names --port (both were OSError's text alone)."""
    import errno
    import socket

    from cubic.core.spec import SpecError

    try:
        return make_server(host, port, app, handler_class=handler)
    except socket.gaierror as e:
        raise SpecError(f"cannot resolve {host!r}: {e.strerror or e}", field="--host") from None
    except OSError as e:
        flag = "--port" if e.errno in (errno.EADDRINUSE, errno.EACCES) else "--host"
        raise SpecError(f"cannot serve on {host}:{port}: {e.strerror or e}", field=flag) from None


def _host(text: str) -> str:
    """An address to serve on: an empty one served every interface, under a URL with no host in it."""
    if not text.strip() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"not an address: {text!r} (127.0.0.1 is this machine only; 0.0.0.0 every "
                                         "interface)")
    return text


def add_dashboard(verbs: Any, add_common) -> None:
    """`cubic campaign dashboard`; ``add_common`` adds the --storage and --json every campaign verb takes."""
    from cubic.cli.common import port

    db = verbs.add_parser("dashboard", help="serve optuna-dashboard on a campaign's storage",
                          description="Serve optuna-dashboard (the live study: history, parameter importances, "
                                      "trial attributes) on the campaign's storage; prints the URL.")
    db.add_argument("name")
    db.add_argument("--host", type=_host, default="127.0.0.1", help="address to serve on (default loopback only)")
    db.add_argument("--port", type=port, default=8080, help="port (0: any free port)")
    add_common(db)
    db.set_defaults(func=cmd_dashboard)
