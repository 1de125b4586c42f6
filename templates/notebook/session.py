"""Starts a notebook session's JupyterLab: on 127.0.0.1 at the attempt's port (MASTER_PORT,
which the executor chose free), under base URL /sessions/<job id>/, accepting only the
session's secret (TRAINYARD_SESSION_SECRET, which the server's proxy sends upstream as
`Authorization: token ...`). The secret goes to Jupyter through its environment (JUPYTER_TOKEN),
never on a command line, where every user of the machine could read it."""

import os
import sys


def main() -> None:
    secret = os.environ.pop("TRAINYARD_SESSION_SECRET", "")
    if not secret:
        sys.exit("this job has no session secret (TRAINYARD_SESSION_SECRET): start it with yard notebook")
    job = os.environ["TRAINYARD_JOB_ID"]
    port = os.environ["MASTER_PORT"]
    os.environ["JUPYTER_TOKEN"] = secret
    home = os.environ.get("HOME", os.getcwd())
    argv = [
        sys.executable, "-m", "jupyterlab", "--no-browser",
        "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
        f"--ServerApp.base_url=/sessions/{job}/",
        f"--ServerApp.root_dir={home}",
        # The proxy answers the browser; Jupyter sees its requests come from 127.0.0.1 with the
        # browser's Host and Origin, which it compares for WebSockets.
        "--ServerApp.allow_remote_access=True",
        "--ServerApp.password=",
    ]
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    main()
