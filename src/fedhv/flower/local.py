"""``fedhv flower local``: a real SuperLink and N real SuperNodes on 127.0.0.1, one run.

:func:`run_local` starts (each in its own process group, with free loopback ports):

- ``flower-superlink --insecure --disable-runtime-dependency-installation`` (it starts
  the ServerApp process of the run itself);
- per node ``K``: ``flower-supernode --insecure --isolation process --node-config
  "partition-id=K num-partitions=N"`` and its long-lived ClientApp process
  (:mod:`fedhv.flower.executor`), or, with ``isolation="subprocess"``, Flower's default
  fresh ``flwr-clientapp`` process per message;

generates the Flower app (``pyproject.toml`` with ``[tool.flwr.app.components]``
``fedhv.flower.app:server_app`` / ``fedhv.flower.client:app`` and the run config) and a
``FLWR_HOME`` whose ``config.toml`` names the local SuperLink, submits the run as
``flwr run`` does (in process: :func:`fedhv.flower.control.start_run`), follows
``rounds.jsonl`` for progress and the run's status on the SuperLink's Control API, and
stops every process of the deployment, also on Ctrl-C / SIGTERM, and a watchdog does so
when the launcher itself is killed (:mod:`fedhv.flower.lifetime`: every process carries a
``FEDHV_DEPLOYMENT`` mark in its environment, which Flower passes on to the processes it
starts). ``resume`` holds the run directory's lock from before the first process starts
until the run is submitted, so a busy directory is refused at once. A run whose ServerApp failed still ends with a
status; the run counts as done only when Flower reports it
``finished:completed`` *and* ``summary.json`` exists.

With ``tls`` the SuperLink serves HTTPS with a fresh test CA's certificate
(:mod:`fedhv.flower.certs`) and every client of it verifies the CA; with ``auth`` each
SuperNode's key is registered (``flwr supernode register``) before it starts with
``--auth-supernode-private-key``. A SuperNode (or ClientApp process) that dies during a
run is reported and the run goes on (its clients are dropped); only the SuperLink's death
ends it. ``resume`` continues an unfinished run directory.

Telemetry and the update check are off (``FLWR_TELEMETRY_ENABLED=0``,
``FLWR_DISABLE_UPDATE_CHECK=1``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fedhv.config import dumps, to_dict
from fedhv.config.schema import RunConfig
from fedhv.data.node_file import node_data_file
from fedhv.flower.control import running_runs, start_run, stop_run
from fedhv.flower.follow import Stopped, follow_run, sigterm_raises
from fedhv.flower.lifetime import MARK, marked, signal_all, sweep
from fedhv.flower.procs import FlowerRunError, console_script, free_ports, until_listening, wait_port
from fedhv.flower.runconf import app_pyproject, default_out, hold_run_dir, local_config, resume_config
from fedhv.procfs import cmdline, session_children
from fedhv.safe_path import SAFE_PATH_ENV

__all__ = ["Deployment", "FlowerRunError", "Stopped", "app_pyproject", "default_out", "local_config",
           "local_deployment", "resume_config", "run_local", "sigterm_raises"]

FLWR_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1",
            # the SuperLink's SuperExec looks for a run to start every second by default
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.25",
            # no module of the working directory on any process's sys.path (`python -m` puts it first),
            # in the processes started here and in those Flower starts (flwr-serverapp, flwr-clientapp)
            **SAFE_PATH_ENV}


def node_threads(nodes: int) -> int:
    """Torch threads of each node process of a local deployment: the cores shared out, at least 1."""
    return max(1, (os.cpu_count() or 1) // max(1, nodes))


@dataclass
class Deployment:
    """The processes of one local deployment (each the leader of its own process group)."""

    workdir: Path
    env: dict[str, str]
    nodes: int
    port: int
    root_certificates: str | None = None
    isolation: str = "process"
    supernode_cmd: list[str] = field(default_factory=list)
    auth: bool = False
    node_data: Path | None = None
    secure: bool = False  # SuperNodes answer only SecAgg+ stages (--node-config secure-aggregation=true)
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    lost: set[str] = field(default_factory=set)
    logs: list[IO[bytes]] = field(default_factory=list)
    watchdog: subprocess.Popen[bytes] | None = None
    link_cmd: list[str] = field(default_factory=list)
    #: The port SuperNodes connect to: the SuperLink's, or a Fleet-only gate's (:mod:`fedhv.flower.gate`).
    fleet_port: int = 0
    #: What the SuperNodes' operator (the launcher) allows (:class:`fedhv.flower.node.NodeTrust`): these
    #: ``module:attr`` benchmarks, this data root (``None``: their ``FEDHV_DATA``), downloads.
    allow_benchmarks: tuple[str, ...] = ()
    node_root: str | None = None
    node_download: bool = False
    held: Any = None  # a RunDir whose lock is held until the run is submitted

    @property
    def token(self) -> str:
        """The deployment's mark (``FEDHV_DEPLOYMENT``) in every process it starts."""
        return self.env[MARK]

    def start_watchdog(self) -> None:
        """The process that stops the deployment when this one dies (:mod:`fedhv.flower.lifetime`):
        in its own session, without the mark, its output to ``watchdog.log``."""
        env = {k: v for k, v in self.env.items() if k != MARK}
        with open(self.workdir / "watchdog.log", "ab") as log:
            self.watchdog = subprocess.Popen(
                [sys.executable, "-m", "fedhv.flower.lifetime", "--token", self.token, "--parent", str(os.getpid()),
                 "--workdir", str(self.workdir)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self.logs.append(log)
        proc = None
        env = self.env
        if name.startswith(("supernode", "clientapp")) and "OMP_NUM_THREADS" not in os.environ:
            # the nodes share this machine's cores: torch's default (every core per process) had 3 nodes
            # on 2 cores spin against each other, 10x slower than the same clients in one process
            env = {**env, "OMP_NUM_THREADS": str(node_threads(self.nodes))}
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir,
                                    start_new_session=True)
        finally:  # an interrupt right after the start must not leave an untracked process
            if proc is not None:
                self.procs.append((name, proc))
        return proc

    def start_listening(self, name: str, command: Callable[[int], list[str]]) -> tuple[subprocess.Popen[bytes], int]:
        """Start ``command(port)`` as ``name`` on a fresh free port and wait until it listens there;
        returns the process and its port.

        Between :func:`~fedhv.flower.procs.free_ports` and the process's bind another process may
        take the port (tests and other deployments choose ports at the same time): the process is
        then stopped and started again on a new port, up to
        :data:`~fedhv.flower.procs.PORT_ATTEMPTS` times, with a note on stderr each time
        (:func:`~fedhv.flower.procs.until_listening`).
        """
        def launch() -> tuple[subprocess.Popen[bytes], int]:
            port = free_ports(1)[0]
            return self.start(name, command(port)), port

        proc, port = launch()
        return until_listening(name, proc, port, self.workdir, launch, self.forget)

    def forget(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop ``proc`` (a process this deployment started) and drop it from the deployment."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self.procs = [(name, p) for name, p in self.procs if p is not proc]

    def node_key(self, name: str) -> Path:
        """A fresh SuperNode authentication key pair in the work directory; returns the private key."""
        from fedhv.flower.certs import make_node_key

        return make_node_key(self.workdir / "keys", name)[0]

    def register(self, *keys: Path) -> list[int]:
        """Register the public keys ``key.pub`` with the SuperLink (``flwr supernode register``, one
        process per key, all at once); their node ids."""
        procs: list[subprocess.Popen[str]] = []
        try:
            for key in keys:
                procs.append(subprocess.Popen(
                    [console_script("flwr"), "supernode", "register", f"{key}.pub", "local", "--format", "json"],
                    env=self.env, cwd=self.workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            ids = []
            for key, proc in zip(keys, procs):
                try:
                    out, err = proc.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, err = proc.communicate()
                try:
                    ids.append(int(json.loads(out)["node-id"]))
                except (ValueError, KeyError, TypeError):
                    raise FlowerRunError(f"flwr supernode register {key}.pub failed (status {proc.returncode}): "
                                         f"{(out + err).strip()[-500:]}") from None
            return ids
        finally:  # an interrupt or a failed registration leaves no register process behind (by PID)
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def start_node(self, k: int, key: Path | None = None, name: str | None = None,
                   clientapp: bool = True) -> subprocess.Popen[bytes]:
        """Start the SuperNode of partition ``k`` (and, under ``process`` isolation and with ``clientapp``,
        its ClientApp process); ``key``: its authentication private key. Returns the SuperNode process."""
        name, node, port = self._launch_node(k, key, name)
        if clientapp:
            node = self._attach_clientapp(k, key, name, node, port)
        return node

    def start_nodes(self, keys: list[Path | None]) -> None:
        """Start SuperNode ``k`` with ``keys[k]`` for every ``k`` at once, then their ClientApp processes
        (each once its SuperNode listens): the nodes' start-up (imports) overlaps."""
        launched = [(k, key, *self._launch_node(k, key)) for k, key in enumerate(keys)]
        for k, key, name, node, port in launched:
            self._attach_clientapp(k, key, name, node, port)

    def _launch_node(self, k: int, key: Path | None, name: str | None = None
                     ) -> tuple[str, subprocess.Popen[bytes], int]:
        name = name or f"supernode-{k}"
        port = free_ports(1)[0]
        tls = ["--insecure"] if self.root_certificates is None else ["--root-certificates", self.root_certificates]
        auth = [] if key is None else ["--auth-supernode-private-key", str(key)]
        node_config = f"partition-id={k} num-partitions={self.nodes}"
        if self.node_data is not None:  # a TOML string value: Flower parses --node-config as TOML pairs
            node_config += f" data-path={json.dumps(str(node_data_file(self.node_data, k)))}"
        if self.secure:
            node_config += " secure-aggregation=true"
        if self.allow_benchmarks:  # the operator's allowance (fedhv.flower.node.NodeTrust)
            node_config += f" allow-benchmarks={json.dumps(','.join(self.allow_benchmarks))}"
        if self.node_root is not None:
            node_config += f" data-root={json.dumps(self.node_root)}"
        if self.node_download:
            node_config += " data-download=true"
        node = self.start(name, [
            *self.supernode_cmd, *tls, *auth, "--superlink", f"127.0.0.1:{self.fleet_port or self.port}",
            "--node-config", node_config, "--isolation", self.isolation,
            "--host", "127.0.0.1", "--port", str(port),
        ])
        return name, node, port

    def _attach_clientapp(self, k: int, key: Path | None, name: str, node: subprocess.Popen[bytes], port: int
                          ) -> subprocess.Popen[bytes]:
        """Under ``process`` isolation: the SuperNode's long-lived ClientApp process, once the SuperNode
        listens (started again on a new port while another process holds its port). Returns the SuperNode."""
        if self.isolation == "process":
            node, port = until_listening(name, node, port, self.workdir, lambda: self._launch_node(k, key, name)[1:],
                                         self.forget)
            self.start(name.replace("supernode", "clientapp"), [
                sys.executable, "-m", "fedhv.flower.executor", "--runtime-api-address", f"127.0.0.1:{port}",
                "--parent-pid", str(node.pid)])
        return node

    @property
    def pids(self) -> list[int]:
        return [p.pid for _, p in self.procs]

    def restart_superlink(self) -> None:
        """The recovery runbook's first step: start the SuperLink again on its port and database
        (registered node keys and runs are kept there; the SuperNodes reconnect by themselves).
        A SuperExec or ServerApp of the previous SuperLink that still runs is stopped first, and
        the runs the database still lists as running are stopped (``flwr stop``) once it answers:
        a message the dead ServerApp stored but had not finished pushing would otherwise be
        handed to a SuperNode whose pull of its missing objects retries for minutes; the pull of
        a stopped run's object is refused at once, and the SuperNode drops the message (flwr 1.42,
        ``Fleet.PullObject`` and ``start_client_internal._pull_and_store_message``)."""
        old = next(p for name, p in self.procs if name == "superlink")
        if old.poll() is None:
            old.kill()
            old.wait()
        leftovers = [pid for pid in marked(self.token) if any(
            part in cmdline(pid) for part in (b"flower-superexec", b"flwr-serverapp"))]
        signal_all(leftovers, signal.SIGKILL)
        self.procs = [(name, p) for name, p in self.procs if p is not old]
        self.lost.discard("superlink")
        wait_port(self.port, self.start("superlink", self.link_cmd), "superlink", self.workdir)
        for run_id in running_runs(self.port, self.root_certificates):
            stop_run(self.port, run_id, self.root_certificates)

    def check_alive(self) -> None:
        """Raise when the SuperLink exited; a SuperNode (or ClientApp process) that exited is
        reported once on stderr and the run goes on: its clients count as dropped."""
        for name, proc in self.procs:
            if proc.poll() is None:
                continue
            if name == "superlink":
                raise FlowerRunError(f"{name} (pid {proc.pid}) exited with status {proc.returncode}; see "
                                     f"{self.workdir / (name + '.log')}")
            if name not in self.lost:
                self.lost.add(name)
                print(f"warning: {name} (pid {proc.pid}) exited with status {proc.returncode}; its client is "
                      f"dropped from every later stage (see {self.workdir / (name + '.log')})", file=sys.stderr)

    def submit(self, cfg: RunConfig | None, out: str | Path | None = None, *, stage_timeout: float = 0.0,
               progress: Callable[[int, int], None] | None = None, resume: str | Path | None = None,
               calibration: Callable[[int, int], None] | None = None, accept_changed_code: bool = False) -> Path:
        """Run ``cfg`` (as ``flwr run``), follow it to the end; returns the run directory.

        ``resume``: continue that unfinished run directory instead (``cfg`` and ``out``
        are then ``None``; its ``config.toml`` is the configuration).
        ``progress(done, total)`` is called as rounds finish, ``calibration(done, total)`` as FedHV's
        calibration rounds do (the ServerApp logs them). Raises
        :class:`FlowerRunError` when a process dies or the run does not complete.
        """
        if resume is not None:
            if cfg is not None or out is not None:
                raise FlowerRunError("--resume continues a run with its own config.toml; drop the setting and --out")
            cfg = resume_config(resume, accept_changed_code)
            out = resume
        if cfg is None:
            raise FlowerRunError("submit: give a configuration or a run directory to resume")
        if self.nodes != cfg.partition.clients:
            raise FlowerRunError(f"--nodes {self.nodes} but partition.clients = {cfg.partition.clients}; one "
                                 f"SuperNode serves one partition: use --nodes {cfg.partition.clients}")
        run_dir = Path(out if out is not None else default_out(cfg)).resolve()
        app_dir = Path(tempfile.mkdtemp(prefix="app-", dir=self.workdir))
        (app_dir / "config.toml").write_text(dumps(to_dict(cfg)))
        run_config: dict[str, Any] = {"config": str(app_dir / "config.toml"), "out": str(run_dir),
                                      "stage-timeout": float(stage_timeout), "node-wait": 120.0,
                                      "log": str(app_dir / "serverapp.log")}
        if resume is not None:
            run_config = {**run_config, "config": "", "out": "", "resume": str(run_dir),
                          "accept-changed-code": bool(accept_changed_code)}
        (app_dir / "pyproject.toml").write_text(app_pyproject(run_config))
        if self.held is not None:  # the ServerApp claims the run directory from here on
            self.held.close()
            self.held = None
        run_id = start_run(self.port, app_dir, self.root_certificates)
        follow_run(self, run_id, run_dir, cfg.rounds, progress, app_dir / "serverapp.log", calibration)
        return run_dir

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL, to each started process group (by the started PID), then to every
        other marked process (the ServerApp, ``flwr-clientapp`` processes: :func:`~fedhv.flower.lifetime.sweep`);
        then the watchdog ends."""
        signal_all(marked(self.token), signal.SIGTERM)  # the ServerApp and per-message ClientApps: same grace period
        for _, proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, proc in reversed(self.procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(deadline - time.monotonic(), 0.05))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group: also the ServerApp / ClientApp children
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        for pid in session_children(os.getpid()):  # started but not yet tracked when a stop request arrived
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        sweep(self.token, grace_s=1.0)
        if self.watchdog is not None:
            with contextlib.suppress(ProcessLookupError):
                self.watchdog.terminate()
            try:
                self.watchdog.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
                self.watchdog.wait()
        for log in self.logs:
            log.close()


@contextlib.contextmanager
def local_deployment(nodes: int, *, isolation: str = "process", poll_s: float | None = 0.1,
                     keep_workdir: bool = False, tls: bool = False, auth: bool = False,
                     node_data: str | Path | None = None, secure: bool = False, gate: bool = False,
                     allow_benchmarks: tuple[str, ...] = (), node_root: str | None = None, node_download: bool = False
                     ) -> Iterator[Deployment]:
    """A SuperLink and ``nodes`` SuperNodes (partition ``K`` of ``nodes`` each) on 127.0.0.1.

    Runs are submitted with :meth:`Deployment.submit` (several may run one after the
    other). ``isolation="process"``: one long-lived ClientApp process per SuperNode
    (:mod:`fedhv.flower.executor`); ``"subprocess"``: Flower's fresh process per message.
    ``poll_s``: the SuperNodes' idle poll (:mod:`fedhv.flower.supernode`; ``None`` =
    Flower's own ``flower-supernode`` and its 3 s). ``tls``: a fresh test CA and SuperLink
    certificate (:mod:`fedhv.flower.certs`); every connection to the SuperLink (SuperNodes,
    ``flwr run``, the ServerApp) is TLS, verified against the CA. ``auth`` (needs ``tls``):
    SuperNode authentication; each SuperNode gets its own P-384 key, registered with
    ``flwr supernode register`` before it starts. ``node_data``: a folder of node data
    files; SuperNode ``K`` serves ``client-K.npz`` from it (``data-path``,
    :mod:`fedhv.data.node_file`) instead of partition ``K`` of the built-in setting. ``secure``:
    the SuperNodes refuse plain stages (``--node-config secure-aggregation=true``; runs must use
    ``flower.secure_aggregation = true``, :mod:`fedhv.flower.secure`). ``gate`` (needs ``tls``): the
    SuperNodes connect through a Fleet-only gate (:mod:`fedhv.flower.gate`), as node hosts do in the
    documented multi-machine recipe; the Control API stays on the SuperLink's own port.
    ``allow_benchmarks``, ``node_root``, ``node_download``: what the SuperNodes' operator allows them
    (``--node-config allow-benchmarks=... data-root=... data-download=true``,
    :class:`fedhv.flower.node.NodeTrust`): nothing the server names otherwise. On exit
    every started process group
    is stopped; the work directory (logs, certificates) is removed unless a run failed, a
    process exited during the run (its log was named in a warning) or ``keep_workdir``.
    """
    if nodes < 1:
        raise FlowerRunError(f"--nodes {nodes}: need at least one SuperNode; give --nodes 1 or more")
    if isolation not in ("process", "subprocess"):
        raise FlowerRunError(f"isolation {isolation!r} is not known; use \"process\" or \"subprocess\"")
    if auth and not tls:
        raise FlowerRunError("--auth without --tls: Flower's SuperNode authentication needs TLS; add --tls")
    if gate and not tls:
        raise FlowerRunError("gate without tls: the Fleet-only gate serves the SuperLink's certificate; add tls")
    data_dir = None
    if node_data is not None:
        data_dir = Path(node_data).resolve()
        missing = [k for k in range(nodes) if not node_data_file(data_dir, k).is_file()]
        if missing:
            raise FlowerRunError(f"--node-data {node_data}: no {node_data_file(data_dir, missing[0]).name} (clients "
                                 f"{missing} lack a file); write them with `fedhv flower export SETTING --out "
                                 f"{node_data}`")
    workdir = Path(tempfile.mkdtemp(prefix="fedhv-flower-"))
    home = workdir / "flwr-home"
    home.mkdir()
    # Flower starts flwr-serverapp / flower-superexec / flwr-clientapp from PATH: this interpreter's first.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, **FLWR_ENV, "FLWR_HOME": str(home), "PATH": path, MARK: uuid.uuid4().hex}
    link_tls = ["--insecure"]
    conn = "insecure = true"
    root = None
    if tls:
        from fedhv.flower.certs import make_tls

        paths = make_tls(workdir / "certs")
        root = str(paths["ca"])
        link_tls = ["--ssl-ca-certfile", root, "--ssl-certfile", str(paths["cert"]), "--ssl-keyfile",
                    str(paths["key"])] + (["--enable-supernode-auth"] if auth else [])
        conn = f"root-certificates = {json.dumps(root)}"
    if poll_s is not None:
        env["FEDHV_SUPERNODE_POLL_S"] = str(poll_s)
    supernode_cmd = [console_script("flower-supernode")] if poll_s is None else [sys.executable, "-m", "fedhv.flower.supernode"]
    dep = Deployment(workdir, env, nodes, 0, root, isolation, supernode_cmd, auth, data_dir, secure,
                     allow_benchmarks=tuple(allow_benchmarks), node_root=node_root, node_download=node_download)
    ok = False
    try:
        dep.start_watchdog()

        def superlink(port: int) -> list[str]:  # flwr 1.42: one HTTP port for Fleet, Control and Runtime APIs
            (home / "config.toml").write_text(
                f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{port}"\n{conn}\n')
            dep.port = port
            dep.link_cmd = [console_script("flower-superlink"), *link_tls, "--disable-runtime-dependency-installation",
                            "--host", "127.0.0.1", "--port", str(port),
                            "--database", str(workdir / "superlink.db")]  # state kept across a restart
            return dep.link_cmd

        dep.start_listening("superlink", superlink)
        if gate:  # node hosts get the Fleet API only; the Control API stays on the SuperLink's port
            dep.fleet_port = dep.start_listening("gate", lambda port: [
                sys.executable, "-m", "fedhv.flower.gate", "--listen", f"127.0.0.1:{port}",
                "--upstream", f"127.0.0.1:{dep.port}", "--certfile", str(paths["cert"]), "--keyfile",
                str(paths["key"]), "--upstream-ca", str(paths["ca"])])[1]
        keys: list[Path | None] = [dep.node_key(f"node-{k}") if auth else None for k in range(nodes)]
        if auth:
            dep.register(*[key for key in keys if key is not None])
        dep.start_nodes(keys)
        yield dep
        ok = True
    finally:
        dep.stop()
        if ok and not keep_workdir and not dep.lost:
            shutil.rmtree(workdir, ignore_errors=True)
        elif ok and dep.lost:  # the warnings named these logs: keep them
            print(f"note: the logs of {', '.join(sorted(dep.lost))} (which exited during the run) are kept in "
                  f"{workdir}", file=sys.stderr)


def run_local(cfg: RunConfig | None, nodes: int, out: str | Path | None = None, *, isolation: str = "process",
              stage_timeout: float = 0.0, poll_s: float | None = 0.1, progress: Callable[[int, int], None] | None = None,
              on_start: Callable[[Deployment], None] | None = None, keep_workdir: bool = False, tls: bool = False,
              auth: bool = False, resume: str | Path | None = None, node_data: str | Path | None = None,
              calibration: Callable[[int, int], None] | None = None, accept_changed_code: bool = False) -> Path:
    """Run ``cfg`` (or ``resume`` a run directory) on a fresh :func:`local_deployment` of ``nodes``
    SuperNodes; returns the run directory. ``on_start`` sees the deployment once every process runs.
    A run with ``flower.secure_aggregation = true`` gets SuperNodes that answer only SecAgg+ stages."""
    run_cfg = cfg if cfg is not None or resume is None else resume_config(resume, accept_changed_code)
    secure = run_cfg is not None and run_cfg.flower.secure_aggregation
    # the launcher is the nodes' operator: it allows them the run's own benchmark, data root and downloads
    allow = (run_cfg.data.benchmark,) if run_cfg is not None and ":" in run_cfg.data.benchmark else ()
    root = str(Path(run_cfg.data.root).resolve()) if run_cfg is not None and run_cfg.data.root else None
    download = bool(run_cfg is not None and run_cfg.data.download)
    held = hold_run_dir(resume if resume is not None else out, resume is not None)
    try:
        with local_deployment(nodes, isolation=isolation, poll_s=poll_s, keep_workdir=keep_workdir, tls=tls,
                              auth=auth, node_data=node_data, secure=secure, allow_benchmarks=allow, node_root=root,
                              node_download=download) as dep:
            dep.held = held
            if on_start is not None:
                on_start(dep)
            return dep.submit(cfg, out, stage_timeout=stage_timeout, progress=progress, resume=resume,
                              calibration=calibration, accept_changed_code=accept_changed_code)
    finally:
        if held is not None:
            held.close()
