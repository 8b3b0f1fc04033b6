"""A local Label Studio server for reviews, tests and the demo: installed in its own virtual environment (its pins
differ from the training stack), started on a free port of 127.0.0.1 with a temporary data folder, stopped and cleaned
up afterwards.

The server's admin uses the API token held by an environment variable (`LABEL_STUDIO_API_KEY` by default) as a legacy
token (enabled through Label Studio's own `LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN`); the token goes to the server through
its environment only. SQLite is the default database; `postgres=` passes Label Studio's PostgreSQL settings
(`DJANGO_DB=default`, `POSTGRE_NAME`, `POSTGRE_USER`, `POSTGRE_PASSWORD`, `POSTGRE_HOST`, `POSTGRE_PORT`).

`python -m hf_defer.review.server` (what `make review-server` runs) starts one in the foreground until Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .client import DEFAULT_TOKEN_ENV

__all__ = ["LABEL_STUDIO_VERSION", "LabelStudioServer", "ensure_label_studio", "free_port"]

LABEL_STUDIO_VERSION = "1.23.2"
"""The Label Studio release the server venv gets (and that the tests and the demo ran against)."""
DEFAULT_VENV = ".venv-label-studio"
OFFLINE_SETTINGS = {  # Label Studio's own switches: no version check, telemetry or error reporting leaves the machine
    "LATEST_VERSION_CHECK": "false", "COLLECT_ANALYTICS": "false", "SENTRY_DSN": "", "FRONTEND_SENTRY_DSN": "",
    "CONVERTER_DOWNLOAD_RESOURCES": "false", "LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK": "true",
}


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ensure_label_studio(venv: str | os.PathLike = DEFAULT_VENV, version: str = LABEL_STUDIO_VERSION,
                        timeout: float = 1200.0) -> Path:
    """The `label-studio` command of `venv`, creating the venv and installing `label-studio==version` into it first
    when it is missing (a few minutes, once).

    Raises:
        RuntimeError: the install failed (its output's tail is in the message) or took longer than `timeout` seconds.
    """
    venv = Path(venv).resolve()
    command = venv / "bin" / "label-studio"
    if command.exists():
        return command
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"label-studio=={version}"]]
    deadline = time.monotonic() + timeout
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired as error:
            raise RuntimeError(f"installing Label Studio into {venv} took longer than {timeout:.0f} s.") from error
        if done.returncode != 0:
            raise RuntimeError(f"installing Label Studio into {venv} failed ({' '.join(step[-3:])}): "
                               f"{(done.stdout + done.stderr)[-2000:]}")
    return command


class LabelStudioServer:
    """A Label Studio server on 127.0.0.1, as a context manager.

    Args:
        token_env (`str`, *optional*, defaults to `"LABEL_STUDIO_API_KEY"`): the environment variable holding the
            admin's API token; it must be set (tests set a random one).
        venv (`str`, *optional*, defaults to `".venv-label-studio"`): the server's own virtual environment (created
            when missing).
        port (`int`, *optional*): defaults to a free port.
        data_dir (`str`, *optional*): the server's data folder; defaults to a temporary one, removed on stop.
        username (`str`, *optional*): the admin's email; password (`str`, *optional*): defaults to a random one
            (the `password` attribute).
        postgres (`dict`, *optional*): PostgreSQL settings `name`, `user`, `password`, `host`, `port`; SQLite when
            `None`.
        startup_timeout (`float`, *optional*, defaults to 300): seconds to wait for the server (migrations included).

    Example:

    ```python
    >>> import os, secrets  # doctest: +SKIP
    >>> os.environ["LABEL_STUDIO_API_KEY"] = secrets.token_hex(20)  # doctest: +SKIP
    >>> with LabelStudioServer() as server:  # doctest: +SKIP
    ...     project = hf_defer.review.connect(server.url, "reviews", ["neither", "offensive"])

    ```
    """

    def __init__(self, *, token_env: str = DEFAULT_TOKEN_ENV, venv: str | os.PathLike = DEFAULT_VENV,
                 port: int | None = None, data_dir: str | os.PathLike | None = None,
                 username: str = "reviews-admin@example.com", password: str | None = None,
                 postgres: Mapping[str, Any] | None = None, startup_timeout: float = 300.0) -> None:
        self.token_env, self.venv, self.username = token_env, Path(venv), username
        self.password = password or secrets.token_urlsafe(12)
        self.port, self.postgres, self.startup_timeout = port, dict(postgres or {}), startup_timeout
        self._given_data_dir = None if data_dir is None else Path(data_dir)
        self.data_dir: Path | None = None
        self.process: subprocess.Popen | None = None
        self._log: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _environment(self) -> dict[str, str]:
        token = os.environ.get(self.token_env)
        if not token or len(token) < 6:
            raise ValueError(f"set ${self.token_env} (`token_env`) to the API token the server's admin should have (at "
                             "least 6 characters), e.g. export "
                             f"{self.token_env}=$(python -c 'import secrets; print(secrets.token_hex(20))').")
        env = {name: value for name, value in os.environ.items() if not name.startswith(("LABEL_STUDIO_", "POSTGRE"))}
        env.update(OFFLINE_SETTINGS)
        env.update({"LABEL_STUDIO_BASE_DATA_DIR": str(self.data_dir), "LABEL_STUDIO_USERNAME": self.username,
                    "LABEL_STUDIO_PASSWORD": self.password, "LABEL_STUDIO_USER_TOKEN": token,
                    "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true", "LOG_LEVEL": "WARNING"})
        if self.postgres:
            env.update({"DJANGO_DB": "default", "POSTGRE_NAME": str(self.postgres.get("name", "labelstudio")),
                        "POSTGRE_USER": str(self.postgres.get("user", "postgres")),
                        "POSTGRE_PASSWORD": str(self.postgres.get("password", "")),
                        "POSTGRE_HOST": str(self.postgres.get("host", "127.0.0.1")),
                        "POSTGRE_PORT": str(self.postgres.get("port", 5432))})
        return env

    def start(self) -> LabelStudioServer:
        """Start the server and wait (bounded by `startup_timeout`) until it answers with the token accepted."""
        if self.process is not None:
            raise RuntimeError(f"the server at {self.url} is already running.")
        command = ensure_label_studio(self.venv)
        self.data_dir = self._given_data_dir or Path(tempfile.mkdtemp(prefix="hf_defer_label_studio_"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        env = self._environment()
        self._log = open(self.data_dir / "server.log", "ab")
        self.process = subprocess.Popen(
            [str(command), "start", "--no-browser", "--internal-host", "127.0.0.1", "--port", str(self.port),
             "--data-dir", str(self.data_dir)],
            env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait(env["LABEL_STUDIO_USER_TOKEN"])
        except BaseException:
            self.stop()
            raise
        return self

    def log_tail(self, characters: int = 3000) -> str:
        path = None if self.data_dir is None else self.data_dir / "server.log"
        return path.read_text(errors="replace")[-characters:] if path and path.exists() else ""

    def _wait(self, token: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        request = urllib.request.Request(f"{self.url}/api/current-user/whoami", headers={"Authorization": f"Token {token}"})
        for _ in range(int(self.startup_timeout) + 1):  # at most one poll a second, and never past the deadline
            if self.process.poll() is not None:
                raise RuntimeError(f"Label Studio exited with code {self.process.returncode} while starting:\n"
                                   f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as error:
                if error.code in (401, 403):
                    raise RuntimeError(f"Label Studio at {self.url} started but refuses the token in "
                                       f"${self.token_env} (HTTP {error.code}).") from None
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                break
            time.sleep(1.0)
        raise RuntimeError(f"Label Studio did not answer at {self.url} within {self.startup_timeout:.0f} s:\n"
                           f"{self.log_tail()}")

    def stop(self) -> None:
        """Stop the server (its whole process group) and remove a temporary data folder."""
        if self.process is not None and self.process.poll() is None:
            for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._given_data_dir is None and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __enter__(self) -> LabelStudioServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """`make review-server`: a local server in the foreground until Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python -m hf_defer.review.server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8080, help="port on 127.0.0.1 (default 8080)")
    parser.add_argument("--data_dir", default=None, help="keep the server's data here (default: a temporary folder, "
                        "removed on exit)")
    parser.add_argument("--token_env", default=DEFAULT_TOKEN_ENV, help="variable holding the admin's API token")
    parser.add_argument("--venv", default=DEFAULT_VENV, help="the server's own virtual environment")
    parser.add_argument("--hours", type=float, default=12.0, help="stop by itself after this long (default 12)")
    options = parser.parse_args(argv)
    server = LabelStudioServer(token_env=options.token_env, venv=options.venv, port=options.port,
                               data_dir=options.data_dir, password=os.environ.get("LABEL_STUDIO_PASSWORD"))
    try:
        server.start()
    except (ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"Label Studio {LABEL_STUDIO_VERSION} is running at {server.url} (data in {server.data_dir}).\n"
          f"Log in as {server.username} with the password {server.password}; the API token is the one in "
          f"${options.token_env}. Ctrl-C stops it.", flush=True)
    deadline = time.monotonic() + options.hours * 3600
    try:
        while server.process is not None and server.process.poll() is None and time.monotonic() < deadline:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
