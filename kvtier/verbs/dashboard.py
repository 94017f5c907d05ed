"""`kvtier dashboard`: start the Streamlit dashboard (loopback by default)

Runs ``streamlit run dashboard/app.py`` in a child process bound to ``--host`` (127.0.0.1
unless told otherwise). The dashboard reads Parquet segments only, never the collector's
store file, so it can run while the collector writes. Streamlit is imported by the child,
not here, so ``kvtier --help`` stays fast.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

from kvtier.errors import KvtierError

SUMMARY = "start the Streamlit dashboard (loopback by default)"
EXAMPLE = "kvtier dashboard --segments kvtier-out/segments --port 8501"


def add_arguments(parser) -> None:
    parser.add_argument("--segments", default="kvtier-out/segments", help="Parquet segment folder to read")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=int, default=8501, help="port to serve on")
    parser.add_argument("--whatif", help="folder of what-if results (default: next to the segments)")
    parser.add_argument("--recommendation", help="recommendation folder (default: next to the segments)")
    parser.add_argument("--rollouts", help="folder of recorded rollouts, one JSON per act, as kvtier demo "
                                           "writes them (default: next to the segments)")
    parser.add_argument("--live-curves", help="the live curve files kvtier collect --live-curves writes "
                                              "(default: SEGMENTS/live_curves)")


def streamlit_command(args) -> list[str]:
    """The child command line for ``args``; ``KvtierError`` for bad input."""
    if not 0 < args.port < 65536:
        raise KvtierError(f"--port must be 1..65535, got {args.port}")
    if not args.host:
        raise KvtierError("--host must name an address, e.g. 127.0.0.1")
    segments = Path(args.segments).resolve()
    if segments.exists() and not segments.is_dir():
        raise KvtierError(f"--segments must be a folder of Parquet segments, got the file {segments}")
    if not segments.exists():
        raise KvtierError(f"--segments {args.segments}: no such folder (yet): kvtier demo writes "
                          "one, and kvtier collect --segments DIR at its first export")
    for name in ("whatif", "recommendation"):
        folder = getattr(args, name, None)
        if folder and Path(folder).exists() and not Path(folder).is_dir():
            raise KvtierError(f"--{name} {folder} is a file; give the folder kvtier "
                              f"{'simulate' if name == 'whatif' else 'recommend'} wrote")
    if importlib.util.find_spec("streamlit") is None:
        raise KvtierError("the dashboard needs Streamlit: pip install streamlit")
    app = dashboard_script()
    command = [sys.executable, "-m", "streamlit", "run", str(app),
               "--server.headless", "true", "--server.address", args.host,
               "--server.port", str(args.port), "--browser.gatherUsageStats", "false",
               "--server.fileWatcherType", "none",  # a service, not a dev loop: no source polling
               "--", "--segments", str(segments)]
    for name in ("whatif", "recommendation", "rollouts", "live_curves"):
        if getattr(args, name, None):
            command += [f"--{name.replace('_', '-')}", str(Path(getattr(args, name)).resolve())]
    return command


def dashboard_script() -> Path:
    """The Streamlit script, found through the installed package (``kvtier.dashboard``): a
    checkout resolves the same name, and there is no top-level ``dashboard`` outside one."""
    spec = importlib.util.find_spec("kvtier.dashboard")
    if spec is None or spec.origin is None:
        raise KvtierError("kvtier's dashboard package is missing from this install; reinstall kvtier")
    return Path(spec.origin).with_name("app.py")


STOP_TIMEOUT_S = 10.0


def check_address(host: str, port: int) -> None:
    """Bind ``host:port`` once, as the server will, so a busy port or an address this host
    does not have is one line here rather than Streamlit's log in the child."""
    import socket

    from kvtier.verbs.checks import address_error

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does
            probe.bind((host, port))
    except OSError as error:
        if getattr(error, "errno", None) in (98, 13):
            raise address_error("--port", f"{port} on {host}", error) from None
        raise address_error("--host", host, error) from None


def run(args) -> int:
    from kvtier.signals import stop_on_signals
    from kvtier.verbs.checks import warn_if_exposed

    command = streamlit_command(args)
    check_address(args.host, args.port)
    warn_if_exposed("dashboard", "the dashboard", args.host, args.port)
    print(f"kvtier dashboard: http://{args.host}:{args.port}/ (segments {Path(args.segments).resolve()}); "
          "Ctrl-C (or SIGTERM, SIGHUP) stops it", flush=True)
    with stop_on_signals():
        # its own process group: stopping the group stops whatever Streamlit started too
        child = subprocess.Popen(command, start_new_session=True)
        try:
            return child.wait()
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP: a service's normal end
            print("kvtier dashboard: stopped", flush=True)
            return 0
        finally:
            stop_group(child)


def stop_group(child: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to the child's process group, SIGKILL if it is still there after ``timeout_s``."""
    import os
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:  # the group is gone
            break
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader is gone; wait for the rest of its group
            os.killpg(child.pid, 0)
        except ProcessLookupError:
            break
